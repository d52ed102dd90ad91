"""The declared hooks' store against both backends, with several workers (each its own store: its own
connection or pool) at once: an audit row once per dedup key, a breaker that trips once and blocks on every
worker until an operator enables it, a tenant budget whose concurrent deductions total exactly, a per-turn
call cap that holds under concurrent calls."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
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


# --------------------------------------------------------------------------------------------------
# The breaker's rolling window (an injected clock: seconds after a fixed start)
# --------------------------------------------------------------------------------------------------

START = 1_700_000_000.0


class Clock:
    """The store's clock, set by the test: ``at(seconds)`` after :data:`START`."""

    def __init__(self) -> None:
        self.now = START

    def at(self, seconds: float) -> Clock:
        self.now = START + seconds
        return self

    def __call__(self) -> float:
        return self.now


def record_at(store: HookStore, clock: Clock, seconds: float, n: int, *, decision: str = "block") -> bool:
    clock.at(seconds)
    return store.record_execution(row(n, decision=decision), counts_as_block=decision == "block")


def test_five_blocks_within_a_minute_trip_the_breaker_wherever_their_streak_began(make_store):
    clock = Clock()
    [store] = registered(make_store, clock=clock)[:1]
    # The streak began at 0 s; its last five blocks (30 … 64 s) fall within 34 s of each other.
    tripped = [record_at(store, clock, t, n) for n, t in enumerate([0, 30, 61, 62, 63, 64])]
    assert tripped == [False] * 5 + [True]
    state = store.state("guard")
    assert not state.enabled and state.tripped_at == START + 64
    assert state.recent_blocks == [START + t for t in (30, 61, 62, 63, 64)]
    [trip] = store.breaker_events("guard")
    assert trip["action"] == "trip" and trip["detail"].startswith("5 consecutive blocks/timeouts within 34s")
    # A tripped hook moves no further: another block does not re-trip it.
    assert not record_at(store, clock, 65, 6)
    assert [e["action"] for e in store.breaker_events("guard")] == ["trip"]


def test_an_allow_ends_the_streak_and_five_blocks_spread_over_more_than_a_minute_do_not_trip(make_store):
    clock = Clock()
    store = registered(make_store, clock=clock)[0]
    # 0, 20, 40, 59, then an allow, then 60: the allow ended the streak of four; the block at 60 starts anew.
    assert not any(record_at(store, clock, t, n) for n, t in enumerate([0, 20, 40, 59]))
    assert not record_at(store, clock, 59.5, 4, decision="allow")
    assert store.state("guard").consecutive_blocks == 0 and store.state("guard").recent_blocks == []
    assert not record_at(store, clock, 60, 5)
    assert store.state("guard").enabled and store.state("guard").recent_blocks == [START + 60]
    # Five blocks, the first and the last 61 s apart: the window rolls on without tripping ...
    assert not any(record_at(store, clock, t, n) for n, t in zip(range(6, 10), [70, 80, 90, 121], strict=True))
    assert store.state("guard").consecutive_blocks == 5 and store.state("guard").enabled
    # ... until the last five fall within a minute of each other (70 … 122 s: no, 80 … 122 s: yes).
    assert record_at(store, clock, 122, 10)


def test_five_blocks_exactly_a_minute_apart_trip_it(make_store):
    clock = Clock()
    store = registered(make_store, clock=clock)[0]
    assert [record_at(store, clock, t, n) for n, t in enumerate([0, 20, 40, 59, 60])] == [False] * 4 + [True]


def test_blocks_recorded_by_several_workers_at_once_are_none_of_them_lost(make_store):
    clock = Clock()
    stores = registered(make_store, clock=clock.at(10))
    # Four workers record a block of the same hook at the same moment: each is counted ...
    assert (
        at_once([lambda s=s, n=n: s.record_execution(row(n), counts_as_block=True) for n, s in enumerate(stores[:4])])
        == [False] * 4
    )
    state = stores[5].state("guard")
    assert state.consecutive_blocks == 4 and state.recent_blocks == [START + 10] * 4 and state.enabled
    # ... so the fifth trips it.
    assert record_at(stores[4], clock, 11, 4)


def test_a_streak_recorded_before_the_rolling_window_is_read_as_blocks_at_its_start(make_store, request):
    """A store written by a worker from before the block times were kept: the column is added and the
    streak it counted (three blocks since ``window_started_at``) goes on from there."""
    clock = Clock()
    store = registered(make_store, clock=clock)[0]
    for hook, started in (("guard", START), ("other", START - 50)):
        if hook == "other":
            [other] = parse_hooks({"hooks": [{"id": "other", "event": "pre_tool_use", "handler_type": "command",
                                              "config": {"command": "true"}}]})  # fmt: skip
            store.register(other)
        legacy(
            store, f"UPDATE agent_hooks SET consecutive_blocks = 3, window_started_at = {started} WHERE id = '{hook}'"
        )
    legacy(store, "ALTER TABLE agent_hooks DROP COLUMN recent_blocks")
    legacy(store, "DELETE FROM agent_schema_migrations WHERE component = 'declared_hooks' AND version = 3")

    upgraded = make_store(clock=clock)  # another worker, of this version, opens the store: it migrates
    assert upgraded.state("guard").recent_blocks == [START] * 3
    assert not record_at(upgraded, clock, 20, 1)
    assert record_at(upgraded, clock, 30, 2)  # three at 0 s, then 20 s and 30 s: five within 30 s
    # The other streak began 50 s earlier: its blocks are read as at -50 s, outside the window at 30 s.
    assert not upgraded.record_execution(row(3, hook_id="other"), counts_as_block=True)
    assert not upgraded.record_execution(row(4, hook_id="other"), counts_as_block=True)
    assert upgraded.state("other").enabled and upgraded.state("other").consecutive_blocks == 5


def legacy(store: HookStore, sql: str) -> None:
    """Run ``sql`` on the store's database as an older worker (or an operator) would."""
    if store.database is not None:
        with psycopg.connect(store.database.url, autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # the test's own SQL
        return
    assert store.path is not None
    with sqlite3.connect(store.path) as db:
        db.execute(sql)
