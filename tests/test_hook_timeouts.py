"""A hook that runs out of time is stopped: it never overlaps its own retry, nothing it does after its
timeout counts, and the request ends as the hook's failure policy says — whether the hook is a plain
``def`` (run in a thread) or ``async``, and whether it runs in a batch of in-process hooks, as its own
local activity, or as an activity the server times out."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from hooks import RunMode
from workflows.models import FailurePolicy, InvocationOutcome, RequestStatus, Stage, StageSettings

from .harness import Harness, Outcome

HELLO = "I can quote stock prices, place trades and send messages, but found nothing to do for that request."
# How long a hook's attempt would run if nothing stopped it (its timeout is 1 s).
STEPS, STEP_SECONDS = 200, 0.01  # interruptible: Python runs between the steps


@dataclass
class Run:
    """One attempt as the hook saw it."""

    started: float
    ticks: list[float] = field(default_factory=list, repr=False)
    ended: float | None = None
    completed: bool = False
    raised: str | None = None


class Attempts:
    """Every attempt of a hook, recorded from inside it (from its thread, or its task)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[Run] = []

    def begin(self) -> Run:
        with self.lock:
            run = Run(started=time.monotonic())
            self.runs.append(run)
            return run

    def tick(self, run: Run) -> None:
        with self.lock:
            run.ticks.append(time.monotonic())

    def end(self, run: Run, completed: bool) -> None:
        error = sys.exc_info()[1]
        with self.lock:
            run.ended, run.completed = time.monotonic(), completed
            run.raised = type(error).__name__ if error is not None else None

    async def all_ended(self, within: float = 15.0) -> list[Run]:
        """The attempts once every one has ended (stopped, or run to its end)."""
        give_up = time.monotonic() + within
        while time.monotonic() < give_up:
            with self.lock:
                if all(run.ended is not None for run in self.runs):
                    return list(self.runs)
            await asyncio.sleep(0.05)
        raise AssertionError(f"an attempt never ended: {self.runs}")


class SyncSlow:
    """after_synthesis as a plain method that overruns its 1 s timeout on each of its 2 attempts: in small
    sleeps (Python runs between them), or blocked in one call into C (a lock's acquire, which nothing can
    interrupt) until the test sets ``release``."""

    timeout_seconds = 1
    max_attempts = 2

    def __init__(self, name: str, run_mode: RunMode, policy: FailurePolicy, *, blocking: bool) -> None:
        self.name, self.run_mode, self.failure_policy, self.blocking = name, run_mode, policy, blocking
        self.attempts = Attempts()
        self.release = threading.Event()

    def after_synthesis(self, ctx, response: str) -> str:
        run = self.attempts.begin()
        completed = False
        try:
            if self.blocking:
                self.release.wait(30)
                self.attempts.tick(run)
            else:
                for _ in range(STEPS):
                    time.sleep(STEP_SECONDS)
                    self.attempts.tick(run)
            completed = True
        finally:
            self.attempts.end(run, completed)
        return response + " [late]"


class AsyncSwallows:
    """after_synthesis as a coroutine that overruns its 1 s timeout and swallows the first cancellation
    of each attempt, going on as if nothing happened."""

    timeout_seconds = 1
    max_attempts = 2

    def __init__(self, name: str, run_mode: RunMode, policy: FailurePolicy) -> None:
        self.name, self.run_mode, self.failure_policy = name, run_mode, policy
        self.attempts = Attempts()

    async def after_synthesis(self, ctx, response: str) -> str:
        run = self.attempts.begin()
        completed = swallowed = False
        try:
            for _ in range(STEPS):
                try:
                    await asyncio.sleep(STEP_SECONDS)
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed = True
                self.attempts.tick(run)
            completed = True
        finally:
            self.attempts.end(run, completed)
        return response + " [late]"


class Tail:
    """The next hook of the stage."""

    name = "tail"

    def __init__(self, run_mode: RunMode) -> None:
        self.run_mode = run_mode

    async def after_synthesis(self, ctx, response: str) -> str:
        return response + " [tail]"


PATHS = {
    # Two in-process hooks in a row share one local activity, which retries each itself.
    "batch": (RunMode.LOCAL_ACTIVITY, StageSettings()),
    # Each in-process hook its own local activity, retried by the worker's SDK.
    "local": (RunMode.LOCAL_ACTIVITY, StageSettings(batch_local_hooks=False)),
    # Each hook its own activity, timed out and retried by the server.
    "activity": (RunMode.ACTIVITY, StageSettings()),
}


async def run_request(client, tmp_path, hook, path: str) -> tuple[Outcome, float]:
    run_mode, settings = PATHS[path]
    async with Harness(client, tmp_path, hooks=[hook, Tail(run_mode)], settings=settings) as h:
        out = await h.run("Hello there")
        return out, time.monotonic()


def assert_outcome_follows_the_policy(out: Outcome, hook: str, policy: FailurePolicy) -> None:
    [inv] = out.record.invocations(Stage.AFTER_SYNTHESIS, hook)
    assert (inv.outcome, inv.error_type) == (InvocationOutcome.TIMED_OUT, "HookTimeout"), inv
    assert inv.error == "hook did not finish within 1s (start_to_close)"
    if policy is FailurePolicy.FAIL_OPEN:
        assert out.failure is None, out.failure
        assert out.result.response == HELLO + " [tail]"  # the late hook's answer is nowhere
        assert out.record.status is RequestStatus.SUCCEEDED
    else:
        assert out.failure is not None and out.failure.type == "ExtensionError", out.failure
        details = out.failure_details()
        assert (details["extension"], details["phase"], details["cause_type"]) == (
            hook,
            "after_synthesis",
            "HookTimeout",
        )
        assert out.record.status is RequestStatus.FAILED
        assert out.record.invocations(Stage.AFTER_SYNTHESIS, "tail") == []


def assert_never_overlapping(runs: list[Run]) -> None:
    """Each attempt started after the one before it had ended."""
    ordered = sorted(runs, key=lambda run: run.started)
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert before.ended is not None and before.ended <= after.started, f"attempts overlapped: {ordered}"


@pytest.mark.parametrize(
    ("path", "policy"),
    [("batch", FailurePolicy.FAIL_OPEN), ("local", FailurePolicy.FAIL_CLOSED), ("activity", FailurePolicy.FAIL_OPEN)],
)
async def test_a_sync_hook_that_overruns_is_stopped_before_its_retry_and_the_policy_decides(
    client, tmp_path, path, policy
):
    hook = SyncSlow(f"steps-{path}", PATHS[path][0], policy, blocking=False)
    out, request_ended = await run_request(client, tmp_path, hook, path)

    assert_outcome_follows_the_policy(out, hook.name, policy)
    runs = await hook.attempts.all_ended()
    assert len(runs) == 2  # each attempt ran the hook, one after the other
    assert_never_overlapping(runs)
    for run in runs:
        assert not run.completed and run.raised is not None, run  # stopped mid-way, from outside
        assert all(tick <= request_ended for tick in run.ticks), "the hook ran on after its request ended"


@pytest.mark.parametrize(
    ("path", "policy"),
    [("batch", FailurePolicy.FAIL_CLOSED), ("local", FailurePolicy.FAIL_OPEN), ("activity", FailurePolicy.FAIL_CLOSED)],
)
async def test_a_sync_hook_stuck_in_a_blocking_call_is_never_overlapped_by_its_retry(
    client, tmp_path, metric_reader, path, policy
):
    hook = SyncSlow(f"stuck-{path}", PATHS[path][0], policy, blocking=True)
    try:
        out, _ = await run_request(client, tmp_path, hook, path)
        await stuck_while_its_retry_times_out(hook, out, policy, metric_reader)
    finally:
        hook.release.set()


async def stuck_while_its_retry_times_out(hook: SyncSlow, out: Outcome, policy: FailurePolicy, metric_reader) -> None:
    """While the first attempt is stuck: the request has ended as its policy says, the retry never called
    the hook, and the worker shows the stuck call; once the call returns, it stops there."""
    assert_outcome_follows_the_policy(out, hook.name, policy)
    # The retry waited for the stuck attempt, within its own timeout, and timed out without calling the hook.
    with hook.attempts.lock:
        assert len(hook.attempts.runs) == 1 and hook.attempts.runs[0].ended is None

    from activities.stoppable import OVERRUNS_METRIC, running_overruns

    labels = (("hook", hook.name), ("stage", "after_synthesis"))
    [overrun] = [o for o in running_overruns() if o.workflow_id == out.workflow_id]
    assert (overrun.hook, overrun.stage, overrun.attempt) == (hook.name, "after_synthesis", 1)
    assert gauge(metric_reader, OVERRUNS_METRIC).get(labels) == 1

    hook.release.set()  # the blocking call returns
    [run] = await hook.attempts.all_ended()
    # Stopped as soon as the blocking call returned: not one more Python step.
    assert (run.completed, run.ticks) == (False, []) and run.raised is not None, run
    await until(lambda: not [o for o in running_overruns() if o.workflow_id == out.workflow_id])
    assert gauge(metric_reader, OVERRUNS_METRIC).get(labels) == 0


@pytest.mark.parametrize(
    ("path", "policy"),
    [("batch", FailurePolicy.FAIL_OPEN), ("local", FailurePolicy.FAIL_OPEN), ("activity", FailurePolicy.FAIL_CLOSED)],
)
async def test_an_async_hook_that_swallows_its_cancellation_holds_nothing_and_is_stopped(
    client, tmp_path, path, policy
):
    hook = AsyncSwallows(f"swallows-{path}", PATHS[path][0], policy)
    out, _ = await run_request(client, tmp_path, hook, path)

    assert_outcome_follows_the_policy(out, hook.name, policy)
    runs = await hook.attempts.all_ended()
    assert_never_overlapping(runs)
    for run in runs:
        assert not run.completed and run.raised == "CancelledError", run  # cancelled again, and stopped


async def until(condition, within: float = 5.0) -> None:
    give_up = time.monotonic() + within
    while not condition():
        assert time.monotonic() < give_up, "the worker never saw the stuck call end"
        await asyncio.sleep(0.05)


def gauge(reader, name: str) -> dict[tuple, float]:
    points: dict[tuple, float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        points[tuple(sorted(point.attributes.items()))] = point.value
    return points
