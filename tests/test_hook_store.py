"""The declared hooks' store against both backends, with several workers (each its own store: its own
connection or pool) at once: an audit row once per dedup key, a breaker that trips once and blocks on every
worker until an operator enables it, a tenant budget whose concurrent deductions total exactly, a per-turn
call cap that holds under concurrent calls."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from hooks.declarative import HookStore, parse_hooks
from hooks.declarative.store import ExecutionRow
from storage.postgres import Database

StoreFactory = Callable[..., HookStore]
WORKERS = 6


@pytest.fixture(params=["sqlite", "postgres"])
def make_store(request, tmp_path) -> Iterator[StoreFactory]:
    """``make_store(**options)``: another worker's hook store on this test's database or file."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    databases: list[Database] = []

    def make(**options: Any) -> HookStore:
        if url is None:
            return HookStore(tmp_path / "hooks.sqlite3", **options)
        databases.append(Database(url, pool_size=2))
        return HookStore(databases[-1], **options)

    yield make
    for database in databases:
        database.close_sync()


def at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def row(n: int, *, decision: str = "block", hook_id: str = "guard") -> ExecutionRow:
    return ExecutionRow(
        dedup_key=f"wf/run/act-{n}/{hook_id}",
        hook_id=hook_id,
        hook_label=hook_id,
        hook_version=1,
        event="pre_tool_use",
        handler_type="command",
        decision=decision,
        reason="rm is not allowed",
        status="completed",
        duration_ms=1.5,
        workflow_id="wf",
        metadata={"n": n},
    )


def registered(make_store: StoreFactory, **options: Any) -> list[HookStore]:
    stores = [make_store(**options) for _ in range(WORKERS)]
    [spec] = parse_hooks({"hooks": [{"id": "guard", "event": "pre_tool_use", "handler_type": "command",
                                     "config": {"command": "true"}}]})  # fmt: skip
    stores[0].register(spec)
    return stores


def test_an_audit_row_written_by_every_worker_at_once_is_kept_once(make_store):
    stores = registered(make_store, breaker_threshold=1000)
    at_once([lambda s=s, n=n: s.record_execution(row(n % 10), counts_as_block=True) for n, s in enumerate(stores * 5)])
    rows = stores[-1].executions(limit=1000)
    assert sorted(r.dedup_key for r in rows) == sorted(row(n).dedup_key for n in range(10))
    assert rows[0].metadata is not None and rows[0].hook_id == "guard"


def test_a_breaker_trips_once_under_concurrent_blocks_and_blocks_on_every_worker_until_enabled(make_store):
    stores = registered(make_store, breaker_threshold=5)
    tripped = at_once(
        [lambda s=s, n=n: s.record_execution(row(n), counts_as_block=True) for n, s in enumerate(stores * 4)]
    )
    assert sum(tripped) == 1  # exactly one write tripped it
    assert all(not s.state("guard").enabled for s in stores)
    assert [e["action"] for e in stores[3].breaker_events("guard")] == ["trip"]
    assert stores[1].enable("guard", actor="alice")
    assert all(s.state("guard").enabled for s in stores)
    assert [e["action"] for e in stores[4].breaker_events("guard")] == ["trip", "reset"]


def test_concurrent_budget_deductions_total_exactly(make_store):
    stores = [make_store() for _ in range(WORKERS)]
    stores[0].set_budget("t1", 10_000)
    charges = at_once([lambda s=s: s.charge_budget("t1", 37) for s in stores * 8])
    assert stores[2].budget_remaining("t1") == (10_000 - 37 * WORKERS * 8, 10_000)
    assert sorted(c.remaining for c in charges) == [10_000 - 37 * n for n in range(WORKERS * 8, 0, -1)]


def test_the_per_turn_cap_holds_under_concurrent_calls(make_store):
    stores = [make_store() for _ in range(WORKERS)]
    taken = at_once([lambda s=s: s.take_turn_invocation("judge", "wf/run", 3) for s in stores * 3])
    assert sum(allowed for allowed, _ in taken) == 3
    assert stores[0].take_turn_invocation("judge", "wf/run", 3) == (False, 3)


def test_a_prompt_decision_cached_by_one_worker_is_read_by_another(make_store):
    writer, reader = make_store(), make_store()
    writer.cache_decision("k", "judge", {"decision": "allow"}, ttl_seconds=60)
    assert reader.cached_decision("k") == {"decision": "allow"}
    assert reader.cached_decision("other") is None
