"""No request ends without its stored record, through a real Temporal server.

Text no database takes as it is — NUL in the request's message, its metadata (keys too), a hook's
enrichment and an effect's data — is stored on SQLite and on PostgreSQL, and the record reads back
exactly as the workflow holds it. A lone surrogate, which Temporal's JSON cannot carry into a request at
all, is refused at the door with ``InvalidRequest`` before anything runs. A store that is down for a moment
is waited for; one that stays down, or refuses the write, fails the request with the non-retryable
``RecordNotStored`` — before any tool runs when the accepted plan could not be stored, and in place of
its success when the terminal snapshot could not be.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid

import psycopg
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.common import RawValue

from storage.executions import PostgresExecutionStore
from storage.postgres import Database
from storage.text import ESCAPE
from workflows import search_attributes as sa
from workflows.models import RequestStatus, StageSettings

from .conftest import Backend
from .harness import Harness
from .postgres_cluster import Cluster
from .test_records import Hold, held, hold_plan

NUL = "\x00"
MESSAGE = f"What is the price of ACME?{NUL} {ESCAPE}u0000 \\u0000"
METADATA = {
    "tenant_id": f"desk{NUL}7",
    f"note{NUL}": [NUL, {ESCAPE: f"{NUL}{NUL}"}],
    "plain": "as it is",
}


class EchoHook:
    """before_planning and after_planning, in process: enriches the request with its own text and reports
    an effect carrying it (the accepted plan's snapshot is written by the hooks' local activity)."""

    name = "echo"

    def before_planning(self, ctx):
        ctx.enrichments["echo"] = ctx.request

    def after_planning(self, ctx, plan):
        ctx.report_effect("echo", name="Echo", status="succeeded", data={f"seen{NUL}": ctx.request}, summary=NUL)
        return plan


def postgres_store(harness: Harness, database: Database) -> None:
    """Point the harness's worker (and its outcomes) at an execution store on ``database``."""
    harness.activities.store = harness.store = PostgresExecutionStore(database)  # type: ignore[assignment]


def failed_workflow_tasks(history) -> int:
    return sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in history.events)


async def test_nul_in_the_message_metadata_and_hook_outputs_is_stored_and_reads_back_exactly(
    client, tmp_path, backend: Backend
):
    h = Harness(client, tmp_path, hooks=[EchoHook()])
    if backend.postgres:
        postgres_store(h, backend.database())
    async with h:
        out = await h.run(MESSAGE, METADATA)

    assert out.failure is None and out.result is not None and "ACME is trading at" in out.result.response
    stored = await out.stored()
    assert stored is not None and stored.status is RequestStatus.SUCCEEDED
    assert stored.request == MESSAGE and stored.metadata == METADATA
    assert stored.enrichments["echo"] == MESSAGE
    effect = stored.effect("echo")
    assert effect is not None and effect.data == {f"seen{NUL}": MESSAGE} and effect.summary == NUL
    assert stored == out.record  # exactly what the workflow holds, every field
    assert await h.store.window(tenant=f"desk{NUL}7") == [(out.workflow_id, out.record.run_id)]


async def test_a_lone_surrogate_is_refused_at_the_door_before_anything_runs(client, tmp_path):
    """Temporal's JSON (pydantic's) cannot carry a lone surrogate: the payload does not decode, and the
    request ends at once in the typed ``InvalidRequest`` — nothing runs, so there is nothing to record."""
    h = Harness(client, tmp_path)
    raw = b'{"request": "What is the price of ACME? \\ud800", "metadata": {"note": "\\udfff"}}'
    async with h:
        handle = await client.start_workflow(
            "RequestLifecycle",
            RawValue(Payload(metadata={"encoding": b"json/plain"}, data=raw)),
            id=f"req-{uuid.uuid4()}",
            task_queue=h.task_queue,
        )
        try:
            await handle.result()
            raise AssertionError("a request with a lone surrogate completed")
        except WorkflowFailureError as err:
            failure = err.cause
        history = await handle.fetch_history()

    assert getattr(failure, "type", None) == "InvalidRequest" and getattr(failure, "non_retryable", False)
    assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert failed_workflow_tasks(history) == 0
    assert await h.store.get(handle.id) is None


async def test_a_store_down_for_a_moment_is_waited_for_and_the_request_completes_recorded(client, tmp_path):
    cluster = Cluster()
    cluster.start()
    try:
        url = cluster.database()
        setup = Database(url)
        await PostgresExecutionStore(setup).migrate()
        await setup.close()
        cluster.stop_server()

        def back_soon() -> None:  # within the write's retries (spaced 1, 2, 4 s)
            time.sleep(2.0)
            cluster.start_server()

        restart = asyncio.get_running_loop().run_in_executor(None, back_soon)
        h = Harness(client, tmp_path, settings=StageSettings(record_write_attempts=5))
        database = Database(url, open_timeout_seconds=1.0)
        postgres_store(h, database)
        async with h:
            out = await h.run("What is the price of ACME?")
        await restart
        assert out.failure is None and out.record.status is RequestStatus.SUCCEEDED
        assert await out.stored() == out.record
        await database.close()
    finally:
        cluster.stop()


async def test_a_store_that_stays_down_fails_the_request_before_any_tool_runs(client, tmp_path):
    cluster = Cluster()
    cluster.start()
    try:
        url = cluster.database()
        cluster.stop_server()  # PostgreSQL stopped, and it stays stopped
        h = Harness(client, tmp_path, settings=StageSettings(record_write_attempts=2))
        database = Database(url, open_timeout_seconds=1.0)
        postgres_store(h, database)
        async with h:
            out = await h.run("What is the price of ACME?")
        await database.close()
    finally:
        cluster.stop()

    failure = out.failure
    assert failure is not None and failure.type == "RecordNotStored" and failure.non_retryable
    details = out.failure_details()
    # The accepted plan was not stored: the request failed there, and its terminal snapshot failed too.
    assert details["boundary"] == "terminal" and details["attempts"] == 2
    assert "DatabaseUnavailable" in details["store_error"]
    assert details["request_error"]["type"] == "RecordNotStored"
    assert "accepted_plan" in details["request_error"]["message"]
    assert not out.tool_activities  # nothing ran that the record would not show
    assert out.record is not None and out.record.status is RequestStatus.FAILED
    assert out.record.error is not None and out.record.error.type == "RecordNotStored"
    assert failed_workflow_tasks(out.history) == 0


async def test_a_dropped_table_fails_the_request_at_once_without_retrying(client, tmp_path, postgres_url):
    h = Harness(client, tmp_path)
    database = Database(postgres_url)
    postgres_store(h, database)
    await h.store.migrate()  # type: ignore[attr-defined]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP TABLE agent_executions")  # gone, and this store never creates it again
    async with h:
        out = await h.run("What is the price of ACME?")
    await database.close()

    assert out.failure is not None and out.failure.type == "RecordNotStored"
    details = out.failure_details()
    assert details["attempts"] == 1 and "UndefinedTable" in details["store_error"]  # refused: not retried
    assert not out.tool_activities
    assert [a.activity_type for a in out.scheduled].count("persist_execution_record") == 2


async def test_a_store_that_refuses_the_terminal_snapshot_fails_the_request_instead_of_completing(client, tmp_path):
    hold = Hold()
    h = Harness(client, tmp_path, tools=[hold], planner=hold_plan())
    async with h:
        handle, accepted = await held(h, hold)
        assert accepted is not None and accepted.lifecycle is not None
        assert accepted.lifecycle.boundary == "accepted_plan"
        # From now on the table takes no write, as a database made read-only would.
        with sqlite3.connect(tmp_path / "executions.sqlite3") as db:
            db.execute(
                "CREATE TRIGGER read_only BEFORE INSERT ON executions BEGIN SELECT RAISE(ABORT, 'read-only'); END"
            )
        hold.release.set()
        out = await h.finish(handle)
        stage, _ = await listed(handle)

    assert out.result is None and out.failure is not None  # the tool ran and answered, yet no success
    assert out.failure.type == "RecordNotStored" and out.failure.non_retryable
    assert out.failure_details()["boundary"] == "terminal"
    assert "read-only" in out.failure_details()["store_error"]
    assert out.tool_activities  # the tool did run: its outcome is in the record the query reads
    live = out.record
    assert live is not None and live.status is RequestStatus.FAILED and live.request_completion == "failed"
    assert live.error is not None and live.error.type == "RecordNotStored"
    stored = await out.stored()  # what the store has is the accepted plan's snapshot, still pending
    assert stored == accepted and stored.request_completion == "pending"
    assert stage == "failed"  # listed as it ended, not as "completed"


async def listed(handle) -> tuple[str | None, bool | None]:
    attrs = (await handle.describe()).typed_search_attributes
    return attrs.get(sa.LIFECYCLE_STAGE), attrs.get(sa.AWAITING_REVIEW)
