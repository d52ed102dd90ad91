"""A worker that dies under a hook is an infrastructure event, not the hook's verdict.

Worker processes (``python worker.py``) run the required after-planning gate, which kills its own
process (SIGKILL) the first times it runs; a supervisor keeps one worker alive, as an orchestrator
would. The lost worker is found by its missing heartbeats within seconds, the invocation is dispatched
again without spending the hook's attempts, and the request ends as the gate decides — or, when every
dispatch loses its worker, in the infrastructure error ``WorkerLost``, never ``RequiredAfterPlanningError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Replayer

from workflows import WORKFLOWS
from workflows.models import ExecutionRecord, InvocationOutcome, RequestInput, RequestResult, RequestStatus, Stage

from .conftest import with_payload_store
from .doubles import decision

ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def supervised_workers(client: Client, state: Path, queue: str, **env: str):
    """Keep one ``worker.py`` process polling ``queue``, starting a new one whenever it dies; yields the
    list of process ids that ran."""
    environment = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": queue,
        "AGENT_STATE_DIR": str(state),
        "AGENT_PIPELINE": "tests.worker_pipelines:crashing_gate",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    pids: list[int] = []
    current: list[asyncio.subprocess.Process] = []

    async def supervise() -> None:
        while True:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "worker.py",
                cwd=ROOT,
                env=environment,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
            current[:] = [process]
            pids.append(process.pid)
            await process.wait()

    supervisor = asyncio.create_task(supervise())
    try:
        yield pids
    finally:
        supervisor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor
        for process in current:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def run_request(
    client: Client, queue: str
) -> tuple[RequestResult | None, BaseException | None, ExecutionRecord, object]:
    handle = await client.start_workflow(
        "RequestLifecycle",
        RequestInput(request="What is the price of ACME?"),
        id=f"crash-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
        result_type=RequestResult,
    )
    result = failure = None
    try:
        result = await asyncio.wait_for(handle.result(), timeout=90)
    except WorkflowFailureError as err:
        failure = err.cause
    history = await handle.fetch_history()
    record = await handle.query("execution_record", result_type=ExecutionRecord)
    replayed = await Replayer(workflows=WORKFLOWS, data_converter=client.data_converter).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None
    return result, failure, record, history


async def test_three_workers_dying_under_the_required_hook_do_not_decide_the_request(client, tmp_path):
    queue = f"crash-{uuid.uuid4()}"
    client = with_payload_store(client, tmp_path)
    async with supervised_workers(
        client, tmp_path, queue, AGENT_TEST_CRASHES="3", AGENT_TEST_GATE_ATTEMPTS="3"
    ) as pids:
        result, failure, record, _ = await run_request(client, queue)

    assert failure is None, failure
    assert "ACME is trading at" in result.response
    assert len(pids) >= 4  # three workers died under the gate; a fourth finished the request
    [gate] = record.invocations(Stage.AFTER_PLANNING)
    assert gate.outcome is InvocationOutcome.SUCCEEDED and decision(gate) == ("fail_closed", "continue", "accepted")
    # Three crashes spent one dispatch's three attempts: the dispatch was lost, the next one decided. The
    # record has each: the first two found by the attempts after them, the last one as the lost dispatch.
    assert gate.worker_losses == 1
    assert [(w.activity, w.dispatch, w.attempt) for w in record.worker_losses] == [
        ("after_planning_hook", 1, 1),
        ("after_planning_hook", 1, 2),
        ("after_planning_hook", 1, None),
    ]
    assert record.status is RequestStatus.SUCCEEDED and record.error is None


async def test_a_hook_that_kills_every_worker_ends_in_worker_lost_not_in_a_policy_verdict(client, tmp_path):
    queue = f"crash-{uuid.uuid4()}"
    env = {"AGENT_TEST_CRASHES": "1000", "AGENT_TEST_GATE_ATTEMPTS": "1", "AGENT_TEST_WORKER_LOSSES": "2"}
    client = with_payload_store(client, tmp_path)
    async with supervised_workers(client, tmp_path, queue, **env):
        result, failure, record, history = await run_request(client, queue)

    assert result is None
    assert failure.type == "WorkerLost" and failure.non_retryable
    [gate] = record.invocations(Stage.AFTER_PLANNING)
    assert gate.outcome is InvocationOutcome.WORKER_LOST and gate.worker_losses == 2
    assert decision(gate) == ("fail_closed", "terminate", "worker_lost")
    assert record.error.type == "WorkerLost" and record.status is RequestStatus.FAILED
    assert "execute_tool_step" not in str(history.to_json())  # no tool ran


async def test_a_worker_killed_under_an_attempt_is_recorded_and_the_attempt_given_back(client, tmp_path):
    """Two attempts: the first loses its worker (SIGKILL), the second, on another worker, finds that and
    says so, then fails. The attempts ran out, but only one of them was the gate's: the call is dispatched
    again with one attempt, which decides."""
    queue = f"crash-{uuid.uuid4()}"
    env = {"AGENT_TEST_CRASHES": "1", "AGENT_TEST_GATE_FAILURES": "1", "AGENT_TEST_GATE_ATTEMPTS": "2"}
    client = with_payload_store(client, tmp_path)
    async with supervised_workers(client, tmp_path, queue, **env):
        result, failure, record, history = await run_request(client, queue)

    assert failure is None, failure  # without the attempt given back: RequiredAfterPlanningError
    assert "ACME is trading at" in result.response
    [gate] = record.invocations(Stage.AFTER_PLANNING)
    assert gate.outcome is InvocationOutcome.SUCCEEDED and decision(gate) == ("fail_closed", "continue", "accepted")
    [loss] = record.worker_losses
    assert (loss.activity, loss.summary, loss.dispatch, loss.attempt) == (
        "after_planning_hook",
        "after_planning · crashing-gate",
        1,
        1,
    )
    assert loss.activity_id and gate.worker_losses == 0  # an attempt was lost, no dispatch
    assert scheduled_summaries(history, "after_planning_hook") == [
        "after_planning · crashing-gate",
        "after_planning · crashing-gate · dispatch 2 (1 attempt lost)",
    ]
    assert (tmp_path / "crashes").read_text() == "3"  # killed, failed, accepted


def scheduled_summaries(history, activity_type: str) -> list[str]:
    """The summaries of the activities of ``activity_type`` the history scheduled, in order."""
    from temporalio.api.enums.v1 import EventType

    from workflows import data_converter

    found = []
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        if event.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
            found.append(data_converter.payload_converter.from_payload(event.user_metadata.summary, str))
    return found


@pytest.mark.parametrize("start_to_close,ceiling,expected", [(20.0, 5.0, 5.0), (4.0, 5.0, 2.0), (1.5, 5.0, None)])
def test_the_heartbeat_timeout_is_short_enough_to_tell_a_lost_worker_from_a_slow_hook(
    start_to_close, ceiling, expected
):
    from datetime import timedelta

    from workflows.dispatch import heartbeat_timeout

    found = heartbeat_timeout(timedelta(seconds=start_to_close), timedelta(seconds=ceiling))
    assert (found.total_seconds() if found else None) == expected


async def test_a_worker_killed_while_turns_are_queued_leaves_the_conversation_in_order(client, tmp_path):
    import json
    import signal as signals

    from client.api import AgentClient
    from client.settings import Settings

    queue = f"conv-crash-{uuid.uuid4()}"
    client = with_payload_store(client, tmp_path)
    agents = AgentClient(client, Settings(task_queue=queue, state_dir=tmp_path))
    conversation = f"crash-{uuid.uuid4().hex[:8]}"
    async with supervised_workers(client, tmp_path, queue, AGENT_PIPELINE="tests.worker_pipelines:slow_turns") as pids:
        accepted = [await agents.submit_turn(conversation, f"turn {n}") for n in range(1, 5)]
        async with asyncio.timeout(60):  # the first turn's tool is running, three turns queued
            while not (tmp_path / "spans.jsonl").exists():
                turns = await agents.turns(conversation)
                if turns.running is not None and len(turns.queued) == 3:
                    await asyncio.sleep(0.5)
                    break
                await asyncio.sleep(0.1)
        killed = pids[-1]
        os.kill(killed, signals.SIGKILL)
        answers = [await asyncio.wait_for(agents.turn_result(turn), 120) for turn in accepted]
        async with asyncio.timeout(30):
            while len((turns := await agents.turns(conversation)).done) < 4:
                await asyncio.sleep(0.1)
        histories = [await client.get_workflow_handle(t.workflow_id).fetch_history() for t in accepted]
        histories.append(await client.get_workflow_handle(f"conversation-{conversation}").fetch_history())

    assert len(pids) >= 2 and all(a.response for a in answers)
    spans = sorted(
        (json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()), key=lambda s: s["started"]
    )
    # Every turn ran its tool to the end once, in the order the turns were accepted, one at a time.
    assert [s["request_id"] for s in spans] == [t.workflow_id for t in accepted]
    assert all(a["ended"] <= b["started"] for a, b in zip(spans, spans[1:], strict=False))
    assert [(t.turn, t.status) for t in turns.done] == [(n, "succeeded") for n in range(1, 5)]
    replayer = Replayer(workflows=WORKFLOWS, data_converter=client.data_converter)
    for history in histories:
        assert (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
