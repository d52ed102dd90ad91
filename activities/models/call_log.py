"""The model calls of one planner or synthesizer invocation (:class:`ModelCallLog`): what each call cost,
the token budget left, and the errors that carry the calls. Kept apart from the calls themselves
(``activities.models.calls``), so the lifecycle's activities load without the ``openai`` package."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.decisions import TOKEN_BUDGET_EXCEEDED
from workflows.models._model_calls import ModelCall, ModelUsage
from workflows.models._plans import ModelTurn

from ..heartbeat import report_progress

# The heartbeat detail under which an activity attempt reports its model calls to the next attempt.
PROGRESS_KEY = "model_calls"
# Who calls: the planner, the synthesizer, or a memory summarizer (``activities.models.memory``).
Stage = Literal["planning", "synthesis", "memory"]


@dataclass
class ModelCallLog:
    """The model calls of one planner or synthesizer invocation, and the tokens it may still spend.

    One per activity invocation — never shared between concurrent invocations — so what it holds is
    exactly this invocation's calls. ``max_tokens_remaining`` is the request's budget left when the
    invocation started (``None``: no budget); calls made here count against it.
    """

    max_tokens_remaining: int | None = None
    calls: list[ModelCall] = field(default_factory=list)
    # The model's turn a planner made its plan from (what the request replays to the model later).
    turn: ModelTurn | None = None

    @classmethod
    def resumed(cls, max_tokens_remaining: int | None = None) -> ModelCallLog:
        """The log of this activity attempt, starting with the calls its earlier attempts made (they
        reported them in their heartbeats): a retried call is recorded once per attempt, and what the
        earlier attempts spent counts against the budget."""
        log = cls(max_tokens_remaining=max_tokens_remaining)
        details = activity.info().heartbeat_details if activity.in_activity() else ()
        earlier = details[0].get(PROGRESS_KEY) if details and isinstance(details[0], dict) else None
        for call in earlier if isinstance(earlier, list) else []:
            try:
                log.calls.append(ModelCall.model_validate(call))
            except ValueError:
                pass  # not a call this log wrote
        return log

    def add(self, call: ModelCall) -> None:
        """Keep ``call``, and report the log in the activity's heartbeat so a next attempt keeps it too."""
        self.calls.append(call)
        report_progress({PROGRESS_KEY: [c.model_dump(mode="json") for c in self.calls]})

    @property
    def tokens_used(self) -> int:
        return sum(call.tokens for call in self.calls)

    @property
    def remaining(self) -> int | None:
        return None if self.max_tokens_remaining is None else self.max_tokens_remaining - self.tokens_used

    def usage(self) -> ModelUsage:
        return ModelUsage.of(self.calls)

    def error(
        self,
        text: str,
        type: str,
        /,
        *,
        non_retryable: bool = True,
        next_retry_delay: timedelta | None = None,
        **details: Any,
    ) -> ApplicationError:
        """An activity error whose details carry this invocation's calls so far."""
        return ApplicationError(
            text,
            {**details, "model_calls": [call.model_dump(mode="json") for call in self.calls]},
            type=type,
            non_retryable=non_retryable,
            next_retry_delay=next_retry_delay,
        )

    def check_budget(self, stage: Stage) -> int | None:
        """The tokens left, or ``TokenBudgetExceeded`` (non-retryable) when none are."""
        remaining = self.remaining
        if remaining is not None and remaining <= 0:
            raise self.error(
                f"the request's model token budget is spent ({self.tokens_used} used here of "
                f"{self.max_tokens_remaining} left); no {stage} call was made",
                TOKEN_BUDGET_EXCEEDED,
                max_tokens_remaining=self.max_tokens_remaining,
                tokens_used=self.tokens_used,
            )
        return remaining
