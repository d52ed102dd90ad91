"""after_execution (observe only) and after_synthesis (chained rewrite), stage filtering, timeouts,
run modes, sync hooks, and the span per invocation."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.enums.v1 import EventType

from activities import Tool
from demo.tools import demo_tools, quote_price
from hooks import (
    ExecutionResult,
    HookRejection,
    PipelineShortCircuit,
    PlanStep,
    RequiredAfterPlanningHook,
    RunMode,
    Stage,
)
from workflows.models import FailurePolicy, RequestStatus, StageSettings

from .doubles import FixedPlanner, NoArguments, decision, span_decision
from .harness import Harness, Outcome, ScheduledActivity

ACME = f"ACME is trading at {quote_price('ACME')} USD."
MSFT = f"MSFT is trading at {quote_price('MSFT')} USD."
QUOTES = "What is the price of ACME and MSFT?"
QUOTES_RESPONSE = f"{ACME}\n{MSFT}"


def local_activities(out: Outcome) -> list[ScheduledActivity]:
    """The hook invocations that ran as local activities (the lifecycle's own bookkeeping aside)."""
    return [a for a in out.scheduled if a.local and a.activity_type.endswith("_hook")]


# --------------------------------------------------------------------------------------------------
# after_execution: observe only
# --------------------------------------------------------------------------------------------------


class BrokenBroker(Tool):
    namespace = "test-tools"
    agent = "broker"
    capability = "place_order"
    Arguments = NoArguments

    async def run(self, arguments, ctx):
        raise RuntimeError("broker offline")


async def test_after_execution_observes_every_step_and_cannot_change_results(client, tmp_path):
    class Tamper:
        name = "tamper"
        seen: list[ExecutionResult] = []

        async def after_execution(self, ctx, execution):
            Tamper.seen.append(execution.model_copy(deep=True))
            execution.steps[0].output = {"symbol": "ACME", "price": 0.01, "currency": "USD"}
            execution.steps[0].status = "failed"
            execution.steps.clear()
            return None

    planner = FixedPlanner(
        PlanStep(
            step_id="quote-acme",
            namespace="demo-tools",
            agent="stock-service",
            capability="stock_quote",
            arguments={"symbol": "ACME"},
        ),
        PlanStep(step_id="order", namespace="test-tools", agent="broker", capability="place_order"),
    )
    async with Harness(
        client,
        tmp_path,
        hooks=[Tamper()],
        planner=planner,
        tools=[*demo_tools(tmp_path), BrokenBroker()],
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("quote and order")

    assert out.failure is None
    [seen] = Tamper.seen
    assert [(s.step_id, s.tool, s.status.value) for s in seen.steps] == [
        ("quote-acme", "stock-service/stock_quote", "succeeded"),
        ("order", "broker/place_order", "failed"),
    ]
    # Observers read the result text a model reads, not the raw output (which the record keeps).
    assert seen.steps[0].output is None and str(quote_price("ACME")) in (seen.steps[0].result or "")
    assert seen.steps[1].error == "broker offline" and seen.steps[1].output is None

    # The in-place changes reached neither synthesis nor the record.
    assert out.result.response == f"{ACME}\nI could not complete broker/place_order (order): error: broker offline"
    assert [s.status.value for s in out.record.steps] == ["succeeded", "failed"]
    assert out.record.steps[0].output["price"] == quote_price("ACME")
    inv = out.record.invocations(Stage.AFTER_EXECUTION, "tamper")[0]
    assert inv.outcome.value == "succeeded"
    assert decision(inv) == ("fail_open", "continue", "accepted")
    # after_execution runs after every tool and before synthesis.
    types = out.activity_types()
    assert types.index("after_execution_hook") > max(i for i, t in enumerate(types) if t == "execute_tool_step")
    assert types.index("after_execution_hook") < types.index("synthesize")


async def test_after_execution_failures_fail_open_and_leave_the_response_alone(client, tmp_path):
    class Chatty:
        name = "chatty"
        calls = 0

        async def after_execution(self, ctx, execution):
            Chatty.calls += 1
            return {"note": "I wanted to change things"}

    class Broken:
        name = "broken"
        max_attempts = 1

        async def after_execution(self, ctx, execution):
            raise KeyError("memory backend")

    class Rejects:
        name = "rejects"

        async def after_execution(self, ctx, execution):
            raise HookRejection("will not record this request")

    class Quiet:
        name = "quiet"
        calls = 0

        async def after_execution(self, ctx, execution):
            Quiet.calls += 1

    async with Harness(client, tmp_path, hooks=[Chatty(), Broken(), Rejects(), Quiet()]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert out.result.response == QUOTES_RESPONSE
    assert out.record.model_draft.matches(QUOTES_RESPONSE) and out.record.final_response == QUOTES_RESPONSE
    assert Chatty.calls == 1 and Quiet.calls == 1  # a wrong return type is not retried
    invocations = out.record.invocations(Stage.AFTER_EXECUTION)
    assert [(i.hook, i.sequence) for i in invocations] == [("chatty", 1), ("broken", 2), ("rejects", 3), ("quiet", 4)]
    chatty, broken, rejects, quiet = invocations
    assert (chatty.outcome.value, chatty.error_type) == ("failed", "InvalidHookResult")
    assert chatty.error == "after_execution observes only and must return None, got dict"
    assert decision(chatty) == ("fail_open", "continue", "invalid_result")
    assert (broken.outcome.value, broken.error_type, broken.exception_type) == ("failed", "HookError", "KeyError")
    assert broken.error == "'memory backend'"
    assert decision(broken) == ("fail_open", "continue", "hook_error")
    assert (rejects.error, rejects.exception_type) == ("will not record this request", "HookRejection")
    assert decision(rejects) == ("fail_open", "continue", "hook_error")
    assert decision(quiet) == ("fail_open", "continue", "accepted")
    assert out.activity_types().count("synthesize") == 1


# --------------------------------------------------------------------------------------------------
# after_synthesis: chained rewrite
# --------------------------------------------------------------------------------------------------


class Append:
    def __init__(self, name: str, suffix: str, run_mode: RunMode = RunMode.LOCAL_ACTIVITY) -> None:
        self.name = name
        self.suffix = suffix
        self.run_mode = run_mode
        self.received: list[str] = []

    async def after_synthesis(self, ctx, response: str) -> str:
        self.received.append(response)
        return response + self.suffix


async def test_after_synthesis_hooks_chain_in_registration_order(client, tmp_path):
    a, b = Append("a", "A"), Append("b", "B")
    async with Harness(client, tmp_path, hooks=[a, b]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert a.received == [QUOTES_RESPONSE]
    assert b.received == [QUOTES_RESPONSE + "A"]
    assert out.result.response == QUOTES_RESPONSE + "AB"
    assert out.record.model_draft.matches(QUOTES_RESPONSE)
    assert out.record.final_response == QUOTES_RESPONSE + "AB"
    assert out.hook_summaries() == ["after_synthesis · a", "after_synthesis · b"]
    assert [decision(i) for i in out.record.invocations(Stage.AFTER_SYNTHESIS)] == [
        ("fail_closed", "continue", "accepted")
    ] * 2
    stored = await out.stored()
    assert stored.model_draft.matches(QUOTES_RESPONSE) and stored.final_response == QUOTES_RESPONSE + "AB"


@pytest.mark.parametrize(
    "returned, error_type, error, reason",
    [
        ("raise", "HookError", "guardrail crashed", "hook_error"),
        (None, "InvalidHookResult", "after_synthesis must return str, got NoneType", "invalid_result"),
        (42, "InvalidHookResult", "after_synthesis must return str, got int", "invalid_result"),
        (b"bytes", "InvalidHookResult", "after_synthesis must return str, got bytes", "invalid_result"),
    ],
)
async def test_a_failing_after_synthesis_hook_keeps_the_previous_text(
    client, tmp_path, returned, error_type, error, reason
):
    class Bad:
        name = "bad"
        max_attempts = 1
        failure_policy = FailurePolicy.FAIL_OPEN  # an optional hook: after_synthesis fails closed by default

        async def after_synthesis(self, ctx, response):
            if returned == "raise":
                raise RuntimeError("guardrail crashed")
            return returned

    a, b = Append("a", "A"), Append("b", "B")
    async with Harness(client, tmp_path, hooks=[a, Bad(), b]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert b.received == [QUOTES_RESPONSE + "A"]
    assert out.result.response == out.record.final_response == QUOTES_RESPONSE + "AB"
    assert out.record.model_draft.matches(QUOTES_RESPONSE)
    bad = out.record.invocations(Stage.AFTER_SYNTHESIS, "bad")[0]
    assert (bad.outcome.value, bad.error_type, bad.error) == ("failed", error_type, error)
    assert decision(bad) == ("fail_open", "continue", reason)


async def test_an_after_synthesis_hook_can_empty_the_response(client, tmp_path):
    class Blank:
        name = "blank"

        async def after_synthesis(self, ctx, response):
            return ""

    async with Harness(client, tmp_path, hooks=[Blank()]) as h:
        out = await h.run(QUOTES)

    assert out.result.response == "" and out.record.final_response == ""
    assert out.record.model_draft.matches(QUOTES_RESPONSE)


# --------------------------------------------------------------------------------------------------
# Stage filtering: no activity for a stage a hook does not implement
# --------------------------------------------------------------------------------------------------


class AllStages:
    name = "all-stages"

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, stage: str) -> None:
        self.calls[stage] = self.calls.get(stage, 0) + 1

    async def before_planning(self, ctx):
        self._count("before_planning")

    async def after_planning(self, ctx, plan):
        self._count("after_planning")
        return plan

    async def after_execution(self, ctx, execution):
        self._count("after_execution")

    async def after_synthesis(self, ctx, response):
        self._count("after_synthesis")
        return response


async def test_a_hook_is_scheduled_only_at_the_stages_it_implements(client, tmp_path):
    all_stages = AllStages()
    async with Harness(client, tmp_path, hooks=[Append("synthesis-only", "!"), all_stages]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert out.hook_summaries() == [
        "before_planning · all-stages",
        "after_planning · all-stages",
        "after_execution · all-stages",
        "after_synthesis · synthesis-only",
        "after_synthesis · all-stages",
    ]
    assert all_stages.calls == {"before_planning": 1, "after_planning": 1, "after_execution": 1, "after_synthesis": 1}
    assert [(i.hook, i.stage.value) for i in out.record.pipeline_hooks] == [
        ("all-stages", "before_planning"),
        ("all-stages", "after_planning"),
        ("all-stages", "after_execution"),
        ("synthesis-only", "after_synthesis"),
        ("all-stages", "after_synthesis"),
    ]
    assert out.result.response == QUOTES_RESPONSE + "!"


async def test_a_pipeline_of_one_stage_schedules_nothing_at_the_others(client, tmp_path):
    async with Harness(client, tmp_path, hooks=[Append("synthesis-only", "!")]) as h:
        out = await h.run(QUOTES)

    assert out.activity_types() == [
        "resolve_pipeline",
        "plan",
        "persist_execution_record",
        "execute_tool_step",
        "execute_tool_step",
        "synthesize",
        "after_synthesis_hook",
        "persist_execution_record",
    ]
    assert [i.stage.value for i in out.record.pipeline_hooks] == ["after_synthesis"]


async def test_a_short_circuit_skips_every_later_stage_hook(client, tmp_path):
    class Answer:
        name = "answer"

        async def before_planning(self, ctx):
            return PipelineShortCircuit(response="from the policy", source="policy")

    all_stages = AllStages()
    async with Harness(client, tmp_path, hooks=[Answer(), all_stages]) as h:
        out = await h.run(QUOTES)

    assert out.result.response == "from the policy"
    assert out.hook_summaries() == ["before_planning · answer"]
    assert all_stages.calls == {}


# --------------------------------------------------------------------------------------------------
# Timeouts
# --------------------------------------------------------------------------------------------------


async def test_a_hanging_ordinary_hook_times_out_and_the_request_completes(client, tmp_path):
    class Hang:
        name = "hang"
        timeout_seconds = 1
        max_attempts = 1
        failure_policy = FailurePolicy.FAIL_OPEN
        run_mode = RunMode.ACTIVITY  # the server times it out

        async def after_execution(self, ctx, execution):
            await asyncio.sleep(60)

        async def after_synthesis(self, ctx, response):
            await asyncio.sleep(60)
            return "never"

    tail = Append("tail", " [checked]")
    async with Harness(client, tmp_path, hooks=[Hang(), tail]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert out.result.response == QUOTES_RESPONSE + " [checked]"
    assert tail.received == [QUOTES_RESPONSE]
    for stage in (Stage.AFTER_EXECUTION, Stage.AFTER_SYNTHESIS):
        [inv] = out.record.invocations(stage, "hang")
        assert inv.outcome.value == "timed_out"
        assert inv.error_type == "HookTimeout"
        assert inv.error == "hook did not finish within 1s (start_to_close)"
        assert decision(inv) == ("fail_open", "continue", "hook_timeout")
    timed_out = [e for e in out.history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
    assert len(timed_out) == 2
    assert (await out.stored()).status is RequestStatus.SUCCEEDED


# --------------------------------------------------------------------------------------------------
# Run modes and sync hooks
# --------------------------------------------------------------------------------------------------


async def test_a_local_activity_hook_is_recorded_but_not_scheduled_on_the_server(client, tmp_path):
    class LocalTag:
        name = "local-tag"
        run_mode = RunMode.LOCAL_ACTIVITY

        def __init__(self) -> None:
            self.observed: list[list[str]] = []

        async def after_planning(self, ctx, plan):
            plan.steps = plan.steps[:1]
            return plan

        async def after_execution(self, ctx, execution):
            self.observed.append([s.step_id for s in execution.steps])

        async def after_synthesis(self, ctx, response):
            return response + " [local]"

    local_tag = LocalTag()
    async with Harness(client, tmp_path, hooks=[local_tag, Append("remote", " [remote]", RunMode.ACTIVITY)]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert out.result.response == f"{ACME} [local] [remote]"
    assert local_tag.observed == [["quote-acme"]]
    assert local_activities(out) == [
        # Batched with the accepted plan's snapshot, which its local activity writes.
        ScheduledActivity(
            "after_planning_hook",
            "after_planning · local-tag",
            local=True,
            batched=True,
            recorded_type="after_planning:local-tag",
        ),
        ScheduledActivity("after_execution_hook", "after_execution · local-tag", local=True),
        ScheduledActivity("after_synthesis_hook", "after_synthesis · local-tag", local=True),
    ]
    assert [a for a in out.scheduled if not a.local and a.activity_type.endswith("_hook")] == [
        ScheduledActivity("after_synthesis_hook", "after_synthesis · remote")
    ]
    server_types = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert "after_planning_hook" not in server_types and "after_execution_hook" not in server_types
    assert server_types.count("after_synthesis_hook") == 1

    invocations = out.record.pipeline_hooks
    assert [(i.hook, i.stage.value, i.sequence, i.outcome.value) for i in invocations] == [
        ("local-tag", "after_planning", 1, "succeeded"),
        ("local-tag", "after_execution", 1, "succeeded"),
        ("local-tag", "after_synthesis", 1, "succeeded"),
        ("remote", "after_synthesis", 2, "succeeded"),
    ]
    assert [decision(i) for i in invocations] == [("fail_open", "continue", "accepted")] * 2 + [
        ("fail_closed", "continue", "accepted")
    ] * 2
    assert [s.step_id for s in out.record.steps] == ["quote-acme"]
    assert out.record.model_draft.matches(ACME)


@pytest.mark.parametrize("failure", ["raise", "wrong_type", "timeout"])
async def test_a_failing_local_activity_hook_fails_open_like_any_other(client, tmp_path, failure):
    class LocalBroken:
        name = "local-broken"
        run_mode = RunMode.LOCAL_ACTIVITY
        max_attempts = 1
        timeout_seconds = 1

        async def after_execution(self, ctx, execution):
            if failure == "raise":
                raise RuntimeError("local failure")
            if failure == "timeout":
                await asyncio.sleep(60)
            return "not None"

    async with Harness(client, tmp_path, hooks=[LocalBroken(), Append("remote", " [remote]", RunMode.ACTIVITY)]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None, f"the request failed: {out.failure!r}"
    assert out.result.response == QUOTES_RESPONSE + " [remote]"
    [inv] = out.record.invocations(Stage.AFTER_EXECUTION, "local-broken")
    if failure == "timeout":
        assert (inv.outcome.value, inv.error_type) == ("timed_out", "HookTimeout")
        assert inv.error == "hook did not finish within 1s (start_to_close)"
        assert decision(inv) == ("fail_open", "continue", "hook_timeout")
    elif failure == "raise":
        assert inv.outcome.value == "failed"
        assert (inv.error, inv.error_type, inv.exception_type) == ("local failure", "HookError", "RuntimeError")
        assert decision(inv) == ("fail_open", "continue", "hook_error")
    else:
        assert inv.outcome.value == "failed"
        assert (inv.error, inv.error_type) == (
            "after_execution observes only and must return None, got str",
            "InvalidHookResult",
        )
        assert decision(inv) == ("fail_open", "continue", "invalid_result")
    assert local_activities(out) == [
        ScheduledActivity("after_execution_hook", "after_execution · local-broken", local=True)
    ]


async def test_sync_hooks_work_like_async_ones(client, tmp_path):
    class SyncAll:
        name = "sync-all"
        max_attempts = 1

        def __init__(self) -> None:
            self.observed: list[list[str]] = []

        def before_planning(self, ctx):
            ctx.enrichments["rag_context"] = "sync context"

        def after_planning(self, ctx, plan):
            plan.steps = [s for s in plan.steps if s.step_id == "quote-msft"]
            return plan

        def after_execution(self, ctx, execution):
            self.observed.append([s.step_id for s in execution.steps])

        def after_synthesis(self, ctx, response):
            return response.upper()

    class SyncBroken:
        name = "sync-broken"
        max_attempts = 1
        failure_policy = FailurePolicy.FAIL_OPEN

        def after_synthesis(self, ctx, response):
            raise ValueError("sync failure")

    class SyncWrongType:
        name = "sync-wrong-type"

        def after_planning(self, ctx, plan):
            return [plan]

    sync_all = SyncAll()
    async with Harness(client, tmp_path, hooks=[SyncWrongType(), sync_all, SyncBroken()]) as h:
        out = await h.run(QUOTES)

    assert out.failure is None
    assert sync_all.observed == [["quote-msft"]]
    assert out.record.enrichments == {"rag_context": "sync context"}
    assert "<agent_memory>\nsync context\n</agent_memory>" in out.record.planning_prompt
    assert out.result.response == f"{MSFT}\nFrom the knowledge base:\nsync context".upper()
    by_hook = {(i.hook, i.stage.value): i for i in out.record.pipeline_hooks}
    assert decision(by_hook[("sync-all", "before_planning")]) == ("fail_open", "continue", "accepted")
    assert decision(by_hook[("sync-all", "after_planning")]) == ("fail_open", "continue", "accepted")
    wrong = by_hook[("sync-wrong-type", "after_planning")]
    assert (wrong.error_type, wrong.error) == (
        "InvalidHookResult",
        "after_planning must return a Plan or Stop, got list",
    )
    assert decision(wrong) == ("fail_open", "continue", "invalid_result")
    broken = by_hook[("sync-broken", "after_synthesis")]
    assert (broken.error, broken.exception_type) == ("sync failure", "ValueError")
    assert decision(broken) == ("fail_open", "continue", "hook_error")


# --------------------------------------------------------------------------------------------------
# Spans
# --------------------------------------------------------------------------------------------------


def hook_spans(spans, request_id: str) -> list:
    return [
        s
        for s in spans.get_finished_spans()
        if s.name.startswith("pipeline.hook.") and (s.attributes or {}).get("pipeline.request_id") == request_id
    ]


class Gate(RequiredAfterPlanningHook):
    name = "gate"
    max_attempts = 1

    def __init__(self, reject: bool) -> None:
        self.reject = reject

    async def after_planning(self, ctx, plan):
        if self.reject:
            raise HookRejection("not allowed")
        return plan


async def test_one_span_per_invocation_carries_the_recorded_decision(client, tmp_path, spans):
    class WrongPlan:
        name = "wrong-plan"

        async def after_planning(self, ctx, plan):
            return {"steps": []}

    class Observer:
        name = "observer"
        max_attempts = 1

        async def after_execution(self, ctx, execution):
            raise RuntimeError("observer down")

    hooks = [AllStages(), WrongPlan(), Gate(reject=False), Observer(), Append("suffix", "!")]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        out = await h.run(QUOTES)
        other = await h.run("What is the price of IBM?")

    assert out.failure is None and other.failure is None
    found = hook_spans(spans, out.workflow_id)
    expected = [(i.stage.value, i.hook) for i in out.record.pipeline_hooks]
    assert sorted(s.name for s in found) == sorted(f"pipeline.hook.{stage}.{hook}" for stage, hook in expected)
    assert len(found) == 8
    for span in found:
        attrs = span.attributes
        stage, hook = attrs["pipeline.hook.stage"], attrs["pipeline.hook.name"]
        assert span.name == f"pipeline.hook.{stage}.{hook}"
        [inv] = [i for i in out.record.pipeline_hooks if i.stage.value == stage and i.hook == hook]
        assert span_decision(span) == decision(inv), span.name
        assert attrs["pipeline.hook.required"] is (hook == "gate")
    by_name = {s.name: s for s in found}
    assert span_decision(by_name["pipeline.hook.after_planning.wrong-plan"]) == (
        "fail_open",
        "continue",
        "invalid_result",
    )
    assert span_decision(by_name["pipeline.hook.after_planning.gate"]) == ("fail_closed", "continue", "accepted")
    assert span_decision(by_name["pipeline.hook.after_execution.observer"]) == ("fail_open", "continue", "hook_error")
    assert by_name["pipeline.hook.after_execution.observer"].status.status_code.name == "ERROR"
    assert by_name["pipeline.hook.after_synthesis.suffix"].status.status_code.name != "ERROR"
    # The other request's spans are its own.
    assert len(hook_spans(spans, other.workflow_id)) == 8


async def test_a_required_rejection_span_says_fail_closed_terminate(client, tmp_path, spans):
    async with Harness(client, tmp_path, hooks=[Gate(reject=True), Append("suffix", "!")]) as h:
        out = await h.run(QUOTES)

    assert out.failure.type == "RequiredAfterPlanningError"
    [span] = hook_spans(spans, out.workflow_id)
    assert span.name == "pipeline.hook.after_planning.gate"
    assert span_decision(span) == ("fail_closed", "terminate", "hook_error")
    assert span_decision(span) == decision(out.record.invocations(Stage.AFTER_PLANNING, "gate")[0])
    assert span.status.status_code.name == "ERROR"


async def test_reporting_an_effect_never_changes_the_outcome_however_much_a_hook_reports(client, tmp_path):
    """A fail-open hook reports an effect with a 2 MiB summary and name, and a hundred more: the request
    completes as it would without them; the record keeps every field bounded and the overflow counted."""

    class Loud:
        name = "loud"

        async def after_execution(self, ctx, execution):
            ctx.report_effect("huge", name="n" * 10_000, summary="s" * (2 * 1024 * 1024), error="e" * 100_000)
            for n in range(100):
                ctx.report_effect(f"e{n}", name="one of many", data={"blob": "x" * 50_000})

    async with Harness(client, tmp_path, hooks=[Loud()]) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None, out.failure
    assert out.result.response == ACME
    for record in (out.record, await out.stored()):
        effects = {e.effect_id: e for e in record.effects if e.hook == "loud"}
        huge = effects["huge"]
        assert (len(huge.name), len(huge.summary), len(huge.error or "")) == (200, 2_000, 4_000)
        assert huge.summary.endswith("…")
        assert len(effects) == 64 + 1  # the limit, and the card that counts the rest
        dropped = effects["effects-dropped"]
        assert dropped.status.value == "failed" and dropped.summary == "37 effect(s) beyond 64 were dropped"
        assert all(e.data["$truncated"] for i, e in effects.items() if i.startswith("e") and i[1:].isdigit())


class Meltdown(BaseException):
    """What a hook raises when it panics: not an ordinary error."""


@pytest.mark.parametrize("mode", ["local", "activity", "sync-system-exit"])
async def test_a_panic_in_a_fail_open_hook_stops_the_request_and_keeps_the_exception_type(client, tmp_path, mode):
    class Panics:
        name = "panics"
        run_mode = RunMode.ACTIVITY if mode == "activity" else RunMode.LOCAL_ACTIVITY

        if mode == "sync-system-exit":

            def after_execution(self, ctx, execution) -> None:
                raise SystemExit(3)
        else:

            async def after_execution(self, ctx, execution) -> None:
                raise Meltdown("the reactor is on fire")

    class Later:
        name = "later"
        calls = 0

        async def after_synthesis(self, ctx, response: str) -> str:
            Later.calls += 1
            return response

    async with Harness(client, tmp_path, hooks=[Panics(), Later()]) as h:
        out = await h.run("What is the price of ACME?")

    expected_type = "SystemExit" if mode == "sync-system-exit" else "Meltdown"
    assert out.failure is not None and out.failure.type == "HookPanic", out.failure
    details = out.failure_details()
    assert (details["extension"], details["phase"], details["exception_type"]) == (
        "panics",
        "after_execution",
        expected_type,
    )
    assert details["failure_policy"] == "fail_open"
    assert Later.calls == 0 and "synthesize" not in out.activity_types()
    [inv] = out.record.invocations(Stage.AFTER_EXECUTION, "panics")
    assert (inv.outcome.value, inv.error_type, inv.exception_type) == ("failed", "HookPanic", expected_type)
    assert decision(inv) == ("fail_open", "propagate_panic", "panic")
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.error.type == "HookPanic"
    assert [s.step_id for s in stored.steps] == ["quote-acme"]  # the completed work stays in the record
