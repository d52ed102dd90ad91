"""What the record keeps of each call the request made to a model: its planner's and synthesizer's, and
those made for it by a hook (a prompt hook's evaluator, a memory hook's model) or by its conversation
memory's summarizer — every one counted against the request's model token budget.

Invariants: a prompt or a response is never kept whole — only its sha256, its size and a preview of at
most ``MAX_MODEL_PREVIEW_CHARS`` characters (the caller masks secrets in the preview before it gets
here: this package imports nothing but pydantic). Error texts are clipped to ``MAX_MODEL_ERROR_CHARS``.
Failed calls are kept too, with their error type, so the record accounts for every call that may have
been billed.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal, Self

from pydantic import BaseModel, Field

from ._common import TextDigest

__all__ = [
    "ANSWER_TOPIC",
    "MAX_MODEL_ERROR_CHARS",
    "MAX_MODEL_PREVIEW_CHARS",
    "AnswerChunk",
    "ModelCall",
    "ModelText",
    "ModelUsage",
]

MAX_MODEL_PREVIEW_CHARS = 200
MAX_MODEL_ERROR_CHARS = 500


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ModelText(TextDigest):
    """A prompt or a response, by digest, with a preview of at most ``MAX_MODEL_PREVIEW_CHARS``."""

    preview: str = Field(default="", max_length=MAX_MODEL_PREVIEW_CHARS)

    @classmethod
    def of(cls, text: str, preview: str = "") -> Self:
        """``preview`` is what may be shown of ``text`` (already masked by the caller), clipped here."""
        return super().of(text, _clip(preview, MAX_MODEL_PREVIEW_CHARS))


class ModelCall(BaseModel):
    """One Chat Completions call, succeeded or failed.

    ``stage`` says who made it: the planner (``planning``), the synthesizer (``synthesis``), a hook's
    model (``hook``: a prompt hook's evaluator) or a memory summarizer (``memory``: the conversation
    memory's summary, a memory hook's summaries); ``hook`` names the hook whose invocation made it.
    ``turn`` 1 is the stage's own call; a planner's repair turn (invalid tool arguments sent back to the
    model) is turn 2. Token counts are the provider's, ``None`` when it reported none.
    """

    stage: Literal["planning", "synthesis", "hook", "memory"]
    hook: str | None = Field(default=None, exclude_if=lambda hook: hook is None)
    phase: int | None = None  # the planning phase; None for synthesis
    turn: int = 1
    model: str
    provider: str = "openai"
    route: Literal["primary", "fallback"] = "primary"  # the fallback answers once a failing primary hands over
    streamed: bool = False
    started_at: datetime | None = None
    latency_ms: float = 0.0
    response_id: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    tool_calls: int = 0
    status: int | None = None  # the HTTP status of a failed call, when the provider answered one
    # ModelUnavailable, ModelRequestError, ModelRefusal, EmptyCompletion, PromptBudgetExceeded and
    # TokenBudgetExceeded (both never sent), ...
    error_type: str | None = None
    error_message: str | None = Field(default=None, max_length=MAX_MODEL_ERROR_CHARS)
    prompt: ModelText | None = None
    response: ModelText | None = None

    @property
    def tokens(self) -> int:
        """Tokens this call spent, as far as the provider said: the total, else prompt + completion."""
        if self.total_tokens is not None:
            return self.total_tokens
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    @staticmethod
    def clip_error(text: str) -> str:
        return _clip(text, MAX_MODEL_ERROR_CHARS)


class ModelUsage(BaseModel):
    """A sum over model calls: what a request (or one stage of it) spent."""

    calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, calls: Iterable[ModelCall]) -> ModelUsage:
        return cls().add(calls)

    def add(self, calls: Iterable[ModelCall]) -> ModelUsage:
        """A new summary with ``calls`` added to this one."""
        usage = self.model_copy()
        for call in calls:
            usage.calls += 1
            usage.failed_calls += call.error_type is not None
            usage.prompt_tokens += call.prompt_tokens or 0
            usage.completion_tokens += call.completion_tokens or 0
            usage.total_tokens += call.tokens
        return usage


# The topic of a request's answer stream (the workflow's durable stream, read by clients).
ANSWER_TOPIC = "answer"


class AnswerChunk(BaseModel):
    """One piece of a streamed answer: the model's text as it is written, or — ``final`` — the whole
    answer after the after_synthesis and after_answer hooks, published last.

    The text is written by a model call's activity — a planning turn that answers in text, or a
    synthesis — named by ``activity`` (its type and its id in the request's history, ``plan#7``) and
    ``attempt`` (the activity's attempt: a retried activity writes again from its start). A chunk whose
    activity or attempt is not the previous chunk's starts the text over. A ``retracted`` chunk (no
    text) withdraws what its activity wrote so far: that planning turn went on to call tools (its text was
    a preamble, not the answer), or its call failed. The workflow withdraws a streamed text answer the
    same way (``activity`` empty) when an after_planning hook turned it into a plan to run."""

    text: str
    attempt: int = 1
    final: bool = False
    activity: str = ""
    retracted: bool = False
