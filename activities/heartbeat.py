"""Heartbeats for every activity the lifecycle schedules with a heartbeat timeout.

A worker that dies stops heartbeating, and the server times its attempt out within seconds, so the
workflow can dispatch the work again elsewhere (``workflows.dispatch``). The heartbeat runs beside the
activity's own work, in the worker's event loop: sync hooks and tools run in threads and never hold it
up, but an ``async`` hook that blocks the event loop for longer than the heartbeat timeout looks like a
lost worker. Heartbeats also carry cancellation to the activity (a cancelled request stops its work).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from temporalio import activity

P = ParamSpec("P")
R = TypeVar("R")


# The details the running activity's heartbeats carry (what its next attempt reads), set by report_progress.
_progress: ContextVar[list[Any] | None] = ContextVar("heartbeat_progress", default=None)


async def _beat(interval: float, progress: list[Any]) -> None:
    # The server times an attempt out when no heartbeat arrives within the heartbeat timeout of its start
    # or of the last heartbeat, so the first beat can wait an interval: an activity that ends sooner (a
    # plan, most tool calls) costs the server no heartbeat at all.
    while True:
        await asyncio.sleep(interval)
        activity.heartbeat(*progress)


def report_progress(*details: Any) -> None:
    """Record what this attempt has done so far, for the activity's next attempt to read from
    ``activity.info().heartbeat_details`` if this one fails: sent at once, and with every background
    heartbeat after it. Nothing is kept outside an activity or in a local activity (no heartbeats)."""
    if not activity.in_activity() or heartbeat_interval() is None:
        return
    progress = _progress.get()
    if progress is not None:
        progress[:] = details
    activity.heartbeat(*details)


def heartbeat_interval() -> float | None:
    """How often this activity should heartbeat, or None when it has no heartbeat timeout (or is local)."""
    info = activity.info()
    if info.is_local or not info.heartbeat_timeout:
        return None
    return max(0.1, info.heartbeat_timeout.total_seconds() / 4)


@contextlib.asynccontextmanager
async def heartbeats():
    """Heartbeat in the background for as long as the block runs."""
    interval = heartbeat_interval()
    if interval is None:
        yield
        return
    progress: list[Any] = []
    token = _progress.set(progress)
    task = asyncio.create_task(_beat(interval, progress))
    try:
        yield
    finally:
        _progress.reset(token)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def heartbeating(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate an activity (below ``@activity.defn``) so it heartbeats while it runs."""

    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        async with heartbeats():
            return await fn(*args, **kwargs)

    return run  # type: ignore[return-value]
