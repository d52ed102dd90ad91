"""The request's model token budget, as the model calls made for a request outside its planner and
synthesizer see it: a prompt hook's evaluator, a memory summarizer.

The activity that may make such calls — every hook invocation, the ``remember`` activity — opens a
:class:`ModelBudget` with what the request had left when the workflow scheduled it (:func:`metered`).
Each call asks it first (:meth:`ModelBudget.admit`): a call whose prompt — estimated from above, so an
estimate that fits does fit — leaves no room for an answer within what is left is refused before it is
sent, with the planner's error (``TokenBudgetExceeded``, non-retryable) and a record of the call that was
never sent; one that fits is sent with its answer capped by the room left. Every call made, answered or
failed, is recorded (:meth:`ModelBudget.spend`); the activity hands the calls to the workflow, which adds
them to the record's ``model_calls`` — where an operator reads them, and from which every later call of
the request counts what is left.

Outside such an activity (a dry run, a detached effect, a policy replay) nothing is metered: a call is
neither refused nor recorded. Two hooks invoked at once (the before_tool hooks of concurrent steps) are
each given what was left when they were scheduled, so together they may spend up to twice it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

from temporalio.exceptions import ApplicationError

from workflows.decisions import MODEL_REQUEST_ERROR, MODEL_UNAVAILABLE, TOKEN_BUDGET_EXCEEDED
from workflows.masking import masked_preview
from workflows.models import MAX_MODEL_PREVIEW_CHARS, ModelCall, ModelText, estimate_tokens

__all__ = ["MeteredCall", "ModelBudget", "TokenBudgetExceeded", "current", "metered"]

Kind = Literal["hook", "memory"]
_CURRENT: ContextVar[ModelBudget | None] = ContextVar("request_model_budget", default=None)


class TokenBudgetExceeded(ApplicationError):
    """A model call refused before it was sent: what the request has left of its model token budget cannot
    hold it. The planner's calls fail with the same type (``TokenBudgetExceeded``), non-retryable."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message, details, type=TOKEN_BUDGET_EXCEEDED, non_retryable=True)


def prompt_digest(messages: Sequence[Mapping[str, Any]]) -> ModelText:
    """The messages sent, by digest; the preview is the last message, masked."""
    exact = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, default=str)
    last = messages[-1].get("content") if messages else None
    return ModelText.of(exact, masked_preview(last if isinstance(last, str) else exact, MAX_MODEL_PREVIEW_CHARS))


@dataclass
class ModelBudget:
    """The model calls of one activity and what they may spend (see the module docstring).

    Attributes:
        tokens_left: The request's budget left when the activity was scheduled (None: no budget).
        hook: The hook whose invocation this is (None for the request's own activities).
        calls: The calls made here so far, in order, refused ones included.
    """

    tokens_left: int | None
    hook: str | None = None
    calls: list[ModelCall] = field(default_factory=list)

    @property
    def left(self) -> int | None:
        """What the request has left now: ``tokens_left`` less what the calls made here spent."""
        return None if self.tokens_left is None else self.tokens_left - sum(call.tokens for call in self.calls)

    def admit(self, kind: Kind, model: str, messages: Sequence[Mapping[str, Any]], max_tokens: int) -> int:
        """The answer's cap for a call of ``messages``: ``max_tokens``, or less when less is left after its
        prompt. Raises :class:`TokenBudgetExceeded` — the call recorded as never sent — when its prompt
        leaves no room for an answer."""
        left = self.left
        if left is None:
            return max_tokens
        prompt = estimate_tokens(json.dumps(list(messages), ensure_ascii=False, default=str))
        room = left - prompt
        if room > 0:
            return min(max_tokens, room)
        text = (
            f"the request's model token budget cannot hold this {kind} call to {model}: about {prompt} prompt "
            f"tokens, {max(left, 0)} left; no request was sent"
        )
        self.spend(
            ModelCall(
                stage=kind,
                model=model,
                started_at=datetime.now(UTC),
                error_type=TOKEN_BUDGET_EXCEEDED,
                error_message=ModelCall.clip_error(text),
                prompt=prompt_digest(messages),
            )
        )
        raise TokenBudgetExceeded(text, tokens_left=left, prompt_tokens=prompt, model=model)

    def spend(self, *calls: ModelCall) -> None:
        """Record calls made here (each named by this budget's hook unless it names one)."""
        for call in calls:
            if call.hook is None and self.hook is not None:
                call.hook = self.hook
            self.calls.append(call)

    def dumped(self) -> list[dict[str, Any]]:
        """The calls as an activity's error details carry them."""
        return [call.model_dump(mode="json") for call in self.calls]


def current() -> ModelBudget | None:
    """The budget of the activity running now (None outside a metered activity)."""
    return _CURRENT.get()


@contextmanager
def metered(tokens_left: int | None, *, hook: str | None = None) -> Iterator[ModelBudget]:
    """Meter the model calls made inside the block against ``tokens_left``."""
    budget = ModelBudget(tokens_left=tokens_left, hook=hook)
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)


class MeteredCall:
    """One Chat Completions call made over plain HTTP (a prompt hook's evaluator), metered: :meth:`admit`
    before it is sent; the request inside ``with``; :meth:`answered` with the provider's JSON body. The
    call is recorded when the block ends, whatever its outcome (an error ending the block records it
    failed: a status it answered, else the error's type). Without a budget it only sends."""

    def __init__(self, kind: Kind, model: str, messages: Sequence[Mapping[str, Any]], max_tokens: int) -> None:
        self.budget = current()
        self.kind: Kind = kind
        self.max_tokens = max_tokens
        self.status: int | None = None
        self._call = ModelCall(stage=kind, model=model)
        self._messages = messages
        self._started = 0.0

    def admit(self) -> int:
        """The answer's cap (``max_tokens`` as sent); raises :class:`TokenBudgetExceeded` (see there)."""
        if self.budget is not None:
            self.max_tokens = self.budget.admit(self.kind, self._call.model, self._messages, self.max_tokens)
        return self.max_tokens

    def answered(self, body: Any) -> None:
        """Take what the provider's answer says of the call: its id, model, finish reason and usage."""
        if not isinstance(body, dict):
            return
        call = self._call
        call.response_id = _text(body.get("id"))
        call.response_model = _text(body.get("model"))
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            call.finish_reason = _text(choices[0].get("finish_reason"))
        usage = body.get("usage")
        if isinstance(usage, dict):
            call.prompt_tokens = _count(usage.get("prompt_tokens"))
            call.completion_tokens = _count(usage.get("completion_tokens"))
            call.total_tokens = _count(usage.get("total_tokens"))

    def __enter__(self) -> MeteredCall:
        self._call.started_at = datetime.now(UTC)
        self._call.prompt = prompt_digest(self._messages)
        self._started = time.monotonic()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        call = self._call
        call.latency_ms = round((time.monotonic() - self._started) * 1000.0, 3)
        call.status = self.status if self.status != 200 else None
        if error is not None:
            if self.status is not None and self.status != 200:
                retryable = self.status in (408, 409, 429) or self.status >= 500
                call.error_type = MODEL_UNAVAILABLE if retryable else MODEL_REQUEST_ERROR
            elif not isinstance(error, Exception):  # cancelled (the hook's timeout), or stopped
                call.error_type = "Cancelled"
            else:
                call.error_type = getattr(error, "reason", None) or type(error).__name__
            call.error_message = ModelCall.clip_error(str(error) or type(error).__name__)
        if self.budget is not None:
            self.budget.spend(call)


def _text(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    """A token count as the provider reported it; None for anything that is not a sane count."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return min(value, 1 << 40)
