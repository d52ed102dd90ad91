"""Multi-phase planning.

The planner asks for another phase with ``continue_after`` and sees the earlier phases' results; a later
step uses an earlier output through ``{{steps.<id>.output.<field>}}`` and lists the id, exactly, in
``implicit_deps``. after_planning runs once per phase; the phase cap bounds the loop; a later phase's
required rejection keeps what the earlier phases did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, ConfigDict, JsonValue
from temporalio.exceptions import ApplicationError

from activities import PlanningRequest, Tool
from demo.tools import quote_price
from hooks import HookRejection, PipelineHook, PlanStep, RequiredAfterPlanningHook, Stage
from workflows.models import Plan, RequestStatus, StageSettings, StepStatus

from .conftest import with_payload_store
from .doubles import decision
from .harness import Harness, Outcome

NS = "test-tools"
ACME = {"symbol": "ACME", "price": 12.5, "count": 3, "info": {"sector": "tech", "listed": True}}


# --------------------------------------------------------------------------------------------------
# Tools and plans
# --------------------------------------------------------------------------------------------------


class LookupArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    symbol: str


class Lookup(Tool):
    """Returns structured data per symbol; ``FAIL`` fails the step (not retried)."""

    namespace = NS
    agent = "data"
    capability = "lookup"
    read_only = True
    Arguments = LookupArguments

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(self, arguments: LookupArguments, ctx):
        self.calls.append(ctx.step_id)
        if arguments.symbol == "FAIL":
            raise ApplicationError("lookup backend refused FAIL", non_retryable=True)
        return {**ACME, "symbol": arguments.symbol}


class EchoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: JsonValue = None
    text: str = ""
    items: list[JsonValue] = []


class Echo(Tool):
    """Returns (and keeps) exactly the arguments it received."""

    namespace = NS
    agent = "data"
    capability = "echo"
    Arguments = EchoArguments

    def __init__(self) -> None:
        self.received: dict[str, dict] = {}

    async def run(self, arguments: EchoArguments, ctx):
        self.received[ctx.step_id] = arguments.model_dump()
        return {"received": arguments.model_dump()}


def lookup(step_id: str, symbol: str) -> PlanStep:
    return PlanStep(step_id=step_id, namespace=NS, agent="data", capability="lookup", arguments={"symbol": symbol})


def echo(
    step_id: str, *, depends_on: list[str] | None = None, implicit_deps: list[str] | None = None, **arguments
) -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="data",
        capability="echo",
        arguments=arguments,
        depends_on=depends_on or [],
        implicit_deps=implicit_deps or [],
    )


@dataclass
class PhasedPlanner:
    """Plans ``phases[n-1]`` in phase n (the last one repeats); records every request it received."""

    phases: list[Plan]
    name: str = "phased-planner"
    requests: list[PlanningRequest] = field(default_factory=list)

    async def plan(self, request: PlanningRequest) -> Plan:
        self.requests.append(request)
        plan = self.phases[min(request.phase, len(self.phases)) - 1].model_copy(deep=True)
        plan.phase = request.phase
        return plan


def phase_one() -> Plan:
    return Plan(phase=1, steps=[lookup("a", "ACME"), lookup("a2", "MSFT")], continue_after=True)


def valid_phase_two() -> Plan:
    return Plan(phase=2, steps=[echo("b", value="{{steps.a.output.price}}", implicit_deps=["a"])])


class PhaseRecorder(PipelineHook):
    """An ordinary after_planning hook that records the phase and steps it saw."""

    name = "phase-recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[int | None, list[str]]] = []

    async def after_planning(self, ctx, plan):
        self.seen.append((ctx.plan_phase, [s.step_id for s in plan.steps]))
        return plan


def tool_step_ids(out: Outcome) -> list[str]:
    return [a.summary.rsplit("(", 1)[1].rstrip(")") for a in out.tool_activities]


def plan_summaries(out: Outcome) -> list[str]:
    return [a.summary for a in out.scheduled if a.activity_type == "plan"]


def persist_summaries(out: Outcome) -> list[str]:
    return [a.summary for a in out.scheduled if a.activity_type == "persist_execution_record"]


def snapshots_with_hooks(out: Outcome) -> list[dict | None]:
    """Per planning activity that ran in-process after_planning hooks on its plan, or local activity of
    them: the accepted plan's snapshot it wrote."""
    found = [output.get("snapshot") for output in out.planning_outputs() if output.get("after")]
    return found + [
        result.get("snapshot") for kind, result in out.local_results() if kind.startswith("after_planning:")
    ]


def harness(client, tmp_path, planner, *, hooks=(), settings=None, lookups=None, echoes=None) -> Harness:
    """The lookup and echo tools, and the payload store a deployment has by default."""
    return Harness(
        with_payload_store(client, tmp_path),
        tmp_path,
        hooks=list(hooks),
        tools=[lookups or Lookup(), echoes or Echo()],
        planner=planner,
        settings=settings,
    )


# --------------------------------------------------------------------------------------------------
# A two-phase request
# --------------------------------------------------------------------------------------------------


async def test_a_two_phase_request_uses_a_phase_one_output_in_phase_two(client, tmp_path):
    phase_two = Plan(
        phase=2,
        steps=[
            echo(
                "b",
                implicit_deps=["a"],
                value="{{steps.a.output.price}}",  # whole string: keeps the JSON type
                text="ACME at {{steps.a.output.price}} USD ({{ steps.a.output.info }}), {{steps.a.output.count}} lots",
                items=["{{steps.a.output.info}}", "{{steps.a.output.count}}", "plain"],
            ),
            echo("c", depends_on=["b"], value="{{steps.b.output.received.value}}"),
        ],
    )
    planner = PhasedPlanner([phase_one(), phase_two])
    recorder, lookups, echoes = PhaseRecorder(), Lookup(), Echo()
    async with harness(client, tmp_path, planner, hooks=[recorder], lookups=lookups, echoes=echoes) as h:
        out = await h.run("look up ACME, then use it")

    assert out.failure is None
    # The planner was asked twice; phase 2 saw phase 1's results.
    assert [r.phase for r in planner.requests] == [1, 2]
    assert planner.requests[0].prior_results == []
    prior = planner.requests[1].prior_results
    # A planner reads results as a model does: the result text, not the raw output.
    assert [(r.step_id, r.status, r.output, json.loads(r.result)) for r in prior] == [
        ("a", StepStatus.SUCCEEDED, None, ACME),
        ("a2", StepStatus.SUCCEEDED, None, {**ACME, "symbol": "MSFT"}),
    ]
    assert plan_summaries(out) == ["plan · phase 1", "plan · phase 2"]

    # The tool received the resolved values.
    assert echoes.received["b"] == {
        "value": 12.5,
        "text": 'ACME at 12.5 USD ({"listed": true, "sector": "tech"}), 3 lots',
        "items": [{"sector": "tech", "listed": True}, 3, "plain"],
    }
    assert isinstance(echoes.received["b"]["value"], float)
    assert echoes.received["c"]["value"] == 12.5  # a same-phase reference through depends_on
    assert tool_step_ids(out)[:2] in (["a", "a2"], ["a2", "a"]) and tool_step_ids(out)[2:] == ["b", "c"]

    # after_planning ran once per phase, on that phase's plan.
    assert recorder.seen == [(1, ["a", "a2"]), (2, ["b", "c"])]
    record = out.record
    assert [(i.plan_phase, i.outcome.value) for i in record.invocations(Stage.AFTER_PLANNING)] == [
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    assert [p.phase for p in record.plans] == [1, 2]
    assert record.plans[1].plan.steps[0].implicit_deps == ["a"]
    assert record.plans[1].plan.steps[0].arguments["value"] == "{{steps.a.output.price}}"  # the plan as accepted
    assert [(s.step_id, s.status.value) for s in record.steps] == [
        ("a", "succeeded"),
        ("a2", "succeeded"),
        ("b", "succeeded"),
        ("c", "succeeded"),
    ]
    assert record.phase_cap_reached is False
    assert [s.step_id for s in out.result.steps] == ["a", "a2", "b", "c"]
    # Each phase's accepted plan was written by its after_planning hook's local activity.
    assert snapshots_with_hooks(out) == [{"revision": 1, "written": True}, {"revision": 2, "written": True}]
    assert persist_summaries(out) == ["bookkeeping · persist record · terminal · revision 3"]
    stored = await out.stored()
    assert [p.phase for p in stored.plans] == [1, 2] and stored.record_revision == 3
    assert stored.steps == record.steps


async def test_the_demo_rule_planner_quotes_then_messages_the_quoted_prices(client, tmp_path):
    async with Harness(client, tmp_path) as h:
        out = await h.run("Quote ACME and MSFT and send the prices to bob", approve_as="rita")

    assert out.failure is None
    record = out.record
    assert [p.phase for p in record.plans] == [1, 2]
    assert record.plans[0].plan.continue_after is True
    notify = record.plans[1].plan.steps[0]
    assert notify.step_id == "notify" and notify.implicit_deps == ["quote-acme", "quote-msft"]
    assert "{{steps.quote-acme.output.price}}" in notify.arguments["text"]
    # The checkpoint was for phase 2's message, and approved.
    assert [(c.phase, c.status.value) for c in record.checkpoints] == [(2, "approved")]
    outbox = [json.loads(line) for line in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [(m["to"], m["text"]) for m in outbox] == [
        ("bob", f"Prices: ACME {quote_price('ACME')} USD; MSFT {quote_price('MSFT')} USD")
    ]
    assert [s.step_id for s in record.steps] == ["quote-acme", "quote-msft", "notify"]


# --------------------------------------------------------------------------------------------------
# implicit_deps rules: rejected from the planner and from an ordinary after_planning hook
# --------------------------------------------------------------------------------------------------

VALUE_OF_A = "{{steps.a.output.price}}"
BAD_PHASE_TWO = {
    "prior_reference_missing_from_implicit_deps": (
        [echo("b", value=VALUE_OF_A)],
        "step 'b': references prior-phase step 'a' missing from implicit_deps",
    ),
    "implicit_dep_not_referenced": (
        [echo("b", value=VALUE_OF_A, implicit_deps=["a", "a2"])],
        "step 'b': implicit_deps names 'a2', which its arguments do not reference",
    ),
    "implicit_dep_names_same_phase_step": (
        [
            echo("b", value=VALUE_OF_A, implicit_deps=["a"]),
            echo("c", value="{{steps.b.output.received}}", depends_on=["b"], implicit_deps=["b"]),
        ],
        "step 'c': implicit_deps names same-phase step 'b'; use depends_on",
    ),
    "same_phase_reference_without_depends_on": (
        [echo("b", value=VALUE_OF_A, implicit_deps=["a"]), echo("c", value="{{steps.b.output.received}}")],
        "step 'c': references same-phase step 'b' without depends_on",
    ),
    "reference_to_unknown_step": (
        [echo("b", value="{{steps.ghost.output.price}}")],
        "step 'b': references unknown step 'ghost'",
    ),
    "prior_phase_step_id_reused": (
        [lookup("a", "IBM")],
        "step 'a': step_id is already used by an earlier phase",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PHASE_TWO))
async def test_a_planner_breaking_an_implicit_deps_rule_fails_planning(client, tmp_path, case):
    steps, problem = BAD_PHASE_TWO[case]
    planner = PhasedPlanner([phase_one(), Plan(phase=2, steps=steps)])
    recorder, lookups, echoes = PhaseRecorder(), Lookup(), Echo()
    async with harness(client, tmp_path, planner, hooks=[recorder], lookups=lookups, echoes=echoes) as h:
        out = await h.run("two phases")

    assert out.failure is not None and out.failure.type == "PlanningFailed"
    assert out.failure.non_retryable
    details = out.failure_details()
    assert problem in details["cause"] and details["cause_type"] == "InvalidPlan"
    assert problem in out.failure.message
    # Nothing of phase 2 ran or was accepted; phase 1's plan and results remain in the failed record.
    assert plan_summaries(out) == ["plan · phase 1", "plan · phase 2"]  # the invalid plan is not retried
    assert recorder.seen == [(1, ["a", "a2"])]
    assert sorted(tool_step_ids(out)) == ["a", "a2"] and echoes.received == {}
    assert sorted(lookups.calls) == ["a", "a2"]
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.request_completion == "failed"
    assert stored.error.type == "PlanningFailed"
    assert [p.phase for p in stored.plans] == [1]
    assert [(s.step_id, s.status.value) for s in stored.steps] == [("a", "succeeded"), ("a2", "succeeded")]


@pytest.mark.parametrize("case", sorted(BAD_PHASE_TWO))
async def test_an_ordinary_hook_breaking_an_implicit_deps_rule_is_rejected_and_the_last_valid_plan_runs(
    client, tmp_path, case
):
    steps, problem = BAD_PHASE_TWO[case]

    class Breaker(PipelineHook):
        name = "breaker"

        async def after_planning(self, ctx, plan):
            if ctx.plan_phase == 2:
                plan.steps = [s.model_copy(deep=True) for s in steps]
            return plan

    planner = PhasedPlanner([phase_one(), valid_phase_two()])
    lookups, echoes = Lookup(), Echo()
    async with harness(client, tmp_path, planner, hooks=[Breaker()], lookups=lookups, echoes=echoes) as h:
        out = await h.run("two phases")

    assert out.failure is None
    record = out.record
    first, second = record.invocations(Stage.AFTER_PLANNING, "breaker")
    assert (first.plan_phase, first.outcome.value, decision(first)) == (
        1,
        "succeeded",
        ("fail_open", "continue", "accepted"),
    )
    assert (second.plan_phase, second.outcome.value, second.error_type) == (2, "failed", "InvalidPlan")
    assert problem in second.error
    assert decision(second) == ("fail_open", "continue", "invalid_plan")
    # The planner's valid phase-2 plan is the one accepted and run.
    assert record.plans[1].plan == valid_phase_two()
    assert echoes.received == {"b": {"value": 12.5, "text": "", "items": []}}
    assert sorted(lookups.calls) == ["a", "a2"]  # the mutation's lookup of IBM never ran
    assert [(s.step_id, s.status.value) for s in record.steps] == [
        ("a", "succeeded"),
        ("a2", "succeeded"),
        ("b", "succeeded"),
    ]
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED and stored.plans == record.plans


# --------------------------------------------------------------------------------------------------
# The phase cap
# --------------------------------------------------------------------------------------------------


class EndlessPlanner:
    """Always asks for another phase."""

    name = "endless-planner"

    def __init__(self) -> None:
        self.phases: list[int] = []

    async def plan(self, request: PlanningRequest) -> Plan:
        self.phases.append(request.phase)
        return Plan(phase=request.phase, steps=[lookup(f"p{request.phase}", "ACME")], continue_after=True)


async def test_the_phase_cap_stops_a_planner_that_always_continues(client, tmp_path):
    planner = EndlessPlanner()
    recorder = PhaseRecorder()
    async with harness(client, tmp_path, planner, hooks=[recorder], settings=StageSettings(max_planning_phases=2)) as h:
        out = await h.run("forever")

    assert out.failure is None
    assert planner.phases == [1, 2]
    assert plan_summaries(out) == ["plan · phase 1", "plan · phase 2"]
    assert [phase for phase, _ in recorder.seen] == [1, 2]
    for record in (out.record, await out.stored()):
        assert record.phase_cap_reached is True
        assert [p.phase for p in record.plans] == [1, 2]
        assert [s.step_id for s in record.steps] == ["p1", "p2"]
        assert record.status is RequestStatus.SUCCEEDED


async def test_the_default_cap_allows_three_phases(client, tmp_path):
    planner = EndlessPlanner()
    async with harness(client, tmp_path, planner) as h:
        out = await h.run("forever")

    assert out.failure is None and planner.phases == [1, 2, 3]
    assert out.record.phase_cap_reached is True and [p.phase for p in out.record.plans] == [1, 2, 3]


async def test_a_planner_that_stops_before_the_cap_does_not_reach_it(client, tmp_path):
    planner = PhasedPlanner([phase_one(), valid_phase_two()])
    async with harness(client, tmp_path, planner, settings=StageSettings(max_planning_phases=2)) as h:
        out = await h.run("two phases")
    assert out.failure is None and out.record.phase_cap_reached is False
    assert [p.phase for p in out.record.plans] == [1, 2]


# --------------------------------------------------------------------------------------------------
# A second-phase required rejection
# --------------------------------------------------------------------------------------------------


class Governor(RequiredAfterPlanningHook, PipelineHook):
    """The required hook: accepts phase 1, rejects phase 2."""

    name = "governor"

    def __init__(self) -> None:
        self.phases: list[int | None] = []

    async def after_planning(self, ctx, plan):
        self.phases.append(ctx.plan_phase)
        if ctx.plan_phase == 2:
            raise HookRejection("phase 2 would send data out")
        return plan


async def test_a_second_phase_required_rejection_keeps_phase_one_in_the_failed_record(client, tmp_path):
    planner = PhasedPlanner([phase_one(), valid_phase_two()])
    governor, lookups, echoes = Governor(), Lookup(), Echo()
    async with harness(client, tmp_path, planner, hooks=[governor], lookups=lookups, echoes=echoes) as h:
        out = await h.run("two phases")

    assert out.failure is not None and out.failure.type == "RequiredAfterPlanningError"
    assert out.failure.non_retryable
    details = out.failure_details()
    assert details["plan_phase"] == 2 and details["hook"] == "governor"
    assert details["cause"] == "phase 2 would send data out"
    assert governor.phases == [1, 2]
    # No phase-2 tool ran, and nothing after it.
    assert echoes.received == {} and sorted(tool_step_ids(out)) == ["a", "a2"]
    assert "synthesize" not in out.activity_types()

    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.request_completion == "failed"
    assert stored.error.type == "RequiredAfterPlanningError" and stored.error.details["plan_phase"] == 2
    # Phase 1's accepted plan and tool results remain; the rejected plan is not listed as accepted.
    assert [p.phase for p in stored.plans] == [1]
    assert stored.plans[0].plan.steps == phase_one().steps
    assert [(s.step_id, s.status.value, s.output) for s in stored.steps] == [
        ("a", "succeeded", ACME),
        ("a2", "succeeded", {**ACME, "symbol": "MSFT"}),
    ]
    first, second = stored.invocations(Stage.AFTER_PLANNING, "governor")
    assert (first.plan_phase, decision(first)) == (1, ("fail_closed", "continue", "accepted"))
    assert (second.plan_phase, second.outcome.value) == (2, "failed")
    assert decision(second) == ("fail_closed", "terminate", "hook_error")
    # The rejected phase was never persisted as accepted: phase 1's hook wrote its plan, phase 2's nothing.
    assert snapshots_with_hooks(out) == [{"revision": 1, "written": True}, None]
    assert persist_summaries(out) == ["bookkeeping · persist record · terminal · revision 2"]
    assert stored == out.record


# --------------------------------------------------------------------------------------------------
# A failed implicit dependency
# --------------------------------------------------------------------------------------------------


async def test_a_phase_two_step_whose_implicit_dependency_failed_is_skipped(client, tmp_path):
    phase_one_with_failure = Plan(phase=1, steps=[lookup("a", "FAIL"), lookup("ok", "ACME")], continue_after=True)
    phase_two = Plan(
        phase=2,
        steps=[
            echo("b", value="{{steps.a.output.price}}", implicit_deps=["a"]),
            echo("c", value="{{steps.ok.output.price}}", implicit_deps=["ok"]),
        ],
    )
    planner = PhasedPlanner([phase_one_with_failure, phase_two])
    echoes = Echo()
    async with harness(client, tmp_path, planner, echoes=echoes) as h:
        out = await h.run("two phases, one broken")

    assert out.failure is None
    prior = {r.step_id: r for r in planner.requests[1].prior_results}
    # The planner reads the error as result text (after after_tool hooks), not the raw error field.
    assert prior["a"].status is StepStatus.FAILED and prior["a"].result == "error: lookup backend refused FAIL"
    assert prior["a"].error is None
    steps = {s.step_id: s for s in out.record.steps}
    assert steps["b"].status is StepStatus.SKIPPED
    assert steps["b"].skip_reason == "missing"
    assert steps["b"].skip_detail == "dependency_not_succeeded: a"
    assert steps["b"].output is None and steps["b"].error is None
    assert steps["c"].status is StepStatus.SUCCEEDED
    assert echoes.received == {"c": {"value": 12.5, "text": "", "items": []}}
    assert "b" not in tool_step_ids(out) and "c" in tool_step_ids(out)
    stored = await out.stored()
    assert {s.step_id: s.status.value for s in stored.steps} == {
        "a": "failed",
        "ok": "succeeded",
        "b": "skipped",
        "c": "succeeded",
    }
