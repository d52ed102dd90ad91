"""A request's turn in its conversation, when it was started directly (not by its conversation).

A request with ``metadata.conversation_id`` that its conversation did not start itself — the Temporal CLI,
a schedule, an older client — claims its turn before its first hook runs: an activity delivers the
``claim`` (starting the conversation if it is not running), and the request waits for the conversation's
``granted`` signal, which comes once every earlier turn of the conversation ended. It sends ``release`` on
every exit — completed, failed, cancelled, stopped — after its finalizers, so the next turn's hooks never
overlap its own. A request cancelled before its turn came withdraws its claim the same way. A request
that ends without a release (terminated) is found by the conversation's periodic check.

Workflow code only.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from .converter import Shown
    from .invocation import raise_if_cancelled
    from .models import ClaimTurnInput, RequestStatus, TurnRelease, TurnStatus, conversation_workflow_id
    from .run_state import RunState
    from .scheduling import Scheduler
    from .support import stage_failure

WAITING_FOR_TURN = "waiting_for_turn"
CONVERSATION_UNAVAILABLE = "ConversationUnavailable"
_RELEASED_AS: dict[str, TurnStatus] = {
    RequestStatus.SUCCEEDED.value: "succeeded",
    RequestStatus.FAILED.value: "failed",
    RequestStatus.CANCELLED.value: "cancelled",
    RequestStatus.STOPPED.value: "stopped",
}


def started_by_conversation(conversation_id: str) -> bool:
    """Whether this request is a turn its conversation started (its parent is the conversation)."""
    parent = workflow.info().parent
    return parent is not None and parent.workflow_id == conversation_workflow_id(conversation_id)


class ConversationTurn:
    """Claim, wait for and release a directly started request's turn (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler
        self.conversation_id: str | None = None
        self.granted = False

    def grant(self) -> None:
        self.granted = True

    async def claim(self, conversation_id: str) -> None:
        """Claim the turn and wait until it is granted."""
        state = self._state
        info = workflow.info()
        try:
            await self._scheduler.activity(
                "claim_conversation_turn",
                ClaimTurnInput(
                    conversation_id=conversation_id,
                    workflow_id=info.workflow_id,
                    run_id=info.run_id,
                    task_queue=info.task_queue,
                    search_attributes=state.manifest.search_attributes,
                ),
                result_type=type(None),
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary=Shown(f"claim turn · {conversation_id}"),
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            raise stage_failure(
                CONVERSATION_UNAVAILABLE, f"could not claim a turn of conversation {conversation_id!r}", err
            ) from None
        self.conversation_id = conversation_id
        with state.leases.waiting():  # a wait adds nothing to the request's history however long it lasts
            await workflow.wait_condition(lambda: self.granted, timeout_summary=Shown("its turn in the conversation"))

    async def release(self) -> None:
        """Give the turn back (or withdraw the claim), with how the request ended."""
        if self.conversation_id is None:
            return
        info = workflow.info()
        status = _RELEASED_AS.get(str(self._state.record.status), "failed")
        handle = workflow.get_external_workflow_handle(conversation_workflow_id(self.conversation_id))
        try:
            await handle.signal("release", TurnRelease(workflow_id=info.workflow_id, run_id=info.run_id, status=status))
        except FailureError:
            pass  # the conversation is gone: there is no next turn to release
        self.conversation_id = None
