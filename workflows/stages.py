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

from dataclasses import dataclass
from enum import StrEnum

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


@dataclass(frozen=True)
class StageSpec:
    """One stage: its hook methods, its models, its activity, its default failure policy, its chaining."""

    stage: Stage
    methods: tuple[str, ...]  # the hook methods that implement it (one contract per hook)
    call: type[HookCall]
    outcome: type[HookOutcome]
    failure_policy: FailurePolicy  # unless the hook sets its own (where ``own_policy`` allows)
    chaining: Chaining
    tool_stage: bool = False  # invoked per plan step; ``matcher`` / ``subagent_only`` filter it
    own_policy: bool = True  # a hook's ``failure_policy`` replaces the default here
    finalizer: bool = False  # runs on every exit; a failure is a diagnostic, never the run's outcome

    @property
    def activity(self) -> str:
        """The activity that invokes one hook at this stage (``<stage>_hook``)."""
        return f"{self.stage.value}_hook"


_OPEN, _CLOSED = FailurePolicy.FAIL_OPEN, FailurePolicy.FAIL_CLOSED

STAGES: dict[Stage, StageSpec] = {
    spec.stage: spec
    for spec in (
        StageSpec(Stage.BEFORE_RUN, ("before_run",), BeforeRunCall, BeforeRunOutcome, _CLOSED, Chaining.GATE),
        StageSpec(
            Stage.BEFORE_PLANNING,
            ("before_planning", "before_planning_decision"),
            BeforePlanningCall,
            BeforePlanningOutcome,
            _OPEN,
            Chaining.FIRST_WINS,
        ),
        # Fails closed only for the one required hook, which is how this stage's policy is chosen.
        StageSpec(
            Stage.AFTER_PLANNING,
            ("after_planning",),
            AfterPlanningCall,
            AfterPlanningOutcome,
            _OPEN,
            Chaining.CHAIN,
            own_policy=False,
        ),
        StageSpec(
            Stage.BEFORE_TOOL,
            ("before_tool",),
            BeforeToolCall,
            BeforeToolOutcome,
            _CLOSED,
            Chaining.GATE,
            tool_stage=True,
        ),
        StageSpec(
            Stage.ON_TOOL_ERROR,
            ("on_tool_error",),
            ToolErrorCall,
            ToolErrorOutcome,
            _CLOSED,
            Chaining.FIRST_WINS,
            tool_stage=True,
        ),
        StageSpec(
            Stage.AFTER_TOOL, ("after_tool",), AfterToolCall, AfterToolOutcome, _CLOSED, Chaining.CHAIN, tool_stage=True
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
        ),
        StageSpec(Stage.AFTER_ANSWER, ("after_answer",), AfterAnswerCall, AfterAnswerOutcome, _CLOSED, Chaining.CHAIN),
        StageSpec(
            Stage.BEFORE_REMEMBER,
            ("before_remember",),
            BeforeRememberCall,
            BeforeRememberOutcome,
            _CLOSED,
            Chaining.GATE,
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
