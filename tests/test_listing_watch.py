"""The activities' side of a late stage listing, on a real dev server: an activity that carries the ask
signals its workflow once the listing delay has passed since it was scheduled — while it runs, or as soon
as it starts when it waited that long in its task queue — and an activity that ends before then signals
nothing. (The request workflow's side — which activities carry the ask, what it lists — is tested
through the lifecycle in ``test_ui_story``.)"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.converter import PayloadConverter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.listing_watch import StageListingWatch
from workflows.listing import LIST_STAGE_SIGNAL, LISTING_HEADER


@activity.defn
async def hold(seconds: float) -> None:
    await asyncio.sleep(seconds)


@workflow.defn(sandboxed=False)
class AskingWorkflow:
    """Schedules one ``hold`` on ``queue``, asking (as the request workflow does) to be told once ``delay``
    has passed; returns how many asks arrived before the hold ended."""

    def __init__(self) -> None:
        self._ask: Payload | None = None
        self._asked = 0

    @workflow.signal(name=LIST_STAGE_SIGNAL)
    def list_stage(self) -> None:
        self._asked += 1

    def listing_header(self) -> Payload | None:
        return self._ask

    @workflow.run
    async def run(self, delay: float, held: float, queue: str) -> int:
        self._ask = PayloadConverter.default.to_payload({"after_seconds": delay, "listing": 0})
        await workflow.execute_activity(hold, held, task_queue=queue, start_to_close_timeout=timedelta(seconds=30))
        return self._asked


def _worker(
    client: Client, queue: str, *, workflows: bool = True, activities: bool = True, workflow: type | None = None
) -> Worker:
    """A worker with the watch: ``AskingWorkflow`` (or ``workflow``) and ``hold``, or either alone."""
    return Worker(
        client,
        task_queue=queue,
        workflows=[workflow or AskingWorkflow] if workflows else [],
        activities=[hold] if activities else [],
        workflow_runner=UnsandboxedWorkflowRunner(),
        interceptors=[StageListingWatch(client)],
    )


async def _asks(client: Client, workflow_id: str) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return sum(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == LIST_STAGE_SIGNAL
        for e in history.events
    )


@pytest.mark.parametrize(
    ("delay", "held", "asks"),
    [(5.0, 0.1, 0), (0.3, 2.0, 1)],
    ids=["ends-before-the-delay-asks-nothing", "still-running-after-the-delay-asks-once"],
)
async def test_an_activity_asks_once_it_has_run_for_the_delay(client: Client, delay: float, held: float, asks: int):
    queue = f"listing-watch-{uuid.uuid4().hex[:8]}"
    workflow_id = f"asking-{uuid.uuid4()}"
    async with _worker(client, queue):
        asked = await client.execute_workflow(
            AskingWorkflow.run, args=[delay, held, queue], id=workflow_id, task_queue=queue
        )

    assert asked == asks and await _asks(client, workflow_id) == asks


async def test_an_activity_that_starts_after_the_delay_asks_as_it_starts(client: Client):
    # The hold waits in a task queue no worker polls for longer than the delay; once a worker takes it,
    # it asks at once, though it runs for less than the delay itself.
    queue, tools = f"listing-watch-{uuid.uuid4().hex[:8]}", f"listing-tools-{uuid.uuid4().hex[:8]}"
    workflow_id = f"asking-{uuid.uuid4()}"
    async with _worker(client, queue, activities=False):
        handle = await client.start_workflow(
            AskingWorkflow.run, args=[1.0, 0.5, tools], id=workflow_id, task_queue=queue
        )
        await asyncio.sleep(2.0)
        async with _worker(client, tools, workflows=False):
            asked = await handle.result()

    assert asked == 1 and await _asks(client, workflow_id) == 1


async def test_an_activity_without_the_ask_runs_as_it_would(client: Client):
    # Any other workflow's activities (no listing_header) pass through the watch untouched.
    queue = f"listing-watch-{uuid.uuid4().hex[:8]}"
    workflow_id = f"plain-{uuid.uuid4()}"
    async with _worker(client, queue, workflow=PlainWorkflow):
        await client.execute_workflow(PlainWorkflow.run, args=[queue], id=workflow_id, task_queue=queue)

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert len(scheduled) == 1
    assert LISTING_HEADER not in scheduled[0].activity_task_scheduled_event_attributes.header.fields
    assert await _asks(client, workflow_id) == 0


@workflow.defn(sandboxed=False)
class PlainWorkflow:
    @workflow.run
    async def run(self, queue: str) -> None:
        await workflow.execute_activity(hold, 0.6, task_queue=queue, start_to_close_timeout=timedelta(seconds=30))
