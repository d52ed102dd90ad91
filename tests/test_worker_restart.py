"""A worker killed while a request waits at a checkpoint: the request survives on the server, and a fresh
worker finishes it after approval, sending the message exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from client.settings import Settings
from demo.pipeline import demo_hooks, demo_memory
from storage.executions import SQLiteExecutionStore
from workflows.models import Checkpoint, RequestInput, RequestResult

from .conftest import with_payload_store
from .doubles import eventually
from .harness import Harness

ROOT = Path(__file__).resolve().parent.parent


def _started_identities(history, activity_type: str) -> list[str]:
    types = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    return [
        e.activity_task_started_event_attributes.identity
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and types[e.activity_task_started_event_attributes.scheduled_event_id] == activity_type
    ]


async def test_a_fresh_worker_finishes_a_request_whose_worker_was_killed_at_its_checkpoint(client, dev_env, tmp_path):
    state = tmp_path / "state"
    queue = f"restart-{uuid.uuid4()}"
    client = with_payload_store(client, state)  # the worker below sends large payloads by reference there
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": queue,
        "AGENT_STATE_DIR": str(state),
        "PYTHONUNBUFFERED": "1",
    }
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "worker.py",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    output: list[str] = []

    async def read_output() -> None:
        async for line in worker.stdout:
            output.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read_output())
    handle = None
    try:

        async def polling() -> bool:
            assert worker.returncode is None, "".join(output)
            return any("worker polling" in line for line in output)

        await eventually(polling, timeout=60, what="the worker subprocess to poll")

        workflow_id = f"restart-{uuid.uuid4().hex[:8]}"
        handle = await client.start_workflow(
            "RequestLifecycle",
            RequestInput(request="Send a message to bob"),
            id=workflow_id,
            task_queue=queue,
            result_type=RequestResult,
        )

        async def checkpoint_opened() -> Checkpoint | None:
            return await handle.query("pending_checkpoint", result_type=Checkpoint | None)

        checkpoint = await eventually(checkpoint_opened, timeout=60, what="the checkpoint")
        assert [(r.step_id, r.tool) for r in checkpoint.reasons] == [("notify", "notify-service/send_message")]
        assert checkpoint.plan.steps[0].arguments == {"to": "bob", "text": "Send a message to bob"}

        # The subprocess worker persisted the suspended record before it dies.
        store = SQLiteExecutionStore(state / "executions.sqlite3")

        async def persisted_suspended():
            record = await store.get(workflow_id)
            return (
                record
                if record is not None and record.lifecycle and record.lifecycle.boundary.value == "checkpoint_opened"
                else None
            )

        suspended = await eventually(persisted_suspended, timeout=30, what="the suspended record")
        assert suspended.status.value == "suspended" and suspended.request_completion == "pending"

        worker.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(worker.wait(), 30) == -signal.SIGKILL
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert not (state / "outbox.jsonl").exists()

        # A fresh worker (in-process, the demo pipeline on the same state) on the same task queue.
        async with Harness(
            client,
            state,
            hooks=demo_hooks(Settings(state_dir=state), demo_memory(Settings(state_dir=state))),
            pipeline="demo",
            task_queue=queue,
        ) as h:
            await handle.signal(
                "approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops-lead", "comment": "go ahead"}
            )
            out = await h.finish(handle)

            # Let the audit hook's detached child finish on this worker before it stops.
            async def audit_done():
                record = await h.store.get(workflow_id)
                effect = record.effect("audit-write") if record else None
                return effect if effect is not None and effect.status.value != "pending" else None

            audit = await eventually(audit_done, timeout=60, what="the detached audit write")
    finally:
        if worker.returncode is None:
            worker.kill()
            await asyncio.wait_for(worker.wait(), 30)
        await asyncio.wait_for(reader, 30)
        if handle is not None and (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await handle.terminate("test cleanup")

    assert out.failure is None, out.failure
    assert out.result.response == "Message sent to bob."
    entries = [json.loads(line) for line in (state / "outbox.jsonl").read_text().splitlines() if line.strip()]
    assert [(m["to"], m["text"]) for m in entries] == [("bob", "Send a message to bob")]  # exactly once
    assert [a.summary for a in out.tool_activities] == ["execute · notify-service/send_message (notify)"]
    assert out.activity_types().count("after_planning_hook") == 1  # not run again by the fresh worker

    # The plan was made by the killed worker; the message was sent by the fresh one.
    assert all(i.startswith(f"{worker.pid}@") for i in _started_identities(out.history, "plan"))
    [sent_by] = _started_identities(out.history, "execute_tool_step")
    assert sent_by.startswith(f"{os.getpid()}@")

    [decided] = out.record.checkpoints
    assert (decided.checkpoint_id, decided.status.value, decided.reviewer) == (
        checkpoint.checkpoint_id,
        "approved",
        "ops-lead",
    )
    stored = await out.stored()
    assert stored.status.value == "succeeded" and stored.request_completion == "completed"
    assert stored.checkpoints[0].status.value == "approved"
    assert audit.status.value == "succeeded"
