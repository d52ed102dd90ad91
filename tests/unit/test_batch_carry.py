"""What the next hook of a batch receives after an outcome: the stage's values as the previous hook left
them, its own entry and private state; and where a batch must stop and hand the stage back to the
workflow."""

from __future__ import annotations

import pydantic
import pytest

from workflows.models import (
    AnswerView,
    DecisionAction,
    DetachedWork,
    EnrichmentChange,
    EnrichmentOperation,
    ExecutionResult,
    FailurePolicy,
    HookBatchOutcome,
    HookDecision,
    HookEntry,
    HookRequestView,
    ManagedLease,
    MemoryCandidate,
    ObserveOutcome,
    Plan,
    PlanStep,
    RunOutcomeView,
    RunPatch,
    RunView,
    ShortCircuitProposal,
    SkipMemory,
    Stage,
    Stop,
    ToolCall,
    ToolErrorResolution,
    ToolOutcomeView,
    ToolStepHooks,
)
from workflows.stages import STAGES, hands_on, hook_activity_type, hook_stage_of, next_call, stages_activity_type
from workflows.stages._base import MAX_HOOK_ACTIVITY_TYPE
from workflows.stages.answer import (
    AfterAnswerCall,
    AfterAnswerOutcome,
    AfterSynthesisCall,
    AfterSynthesisOutcome,
    BeforeRememberCall,
    BeforeRememberOutcome,
)
from workflows.stages.execution import (
    AfterExecutionCall,
    AfterToolCall,
    AfterToolOutcome,
    BeforeToolCall,
    ToolErrorCall,
    ToolErrorOutcome,
)
from workflows.stages.planning import AfterPlanningCall, AfterPlanningOutcome
from workflows.stages.planning import BeforePlanningCall as PlanningCall
from workflows.stages.planning import BeforePlanningOutcome as PlanningOutcome
from workflows.stages.run import BeforeRunCall, BeforeRunOutcome, OnFinishCall

OK = HookDecision(failure_policy=FailurePolicy.FAIL_OPEN, action=DecisionAction.CONTINUE, reason="accepted")


def entry(name: str, stage: Stage) -> HookEntry:
    return HookEntry(name=name, index=0, stages=[stage])


def view(state: dict | None = None, **fields) -> HookRequestView:
    return HookRequestView(request="ask", request_id="r", workflow_id="w", state=state or {}, **fields)


def a_lease(stage: Stage) -> ManagedLease:
    return ManagedLease(
        lease_id="l",
        hook="a",
        stage=stage,
        ttl_seconds=30,
        renew_interval_seconds=10,
        renewal_effect_id="renew",
        cleanup_effect_id="release",
    )


def carried(stage: Stage, first, outcome, second):
    return next_call(STAGES[stage], first, outcome, second)


def test_the_next_hook_keeps_its_own_entry_and_private_state():
    stage = Stage.AFTER_PLANNING
    plan, changed = (
        Plan(phase=1, steps=[]),
        Plan(phase=1, steps=[PlanStep(step_id="s", namespace="n", agent="a", capability="c")]),
    )
    first = AfterPlanningCall(hook=entry("a", stage), view=view({"mine": 1}, plan_phase=1), plan=plan)
    second = AfterPlanningCall(hook=entry("b", stage), view=view({"theirs": 2}, plan_phase=1), plan=plan)
    call = carried(stage, first, AfterPlanningOutcome(plan=changed, changed=True, decision=OK), second)
    assert call.hook.name == "b" and call.view.state == {"theirs": 2} and call.view.plan_phase == 1
    assert call.plan == changed


def test_enrichment_changes_carry_in_order_and_a_short_circuit_stops():
    stage = Stage.BEFORE_PLANNING
    first = PlanningCall(hook=entry("a", stage), view=view(enrichments={"old": 1, "keep": 2}))
    second = PlanningCall(hook=entry("b", stage), view=view(enrichments={"old": 1, "keep": 2}))
    changes = [
        EnrichmentChange(key="new", operation=EnrichmentOperation.ADDED, before=None, after="x"),
        EnrichmentChange(key="old", operation=EnrichmentOperation.REMOVED, before=1, after=None),
    ]
    call = carried(stage, first, PlanningOutcome(enrichment_changes=changes, decision=OK), second)
    assert call.view.enrichments == {"keep": 2, "new": "x"}
    proposal = ShortCircuitProposal(contract="decision", kind="cache", response="hit", source="cache")
    assert carried(stage, first, PlanningOutcome(short_circuit=proposal, decision=OK), second) is None


def test_chained_values_carry():
    tool = ToolCall(step_id="s", namespace="n", agent="a", capability="c", arguments={"x": 1})
    outcome_view = ToolOutcomeView(status="executed", result="raw")
    stage = Stage.AFTER_TOOL
    first = AfterToolCall(hook=entry("a", stage), view=view(), call=tool, outcome=outcome_view)
    second = AfterToolCall(hook=entry("b", stage), view=view(), call=tool, outcome=outcome_view)
    assert carried(stage, first, AfterToolOutcome(result="redacted", decision=OK), second).outcome.result == "redacted"

    stage = Stage.AFTER_ANSWER
    answer = AnswerView(text="one", handled_by="pipeline")
    first = AfterAnswerCall(hook=entry("a", stage), view=view(), answer=answer)
    second = AfterAnswerCall(hook=entry("b", stage), view=view(), answer=answer)
    assert carried(stage, first, AfterAnswerOutcome(text="two", decision=OK), second).answer.text == "two"
    stopped = AfterAnswerOutcome(text="two", stop=Stop(text="bye"), decision=OK)
    assert carried(stage, first, stopped, second) is None

    stage = Stage.BEFORE_REMEMBER
    candidate = MemoryCandidate(conversation_id="c", request="q", answer="a")
    replaced = candidate.model_copy(update={"answer": "shorter"})
    first = BeforeRememberCall(hook=entry("a", stage), view=view(), candidate=candidate)
    second = BeforeRememberCall(hook=entry("b", stage), view=view(), candidate=candidate)
    assert carried(stage, first, BeforeRememberOutcome(candidate=replaced, decision=OK), second).candidate == replaced
    skipped = BeforeRememberOutcome(candidate=candidate, skip=SkipMemory(reason="no"), decision=OK)
    assert carried(stage, first, skipped, second) is None


def test_what_ends_a_stage_or_only_the_workflow_applies_stops_the_batch():
    stage = Stage.BEFORE_RUN
    run = RunView(ask="ask")
    first = BeforeRunCall(hook=entry("a", stage), view=view(), run=run)
    second = BeforeRunCall(hook=entry("b", stage), view=view(), run=run)
    assert carried(stage, first, BeforeRunOutcome(decision=OK), second) is not None
    assert carried(stage, first, BeforeRunOutcome(patch=RunPatch(ask="other"), decision=OK), second) is None
    assert carried(stage, first, BeforeRunOutcome(stop=Stop(text="no"), decision=OK), second) is None

    stage = Stage.ON_TOOL_ERROR
    tool = ToolCall(step_id="s", namespace="n", agent="a", capability="c")
    failed = ToolOutcomeView(status="failed", error="boom")
    first = ToolErrorCall(hook=entry("a", stage), view=view(), call=tool, outcome=failed)
    second = ToolErrorCall(hook=entry("b", stage), view=view(), call=tool, outcome=failed)
    handled = ToolErrorOutcome(resolution=ToolErrorResolution(handled=True, result="fallback"), decision=OK)
    assert carried(stage, first, handled, second) is None
    assert carried(stage, first, ToolErrorOutcome(resolution=ToolErrorResolution(), decision=OK), second) is not None

    # Leases and detached work are adopted or started by the workflow before the next hook runs.
    stage = Stage.ON_FINISH
    first = OnFinishCall(hook=entry("a", stage), view=view(), outcome=RunOutcomeView(status="completed"))
    second = OnFinishCall(hook=entry("b", stage), view=view(), outcome=RunOutcomeView(status="completed"))
    assert carried(stage, first, ObserveOutcome(decision=OK), second) is not None
    lease = a_lease(stage)
    assert carried(stage, first, ObserveOutcome(decision=OK, leases=[lease]), second) is None
    work = DetachedWork(effect_id="e", hook="a", stage=stage, name="audit")
    assert carried(stage, first, ObserveOutcome(decision=OK, detached=[work]), second) is None


# --------------------------------------------------------------------------------------------------
# Running on into the next stage (``hands_on``) and the type that names every stage's hooks
# --------------------------------------------------------------------------------------------------


def test_a_stage_that_left_the_run_as_it_was_hands_on_to_the_next_one():
    stage = Stage.AFTER_SYNTHESIS
    spec = STAGES[stage]
    first = AfterSynthesisCall(hook=entry("a", stage), view=view({"n": 1}), response="text")
    second = AfterSynthesisCall(hook=entry("b", stage), view=view(), response="text")
    same = AfterSynthesisOutcome(response="text", decision=OK, state={"n": 1})
    assert hands_on(spec, [(first, same), (second, AfterSynthesisOutcome(response="text", decision=OK, state={}))])
    # An observer's outcome changes nothing: it hands on whatever it returned.
    observed = AfterExecutionCall(hook=entry("a", Stage.AFTER_EXECUTION), view=view(), execution=ExecutionResult())
    assert hands_on(STAGES[Stage.AFTER_EXECUTION], [(observed, ObserveOutcome(decision=OK))])


def test_a_stage_that_changed_the_run_or_decided_something_hands_back_to_the_workflow():
    stage = Stage.AFTER_SYNTHESIS
    spec = STAGES[stage]
    call = AfterSynthesisCall(hook=entry("a", stage), view=view({"n": 1}), response="text")
    assert not hands_on(spec, [])  # nothing ran: the workflow goes on
    # a rewrite, even one a later hook undoes, is the workflow's to carry
    rewritten = AfterSynthesisOutcome(response="other", decision=OK)
    assert not hands_on(spec, [(call, rewritten)])
    undone = [
        (call, rewritten),
        (call.model_copy(update={"response": "other"}), AfterSynthesisOutcome(response="text", decision=OK)),
    ]
    assert hands_on(spec, undone)  # the subject is back where it started, the state untouched
    # the hook's private state, a lease, detached work, or a decision the workflow acts on
    assert not hands_on(spec, [(call, AfterSynthesisOutcome(response="text", decision=OK, state={"n": 2}))])
    lease = a_lease(stage)
    assert not hands_on(spec, [(call, AfterSynthesisOutcome(response="text", decision=OK, leases=[lease]))])
    work = DetachedWork(effect_id="e", hook="a", stage=stage, name="audit")
    assert not hands_on(spec, [(call, AfterSynthesisOutcome(response="text", decision=OK, detached=[work]))])
    for action in (DecisionAction.DENY, DecisionAction.STOP, DecisionAction.TERMINATE, DecisionAction.SKIP):
        decided = OK.model_copy(update={"action": action})
        assert not hands_on(spec, [(call, AfterSynthesisOutcome(response="text", decision=decided))])
    answer_stage = Stage.AFTER_ANSWER
    answer = AnswerView(text="one", handled_by="pipeline")
    answered = AfterAnswerCall(hook=entry("a", answer_stage), view=view(), answer=answer)
    stop = AfterAnswerOutcome(text="one", stop=Stop(text="bye"), decision=OK)
    assert not hands_on(STAGES[answer_stage], [(answered, stop)])


def test_the_type_of_several_stages_names_each_stages_hooks_and_stays_within_bounds():
    two = stages_activity_type([(Stage.AFTER_PLANNING, ["gate"]), (Stage.AFTER_EXECUTION, ["audit", "metrics"])])
    assert two == "after_planning:gate → after_execution:audit + metrics"
    assert hook_stage_of(two) is Stage.AFTER_PLANNING
    assert stages_activity_type([(Stage.AFTER_ANSWER, ["a"])]) == hook_activity_type(Stage.AFTER_ANSWER, ["a"])
    many = [(Stage.AFTER_PLANNING, [f"planning-hook-{n}" for n in range(6)])] + [
        (stage, [f"{stage.value}-hook-{n}" for n in range(5)])
        for stage in (Stage.AFTER_EXECUTION, Stage.AFTER_SYNTHESIS, Stage.AFTER_ANSWER)
    ]
    long = stages_activity_type(many)
    assert len(long) <= MAX_HOOK_ACTIVITY_TYPE and hook_stage_of(long) is Stage.AFTER_PLANNING
    assert long.endswith("after_execution:5 hooks → after_synthesis:5 hooks → after_answer:5 hooks")
    huge = stages_activity_type([(Stage.AFTER_PLANNING, ["x" * 300]), (Stage.AFTER_ANSWER, ["y"])])
    assert len(huge) <= MAX_HOOK_ACTIVITY_TYPE and hook_stage_of(huge) is Stage.AFTER_PLANNING
    assert huge.endswith("→ after_answer:1 hook")


def test_a_marker_holding_one_hooks_outcome_does_not_decode_as_a_batch_in_which_none_ran():
    decision = HookDecision(failure_policy=FailurePolicy.FAIL_OPEN, action=DecisionAction.CONTINUE, reason="ok")
    lone = ObserveOutcome(decision=decision).model_dump(mode="json")  # a lone hook's result, same type
    with pytest.raises(pydantic.ValidationError, match="entries"):
        HookBatchOutcome.model_validate(lone)
    assert HookBatchOutcome.model_validate({"entries": []}).entries == []


def test_a_tool_step_sends_what_its_hook_calls_share_once_and_its_activity_gets_each_call_whole():
    call = ToolCall(step_id="s1", namespace="n", agent="a", capability="quote", arguments={"symbol": "AAA"})
    before = [
        BeforeToolCall(hook=entry("allow", Stage.BEFORE_TOOL), view=view(), call=call),
        BeforeToolCall(hook=entry("audit", Stage.BEFORE_TOOL), view=view(state={"n": 1}), call=call),
    ]
    after = [
        AfterToolCall(
            hook=entry("redact", Stage.AFTER_TOOL), view=view(), call=call, outcome=ToolOutcomeView(status="skipped")
        )
    ]
    hooks = ToolStepHooks.of(before, after, "run-1")

    whole = [c.model_dump(mode="json", exclude_defaults=True) for c in [*before, *after]]
    assert [*hooks.before_calls(), *hooks.after_calls()] == whole
    assert set(hooks.shared) == {"call"}  # the views differ in one hook's private state
    assert all("call" not in own for own in [*hooks.before, *hooks.after])
    alike = ToolStepHooks.of(before[:1], after, "run-1")
    assert set(alike.shared) == {"call", "view"}
    assert ToolStepHooks.model_validate_json(alike.model_dump_json()).after_calls() == [whole[2]]
