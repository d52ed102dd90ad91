"""The execution store's contract, run against both backends — the SQLite file and PostgreSQL (a real
server: the session's throwaway cluster) — the same way: revision gating, retention, effect updates
accepted once, and the same totals when many workers (each its own connection or pool) write at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from storage.executions import ExecutionStore, PostgresExecutionStore, SQLiteExecutionStore
from storage.executions.postgres import MIGRATIONS
from storage.postgres import Database, DatabaseUnavailable
from workflows.models import EffectStatus, ExecutionRecord, PipelineHookEffect, RequestStatus

from .conftest import Backend
from .postgres_cluster import Cluster


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


StoreFactory = Callable[..., ExecutionStore]


@pytest.fixture
def make_store(backend: Backend) -> StoreFactory:
    """``make_store(**options)``: a store on this test's database; each call is another worker's (its
    own connection, or its own pool)."""

    def make(**options: Any) -> ExecutionStore:
        if backend.postgres:
            return PostgresExecutionStore(backend.database(), **options)
        return SQLiteExecutionStore(backend.file("x.sqlite3"), **options)

    return make


def effect(effect_id: str = "audit-write", status: EffectStatus = EffectStatus.SUCCEEDED) -> PipelineHookEffect:
    return PipelineHookEffect(effect_id=effect_id, name="Audit write", hook="audit", status=status)


async def test_a_stale_or_equal_revision_never_replaces_a_newer_one(make_store):
    store = make_store()
    assert await store.save(_record(2, response="second")) == (2, True)
    assert await store.save(_record(1, response="first")) == (2, False)
    assert await store.save(_record(2, response="again")) == (2, False)
    assert (await store.get("req-1")).final_response == "second"
    assert await store.save(_record(3, response="third")) == (3, True)
    assert (await store.get("request-req-1")).final_response == "third"


async def test_concurrent_writers_leave_the_newest_revision(make_store):
    store = make_store()
    revisions = list(range(1, 41))
    results = await asyncio.gather(*(store.save(_record(r, response=f"r{r}")) for r in reversed(revisions)))
    assert all(stored <= 40 for stored, _ in results)
    final = await store.get("req-1")
    assert final.record_revision == 40 and final.final_response == "r40"


async def test_runs_of_one_workflow_id_are_kept_apart_and_newest_is_read(make_store):
    store = make_store()
    await store.save(_record(5, run_id="run-1", response="old run"))
    assert await store.save(_record(1, run_id="run-2", response="new run")) == (1, True)
    assert (await store.get("req-1")).final_response == "new run"


async def test_normal_and_error_retention_are_separate(make_store):
    clock = Clock()
    store = make_store(retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock)
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


async def test_an_effect_update_is_accepted_once_and_a_later_snapshot_cannot_hide_it(make_store):
    store = make_store()
    pending = effect(status=EffectStatus.PENDING)
    await store.save(_record(1).model_copy(update={"effects": [pending]}))

    first, again = (
        await store.update_effect("request-req-1", "run-1", effect()),
        await store.update_effect("request-req-1", "run-1", effect(status=EffectStatus.FAILED)),
    )
    assert (first, again) == ((2, True), (2, False))
    assert await store.save(_record(2).model_copy(update={"effects": [pending]})) == (3, True)
    stored = await store.get("req-1")
    assert stored is not None and stored.record_revision == 3
    assert [(e.effect_id, e.status) for e in stored.effects] == [("audit-write", EffectStatus.SUCCEEDED)]
    with pytest.raises(ValueError, match="must be terminal"):
        await store.update_effect("request-req-1", "run-1", effect("other", EffectStatus.PENDING))


async def test_many_workers_writing_at_once_leave_the_newest_snapshot_and_each_effect_once(make_store):
    workers = [make_store() for _ in range(4)]
    await workers[0].save(_record(1))
    saves = [w.save(_record(r, response=f"r{r}")) for r in range(2, 42) for w in workers[r % 2 :: 2][:1]]
    updates = [w.update_effect("request-req-1", "run-1", effect(f"e{n % 10}")) for n, w in enumerate(workers * 10)]
    results = await asyncio.gather(*saves, *updates)

    accepted = [written for _, written in results[len(saves) :]]
    assert sum(accepted) == 10  # each of the ten effects accepted by exactly one worker
    final = await workers[3].get("req-1")
    assert final is not None and final.final_response == "r41"
    assert final.record_revision == 41 + 10 and len(final.effects) == 10


async def test_retention_sweeps_run_from_every_worker_at_once(make_store):
    clock = Clock()
    workers = [make_store(retention=timedelta(hours=1), clock=clock) for _ in range(4)]
    for n in range(40):
        await workers[0].save(
            _record(1, run_id=f"run-{n % 10}").model_copy(update={"workflow_id": f"w{n}", "request_id": f"q{n}"})
        )
    clock.now += 2 * 3600
    fresh = [
        _record(1, run_id="run-1").model_copy(update={"workflow_id": f"new{n}", "request_id": f"new{n}"})
        for n in range(4)
    ]
    assert all(
        written for _, written in await asyncio.gather(*(w.save(r) for w, r in zip(workers, fresh, strict=True)))
    )
    await workers[1].save(fresh[0].model_copy(update={"record_revision": 2}))  # a later sweep finishes the job
    assert sorted(r.request_id for r in await workers[2].recent(100)) == ["new0", "new1", "new2", "new3"]


# --------------------------------------------------------------------------------------------------
# PostgreSQL only: the schema
# --------------------------------------------------------------------------------------------------


async def test_workers_starting_at_once_migrate_the_schema_once(postgres_url):
    databases = [Database(postgres_url, pool_size=2) for _ in range(6)]
    try:
        applied = await asyncio.gather(*(d.migrate(MIGRATIONS) for d in databases))
        assert sorted(len(a) for a in applied) == [0, 0, 0, 0, 0, 1]  # one worker applied it, the others found it
        assert await Database(postgres_url).migrate(MIGRATIONS) == []  # a restart applies nothing
        async with databases[0].transaction() as conn:
            cursor = await conn.execute("SELECT component, version FROM agent_schema_migrations")
            assert await cursor.fetchall() == [("executions", 1)]
    finally:
        for database in databases:
            await database.close()


async def test_an_unreachable_database_is_a_clear_error_without_the_password(postgres_cluster: Cluster):
    url = postgres_cluster.url().replace("agent@", "agent:s3cret@").replace(str(postgres_cluster.port), "1")
    store = PostgresExecutionStore(Database(url, open_timeout_seconds=1))
    with pytest.raises(DatabaseUnavailable) as caught:
        await store.get("req-1")
    assert "127.0.0.1:1/postgres" in str(caught.value) and "s3cret" not in str(caught.value)


async def test_a_window_lists_runs_by_start_time_tenant_and_agent_oldest_first(make_store):
    store = make_store()
    start = datetime(2026, 11, 1, tzinfo=UTC)
    for n, (tenant, agent) in enumerate([("t1", "a1"), ("t2", "a1"), ("t1", "a2"), ("t1", "a1")]):
        record = _record(1, run_id=f"run-{n}").model_copy(
            update={
                "workflow_id": f"request-{n}",
                "request_id": f"req-{n}",
                "started_at": start + timedelta(hours=n),
                "metadata": {"tenant_id": tenant, "agent_id": agent},
            }
        )
        await store.save(record)
    everything = await store.window()
    assert everything == [(f"request-{n}", f"run-{n}") for n in range(4)]
    assert await store.window(start + timedelta(hours=1), start + timedelta(hours=3)) == [
        ("request-1", "run-1"),
        ("request-2", "run-2"),
    ]
    assert await store.window(tenant="t1") == [("request-0", "run-0"), ("request-2", "run-2"), ("request-3", "run-3")]
    assert await store.window(tenant="t1", agent="a1", limit=1) == [("request-0", "run-0")]
    assert (await store.get_run("request-2", "run-2")).metadata["agent_id"] == "a2"
