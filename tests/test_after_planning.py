"""after_planning: copy-on-write chaining, full plan validation after every mutation, fail-open ordinary
hooks, and the fail-closed required hook."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from temporalio.api.enums.v1 import EventType

from hooks import HookRejection, PlanStep, RequiredAfterPlanningHook, RunMode, Stage
from workflows.models import Plan, RequestStatus

from .doubles import FixedPlanner, decision, quote, started_attempts
from .harness import Harness, Outcome

NS = "demo-tools"


def trade(step_id: str, symbol: str) -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="stock-service",
        capability="execute_trade",
        arguments={"symbol": symbol, "side": "buy", "quantity": 1},
    )


def two_quotes() -> FixedPlanner:
    return FixedPlanner(quote("quote-acme", "ACME"), quote("quote-msft", "MSFT"))


def tool_step_ids(out: Outcome) -> list[str]:
    """The step ids of the execute_tool_step activities, read from their summaries in history."""
    return [a.summary.rsplit("(", 1)[1].rstrip(")") for a in out.tool_activities]


class Recorder:
    """An ordinary after_planning hook that only records the step ids it received."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[list[str]] = []

    async def after_planning(self, ctx, plan: Plan) -> Plan:
        self.seen.append([s.step_id for s in plan.steps])
        return plan


# --------------------------------------------------------------------------------------------------
# Chaining
# --------------------------------------------------------------------------------------------------


async def test_hooks_chain_in_registration_order_and_the_final_plan_runs(client, tmp_path):
    class DropMsft:
        name = "drop-msft"
        seen: list[list[str]] = []

        async def after_planning(self, ctx, plan):
            self.seen.append([s.step_id for s in plan.steps])
            plan.steps = [s for s in plan.steps if s.step_id != "quote-msft"]
            return plan

    class AddIbm:
        name = "add-ibm"
        seen: list[list[str]] = []

        async def after_planning(self, ctx, plan):
            self.seen.append([s.step_id for s in plan.steps])
            plan.steps.append(quote("quote-ibm", "IBM", depends_on=["quote-acme"]))
            return plan

    drop, add = DropMsft(), AddIbm()
    async with Harness(client, tmp_path, hooks=[drop, add], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert drop.seen == [["quote-acme", "quote-msft"]]
    assert add.seen == [["quote-acme"]]  # B received A's output, not the planner's plan
    assert out.hook_summaries() == ["after_planning · drop-msft", "after_planning · add-ibm"]
    assert tool_step_ids(out) == ["quote-acme", "quote-ibm"]
    assert [s.step_id for s in out.result.steps] == ["quote-acme", "quote-ibm"]
    assert "IBM is trading at" in out.result.response and "MSFT" not in out.result.response

    record = out.record
    assert [s.step_id for s in record.plans[0].plan.steps] == ["quote-acme", "quote-ibm"]
    assert len(record.plans) == 1
    invocations = record.invocations(Stage.AFTER_PLANNING)
    assert [(i.hook, i.sequence, i.plan_phase, i.outcome.value) for i in invocations] == [
        ("drop-msft", 1, 1, "succeeded"),
        ("add-ibm", 2, 1, "succeeded"),
    ]
    assert [decision(i) for i in invocations] == [("fail_open", "continue", "accepted")] * 2
    assert all(i.error is None and i.error_type is None for i in invocations)


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
async def test_registration_order_is_the_chaining_order(client, tmp_path, order):
    class Appender:
        def __init__(self, name: str, symbol: str) -> None:
            self.name = name
            self.symbol = symbol

        async def after_planning(self, ctx, plan):
            plan.steps.append(quote(f"quote-{self.symbol.lower()}", self.symbol))
            return plan

    hooks = {"a": Appender("a", "AAA"), "b": Appender("b", "BBB")}
    async with Harness(client, tmp_path, hooks=[hooks[k] for k in order], planner=FixedPlanner()) as h:
        out = await h.run("quotes please")

    expected = [f"quote-{hooks[k].symbol.lower()}" for k in order]
    assert [s.step_id for s in out.record.plans[0].plan.steps] == expected
    assert tool_step_ids(out) == expected
    assert [i.hook for i in out.record.invocations(Stage.AFTER_PLANNING)] == list(order)


# --------------------------------------------------------------------------------------------------
# Copy-on-write
# --------------------------------------------------------------------------------------------------


def _vandalise(plan: Plan) -> None:
    plan.steps[0].arguments["symbol"] = "EVIL"
    plan.steps.pop()
    plan.rationale = "vandalised"


@pytest.mark.parametrize(
    "finish, error_type, reason",
    [
        ("raise", "HookError", "hook_error"),
        ("return_none", "InvalidHookResult", "invalid_result"),
        ("return_invalid", "InvalidPlan", "invalid_plan"),
    ],
)
async def test_a_hook_that_mutates_in_place_then_fails_does_not_change_the_plan(
    client, tmp_path, finish, error_type, reason
):
    class Vandal:
        name = "vandal"
        max_attempts = 1

        async def after_planning(self, ctx, plan):
            _vandalise(plan)
            if finish == "raise":
                raise RuntimeError("vandalised, then failed")
            if finish == "return_none":
                return None
            plan.steps.append(plan.steps[0].model_copy())  # duplicate step id
            return plan

    witness = Recorder("witness")
    async with Harness(client, tmp_path, hooks=[Vandal(), witness], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert witness.seen == [["quote-acme", "quote-msft"]]
    accepted = out.record.plans[0].plan
    assert [s.step_id for s in accepted.steps] == ["quote-acme", "quote-msft"]
    assert accepted.steps[0].arguments == {"symbol": "ACME"} and accepted.rationale == ""
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
    assert "EVIL" not in out.result.response and "ACME is trading at" in out.result.response
    vandal = out.record.invocations(Stage.AFTER_PLANNING, "vandal")[0]
    assert vandal.outcome.value == "failed" and vandal.error_type == error_type
    assert decision(vandal) == ("fail_open", "continue", reason)


# --------------------------------------------------------------------------------------------------
# Invalid plans from an ordinary hook
# --------------------------------------------------------------------------------------------------


def _set(index: int, **changes) -> Callable[[Plan], None]:
    def mutate(plan: Plan) -> None:
        for key, value in changes.items():
            setattr(plan.steps[index], key, value)

    return mutate


INVALID_PLANS = {
    "unknown_tool": (
        _set(1, capability="crystal_ball"),
        "invalid plan: step 'quote-msft': unknown tool demo-tools/stock-service/crystal_ball",
    ),
    "unknown_namespace": (
        _set(0, namespace="other-tools"),
        "invalid plan: step 'quote-acme': unknown tool other-tools/stock-service/stock_quote",
    ),
    "duplicate_step_id": (
        _set(1, step_id="quote-acme"),
        "invalid plan: step 'quote-acme': duplicate step_id",
    ),
    "depends_on_later_step": (
        _set(0, depends_on=["quote-msft"]),
        "invalid plan: step 'quote-acme': depends_on 'quote-msft' names a later step (cycle or forward reference)",
    ),
    "depends_on_itself": (
        _set(1, depends_on=["quote-msft"]),
        "invalid plan: step 'quote-msft': depends on itself (cycle)",
    ),
    "missing_dependency": (
        _set(1, depends_on=["quote-ghost"]),
        "invalid plan: step 'quote-msft': depends_on 'quote-ghost' is not a step of this plan",
    ),
    "two_step_cycle": (
        lambda plan: (_set(0, depends_on=["quote-msft"])(plan), _set(1, depends_on=["quote-acme"])(plan)),
        "invalid plan: step 'quote-acme': depends_on 'quote-msft' names a later step (cycle or forward reference)",
    ),
    "argument_pattern": (
        _set(0, arguments={"symbol": "acme"}),
        "invalid plan: step 'quote-acme': argument symbol: String should match pattern '^[A-Z]{1,5}$'",
    ),
    "argument_missing": (
        _set(1, arguments={}),
        "invalid plan: step 'quote-msft': argument symbol: Field required",
    ),
    "argument_unknown": (
        _set(0, arguments={"symbol": "ACME", "venue": "dark-pool"}),
        "invalid plan: step 'quote-acme': argument venue: Extra inputs are not permitted",
    ),
    "bad_step_id": (
        _set(0, step_id="-bad id"),
        "invalid plan: step '-bad id': step_id must match ^[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}$",
    ),
    "wrong_phase": (
        lambda plan: setattr(plan, "phase", 2),
        "invalid plan: plan is for phase 2, expected phase 1",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID_PLANS))
async def test_an_ordinary_hooks_invalid_plan_is_recorded_and_the_last_valid_plan_runs(client, tmp_path, case):
    mutate, diagnostic = INVALID_PLANS[case]

    class Rewriter:
        name = "rewriter"
        calls = 0

        async def after_planning(self, ctx, plan):
            # Its output is valid: it becomes the last valid plan the broken mutation must not replace.
            Rewriter.calls += 1
            plan.steps[1].arguments = {"symbol": "IBM"}
            return plan

    class Mutator:
        name = "mutator"
        calls = 0

        async def after_planning(self, ctx, plan):
            Mutator.calls += 1
            mutate(plan)
            return plan

    witness = Recorder("witness")
    async with Harness(client, tmp_path, hooks=[Rewriter(), Mutator(), witness], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert Mutator.calls == 1  # an invalid plan is not retried
    assert witness.seen == [["quote-acme", "quote-msft"]]
    accepted = out.record.plans[0].plan
    assert [(s.step_id, s.arguments, s.depends_on) for s in accepted.steps] == [
        ("quote-acme", {"symbol": "ACME"}, []),
        ("quote-msft", {"symbol": "IBM"}, []),
    ]
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
    assert [s.status for s in out.result.steps] == ["succeeded", "succeeded"]
    assert "IBM is trading at" in out.result.response

    invocations = out.record.invocations(Stage.AFTER_PLANNING)
    assert [i.hook for i in invocations] == ["rewriter", "mutator", "witness"]
    bad = invocations[1]
    assert bad.outcome.value == "failed"
    assert bad.error_type == "InvalidPlan"
    assert bad.error == diagnostic
    assert decision(bad) == ("fail_open", "continue", "invalid_plan")
    assert decision(invocations[0]) == decision(invocations[2]) == ("fail_open", "continue", "accepted")


# --------------------------------------------------------------------------------------------------
# Ordinary hook errors and wrong return types
# --------------------------------------------------------------------------------------------------


async def test_an_ordinary_hook_that_raises_fails_open(client, tmp_path):
    class Broken:
        name = "broken"
        max_attempts = 1

        async def after_planning(self, ctx, plan):
            raise ValueError("policy backend unreachable")

    async with Harness(client, tmp_path, hooks=[Broken()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
    assert "synthesize" in out.activity_types()
    inv = out.record.invocations(Stage.AFTER_PLANNING, "broken")[0]
    assert inv.outcome.value == "failed"
    assert inv.error == "policy backend unreachable"
    assert inv.error_type == "HookError"
    assert inv.exception_type == "ValueError"
    assert decision(inv) == ("fail_open", "continue", "hook_error")
    assert [s.step_id for s in out.record.plans[0].plan.steps] == ["quote-acme", "quote-msft"]


@pytest.mark.parametrize(
    "returned, type_name",
    [({"phase": 1, "steps": []}, "dict"), (None, "NoneType"), ("plan", "str")],
)
async def test_an_ordinary_hook_returning_the_wrong_type_fails_open(client, tmp_path, returned, type_name):
    class WrongType:
        name = "wrong-type"
        calls = 0  # default max_attempts (3): a wrong type must still not be retried

        async def after_planning(self, ctx, plan):
            WrongType.calls += 1
            return returned

    async with Harness(client, tmp_path, hooks=[WrongType()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert WrongType.calls == 1
    assert started_attempts(out, "after_planning_hook") == [1]
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
    inv = out.record.invocations(Stage.AFTER_PLANNING, "wrong-type")[0]
    assert inv.outcome.value == "failed"
    assert inv.error_type == "InvalidHookResult"
    assert inv.error == f"after_planning must return a Plan or Stop, got {type_name}"
    assert decision(inv) == ("fail_open", "continue", "invalid_result")


async def test_an_ordinary_plain_exception_is_retried_and_can_succeed(client, tmp_path):
    class Flaky:
        name = "flaky"
        max_attempts = 2
        attempts = 0

        async def after_planning(self, ctx, plan):
            Flaky.attempts += 1
            if Flaky.attempts == 1:
                raise ConnectionError("transient")
            plan.steps = plan.steps[:1]
            return plan

    async with Harness(client, tmp_path, hooks=[Flaky()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert Flaky.attempts == 2
    assert started_attempts(out, "after_planning_hook") == [2]
    assert out.hook_summaries() == ["after_planning · flaky"]  # one invocation, retried
    inv = out.record.invocations(Stage.AFTER_PLANNING, "flaky")
    assert len(inv) == 1
    assert inv[0].outcome.value == "succeeded" and inv[0].error is None
    assert decision(inv[0]) == ("fail_open", "continue", "accepted")
    assert tool_step_ids(out) == ["quote-acme"]


async def test_an_ordinary_hook_failing_every_attempt_fails_open_after_max_attempts(client, tmp_path):
    class AlwaysFails:
        name = "always-fails"
        max_attempts = 2
        attempts = 0

        async def after_planning(self, ctx, plan):
            AlwaysFails.attempts += 1
            raise ConnectionError(f"down (attempt {AlwaysFails.attempts})")

    async with Harness(client, tmp_path, hooks=[AlwaysFails()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert AlwaysFails.attempts == 2
    assert started_attempts(out, "after_planning_hook") == [2]
    inv = out.record.invocations(Stage.AFTER_PLANNING, "always-fails")[0]
    assert inv.error == "down (attempt 2)"
    assert decision(inv) == ("fail_open", "continue", "hook_error")
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]


async def test_an_ordinary_hook_rejection_is_not_retried(client, tmp_path):
    class Refuses:
        name = "refuses"
        max_attempts = 3
        attempts = 0

        async def after_planning(self, ctx, plan):
            Refuses.attempts += 1
            raise HookRejection("not today")

    async with Harness(client, tmp_path, hooks=[Refuses()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert Refuses.attempts == 1
    assert started_attempts(out, "after_planning_hook") == [1]
    inv = out.record.invocations(Stage.AFTER_PLANNING, "refuses")[0]
    assert (inv.error, inv.exception_type) == ("not today", "HookRejection")
    assert decision(inv) == ("fail_open", "continue", "hook_error")
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]


# --------------------------------------------------------------------------------------------------
# The required hook
# --------------------------------------------------------------------------------------------------


class Audit:
    """Participates only in later stages; may follow the required hook, must not run after a rejection."""

    name = "audit"

    async def after_execution(self, ctx, execution) -> None:
        return None

    async def after_synthesis(self, ctx, response: str) -> str:
        return response


class Gate(RequiredAfterPlanningHook):
    """A required hook whose behaviour is chosen per test."""

    name = "gate"

    def __init__(self, behaviour: str, *, max_attempts: int = 1, timeout_seconds: float = 10.0) -> None:
        self.behaviour = behaviour
        self.max_attempts = max_attempts
        self.timeout_seconds = timeout_seconds
        self.attempts = 0
        self.seen: list[list[str]] = []

    async def after_planning(self, ctx, plan):
        self.attempts += 1
        self.seen.append([s.step_id for s in plan.steps])
        if self.behaviour == "accept":
            return plan
        if self.behaviour == "reject":
            raise HookRejection("step quote-msft uses an operation not allowed by this application")
        if self.behaviour == "raise":
            raise RuntimeError("policy store unavailable")
        if self.behaviour == "dict":
            return {"steps": []}
        if self.behaviour == "none":
            return None
        if self.behaviour == "invalid_plan":
            plan.steps.append(quote("quote-acme", "ACME"))
            return plan
        if self.behaviour == "hang":
            await asyncio.sleep(60)
            return plan
        if self.behaviour == "deny_trades":
            for step in plan.steps:
                if step.capability == "execute_trade":
                    raise HookRejection(f"step {step.step_id} uses an operation not allowed by this application")
            return plan
        raise AssertionError(self.behaviour)


REQUIRED_FAILURES = {
    "rejection": (
        dict(behaviour="reject", max_attempts=3),
        "HookError",
        "hook_error",
        "failed",
        "step quote-msft uses an operation not allowed by this application",
    ),
    "exception": (
        dict(behaviour="raise"),
        "HookError",
        "hook_error",
        "failed",
        "policy store unavailable",
    ),
    "wrong_type_dict": (
        dict(behaviour="dict", max_attempts=3),
        "InvalidHookResult",
        "invalid_result",
        "failed",
        "after_planning must return a Plan or Stop, got dict",
    ),
    "wrong_type_none": (
        dict(behaviour="none"),
        "InvalidHookResult",
        "invalid_result",
        "failed",
        "after_planning must return a Plan or Stop, got NoneType",
    ),
    "invalid_plan": (
        dict(behaviour="invalid_plan", max_attempts=3),
        "InvalidPlan",
        "invalid_plan",
        "failed",
        "invalid plan: step 'quote-acme': duplicate step_id",
    ),
    "timeout": (
        dict(behaviour="hang", timeout_seconds=1),
        "HookTimeout",
        "hook_timeout",
        "timed_out",
        "hook did not finish within 1s (start_to_close)",
    ),
}


@pytest.mark.parametrize("case", sorted(REQUIRED_FAILURES))
async def test_a_required_hook_failure_fails_the_request_before_any_tool(client, tmp_path, case):
    options, cause_type, reason, outcome, cause = REQUIRED_FAILURES[case]
    gate = Gate(**options)
    before = Recorder("before-gate")
    async with Harness(client, tmp_path, hooks=[before, gate, Audit()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    # The typed failure names the hook and the cause.
    assert out.result is None
    assert out.failure is not None
    assert out.failure.type == "RequiredAfterPlanningError"
    assert out.failure.non_retryable
    assert out.failure.message == f"required after_planning hook 'gate' rejected the plan: {cause}"
    details = out.failure_details()
    assert details["hook"] == "gate"
    assert details["cause"] == cause
    assert details["cause_type"] == cause_type
    assert gate.attempts == 1  # rejections, contract violations and timeouts here are never retried

    # Nothing downstream was scheduled.
    types = out.activity_types()
    assert "execute_tool_step" not in types
    assert "synthesize" not in types
    assert "after_execution_hook" not in types and "after_synthesis_hook" not in types
    assert out.hook_summaries() == ["after_planning · before-gate", "after_planning · gate"]
    assert types[-1] == "persist_execution_record"

    # The stored record is a failed request with zero steps and the hook evidence.
    stored = await out.stored()
    assert stored is not None
    assert stored.status is RequestStatus.FAILED
    assert stored.steps == [] and stored.plans == []
    assert stored.final_response is None and stored.model_draft is None
    assert stored.error.type == "RequiredAfterPlanningError"
    assert stored.error.details["hook"] == "gate" and stored.error.details["cause"] == cause
    invocations = stored.invocations(Stage.AFTER_PLANNING)
    assert [i.hook for i in invocations] == ["before-gate", "gate"]
    assert decision(invocations[0]) == ("fail_open", "continue", "accepted")
    failed = invocations[1]
    assert failed.outcome.value == outcome
    assert failed.error == cause
    assert failed.error_type == cause_type
    assert decision(failed) == ("fail_closed", "terminate", reason)
    assert stored.invocations(Stage.AFTER_EXECUTION) == stored.invocations(Stage.AFTER_SYNTHESIS) == []
    # The query answers the same as the store.
    assert out.record.model_dump() == stored.model_dump()


async def test_a_required_hook_rejection_is_not_retried(client, tmp_path):
    gate = Gate("reject", max_attempts=5)
    gate.run_mode = RunMode.ACTIVITY  # the server's retry policy is what must not retry it
    async with Harness(client, tmp_path, hooks=[gate], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure.type == "RequiredAfterPlanningError"
    assert gate.attempts == 1
    assert started_attempts(out, "after_planning_hook") == [1]
    failed = [e for e in out.history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert len(failed) == 1
    app = failed[0].activity_task_failed_event_attributes.failure.application_failure_info
    assert app.type == "HookError" and app.non_retryable
    assert out.failure_details()["exception_type"] == "HookRejection"


async def test_an_accepting_required_hook_lets_the_plan_run(client, tmp_path):
    gate = Gate("accept")
    async with Harness(client, tmp_path, hooks=[gate, Audit()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
    assert "synthesize" in out.activity_types()
    inv = out.record.invocations(Stage.AFTER_PLANNING, "gate")[0]
    assert inv.outcome.value == "succeeded"
    assert decision(inv) == ("fail_closed", "continue", "accepted")
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED
    assert len(stored.plans) == 1 and [s.step_id for s in stored.steps] == ["quote-acme", "quote-msft"]
    assert [i.hook for i in stored.invocations(Stage.AFTER_SYNTHESIS)] == ["audit"]


async def test_the_required_hook_sees_the_plan_an_earlier_ordinary_hook_rewrote(client, tmp_path):
    class Narrow:
        name = "narrow"

        async def after_planning(self, ctx, plan):
            plan.steps = [s for s in plan.steps if s.step_id == "quote-msft"]
            return plan

    gate = Gate("accept")
    async with Harness(client, tmp_path, hooks=[Narrow(), gate], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert gate.seen == [["quote-msft"]]
    assert tool_step_ids(out) == ["quote-msft"]
    assert [s.step_id for s in out.record.plans[0].plan.steps] == ["quote-msft"]
    assert [decision(i) for i in out.record.invocations(Stage.AFTER_PLANNING)] == [
        ("fail_open", "continue", "accepted"),
        ("fail_closed", "continue", "accepted"),
    ]


async def test_the_required_hook_rejects_what_an_earlier_hook_added_and_no_tool_runs(client, tmp_path):
    class AddTrade:
        name = "add-trade"

        async def after_planning(self, ctx, plan):
            plan.steps.append(trade("trade-acme", "ACME"))
            return plan

    gate = Gate("deny_trades")
    async with Harness(client, tmp_path, hooks=[AddTrade(), gate], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert gate.seen == [["quote-acme", "quote-msft", "trade-acme"]]
    assert out.failure.type == "RequiredAfterPlanningError"
    assert out.failure_details()["cause"] == "step trade-acme uses an operation not allowed by this application"
    assert out.tool_activities == []  # not even the allowed quotes of the rejected plan
    assert not (tmp_path / "ledger.jsonl").exists()
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.steps == [] and stored.plans == []


async def test_a_required_local_activity_hook_rejection_is_a_required_after_planning_error(client, tmp_path):
    class LocalGate(RequiredAfterPlanningHook):
        name = "local-gate"
        run_mode = RunMode.LOCAL_ACTIVITY
        max_attempts = 3
        attempts = 0

        async def after_planning(self, ctx, plan):
            LocalGate.attempts += 1
            raise HookRejection("step quote-acme uses an operation not allowed by this application")

    async with Harness(client, tmp_path, hooks=[LocalGate()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is not None
    assert out.failure.type == "RequiredAfterPlanningError", f"{out.failure.type}: {out.failure.message}"
    details = out.failure_details()
    assert (details["hook"], details["cause_type"]) == ("local-gate", "HookError")
    assert details["cause"] == "step quote-acme uses an operation not allowed by this application"
    assert LocalGate.attempts == 1
    assert out.tool_activities == [] and "synthesize" not in out.activity_types()
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.steps == [] and stored.plans == []
    # The hooks' local activity wrote no snapshot of the plan it rejected: the terminal one is the first.
    assert stored.record_revision == 1 and stored.lifecycle.boundary == "terminal"
    [inv] = stored.invocations(Stage.AFTER_PLANNING, "local-gate")
    assert decision(inv) == ("fail_closed", "terminate", "hook_error")


# --------------------------------------------------------------------------------------------------
# In the planning activity
# --------------------------------------------------------------------------------------------------


class FlakyPlanner(FixedPlanner):
    """Fails its first call (a retryable error), then plans as a FixedPlanner."""

    async def plan(self, request) -> Plan:
        if self.calls == 0:
            self.calls += 1
            raise RuntimeError("the model timed out")
        return await super().plan(request)


async def test_the_planning_activity_runs_the_hooks_once_on_the_plan_of_its_attempt_that_produced_one(client, tmp_path):
    """The phase's in-process hooks run in the planning activity, after the planner: an attempt whose planner
    failed ran none, and the retried attempt runs each once, recorded as its own invocation."""
    recorder = Recorder("recorder")
    planner = FlakyPlanner(quote("quote-acme", "ACME"))
    async with Harness(client, tmp_path, hooks=[recorder], planner=planner) as h:
        out = await h.run("price of ACME")

    assert out.failure is None
    assert planner.calls == 2 and started_attempts(out, "plan") == [2]
    assert recorder.seen == [["quote-acme"]]
    assert [a.summary for a in out.scheduled if a.activity_type in ("plan", "after_planning_hook")] == [
        "plan · phase 1",
        "after_planning · recorder",
    ]
    assert [(i.hook, i.stage.value, i.outcome.value) for i in out.record.pipeline_hooks] == [
        ("recorder", "after_planning", "succeeded")
    ]
    assert tool_step_ids(out) == ["quote-acme"]


async def test_a_hook_failing_in_the_planning_activity_fails_open_without_asking_the_planner_again(client, tmp_path):
    class Broken:
        name = "broken"
        calls = 0

        async def after_planning(self, ctx, plan):
            Broken.calls += 1
            raise RuntimeError("the policy service is down")

    after = Recorder("after")
    planner = two_quotes()
    async with Harness(client, tmp_path, hooks=[Broken(), after], planner=planner) as h:
        out = await h.run("quotes please")

    assert out.failure is None
    assert planner.calls == 1  # the hook's failure is answered, never raised: the planner is asked once
    assert Broken.calls == 3 and started_attempts(out, "after_planning_hook") == [3, 1]
    assert after.seen == [["quote-acme", "quote-msft"]]  # the run went on without the failed hook's result
    entries = [(i.hook, i.outcome.value, i.decision.action.value) for i in out.record.pipeline_hooks]
    assert entries == [("broken", "failed", "continue"), ("after", "succeeded", "continue")]
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]


async def test_a_required_hook_rejecting_in_the_planning_activity_ends_the_request_before_any_tool(client, tmp_path):
    class Gate(RequiredAfterPlanningHook):
        name = "gate"

        async def after_planning(self, ctx, plan):
            raise HookRejection("quote-msft is not allowed")

    planner = two_quotes()
    async with Harness(client, tmp_path, hooks=[Recorder("before-gate"), Gate()], planner=planner) as h:
        out = await h.run("quotes please")

    assert out.failure is not None and out.failure.type == "RequiredAfterPlanningError"
    assert out.failure.non_retryable
    assert out.failure_details()["hook"] == "gate"
    assert planner.calls == 1 and out.tool_activities == []
    assert [s.summary for s in out.scheduled if s.activity_type == "plan"] == ["plan · phase 1"]
    assert out.record.status is RequestStatus.FAILED and out.record.plans == []
    assert [(i.hook, i.outcome.value) for i in out.record.pipeline_hooks] == [
        ("before-gate", "succeeded"),
        ("gate", "failed"),
    ]
