"""Consecutive in-process hooks of one stage run in one local activity: one marker in history for the run
of them, while each hook keeps its own invocation — the stage's values as the hooks before it left them,
its own attempts and timeout, its record entry, its span — and the batch stops where only the workflow
can go on (a failure, a short-circuit, a denial)."""

from __future__ import annotations

import asyncio

from temporalio.api.enums.v1 import EventType

from demo.tools import quote_price
from hooks import PipelineShortCircuit, RunMode, ToolDecision
from workflows import data_converter
from workflows.models import FailurePolicy, InvocationOutcome, Stage, StageSettings
from workflows.stages import hook_stage_of

from .conftest import with_payload_store
from .doubles import FixedPlanner, decision, quote
from .harness import Harness, Outcome

ACME = f"ACME is trading at {quote_price('ACME')} USD."


def markers(out: Outcome) -> list[tuple[str, str | None]]:
    """(activity type, summary) of every local-activity marker, in history order."""
    found = []
    converter = data_converter.payload_converter
    for event in out.history.events:
        if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
            continue
        details = event.marker_recorded_event_attributes.details
        if "data" not in details:
            continue
        summary = None
        if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
            summary = converter.from_payload(event.user_metadata.summary, str)
        found.append((converter.from_payloads(details["data"].payloads)[0]["activity_type"], summary))
    return found


def hook_markers(out: Outcome) -> list[tuple[str, str | None]]:
    """The markers of in-process hooks: each typed ``<stage>:<hook>``, a batch ``<stage>:<hook> + <hook>``."""
    return [m for m in markers(out) if hook_stage_of(m[0]) is not None]


def invocations(out: Outcome, stage: Stage) -> list[tuple[str, int, str]]:
    return [(i.hook, i.sequence, i.outcome.value) for i in out.record.invocations(stage)]


class Suffix:
    """after_synthesis: appends its suffix; remembers what it received."""

    def __init__(self, name: str, run_mode: RunMode = RunMode.LOCAL_ACTIVITY) -> None:
        self.name, self.run_mode = name, run_mode
        self.received: list[str] = []

    async def after_synthesis(self, ctx, response: str) -> str:
        self.received.append(response)
        return response + self.name.upper()


async def test_five_in_process_hooks_chain_through_one_local_activity_and_each_is_recorded(client, tmp_path, spans):
    hooks = [Suffix(n) for n in "abcde"]
    async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(quote("q", "ACME"))) as h:
        out = await h.run("price of ACME")

    assert out.failure is None
    assert out.result.response == ACME + "ABCDE"
    assert [hook.received for hook in hooks] == [[ACME], [ACME + "A"], [ACME + "AB"], [ACME + "ABC"], [ACME + "ABCD"]]
    # One marker for the five, named by stage and hooks; no marker or activity per hook.
    assert hook_markers(out) == [("after_synthesis:a + b + c + d + e", "after_synthesis · a, b, c, d, e")]
    assert [a for a in out.scheduled if a.activity_type == "after_synthesis_hook" and not a.batched] == []
    # Each invocation is its own: in the record, in the history's view of the batch, and as a span.
    assert invocations(out, Stage.AFTER_SYNTHESIS) == [(n, i, "succeeded") for i, n in enumerate("abcde", start=1)]
    assert out.hook_summaries() == [f"after_synthesis · {n}" for n in "abcde"]
    found = [s.name for s in spans.get_finished_spans() if s.name.startswith("pipeline.hook.after_synthesis.")]
    assert sorted(found) == [f"pipeline.hook.after_synthesis.{n}" for n in "abcde"]
    recorded = out.record.invocations(Stage.AFTER_SYNTHESIS)
    assert all(a.started_at <= b.started_at for a, b in zip(recorded, recorded[1:], strict=False))


async def test_with_batching_off_each_in_process_hook_has_its_own_marker(client, tmp_path):
    hooks = [Suffix(n) for n in "abc"]
    settings = StageSettings(batch_local_hooks=False)
    async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(quote("q", "ACME")), settings=settings) as h:
        out = await h.run("price of ACME")

    assert out.result.response == ACME + "ABC"
    assert hook_markers(out) == [(f"after_synthesis:{n}", f"after_synthesis · {n}") for n in "abc"]


async def test_a_hook_that_runs_as_an_activity_splits_the_batch_and_keeps_the_order(client, tmp_path):
    hooks = [Suffix("a"), Suffix("b"), Suffix("c", RunMode.ACTIVITY), Suffix("d"), Suffix("e")]
    async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(quote("q", "ACME"))) as h:
        out = await h.run("price of ACME")

    assert out.result.response == ACME + "ABCDE"
    assert hook_markers(out) == [
        ("after_synthesis:a + b", "after_synthesis · a, b"),
        ("after_synthesis:d + e", "after_synthesis · d, e"),
    ]
    assert [a.summary for a in out.scheduled if not a.local and a.activity_type == "after_synthesis_hook"] == [
        "after_synthesis · c"
    ]
    assert invocations(out, Stage.AFTER_SYNTHESIS) == [(n, i, "succeeded") for i, n in enumerate("abcde", start=1)]


class Enrich:
    def __init__(self, name: str, key: str, value: str) -> None:
        self.name, self.key, self.value = name, key, value

    def before_planning(self, ctx):
        ctx.enrichments[self.key] = self.value


class Reader:
    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[dict] = []

    def before_planning(self, ctx):
        self.seen.append(dict(ctx.enrichments))


class Cache:
    name = "cache"

    def before_planning(self, ctx):
        return PipelineShortCircuit(response="from the cache", source="test-cache")


async def test_enrichments_carry_to_the_next_hook_and_a_short_circuit_ends_the_batch(client, tmp_path):
    reader, late = Reader("reader"), Reader("late")
    hooks = [Enrich("enrich", "profile", "gold"), reader, Enrich("more", "region", "eu"), Cache(), late]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        out = await h.run("Hello there")

    assert out.failure is None
    assert out.result.response == "from the cache"
    assert reader.seen == [{"profile": "gold"}]
    assert late.seen == []  # never reached: the short-circuit ended the stage
    assert invocations(out, Stage.BEFORE_PLANNING) == [
        ("enrich", 1, "succeeded"),
        ("reader", 2, "succeeded"),
        ("more", 3, "succeeded"),
        ("cache", 4, "succeeded"),
    ]
    assert out.hook_summaries() == [f"before_planning · {n}" for n in ("enrich", "reader", "more", "cache")]
    assert out.record.enrichments == {"profile": "gold", "region": "eu"}
    assert "plan" not in out.activity_types()


class Flaky:
    """after_synthesis: raises on its first ``failures`` calls (optional: it fails open)."""

    max_attempts = 3
    failure_policy = FailurePolicy.FAIL_OPEN

    def __init__(self, name: str, failures: int) -> None:
        self.name, self.failures, self.calls = name, failures, 0

    async def after_synthesis(self, ctx, response: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"{self.name} failed (call {self.calls})")
        return response + "!"


class Slow:
    name = "slow"
    timeout_seconds = 1.0
    max_attempts = 1
    failure_policy = FailurePolicy.FAIL_OPEN

    async def after_synthesis(self, ctx, response: str) -> str:
        await asyncio.sleep(30)
        return response


async def test_each_hook_keeps_its_attempts_and_timeout_and_a_failure_fails_open_without_losing_the_rest(
    client, tmp_path
):
    retried, broken, after = Flaky("retried", failures=2), Flaky("broken", failures=5), Suffix("after")
    hooks = [Suffix("first"), retried, broken, Slow(), after]
    async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(quote("q", "ACME"))) as h:
        out = await h.run("price of ACME")

    assert out.failure is None
    # first, retried (third attempt), then broken and slow failed open; after still ran on the chain.
    assert out.result.response == ACME + "FIRST!AFTER"
    assert retried.calls == 3 and broken.calls == 3
    assert after.received == [ACME + "FIRST!"]
    recorded = {i.hook: i for i in out.record.invocations(Stage.AFTER_SYNTHESIS)}
    assert [i.hook for i in out.record.invocations(Stage.AFTER_SYNTHESIS)] == [
        "first",
        "retried",
        "broken",
        "slow",
        "after",
    ]
    assert recorded["retried"].outcome is InvocationOutcome.SUCCEEDED
    assert recorded["broken"].outcome is InvocationOutcome.FAILED
    assert recorded["broken"].error == "broken failed (call 3)"
    assert decision(recorded["broken"])[:2] == ("fail_open", "continue")
    assert recorded["slow"].outcome is InvocationOutcome.TIMED_OUT
    assert recorded["slow"].error == "hook did not finish within 1s (start_to_close)"
    # The batch stopped at each failure; the workflow went on from the next hook.
    assert hook_markers(out) == [
        (
            "after_synthesis:first + retried + broken + slow + after",
            "after_synthesis · first, retried, broken, slow, after",
        ),
        ("after_synthesis:slow + after", "after_synthesis · slow, after"),
        ("after_synthesis:after", "after_synthesis · after"),
    ]


class Rewrite:
    """before_tool: quotes MSFT instead (a modify verdict)."""

    name = "rewrite"

    def before_tool(self, ctx, call):
        return ToolDecision.modify({**call.arguments, "symbol": "MSFT"}, reason="swap")


class Watch:
    name = "watch"

    def __init__(self) -> None:
        self.arguments: list[dict] = []

    def before_tool(self, ctx, call):
        self.arguments.append(dict(call.arguments))


class Deny:
    name = "deny"

    def before_tool(self, ctx, call):
        return ToolDecision.deny("not today")


async def test_tool_hooks_see_the_arguments_the_hooks_before_them_set_and_a_denial_ends_the_batch(client, tmp_path):
    watch, late = Watch(), Watch()
    late.name = "late"
    async with Harness(
        client, tmp_path, hooks=[Rewrite(), watch, Deny(), late], planner=FixedPlanner(quote("q", "ACME"))
    ) as h:
        out = await h.run("price of ACME")

    assert out.failure is None
    assert watch.arguments == [{"symbol": "MSFT"}]
    assert late.arguments == []
    [step] = out.record.steps
    assert step.status.value == "skipped" and step.skipped_by == "deny"
    assert step.arguments == {"symbol": "MSFT"} and step.modified_by == ["rewrite"]
    assert invocations(out, Stage.BEFORE_TOOL) == [
        ("rewrite", 1, "succeeded"),
        ("watch", 2, "succeeded"),
        ("deny", 3, "succeeded"),
    ]
    # The step's tool hooks all run in-process: they run in the step's own activity (no marker), which the
    # denial ends before the tool.
    assert hook_markers(out) == []
    assert [a.summary for a in out.tool_activities] == []
    assert [a.summary for a in out.scheduled if a.batched] == [
        "before_tool · rewrite · q",
        "before_tool · watch · q",
        "before_tool · deny · q",
    ]


class Keep:
    """after_synthesis: returns the answer as it received it; remembers what it received."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.received: list[str] = []

    def after_synthesis(self, ctx, response: str) -> str:
        self.received.append(response)
        return response


class KeepPlan:
    name = "keep-plan"

    def after_planning(self, ctx, plan):
        return plan


def marker_result(out: Outcome, activity_type: str) -> dict:
    """What a local activity's marker recorded as its result, as history holds it."""
    for recorded, result in out.local_results():
        if recorded == activity_type:
            return result
    raise AssertionError(f"no marker {activity_type!r}")


async def test_an_outcome_records_the_subject_only_where_its_hook_changed_it(client, tmp_path):
    first, last = Keep("first"), Keep("last")
    hooks = [KeepPlan(), first, Suffix("a"), last]
    stored = with_payload_store(client, tmp_path)
    async with Harness(stored, tmp_path, hooks=hooks, planner=FixedPlanner(quote("q", "ACME"))) as h:
        out = await h.run("price of ACME")

    assert out.failure is None
    assert out.result.response == ACME + "A"
    assert (first.received, last.received) == ([ACME], [ACME + "A"])
    # The hooks that left the answer as they received it hand nothing back to history; the one that
    # changed it hands its answer. The workflow takes the others' from what each received.
    batch = marker_result(out, "after_synthesis:first + a + last")["entries"]
    assert [("response" in e["outcome"], e["outcome"].get("response")) for e in batch] == [
        (False, None),
        (True, ACME + "A"),
        (False, None),
    ]
    assert [e["outcome"]["decision"]["reason"] for e in batch] == ["accepted"] * 3
    # The phase's only after_planning hook runs in the planning activity, which also writes the accepted
    # plan (see tests/test_records.py), and the plan it left as it was stays out of its entry: the tools
    # still run the plan.
    [kept] = out.planning_outputs()
    [entry] = kept["after"]
    assert kept["snapshot"]["revision"] == 1 and kept["snapshot"]["written"] is True
    assert "plan" not in entry["outcome"] and entry["outcome"]["changed"] is False
    assert entry["outcome"]["decision"]["reason"] == "accepted"
    assert [(s.step_id, s.status.value) for s in out.record.steps] == [("q", "succeeded")]
    assert invocations(out, Stage.AFTER_PLANNING) == [("keep-plan", 1, "succeeded")]
    assert invocations(out, Stage.AFTER_SYNTHESIS) == [
        ("first", 1, "succeeded"),
        ("a", 2, "succeeded"),
        ("last", 3, "succeeded"),
    ]
