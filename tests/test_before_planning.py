"""before_planning against a real Temporal server: enrichment effects, metadata auto-promotion, the
planning prompt, every short-circuit branch, failures, spans and the short-circuit metric."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from activities.planning import PlanningRequest
from activities.telemetry import SHORT_CIRCUIT_METRIC
from demo.agent import RulePlanner
from hooks import HookRejection, PipelineHook, PipelineShortCircuit, PipelineShortCircuitDecision
from hooks.builtin import ResponseCacheHook
from workflows.converter import data_converter
from workflows.models import MAX_RECORDED_PROMPT_CHARS, InvocationOutcome, Plan, PlanOutput, RequestStatus, Stage

from .doubles import decision
from .harness import Harness, Outcome

QUOTE = "What is the price of ACME?"
FULL_LIFECYCLE = [
    "resolve_pipeline",
    "before_planning_hook",
    "plan",
    "execute_tool_step",
    "synthesize",
    "persist_execution_record",
]


# --------------------------------------------------------------------------------------------------
# Tiny hooks and helpers
# --------------------------------------------------------------------------------------------------


class Enrich(PipelineHook):
    """Legacy before_planning hook that applies ``edit`` to the enrichments and records what it saw."""

    max_attempts = 1

    def __init__(self, name: str, edit: Callable[[dict], None] = lambda e: None) -> None:
        self.name = name
        self.edit = edit
        self.seen: list[dict] = []
        self.seen_metadata: list[dict] = []

    def before_planning(self, ctx):
        self.seen.append(dict(ctx.enrichments))
        self.seen_metadata.append(dict(ctx.metadata))
        self.edit(ctx.enrichments)
        return None


class AsyncEnrich(PipelineHook):
    """The same through the decision contract, as an ``async def``."""

    max_attempts = 1

    def __init__(self, name: str, edit: Callable[[dict], None]) -> None:
        self.name = name
        self.edit = edit
        self.seen: list[dict] = []

    async def before_planning_decision(self, ctx, gate):
        self.seen.append(dict(ctx.enrichments))
        self.edit(ctx.enrichments)
        return None


class Legacy(PipelineHook):
    """Legacy short-circuit (authoritative by definition); counts its calls."""

    max_attempts = 1

    def __init__(self, name: str, response: str = "Denied by policy.", metadata: dict | None = None) -> None:
        self.name = name
        self.response = response
        self.metadata = metadata or {}
        self.calls = 0

    def before_planning(self, ctx):
        self.calls += 1
        ctx.enrichments[f"{self.name}_note"] = "checked"
        return PipelineShortCircuit(response=self.response, source=f"{self.name}-source", metadata=self.metadata)

    def after_synthesis(self, ctx, response):
        self.calls += 1
        return response + " [tail]"


class Decide(PipelineHook):
    """Decision hook returning ``make(ctx, gate)``; counts its calls."""

    def __init__(self, name: str, make: Callable[[Any, Any], Any], max_attempts: int = 1) -> None:
        self.name = name
        self.make = make
        self.max_attempts = max_attempts
        self.calls = 0

    def before_planning_decision(self, ctx, gate):
        self.calls += 1
        return self.make(ctx, gate)


class RememberVary(PipelineHook):
    """A cache that stores ``gate.cache_vary()`` at the first request (its write) and answers every later
    request with that stored map as ``cached_against``."""

    max_attempts = 1

    def __init__(self, name: str = "vary-cache", response: str = "cached answer") -> None:
        self.name = name
        self.response = response
        self.stored: dict[str, str] | None = None
        self.read_disabled: list[bool] = []

    async def before_planning_decision(self, ctx, gate):
        self.read_disabled.append(gate.response_cache_read_disabled())
        if self.stored is None:
            self.stored = gate.cache_vary()
            return None
        return PipelineShortCircuitDecision(
            short_circuit=PipelineShortCircuit(response=self.response, source=self.name, metadata={"hit": True}),
            kind="cache",
            cached_against=dict(self.stored),
        )


class Boom(PipelineHook):
    """Writes an enrichment, then raises ``error``; counts its calls."""

    def __init__(self, name: str, error: Exception, max_attempts: int | None = None) -> None:
        self.name = name
        self.error = error
        if max_attempts is not None:
            self.max_attempts = max_attempts
        self.calls = 0

    def before_planning(self, ctx):
        self.calls += 1
        ctx.enrichments["partial"] = "half-written"
        raise self.error


class CapturingPlanner:
    """A Planner that keeps what it received and delegates to the demo rule planner."""

    name = "capturing-planner/1"

    def __init__(self) -> None:
        self.requests: list[PlanningRequest] = []
        self._inner = RulePlanner()

    async def plan(self, request: PlanningRequest) -> Plan:
        self.requests.append(request)
        return await self._inner.plan(request)


def cache_decision(response: str = "cached", cached_against: dict | None = None, kind: str = "cache"):
    return PipelineShortCircuitDecision(
        short_circuit=PipelineShortCircuit(response=response, source="test-cache"),
        kind=kind,
        cached_against=cached_against or {},
    )


def invocation(out: Outcome, hook: str):
    found = out.record.invocations(Stage.BEFORE_PLANNING, hook)
    assert len(found) == 1, f"expected one before_planning invocation of {hook}, got {found}"
    return found[0]


def enrichment_effects(record) -> list[tuple[str, str, dict]]:
    return [(e.effect_id, e.hook, e.data) for e in record.effects if e.effect_id.startswith("planning_enrichment:")]


def short_circuit_counts(reader) -> dict[tuple[tuple[str, Any], ...], int]:
    data = reader.get_metrics_data()
    points: dict[tuple[tuple[str, Any], ...], int] = {}
    if data is None:
        return points
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == SHORT_CIRCUIT_METRIC:
                    for point in metric.data.data_points:
                        points[tuple(sorted(point.attributes.items()))] = point.value
    return points


def delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def label(kind: str, reason: str, status: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"kind": kind, "reason": reason, "status": status}.items()))


def assert_short_circuited(out: Outcome, *served_hooks: str) -> None:
    """Only resolve, the named before_planning hooks, finalizers and the record write ran."""
    assert out.failure is None, out.failure
    ran = [t for t in out.activity_types() if t != "on_finish_hook"]
    assert ran == ["resolve_pipeline", *["before_planning_hook"] * len(served_hooks), "persist_execution_record"]
    assert out.hook_summaries() == [f"before_planning · {h}" for h in served_hooks]
    assert out.result.confidence == 1.0
    assert out.tool_activities == []


def assert_planned(out: Outcome) -> None:
    assert out.failure is None, out.failure
    assert out.result.short_circuit is None
    types = out.activity_types()
    assert "plan" in types and "synthesize" in types
    assert "ACME is trading at" in out.result.response


# --------------------------------------------------------------------------------------------------
# Enrichments and their effects
# --------------------------------------------------------------------------------------------------


async def test_enrichment_changes_are_recorded_as_effects_with_exact_values(client, tmp_path):
    topic_v1 = {"ticker": "ACME", "weights": [0.5, 1.5], "live": True, "note": None}
    topic_v2 = {"ticker": "ACME", "weights": [0.5, 1.5, 2.0], "live": False}

    def add(e):
        e["topic"] = topic_v1
        e["scratch"] = "temporary notes"
        e["keep"] = 3

    def update_and_remove(e):
        e["topic"] = topic_v2
        del e["scratch"]
        e["keep"] = 3  # unchanged value: not an effect

    adder, updater = Enrich("adder", add), AsyncEnrich("updater", update_and_remove)
    async with Harness(client, tmp_path, hooks=[adder, updater]) as h:
        out = await h.run("hello there")

    assert out.failure is None
    assert updater.seen == [{"topic": topic_v1, "scratch": "temporary notes", "keep": 3}]
    stored = await out.stored()
    for record in (out.record, stored):
        effects = enrichment_effects(record)
        assert sorted(effects, key=lambda e: (e[1], e[0])) == [
            ("planning_enrichment:keep", "adder", {"key": "keep", "operation": "added", "before": None, "after": 3}),
            (
                "planning_enrichment:scratch",
                "adder",
                {"key": "scratch", "operation": "added", "before": None, "after": "temporary notes"},
            ),
            (
                "planning_enrichment:topic",
                "adder",
                {"key": "topic", "operation": "added", "before": None, "after": topic_v1},
            ),
            (
                "planning_enrichment:scratch",
                "updater",
                {"key": "scratch", "operation": "removed", "before": "temporary notes", "after": None},
            ),
            (
                "planning_enrichment:topic",
                "updater",
                {"key": "topic", "operation": "updated", "before": topic_v1, "after": topic_v2},
            ),
        ]
        # Attributed in invocation order: every adder effect precedes every updater effect.
        hooks_in_order = [hook for _, hook, _ in effects]
        assert hooks_in_order == sorted(hooks_in_order, key=["adder", "updater"].index)
        assert all(e.stage is Stage.BEFORE_PLANNING and e.status == "succeeded" for e in record.effects)
        assert record.enrichments == {"topic": topic_v2, "keep": 3}
    assert [decision(i) for i in stored.invocations(Stage.BEFORE_PLANNING)] == [
        ("fail_open", "continue", "accepted"),
        ("fail_open", "continue", "accepted"),
    ]
    assert [i.sequence for i in stored.invocations(Stage.BEFORE_PLANNING)] == [1, 2]


async def test_a_hook_that_changes_nothing_records_no_enrichment_effect(client, tmp_path):
    async with Harness(client, tmp_path, hooks=[Enrich("noop")]) as h:
        out = await h.run("hello there", {"rag_context": "doc"})
    assert out.failure is None
    assert enrichment_effects(out.record) == []
    assert invocation(out, "noop").outcome is InvocationOutcome.SUCCEEDED


# --------------------------------------------------------------------------------------------------
# Metadata auto-promotion: rag_context, conversation_history and conversation_turns become enrichments
# --------------------------------------------------------------------------------------------------


async def test_rag_context_and_conversation_turns_are_promoted_before_hooks_run(client, tmp_path):
    metadata = {
        "rag_context": "ACME makes anvils.",
        "conversation_turns": [
            {"role": "user", "content": "Do you cover ACME?"},
            {"role": "assistant", "content": "Yes, ask me for a quote."},
        ],
        "user_id": "u-17",
        "user_profile": "PROFILE-FROM-METADATA",
        "activity_coordination": "COORD-FROM-METADATA",
        "favourite_colour": "teal",
    }
    peek = Enrich("peek", lambda e: e.update(rag_context=e["rag_context"] + " And rockets."))
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=[peek], planner=planner) as h:
        out = await h.run(QUOTE, metadata)

    assert_planned(out)
    history = "user: Do you cover ACME?\nassistant: Yes, ask me for a quote."
    # The hook saw the promoted values, and only those: arbitrary metadata is not promoted.
    assert peek.seen == [{"rag_context": "ACME makes anvils.", "conversation_history": history}]
    assert peek.seen_metadata[0]["favourite_colour"] == "teal"
    stored = await out.stored()
    assert stored.promoted_enrichments == ["conversation_history", "rag_context"]
    assert stored.enrichments == {"rag_context": "ACME makes anvils. And rockets.", "conversation_history": history}
    # The override is an ordinary update effect of the hook, with the promoted value as "before".
    assert [(eid, hook, data) for eid, hook, data in enrichment_effects(stored)] == [
        (
            "planning_enrichment:rag_context",
            "peek",
            {
                "key": "rag_context",
                "operation": "updated",
                "before": "ACME makes anvils.",
                "after": "ACME makes anvils. And rockets.",
            },
        )
    ]
    prompt = planner.requests[0].prompt
    assert "<agent_memory>\nACME makes anvils. And rockets.\n</agent_memory>" in prompt
    assert f"<conversation_history>\n{history}\n</conversation_history>" in prompt
    for not_promoted in ("PROFILE-FROM-METADATA", "COORD-FROM-METADATA", "teal", "u-17"):
        assert not_promoted not in prompt
    assert set(planner.requests[0].enrichments) == {"rag_context", "conversation_history"}


async def test_promotion_works_with_no_hooks_at_all(client, tmp_path):
    planner = CapturingPlanner()
    metadata = {"rag_context": "Doc: ACME is listed in Frankfurt.", "conversation_history": "user: earlier question"}
    async with Harness(client, tmp_path, hooks=[], planner=planner) as h:
        out = await h.run(QUOTE, metadata)

    assert_planned(out)
    assert "before_planning_hook" not in out.activity_types()
    assert out.record.promoted_enrichments == ["conversation_history", "rag_context"]
    assert out.record.enrichments == metadata
    prompt = planner.requests[0].prompt
    assert "<agent_memory>\nDoc: ACME is listed in Frankfurt.\n</agent_memory>" in prompt
    assert "<conversation_history>\nuser: earlier question\n</conversation_history>" in prompt


async def test_only_hooks_implementing_before_planning_are_scheduled_there(client, tmp_path):
    class RewriteOnly(PipelineHook):
        name = "rewrite-only"

        def after_synthesis(self, ctx, response):
            return response

    async with Harness(client, tmp_path, hooks=[RewriteOnly(), Enrich("enrich")]) as h:
        out = await h.run(QUOTE)
    assert_planned(out)
    assert [s for s in out.hook_summaries() if s.startswith("before_planning")] == ["before_planning · enrich"]
    assert [(i.hook, i.sequence) for i in out.record.invocations(Stage.BEFORE_PLANNING)] == [("enrich", 1)]


async def test_arbitrary_metadata_is_not_promoted(client, tmp_path):
    peek = Enrich("peek")
    async with Harness(client, tmp_path, hooks=[peek]) as h:
        out = await h.run("hello there", {"user_id": "u-1", "topic": "stocks", "locale": "de"})
    assert out.failure is None
    assert peek.seen == [{}]
    assert peek.seen_metadata == [{"user_id": "u-1", "topic": "stocks", "locale": "de"}]
    assert out.record.promoted_enrichments == []
    assert out.record.enrichments == {}


# --------------------------------------------------------------------------------------------------
# The planner's prompt: well-known enrichment keys rendered inside their tags
# --------------------------------------------------------------------------------------------------


async def test_planning_prompt_renders_the_well_known_enrichments(client, tmp_path):
    def add(e):
        e["rag_context"] = "RAG: ACME reports on Friday."
        e["conversation_history"] = "user: what about ACME?"
        e["activity_coordination"] = "agent-7 is already quoting ACME"
        e["user_profile"] = "Prefers terse answers; risk: low."
        e["internal_score"] = "CUSTOM-VALUE-NEVER-RENDERED"

    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=[Enrich("context", add)], planner=planner) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    assert len(planner.requests) == 1
    prompt = planner.requests[0].prompt
    assert "<agent_memory>\nRAG: ACME reports on Friday.\n</agent_memory>" in prompt
    assert "<conversation_history>\nuser: what about ACME?\n</conversation_history>" in prompt
    assert "<agent_coordination>\nagent-7 is already quoting ACME\n</agent_coordination>" in prompt
    # user_profile is inserted verbatim: no tag is added around it.
    assert "Prefers terse answers; risk: low." in prompt
    assert "<user_profile>" not in prompt and "</user_profile>" not in prompt
    # A custom key is not rendered by the default builder, but custom builders can read the snapshot.
    assert "CUSTOM-VALUE-NEVER-RENDERED" not in prompt and "internal_score" not in prompt
    assert planner.requests[0].enrichments["internal_score"] == "CUSTOM-VALUE-NEVER-RENDERED"
    assert QUOTE in prompt
    stored = await out.stored()
    assert stored.planning_prompt == prompt
    assert stored.planner == "capturing-planner/1"


async def test_a_prompt_longer_than_the_record_keeps_is_cut_before_it_leaves_the_activity(client, tmp_path):
    """The planner reads the whole prompt; the record keeps its first ``MAX_RECORDED_PROMPT_CHARS``
    characters, and only those travel back through the history."""
    context = "ACME quarterly filing, line by line. " * 4000  # about 148,000 characters

    def add(e):
        e["rag_context"] = context

    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=[Enrich("context", add)], planner=planner) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    [request] = planner.requests
    assert context in request.prompt and len(request.prompt) > MAX_RECORDED_PROMPT_CHARS
    stored = await out.stored()
    assert stored.planning_prompt == request.prompt[:MAX_RECORDED_PROMPT_CHARS]
    [completed] = [
        event.activity_task_completed_event_attributes.result
        for event in out.history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and out.history.events[
            event.activity_task_completed_event_attributes.scheduled_event_id - 1
        ].activity_task_scheduled_event_attributes.activity_type.name
        == "plan"
    ]
    [returned] = await client.data_converter.decode(list(completed.payloads), [PlanOutput])
    assert returned.prompt == stored.planning_prompt


async def test_a_preformatted_user_profile_block_is_kept_exactly(client, tmp_path):
    block = "<user_profile>\nname: Ada\n</user_profile>"
    planner = CapturingPlanner()
    async with Harness(
        client, tmp_path, hooks=[Enrich("profile", lambda e: e.update(user_profile=block))], planner=planner
    ) as h:
        out = await h.run(QUOTE)
    assert_planned(out)
    prompt = planner.requests[0].prompt
    assert block in prompt
    assert prompt.count("<user_profile>") == 1


# --------------------------------------------------------------------------------------------------
# Short-circuits: authoritative and cache proposals judged against the request's cache gate
# --------------------------------------------------------------------------------------------------


async def test_legacy_short_circuit_is_authoritative_and_the_first_wins(client, tmp_path, metric_reader):
    early = Enrich("early", lambda e: e.update(note=1, rag_context="from early hook"))
    guard = Legacy("guard", "Requests about ACME are paused.", metadata={"policy": "p-7"})
    tail = Legacy("tail", "tail answer")  # would short-circuit too, and rewrites at after_synthesis
    before = short_circuit_counts(metric_reader)
    async with Harness(client, tmp_path, hooks=[early, guard, tail]) as h:
        out = await h.run(QUOTE, {"conversation_turns": [{"role": "user", "content": "hi"}]})

    assert_short_circuited(out, "early", "guard")
    assert tail.calls == 0
    assert out.result.response == "Requests about ACME are paused."
    sc = out.result.short_circuit
    assert (sc.source, sc.kind, sc.reason) == ("guard-source", "authoritative", "authoritative")
    # Payload metadata plus every enrichment injected so far (promoted, earlier hook, the guard itself).
    assert out.result.metadata == {
        "policy": "p-7",
        "conversation_history": "user: hi",
        "note": 1,
        "rag_context": "from early hook",
        "guard_note": "checked",
    }
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED
    assert [i.hook for i in stored.pipeline_hooks] == ["early", "guard"]
    assert decision(invocation(out, "guard")) == ("fail_open", "short_circuit", "authoritative")
    assert stored.short_circuit == sc
    assert (stored.final_response, stored.confidence) == ("Requests about ACME are paused.", 1.0)
    assert stored.plans == [] and stored.steps == [] and stored.planning_prompt is None and stored.model_draft is None
    # The short-circuiting hook's own enrichment write is still recorded as its effect.
    assert (
        "planning_enrichment:guard_note",
        "guard",
        {"key": "guard_note", "operation": "added", "before": None, "after": "checked"},
    ) in enrichment_effects(stored)
    assert delta(before, short_circuit_counts(metric_reader)) == {
        label("authoritative", "authoritative", "accepted"): 1
    }


async def test_a_legacy_short_circuit_under_reserved_dimensions_is_served_with_a_diagnostic(client, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="activities.hook_stages")
    async with Harness(
        client, tmp_path, hooks=[Legacy("old-cache", "old cached text")], reserved_metadata_dimensions=["locale"]
    ) as h:
        out = await h.run(QUOTE, {"locale": "en"})

    assert_short_circuited(out, "old-cache")
    assert (out.result.short_circuit.kind, out.result.short_circuit.reason) == ("authoritative", "authoritative")
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "activities.hook_stages" and r.levelno == logging.WARNING
    ]
    assert any("old-cache" in w and "legacy short-circuit" in w for w in warnings), warnings


async def test_authoritative_decision_short_circuits_even_with_cache_reads_disabled(client, tmp_path):
    deny = Decide("rate-limit", lambda ctx, gate: cache_decision("Slow down.", kind="authoritative"))
    tail = Legacy("tail")
    async with Harness(client, tmp_path, hooks=[deny, tail]) as h:
        out = await h.run(QUOTE, {"cache": "bypass"})

    assert_short_circuited(out, "rate-limit")
    assert tail.calls == 0
    assert out.result.response == "Slow down."
    assert (out.result.short_circuit.kind, out.result.short_circuit.reason) == ("authoritative", "authoritative")
    assert decision(invocation(out, "rate-limit")) == ("fail_open", "short_circuit", "authoritative")


async def test_matching_cache_decision_is_served(client, tmp_path, spans, metric_reader):
    cache, plain = RememberVary(), Enrich("plain")
    async with Harness(client, tmp_path, hooks=[cache, plain]) as h:
        first = await h.run(QUOTE)
        before = short_circuit_counts(metric_reader)
        spans.clear()
        second = await h.run(QUOTE)

    assert_planned(first)
    assert set(cache.stored) >= {"pipeline", "planner", "synthesizer", "tools"}
    assert_short_circuited(second, "vary-cache")
    assert second.result.response == "cached answer"
    sc = second.result.short_circuit
    assert (sc.source, sc.kind, sc.reason) == ("vary-cache", "cache", "cache_match")
    assert second.result.metadata == {"hit": True}
    assert decision(invocation(second, "vary-cache")) == ("fail_closed", "short_circuit", "cache_match")
    stored = await second.stored()
    assert stored.status is RequestStatus.SUCCEEDED and stored.short_circuit == sc
    assert len(plain.seen) == 1  # only the first request reached the later hook
    # Span: the decision as attributes, and the decision event.
    [span] = [s for s in spans.get_finished_spans() if s.name == "pipeline.hook.before_planning.vary-cache"]
    assert span.attributes["pipeline.hook.decision.failure_policy"] == "fail_closed"
    assert span.attributes["pipeline.hook.decision.action"] == "short_circuit"
    assert span.attributes["pipeline.hook.decision.reason"] == "cache_match"
    [event] = [e for e in span.events if e.name == "pipeline.short_circuit.decision"]
    assert (event.attributes["kind"], event.attributes["reason"], event.attributes["accepted"]) == (
        "cache",
        "cache_match",
        True,
    )
    # Metric: bounded labels only (no hook name, no source).
    changed = delta(before, short_circuit_counts(metric_reader))
    assert changed == {label("cache", "cache_match", "accepted"): 1}
    for labels in short_circuit_counts(metric_reader):
        assert {k for k, _ in labels} == {"kind", "reason", "status"}
        assert "vary-cache" not in {v for _, v in labels}


@pytest.mark.parametrize(
    "written_with, read_with, expected",
    [
        pytest.param({"locale": "en"}, {}, "cache_dimension_mismatch", id="value-only-in-cached_against"),
        pytest.param({}, {"locale": "en"}, "cache_dimension_mismatch", id="value-only-in-request"),
        pytest.param({"locale": "en"}, {"locale": "fr"}, "cache_dimension_mismatch", id="differing-value"),
        pytest.param({"locale": "en"}, {"locale": "en"}, "cache_match", id="same-value"),
        pytest.param({}, {}, "cache_match", id="absent-on-both-sides"),
    ],
)
async def test_cache_decision_checks_reserved_dimensions_symmetrically(
    client, tmp_path, spans, metric_reader, written_with, read_with, expected
):
    cache = RememberVary()
    later = Enrich("later", lambda e: e.update(later="ran"))
    async with Harness(client, tmp_path, hooks=[cache, later], reserved_metadata_dimensions=["locale"]) as h:
        await h.run(QUOTE, written_with)
        assert ("locale" in cache.stored) == ("locale" in written_with)
        before = short_circuit_counts(metric_reader)
        spans.clear()
        out = await h.run(QUOTE, read_with)

    inv = invocation(out, "vary-cache")
    assert inv.outcome is InvocationOutcome.SUCCEEDED
    [span] = [s for s in spans.get_finished_spans() if s.name == "pipeline.hook.before_planning.vary-cache"]
    if expected == "cache_match":
        assert_short_circuited(out, "vary-cache")
        assert decision(inv) == ("fail_closed", "short_circuit", "cache_match")
        assert delta(before, short_circuit_counts(metric_reader)) == {label("cache", "cache_match", "accepted"): 1}
        return
    # Rejected: not served; later hooks and normal planning run.
    assert_planned(out)
    assert out.hook_summaries() == ["before_planning · vary-cache", "before_planning · later"]
    assert decision(inv) == ("fail_closed", "continue", "cache_dimension_mismatch")
    assert out.record.short_circuit is None
    assert out.record.enrichments == {"later": "ran"}
    assert (await out.stored()).status is RequestStatus.SUCCEEDED
    assert span.attributes["pipeline.hook.decision.action"] == "continue"
    assert span.attributes["pipeline.hook.decision.reason"] == "cache_dimension_mismatch"
    assert delta(before, short_circuit_counts(metric_reader)) == {
        label("cache", "cache_dimension_mismatch", "rejected"): 1
    }


async def test_cache_decision_echoing_nothing_does_not_match(client, tmp_path):
    """An empty ``cached_against`` lacks every pipeline-owned dimension: a one-sided mismatch."""
    stale = Decide("empty-vary", lambda ctx, gate: cache_decision("stale", cached_against={}))
    async with Harness(client, tmp_path, hooks=[stale]) as h:
        out = await h.run(QUOTE)
    assert_planned(out)
    assert decision(invocation(out, "empty-vary")) == ("fail_closed", "continue", "cache_dimension_mismatch")


async def test_cache_read_disabled_continues_to_planning(client, tmp_path, metric_reader):
    cache = RememberVary()
    async with Harness(client, tmp_path, hooks=[cache, Enrich("later")]) as h:
        await h.run(QUOTE)
        before = short_circuit_counts(metric_reader)
        bypassed = await h.run(QUOTE, {"cache": "bypass"})
        after_bypass = short_circuit_counts(metric_reader)
        served = await h.run(QUOTE)  # the same entry matches when reads are enabled

    assert cache.read_disabled == [False, True, False]
    assert_planned(bypassed)
    assert bypassed.hook_summaries() == ["before_planning · vary-cache", "before_planning · later"]
    assert decision(invocation(bypassed, "vary-cache")) == ("fail_closed", "continue", "cache_read_disabled")
    assert delta(before, after_bypass) == {label("cache", "cache_read_disabled", "rejected"): 1}
    assert_short_circuited(served, "vary-cache")
    assert served.result.short_circuit.reason == "cache_match"


async def test_demo_response_cache_serves_a_repeat_and_respects_bypass_and_dimensions(client, tmp_path):
    cache = ResponseCacheHook(tmp_path / "response-cache.sqlite3")
    async with Harness(client, tmp_path, hooks=[cache], reserved_metadata_dimensions=["locale"]) as h:
        first = await h.run(QUOTE)
        repeat = await h.run("what is the price of ACME")
        bypass = await h.run(QUOTE, {"cache": "bypass"})
        localized = await h.run(QUOTE, {"locale": "de"})

    assert_planned(first)
    assert_short_circuited(repeat, "response-cache")
    assert repeat.result.response == first.result.response
    assert (repeat.result.short_circuit.source, repeat.result.short_circuit.reason) == ("response-cache", "cache_match")
    lookup = repeat.record.effect("response_cache_lookup")
    assert lookup is not None and lookup.hook == "response-cache" and lookup.summary == "hit"
    assert first.record.effect("response_cache_lookup").summary == "miss"
    assert_planned(bypass)
    assert decision(invocation(bypass, "response-cache")) == ("fail_closed", "continue", "cache_read_disabled")
    assert_planned(localized)
    assert decision(invocation(localized, "response-cache")) == ("fail_closed", "continue", "cache_dimension_mismatch")


async def test_a_rejected_cache_decision_lets_a_later_short_circuit_win(client, tmp_path):
    stale = Decide("stale-cache", lambda ctx, gate: cache_decision("stale answer", cached_against={"pipeline": "old"}))
    enrich = AsyncEnrich("enrich", lambda e: e.update(fact="ACME: anvils"))
    guard = Legacy("guard", "Guard answer.")
    async with Harness(client, tmp_path, hooks=[stale, enrich, guard]) as h:
        out = await h.run(QUOTE)

    assert_short_circuited(out, "stale-cache", "enrich", "guard")
    assert out.result.response == "Guard answer."
    assert out.result.short_circuit.source == "guard-source"
    assert decision(invocation(out, "stale-cache")) == ("fail_closed", "continue", "cache_dimension_mismatch")
    assert decision(invocation(out, "guard")) == ("fail_open", "short_circuit", "authoritative")
    assert out.result.metadata == {"fact": "ACME: anvils", "guard_note": "checked"}


@pytest.mark.parametrize(
    "returned, cause",
    [
        pytest.param(cache_decision(kind="semantic"), "unknown short-circuit kind 'semantic'", id="unknown-kind"),
        pytest.param(
            PipelineShortCircuitDecision(short_circuit=None, kind="cache", cached_against={"pipeline": "x"}),
            "short-circuit decision has no short_circuit payload",
            id="missing-payload-cache",
        ),
        pytest.param(
            PipelineShortCircuitDecision(short_circuit=None, kind="authoritative"),
            "short-circuit decision has no short_circuit payload",
            id="missing-payload-authoritative",
        ),
    ],
)
async def test_a_broken_short_circuit_contract_fails_the_request(client, tmp_path, spans, returned, cause):
    first = Enrich("first", lambda e: e.update(seen="yes"))
    broken = Decide("broken", lambda ctx, gate: returned, max_attempts=3)  # contract errors are never retried
    tail = Legacy("tail")
    async with Harness(client, tmp_path, hooks=[first, broken, tail]) as h:
        out = await h.run(QUOTE)

    assert out.result is None
    assert out.failure is not None and out.failure.type == "HookContractError"
    assert out.failure.non_retryable
    assert cause in out.failure.message and "'broken'" in out.failure.message
    details = out.failure_details()
    assert (details["hook"], details["stage"], details["cause"]) == ("broken", "before_planning", cause)
    # Nothing after the broken hook: no later hook, no planning; only the failed record is written.
    assert out.activity_types() == [
        "resolve_pipeline",
        "before_planning_hook",
        "before_planning_hook",
        "persist_execution_record",
    ]
    assert out.hook_summaries() == ["before_planning · first", "before_planning · broken"]
    assert broken.calls == 1 and tail.calls == 0
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED
    assert stored.error.type == "HookContractError" and stored.error.details["hook"] == "broken"
    inv = invocation(out, "broken")
    assert inv.outcome is InvocationOutcome.FAILED
    assert (inv.error, inv.error_type) == (cause, "HookContractError")
    assert decision(inv) == ("fail_closed", "terminate", "contract_error")
    assert stored.pipeline_hooks == out.record.pipeline_hooks
    assert stored.short_circuit is None and stored.final_response is None
    [span] = [s for s in spans.get_finished_spans() if s.name == "pipeline.hook.before_planning.broken"]
    assert span.attributes["pipeline.hook.decision.action"] == "terminate"


# --------------------------------------------------------------------------------------------------
# Ordinary hook failures (fail open)
# --------------------------------------------------------------------------------------------------


async def test_a_raising_hook_fails_open_and_its_changes_are_dropped(client, tmp_path, spans):
    broken = Boom("retriever", RuntimeError("retrieval backend down: HTTP 503"), max_attempts=1)
    later = Enrich("later", lambda e: e.update(later="ran"))
    async with Harness(client, tmp_path, hooks=[broken, later]) as h:
        out = await h.run(QUOTE, {"rag_context": "promoted doc"})

    assert_planned(out)
    assert broken.calls == 1
    inv = invocation(out, "retriever")
    assert inv.outcome is InvocationOutcome.FAILED
    assert inv.error == "retrieval backend down: HTTP 503"
    assert (inv.error_type, inv.exception_type) == ("HookError", "RuntimeError")
    assert decision(inv) == ("fail_open", "continue", "hook_error")
    # Its enrichment write is not applied: the next hook and the record never see it.
    assert later.seen == [{"rag_context": "promoted doc"}]
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED
    assert stored.enrichments == {"rag_context": "promoted doc", "later": "ran"}
    assert [eid for eid, _, _ in enrichment_effects(stored)] == ["planning_enrichment:later"]
    assert stored.invocations(Stage.BEFORE_PLANNING, "retriever")[0].error == "retrieval backend down: HTTP 503"
    [span] = [s for s in spans.get_finished_spans() if s.name == "pipeline.hook.before_planning.retriever"]
    assert span.attributes["pipeline.hook.outcome"] == "failed"
    assert span.attributes["pipeline.hook.decision.failure_policy"] == "fail_open"
    assert span.attributes["pipeline.hook.decision.action"] == "continue"
    assert span.attributes["pipeline.hook.decision.reason"] == "hook_error"


async def test_a_raising_hook_is_retried_by_default(client, tmp_path, spans):
    broken = Boom("flaky", ValueError("still broken"))  # default max_attempts
    assert broken.max_attempts == 3
    async with Harness(client, tmp_path, hooks=[broken]) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    assert broken.calls == 3
    assert out.hook_summaries() == ["before_planning · flaky"]  # retries are attempts of one activity
    inv = invocation(out, "flaky")
    assert (inv.outcome, inv.error, inv.exception_type) == (InvocationOutcome.FAILED, "still broken", "ValueError")
    assert decision(inv) == ("fail_open", "continue", "hook_error")
    attempts = [s for s in spans.get_finished_spans() if s.name == "pipeline.hook.before_planning.flaky"]
    assert sorted(s.attributes["temporal.activity.attempt"] for s in attempts) == [1, 2, 3]
    final = next(s for s in attempts if s.attributes["temporal.activity.attempt"] == 3)
    assert final.attributes["pipeline.hook.decision.reason"] == "hook_error"


async def test_a_hook_rejection_is_not_retried(client, tmp_path):
    refused = Boom("refuser", HookRejection("not for this tenant"))  # default max_attempts
    async with Harness(client, tmp_path, hooks=[refused]) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    assert refused.calls == 1
    inv = invocation(out, "refuser")
    assert (inv.error, inv.exception_type) == ("not for this tenant", "HookRejection")
    assert decision(inv) == ("fail_open", "continue", "hook_error")


async def test_a_retried_hook_that_recovers_succeeds(client, tmp_path):
    class Recovers(PipelineHook):
        name = "recovers"

        def __init__(self) -> None:
            self.calls = 0

        def before_planning(self, ctx):
            self.calls += 1
            if self.calls < 3:
                raise ConnectionError("transient")
            ctx.enrichments["rag_context"] = "third time lucky"

    hook = Recovers()
    async with Harness(client, tmp_path, hooks=[hook]) as h:
        out = await h.run(QUOTE)
    assert_planned(out)
    assert hook.calls == 3
    inv = invocation(out, "recovers")
    assert (inv.outcome, inv.error) == (InvocationOutcome.SUCCEEDED, None)
    assert decision(inv) == ("fail_open", "continue", "accepted")
    assert out.record.enrichments == {"rag_context": "third time lucky"}


class _WrongLegacy(PipelineHook):
    name = "wrong-legacy"

    def __init__(self) -> None:
        self.calls = 0

    def before_planning(self, ctx):
        self.calls += 1
        ctx.enrichments["dropped"] = "yes"
        return "Here is an answer"


class _WrongDecision(PipelineHook):
    name = "wrong-decision"

    def __init__(self) -> None:
        self.calls = 0

    async def before_planning_decision(self, ctx, gate):
        self.calls += 1
        ctx.enrichments["dropped"] = "yes"
        return PipelineShortCircuit(response="legacy payload on the decision contract", source="x")


@pytest.mark.parametrize(
    "hook_cls, message",
    [
        (_WrongLegacy, "before_planning must return PipelineShortCircuit or None, got str"),
        (
            _WrongDecision,
            "before_planning_decision must return PipelineShortCircuitDecision or None, got PipelineShortCircuit",
        ),
    ],
)
async def test_a_wrong_return_type_is_an_invalid_result_and_fails_open(client, tmp_path, hook_cls, message):
    hook = hook_cls()  # default max_attempts: an invalid result is never retried
    async with Harness(client, tmp_path, hooks=[hook]) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    assert hook.calls == 1
    inv = invocation(out, hook.name)
    assert inv.outcome is InvocationOutcome.FAILED
    assert (inv.error, inv.error_type) == (message, "InvalidHookResult")
    assert decision(inv) == ("fail_open", "continue", "invalid_result")
    assert out.record.enrichments == {} and enrichment_effects(out.record) == []
    assert out.record.short_circuit is None


@pytest.mark.parametrize(
    "bad_value, error_start",
    [
        pytest.param(datetime(2024, 1, 1), "enrichment 'bad' is not JSON", id="datetime"),
        pytest.param({1, 2}, "enrichment 'bad' is not JSON", id="set"),
        pytest.param(math.nan, "enrichment 'bad' is not JSON", id="nan"),
        pytest.param(object(), "enrichment 'bad' is not JSON", id="object"),
        pytest.param("x" * 300_000, "enrichments would be", id="over-size-limit"),
    ],
)
async def test_a_non_json_enrichment_is_an_invalid_result(client, tmp_path, bad_value, error_start):
    def add(e):
        e["good"] = "fine"
        e["bad"] = bad_value

    hook = Enrich("non-json", add)
    later = Enrich("later")
    async with Harness(client, tmp_path, hooks=[hook, later]) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    inv = invocation(out, "non-json")
    assert inv.outcome is InvocationOutcome.FAILED and inv.error_type == "InvalidHookResult"
    assert inv.error.startswith(error_start)
    assert decision(inv) == ("fail_open", "continue", "invalid_result")
    # None of the invocation's changes is applied, not even the valid one.
    assert later.seen == [{}]
    assert out.record.enrichments == {}


async def test_a_non_string_enrichment_key_is_an_invalid_result(client, tmp_path):
    hook = Enrich("int-key", lambda e: e.update({7: "seven"}))
    async with Harness(client, tmp_path, hooks=[hook]) as h:
        out = await h.run(QUOTE)
    assert_planned(out)
    inv = invocation(out, "int-key")
    assert inv.error_type == "InvalidHookResult" and "7" in inv.error
    assert decision(inv) == ("fail_open", "continue", "invalid_result")


# --------------------------------------------------------------------------------------------------
# Spans of succeeding hooks
# --------------------------------------------------------------------------------------------------


async def test_each_invocation_has_a_span_with_its_decision(client, tmp_path, spans):
    hooks = [Enrich("first", lambda e: e.update(a=1)), AsyncEnrich("second", lambda e: e.update(b=2))]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        out = await h.run(QUOTE)
    assert_planned(out)
    for name in ("first", "second"):
        [span] = [s for s in spans.get_finished_spans() if s.name == f"pipeline.hook.before_planning.{name}"]
        assert span.attributes["pipeline.hook.name"] == name
        assert span.attributes["pipeline.hook.stage"] == "before_planning"
        assert span.attributes["pipeline.hook.outcome"] == "succeeded"
        assert span.attributes["pipeline.hook.decision.failure_policy"] == "fail_open"
        assert span.attributes["pipeline.hook.decision.action"] == "continue"
        assert span.attributes["pipeline.hook.decision.reason"] == "accepted"
        assert span.attributes["pipeline.request_id"] == out.workflow_id


# --------------------------------------------------------------------------------------------------
# The request's first planning activity runs the stage
# --------------------------------------------------------------------------------------------------


def planning_summaries(out: Outcome) -> list[str]:
    """What the Temporal UI shows for each planning activity the request scheduled, in order."""
    converter = data_converter.payload_converter
    return [
        converter.from_payload(e.user_metadata.summary, str)
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "plan"
    ]


def local_hook_types(out: Outcome) -> list[str]:
    """The local activities that ran hooks, by the type history records."""
    return [recorded for recorded, _ in out.local_results() if recorded != "resolve_pipeline"]


class FlakyPlanner(CapturingPlanner):
    """Fails its first request as a dropped connection would, then plans as the rule planner does."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def plan(self, request: PlanningRequest) -> Plan:
        if self.failures:
            self.failures -= 1
            self.requests.append(request)
            raise ConnectionResetError("the model endpoint reset the connection")
        return await super().plan(request)


async def test_the_first_planning_activity_runs_the_stage_and_plans_on_what_it_left(client, tmp_path):
    """In-process before_planning hooks run in the request's first planning activity, before the planner: no
    local activity of their own, the activity's summary names them, each is still its own recorded
    invocation (its sequence, its decision, each enrichment change as it ended), and the planner is asked on
    the enrichments they left."""
    first = Enrich("first", lambda e: e.update(desk="equities"))
    second = AsyncEnrich("second", lambda e: e.update(region="emea"))
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=[first, second], planner=planner) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    assert not [t for t in local_hook_types(out) if t.startswith("before_planning")]
    [fused, *_] = planning_summaries(out)
    assert fused.startswith("plan · phase 1 with before_planning:first + second")
    assert second.seen == [{"desk": "equities"}]
    assert [r.enrichments for r in planner.requests] == [{"desk": "equities", "region": "emea"}]
    stored = await out.stored()
    invocations = stored.invocations(Stage.BEFORE_PLANNING)
    assert [(i.hook, i.sequence, i.outcome) for i in invocations] == [
        ("first", 1, InvocationOutcome.SUCCEEDED),
        ("second", 2, InvocationOutcome.SUCCEEDED),
    ]
    assert [decision(i) for i in invocations] == [("fail_open", "continue", "accepted")] * 2
    ended = [i.started_at + timedelta(milliseconds=i.duration_ms) for i in invocations]
    changes = [(e.effect_id, e.hook, e.started_at) for e in stored.effects if e.effect_id.startswith("planning_")]
    assert changes == [
        ("planning_enrichment:desk", "first", ended[0]),
        ("planning_enrichment:region", "second", ended[1]),
    ]
    assert stored.enrichments == {"desk": "equities", "region": "emea"}
    assert [o.get("planned", True) for o in out.planning_outputs()] == [True]


async def test_a_short_circuit_in_the_planning_activity_asks_no_planner(client, tmp_path):
    served = Legacy("served", "ACME closed at 12.")
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=[served], planner=planner) as h:
        out = await h.run(QUOTE)

    assert_short_circuited(out, "served")
    assert out.result.response == "ACME closed at 12."
    assert planner.requests == []
    [answered] = out.planning_outputs()
    assert answered["planned"] is False and len(answered["before"]) == 1
    stored = await out.stored()
    assert stored.planner is None and stored.model_calls == [] and stored.planning_prompt is None


async def test_a_planning_failure_after_the_hooks_keeps_their_entries_and_the_workflow_plans_again(client, tmp_path):
    """A planner that fails after the stage's hooks ran in its activity loses none of their work: the
    activity answers their entries, the hooks ran once and are recorded once, and the workflow asks the
    planner again as it asks for any planning attempt."""
    enrich = Enrich("enrich", lambda e: e.update(desk="equities"))
    planner = FlakyPlanner()
    async with Harness(client, tmp_path, hooks=[enrich], planner=planner) as h:
        out = await h.run(QUOTE)

    assert_planned(out)
    assert len(enrich.seen) == 1
    assert [r.enrichments for r in planner.requests] == [{"desk": "equities"}] * 2
    assert [o.get("planned", True) for o in out.planning_outputs()] == [False, True]
    assert [s.split(" with ")[0] for s in planning_summaries(out)] == ["plan · phase 1"] * 2
    stored = await out.stored()
    assert [(i.hook, i.outcome) for i in stored.invocations(Stage.BEFORE_PLANNING)] == [
        ("enrich", InvocationOutcome.SUCCEEDED)
    ]
    assert stored.enrichments == {"desk": "equities"}
