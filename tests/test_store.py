"""The execution store's contract on its own: revision gating, retention, concurrent writers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from activities.store import SQLiteExecutionStore
from workflows.models import ExecutionRecord, RequestStatus


def _record(
    revision: int, *, status: RequestStatus = RequestStatus.SUCCEEDED, run_id: str = "run-1", response: str = ""
) -> ExecutionRecord:
    return ExecutionRecord(
        request_id="req-1",
        workflow_id="request-req-1",
        run_id=run_id,
        request="What is the price of ACME?",
        status=status,
        record_revision=revision,
        started_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=int(run_id[-1])),
        final_response=response,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_stale_or_equal_revision_never_replaces_a_newer_one(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    assert await store.save(_record(2, response="second")) == (2, True)
    assert await store.save(_record(1, response="first")) == (2, False)
    assert await store.save(_record(2, response="again")) == (2, False)
    assert (await store.get("req-1")).final_response == "second"
    assert await store.save(_record(3, response="third")) == (3, True)
    assert (await store.get("request-req-1")).final_response == "third"


async def test_concurrent_writers_leave_the_newest_revision(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    revisions = list(range(1, 41))
    results = await asyncio.gather(*(store.save(_record(r, response=f"r{r}")) for r in reversed(revisions)))
    assert all(stored <= 40 for stored, _ in results)
    final = await store.get("req-1")
    assert final.record_revision == 40 and final.final_response == "r40"


async def test_runs_of_one_workflow_id_are_kept_apart_and_newest_is_read(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    await store.save(_record(5, run_id="run-1", response="old run"))
    assert await store.save(_record(1, run_id="run-2", response="new run")) == (1, True)
    assert (await store.get("req-1")).final_response == "new run"


async def test_normal_and_error_retention_are_separate(tmp_path):
    clock = Clock()
    store = SQLiteExecutionStore(
        tmp_path / "x.sqlite3", retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock
    )
    ok = _record(1, run_id="run-1")
    failed = _record(1, run_id="run-2", status=RequestStatus.FAILED).model_copy(
        update={"request_id": "req-2", "workflow_id": "request-req-2"}
    )
    await store.save(ok)
    await store.save(failed)
    clock.now += 2 * 3600
    assert await store.get("req-1") is None
    assert (await store.get("req-2")).status is RequestStatus.FAILED
    clock.now += 4 * 3600
    assert await store.get("req-2") is None
    # Expired rows are purged on the next write, not just hidden.
    await store.save(_record(1, run_id="run-3").model_copy(update={"request_id": "req-3", "workflow_id": "w3"}))
    assert [r.request_id for r in await store.recent()] == ["req-3"]
