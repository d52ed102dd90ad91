"""The answer stages: after_synthesis (rewrite the synthesized answer, chained), after_answer (rewrite the
final answer, or stop) and before_remember (replace what the run remembers, or skip it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..decisions import REASON_ACCEPTED, REASON_MEMORY_REPLACED, REASON_MEMORY_SKIPPED, REASON_REWRITTEN
from ..models import AnswerView, DecisionAction, HookCall, HookOutcome, MemoryCandidate, SkipMemory, Stage, Stop
from ._base import Chaining, Checks, Fold, StageSpec, rejected, returned

if TYPE_CHECKING:
    from hooks.contracts import PipelineContext

__all__ = ["AfterAnswerHook", "AfterSynthesisHook", "BeforeRememberHook"]

# --------------------------------------------------------------------------------------------------
# after_synthesis: rewrite the answer, chained
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class AfterSynthesisHook(Protocol):
    """after_synthesis: return the response, possibly rewritten (guardrails, redaction, write-back).
    Hooks chain in registration order; an error or a non-``str`` result keeps the previous text."""

    name: str

    def after_synthesis(self, ctx: PipelineContext, response: str) -> str: ...


class AfterSynthesisCall(HookCall):
    response: str


class AfterSynthesisOutcome(HookOutcome):
    response: str


class AfterSynthesisSpec(StageSpec[AfterSynthesisCall, AfterSynthesisOutcome]):
    stage = Stage.AFTER_SYNTHESIS
    protocols = {"after_synthesis": AfterSynthesisHook}
    chaining = Chaining.CHAIN
    subject_field = "response"
    echo = "response"

    def judge(
        self, call: AfterSynthesisCall, value: Any, ctx: PipelineContext, checks: Checks
    ) -> AfterSynthesisOutcome:
        response = returned(value, "after_synthesis", str, none=False)
        return AfterSynthesisOutcome(response=response, decision=self.success(call.hook))

    def fold(self, subject: str, outcome: AfterSynthesisOutcome) -> Fold:
        return Fold(outcome.response)


# --------------------------------------------------------------------------------------------------
# after_answer: rewrite the final answer, or stop
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class AfterAnswerHook(Protocol):
    """after_answer: once a non-empty final answer exists (synthesized, short-circuited or best-effort:
    ``answer.best_effort``). Return new text, ``Stop``, or ``None``. Returning an empty answer is an
    ``ExtensionError`` (the hook failed), not a request to retry."""

    name: str

    def after_answer(self, ctx: PipelineContext, answer: AnswerView) -> str | Stop | None: ...


class AfterAnswerCall(HookCall):
    answer: AnswerView


class AfterAnswerOutcome(HookOutcome):
    text: str
    stop: Stop | None = None


class AfterAnswerSpec(StageSpec[AfterAnswerCall, AfterAnswerOutcome]):
    stage = Stage.AFTER_ANSWER
    protocols = {"after_answer": AfterAnswerHook}
    chaining = Chaining.CHAIN
    subject_field = "answer"
    echo = "text"

    def echoed(self, call: AfterAnswerCall) -> str:
        return call.answer.text

    def judge(self, call: AfterAnswerCall, value: Any, ctx: PipelineContext, checks: Checks) -> AfterAnswerOutcome:
        value = returned(value, "after_answer", str, Stop)
        stop = value if isinstance(value, Stop) else None
        text: str = call.answer.text if value is None else value.text if isinstance(value, Stop) else value
        if not text.strip():
            raise rejected("after_answer produced an empty answer")
        if stop:
            decision = self.stopped(call.hook, stop)
        else:
            decision = self.success(call.hook, REASON_ACCEPTED if text == call.answer.text else REASON_REWRITTEN)
        return AfterAnswerOutcome(text=text, stop=stop, decision=decision)

    def fold(self, subject: AnswerView, outcome: AfterAnswerOutcome) -> Fold:
        if outcome.stop is not None:
            return Fold.end(subject)
        return Fold(subject.model_copy(update={"text": outcome.text}))


# --------------------------------------------------------------------------------------------------
# before_remember: replace what the run remembers, or skip it
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class BeforeRememberHook(Protocol):
    """before_remember: a completed run is about to be remembered. Return a replacement
    ``MemoryCandidate``, ``SkipMemory`` (final: later hooks cannot undo it), or ``None``."""

    name: str

    def before_remember(
        self, ctx: PipelineContext, candidate: MemoryCandidate
    ) -> MemoryCandidate | SkipMemory | None: ...


class BeforeRememberCall(HookCall):
    candidate: MemoryCandidate


class BeforeRememberOutcome(HookOutcome):
    candidate: MemoryCandidate
    skip: SkipMemory | None = None


class BeforeRememberSpec(StageSpec[BeforeRememberCall, BeforeRememberOutcome]):
    stage = Stage.BEFORE_REMEMBER
    protocols = {"before_remember": BeforeRememberHook}
    chaining = Chaining.GATE
    subject_field = "candidate"
    echo = "candidate"

    def judge(
        self, call: BeforeRememberCall, value: Any, ctx: PipelineContext, checks: Checks
    ) -> BeforeRememberOutcome:
        value = returned(value, "before_remember", MemoryCandidate, SkipMemory)
        if isinstance(value, SkipMemory):
            decision = self.success(call.hook, REASON_MEMORY_SKIPPED, DecisionAction.SKIP)
            return BeforeRememberOutcome(candidate=call.candidate, skip=value, decision=decision)
        decision = self.success(call.hook, REASON_MEMORY_REPLACED if value is not None else REASON_ACCEPTED)
        return BeforeRememberOutcome(candidate=value or call.candidate, decision=decision)

    def fold(self, subject: MemoryCandidate, outcome: BeforeRememberOutcome) -> Fold:
        if outcome.skip is not None:
            return Fold.end(subject)
        return Fold(outcome.candidate)


AFTER_SYNTHESIS = AfterSynthesisSpec()
AFTER_ANSWER = AfterAnswerSpec()
BEFORE_REMEMBER = BeforeRememberSpec()
