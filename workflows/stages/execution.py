"""The execution stages: the tool-call stages each step passes through — before_tool (allow / modify /
deny / stop), on_tool_error (substitute a failed call's result), after_tool (rewrite the result text) —
and after_execution, which observes every step's outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import Field

from ..decisions import (
    REASON_ACCEPTED,
    REASON_ALLOWED,
    REASON_DENIED,
    REASON_HANDLED,
    REASON_MODIFIED,
    REASON_REWRITTEN,
    REASON_STOPPED,
)
from ..models import (
    DecisionAction,
    ExecutionResult,
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    ObserveOutcome,
    PlanStep,
    Stage,
    StepSummary,
    ToolCall,
    ToolDecision,
    ToolErrorResolution,
    ToolOutcomeView,
)
from ._base import CallT, Chaining, Checks, Fold, ObserverSpec, OutcomeT, StageSpec, rejected, returned

if TYPE_CHECKING:
    from hooks.contracts import PipelineContext

__all__ = ["AfterExecutionHook", "AfterToolHook", "BeforeToolHook", "OnToolErrorHook"]


class _ToolStageSpec(StageSpec[CallT, OutcomeT]):
    """A stage each tool step passes through: invoked per plan step (``matcher`` / ``subagent_only`` filter
    its hooks); a hook's failure ends the run unless the hook declares otherwise."""

    tool_stage = True


# --------------------------------------------------------------------------------------------------
# before_tool: allow / modify / deny / stop one call
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class BeforeToolHook(Protocol):
    """before_tool: once a step's arguments are known, before its tool runs. Return ``None`` or a
    :class:`ToolDecision`: allow (the zero value), modify (new arguments, validated again against the
    tool's parameters), deny (the step is skipped with reason ``policy``; ``message`` is what the model
    reads) or stop (the run ends with ``message`` as its answer). The first deny or stop ends the chain;
    modifications chain in order. A failure ends the run with ``ExtensionError``."""

    name: str

    def before_tool(self, ctx: PipelineContext, call: ToolCall) -> ToolDecision | None: ...


class BeforeToolCall(HookCall):
    call: ToolCall
    steps: list[StepSummary] = Field(default_factory=list)  # the request's steps finished so far


class BeforeToolOutcome(HookOutcome):
    verdict: ToolDecision


_TOOL_VERDICTS = {
    "allow": (DecisionAction.CONTINUE, REASON_ALLOWED),
    "modify": (DecisionAction.CONTINUE, REASON_MODIFIED),
    "deny": (DecisionAction.DENY, REASON_DENIED),
    "stop": (DecisionAction.STOP, REASON_STOPPED),
}


class BeforeToolSpec(_ToolStageSpec[BeforeToolCall, BeforeToolOutcome]):
    """Modifications chain; the first deny or stop ends the stage. A modify is validated against the
    tool's parameters in the activity, so invalid rewritten arguments never reach execution."""

    stage = Stage.BEFORE_TOOL
    protocols = {"before_tool": BeforeToolHook}
    chaining = Chaining.GATE
    subject_field = "call"

    def judge(self, call: BeforeToolCall, value: Any, ctx: PipelineContext, checks: Checks) -> BeforeToolOutcome:
        verdict = returned(value, "before_tool", ToolDecision) or ToolDecision()
        if verdict.action == "stop" and not verdict.message.strip():
            raise rejected("a stop decision needs the run's answer as its message")
        if verdict.action == "modify":
            if verdict.arguments is None:
                raise rejected("a modify decision needs arguments")
            step = PlanStep(
                step_id=call.call.step_id,
                namespace=call.call.namespace,
                agent=call.call.agent,
                capability=call.call.capability,
                arguments=verdict.arguments,
            )
            problems = checks.argument_problems(step)
            if problems:
                raise rejected("rewritten arguments are invalid: " + "; ".join(problems))
        action, reason = _TOOL_VERDICTS[verdict.action]
        return BeforeToolOutcome(verdict=verdict, decision=self.success(call.hook, reason, action))

    def refusal(self, hook: HookEntry, message: str, reason: str) -> BeforeToolOutcome:
        """The call is denied, as if the hook had denied it."""
        decision = HookDecision(failure_policy=self.policy(hook), action=DecisionAction.DENY, reason=reason)
        return BeforeToolOutcome(verdict=ToolDecision.deny(message, reason=reason), decision=decision)

    def fold(self, subject: ToolCall, outcome: BeforeToolOutcome) -> Fold:
        verdict = outcome.verdict
        if verdict.action == "modify":
            return Fold(subject.model_copy(update={"arguments": dict(verdict.arguments or {})}))
        if verdict.action in ("deny", "stop"):
            return Fold.end(subject)
        return Fold(subject)


# --------------------------------------------------------------------------------------------------
# on_tool_error: the first hook that handles a failed call substitutes its result
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class OnToolErrorHook(Protocol):
    """on_tool_error: a tool failed after its retries (``outcome.status == "failed"``, ``outcome.error``).
    Return ``ToolErrorResolution(handled=True, result=...)`` to substitute a readable result and suppress
    the error, or ``None``. The first handled resolution wins. A failure ends the run with
    ``ExtensionError``."""

    name: str

    def on_tool_error(
        self, ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView
    ) -> ToolErrorResolution | None: ...


class ToolErrorCall(HookCall):
    call: ToolCall
    outcome: ToolOutcomeView


class ToolErrorOutcome(HookOutcome):
    resolution: ToolErrorResolution


class OnToolErrorSpec(_ToolStageSpec[ToolErrorCall, ToolErrorOutcome]):
    stage = Stage.ON_TOOL_ERROR
    protocols = {"on_tool_error": OnToolErrorHook}
    chaining = Chaining.FIRST_WINS
    subject_field = "outcome"

    def arguments(self, call: ToolErrorCall, ctx: PipelineContext) -> tuple[Any, ...]:
        return call.call.model_copy(deep=True), call.outcome.model_copy()

    def judge(self, call: ToolErrorCall, value: Any, ctx: PipelineContext, checks: Checks) -> ToolErrorOutcome:
        resolution = returned(value, "on_tool_error", ToolErrorResolution) or ToolErrorResolution()
        reason = REASON_HANDLED if resolution.handled else REASON_ACCEPTED
        return ToolErrorOutcome(resolution=resolution, decision=self.success(call.hook, reason))

    def fold(self, subject: ToolOutcomeView, outcome: ToolErrorOutcome) -> Fold:
        handled = outcome.resolution.handled
        return Fold(subject, ends=handled, carries=not handled)


# --------------------------------------------------------------------------------------------------
# after_tool: rewrite the result text of every outcome, chained
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class AfterToolHook(Protocol):
    """after_tool: every step's outcome — ``executed`` (its raw output), ``cached`` (answered from an
    earlier identical read, ``from_step``; no raw output), ``skipped`` (``reason``: policy, confirmation,
    missing or duplicate) or ``failed``. Return new result text or ``None``; the execution status never
    changes. Chained in order; the text is capped after the last hook. A failure ends the run with
    ``ExtensionError``; the step stays in the record as it ran."""

    name: str

    def after_tool(self, ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView) -> str | None: ...


class AfterToolCall(HookCall):
    call: ToolCall
    outcome: ToolOutcomeView
    steps: list[StepSummary] = Field(default_factory=list)  # the request's steps finished before this one


class AfterToolOutcome(HookOutcome):
    result: str


class AfterToolSpec(_ToolStageSpec[AfterToolCall, AfterToolOutcome]):
    stage = Stage.AFTER_TOOL
    protocols = {"after_tool": AfterToolHook}
    chaining = Chaining.CHAIN
    subject_field = "outcome"
    echo = "result"

    def echoed(self, call: AfterToolCall) -> str:
        return call.outcome.result

    def arguments(self, call: AfterToolCall, ctx: PipelineContext) -> tuple[Any, ...]:
        return call.call.model_copy(deep=True), call.outcome.model_copy(deep=True)

    def judge(self, call: AfterToolCall, value: Any, ctx: PipelineContext, checks: Checks) -> AfterToolOutcome:
        result = returned(value, "after_tool", str)
        result = call.outcome.result if result is None else result
        reason = REASON_ACCEPTED if result == call.outcome.result else REASON_REWRITTEN
        return AfterToolOutcome(result=result, decision=self.success(call.hook, reason))

    def fold(self, subject: ToolOutcomeView, outcome: AfterToolOutcome) -> Fold:
        return Fold(subject.model_copy(update={"result": outcome.result}))


# --------------------------------------------------------------------------------------------------
# after_execution: observe every step's outcome
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class AfterExecutionHook(Protocol):
    """after_execution: observe the tool results (record to memory, audit, metrics). Return ``None``;
    results cannot be changed here. Errors fail open."""

    name: str

    def after_execution(self, ctx: PipelineContext, execution: ExecutionResult) -> None: ...


class AfterExecutionCall(HookCall):
    execution: ExecutionResult


class AfterExecutionSpec(ObserverSpec[AfterExecutionCall, ObserveOutcome]):
    stage = Stage.AFTER_EXECUTION
    protocols = {"after_execution": AfterExecutionHook}
    subject_field = "execution"


BEFORE_TOOL = BeforeToolSpec()
ON_TOOL_ERROR = OnToolErrorSpec()
AFTER_TOOL = AfterToolSpec()
AFTER_EXECUTION = AfterExecutionSpec()
