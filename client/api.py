"""The client a service uses to run agent requests: start them, wait for their answers or typed failures,
stream answers, review checkpoints, read records, cancel.

    from client.api import AgentClient, RequestFailed

    agents = await AgentClient.connect()                     # settings from the environment
    result = await agents.execute("What is the price of ACME?", metadata={"user_id": "u1"})
    print(result.response)

    handle = await agents.start("Send bob a note", request_id="order-17")
    for checkpoint in await agents.inbox():                  # what reviewers see
        await agents.approve(checkpoint.workflow_id, reviewer="alice", comment="ok")
    try:
        await agents.result("order-17")                       # a request id or a workflow id
    except RequestFailed as failed:
        print(failed.type, failed.message)                    # e.g. CheckpointRejected, RequiredAfterPlanningError

Every method that names a request takes its request id or its workflow id (``request-<request id>``).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf.field_mask_pb2 import FieldMask
from temporalio.api.common.v1 import Priority, WorkflowExecution
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflow.v1 import WorkflowExecutionOptions
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, UpdateWorkflowExecutionOptionsRequest
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from workflows import WORKFLOW_TYPE, data_converter, review_proof, story
from workflows import search_attributes as sa
from workflows.decisions import REQUEST_ID_CONFLICT
from workflows.models import (
    ANSWER_TOPIC,
    AnswerChunk,
    Checkpoint,
    ConversationInput,
    ConversationTurns,
    ExecutionRecord,
    PolicyReplayResult,
    ReplayWindow,
    RequestInput,
    RequestResult,
    ReviewAck,
    ReviewRequest,
    TurnAccepted,
    TurnRequest,
    conversation_id_problem,
    conversation_workflow_id,
)

from . import TemporalUnreachable
from .reviewer_keys import SigningKey, load_signing_key, sign_decision
from .settings import Settings

logger = logging.getLogger(__name__)

__all__ = ["AgentClient", "TemporalUnreachable"]

REQUEST_PREFIX = "request-"
_OPTIONAL_CHECKPOINT: Any = Checkpoint | None  # a query result that may be null


def workflow_id_for(request_id: str) -> str:
    """The workflow id of the request ``request_id`` (``request-<request id>``)."""
    return f"{REQUEST_PREFIX}{request_id}"


class RequestIdConflict(ApplicationError):
    """A request id already names a request with another input: refused, never deduplicated."""

    def __init__(self, request_id: str, workflow_id: str, detail: str) -> None:
        super().__init__(
            f"request id {request_id!r} already names a different request ({workflow_id}): {detail}",
            {"request_id": request_id, "workflow_id": workflow_id, "detail": detail},
            type=REQUEST_ID_CONFLICT,
            non_retryable=True,
        )


class RequestFailed(Exception):
    """A request ended without an answer: ``type`` is the stable error type (``RequiredAfterPlanningError``,
    ``CheckpointRejected``, ``ExtensionError``, ``Cancelled``, ...), ``details`` what the failure carries."""

    def __init__(self, workflow_id: str, type: str, message: str, details: Any = None) -> None:
        super().__init__(f"{workflow_id}: {type}: {message}")
        self.workflow_id, self.type, self.message, self.details = workflow_id, type, message, details

    @classmethod
    def of(cls, workflow_id: str, err: WorkflowFailureError) -> RequestFailed:
        cause = err.cause
        if isinstance(cause, ApplicationError):
            return cls(
                workflow_id,
                cause.type or "ApplicationError",
                cause.message,
                cause.details[0] if cause.details else None,
            )
        if isinstance(cause, CancelledError):
            return cls(workflow_id, "Cancelled", str(cause))
        return cls(workflow_id, type(cause).__name__, str(cause))

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "details": self.details}


class TurnRefused(Exception):
    """The conversation refused a turn before accepting it (malformed, or another conversation's id):
    nothing was queued."""


class NoPendingCheckpoint(ValueError):
    """A review names no checkpoint and the request has none waiting, or names one that is not waiting."""


class CallsChanged(ValueError):
    """The checkpoint's calls are not the ones the reviewer was shown (their digest differs)."""


class RequestNotFound(LookupError):
    """No request has that request id or workflow id."""


class ReviewRefused(Exception):
    """The request refused a review before accepting it (not a reviewer it allows, a checkpoint already
    decided or expired, no pending checkpoint): nothing changed."""


# How long a worker seen polling the task queue is taken to be there still (the no-worker warning).
_WORKERS_SEEN_FOR = 60.0

# Clients not closed when the interpreter exits are let go of before it finalizes (an ``atexit`` hook
# runs while threads may still take the interpreter's lock), so a script that never closes its client
# does not abort at exit either.
_SETTLE_SECONDS = 0.05
_open_clients: weakref.WeakSet[AgentClient] = weakref.WeakSet()


@atexit.register
def _let_go_at_exit() -> None:
    left = [client for client in list(_open_clients) if not client._closed]
    for client in left:
        client._let_go()
    if left:
        time.sleep(_SETTLE_SECONDS)


class _Connecting:
    """What :meth:`AgentClient.connect` returns: awaited, the client; entered with ``async with``, the
    client, closed when the block ends."""

    def __init__(self, cls: type[AgentClient], settings: Settings | None, tracing: bool) -> None:
        self._cls, self._settings, self._tracing = cls, settings, tracing
        self._client: AgentClient | None = None

    async def _connect(self) -> AgentClient:
        from . import connect

        settings = self._settings or Settings.from_env()
        return self._cls(await connect(settings, tracing=self._tracing), settings)

    def __await__(self) -> Generator[Any, None, AgentClient]:
        return self._connect().__await__()

    async def __aenter__(self) -> AgentClient:
        self._client = await self._connect()
        return self._client

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()


@dataclass(frozen=True)
class PendingReview:
    """A checkpoint waiting for a reviewer, and the request it belongs to."""

    workflow_id: str
    checkpoint: Checkpoint


class AgentClient:
    """Runs agent requests on a Temporal namespace (see the module docstring)."""

    def __init__(self, client: Client, settings: Settings) -> None:
        self.temporal = client  # the underlying Temporal client, for anything not wrapped here
        self.settings = settings
        self._signing_key: SigningKey | None = None
        self._closed = False
        self._workers_seen_at: float | None = None  # when the task queue last had a worker polling (or would not say)
        _open_clients.add(self)

    @classmethod
    def connect(cls, settings: Settings | None = None, *, tracing: bool = True) -> _Connecting:
        """Connect with the project's data converter and payload store (settings from the environment
        unless given): ``agents = await AgentClient.connect()`` (then ``await agents.close()``), or
        ``async with AgentClient.connect() as agents:``, which closes it when the block ends.

        Raises:
            SettingsError: the environment holds a bad or unknown variable (each named).
            TemporalUnreachable: no Temporal server answers at the settings' address.
        """
        return _Connecting(cls, settings, tracing)

    async def close(self) -> None:
        """Let go of what the client holds: the database pools its stores opened and the connection to
        Temporal. Call it (or use ``async with``) before the process ends: a connection left to the
        interpreter's shutdown can be released by the SDK's native threads while Python finalizes, which
        aborts the process. Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        from . import close_databases

        await close_databases()
        self._let_go()
        await asyncio.sleep(_SETTLE_SECONDS)

    def _let_go(self) -> None:
        # Drop the connection while the interpreter still runs; the SDK's threads release what they hold
        # of it in the moment the caller then waits.
        self._closed = True
        self.__dict__.pop("temporal", None)
        gc.collect()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests ------------------------------------------------------------------------------------

    async def start(
        self,
        text: str,
        *,
        metadata: dict[str, Any] | None = None,
        request_id: str | None = None,
        stream: bool = False,
        requested_by: str | None = None,
        instructions: str | None = None,
    ) -> WorkflowHandle[Any, RequestResult]:
        """Start a request and return its handle (workflow id ``request-<request id>``).

        A request id names one request: starting an id that runs or has finished with the same input
        attaches to that execution (a retried call never runs the request twice); with a different input
        it raises :class:`RequestIdConflict`. With ``stream`` the answer is also published while it is
        written (read it with :meth:`stream`). ``requested_by`` (default: ``AGENT_PRINCIPAL``) is who the
        request is for: they may not approve its checkpoints themselves. ``instructions`` are this
        request's own, told to the model after the pipeline's.

        When no worker polls the task queue the request waits until one does: a warning is logged
        (``client.api``) naming the queue. Once a worker was seen polling (or the server does not say), the
        queue is asked again only after a minute: a service starting many requests pays no extra round trip
        for each."""
        handle = await start_request(
            self.temporal,
            self.settings,
            text,
            metadata=metadata,
            request_id=request_id,
            stream_answer=stream,
            requested_by=requested_by,
            instructions=instructions,
        )
        if self._workers_seen_at is not None and time.monotonic() - self._workers_seen_at < _WORKERS_SEEN_FOR:
            return handle
        polling = await self.workers_polling()
        # Asked again at the next start only while no worker polls (a server that does not say is not
        # asked before a minute is out either: asking again tells no more).
        self._workers_seen_at = None if polling == 0 else time.monotonic()
        if polling == 0:
            logger.warning(
                "no worker polls task queue %r at %s; request %s waits until one does (start one: python worker.py)",
                self.settings.task_queue,
                self.settings.temporal_address,
                handle.id,
            )
        return handle

    async def workers_polling(self) -> int | None:
        """How many workers poll the task queue for requests now (the server's recent pollers); None when
        the server does not say (an older server, or no permission)."""
        request = DescribeTaskQueueRequest(
            namespace=self.settings.temporal_namespace,
            task_queue=TaskQueue(name=self.settings.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
        try:
            description = await self.temporal.workflow_service.describe_task_queue(request)
        except RPCError:
            return None
        return len(description.pollers)

    async def execute(
        self,
        text: str,
        *,
        metadata: dict[str, Any] | None = None,
        request_id: str | None = None,
        instructions: str | None = None,
    ) -> RequestResult:
        """Start a request and wait for its answer; a request that fails raises :class:`RequestFailed`."""
        handle = await self.start(text, metadata=metadata, request_id=request_id, instructions=instructions)
        return await self.result(handle.id)

    async def result(self, request: str) -> RequestResult:
        """Wait for a request's answer (:class:`RequestFailed` if it fails)."""
        # Waited for at once, not looked up first: the request's own id needs no round trip before the wait.
        for workflow_id in _candidates(request):
            try:
                return await self.temporal.get_workflow_handle(workflow_id, result_type=RequestResult).result()
            except WorkflowFailureError as err:
                raise RequestFailed.of(workflow_id, err) from None
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
        raise _not_found(request)

    async def stream(self, request: str, *, from_offset: int = 0) -> AsyncIterator[AnswerChunk]:
        """The answer of a request started with ``stream=True``, as it is written: the model's text chunks,
        then one ``final`` chunk with the answer after the after_synthesis and after_answer hooks. Ends
        when the request ends. A chunk of another ``activity`` or ``attempt`` than the one before starts
        the text over (a retried or another model call); a ``retracted`` chunk withdraws the text so far
        (the model went on to call tools, or its call failed)."""
        async for chunk in answer_chunks(self.temporal, await self.workflow_id(request), from_offset=from_offset):
            yield chunk

    async def cancel(self, request: str) -> None:
        """Cancel a request: its finalizers run and its record says ``cancelled``."""
        await self.temporal.get_workflow_handle(await self.workflow_id(request)).cancel()

    async def status(self, request: str) -> WorkflowExecutionStatus | None:
        description = await self.temporal.get_workflow_handle(await self.workflow_id(request)).describe()
        return description.status

    # -- conversations -------------------------------------------------------------------------------

    async def submit_turn(
        self,
        conversation_id: str,
        message: str,
        *,
        metadata: dict[str, Any] | None = None,
        stream: bool = False,
    ) -> TurnAccepted:
        """Queue a turn of a conversation (update-with-start: the conversation starts if it is not
        running). The turns of one conversation run one at a time in the order they were accepted; the
        answer names the request that runs this one (``conversation-<id>/turn-<n>``): wait for it with
        :meth:`turn_result`. A turn the conversation refuses raises :class:`TurnRefused`."""
        return await submit_turn(
            self.temporal, self.settings, conversation_id, message, metadata=metadata, stream_answer=stream
        )

    async def turn_result(self, turn: str | TurnAccepted, *, poll_seconds: float = 0.2) -> RequestResult:
        """Wait for a turn's answer (:class:`RequestFailed` if it fails or is cancelled), however long it
        waits in its conversation's queue first."""
        workflow_id = turn.workflow_id if isinstance(turn, TurnAccepted) else turn
        await _until_started(self.temporal, workflow_id, poll_seconds)
        return await self.result(workflow_id)

    async def turns(self, conversation_id: str) -> ConversationTurns:
        """The conversation's turns: the latest done, the running one, those queued (query ``turns``)."""
        handle = self.temporal.get_workflow_handle(conversation_workflow_id(conversation_id))
        return await handle.query("turns", result_type=ConversationTurns)

    # -- reviews -------------------------------------------------------------------------------------

    async def pending(self, request: str) -> list[Checkpoint]:
        """The request's checkpoints waiting for a reviewer, oldest first."""
        handle = self.temporal.get_workflow_handle(await self.workflow_id(request))
        return await handle.query("pending_checkpoints", result_type=list[Checkpoint])

    async def inbox(self) -> list[PendingReview]:
        """Every pending checkpoint of the namespace's requests (those listed ``AgentAwaitingReview``)."""
        found = []
        async for execution in self.temporal.list_workflows(sa.AWAITING_REVIEW_QUERY):
            found.extend(PendingReview(execution.id, c) for c in await self.pending(execution.id))
        return found

    async def review(
        self,
        request: str,
        decision: Literal["approve", "reject"],
        *,
        reviewer: str,
        comment: str = "",
        checkpoint_id: str | None = None,
        declined: Sequence[str] = (),
        proof: str = "",
        calls_digest: str | None = None,
    ) -> ReviewAck:
        """Decide a checkpoint (the oldest pending one unless named) through the validated ``review``
        update; an approval may decline some of its calls (their step ids: each is skipped, reason
        ``confirmation``, and the others run). The decision is signed with the reviewer's key
        (``AGENT_REVIEWER_KEY``) when one is configured, or carries ``proof`` (a token from a trusted
        issuer); ``calls_digest`` refuses to decide if the calls are no longer those shown. A review the
        request refuses raises :class:`ReviewRefused` and changes nothing."""
        workflow_id = await self.workflow_id(request)
        key = self.signing_key() if not proof else None
        try:
            return await review(
                self.temporal,
                workflow_id,
                decision,
                reviewer,
                comment,
                checkpoint_id,
                declined,
                signing_key=key,
                proof=proof,
                calls_digest=calls_digest,
            )
        except (NoPendingCheckpoint, CallsChanged) as err:
            raise ReviewRefused(str(err)) from None
        except WorkflowUpdateFailedError as err:
            raise ReviewRefused(str(getattr(err.cause, "message", err.cause))) from None

    async def approve(
        self,
        request: str,
        *,
        reviewer: str,
        comment: str = "",
        checkpoint_id: str | None = None,
        decline: Sequence[str] = (),
        proof: str = "",
        calls_digest: str | None = None,
    ) -> ReviewAck:
        """Approve a checkpoint; ``decline`` names calls (step ids) of it not to run."""
        return await self.review(
            request,
            "approve",
            reviewer=reviewer,
            comment=comment,
            checkpoint_id=checkpoint_id,
            declined=decline,
            proof=proof,
            calls_digest=calls_digest,
        )

    async def reject(
        self, request: str, *, reviewer: str, comment: str = "", checkpoint_id: str | None = None, proof: str = ""
    ) -> ReviewAck:
        """Reject a checkpoint; ``comment`` says why (the record keeps it)."""
        return await self.review(
            request, "reject", reviewer=reviewer, comment=comment, checkpoint_id=checkpoint_id, proof=proof
        )

    def signing_key(self) -> SigningKey | None:
        """The reviewer's key decisions are signed with (``AGENT_REVIEWER_KEY``), loaded once; None without one.

        Raises:
            ReviewerKeyError: the key file cannot be used (readable by others, not a private key...).
        """
        if self.settings.reviewer_key is None:
            return None
        if self._signing_key is None:
            self._signing_key = load_signing_key(self.settings.reviewer_key)
        return self._signing_key

    # -- policy replay -------------------------------------------------------------------------------

    async def replay_policy(
        self, pipeline: str, window: ReplayWindow | None = None, *, replay_id: str | None = None, batch_size: int = 100
    ) -> WorkflowHandle[Any, PolicyReplayResult]:
        """Start replaying the candidate pipeline ``pipeline`` (``module:factory``) over the records of
        ``window`` in shadow (see ``client.replay``): query ``progress`` on the handle, await its result,
        then read the report with ``client.replay.replay_report``."""
        from .replay import start_policy_replay

        return await start_policy_replay(
            self.temporal, self.settings, pipeline, window or ReplayWindow(), replay_id=replay_id, batch_size=batch_size
        )

    # -- records -------------------------------------------------------------------------------------

    async def record(self, request: str) -> ExecutionRecord:
        """The request's execution record as it stands now (by query; the execution store keeps it after
        the workflow's retention)."""
        handle = self.temporal.get_workflow_handle(await self.workflow_id(request))
        return await handle.query("execution_record", result_type=ExecutionRecord)

    async def workflow_id(self, request: str) -> str:
        """The workflow id of a request named by its request id or its workflow id."""
        for workflow_id in _candidates(request):
            try:
                await self.temporal.get_workflow_handle(workflow_id).describe()
                return workflow_id
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
        raise _not_found(request)


def _candidates(request: str) -> list[str]:
    """The workflow ids a request may be named by: a workflow id, or a request id (its workflow's first)."""
    return [request] if request.startswith(REQUEST_PREFIX) else [workflow_id_for(request), request]


def _not_found(request: str) -> RequestNotFound:
    return RequestNotFound(f"no request {request!r}: neither a workflow id nor a request id")


async def started_input(handle: WorkflowHandle, converter: DataConverter = data_converter) -> RequestInput | None:
    """The input an existing execution was started with (from its first history event), if it is one;
    ``converter``: the client's (it decrypts what the client encrypted)."""
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            [value] = await converter.decode(payloads)
            return RequestInput.model_validate(value)
        except (ValueError, TypeError, ApplicationError):
            return None
    return None


async def start_request(
    client: Client,
    settings: Settings,
    text: str,
    *,
    metadata: dict[str, Any] | None = None,
    request_id: str | None = None,
    stream_answer: bool = False,
    requested_by: str | None = None,
    instructions: str | None = None,
) -> WorkflowHandle[Any, RequestResult]:
    """:meth:`AgentClient.start` on a Temporal client of the project's (see there); the request is made for
    ``requested_by``, else the settings' ``AGENT_PRINCIPAL``."""
    request_id = request_id or uuid.uuid4().hex[:12]
    request = RequestInput(
        request=text,
        metadata=metadata or {},
        request_id=request_id,
        stream_answer=stream_answer,
        requested_by=requested_by or settings.principal,
        instructions=instructions,
    )
    workflow_id = workflow_id_for(request_id)
    # What the UI shows without a codec: the request's text only where payloads are not encrypted, or the
    # deployment allows it (as the worker decides for what the request shows later).
    with_text = client.data_converter.payload_codec is None or settings.protection.ui_shows_text

    async def start(attributes: TypedSearchAttributes | None) -> WorkflowHandle[Any, RequestResult]:
        return await client.start_workflow(
            WORKFLOW_TYPE,
            request,
            id=workflow_id,
            task_queue=settings.task_queue,
            result_type=RequestResult,
            static_summary=story.request_summary(text, request_id, with_text=with_text),
            static_details=story.request_details(text, request_id, with_text=with_text),
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            search_attributes=attributes,
        )

    try:
        try:
            # Listed (kind, first stage) from its start: the request costs no upsert to be found.
            return await start(sa.listed_at_start())
        except RPCError as err:
            if not _search_attributes_missing(err):
                raise
            return await start(None)  # a namespace without them: the request runs, unlisted
    except WorkflowAlreadyStartedError:
        pass
    handle = client.get_workflow_handle(workflow_id, result_type=RequestResult)
    existing = await started_input(handle, client.data_converter)
    if existing is None:
        raise RequestIdConflict(request_id, workflow_id, "its input is not a request")
    if existing.model_dump(mode="json") != request.model_dump(mode="json"):
        raise RequestIdConflict(request_id, workflow_id, "its request or metadata differ")
    return handle


def _search_attributes_missing(err: RPCError) -> bool:
    """Whether the server refused a start because the namespace lacks the lifecycle search attributes."""
    return err.status is RPCStatusCode.INVALID_ARGUMENT and any(key.name in err.message for key in sa.ALL)


async def submit_turn(
    client: Client,
    settings: Settings,
    conversation_id: str,
    message: str,
    *,
    metadata: dict[str, Any] | None = None,
    stream_answer: bool = False,
) -> TurnAccepted:
    """:meth:`AgentClient.submit_turn` on a Temporal client of the project's (see there)."""
    problem = conversation_id_problem(conversation_id)
    if problem is not None:
        raise TurnRefused(problem)
    start = WithStartWorkflowOperation(
        "Conversation",
        ConversationInput(
            conversation_id=conversation_id,
            memory_key=conversation_id,
            idle_seconds=settings.conversation_idle_seconds,
            turns_per_run=settings.conversation_turns_per_run,
        ),
        id=conversation_workflow_id(conversation_id),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        search_attributes=TypedSearchAttributes([SearchAttributePair(sa.WORKFLOW_KIND, sa.KIND_CONVERSATION)]),
        static_summary=story.shown(f"conversation {conversation_id}"),
    )
    # Sent as plain JSON: the conversation validates it, so a malformed turn is refused there, typed.
    turn: Any = (
        TurnRequest(message=message, metadata=metadata or {}, stream_answer=stream_answer).model_dump(mode="json")
        if message
        else {"message": message, "metadata": metadata or {}, "stream_answer": stream_answer}
    )
    try:
        return await client.execute_update_with_start_workflow(
            "submit_turn", turn, start_workflow_operation=start, result_type=TurnAccepted
        )
    except WorkflowUpdateFailedError as err:
        raise TurnRefused(str(getattr(err.cause, "message", err.cause))) from None


async def _until_started(client: Client, workflow_id: str, poll_seconds: float) -> None:
    """Wait until a queued turn's request exists (or its conversation says it never will)."""
    conversation = workflow_id.rsplit("/turn-", 1)[0]
    while True:
        try:
            await client.get_workflow_handle(workflow_id).describe()
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
        try:
            turns = await client.get_workflow_handle(conversation).query("turns", result_type=ConversationTurns)
        except (RPCError, WorkflowQueryFailedError):
            turns = None
        for entry in turns.done if turns is not None else ():
            if entry.workflow_id == workflow_id:
                raise RequestFailed(
                    workflow_id,
                    "Cancelled" if entry.status == "cancelled" else "TurnNotRun",
                    entry.error or f"the turn ended {entry.status} before it started",
                )
        await asyncio.sleep(poll_seconds)


async def answer_chunks(client: Client, workflow_id: str, *, from_offset: int = 0) -> AsyncIterator[AnswerChunk]:
    """:meth:`AgentClient.stream` by workflow id (see there)."""
    stream = WorkflowStreamClient.create(client, workflow_id)
    async for item in stream.subscribe(ANSWER_TOPIC, from_offset, result_type=AnswerChunk):
        yield item.data


async def pending_checkpoint(client: Client, workflow_id: str) -> Checkpoint | None:
    """The oldest checkpoint of a request waiting for a reviewer, or None."""
    return await client.get_workflow_handle(workflow_id).query("pending_checkpoint", result_type=_OPTIONAL_CHECKPOINT)


async def review(
    client: Client,
    workflow_id: str,
    decision: Literal["approve", "reject"],
    reviewer: str,
    comment: str = "",
    checkpoint_id: str | None = None,
    declined: Sequence[str] = (),
    *,
    signing_key: SigningKey | None = None,
    proof: str = "",
    calls_digest: str | None = None,
) -> ReviewAck:
    """Decide a checkpoint through the ``review`` update (validated, acknowledged): the one named, or the
    oldest pending; an approval may decline some of its calls. The request is put first (:func:`put_first`)
    before anything is asked of it.

    With ``signing_key`` the decision is signed for the checkpoint's calls as the request lists them now
    (and, with ``calls_digest``, only if they are still the calls the reviewer was shown); ``proof`` sends
    a token obtained elsewhere (a trusted issuer's). A refused review raises ``WorkflowUpdateFailedError``;
    no such pending checkpoint, :class:`NoPendingCheckpoint`; calls other than those shown,
    :class:`CallsChanged`."""
    await put_first(client, workflow_id)
    handle = client.get_workflow_handle(workflow_id)
    if checkpoint_id is None or signing_key is not None or calls_digest is not None:
        pending = await handle.query("pending_checkpoints", result_type=list[Checkpoint])
        checkpoint = next((c for c in pending if checkpoint_id in (None, c.checkpoint_id)), None)
        if checkpoint is None:
            named = f"checkpoint {checkpoint_id}" if checkpoint_id else "checkpoint"
            raise NoPendingCheckpoint(f"{workflow_id} has no pending {named}")
        checkpoint_id = checkpoint.checkpoint_id
        digest = review_proof.calls_digest(checkpoint.calls, checkpoint.plan)
        if calls_digest is not None and calls_digest != digest:
            raise CallsChanged(
                f"checkpoint {checkpoint_id} now runs other calls than those shown ({digest}, not {calls_digest}): "
                "look at it again before deciding"
            )
        if signing_key is not None:
            proof = sign_decision(
                signing_key,
                checkpoint,
                workflow_id=workflow_id,
                decision=decision,
                reviewer=reviewer,
                comment=comment,
                declined=declined,
            )
    assert checkpoint_id is not None
    request = ReviewRequest(
        checkpoint_id=checkpoint_id,
        reviewer=reviewer,
        decision=decision,
        comment=comment,
        declined=list(declined),
        proof=proof,
    )
    return await handle.execute_update("review", request, result_type=ReviewAck)


# Temporal's highest task priority (1 is first, 3 the default, 5 the last).
REVIEWED_PRIORITY_KEY = 1


async def put_first(client: Client, workflow_id: str) -> None:
    """Give a request a person is deciding Temporal's highest task priority, before the decision is sent:
    the workflow task that answers the review, and everything the request does after it, go ahead of the
    tasks of requests no one waits on. A worker past its capacity still answers a reviewer in the time one
    task takes, however long its task queue is. Only the priority key changes (a fairness key stays); a
    server that cannot (no permission, no priorities) leaves the order as it was, and the review goes on."""
    try:
        await client.workflow_service.update_workflow_execution_options(
            UpdateWorkflowExecutionOptionsRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=workflow_id),
                workflow_execution_options=WorkflowExecutionOptions(
                    priority=Priority(priority_key=REVIEWED_PRIORITY_KEY)
                ),
                update_mask=FieldMask(paths=["priority.priority_key"]),
            )
        )
    except RPCError as err:
        logger.debug("could not raise the priority of %s: %s", workflow_id, err.message)


def describe_failure(err: WorkflowFailureError) -> dict[str, Any]:
    """The typed failure of a request as a dict: type, message, details."""
    return RequestFailed.of("", err).as_dict()
