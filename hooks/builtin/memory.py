"""Shared episodic memory: ``memory-enrichment`` reads, ``memory-record`` writes, ``knowledge-extraction``
distils reusable fragments after the request — and :func:`build_memory_hooks`, which wires them with the
activity-coordination hooks in their required order (announcement → enrichment → record → knowledge
extraction → cleanup).

The symmetry to notice: the before_planning hook reads and enriches, the after_execution and
after_synthesis hooks write and record. Every one fails open — a memory outage degrades the answer, it
never fails the request — and reports what it *observed* (``read_succeeded`` / ``read_failed``,
submitted events, the provider call's status), not a claim that anything was durably committed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workflows.models import (
    ENRICHMENT_RAG_CONTEXT,
    DetachedWorkResult,
    EffectStatus,
    ExecutionResult,
    RunMode,
    StepStatus,
)

from ..contracts import DetachedContext, PipelineContext, PipelineHook
from ..memory import (
    ActivityCoordinator,
    EpisodicEvent,
    EpisodicMemory,
    KnowledgeFragment,
    KnowledgeStore,
    MemoryBackends,
    MemoryModel,
)
from .activity_coordination import ActivityAnnouncementHook, ActivityCleanupHook
from .memory_model import (
    HeuristicMemoryModel,
    extract_entities,
    model_prompt,
    parse_json_answer,
    readable_result,
    report_call,
    strings_in,
)

DEFAULT_SUMMARIZER_TIMEOUT_SECONDS = 120.0
SUMMARIZER_TIMEOUT_ENV = "AGENT_MEMORY_SUMMARIZER_TIMEOUT_SECONDS"
ACTIVITY_TTL_ENV = "AGENT_MEMORY_ACTIVITY_TTL_SECONDS"
VIEW_FORMAT = "event-lines/v1"
_IMPORTANCE = {StepStatus.FAILED: 0.8, StepStatus.SUCCEEDED: 0.5, StepStatus.SKIPPED: 0.3}


class MemoryOptions(BaseModel):
    """The builders' behavioural knobs: ``settings.memory`` of the process settings, where the two the
    environment sets are read (``AGENT_MEMORY_SUMMARIZER_TIMEOUT_SECONDS``,
    ``AGENT_MEMORY_ACTIVITY_TTL_SECONDS``); a pipeline passes ``settings.memory`` with its own domain:
    ``settings.memory.model_copy(update={"agent_domain": "my-agent"})``.

    Attributes:
        agent_domain: The episodic-memory domain this agent reads and writes (and its coordination name).
        lookback_seconds: How far back memory enrichment reads.
        query_limit: At most this many events are read per request.
        byte_budget: The injected memory text (scope notice included) stays within this many UTF-8 bytes.
        summarizer_timeout_seconds: Bound on the recorder's one summarizer call; on timeout it falls back
            to heuristic summaries.
        extraction_timeout_seconds: Bound on the knowledge-extraction model call (in detached work).
        max_fragments: Knowledge fragments kept per request: from none up to this many (3 by default).
        activity_ttl_seconds / activity_renew_interval_seconds: The coordination signal's TTL and renewal
            (by default every third of the TTL).
        managed_activity: The request owner renews and cleans up the signal (see activity_coordination).
        entity_extractor: Finds entities in a text.
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    agent_domain: str = "agent"
    lookback_seconds: float = 7 * 24 * 3600.0
    query_limit: int = 20
    byte_budget: int = 4096
    summarizer_timeout_seconds: float = Field(
        default=DEFAULT_SUMMARIZER_TIMEOUT_SECONDS,
        gt=0,
        validation_alias=SUMMARIZER_TIMEOUT_ENV,
        description="bound on the memory recorder's one summarizer call (then heuristic summaries)",
    )
    extraction_timeout_seconds: float = 60.0
    max_fragments: int = 3
    activity_ttl_seconds: float = Field(
        default=120.0,
        gt=0,
        validation_alias=ACTIVITY_TTL_ENV,
        description="how long an activity-coordination signal lives unrenewed (renewed every third of it)",
    )
    activity_renew_interval_seconds: float | None = None
    managed_activity: bool = True
    entity_extractor: Callable[[str], list[str]] = extract_entities

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> MemoryOptions:
        """``Settings.from_env(env).memory`` with ``overrides`` (kept for compatibility; a pipeline factory
        reads ``settings.memory``).

        Raises:
            client.settings.SettingsError: a variable without a valid value (the message names it).
        """
        from client.settings import Settings  # the one loader; imported here, the layer above this one

        return Settings.from_env(env).memory.model_copy(update=overrides)


# How the memory section of ``rag_context`` opens: its scope notice comes first, before any memory text.
MEMORY_SCOPE_NOTICE_PREFIX = "Shared memory of agent domain"


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(eq=False)
class MemoryEnrichmentHook(PipelineHook):
    """before_planning: what this agent domain did recently, about these entities, into ``rag_context``.

    Extracts entities from the request, reads the domain's events of the lookback window (those sharing an
    entity first, then the most recent; at most ``query_limit``), and appends them — after a scope notice
    saying they are history, not results of this request — to ``rag_context`` (rendered inside
    ``<agent_memory>``) within ``byte_budget``. With a knowledge store it adds fragments about the same
    entities. The text is a request-start snapshot: later planning phases see the same text.

    Effects: ``memory_planning_context`` (domain, entities, section count, the view report),
    ``memory_episodic_read`` (``read_succeeded`` / ``read_failed``, returned events, query limit) and
    ``memory_digest_window`` (the window the view was built from and its coverage). Fails open: a failed
    read injects nothing and the request plans without memory.
    """

    memory: EpisodicMemory
    _: KW_ONLY
    options: MemoryOptions = field(default_factory=MemoryOptions)
    knowledge: KnowledgeStore | None = None
    name: str = "memory-enrichment"
    timeout_seconds = 10.0

    async def before_planning(self, ctx: PipelineContext) -> None:
        opts = self.options
        entities = opts.entity_extractor(ctx.request)
        read = await self.memory.recent_events(
            opts.agent_domain,
            entities=entities,
            since=_utcnow() - timedelta(seconds=opts.lookback_seconds),
            limit=opts.query_limit,
        )
        report_call(
            ctx,
            "memory_episodic_read",
            read,
            name="Episodic memory read",
            data={
                "status": read.status,
                "returned_events": len(read.items),
                "query_limit": opts.query_limit,
                "lookback_seconds": opts.lookback_seconds,
                "event_ids": [e.event_id for e in read.items],
            },
            summary=f"{read.status}: {len(read.items)} event(s)",
        )
        ctx.report_effect(
            "memory_digest_window",
            name="Memory digest window",
            data={
                "path": "recent_window",  # built from this read; this backend keeps no digest cache
                "cache_entry_found": False,
                "returned_events": len(read.items),
                "coverage": "unknown"
                if not read.ok
                else "limited_window"
                if len(read.items) >= opts.query_limit
                else "returned_window",
            },
        )
        fragments = []
        if self.knowledge is not None and entities:
            found = await self.knowledge.related_fragments(opts.agent_domain, entities=entities, limit=3)
            fragments = found.items

        text, view = self._render(read.items, fragments)
        if not read.ok:
            view["outcome"] = "read_failed"
        ctx.report_effect(
            "memory_planning_context",
            name="Memory planning context",
            data={
                "agent_domain": opts.agent_domain,
                "entities": entities,
                "section_count": view["section_count"],
                "view": view,
            },
            summary=f"{view['outcome']}: {view['bytes_used']} of {view['byte_budget']} bytes",
        )
        if text:
            existing = ctx.enrichments.get(ENRICHMENT_RAG_CONTEXT)
            ctx.enrichments[ENRICHMENT_RAG_CONTEXT] = (
                f"{existing}\n{text}" if isinstance(existing, str) and existing else text
            )

    def _render(self, events: list[EpisodicEvent], fragments: list[KnowledgeFragment]) -> tuple[str, dict[str, Any]]:
        """Scope notice first, then one line per event, then fragments — all inside the byte budget."""
        budget = self.options.byte_budget
        notice = (
            f'{MEMORY_SCOPE_NOTICE_PREFIX} "{self.options.agent_domain}": outcomes of earlier requests '
            "(history, not results of this request)."
        )
        lines = [notice]
        used = len(notice.encode())
        shown = {"events": 0, "events_omitted": 0, "knowledge": 0, "header": 0}

        def add(line: str, kind: str) -> None:
            nonlocal used
            size = len(line.encode()) + 1
            if used + size > budget:
                if kind == "events":
                    shown["events_omitted"] += 1
                return
            lines.append(line)
            used += size
            shown[kind] += 1

        for e in events:
            when = e.occurred_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
            tags = f" [{', '.join(e.entities)}]" if e.entities else ""
            add(f"- {when} {e.tool or 'request'} {e.outcome}{tags}: {e.summary}", "events")
        if fragments:
            add("Related knowledge:", "header")
            for f in fragments:
                add(f"- {f.text}", "knowledge")
        sections = int(shown["events"] > 0) + int(shown["knowledge"] > 0)
        view = {
            "version": 1,
            "format": VIEW_FORMAT,
            "byte_budget": budget,
            "bytes_used": used if sections else 0,
            "outcome": "rendered" if sections else "empty",
            "section_count": sections,
            "sections": {k: v for k, v in shown.items() if k != "header"},
        }
        return ("\n".join(lines) if sections else ""), view


@dataclass(eq=False)
class MemoryRecordHook(PipelineHook):
    """after_execution: submit one episodic event per step — entities, outcome, importance, a summary.

    Entities come from the request (extracted here for recording only) and the step's arguments. The
    summaries come from **one** bounded summarizer call (``summarizer_timeout_seconds``, 2 min by default);
    on timeout, a model error or an unusable answer each event gets a heuristic summary instead — no retry,
    no background recording: the request waits for this hook before synthesis. If the request is cancelled
    meanwhile, the effect is reported failed and nothing is written. Event ids are
    ``<workflow id>:<step id>``, so a retried invocation never records a step twice.

    Effect ``episodic_memory_records``: the submitted event envelopes, the provider call's status and error,
    ``backend_assigns_event_id`` / ``backend_assigns_timestamp``, and ``summary_coverage`` (how many
    summaries came from the model and how many from the heuristic, and why).
    """

    memory: EpisodicMemory
    _: KW_ONLY
    model: MemoryModel | None = None
    options: MemoryOptions = field(default_factory=MemoryOptions)
    name: str = "memory-record"
    max_attempts = 2
    run_mode = RunMode.ACTIVITY  # a model call of up to minutes: its own heartbeated task

    def __post_init__(self) -> None:
        # The invocation's own bound leaves room for the summarizer's, plus the write.
        self.timeout_seconds = min(600.0, self.options.summarizer_timeout_seconds + 30.0)

    async def after_execution(self, ctx: PipelineContext, execution: ExecutionResult) -> None:
        opts = self.options
        request_entities = opts.entity_extractor(ctx.request)
        now = _utcnow()
        events = []
        for step in execution.steps:
            found = [e for text in strings_in(step.arguments or {}) for e in opts.entity_extractor(text)]
            events.append(
                EpisodicEvent(
                    event_id=f"{ctx.workflow_id}:{step.step_id}",
                    agent_domain=opts.agent_domain,
                    request_id=ctx.request_id,
                    step_id=step.step_id,
                    tool=step.tool,
                    entities=list(dict.fromkeys([*request_entities, *found])),
                    outcome=step.status.value,
                    importance=_IMPORTANCE[step.status],
                    summary="",
                    occurred_at=step.started_at or now,
                )
            )
        try:
            summaries, coverage = await self._summaries(ctx, execution, events)
        except asyncio.CancelledError:
            ctx.report_effect(
                "episodic_memory_records",
                name="Episodic memory records",
                status=EffectStatus.FAILED,
                data={"submitted_events": 0, "agent_domain": opts.agent_domain},
                error="cancelled while summarizing; no events were written",
            )
            raise
        for event in events:
            event.summary = summaries[event.step_id]
        written = await self.memory.record_events(events) if events else None
        ctx.report_effect(
            "episodic_memory_records",
            name="Episodic memory records",
            status=EffectStatus.FAILED if written is not None and not written.ok else EffectStatus.SUCCEEDED,
            data={
                "agent_domain": opts.agent_domain,
                "request_entities": request_entities,
                "submitted_events": len(events),
                "events": [
                    {
                        "event_id": e.event_id,
                        "step_id": e.step_id,
                        "tool": e.tool,
                        "entities": e.entities,
                        "outcome": e.outcome,
                        "importance": e.importance,
                        "occurred_at": e.occurred_at.isoformat(),
                        "summary_source": coverage["sources"][e.step_id],
                    }
                    for e in events
                ],
                "provider_call_status": written.provider_call_status if written else "not_called",
                "provider_detail": written.detail if written else {},
                "backend_assigns_event_id": False,
                "backend_assigns_timestamp": True,  # recorded_at; occurred_at is the step's start
                "summary_coverage": {k: v for k, v in coverage.items() if k != "sources"},
            },
            error=written.error if written else None,
            summary=f"{len(events)} event(s) submitted" if written is None or written.ok else "event submission failed",
        )

    async def _summaries(
        self, ctx: PipelineContext, execution: ExecutionResult, events: list[EpisodicEvent]
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """One bounded model call for every event; whatever it does not cover gets a heuristic summary."""
        heuristic = {
            s.step_id: readable_result(s.result or s.error or s.skip_detail) or f"{s.tool} {s.status.value}"
            for s in execution.steps
        }
        coverage: dict[str, Any] = {
            "requested": len(events),
            "model": 0,
            "heuristic": len(events),
            "fallback_cause": None,
            "timeout_seconds": self.options.summarizer_timeout_seconds,
            "sources": {e.step_id: "heuristic" for e in events},
        }
        if not events:
            return heuristic, coverage
        if self.model is None:
            coverage["fallback_cause"] = "no_model"
            return heuristic, coverage
        prompt = model_prompt(
            "summarize_events",
            'Summarize each event in one factual sentence. Answer {"summaries": [{"step_id", "summary"}]}.',
            {
                "request": ctx.request,
                "events": [
                    {"step_id": s.step_id, "tool": s.tool, "outcome": s.status.value, "result": (s.result or "")[:600]}
                    for s in execution.steps
                ],
            },
        )
        try:
            answer = await asyncio.wait_for(
                self.model.complete(prompt), timeout=self.options.summarizer_timeout_seconds
            )
            parsed = parse_json_answer(answer).get("summaries", [])
        except TimeoutError:
            coverage["fallback_cause"] = "timeout"
            return heuristic, coverage
        except Exception as err:  # noqa: BLE001 - any model failure falls back, with its cause recorded
            coverage["fallback_cause"] = f"model_error: {type(err).__name__}"
            return heuristic, coverage
        summaries = dict(heuristic)
        for item in parsed if isinstance(parsed, list) else []:
            if isinstance(item, dict) and item.get("step_id") in summaries and isinstance(item.get("summary"), str):
                text = " ".join(item["summary"].split())[:400]
                if text and coverage["sources"][item["step_id"]] == "heuristic":
                    summaries[item["step_id"]] = text
                    coverage["sources"][item["step_id"]] = "model"
        coverage["model"] = sum(v == "model" for v in coverage["sources"].values())
        coverage["heuristic"] = len(events) - coverage["model"]
        if coverage["heuristic"]:
            coverage["fallback_cause"] = "incomplete_answer"
        return summaries, coverage


@dataclass(eq=False)
class KnowledgeExtractionHook(PipelineHook):
    """after_synthesis: distil 0–3 reusable knowledge fragments from the request and its answer — later.

    The invocation only hands the work off (``ctx.detach``): the effect ``knowledge_extraction`` is pending
    when it returns, and a ``DetachedEffect`` child workflow, which outlives the request, asks the model
    (bounded by ``extraction_timeout_seconds``), normalises its fragments and stores each, then brings the
    effect to ``succeeded`` with the exact model response, the normalised fragments and one observed
    outcome per fragment — or to ``failed`` if the model call kept failing. The response is returned
    unchanged, always.
    """

    knowledge: KnowledgeStore
    _: KW_ONLY
    model: MemoryModel = field(default_factory=HeuristicMemoryModel)
    options: MemoryOptions = field(default_factory=MemoryOptions)
    name: str = "knowledge-extraction"
    timeout_seconds = 10.0

    def after_synthesis(self, ctx: PipelineContext, response: str) -> str:
        # Context this request was given is not new knowledge: lines repeating it are left out.
        injected = ctx.enrichments.get(ENRICHMENT_RAG_CONTEXT)
        known = {line.strip() for line in injected.splitlines() if line.strip()} if isinstance(injected, str) else set()
        novel = "\n".join(line for line in response.splitlines() if line.strip() not in known)
        ctx.detach(
            "knowledge_extraction",
            name="Knowledge extraction",
            payload={"request": ctx.request, "response": novel[:8000], "agent_domain": self.options.agent_domain},
            data={"state": "pending", "max_fragments": self.options.max_fragments},
            summary="extraction submitted",
        )
        return response

    async def run_detached(self, work: DetachedContext) -> DetachedWorkResult:
        payload = work.payload
        limit = self.options.max_fragments
        prompt = model_prompt(
            "extract_knowledge",
            f"List at most {limit} reusable facts from this exchange, or none. "
            'Answer {"fragments": [{"title", "text", "entities"}]}.',
            {"request": payload["request"], "response": payload["response"], "max_fragments": limit},
        )
        answer = await asyncio.wait_for(self.model.complete(prompt), timeout=self.options.extraction_timeout_seconds)
        try:
            raw = parse_json_answer(answer).get("fragments", [])
            parse_error = None
        except (ValueError, AttributeError) as err:
            raw, parse_error = [], str(err)
        fragments = []
        for item in raw if isinstance(raw, list) else []:
            if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not item["text"].strip():
                continue
            text = " ".join(item["text"].split())[:1000]
            entities = [str(e) for e in item.get("entities", []) if isinstance(e, str)][
                :8
            ] or self.options.entity_extractor(text)
            fragments.append(
                KnowledgeFragment(
                    fragment_id=hashlib.sha256(f"{payload['agent_domain']}\n{text}".encode()).hexdigest()[:24],
                    agent_domain=payload["agent_domain"],
                    title=str(item.get("title") or text)[:120],
                    text=text,
                    entities=entities,
                    source_request_id=work.request_id,
                )
            )
            if len(fragments) == limit:
                break
        outcomes = []
        for fragment in fragments:
            stored = await self.knowledge.store_fragment(fragment)
            outcomes.append(
                {
                    "fragment_id": fragment.fragment_id,
                    "observed_outcome": "submitted" if stored.ok else "error",
                    "provider_call_status": stored.provider_call_status,
                    "error": stored.error,
                    **stored.detail,
                }
            )
        errors = sum(o["observed_outcome"] == "error" for o in outcomes)
        return DetachedWorkResult(
            data={
                "model_response": answer[:4000],
                "parse_error": parse_error,
                "fragments": [json.loads(f.model_dump_json(exclude={"recorded_at"})) for f in fragments],
                "outcomes": outcomes,
            },
            summary=f"{len(fragments)} fragment(s) submitted, {errors} error(s)",
        )


def build_memory_hooks(
    backends: MemoryBackends, model: MemoryModel | None = None, options: MemoryOptions | None = None
) -> tuple[list[PipelineHook], ActivityCoordinator | None]:
    """The shared-memory hooks for the configured backends, in order, and the activity coordinator.

    Order: activity announcement → memory enrichment → memory record → knowledge
    extraction → activity cleanup. A facet left unset leaves its hooks out: no coordinator, no
    announcement/cleanup; no episodic memory, no enrichment/record; no knowledge store, no extraction.
    Put a short-circuiting cache hook *before* these so a cached answer skips their work. ``model``
    defaults to :class:`HeuristicMemoryModel`.
    """
    options = options or MemoryOptions()
    model = model or HeuristicMemoryModel()
    hooks: list[PipelineHook] = []
    if backends.coordinator is not None:
        hooks.append(
            ActivityAnnouncementHook(
                backends.coordinator,
                agent=options.agent_domain,
                ttl_seconds=options.activity_ttl_seconds,
                renew_interval_seconds=options.activity_renew_interval_seconds,
                managed=options.managed_activity,
                entity_extractor=options.entity_extractor,
            )
        )
    if backends.episodic is not None:
        hooks.append(MemoryEnrichmentHook(backends.episodic, options=options, knowledge=backends.knowledge))
        hooks.append(MemoryRecordHook(backends.episodic, model=model, options=options))
    if backends.knowledge is not None:
        hooks.append(KnowledgeExtractionHook(backends.knowledge, model=model, options=options))
    if backends.coordinator is not None:
        hooks.append(ActivityCleanupHook(backends.coordinator, agent=options.agent_domain))
    return hooks, backends.coordinator
