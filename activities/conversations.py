"""The side effects of the conversation entry path: a request started directly with
``metadata.conversation_id`` claims its turn by signal-with-start of the conversation, and the
conversation checks whether a granted request that never released its turn is still running."""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from workflows import search_attributes as sa
from workflows.conversation import CLAIM_SIGNAL, CONVERSATION_WORKFLOW_TYPE
from workflows.converter import Shown
from workflows.models import (
    ClaimTurnInput,
    ConversationInput,
    TurnClaim,
    TurnOpenInput,
    conversation_workflow_id,
    turn_workflow_id,
)


@dataclass
class ConversationOptions:
    """How a conversation started by a claim runs (a client's submission brings its own)."""

    idle_seconds: float = 900.0
    turns_per_run: int = 100


def conversation_input(conversation_id: str, options: ConversationOptions) -> ConversationInput:
    return ConversationInput(
        conversation_id=conversation_id,
        memory_key=conversation_id,
        idle_seconds=options.idle_seconds,
        turns_per_run=options.turns_per_run,
    )


def conversation_kind() -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(sa.WORKFLOW_KIND, sa.KIND_CONVERSATION)])


class ConversationActivities:
    """Activities of the conversation entry path, with the options a conversation they start runs with."""

    def __init__(self, options: ConversationOptions | None = None) -> None:
        self.options = options or ConversationOptions()

    @activity.defn(name="claim_conversation_turn")
    async def claim_conversation_turn(self, input: ClaimTurnInput) -> None:
        """Deliver a request's claim to its conversation, starting the conversation if it is not running
        (a retried claim is dropped by the conversation)."""
        await activity.client().start_workflow(
            CONVERSATION_WORKFLOW_TYPE,
            conversation_input(input.conversation_id, self.options),
            id=conversation_workflow_id(input.conversation_id),
            task_queue=input.task_queue,
            start_signal=CLAIM_SIGNAL,
            start_signal_args=[TurnClaim(workflow_id=input.workflow_id, run_id=input.run_id)],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=conversation_kind() if input.search_attributes else None,
            static_summary=Shown(f"conversation {input.conversation_id}"),
        )

    @activity.defn(name="resume_conversation")
    async def resume_conversation(self, conversation_id: str) -> int:
        """The next turn number of a conversation: one past its latest turn that ever started, or 1 when
        none did. Turns start in the order they are numbered, so the turns that exist are a prefix: an
        exponential then binary search finds its end in a few describes, whatever the server keeps in
        visibility or whichever queue the earlier chain ran on."""
        client = activity.client()

        async def exists(turn: int) -> bool:
            try:
                await client.get_workflow_handle(turn_workflow_id(conversation_id, turn)).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return False
                raise
            return True

        if not await exists(1):
            return 1
        found, missing = 1, 2
        while await exists(missing):
            found, missing = missing, missing * 2
        while missing - found > 1:
            middle = (found + missing) // 2
            found, missing = (middle, missing) if await exists(middle) else (found, middle)
        return found + 1

    @activity.defn(name="conversation_turn_open")
    async def conversation_turn_open(self, input: TurnOpenInput) -> bool:
        """Whether the request holding a turn still runs (a request gone without releasing frees it)."""
        handle = activity.client().get_workflow_handle(input.workflow_id, run_id=input.run_id or None)
        try:
            description = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return description.status == WorkflowExecutionStatus.RUNNING
