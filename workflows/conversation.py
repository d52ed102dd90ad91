"""``Conversation``: the entity workflow that runs the turns of one conversation one at a time.

One execution chain per conversation (workflow id ``conversation-<id>``, ``AgentWorkflowKind =
conversation``). Invariants:

- **One turn at a time, in arrival order.** A client submits a turn with the validated update
  ``submit_turn`` (update-with-start: the conversation starts if it is not running); the turn is queued
  and later run as the child ``RequestLifecycle`` ``conversation-<id>/turn-<n>``. A request started
  directly with ``metadata.conversation_id`` sends ``claim`` (from an activity, signal-with-start), waits
  for ``granted`` before its first hook and sends ``release`` on every exit. Whatever the entry path,
  the next turn starts only after the one before it ended — succeeded, failed, cancelled or stopped.
- **Nothing in hand is lost or run twice.** The queue lives in workflow state; the conversation continues
  as new only between turns (nothing running), after ``turns_per_run`` turns or when the server suggests
  it, carrying the queue, the turn counter, its latest finished turns and its memory's key.
- **Idle ends.** With nothing queued for ``idle_seconds`` the chain completes; the next submission or
  claim starts it again (the memory is in the memory store, keyed by the conversation).

Workflow code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
)

with workflow.unsafe.imports_passed_through():
    from . import search_attributes as sa
    from .converter import Shown
    from .models import (
        DONE_TURNS_KEPT,
        INVALID_TURN,
        MAX_INBOUND_PAYLOAD_BYTES,
        ConversationInput,
        ConversationResult,
        ConversationTurns,
        RequestInput,
        RequestResult,
        TurnAccepted,
        TurnClaim,
        TurnEntry,
        TurnOpenInput,
        TurnRelease,
        TurnRequest,
        TurnStatus,
        turn_workflow_id,
    )
    from .names import CONVERSATION_WORKFLOW_TYPE
    from .support import decode_payload

SUBMIT_TURN_UPDATE = "submit_turn"
CLAIM_SIGNAL = "claim"
RELEASE_SIGNAL = "release"
GRANTED_SIGNAL = "granted"
TURNS_QUERY = "turns"
# Released claims remembered to drop a late duplicate claim (a retried claim activity).
RELEASED_KEPT = 200
MAX_TURN_PAYLOAD_BYTES = 64 * 1024


@workflow.defn(name=CONVERSATION_WORKFLOW_TYPE)
class ConversationWorkflow:
    """Queue the turns of one conversation and run them one after another (see the module docstring)."""

    @workflow.init
    def __init__(self, input: ConversationInput) -> None:
        self._input = input
        self._id = input.conversation_id
        self._next_turn = input.next_turn
        self._queue: list[TurnEntry] = [e.model_copy() for e in input.queue]
        self._done: list[TurnEntry] = list(input.done)
        self._running: TurnEntry | None = None
        self._released: list[str] = []
        # A new chain (not a continuation) first learns the turn counter its conversation ended with, if it
        # ran before and went idle: turns that arrive meanwhile are queued and numbered once it is known.
        self._numbered = input.resumed or input.runs > 1 or input.next_turn > 1

    # -- messages ------------------------------------------------------------------------------------

    @workflow.update(name=SUBMIT_TURN_UPDATE)
    async def submit_turn(self, *args: Any) -> TurnAccepted:
        """Queue a turn; the answer names the request that will run it."""
        request = _turn_request(args)
        ahead = len(self._in_hand())
        entry = TurnEntry(
            turn=0,
            workflow_id="",
            message=request.message,
            metadata={**request.metadata, "conversation_id": self._id},
            stream_answer=request.stream_answer,
            submitted_at=workflow.now(),
        )
        self._arrive(entry)
        if not entry.turn:
            await workflow.wait_condition(lambda: entry.turn > 0)
        return TurnAccepted(
            conversation_id=self._id, turn=entry.turn, workflow_id=entry.workflow_id, queued_behind=ahead
        )

    @submit_turn.validator
    def _validate_submit_turn(self, *args: Any) -> None:
        request = _turn_request(args)
        given = request.metadata.get("conversation_id")
        if given is not None and given != self._id:
            raise ApplicationError(
                f"metadata.conversation_id {given!r} is not this conversation ({self._id!r})",
                type=INVALID_TURN,
                non_retryable=True,
            )

    @workflow.signal(name=CLAIM_SIGNAL)
    def claim(self, *args: Any) -> None:
        """A request started directly asks for its turn; it is granted when every turn before it ended."""
        claim, _ = decode_payload(TurnClaim, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
        if claim is None:
            return
        entry = TurnEntry(
            turn=0,
            workflow_id=claim.workflow_id,
            run_id=claim.run_id,
            claimed=True,
            submitted_at=workflow.now(),
        )
        if entry.key in self._released or any(e.key == entry.key for e in self._in_hand()):
            return  # a retried claim
        self._arrive(entry)

    @workflow.signal(name=RELEASE_SIGNAL)
    def release(self, *args: Any) -> None:
        """A request gives its turn back (or withdraws its claim before it was granted)."""
        release, _ = decode_payload(TurnRelease, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
        if release is None:
            return
        key = f"{release.workflow_id}@{release.run_id}"
        self._released = [*self._released[-(RELEASED_KEPT - 1) :], key]
        for entry in list(self._queue):
            if entry.claimed and entry.key == key:  # ended before its turn came: nothing to run
                self._queue.remove(entry)
                self._finish(entry, release.status)
        if self._running is not None and self._running.key == key:
            self._running.status = release.status

    @workflow.query(name=TURNS_QUERY)
    def turns(self) -> ConversationTurns:
        """The latest finished turns, the running one and those queued, in order."""
        return ConversationTurns(
            conversation_id=self._id,
            done=list(self._done),
            running=self._running,
            queued=[e.model_copy(update={"message": ""}) for e in self._queue],
            turns_submitted=self._next_turn - 1,
            runs=self._input.runs,
        )

    # -- the loop ------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: ConversationInput) -> ConversationResult:
        if not self._numbered:
            self._number_from(await self._resume())
        ran = 0
        while True:
            if ran >= input.turns_per_run or workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()
            if not self._queue:
                try:
                    await workflow.wait_condition(
                        lambda: bool(self._queue),
                        timeout=timedelta(seconds=input.idle_seconds),
                        timeout_summary=Shown("idle"),
                    )
                except asyncio.TimeoutError:
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    if not self._queue:
                        return ConversationResult(conversation_id=self._id, turns_submitted=self._next_turn - 1)
                    continue
            entry = self._queue.pop(0)
            self._running = entry
            entry.status, entry.started_at = "running", workflow.now()
            if entry.claimed:
                status, error = await self._grant(entry)
            else:
                status, error = await self._run_child(entry)
            self._running = None
            entry.error = error
            self._finish(entry, status)
            ran += 1

    def _arrive(self, entry: TurnEntry) -> None:
        self._queue.append(entry)
        if self._numbered and not entry.claimed:
            self._number(entry)

    def _number(self, entry: TurnEntry) -> None:
        """A submitted turn's number and workflow id (a claimed turn keeps its own request's id)."""
        entry.turn = self._next_turn
        self._next_turn += 1
        entry.workflow_id = turn_workflow_id(self._id, entry.turn)

    def _number_from(self, next_turn: int) -> None:
        """Number the turns that arrived while the counter was being resumed, in arrival order."""
        self._next_turn, self._numbered = max(next_turn, self._next_turn), True
        for entry in self._queue:
            if not entry.turn and not entry.claimed:
                self._number(entry)

    async def _resume(self) -> int:
        """The next turn number of a conversation that ran before and went idle (1 for a new one), so a
        turn's workflow id never names an earlier turn."""
        return await workflow.execute_activity(
            "resume_conversation",
            self._id,
            result_type=int,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)),
            summary=Shown(f"resume turn counter · {self._id}"),
        )

    def _in_hand(self) -> list[TurnEntry]:
        return [*self._queue, *([self._running] if self._running is not None else [])]

    def _finish(self, entry: TurnEntry, status: TurnStatus) -> None:
        entry.status, entry.ended_at, entry.message = status, workflow.now(), ""
        self._done = [*self._done[-(DONE_TURNS_KEPT - 1) :], entry]

    async def _run_child(self, entry: TurnEntry) -> tuple[TurnStatus, str | None]:
        """Run a submitted turn as a child request and wait for it to end, however it ends."""
        request = RequestInput(
            request=entry.message,
            metadata=entry.metadata,
            stream_answer=entry.stream_answer,
        )
        entry.message = ""
        try:
            result = await workflow.execute_child_workflow(
                "RequestLifecycle",
                request,
                id=entry.workflow_id,
                result_type=RequestResult,
                parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
                static_summary=Shown(f"turn {entry.turn} of {self._id}"),
                search_attributes=self._turn_listing(),
            )
        except ChildWorkflowError as err:
            if isinstance(err.cause, CancelledError):
                return "cancelled", "the turn was cancelled"
            cause = err.cause
            kind = getattr(cause, "type", None) or type(cause).__name__
            return "failed", f"{kind}: {cause}"[:300]
        except WorkflowAlreadyStartedError:  # its id was taken by a request started outside the conversation
            return "failed", f"{entry.workflow_id} already exists"
        return ("stopped" if result.stopped is not None else "succeeded"), None

    @staticmethod
    def _turn_listing() -> TypedSearchAttributes | None:
        """A turn starts listed as a client starts a request (its kind and first stage: no upsert to be
        found), where this conversation is listed by its kind — the namespace has the attributes."""
        if workflow.info().typed_search_attributes.get(sa.WORKFLOW_KIND) != sa.KIND_CONVERSATION:
            return None
        return sa.listed_at_start(sa.KIND_REQUEST)

    async def _grant(self, entry: TurnEntry) -> tuple[TurnStatus, str | None]:
        """Let a request started directly run its turn, and wait until it releases it. A request that
        ended without releasing (terminated, reset) is found by a periodic check and its turn freed."""
        assert entry.run_id is not None
        handle = workflow.get_external_workflow_handle(entry.workflow_id, run_id=entry.run_id)
        try:
            await handle.signal(GRANTED_SIGNAL)
        except FailureError as err:  # a request already closed cannot be signalled
            return "gone", f"the request could not be granted its turn: {err}"[:300]
        while True:
            try:
                await workflow.wait_condition(
                    lambda: entry.key in self._released,
                    timeout=timedelta(seconds=self._input.claim_check_seconds),
                    timeout_summary=Shown("turn released"),
                )
                return (entry.status if entry.status != "running" else "succeeded"), None
            except asyncio.TimeoutError:
                if not await self._turn_open(entry):
                    return "gone", "the request ended without releasing its turn"

    async def _turn_open(self, entry: TurnEntry) -> bool:
        try:
            return await workflow.execute_activity(
                "conversation_turn_open",
                TurnOpenInput(workflow_id=entry.workflow_id, run_id=entry.run_id or ""),
                result_type=bool,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=Shown(f"is {entry.workflow_id} still running"),
            )
        except ActivityError:
            return True  # cannot tell: keep waiting for the release

    async def _continue_as_new(self) -> None:
        """Continue as new between turns: nothing is running, the queue goes across as it stands."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            self._input.model_copy(
                update={
                    "next_turn": self._next_turn,
                    "queue": self._queue,
                    "done": self._done,
                    "memory_key": self._input.memory_key or self._id,
                    "runs": self._input.runs + 1,
                    "resumed": True,
                }
            )
        )


def _turn_request(args: Sequence[Any]) -> TurnRequest:
    request, problem = decode_payload(TurnRequest, args, max_bytes=MAX_TURN_PAYLOAD_BYTES)
    if request is None:
        raise ApplicationError(f"malformed turn: {problem}", type=INVALID_TURN, non_retryable=True)
    return request
