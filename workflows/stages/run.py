"""The run-level stages: before_run (rewrite the ask, the instructions or the facts, or stop the run),
and the finalizers on_error and on_finish, which run on every exit and never change its outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..decisions import REASON_MODIFIED, REASON_STOPPED
from ..models import (
    DecisionAction,
    FailurePolicy,
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    ObserveOutcome,
    RunErrorView,
    RunOutcomeView,
    RunPatch,
    RunView,
    Stage,
    Stop,
)
from ._base import CallT, Chaining, Checks, Fold, ObserverSpec, StageSpec, rejected, returned

if TYPE_CHECKING:
    from hooks.contracts import PipelineContext

__all__ = ["BeforeRunHook", "OnErrorHook", "OnFinishHook"]

# --------------------------------------------------------------------------------------------------
# before_run: rewrite the ask, instructions or facts, or stop the run
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class BeforeRunHook(Protocol):
    """before_run: first, before anything else. Return ``RunPatch`` to rewrite the ask, the instructions
    or the facts (facts merge), ``Stop`` to end the run with your text, or ``None``. A failure ends the
    run with ``ExtensionError``."""

    name: str

    def before_run(self, ctx: PipelineContext, run: RunView) -> RunPatch | Stop | None: ...


class BeforeRunCall(HookCall):
    run: RunView


class BeforeRunOutcome(HookOutcome):
    patch: RunPatch | None = None
    stop: Stop | None = None


def patched_run(run: RunView, patch: RunPatch) -> RunView:
    """``run`` after a patch: the fields it sets replace, its facts merge (later values win)."""
    return RunView(
        ask=patch.ask if patch.ask is not None else run.ask,
        instructions=patch.instructions if patch.instructions is not None else run.instructions,
        facts={**run.facts, **(patch.facts or {})},
    )


class BeforeRunSpec(StageSpec[BeforeRunCall, BeforeRunOutcome]):
    """Patches apply in order; a stop ends the run. A local batch hands a patch back to the workflow
    (rare enough that the next hook may wait for it)."""

    stage = Stage.BEFORE_RUN
    call = BeforeRunCall
    outcome = BeforeRunOutcome
    protocols = {"before_run": BeforeRunHook}
    failure_policy = FailurePolicy.FAIL_CLOSED
    chaining = Chaining.GATE
    subject_field = "run"

    def judge(self, call: BeforeRunCall, value: Any, ctx: PipelineContext, checks: Checks) -> BeforeRunOutcome:
        value = returned(value, "before_run", RunPatch, Stop)
        if isinstance(value, Stop):
            if not value.text.strip():
                raise rejected("before_run stopped the run with an empty answer")
            return BeforeRunOutcome(stop=value, decision=self.success(call.hook, REASON_STOPPED, DecisionAction.STOP))
        if value is not None and value.ask is not None and not value.ask.strip():
            raise rejected("before_run rewrote the ask to empty text")
        reason = REASON_MODIFIED if value is not None else None
        return BeforeRunOutcome(patch=value, decision=self.success(call.hook, reason))

    def refusal(self, hook: HookEntry, message: str, reason: str) -> BeforeRunOutcome:
        """The run is stopped, as if the hook had stopped it."""
        decision = HookDecision(failure_policy=self.policy(hook), action=DecisionAction.STOP, reason=reason)
        return BeforeRunOutcome(stop=Stop(text=message, reason=reason), decision=decision)

    def fold(self, subject: RunView, outcome: BeforeRunOutcome) -> Fold:
        if outcome.stop is not None:
            return Fold(subject, ends=True, carries=False)
        if outcome.patch is not None:
            return Fold(patched_run(subject, outcome.patch), carries=False)
        return Fold(subject)


# --------------------------------------------------------------------------------------------------
# on_error and on_finish: observe the run's end
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class OnErrorHook(Protocol):
    """on_error: observe a run's error and its origin (extension, planner, synthesizer, hook,
    confirmation, cancelled, ...). Runs before on_finish. A failure is a diagnostic; it never replaces
    the original error and never stops later observers."""

    name: str

    def on_error(self, ctx: PipelineContext, error: RunErrorView) -> None: ...


@runtime_checkable
class OnFinishHook(Protocol):
    """on_finish: exactly once per hook per run, for completed, stopped, error and cancelled outcomes —
    also when this hook's other stages were never reached. Observe and clean up; failures are
    diagnostics (``outcome.diagnostics`` shows earlier ones)."""

    name: str

    def on_finish(self, ctx: PipelineContext, outcome: RunOutcomeView) -> None: ...


class OnErrorCall(HookCall):
    error: RunErrorView


class OnFinishCall(HookCall):
    outcome: RunOutcomeView


class _FinalizerSpec(ObserverSpec[CallT, ObserveOutcome]):
    """Runs on every exit; a hook's failure is a diagnostic, whatever its policy, never the run's outcome."""

    outcome = ObserveOutcome
    own_policy = False
    finalizer = True


class OnErrorSpec(_FinalizerSpec[OnErrorCall]):
    stage = Stage.ON_ERROR
    call = OnErrorCall
    protocols = {"on_error": OnErrorHook}
    subject_field = "error"


class OnFinishSpec(_FinalizerSpec[OnFinishCall]):
    stage = Stage.ON_FINISH
    call = OnFinishCall
    protocols = {"on_finish": OnFinishHook}
    subject_field = "outcome"


BEFORE_RUN = BeforeRunSpec()
ON_ERROR = OnErrorSpec()
ON_FINISH = OnFinishSpec()
