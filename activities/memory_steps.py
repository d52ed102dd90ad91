"""The conversation-memory activities: recall a conversation's memory for a run, and remember a completed
run's exchange (folding older exchanges into a capped summary)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from temporalio import activity
from temporalio.exceptions import ApplicationError

from hooks.model_budget import metered
from workflows import decisions
from workflows.models import MemoryExchange, MemoryOutcome, RecalledMemory, RecallInput, RememberInput, estimate_tokens

from .heartbeat import heartbeating
from .memory import (
    KEPT_EXCHANGES,
    SummarizingMemory,
    capped_summary,
    fold_heuristically,
    summary_cap_tokens,
    summary_prompt,
)

if TYPE_CHECKING:
    from .lifecycle import LifecycleActivities

RECALLED_EXCHANGES = KEPT_EXCHANGES  # the latest exchanges of a conversation a run recalls (besides its summary)


class MemorySteps:
    """The memory activities of a worker (see the module docstring).

    Args:
        owner: The worker's activities: its ``memory`` (None: no conversation memory), its
            ``memory_summarizer`` and ``memory_context_window``, and how results are bounded.
    """

    def __init__(self, owner: LifecycleActivities) -> None:
        self._owner = owner

    def activities(self) -> list[Any]:
        return [self.recall_memory, self.remember]

    @activity.defn(name="recall_memory")
    @heartbeating
    async def recall_memory(self, input: RecallInput) -> RecalledMemory:
        """Load a conversation's memory for a run: its summary (where the memory keeps one) and its latest
        exchanges, oldest first."""
        if self._owner.memory is None:
            raise ApplicationError("no conversation memory is configured", type="MemoryUnavailable", non_retryable=True)
        recall: Callable[[str], Awaitable[RecalledMemory]] | None = getattr(self._owner.memory, "recall", None)
        if recall is not None:
            memory = await recall(input.conversation_id)
        else:
            exchanges = await self._owner.memory.recent(input.conversation_id, RECALLED_EXCHANGES)
            memory = RecalledMemory(exchanges=[MemoryExchange(request=e.request, answer=e.answer) for e in exchanges])
        return self._owner.bounded_result(memory, "recall_memory")

    @activity.defn(name="remember")
    @heartbeating
    async def remember(self, input: RememberInput) -> MemoryOutcome:
        """Save a completed run's memory candidate to the conversation memory, then keep the memory within
        its limits: the latest three exchanges, and a summary of the older ones capped at an eighth of the
        model's window. On the normal route the exchanges leaving the recent history are folded into the
        summary (by the memory summarizer when one is configured, a bounded heuristic otherwise); after a
        handoff to the fallback model the previous summary is kept as it is and the older exchanges are
        dropped, without asking a model to summarize. A summarizer that fails is replaced by the heuristic
        (the limits still hold) and the failure raised as a ``MemoryError`` once the memory is saved: the
        request keeps its answer and records the error, it never runs the turn again. The summarizer's
        calls count against the request's model token budget (``hooks.model_budget``) and come back with
        the outcome for the record; one the budget cannot hold is refused before it is sent
        (``TokenBudgetExceeded``) and the heuristic's summary is kept — no error: the request spent what it
        was allowed."""
        if self._owner.memory is None:
            raise ApplicationError("no conversation memory is configured", type="MemoryUnavailable", non_retryable=True)
        conversation = input.candidate.conversation_id
        await self._owner.memory.save(input.candidate, request_id=input.request_id)
        saved = MemoryOutcome(action="saved", conversation_id=conversation)
        older = getattr(self._owner.memory, "older", None)
        if older is None:  # a memory that keeps no summary: its own limits
            return saved
        memory = cast(SummarizingMemory, self._owner.memory)
        evicted = await memory.older(conversation, KEPT_EXCHANGES)
        if not evicted:
            return saved
        cap = summary_cap_tokens(self._owner.memory_context_window)
        previous = await memory.summary(conversation)
        exchanges = [candidate for _, candidate in evicted]
        failure = None
        with metered(input.model_tokens_left) as budget:
            if input.handled_by == "fallback":
                summary, how = capped_summary(previous, cap), "kept"
            elif self._owner.memory_summarizer is not None:
                try:
                    folded = await self._owner.memory_summarizer.complete(summary_prompt(previous, exchanges, cap))
                    summary, how = capped_summary(folded, cap), "model"
                except Exception as err:  # noqa: BLE001 - any summarizer failure is recovered the same way
                    # A summary the request's budget cannot pay for is no failure: the heuristic's stands.
                    if getattr(err, "type", None) != decisions.TOKEN_BUDGET_EXCEEDED:
                        failure = f"the memory summarizer failed: {type(err).__name__}: {err}"[:500]
                    summary, how = fold_heuristically(previous, exchanges, cap), "heuristic"
            else:
                summary, how = fold_heuristically(previous, exchanges, cap), "heuristic"
        await memory.compact(conversation, summary, [request_id for request_id, _ in evicted])
        if failure is not None:
            raise ApplicationError(
                failure,
                {"conversation_id": conversation, "model_calls": budget.dumped()},
                type="MemoryError",
                non_retryable=True,
            )
        return saved.model_copy(
            update={
                "evicted": len(evicted),
                "summary": how,
                "summary_tokens": estimate_tokens(summary),
                "model_calls": budget.calls,
            }
        )
