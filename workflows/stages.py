"""The stage table: one declaration per stage, from which the rest of the lifecycle derives.

Each row says which hook method implements the stage, what one invocation receives and returns, the
activity that invokes it, how a failure is treated unless the hook says otherwise, and how the outcomes
of the stage's hooks combine. The registry validates hooks against it (each method's arity comes from the
stage's Protocol in ``hooks.contracts``), the worker registers the stage activities from it, and the
workflow names those activities and decides failures from it. Adding a stage is one row here plus its
behaviour: its call and outcome models, its Protocol, what its activity checks, and how the workflow
applies an outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .models import (
    AfterAnswerCall,
    AfterAnswerOutcome,
    AfterExecutionCall,
    AfterPlanningCall,
    AfterPlanningOutcome,
    AfterSynthesisCall,
    AfterSynthesisOutcome,
    AfterToolCall,
    AfterToolOutcome,
    BeforePlanningCall,
    BeforePlanningOutcome,
    BeforeRememberCall,
    BeforeRememberOutcome,
    BeforeRunCall,
    BeforeRunOutcome,
    BeforeToolCall,
    BeforeToolOutcome,
    EnrichmentOperation,
    FailurePolicy,
    HookCall,
    HookOutcome,
    ObserveOutcome,
    OnErrorCall,
    OnFinishCall,
    Stage,
    ToolErrorCall,
    ToolErrorOutcome,
)


class Chaining(StrEnum):
    """How the outcomes of one stage's hooks combine, in execution order."""

    CHAIN = "chain"  # each hook receives what the previous one returned (a plan, an answer, a result text)
    FIRST_WINS = "first_wins"  # the first hook that decides ends the stage (a short-circuit, a handled error)
    GATE = "gate"  # each hook lets the run through, changes it, or ends it (deny, stop, skip)
    OBSERVE = "observe"  # every hook runs; what they return changes nothing


# How a stage's call looks to the next hook after an outcome, for the hooks a batch runs in one local
# activity (see ``next_call``): each returns the call with the outcome applied as the workflow applies it,
# or None where the stage cannot go on without the workflow — the outcome ends the stage (a stop, a
# short-circuit, a denial, a handled error, a skip) or is rare enough to leave to it (a before_run
# rewrite). A failed invocation always stops the batch, and so does one that hands over leases or
# detached work (the workflow adopts or starts those before the next hook runs).


def _unchanged(call: Any, outcome: Any) -> Any:
    return call


def _carry_before_run(call: BeforeRunCall, outcome: BeforeRunOutcome) -> BeforeRunCall | None:
    return call if outcome.stop is None and outcome.patch is None else None


def _carry_before_planning(call: BeforePlanningCall, outcome: BeforePlanningOutcome) -> BeforePlanningCall | None:
    if outcome.short_circuit is not None:
        return None
    enrichments = dict(call.view.enrichments)
    for change in outcome.enrichment_changes:
        if change.operation is EnrichmentOperation.REMOVED:
            enrichments.pop(change.key, None)
        else:
            enrichments[change.key] = change.after
    return call.model_copy(update={"view": call.view.model_copy(update={"enrichments": enrichments})})


def _carry_after_planning(call: AfterPlanningCall, outcome: AfterPlanningOutcome) -> AfterPlanningCall:
    return call.model_copy(update={"plan": outcome.plan})


def _carry_before_tool(call: BeforeToolCall, outcome: BeforeToolOutcome) -> BeforeToolCall | None:
    verdict = outcome.verdict
    if verdict.action == "allow":
        return call
    if verdict.action == "modify":
        return call.model_copy(
            update={"call": call.call.model_copy(update={"arguments": dict(verdict.arguments or {})})}
        )
    return None


def _carry_on_tool_error(call: ToolErrorCall, outcome: ToolErrorOutcome) -> ToolErrorCall | None:
    return None if outcome.resolution.handled else call


def _carry_after_tool(call: AfterToolCall, outcome: AfterToolOutcome) -> AfterToolCall:
    return call.model_copy(update={"outcome": call.outcome.model_copy(update={"result": outcome.result})})


def _carry_after_synthesis(call: AfterSynthesisCall, outcome: AfterSynthesisOutcome) -> AfterSynthesisCall:
    return call.model_copy(update={"response": outcome.response})


def _carry_after_answer(call: AfterAnswerCall, outcome: AfterAnswerOutcome) -> AfterAnswerCall | None:
    if outcome.stop is not None:
        return None
    return call.model_copy(update={"answer": call.answer.model_copy(update={"text": outcome.text})})


def _carry_before_remember(call: BeforeRememberCall, outcome: BeforeRememberOutcome) -> BeforeRememberCall | None:
    return None if outcome.skip is not None else call.model_copy(update={"candidate": outcome.candidate})


@dataclass(frozen=True)
class StageSpec:
    """One stage: its hook methods, its models, its activity, its default failure policy, its chaining."""

    stage: Stage
    methods: tuple[str, ...]  # the hook methods that implement it (one contract per hook)
    call: type[HookCall]
    outcome: type[HookOutcome]
    failure_policy: FailurePolicy  # unless the hook sets its own (where ``own_policy`` allows)
    chaining: Chaining
    # The call after an outcome, as the next hook of a batch receives it (None: the batch stops there).
    carry: Callable[[Any, Any], Any] = _unchanged
    tool_stage: bool = False  # invoked per plan step; ``matcher`` / ``subagent_only`` filter it
    own_policy: bool = True  # a hook's ``failure_policy`` replaces the default here
    finalizer: bool = False  # runs on every exit; a failure is a diagnostic, never the run's outcome

    @property
    def activity(self) -> str:
        """The activity that invokes one hook at this stage (``<stage>_hook``)."""
        return f"{self.stage.value}_hook"


_OPEN, _CLOSED = FailurePolicy.FAIL_OPEN, FailurePolicy.FAIL_CLOSED
# The local activity that runs consecutive in-process hooks of one stage (see ``next_call``).
HOOK_BATCH_ACTIVITY = "run_hook_batch"

STAGES: dict[Stage, StageSpec] = {
    spec.stage: spec
    for spec in (
        StageSpec(
            Stage.BEFORE_RUN,
            ("before_run",),
            BeforeRunCall,
            BeforeRunOutcome,
            _CLOSED,
            Chaining.GATE,
            carry=_carry_before_run,
        ),
        StageSpec(
            Stage.BEFORE_PLANNING,
            ("before_planning", "before_planning_decision"),
            BeforePlanningCall,
            BeforePlanningOutcome,
            _OPEN,
            Chaining.FIRST_WINS,
            carry=_carry_before_planning,
        ),
        # Fails closed only for the one required hook, which is how this stage's policy is chosen.
        StageSpec(
            Stage.AFTER_PLANNING,
            ("after_planning",),
            AfterPlanningCall,
            AfterPlanningOutcome,
            _OPEN,
            Chaining.CHAIN,
            carry=_carry_after_planning,
            own_policy=False,
        ),
        StageSpec(
            Stage.BEFORE_TOOL,
            ("before_tool",),
            BeforeToolCall,
            BeforeToolOutcome,
            _CLOSED,
            Chaining.GATE,
            carry=_carry_before_tool,
            tool_stage=True,
        ),
        StageSpec(
            Stage.ON_TOOL_ERROR,
            ("on_tool_error",),
            ToolErrorCall,
            ToolErrorOutcome,
            _CLOSED,
            Chaining.FIRST_WINS,
            carry=_carry_on_tool_error,
            tool_stage=True,
        ),
        StageSpec(
            Stage.AFTER_TOOL,
            ("after_tool",),
            AfterToolCall,
            AfterToolOutcome,
            _CLOSED,
            Chaining.CHAIN,
            carry=_carry_after_tool,
            tool_stage=True,
        ),
        StageSpec(
            Stage.AFTER_EXECUTION, ("after_execution",), AfterExecutionCall, ObserveOutcome, _OPEN, Chaining.OBSERVE
        ),
        StageSpec(
            Stage.AFTER_SYNTHESIS,
            ("after_synthesis",),
            AfterSynthesisCall,
            AfterSynthesisOutcome,
            _OPEN,
            Chaining.CHAIN,
            carry=_carry_after_synthesis,
        ),
        StageSpec(
            Stage.AFTER_ANSWER,
            ("after_answer",),
            AfterAnswerCall,
            AfterAnswerOutcome,
            _CLOSED,
            Chaining.CHAIN,
            carry=_carry_after_answer,
        ),
        StageSpec(
            Stage.BEFORE_REMEMBER,
            ("before_remember",),
            BeforeRememberCall,
            BeforeRememberOutcome,
            _CLOSED,
            Chaining.GATE,
            carry=_carry_before_remember,
        ),
        StageSpec(
            Stage.ON_ERROR,
            ("on_error",),
            OnErrorCall,
            ObserveOutcome,
            _OPEN,
            Chaining.OBSERVE,
            own_policy=False,
            finalizer=True,
        ),
        StageSpec(
            Stage.ON_FINISH,
            ("on_finish",),
            OnFinishCall,
            ObserveOutcome,
            _OPEN,
            Chaining.OBSERVE,
            own_policy=False,
            finalizer=True,
        ),
    )
}
assert list(STAGES) == list(Stage), "the stage table declares every stage, in Stage order"

# Derived views of the table.
STAGE_METHODS: dict[str, Stage] = {method: spec.stage for spec in STAGES.values() for method in spec.methods}
TOOL_STAGES = frozenset(s for s, spec in STAGES.items() if spec.tool_stage)
FINALIZER_STAGES = frozenset(s for s, spec in STAGES.items() if spec.finalizer)
OWN_POLICY_STAGES = frozenset(s for s, spec in STAGES.items() if spec.own_policy)


def next_call(spec: StageSpec, applied: HookCall, outcome: HookOutcome, prebuilt: HookCall) -> HookCall | None:
    """What the hook after one in a batch receives: the stage's values and the shared view as the
    previous hook left them (``applied``, its call, with ``outcome`` carried in), and the hook's own
    entry and private state from the call the workflow built for it (``prebuilt``). None when the batch
    must stop and hand the rest of the stage back to the workflow."""
    if outcome.leases or outcome.detached:
        return None
    carried = spec.carry(applied, outcome)
    if carried is None:
        return None
    view = carried.view.model_copy(update={"state": prebuilt.view.state, "plan_phase": prebuilt.view.plan_phase})
    return carried.model_copy(update={"hook": prebuilt.hook, "view": view})
