"""A request's conversation memory, as the workflow runs it: recall before planning (then after_recall
hooks on the view the run plans with) and remember after the answer (before_remember hooks first).

Workflow code: memory is loaded and saved by the ``recall_memory`` and ``remember`` activities. A memory
that cannot be loaded or saved is an error the run recovers from — it plans without the memory, or keeps
its completed answer — recorded as a ``memory`` diagnostic.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import stages
    from .invocation import Ahead, HookRunner, error_text, raise_if_cancelled
    from .listing import RECALLING, REMEMBERING, StageListing
    from .models import (
        ENRICHMENT_CONVERSATION_HISTORY,
        Diagnostic,
        HookEntry,
        MemoryCandidate,
        MemoryOutcome,
        RecalledMemory,
        RecallInput,
        RecallOutcome,
        RecallView,
        RememberInput,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .stages import STAGES, Fold, Stage
    from .support import activity_error_details, model_calls_in


class MemoryStages:
    """Recall and remember for one request (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing, hooks: HookRunner) -> None:
        self._state, self._scheduler, self._listing, self._hooks = state, scheduler, listing, hooks

    def recalls(self) -> str | None:
        """The conversation whose memory this run loads before planning, if it loads one."""
        state = self._state
        conversation = state.conversation_id
        if state.manifest.memory and conversation:
            return conversation
        return None

    async def recall(self) -> None:
        """Load the conversation's memory, let after_recall hooks change the view of it this run plans with,
        and put that view ahead of the conversation history the planner reads."""
        state = self._state
        conversation = self.recalls()
        if conversation is None:
            return
        self._listing.enter(RECALLING)
        outcome = RecallOutcome(conversation_id=conversation)
        state.record.recall = outcome
        try:
            memory = await self._scheduler.bookkeeping(
                "recall_memory",
                RecallInput(request_id=state.request_id, conversation_id=conversation),
                result_type=RecalledMemory,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"recall · {conversation}",
            )
        except (ActivityError, ApplicationError) as err:
            outcome.error = self._recover(err, conversation)
            return
        outcome.exchanges, outcome.summary_chars = len(memory.exchanges), len(memory.summary)

        def on_outcome(hook: HookEntry, result: Any, before: RecallView, folded: Fold) -> None:
            if folded.subject != before:
                outcome.changed_by.append(hook.name)

        view = await self._hooks.stage(
            Stage.AFTER_RECALL,
            RecallView(conversation_id=conversation, memory=memory),
            on_outcome,
            ahead=[Ahead(Stage.BEFORE_PLANNING, with_recalled_memory(state.enrichments, memory))],
        )
        state.enrichments = with_recalled_memory(state.enrichments, view.memory)

    async def remember(self, answer: str) -> None:
        """Offer the exchange to before_remember hooks, then save it to conversation memory. A best-effort
        answer (the run hit its phase cap) is not remembered."""
        state = self._state
        if not state.manifest.memory:
            return
        conversation = state.conversation_id or state.request_id
        if state.record.phase_cap_reached:
            state.record.memory = MemoryOutcome(
                action="skipped", conversation_id=conversation, reason="a best-effort answer (the phase cap was hit)"
            )
            return
        self._listing.enter(REMEMBERING)
        candidate = MemoryCandidate(conversation_id=conversation, request=state.ask, answer=answer, facts=state.facts)
        replaced_by: list[str] = []

        def on_outcome(
            hook: HookEntry, outcome: stages.answer.BeforeRememberOutcome, before: MemoryCandidate, folded: Fold
        ) -> None:
            if outcome.skip is not None:
                state.record.memory = MemoryOutcome(
                    action="skipped", conversation_id=before.conversation_id, by=hook.name, reason=outcome.skip.reason
                )
            elif folded.subject != before:
                replaced_by.append(hook.name)

        stage = await self._hooks.run(STAGES[Stage.BEFORE_REMEMBER], candidate, on_outcome)
        if stage.ended:
            return
        candidate = stage.subject
        try:
            saved = await self._scheduler.activity(
                "remember",
                RememberInput(
                    request_id=state.request_id,
                    workflow_id=state.record.workflow_id,
                    candidate=candidate,
                    handled_by="fallback" if state.route == "fallback" else "primary",
                    model_tokens_left=state.model_tokens_left(),
                ),
                result_type=MemoryOutcome,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"remember · {candidate.conversation_id}",
            )
        except (ActivityError, ApplicationError) as err:
            error = self._recover(err, candidate.conversation_id)
            if isinstance(err, ActivityError):  # the summarizer's calls, made before the memory failed
                state.record.model_calls.extend(model_calls_in(activity_error_details(err).get("model_calls")))
            state.record.diagnostics.append(
                Diagnostic(extension="(memory)", phase="remember", error=error, error_type="MemoryError")
            )
            return
        state.record.model_calls.extend(saved.model_calls)
        state.record.memory = saved.model_copy(
            update={"by": replaced_by[-1] if replaced_by else None, "model_calls": []}
        )

    def _recover(self, err: ActivityError | ApplicationError, conversation: str) -> str:
        """A memory that could not be loaded or saved: the run goes on without it (a cancellation is raised
        again), keeping the failure as a ``memory`` error on_error observes. Returns the failure's text."""
        raise_if_cancelled(err)
        error = error_text(err)
        self._state.recover("memory", "MemoryError", error, {"conversation_id": conversation})
        return error


def with_recalled_memory(enrichments: dict[str, Any], memory: RecalledMemory) -> dict[str, Any]:
    """``enrichments`` with the recalled memory ahead of any conversation history already there: the
    summary of older exchanges first, then the latest exchanges, oldest first."""
    if memory.empty:
        return enrichments
    lines = [f"(earlier in this conversation) {memory.summary}"] if memory.summary else []
    lines += [f"user: {e.request}\nassistant: {e.answer}" for e in memory.exchanges]
    existing = enrichments.get(ENRICHMENT_CONVERSATION_HISTORY)
    if isinstance(existing, str) and existing:
        lines.append(existing)
    return {**enrichments, ENRICHMENT_CONVERSATION_HISTORY: "\n".join(lines)}
