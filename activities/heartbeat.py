"""Heartbeats for every activity the lifecycle schedules with a heartbeat timeout.

A worker that dies stops heartbeating, and the server times its attempt out within seconds, so the
workflow can dispatch the work again elsewhere (``workflows.dispatch``). The heartbeat runs beside the
activity's own work, in the worker's event loop: sync hooks and tools run in threads and never hold it
up, but an ``async`` hook that blocks the event loop for longer than the heartbeat timeout looks like a
lost worker. Heartbeats also carry cancellation to the activity (a cancelled request stops its work).

A lost worker whose attempt the activity's own retries follow is found here: an attempt after the first
asks the server how the one before it ended, and when the server timed it out on its heartbeat, tells the
request (``LOST_ATTEMPT_SIGNAL``) before it does anything else — so the request records the loss, and can
give the attempt back, whatever this attempt then does.

Progress (what a next attempt must know, such as the model calls already made and paid for) rides on
the heartbeats: it is sent :data:`PROGRESS_DELAY` after it is reported while the attempt still runs, and
at once when the attempt fails. An attempt that completes sooner sends no heartbeat at all: its result
carries everything, and a heartbeat still in flight would hold its completion back by the heartbeat's
round trip (the worker sends a completion only once the heartbeats before it have been answered).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from temporalio import activity
from temporalio.api.enums.v1 import TimeoutType

from workflows import WORKFLOW_TYPE
from workflows.dispatch import LOST_ATTEMPT_SIGNAL
from workflows.models import LostAttempt

logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

# How long reported progress waits for the next heartbeat while the attempt runs. A worker lost within
# this time of a report leaves the next attempt without it; a call still in flight when a worker is lost
# is not known to the next attempt either.
PROGRESS_DELAY = 0.2
# How long an attempt spends at most finding out about the one before it and telling its request.
LOSS_REPORT_SECONDS = 10.0


class _Progress:
    """The details the running activity's heartbeats carry; ``reported`` is set while a report is unsent."""

    def __init__(self) -> None:
        self.details: tuple[Any, ...] = ()
        self.reported = asyncio.Event()

    def report(self, details: tuple[Any, ...]) -> None:
        self.details = details
        self.reported.set()

    def send(self) -> None:
        self.reported.clear()
        activity.heartbeat(*self.details)


_progress: ContextVar[_Progress | None] = ContextVar("heartbeat_progress", default=None)


async def _beat(interval: float, progress: _Progress) -> None:
    # The server times an attempt out when no heartbeat arrives within the heartbeat timeout of its start
    # or of the last heartbeat, so the first beat can wait an interval: an activity that ends sooner (a
    # plan, most tool calls) costs the server no heartbeat at all.
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await progress.reported.wait()
                await asyncio.sleep(PROGRESS_DELAY)
        progress.send()


def report_progress(*details: Any) -> None:
    """Record what this attempt has done so far, for the activity's next attempt to read from
    ``activity.info().heartbeat_details`` if this one fails: sent with the next heartbeat, at most
    :data:`PROGRESS_DELAY` later while the attempt runs, and at once if it fails. Nothing is kept outside
    an activity or in a local activity (no heartbeats)."""
    if not activity.in_activity():
        return
    progress = _progress.get()
    if progress is not None:
        progress.report(details)


def heartbeat_interval() -> float | None:
    """How often this activity should heartbeat, or None when it has no heartbeat timeout (or is local)."""
    info = activity.info()
    if info.is_local or not info.heartbeat_timeout:
        return None
    return max(0.1, info.heartbeat_timeout.total_seconds() / 4)


@contextlib.asynccontextmanager
async def heartbeats():
    """Heartbeat in the background for as long as the block runs; a failing block sends the progress
    it reported and has not sent yet before it fails."""
    interval = heartbeat_interval()
    if interval is None:
        yield
        return
    progress = _Progress()
    token = _progress.set(progress)
    task = asyncio.create_task(_beat(interval, progress))
    try:
        await report_lost_attempt()
        yield
    except BaseException:
        if progress.reported.is_set():  # the worker sends this heartbeat before it reports the failure
            progress.send()
        raise
    finally:
        _progress.reset(token)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def report_lost_attempt() -> None:
    """In a request's activity, an attempt after the first: when the server timed the attempt before it
    out on its heartbeat (its worker was lost), tell the request, which records it. A report that cannot be
    made is logged; the attempt goes on either way."""
    info = activity.info()
    if info.attempt <= 1 or info.workflow_type != WORKFLOW_TYPE or info.workflow_id is None:
        return
    try:
        async with asyncio.timeout(LOSS_REPORT_SECONDS):
            handle = activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
            described = await handle.describe()
            pending = next(
                (p for p in described.raw_description.pending_activities if p.activity_id == info.activity_id), None
            )
            failure = pending.last_failure if pending is not None else None
            if failure is None or not failure.HasField("timeout_failure_info"):
                return
            if failure.timeout_failure_info.timeout_type != TimeoutType.TIMEOUT_TYPE_HEARTBEAT:
                return
            lost = LostAttempt(activity=info.activity_type, activity_id=info.activity_id, attempt=info.attempt - 1)
            await handle.signal(LOST_ATTEMPT_SIGNAL, lost)
    except Exception as err:  # noqa: BLE001 - the report is bookkeeping: the attempt goes on
        logger.warning(
            "could not report the lost attempt before attempt %s of %s: %s", info.attempt, info.activity_type, err
        )


def heartbeating(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate an activity (below ``@activity.defn``) so it heartbeats while it runs."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        async with heartbeats():
            return await fn(*args, **kwargs)

    return run  # type: ignore[return-value]
