"""Progress carried by heartbeats, on a real Temporal server: what an attempt reports reaches the server
while it runs (soon after the report, not an interval later) and reaches the next attempt when the
attempt fails right after the report."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.heartbeat import heartbeat_interval, heartbeating, report_progress

# Long enough that no background beat falls within a test: whatever the server sees came from a report.
HEARTBEAT_TIMEOUT = timedelta(seconds=40)
_released = asyncio.Event()


@activity.defn(name="report_then_wait")
@heartbeating
async def report_then_wait(progress: str) -> str:
    report_progress({"done": progress})
    await _released.wait()
    return progress


@activity.defn(name="report_then_fail_once")
@heartbeating
async def report_then_fail_once(progress: str) -> Any:
    if activity.info().attempt == 1:
        report_progress({"done": progress})
        raise ApplicationError("the first attempt fails at once", type="FirstAttemptFails")
    return {"attempt": activity.info().attempt, "read": list(activity.info().heartbeat_details)}


@activity.defn(name="interval_of_this_attempt")
@heartbeating
async def interval_of_this_attempt() -> float | None:
    return heartbeat_interval()


@workflow.defn(name="HeartbeatProbe")
class HeartbeatProbe:
    @workflow.run
    async def run(self, activity_name: str, progress: str) -> Any:
        return await workflow.execute_activity(
            activity_name,
            *([progress] if progress else []),
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=50), maximum_attempts=3),
        )


def _worker(client: Client, queue: str) -> Worker:
    return Worker(
        client,
        task_queue=queue,
        workflows=[HeartbeatProbe],
        activities=[report_then_wait, report_then_fail_once, interval_of_this_attempt],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def test_the_background_beat_would_come_only_an_interval_later(client):
    queue = f"heartbeats-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        interval = await client.execute_workflow(
            HeartbeatProbe.run, args=["interval_of_this_attempt", ""], id=f"hb-{uuid.uuid4()}", task_queue=queue
        )
    assert interval == HEARTBEAT_TIMEOUT.total_seconds() / 4  # what makes the next test's timing meaningful


async def test_progress_reported_by_a_running_attempt_reaches_the_server_soon_after_the_report(client):
    queue = f"heartbeats-{uuid.uuid4().hex[:8]}"
    _released.clear()
    async with _worker(client, queue):
        handle = await client.start_workflow(
            HeartbeatProbe.run, args=["report_then_wait", "three quotes"], id=f"hb-{uuid.uuid4()}", task_queue=queue
        )
        started = time.monotonic()
        details: list[Any] = []
        # The report is sent PROGRESS_DELAY after it is made; the background beat alone would take 10 s.
        while time.monotonic() - started < 8.0 and not details:
            description = await handle.describe()
            for pending in description.raw_description.pending_activities:
                if pending.heartbeat_details.payloads:
                    details = await client.data_converter.decode(pending.heartbeat_details.payloads)
            await asyncio.sleep(0.05)
        _released.set()
        assert await handle.result() == "three quotes"
    assert details == [{"done": "three quotes"}]


async def test_an_attempt_that_fails_right_after_its_report_leaves_it_to_the_next_attempt(client):
    queue = f"heartbeats-{uuid.uuid4().hex[:8]}"
    async with _worker(client, queue):
        result = await client.execute_workflow(
            HeartbeatProbe.run,
            args=["report_then_fail_once", "one model call"],
            id=f"hb-{uuid.uuid4()}",
            task_queue=queue,
        )
    # The failure came well within PROGRESS_DELAY of the report: the failing attempt sent it itself.
    assert result == {"attempt": 2, "read": [{"done": "one model call"}]}


def test_progress_outside_an_activity_is_not_kept():
    report_progress({"done": "nothing"})  # no activity: nothing to carry it, and no error either
