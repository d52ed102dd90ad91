"""Hook methods run so that they can be stopped: a call whose invocation timed out (or was cancelled)
is stopped, never overlaps its own retry, and is tracked until it ends.

A hook method runs within its invocation's time (the hook's ``timeout_seconds`` per attempt). When that
time is up, or the invocation is cancelled:

- an ``async`` method's task is cancelled, and the invocation ends at once even if the method swallows
  the cancellation; it is cancelled again every :data:`RESTOP_SECONDS` while it goes on;
- a plain ``def`` method runs in a thread of its own (never the event loop's shared executor, whose few
  threads a stuck hook would take from every other hook and store call). It is stopped by raising
  :class:`HookStopped` in that thread, which takes effect at its next Python instruction: a blocking call
  into C (``time.sleep(5)``, a socket read without a timeout) finishes first. The stop is raised again
  every :data:`RESTOP_SECONDS` while the thread still runs.

What holds, whatever the method does after its time:

- Its result counts for nothing: the invocation has already failed as timed out (or cancelled). The
  return value is discarded, and the effects, state, leases and detached work it reports land on the
  invocation's private context, which nothing reads any more.
- It never overlaps its own retry: an attempt of the same hook at the same stage of the same request (its
  retry, the next attempt in a batch, or a later invocation) first waits, within its own time, for every
  earlier call that is still running after its invocation ended. One still running when that time is up
  makes the new attempt time out without calling the hook. An earlier attempt of the same activity still
  running when the next one starts on this worker (the server gave up on it first) is stopped then.
- Each such call is tracked by this worker process until it ends: a warning when it is left running
  past :data:`STOP_GRACE_SECONDS`, another when it ends, the gauge ``agent.hook.overruns`` (labels
  ``stage``, ``hook``), and :func:`running_overruns`.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opentelemetry import metrics

from . import telemetry

logger = logging.getLogger(__name__)

OVERRUNS_METRIC = "agent.hook.overruns"
# How long a stopped call may take to end before it counts as running on (a Python loop ends well within
# it); the invocation waits this long for it before it reports its timeout.
STOP_GRACE_SECONDS = 0.1
# How often a call that is still running is stopped again (one that caught the stop, or was in C).
RESTOP_SECONDS = 0.25
_POLL_SECONDS = 0.02

_overruns_gauge: metrics.UpDownCounter | None = None


class HookStopped(BaseException):
    """Raised inside a hook's thread whose invocation timed out or was cancelled. Not an ``Exception``,
    so a hook's ``except Exception`` does not swallow it."""


@dataclass(frozen=True)
class HookAttempt:
    """Which invocation a hook call belongs to: the hook at a stage of one request, the activity running
    it (its attempts share the activity's id) and the attempt."""

    workflow_id: str
    stage: str
    hook: str
    activity_id: str
    attempt: int

    @property
    def scope(self) -> tuple[str, str, str]:
        """The calls that must never overlap: this hook at this stage of this request."""
        return (self.workflow_id, self.stage, self.hook)


@dataclass(frozen=True)
class Overrun:
    """A hook call still running after its invocation ended: ``overrun_seconds`` since then."""

    hook: str
    stage: str
    workflow_id: str
    attempt: int
    started: datetime
    overrun_seconds: float
    reason: str


class _Call:
    """One running hook method."""

    def __init__(self, where: HookAttempt | None, what: str) -> None:
        self.where, self.what = where, what
        self.started = datetime.now(UTC)
        self.abandoned: float | None = None  # time.monotonic() when its invocation let go of it
        self.reason = ""
        self.counted = False  # in the gauge: it ran on past the grace
        self.ended = asyncio.Event()

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def let_go(self) -> None:
        """Stop waiting for the call's result (its invocation is over)."""

    def describe(self) -> str:
        return _describe(self.where) if self.where is not None else self.what


class _ThreadCall(_Call):
    """A plain method in a daemon thread of its own; its result reaches ``future`` on the event loop."""

    def __init__(self, where: HookAttempt | None, what: str, fn: Callable[..., Any], args: Sequence[Any]) -> None:
        super().__init__(where, what)
        self._fn, self._args = fn, args
        self._context = contextvars.copy_context()  # the activity's context and span, as asyncio.to_thread
        self._loop = asyncio.get_running_loop()
        self.future: asyncio.Future[tuple[bool, Any]] = self._loop.create_future()
        self._lock = threading.Lock()
        self._inside = False  # running the hook method: the only time a stop may be raised in the thread
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"hook {what}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._inside and self._thread.ident is not None:
                _set_async_exc(self._thread.ident, HookStopped)

    def let_go(self) -> None:
        self.future.cancel()

    def _run(self) -> None:
        outcome: tuple[bool, Any] = (False, HookStopped())
        try:
            try:
                with self._lock:
                    self._inside = not self._stopped
                if self._inside:
                    outcome = (True, self._context.run(self._fn, *self._args))
            except BaseException as err:  # noqa: BLE001 - handed to the invocation, which decides
                outcome = (False, err)
            finally:
                self._leave()
        except HookStopped:  # a stop raised as the method returned: its outcome stands
            pass
        try:
            self._loop.call_soon_threadsafe(self._settle, outcome)
        except RuntimeError:  # the loop is closed: nobody waits for the result
            pass

    def _leave(self) -> None:
        with self._lock:
            self._inside = False
            if self._thread.ident is not None:
                _set_async_exc(self._thread.ident, None)  # a stop raised but not yet delivered: dropped

    def _settle(self, outcome: tuple[bool, Any]) -> None:
        if not self.future.done():
            self.future.set_result(outcome)


class _TaskCall(_Call):
    """An ``async`` method (or what a plain one returned to await) in a task of its own."""

    def __init__(self, where: HookAttempt | None, what: str, awaitable: Awaitable[Any]) -> None:
        super().__init__(where, what)
        self.task: asyncio.Future[tuple[bool, Any]] = asyncio.ensure_future(_contained(awaitable))
        # What the invocation awaits: a method that swallows its cancellation does not hold it.
        self.future: asyncio.Future[tuple[bool, Any]] = asyncio.shield(self.task)

    def alive(self) -> bool:
        return not self.task.done()

    def stop(self) -> None:
        self.task.cancel()

    def let_go(self) -> None:
        self.future.cancel()


async def _contained(awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    """(True, result) or (False, what it raised): a task of its own must not raise what the event loop
    would take for its own end (``SystemExit``, ``KeyboardInterrupt``); the invocation raises it instead."""
    try:
        return True, await awaitable
    except asyncio.CancelledError:
        raise
    except BaseException as err:  # noqa: BLE001 - handed to the invocation, which decides
        return False, err


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the thread at its next Python instruction (None: drop one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class _Running:
    """The hook calls this process runs, by scope; and those it let go of that still run."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str, str], list[_Call]] = {}
        self._let_go: list[_Call] = []
        self._watchers: set[asyncio.Task[None]] = set()

    def add(self, call: _Call) -> None:
        if call.where is not None:
            self._calls.setdefault(call.where.scope, []).append(call)

    def remove(self, call: _Call) -> None:
        if call.where is None:
            return
        calls = self._calls.get(call.where.scope, [])
        if call in calls:
            calls.remove(call)
        if not calls:
            self._calls.pop(call.where.scope, None)

    async def wait_for_earlier(self, where: HookAttempt) -> None:
        """Return once no earlier call of ``where``'s scope runs on after its invocation ended; an earlier
        attempt of the same activity still running is let go of first (the server gave up on it)."""
        told = False
        while True:
            earlier = []
            for call in list(self._calls.get(where.scope, ())):
                prior = call.where
                if (
                    call.abandoned is None
                    and prior is not None
                    and prior.activity_id == where.activity_id
                    and prior.attempt < where.attempt
                ):
                    self.abandon(call, f"attempt {where.attempt} started")
                if call.abandoned is not None:
                    earlier.append(call)
            if not earlier:
                return
            if not told:
                told = True
                logger.warning(
                    "%s waits for %s, still running after its invocation ended",
                    _describe(where),
                    earlier[0].describe(),
                )
            await earlier[0].ended.wait()

    def abandon(self, call: _Call, reason: str) -> None:
        """The call's invocation is over: stop it, and watch it until it ends."""
        if call.abandoned is not None:
            return
        call.abandoned, call.reason = time.monotonic(), reason
        call.stop()
        call.let_go()
        if not call.alive():
            self._ended(call)
            return
        self._let_go.append(call)
        watcher = asyncio.get_running_loop().create_task(self._watch(call))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, call: _Call) -> None:
        assert call.abandoned is not None
        next_stop = call.abandoned + RESTOP_SECONDS
        try:
            while call.alive():
                await asyncio.sleep(_POLL_SECONDS)
                now = time.monotonic()
                if not call.counted and now - call.abandoned >= STOP_GRACE_SECONDS and call.alive():
                    call.counted = True
                    _gauge(call, +1)
                    logger.warning(
                        "%s is still running %.1fs after its invocation ended (%s); stopping it",
                        call.describe(),
                        now - call.abandoned,
                        call.reason,
                    )
                if now >= next_stop and call.alive():
                    call.stop()
                    next_stop = now + RESTOP_SECONDS
        finally:
            self._ended(call)

    def _ended(self, call: _Call) -> None:
        self.remove(call)
        if call in self._let_go:
            self._let_go.remove(call)
        call.ended.set()
        if call.counted:
            _gauge(call, -1)
            assert call.abandoned is not None
            logger.warning(
                "%s ended %.1fs after its invocation ended (%s); what it did since was not recorded",
                call.describe(),
                time.monotonic() - call.abandoned,
                call.reason,
            )

    def overruns(self) -> list[Overrun]:
        now = time.monotonic()
        return [
            Overrun(
                hook=call.where.hook if call.where else call.what,
                stage=call.where.stage if call.where else "",
                workflow_id=call.where.workflow_id if call.where else "",
                attempt=call.where.attempt if call.where else 0,
                started=call.started,
                overrun_seconds=now - call.abandoned,
                reason=call.reason,
            )
            for call in self._let_go
            if call.abandoned is not None and call.alive()
        ]


_RUNNING = _Running()


def running_overruns() -> list[Overrun]:
    """The hook calls of this process still running after their invocation ended."""
    return _RUNNING.overruns()


def _describe(where: HookAttempt) -> str:
    return f"hook {where.hook!r} at {where.stage} of {where.workflow_id} (attempt {where.attempt})"


def _gauge(call: _Call, delta: int) -> None:
    global _overruns_gauge
    if _overruns_gauge is None:
        _overruns_gauge = metrics.get_meter(telemetry.INSTRUMENTATION).create_up_down_counter(
            OVERRUNS_METRIC, description="Hook calls still running after their invocation timed out or was cancelled"
        )
    where = call.where
    _overruns_gauge.add(delta, {"stage": where.stage if where else "", "hook": where.hook if where else call.what})


async def call_stoppable(fn: Callable[..., Any], args: Sequence[Any], where: HookAttempt | None = None) -> Any:
    """Call a hook method so that it can be stopped (see the module docstring): a plain function in a
    thread of its own, a coroutine in a task of its own. With ``where``, wait first for the earlier calls
    of its scope that outlived their invocation."""
    if where is not None:
        await _RUNNING.wait_for_earlier(where)
    what = getattr(fn, "__qualname__", None) or repr(fn)
    if inspect.iscoroutinefunction(fn):
        return await _awaited(_TaskCall(where, what, fn(*args)))
    call = _ThreadCall(where, what, fn, args)
    value = await _awaited(call)
    if inspect.isawaitable(value):
        return await _awaited(_TaskCall(where, what, value))
    return value


async def _awaited(call: _ThreadCall | _TaskCall) -> Any:
    _RUNNING.add(call)
    if isinstance(call, _ThreadCall):
        call.start()
    try:
        ok, value = await call.future
    except asyncio.CancelledError:
        _RUNNING.abandon(call, "timed out or cancelled")
        # A method that stops at once is gone before the invocation reports; one that does not is watched.
        give_up = time.monotonic() + STOP_GRACE_SECONDS
        while call.alive() and time.monotonic() < give_up:
            await asyncio.sleep(_POLL_SECONDS / 2)
        raise
    finally:
        if call.abandoned is None:
            _RUNNING.remove(call)
    if ok:
        return value
    raise value
