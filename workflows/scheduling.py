"""How the request workflow schedules the framework's own activities: heartbeated and dispatched again
when a worker is lost, bounded in bytes in flight, refused before sending what Temporal cannot carry;
the in-process bookkeeping (resolving the pipeline, writing the record) as local activities. Every worker
loss is kept in the record — a dispatch's, and an attempt's its retries followed (reported by the next
attempt, ``dispatch.LOST_ATTEMPT_SIGNAL``). Workflow code only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from . import decisions, dispatch
    from .converter import Shown
    from .listing import StageListing
    from .models import (
        MAX_IGNORED_MESSAGES,
        MAX_INLINE_PAYLOAD_BYTES,
        MAX_STORED_PAYLOAD_BYTES,
        STORED_REFERENCE_BYTES,
        TASK_PAYLOAD_BUDGET_BYTES,
        LostAttempt,
        WorkerLoss,
    )
    from .run_state import RunState
    from .support import payload_bytes

ResultT = TypeVar("ResultT")


@dataclass
class _Call:
    """One of the framework's activities while it runs: what a lost attempt of it is recorded with."""

    activity: str
    summary: str
    dispatch: int = 1


class Scheduler:
    """Schedules the request's activities (see the module docstring)."""

    def __init__(self, state: RunState, listing: StageListing) -> None:
        self._state = state
        self._listing = listing
        self._inflight_bytes = 0  # inline input bytes of the activities scheduled and not yet finished
        self._running: list[_Call] = []
        self._lost_attempts: dict[str, set[int]] = {}  # by activity id: its attempts reported lost

    async def activity(
        self,
        activity: str,
        arg: Any,
        *,
        result_type: type[ResultT],
        timeout: float,
        retry_policy: RetryPolicy,
        summary: str,
        on_worker_lost: Callable[[int], None] | None = None,
        deadline: datetime | None = None,
    ) -> ResultT:
        """Schedule one of the framework's activities: heartbeated, dispatched again when its worker is
        lost (each loss kept in the record), ``WorkerLost`` after the pipeline's limit of lost dispatches;
        with a ``deadline``, finished by then whatever its retries and dispatches (``dispatch.execute``)."""
        settings = self._state.manifest.settings
        sent, size = self.encoded(summary, arg)
        inline = self._inline_bytes(size)
        self._listing.publish(untimed=True)

        call = _Call(activity, summary)

        def lost(n: int) -> None:
            call.dispatch = n + 1
            self.note_worker_lost(activity, summary, n)
            if on_worker_lost is not None:
                on_worker_lost(n)

        # What is in flight is bounded in bytes, so no workflow task can schedule more than a gRPC message
        # carries: a large fan-out waits here for earlier activities to finish.
        if self._inflight_bytes and self._inflight_bytes + inline > TASK_PAYLOAD_BUDGET_BYTES:
            await workflow.wait_condition(
                lambda: self._inflight_bytes + inline <= TASK_PAYLOAD_BUDGET_BYTES or not self._inflight_bytes
            )
        self._inflight_bytes += inline
        self._running.append(call)
        try:
            return await dispatch.execute(
                activity,
                sent,
                result_type=result_type,
                start_to_close_timeout=timedelta(seconds=timeout),
                retry_policy=retry_policy,
                summary=Shown(summary),
                heartbeat_ceiling=timedelta(seconds=settings.heartbeat_timeout_seconds),
                max_worker_losses=settings.max_worker_losses,
                on_worker_lost=lost,
                lost_attempts=lambda activity_id: len(self._lost_attempts.get(activity_id, ())),
                deadline=deadline,
            )
        finally:
            self._inflight_bytes -= inline
            self._running.remove(call)

    async def bookkeeping(
        self,
        activity: str,
        arg: Any,
        *,
        result_type: type[ResultT],
        timeout: float,
        retry_policy: RetryPolicy,
        summary: str,
    ) -> ResultT:
        """The framework's own in-process steps (resolving the pipeline, writing the record): local
        activities, so they cost no server round trip and their input — the whole record — never enters
        the history."""
        try:
            return await workflow.execute_local_activity(
                activity,
                arg,
                result_type=result_type,
                start_to_close_timeout=timedelta(seconds=timeout),
                retry_policy=retry_policy,
                summary=Shown(summary),
            )
        except (ApplicationError, TimeoutError) as err:  # a local activity's failure arrives unwrapped
            raise ActivityError(
                str(err),
                scheduled_event_id=0,
                started_event_id=0,
                identity="",
                activity_type=activity,
                activity_id="",
                retry_state=None,
            ) from err

    def _inline_bytes(self, size: int) -> int:
        """What a payload of ``size`` bytes adds to a workflow task: itself, or its reference in the store."""
        return STORED_REFERENCE_BYTES if self._state.manifest.payload_store and size >= STORED_REFERENCE_BYTES else size

    def encoded(self, summary: str, arg: Any) -> tuple[RawValue, int]:
        """``arg`` as the data converter sends it, and its size in bytes: converted once, here, and sent as
        these very bytes (the converter passes a ``RawValue`` on as it is). Refused as :meth:`check_size`
        says."""
        payload = workflow.payload_converter().to_payloads([arg])[0]
        return RawValue(payload), self.check_size(summary, payload.ByteSize())

    def check_payload(self, summary: str, arg: Any) -> int:
        """:meth:`check_size` of ``arg`` as the data converter would send it."""
        return self.check_size(summary, payload_bytes(arg))

    def check_size(self, summary: str, size: int) -> int:
        """Refuse to send what Temporal (or the payload store) cannot carry: a typed failure now, instead of
        a workflow task that fails on every retry. Returns ``size``."""
        stored = self._state.manifest.payload_store
        limit = MAX_STORED_PAYLOAD_BYTES if stored else MAX_INLINE_PAYLOAD_BYTES
        if size > limit:
            raise ApplicationError(
                f"{summary}: its input is {size} bytes; one payload may be at most {limit}",
                {"summary": summary, "bytes": size, "limit": limit, "payload_store": stored},
                type=decisions.PAYLOAD_TOO_LARGE,
                non_retryable=True,
            )
        return size

    def note_worker_lost(self, activity: str, summary: str, dispatch_number: int) -> None:
        workflow.logger.warning("worker lost under %s (dispatch %s); dispatching it again", summary, dispatch_number)
        record = self._state.record
        if len(record.worker_losses) < MAX_IGNORED_MESSAGES:
            record.worker_losses.append(
                WorkerLoss(activity=activity, summary=summary, at=workflow.now(), dispatch=dispatch_number)
            )

    def note_attempt_lost(self, lost: LostAttempt) -> None:
        """Keep an attempt that lost its worker within its activity's retries, as the attempt after it
        reported it (once per attempt, whoever reports it again). It is recorded with the summary of the
        activity it belongs to — when one activity of its type runs; with several at once, as one of them."""
        seen = self._lost_attempts.setdefault(lost.activity_id, set())
        if lost.attempt in seen:
            return
        seen.add(lost.attempt)
        calls = [c for c in self._running if c.activity == lost.activity]
        if len(calls) == 1:
            summary, dispatch_number = calls[0].summary, calls[0].dispatch
        else:
            summary = lost.activity if not calls else f"{lost.activity} · one of {len(calls)} running"
            dispatch_number = min((c.dispatch for c in calls), default=1)
        workflow.logger.warning("worker lost under %s (attempt %s); its retries went on", summary, lost.attempt)
        record = self._state.record
        if len(record.worker_losses) < MAX_IGNORED_MESSAGES:
            record.worker_losses.append(
                WorkerLoss(
                    activity=lost.activity,
                    summary=summary,
                    at=workflow.now(),
                    dispatch=dispatch_number,
                    attempt=lost.attempt,
                    activity_id=lost.activity_id,
                )
            )
