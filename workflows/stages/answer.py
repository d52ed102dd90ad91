"""The answer stages: after_synthesis (rewrite the synthesized answer, chained), after_answer (rewrite the
final answer, or stop) and before_remember (replace what the run remembers, or skip it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import JsonValue

from ..decisions import REASON_ACCEPTED, REASON_MEMORY_REPLACED, REASON_MEMORY_SKIPPED, REASON_REWRITTEN
from ..models import AnswerView, DecisionAction, HookCall, HookOutcome, MemoryCandidate, SkipMemory, Stage, Stop
from ._base import Chaining, Checks, Fold, StageSpec, rejected, returned
from .run import OnFinishCall

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


# --------------------------------------------------------------------------------------------------
# the stages after a text answer, built before the answer exists
# --------------------------------------------------------------------------------------------------

# What the calls of the stages after a planning activity's text answer are built on before the planner
# answers (``answered``): never shown to a hook, never recorded.
STAND_IN_ANSWER = "(the planner's text answer)"


def answered(
    call: HookCall,
    answer: str,
    answered_by: Literal["primary", "fallback"],
    planner_tokens: int,
    enrichments: Mapping[str, JsonValue],
) -> HookCall:
    """``call``, built on :data:`STAND_IN_ANSWER` before the planner answered, as the workflow builds it once
    the answer is in: ``answer`` in the stand-in's place (after_synthesis's subject, after_answer's text and
    the model that answered, on_finish's response and the text a cache may store), the request's token
    budget, if it has one, less what the planner's calls spent, and the enrichments the plan was made with
    (those the before_planning hooks left, where the planning activity ran them too). A call that holds no
    answer (after_execution's) gets the budget and the enrichments alone."""
    update_view: dict[str, Any] = {"enrichments": dict(enrichments)}
    if call.view.model_tokens_left is not None:
        update_view["model_tokens_left"] = call.view.model_tokens_left - planner_tokens
    update: dict[str, Any] = {"view": call.view.model_copy(update=update_view)}
    if isinstance(call, AfterSynthesisCall):
        update["response"] = answer
    elif isinstance(call, AfterAnswerCall):
        update["answer"] = call.answer.model_copy(update={"text": answer, "answered_by": answered_by})
    elif isinstance(call, OnFinishCall):
        cache = call.outcome.cache
        if cache.response is not None:
            cache = cache.model_copy(update={"response": answer})
        update["outcome"] = call.outcome.model_copy(update={"response": answer, "cache": cache})
    return call.model_copy(update=update)
