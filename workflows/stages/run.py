"""The run-level stages: before_run (rewrite the ask, the instructions or the facts, or stop the run),
after_recall (a transient view of the conversation's memory), before_fallback (what a fallback model is
asked when the primary failed, or stop), and the finalizers on_error and on_finish, which run on every
exit and never change its outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..decisions import REASON_MODIFIED
from ..models import (
    MAX_ENRICHMENT_BYTES,
    DecisionAction,
    FallbackRequest,
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    ObserveOutcome,
    RecallPatch,
    RecallView,
    RunErrorView,
    RunOutcomeView,
    RunPatch,
    RunView,
    Stage,
    Stop,
    json_size,
)
from ._base import CallT, Chaining, Checks, Fold, ObserverSpec, StageSpec, rejected, returned

if TYPE_CHECKING:
    from hooks.contracts import PipelineContext

__all__ = ["AfterRecallHook", "BeforeFallbackHook", "BeforeRunHook", "OnErrorHook", "OnFinishHook"]

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
    protocols = {"before_run": BeforeRunHook}
    chaining = Chaining.GATE
    subject_field = "run"

    def judge(self, call: BeforeRunCall, value: Any, ctx: PipelineContext, checks: Checks) -> BeforeRunOutcome:
        value = returned(value, "before_run", RunPatch, Stop)
        if isinstance(value, Stop):
            return BeforeRunOutcome(stop=value, decision=self.stopped(call.hook, value))
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
            return Fold.end(subject)
        if outcome.patch is not None:
            return Fold(patched_run(subject, outcome.patch), carries=False)
        return Fold(subject)


# --------------------------------------------------------------------------------------------------
# after_recall: a transient view of the conversation's memory
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class AfterRecallHook(Protocol):
    """after_recall: once the conversation's memory is loaded, before planning. Return ``RecallPatch`` to
    plan this run with other memory (drop an exchange, shorten the summary), or ``None``. The change is
    transient: what the run saves starts from the memory as loaded. A failure ends the run with
    ``ExtensionError``."""

    name: str

    def after_recall(self, ctx: PipelineContext, recall: RecallView) -> RecallPatch | None: ...


class AfterRecallCall(HookCall):
    recall: RecallView


class AfterRecallOutcome(HookOutcome):
    patch: RecallPatch | None = None


class AfterRecallSpec(StageSpec[AfterRecallCall, AfterRecallOutcome]):
    """Patches chain in order: each hook sees the memory the one before left."""

    stage = Stage.AFTER_RECALL
    protocols = {"after_recall": AfterRecallHook}
    chaining = Chaining.CHAIN
    subject_field = "recall"

    def judge(self, call: AfterRecallCall, value: Any, ctx: PipelineContext, checks: Checks) -> AfterRecallOutcome:
        patch = returned(value, "after_recall", RecallPatch)
        if patch is not None and (size := json_size(patch.memory.model_dump(mode="json"))) > MAX_ENRICHMENT_BYTES:
            raise rejected(f"after_recall memory is {size} bytes of JSON; the limit is {MAX_ENRICHMENT_BYTES}")
        return AfterRecallOutcome(patch=patch, decision=self.success(call.hook, REASON_MODIFIED if patch else None))

    def fold(self, subject: RecallView, outcome: AfterRecallOutcome) -> Fold:
        if outcome.patch is None:
            return Fold(subject)
        return Fold(subject.model_copy(update={"memory": outcome.patch.memory}))


# --------------------------------------------------------------------------------------------------
# before_fallback: what the fallback model is asked, or stop
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class BeforeFallbackHook(Protocol):
    """before_fallback: the primary model failed (unavailable after its retries) in planning or synthesis
    and a fallback model will be called. ``fallback`` is a copy of what it will be asked: return a changed
    copy to replace that (redacting it changes neither the record nor what the run remembers), ``Stop`` to
    end the run with your text instead, or ``None``. Never called for hook errors. A failure ends the run
    with ``ExtensionError``."""

    name: str

    def before_fallback(self, ctx: PipelineContext, fallback: FallbackRequest) -> FallbackRequest | Stop | None: ...


class BeforeFallbackCall(HookCall):
    fallback: FallbackRequest


class BeforeFallbackOutcome(HookOutcome):
    request: FallbackRequest | None = None
    stop: Stop | None = None


class BeforeFallbackSpec(StageSpec[BeforeFallbackCall, BeforeFallbackOutcome]):
    """Replacements apply in order (what describes the handoff is kept whatever a hook returns); a stop
    ends the run."""

    stage = Stage.BEFORE_FALLBACK
    protocols = {"before_fallback": BeforeFallbackHook}
    chaining = Chaining.GATE
    subject_field = "fallback"

    def judge(
        self, call: BeforeFallbackCall, value: Any, ctx: PipelineContext, checks: Checks
    ) -> BeforeFallbackOutcome:
        value = returned(value, "before_fallback", FallbackRequest, Stop)
        if isinstance(value, Stop):
            return BeforeFallbackOutcome(stop=value, decision=self.stopped(call.hook, value))
        if value is None:
            return BeforeFallbackOutcome(decision=self.success(call.hook))
        if not value.ask.strip():
            raise rejected("before_fallback replaced the ask with empty text")
        kept = call.fallback.model_dump(include={"stage", "phase", "reason", "primary_model", "fallback_model"})
        request = value.model_copy(update=kept)
        return BeforeFallbackOutcome(request=request, decision=self.success(call.hook, REASON_MODIFIED))

    def fold(self, subject: FallbackRequest, outcome: BeforeFallbackOutcome) -> Fold:
        if outcome.stop is not None:
            return Fold.end(subject)
        return Fold(outcome.request or subject)


# --------------------------------------------------------------------------------------------------
# on_error and on_finish: observe the run's end
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class OnErrorHook(Protocol):
    """on_error: observe an error and its origin (extension, model, memory, confirmation, fallback,
    formatter, event, config, budget, tool, harness; or cancelled). The error that ends a run is observed
    before on_finish; errors the run recovered from (``error.recovered``) are observed too. A failure is a
    diagnostic; it never replaces the original error and never stops later observers."""

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

    own_policy = False
    finalizer = True


class OnErrorSpec(_FinalizerSpec[OnErrorCall]):
    stage = Stage.ON_ERROR
    protocols = {"on_error": OnErrorHook}
    subject_field = "error"


class OnFinishSpec(_FinalizerSpec[OnFinishCall]):
    stage = Stage.ON_FINISH
    protocols = {"on_finish": OnFinishHook}
    subject_field = "outcome"


BEFORE_RUN = BeforeRunSpec()
AFTER_RECALL = AfterRecallSpec()
BEFORE_FALLBACK = BeforeFallbackSpec()
ON_ERROR = OnErrorSpec()
ON_FINISH = OnFinishSpec()
