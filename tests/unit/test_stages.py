"""Each stage declared once: the stage table derived from the family modules, and each stage's combine
rule (``fold``) held against how its hooks are documented to combine (``chaining``)."""

from __future__ import annotations

import pytest

import hooks
from workflows.models import (
    AnswerView,
    DecisionAction,
    ExecutionResult,
    FailurePolicy,
    FallbackRequest,
    HookDecision,
    HookEntry,
    HookRequestView,
    MemoryCandidate,
    MemoryExchange,
    ObserveOutcome,
    Plan,
    PlanStep,
    RecalledMemory,
    RecallPatch,
    RecallView,
    RunErrorView,
    RunOutcomeView,
    RunPatch,
    RunView,
    SkipMemory,
    Stage,
    Stop,
    ToolCall,
    ToolDecision,
    ToolErrorResolution,
    ToolOutcomeView,
)
from workflows.stages import STAGE_PROTOCOLS, STAGES, Chaining, ResultRejected, hook_activity_type, hook_stage_of
from workflows.stages._base import MAX_HOOK_ACTIVITY_TYPE
from workflows.stages.answer import AfterAnswerOutcome, AfterSynthesisOutcome, BeforeRememberOutcome
from workflows.stages.execution import AfterToolOutcome, BeforeToolOutcome, ToolErrorOutcome
from workflows.stages.planning import (
    AfterPlanningOutcome,
    BeforePlanOutcome,
    PlanAttempt,
    PlanAttemptPatch,
    ToolDescriptor,
)
from workflows.stages.run import AfterRecallOutcome, BeforeFallbackOutcome, BeforeRunOutcome

OK = HookDecision(failure_policy=FailurePolicy.FAIL_OPEN, action=DecisionAction.CONTINUE, reason="accepted")
CALL = ToolCall(step_id="s1", namespace="n", agent="a", capability="c", arguments={"x": 1})
PLAN = Plan(phase=1, steps=[PlanStep(step_id="s1", namespace="n", agent="a", capability="c")])
RECALL = RecallView(conversation_id="c", memory=RecalledMemory(exchanges=[MemoryExchange(request="q", answer="a")]))
ATTEMPT = PlanAttempt(
    phase=1,
    ask="q",
    tools=[ToolDescriptor(key="n/a/read", writes=False), ToolDescriptor(key="n/a/write"), ToolDescriptor(key="n/b/c")],
)
FALLBACK = FallbackRequest(stage="planning", phase=1, ask="q", reason="unavailable")


def test_the_table_holds_every_stage_once_in_lifecycle_order_with_its_own_activity():
    assert list(STAGES) == list(Stage)
    assert [spec.activity for spec in STAGES.values()] == [f"{stage.value}_hook" for stage in Stage]
    assert {method for spec in STAGES.values() for method in spec.methods} == set(STAGE_PROTOCOLS)


def test_every_stage_protocol_is_part_of_the_hook_api():
    for protocol in STAGE_PROTOCOLS.values():
        assert getattr(hooks, protocol.__name__) is protocol and protocol.__name__ in hooks.__all__


# One outcome per stage that lets the stage go on, and (where the stage has one) one that ends it.
CONTINUING = {
    Stage.BEFORE_RUN: (CALL, BeforeRunOutcome(decision=OK)),
    Stage.AFTER_RECALL: (RECALL, AfterRecallOutcome(patch=RecallPatch(memory=RecalledMemory()), decision=OK)),
    Stage.BEFORE_PLAN: (ATTEMPT, BeforePlanOutcome(patch=PlanAttemptPatch(context_text="prefer reads"), decision=OK)),
    Stage.BEFORE_FALLBACK: (
        FALLBACK,
        BeforeFallbackOutcome(request=FALLBACK.model_copy(update={"ask": "redacted"}), decision=OK),
    ),
    Stage.AFTER_PLANNING: (
        PLAN,
        AfterPlanningOutcome(plan=PLAN.model_copy(update={"phase": 2}), changed=True, decision=OK),
    ),
    Stage.BEFORE_TOOL: (CALL, BeforeToolOutcome(verdict=ToolDecision.modify({"x": 2}), decision=OK)),
    Stage.ON_TOOL_ERROR: (
        ToolOutcomeView(status="failed"),
        ToolErrorOutcome(resolution=ToolErrorResolution(), decision=OK),
    ),
    Stage.AFTER_TOOL: (ToolOutcomeView(status="executed", result="a"), AfterToolOutcome(result="b", decision=OK)),
    Stage.AFTER_SYNTHESIS: ("draft", AfterSynthesisOutcome(response="final", decision=OK)),
    Stage.AFTER_ANSWER: (AnswerView(text="a", handled_by="pipeline"), AfterAnswerOutcome(text="b", decision=OK)),
    Stage.BEFORE_REMEMBER: (
        MemoryCandidate(conversation_id="c", request="q", answer="a"),
        BeforeRememberOutcome(candidate=MemoryCandidate(conversation_id="c", request="q", answer="b"), decision=OK),
    ),
}
ENDING = {
    Stage.BEFORE_RUN: BeforeRunOutcome(stop=Stop(text="done"), decision=OK),
    Stage.BEFORE_FALLBACK: BeforeFallbackOutcome(stop=Stop(text="no cloud"), decision=OK),
    Stage.BEFORE_TOOL: BeforeToolOutcome(verdict=ToolDecision.deny("no"), decision=OK),
    Stage.ON_TOOL_ERROR: ToolErrorOutcome(resolution=ToolErrorResolution(handled=True, result="r"), decision=OK),
    Stage.AFTER_ANSWER: AfterAnswerOutcome(text="stop", stop=Stop(text="stop"), decision=OK),
    Stage.BEFORE_REMEMBER: BeforeRememberOutcome(
        candidate=MemoryCandidate(conversation_id="c", request="q", answer="a"), skip=SkipMemory(), decision=OK
    ),
}


@pytest.mark.parametrize("stage", [s for s in Stage if STAGES[s].chaining is Chaining.CHAIN])
def test_a_chaining_stage_hands_each_hook_what_the_previous_one_returned(stage):
    subject, outcome = CONTINUING[stage]
    folded = STAGES[stage].fold(subject, outcome)
    assert folded.subject != subject and not folded.ends and folded.carries


@pytest.mark.parametrize("stage", [s for s in Stage if STAGES[s].chaining in (Chaining.GATE, Chaining.FIRST_WINS)])
def test_a_gate_or_first_wins_stage_ends_at_its_deciding_outcome_and_goes_on_otherwise(stage):
    spec = STAGES[stage]
    subject, going_on = CONTINUING.get(stage, (None, None))
    if going_on is not None:
        assert not spec.fold(subject, going_on).ends
    if stage in ENDING:
        ended = spec.fold(subject, ENDING[stage])
        assert ended.ends and not ended.carries


def test_a_before_run_patch_applies_but_hands_the_rest_of_a_batch_back_to_the_workflow():
    run = RunView(ask="q", instructions="i", facts={"a": 1})
    outcome = BeforeRunOutcome(patch=RunPatch(ask="q2", facts={"b": 2}), decision=OK)
    folded = STAGES[Stage.BEFORE_RUN].fold(run, outcome)
    assert folded.subject == RunView(ask="q2", instructions="i", facts={"a": 1, "b": 2})
    assert not folded.ends and not folded.carries


@pytest.mark.parametrize("stage", [s for s in Stage if STAGES[s].chaining is Chaining.OBSERVE])
def test_an_observer_stage_changes_nothing_and_refuses_a_returned_value(stage):
    spec = STAGES[stage]
    subject = {
        Stage.AFTER_EXECUTION: ExecutionResult(),
        Stage.ON_ERROR: RunErrorView(origin="extension", type="T", message="m"),
        Stage.ON_FINISH: RunOutcomeView(status="completed"),
    }[stage]
    folded = spec.fold(subject, ObserveOutcome(decision=OK))
    assert folded.subject is subject and not folded.ends
    hook = HookEntry(name="observer", index=0, stages=[stage])
    call = spec.build(hook, HookRequestView(request="q", request_id="r", workflow_id="w"), subject)
    with pytest.raises(ResultRejected, match="observes only"):
        spec.judge(call, "a value", None, None)  # type: ignore[arg-type]
    reason = "observed" if spec.finalizer else "accepted"
    assert spec.judge(call, None, None, None).decision.reason == reason  # type: ignore[arg-type]


def test_before_plan_filtering_intersects_so_a_later_hook_cannot_bring_a_tool_back():
    spec = STAGES[Stage.BEFORE_PLAN]
    first = spec.fold(ATTEMPT, BeforePlanOutcome(patch=PlanAttemptPatch(tools=["n/a/read", "a/write"]), decision=OK))
    assert first.subject.tool_keys == ["n/a/read", "n/a/write"]  # by key, or by agent/capability
    second = spec.fold(
        first.subject, BeforePlanOutcome(patch=PlanAttemptPatch(tools=["n/b/c", "n/a/read"]), decision=OK)
    )
    assert second.subject.tool_keys == ["n/a/read"] and not second.ends
    assert second.subject.context_text == "" and first.carries


def test_after_planning_may_stop_the_run():
    spec = STAGES[Stage.AFTER_PLANNING]
    hook = HookEntry(name="gate", index=0, stages=[Stage.AFTER_PLANNING])
    call = spec.build(hook, HookRequestView(request="q", request_id="r", workflow_id="w"), PLAN)
    outcome = spec.judge(call, Stop(text="Not today.", reason="closed"), None, None)  # type: ignore[arg-type]
    assert outcome.stop == Stop(text="Not today.", reason="closed") and outcome.decision.action is DecisionAction.STOP
    folded = spec.fold(PLAN, outcome)
    assert folded.ends and not folded.carries and folded.subject == PLAN
    with pytest.raises(ResultRejected, match="empty answer"):
        spec.judge(call, Stop(text="  "), None, None)  # type: ignore[arg-type]


def test_before_fallback_keeps_what_describes_the_handoff_whatever_a_hook_returns():
    spec = STAGES[Stage.BEFORE_FALLBACK]
    hook = HookEntry(name="redact", index=0, stages=[Stage.BEFORE_FALLBACK])
    call = spec.build(hook, HookRequestView(request="q", request_id="r", workflow_id="w"), FALLBACK)
    forged = FALLBACK.model_copy(update={"ask": "[redacted]", "reason": "nothing happened", "stage": "synthesis"})
    outcome = spec.judge(call, forged, None, None)  # type: ignore[arg-type]
    assert outcome.request is not None and outcome.request.ask == "[redacted]"
    assert (outcome.request.reason, outcome.request.stage) == ("unavailable", "planning")
    with pytest.raises(ResultRejected, match="empty text"):
        spec.judge(call, FALLBACK.model_copy(update={"ask": ""}), None, None)  # type: ignore[arg-type]


def test_only_the_gating_stages_can_refuse_for_a_hook_that_could_not_decide():
    """A hook whose chain ran out and whose timeout blocks: the workflow refuses for it — a denied call at
    before_tool, a stopped run at before_run — and that outcome ends the stage like the hook's own would."""
    hook = HookEntry(name="gate", index=0, stages=[Stage.BEFORE_TOOL, Stage.BEFORE_RUN])
    denied = STAGES[Stage.BEFORE_TOOL].refusal(
        hook, "blocked by hook gate: chain_budget_exhausted", "chain_budget_exhausted"
    )
    assert isinstance(denied, BeforeToolOutcome)
    assert (denied.verdict.action, denied.verdict.reason) == ("deny", "chain_budget_exhausted")
    assert denied.verdict.message == "blocked by hook gate: chain_budget_exhausted"
    assert (denied.decision.failure_policy, denied.decision.action) == (FailurePolicy.FAIL_CLOSED, DecisionAction.DENY)
    assert STAGES[Stage.BEFORE_TOOL].fold(CALL, denied).ends
    stopped = STAGES[Stage.BEFORE_RUN].refusal(hook, "blocked", "chain_budget_exhausted")
    assert isinstance(stopped, BeforeRunOutcome) and stopped.stop == Stop(
        text="blocked", reason="chain_budget_exhausted"
    )
    assert stopped.decision.action is DecisionAction.STOP
    assert STAGES[Stage.BEFORE_RUN].fold(RunView(ask="x"), stopped).ends
    others = [spec for stage, spec in STAGES.items() if stage not in (Stage.BEFORE_TOOL, Stage.BEFORE_RUN)]
    assert all(spec.refusal(hook, "blocked", "chain_budget_exhausted") is None for spec in others)


def test_in_process_hooks_run_under_types_that_name_them():
    assert hook_activity_type(Stage.AFTER_PLANNING, ["allowed-operations"]) == "after_planning:allowed-operations"
    assert hook_activity_type(Stage.BEFORE_TOOL, ["a", "b c"]) == "before_tool:a + b c"
    many = hook_activity_type(Stage.AFTER_SYNTHESIS, [f"hook-number-{n:03}" for n in range(40)])
    assert len(many) <= MAX_HOOK_ACTIVITY_TYPE and many.startswith("after_synthesis:hook-number-000 + ")
    assert many.endswith(" more") and "+" in many.rsplit(" + ", 1)[-1]
    long = hook_activity_type(Stage.ON_FINISH, ["x" * 500, "y"])
    assert len(long) <= MAX_HOOK_ACTIVITY_TYPE and long.endswith("… +1 more")
    for text in (many, long, "after_planning:allowed-operations"):
        assert hook_stage_of(text) in (Stage.AFTER_SYNTHESIS, Stage.ON_FINISH, Stage.AFTER_PLANNING)
    assert hook_stage_of("after_planning_hook") is None and hook_stage_of("nostage:x") is None
