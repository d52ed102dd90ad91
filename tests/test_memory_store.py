"""The memory store against both backends, with several workers (each its own store) at once: events,
facts and fragments stored once whoever writes them, the activity coordinator's signals shared, the
conversation memory the remember stage writes — and a database that fails is a ``read_failed`` /
``error`` result, never an exception into a request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.memory import MemoryStore
from hooks.memory import ActivitySignal, EpisodicEvent, KnowledgeFragment, UserFact
from storage.postgres import Database
from workflows.models import MemoryCandidate

from .conftest import Backend

StoreFactory = Callable[..., MemoryStore]
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


@pytest.fixture
def make_store(backend: Backend) -> StoreFactory:
    """``make_store(**options)``: another worker's memory store on this test's database or file."""

    def make(**options: Any) -> MemoryStore:
        location = backend.database() if backend.postgres else backend.file("memory.sqlite3")
        return MemoryStore(location, **options)

    return make


def event(n: int, entity: str = "ACME") -> EpisodicEvent:
    return EpisodicEvent(
        event_id=f"e{n}",
        agent_domain="demo",
        request_id=f"r{n}",
        tool="stock-service/stock_quote",
        entities=[entity],
        outcome="succeeded",
        summary=f"quote {n}",
        occurred_at=NOW + timedelta(seconds=n),
    )


async def test_events_recorded_by_every_worker_at_once_are_stored_once_and_read_by_entity(make_store):
    stores = [make_store() for _ in range(5)]
    results = await asyncio.gather(
        *(s.record_events([event(n % 8, "ACME" if n % 2 else "MSFT") for n in range(8)]) for s in stores)
    )
    assert all(r.provider_call_status == "returned" for r in results)
    assert sum(len(r.detail["inserted"]) for r in results) == 8  # each event inserted by exactly one worker
    read = await stores[0].recent_events("demo", entities=["acme"], since=NOW - timedelta(days=1), limit=3)
    assert read.status == "read_succeeded"
    assert [e.event_id for e in read.items][:2] == ["e7", "e5"]  # related to ACME first, newest first


async def test_facts_fragments_and_conversations_written_by_one_worker_are_read_by_another(make_store):
    writer, reader = make_store(), make_store()
    await writer.remember_facts([UserFact(user_id="u1", key="currency", value="USD")])
    await writer.remember_facts([UserFact(user_id="u1", key="currency", value="EUR")])  # a newer value wins
    fragment = KnowledgeFragment(fragment_id="f1", agent_domain="demo", title="ACME", text="ACME reports Thursday.",
                                 entities=["ACME"])  # fmt: skip
    assert (await writer.store_fragment(fragment)).detail == {"inserted": True}
    assert (await writer.store_fragment(fragment)).detail == {"inserted": False}
    await writer.save(MemoryCandidate(conversation_id="c1", request="hi", answer="hello"), request_id="r1")

    assert [(f.key, f.value) for f in (await reader.user_facts("u1", limit=5)).items] == [("currency", "EUR")]
    assert [f.fragment_id for f in (await reader.related_fragments("demo", entities=["acme"], limit=5)).items] == ["f1"]
    assert [(m.request, m.answer) for m in await reader.recent("c1")] == [("hi", "hello")]


async def test_activity_signals_are_shared_renewed_and_removed_across_workers(make_store):
    clock = [1_000.0]
    first, second = make_store(clock=lambda: clock[0]), make_store(clock=lambda: clock[0])
    signal = ActivitySignal(signal_id="s1", agent="demo", activity="quoting ACME", entities=["ACME"], request_id="r1")
    await first.announce(signal, ttl_seconds=10)
    assert [s.signal_id for s in (await second.active()).items] == ["s1"]
    clock[0] += 8
    assert (await second.renew("s1", ttl_seconds=10)).detail["found"] is True
    clock[0] += 8
    assert [s.renewals for s in (await first.active()).items] == [1]  # alive thanks to the other worker's renewal
    assert (await first.remove("s1")).detail == {"removed": True}
    assert (await second.active()).items == []


async def test_a_failing_database_fails_open(make_store, tmp_path):
    store = make_store()
    if store.database is not None:  # a server that is down: nothing listens on port 1
        store = MemoryStore(Database("postgresql://agent@127.0.0.1:1/postgres", open_timeout_seconds=1))
    else:  # a file that cannot be opened any more
        assert store.path is not None
        store.path.unlink()
        store.path.mkdir()
    assert (await store.user_facts("u1", limit=5)).status == "read_failed"
    assert (await store.remember_facts([UserFact(user_id="u1", key="k", value="v")])).provider_call_status == "error"
