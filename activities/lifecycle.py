"""The activities of ``RequestLifecycle``: pipeline resolution, planning, tool steps, synthesis, memory,
record persistence, detached effects and managed leases — plus the hook activities of every stage
(``activities.hook_stages``), which this class inherits.

Built once per worker with its dependencies (``LifecycleActivities(registry=..., tools=..., ...)``) and
registered as bound methods (``activities()``).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from opentelemetry import trace
from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from hooks.builtin.secret_redaction import masked_preview
from hooks.contracts import DetachedContext
from hooks.memory import MemoryModel
from hooks.registry import HookRegistry
from storage.executions import ExecutionStore, lasting
from workflows import decisions
from workflows.models import (
    MAX_PLAN_ATTEMPTS,
    MAX_RECORDED_PROMPT_CHARS,
    DetachedEffectInput,
    DetachedWorkResult,
    EffectUpdateInput,
    ExecutionRecord,
    ModelDraft,
    ModelUsage,
    PersistRecordInput,
    PersistRecordOutput,
    PipelineManifest,
    Plan,
    PlanInput,
    PlanOutput,
    ResolvePipelineInput,
    ReviewNotificationInput,
    ReviewNotificationResult,
    ReviewSettings,
    Stage,
    StageSettings,
    SynthesizeInput,
    SynthesizeOutput,
    ToolSpec,
)
from workflows.notification import NOTIFY_REVIEWERS_ACTIVITY
from workflows.plan_validation import plan_problems
from workflows.snapshots import BeforePlanningRan, accepted_plan_snapshot, took_planned
from workflows.stages import let_through
from workflows.stages.planning import AFTER_PLANNING, BEFORE_PLANNING
from workflows.support import error_details, model_calls_in

from . import telemetry
from .answer_stream import publish_answer, publish_plan, streaming_planner, streaming_synthesizer
from .conversations import ConversationActivities
from .heartbeat import heartbeating
from .hook_stages import HookStageActivities, call_hook, returned_or_default
from .lease_steps import LeaseSteps
from .memory import ConversationMemory
from .memory_steps import MemorySteps
from .models.call_log import ModelCallLog
from .planning import (
    Planner,
    PlanningRequest,
    PlanRepairNeeded,
    PromptBuilder,
    PromptInput,
    Synthesizer,
    build_planning_prompt,
)
from .review_webhook import WEBHOOK_NOT_CONFIGURED, ReviewWebhook
from .tool_steps import ToolSteps
from .tools import ToolRegistry

logger = logging.getLogger(__name__)
ResultT = TypeVar("ResultT", bound=BaseModel)

MAX_PRIVATE_STATE_BYTES = 64 * 1024
DRAFT_PREVIEW_CHARS = 160  # of the model's draft, secrets masked, as the record keeps it
# A store's error as ``RecordNotStored`` carries it, and the time an attempt at a write leaves before its
# start-to-close timeout to report that it failed.
MAX_STORE_ERROR_CHARS = 500
WRITE_MARGIN_SECONDS = 2.0


class LifecycleActivities(HookStageActivities):
    """Every activity ``RequestLifecycle`` schedules, bound to one worker's dependencies.

    Args:
        registry: The validated hook pipeline.
        tools: The tools plan steps may call.
        planner: Chooses tools; receives the prompt built by ``prompt_builder``.
        synthesizer: Writes the answer.
        store: Where execution records are persisted.
        settings: Timeouts and limits of the framework's own activities.
        cache_variation: Extra pipeline-owned cache dimensions (merged over the built-in ones).
        reserved_metadata_dimensions: Request-metadata keys that are cache dimensions (e.g. ``locale``).
        prompt_builder: Renders the planning prompt; the default renders the well-known enrichments.
        review: Who may decide checkpoints and how long they wait.
        search_attributes: Whether the lifecycle search attributes exist on the namespace (the worker
            checks and sets this; without them the workflow does not upsert them).
        memory: Conversation memory: completed runs are remembered (after before_remember hooks).
        instructions: The pipeline's instructions, recorded in each request's manifest (its system prompt).
        review_webhook: Where each checkpoint that opens is announced (``AGENT_REVIEW_WEBHOOK``); None:
            nobody is told, and a checkpoint starts no notification.

    ``ungated``: the pipeline runs tools with no required after-planning gate and says so; a worker
    refuses to serve a pipeline with tools and no such gate otherwise (``client.pipeline.check_servable``).
    """

    ungated: bool = False

    def __init__(
        self,
        *,
        registry: HookRegistry,
        tools: ToolRegistry,
        planner: Planner,
        synthesizer: Synthesizer,
        store: ExecutionStore,
        settings: StageSettings | None = None,
        cache_variation: Mapping[str, str] | None = None,
        reserved_metadata_dimensions: Sequence[str] = (),
        prompt_builder: PromptBuilder = build_planning_prompt,
        review: ReviewSettings | None = None,
        search_attributes: bool = False,
        memory: ConversationMemory | None = None,
        review_webhook: ReviewWebhook | None = None,
        instructions: str = "",
    ) -> None:
        self.registry = registry
        self.tools = tools
        self.planner = planner
        self.synthesizer = synthesizer
        self.store = store
        self.settings = settings or StageSettings()
        self.prompt_builder = prompt_builder
        self.memory = memory
        self.review_webhook = review_webhook
        self.conversations = ConversationActivities()
        self.tool_steps = ToolSteps(self)
        self.leases = LeaseSteps(self)
        self.memory_steps = MemorySteps(self)
        # How conversation memory folds older exchanges into its summary (a bounded heuristic without a
        # summarizer), and the window its summary takes an eighth of (a default one when unknown).
        self.memory_summarizer: MemoryModel | None = None
        self.memory_context_window: int | None = None
        # The pipeline settings (``client.pipeline.PIPELINE_VARIABLES``) these activities already take into
        # account: the worker applies the others, or refuses to start.
        self.applied_settings: frozenset[str] = frozenset()
        self._cache_variation = dict(cache_variation or {})
        review = (review or ReviewSettings()).model_copy(update={"notify": review_webhook is not None})
        self.manifest = PipelineManifest(
            pipeline=registry.pipeline,
            review=review,
            search_attributes=search_attributes,
            reserved_metadata_dimensions=list(reserved_metadata_dimensions),
            instructions=instructions,
        )
        self.rebuild()

    def rebuild(self, *, registry: HookRegistry | None = None, add_tools: Sequence[Any] = ()) -> None:
        """Take a new hook registry or more tools (what the worker adds from its settings before it serves
        anything), and derive the manifest every request records from the parts as they are now."""
        if registry is not None:
            self.registry = registry
        self.tools.add(add_tools)
        vars(self).pop("_recorded_tools", None)
        self.manifest = self.manifest.model_copy(
            update={
                "pipeline": self.registry.pipeline,
                "hooks": self.registry.entries,
                "tools": self.tools.specs(),
                "cache_variation": {**self._builtin_variation(), **self._cache_variation},
                "settings": self.settings,
                "memory": self.memory is not None,
                "review": self.manifest.review.model_copy(update={"notify": self.review_webhook is not None}),
                "fallback": {
                    stage: name
                    for stage, part in (("planning", self.planner), ("synthesis", self.synthesizer))
                    if isinstance(name := getattr(part, "fallback_model", None), str)
                },
            }
        )

    def _builtin_variation(self) -> dict[str, str]:
        """Dimensions the orchestration owns: a cached answer is stale once any of them changes."""

        def digest(value: Any) -> str:
            return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]

        return {
            "pipeline": digest([(e.name, [s.value for s in e.stages]) for e in self.registry.entries]),
            "planner": self.planner_name,
            "synthesizer": getattr(self.synthesizer, "name", type(self.synthesizer).__name__),
            "tools": digest([t.model_dump(mode="json") for t in self.tools.specs()]),
        }

    def activities(self) -> list[Callable[..., Any]]:
        """The bound activity methods to give a ``Worker``: one per stage of the stage table, then the
        framework's own."""
        return [
            *self.stage_activities(),
            self.resolve_pipeline,
            *self.memory_steps.activities(),
            self.plan,
            *self.tool_steps.activities(),
            self.synthesize,
            self.persist_execution_record,
            self.run_detached_work,
            self.merge_effect_update,
            self.notify_reviewers,
            *self.leases.activities(),
            self.conversations.claim_conversation_turn,
            self.conversations.conversation_turn_open,
            self.conversations.resume_conversation,
        ]

    async def aclose(self) -> None:
        """Release what the worker's parts hold open when it stops: MCP server processes and connections,
        a model's HTTP client (a planner or synthesizer with an ``aclose`` method)."""
        await self.tools.aclose()
        for part in (self.planner, self.synthesizer):
            close = getattr(part, "aclose", None)
            if close is not None:
                await close()

    # ------------------------------------------------------------------------------------------------
    # Pipeline
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name="resolve_pipeline")
    @heartbeating
    async def resolve_pipeline(self, input: ResolvePipelineInput) -> PipelineManifest:
        """The hooks (order, stages, required flag, run options), tools and cache dimensions of this
        worker, recorded in history so replay never depends on the worker's current configuration.
        Scoped hooks are filtered here: the request's tenant (metadata ``tenant_id``) and agent
        (``agent_id``) see only global hooks, their tenant's and their agent's. A tool is recorded as
        the workflow decides with it — its key, kind and flags; its description and argument schema
        stay with the activities that plan, validate and call (this worker's registry), out of every
        request's history."""
        tenant, agent = input.metadata.get("tenant_id"), input.metadata.get("agent_id")
        visible = self.registry.visible_entries(
            tenant if isinstance(tenant, str) else None, agent if isinstance(agent, str) else None
        )
        span = trace.get_current_span().get_span_context()
        trace_id = format(span.trace_id, "032x") if span.is_valid else None
        return self.manifest.model_copy(update={"hooks": visible, "tools": self._recorded_tools, "trace_id": trace_id})

    @functools.cached_property
    def _recorded_tools(self) -> list[ToolSpec]:
        """The tools as each request records them (the worker's tools are fixed when it is built)."""
        return [tool.model_copy(update={"description": "", "parameters": {}}) for tool in self.manifest.tools]

    # ------------------------------------------------------------------------------------------------
    # Plan, execute, synthesize, persist
    # ------------------------------------------------------------------------------------------------

    def plan_problems(
        self, plan: Plan, phase: int, prior_step_ids: Sequence[str] = (), available: Sequence[str] | None = None
    ) -> list[str]:
        problems = plan_problems(
            plan,
            self.manifest.tools,
            max_steps=self.settings.max_plan_steps,
            phase=phase,
            prior_step_ids=prior_step_ids,
            available=None if available is None else set(available),
        )
        for step in plan.steps:
            problems.extend(self.tools.argument_problems(step))
        return problems[:10]

    @property
    def planner_name(self) -> str:
        """The planner as the record names it: its ``name``, or its class's."""
        return getattr(self.planner, "name", type(self.planner).__name__)

    @activity.defn(name="plan")
    @heartbeating
    async def plan(self, input: PlanInput) -> PlanOutput:
        """Build the planning prompt from the enrichments and ask the planner for a valid plan; run the
        request's before_planning hooks first and the phase's after_planning hooks on the plan, where the
        workflow sent them."""
        started = time.monotonic()
        if input.hooks is None or not input.hooks.before:
            return self.bounded_result(await self._plan(input, started), "plan")
        before = input.hooks.before
        entries, ran, _ = await self.run_stage(Stage.BEFORE_PLANNING, before)
        enrichments = let_through(BEFORE_PLANNING, ran) if len(ran) == len(before) else None
        planner = self.planner_name
        output = PlanOutput(prompt="", planner=planner, before=entries, planned=False)
        if enrichments is not None:
            try:
                enriched = input.model_copy(update={"enrichments": enrichments})
                output = await self._plan(enriched, started, BeforePlanningRan(ran, entries))
            except Exception as err:  # noqa: BLE001 - the hooks' entries stand; the workflow plans the attempt
                # A planning failure would lose the before_planning hooks' entries with it: they are
                # answered instead, with the model calls the failure reported, and the workflow asks the
                # planner again as it asks for any attempt (retries, fallback and typed failure as usual).
                logger.warning("planning after the before_planning hooks failed; the workflow plans: %s", err)
                output.model_calls = model_calls_in(error_details(err).get("model_calls"))
            output.before = entries
        return self.bounded_result(output, "plan")

    async def _plan(
        self, input: PlanInput, started: float, before_planning: BeforePlanningRan | None = None
    ) -> PlanOutput:
        tools = self.manifest.tools
        if input.tools is not None:  # before_plan hooks narrowed what this attempt may use
            offered = set(input.tools)
            tools = [tool for tool in tools if tool.key in offered]
        calls = ModelCallLog.resumed(input.max_tokens_remaining)
        prompt = self.prompt_builder(
            PromptInput(
                request=input.request,
                enrichments=copy.deepcopy(input.enrichments),
                tools=tools,
                phase=input.phase,
                instructions="" if getattr(self.planner, "instructions_in_system", False) else input.instructions,
                facts=copy.deepcopy(input.facts),
                context_text=input.context_text,
                tools_as_functions=bool(getattr(self.planner, "tools_as_functions", False)),
            )
        )
        planner = self.planner_name
        request = PlanningRequest(
            request=input.request,
            request_id=input.request_id,
            prompt=prompt,
            enrichments=copy.deepcopy(input.enrichments),
            tools=tools,
            phase=input.phase,
            prior_results=[r.model_view() for r in input.prior_results],
            instructions=input.instructions,
            facts=copy.deepcopy(input.facts),
            model_calls=calls,
            attempt=input.attempt,
            context_text=input.context_text,
            repair=input.repair,
            prior_turns=list(input.prior_turns),
            route=input.route,
        )
        try:
            stream = streaming_planner(self.planner) if input.stream else None
            plan = await (publish_plan(stream, request) if stream else self.planner.plan(request))
        except PlanRepairNeeded as need:
            if input.attempt + 1 < MAX_PLAN_ATTEMPTS:
                output = PlanOutput(
                    prompt=recorded_prompt(prompt),
                    planner=planner,
                    model_calls=calls.calls,
                    problems=need.problems,
                    repair=need.repair,
                )
                return output
            raise ApplicationError(
                f"the planner's plan was still invalid on attempt {input.attempt + 1}: " + "; ".join(need.problems),
                {"problems": need.problems, "model_calls": [call.model_dump(mode="json") for call in calls.calls]},
                type=decisions.INVALID_PLAN,
                non_retryable=True,
            ) from None
        recorded = [call.model_dump(mode="json") for call in calls.calls]
        if not isinstance(plan, Plan):
            raise ApplicationError(
                f"planner returned {type(plan).__name__}, not a Plan",
                {"model_calls": recorded},
                type=decisions.INVALID_PLAN,
                non_retryable=True,
            )
        problems = self.plan_problems(plan, input.phase, [r.step_id for r in input.prior_results], input.tools)
        if problems:
            raise ApplicationError(
                "planner produced an invalid plan: " + "; ".join(problems),
                {"problems": problems, "model_calls": recorded},
                type=decisions.INVALID_PLAN,
                non_retryable=True,
            )
        draft = None
        if plan.answer and not plan.steps:  # the planner answered in text: the record keeps it as a draft
            preview = masked_preview(plan.answer, DRAFT_PREVIEW_CHARS, ellipsis=True)
            draft = ModelDraft.of(plan.answer, preview).model_copy(update={"stage": "planning", "phase": plan.phase})
        output = PlanOutput(
            plan=plan,
            prompt=recorded_prompt(prompt),
            planner=planner,
            model_calls=calls.calls,
            model_turn=calls.turn,
            draft=draft,
        )
        if input.hooks is not None and input.hooks.after:
            await self._after_planning(input, output, started, before_planning)
        return output

    async def _after_planning(
        self, input: PlanInput, output: PlanOutput, started: float, before_planning: BeforePlanningRan | None
    ) -> None:
        """Run the phase's after_planning hooks on the plan (``PlanInput.hooks``), in order, each exactly as a
        local batch runs it (its attempts, timeout, span and checks); their entries go back in ``output``, a
        hook's failure among them, never raised (the planner is not asked again for it). Where the workflow
        handed over the accepted plan's snapshot and every hook left the plan and the run as they were:
        a plan with steps, write that snapshot as the workflow would build it from the same outcomes (with
        ``before_planning``, the hooks of that stage this activity ran first); a text answer, where the
        workflow sent what follows it (``PlanHooks.ending``), run on into it (``end_with_answer``)."""
        hooks, plan = input.hooks, output.plan
        assert hooks is not None and plan is not None
        output.hooks_after_ms = round((time.monotonic() - started) * 1000.0, 3)
        spent = ModelUsage.of(output.model_calls).total_tokens
        calls = [AFTER_PLANNING.on_plan(built, plan, spent, input.enrichments) for built in hooks.after]
        output.after, ran, ran_on = await self.run_stage(Stage.AFTER_PLANNING, calls)
        write = hooks.write
        if write is None or not ran_on:
            return
        if not plan.steps:
            if hooks.ending is not None:
                await self.end_with_answer(hooks.ending, write, output, input, before_planning)
            return
        took_planned(write.record, output, input.route)
        entries, after_ms = output.after, output.hooks_after_ms
        output.snapshot = await self._write_snapshot(
            write.record,
            lambda: accepted_plan_snapshot(
                write, ran, entries, after_ms=after_ms, before_planning=before_planning, in_place=True
            ),
            "accepted plan",
        )

    @activity.defn(name="synthesize")
    @heartbeating
    async def synthesize(self, input: SynthesizeInput) -> SynthesizeOutput:
        """Ask the synthesizer for the answer (the model output, before after_synthesis hooks); with
        ``input.stream`` and a synthesizer that can stream, publish its text to the request's answer
        stream as it is written."""
        stream = streaming_synthesizer(self.synthesizer) if input.stream else None
        output = await (publish_answer(stream, input) if stream else self.synthesizer.synthesize(input))
        if not isinstance(output, SynthesizeOutput):
            raise ApplicationError(
                f"synthesizer returned {type(output).__name__}, not SynthesizeOutput",
                type="InvalidSynthesis",
                non_retryable=True,
            )
        preview = masked_preview(output.response, DRAFT_PREVIEW_CHARS, ellipsis=True)
        return self.bounded_result(
            output.model_copy(update={"draft": ModelDraft.of(output.response, preview)}), "synthesize"
        )

    @activity.defn(name="persist_execution_record")
    @heartbeating
    async def persist_execution_record(self, input: PersistRecordInput) -> PersistRecordOutput:
        """Write a full record snapshot; an older or equal revision never replaces a newer one. A write
        that cannot succeed — the store refuses it (``storage.executions.lasting``), or its workflow's last
        attempt fails too, a timeout included — ends in the non-retryable ``RecordNotStored``, the store's
        error in its details; any other failure is retried."""
        info = activity.info()
        try:
            async with asyncio.timeout(_write_budget(info.start_to_close_timeout)):
                revision, written = await self.save_record(input.record)
        except Exception as err:
            refused = lasting(err)
            if not refused and (input.final_attempt is None or info.attempt < input.final_attempt):
                raise
            problem = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[
                :MAX_STORE_ERROR_CHARS
            ]
            raise ApplicationError(
                f"the execution record (revision {input.record.record_revision}) was not stored: {problem}",
                {
                    "revision": input.record.record_revision,
                    "store_error": problem,
                    "attempts": info.attempt,
                    "refused": refused,
                },
                type=decisions.RECORD_NOT_STORED,
                non_retryable=True,
            ) from None
        return PersistRecordOutput(stored_revision=revision, written=written)

    async def save_record(self, record: ExecutionRecord) -> tuple[int, bool]:
        return await self.store.save(record)

    # ------------------------------------------------------------------------------------------------
    # Detached effects
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name="run_detached_work")
    @heartbeating
    async def run_detached_work(self, input: DetachedEffectInput) -> DetachedWorkResult:
        """Run the work a hook detached, through that hook's ``run_detached``."""
        work = input.work
        try:
            hook = self.registry.hook(work.hook)
        except LookupError as err:
            raise ApplicationError(str(err), type="HookNotRegistered", non_retryable=True) from None
        ctx = DetachedContext(
            effect_id=work.effect_id,
            name=work.name,
            payload=copy.deepcopy(work.payload),
            request_id=input.request_id,
            workflow_id=input.parent_workflow_id,
            attempt=activity.info().attempt,
            run_id=input.parent_run_id,
        )
        with telemetry.tracer().start_as_current_span(
            f"pipeline.hook.detached.{work.hook}",
            attributes={"pipeline.hook.name": work.hook, "pipeline.effect_id": work.effect_id},
        ):
            value = await call_hook(hook.run_detached, ctx)
        return self.bounded_result(returned_or_default(value, DetachedWorkResult, "run_detached"), "run_detached")

    @activity.defn(name="merge_effect_update")
    @heartbeating
    async def merge_effect_update(self, input: EffectUpdateInput) -> PersistRecordOutput:
        """Merge a terminal effect into the stored record of its request (accepted once per effect)."""
        revision, written = await self.store.update_effect(input.workflow_id, input.run_id, input.effect)
        return PersistRecordOutput(stored_revision=revision, written=written)

    @activity.defn(name=NOTIFY_REVIEWERS_ACTIVITY)
    @heartbeating
    async def notify_reviewers(self, input: ReviewNotificationInput) -> ReviewNotificationResult:
        """Tell the reviewers' webhook that a checkpoint opened (one attempt; the child retries)."""
        if self.review_webhook is None:
            raise ApplicationError(
                "this worker has no reviewers' webhook (AGENT_REVIEW_WEBHOOK)",
                type=WEBHOOK_NOT_CONFIGURED,
                non_retryable=True,
            )
        with telemetry.tracer().start_as_current_span(
            "pipeline.review.notify",
            attributes={
                "pipeline.checkpoint_id": input.checkpoint.checkpoint_id,
                "pipeline.request_id": input.request_id,
            },
        ):
            return await self.review_webhook.deliver(input)


def _write_budget(start_to_close: timedelta | None) -> float | None:
    """How long one attempt at writing a snapshot may take: less than its start-to-close timeout, so that
    a store that hangs on the last attempt still ends it in the typed failure, not in the timeout."""
    if start_to_close is None:
        return None
    seconds = start_to_close.total_seconds()
    return max(seconds / 2, seconds - WRITE_MARGIN_SECONDS)


def recorded_prompt(prompt: str) -> str:
    """The planning prompt as the record keeps it (its first ``MAX_RECORDED_PROMPT_CHARS`` characters):
    cut here, so a prompt of a large context never travels through the history (or the payload store)
    only to be cut by the workflow."""
    return prompt[:MAX_RECORDED_PROMPT_CHARS]
