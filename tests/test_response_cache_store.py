"""The response cache's store against both backends, and through Temporal: an answer written through one
worker is served to a repeated request through another worker that shares only the database."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hooks.builtin.response_cache import ResponseCacheHook
from hooks.builtin.secret_redaction import SecretRedactionHook
from storage.postgres import Database
from storage.responses import CachedResponse, PostgresResponseCacheStore, ResponseCacheStore, SQLiteResponseCacheStore

from .conftest import Backend
from .harness import Harness

StoreFactory = Callable[[], ResponseCacheStore]


@pytest.fixture
def make_store(backend: Backend) -> StoreFactory:
    """``make_store()``: another worker's cache store on this test's database or file."""

    def make() -> ResponseCacheStore:
        if backend.postgres:
            return PostgresResponseCacheStore(backend.database())
        return SQLiteResponseCacheStore(backend.file("cache.sqlite3"))

    return make


async def test_an_entry_written_by_one_worker_is_read_whole_by_another(make_store):
    writer, reader = make_store(), make_store()
    assert await reader.get("k") is None
    entry = CachedResponse("ACME trades at 42.", {"tenant_id": "t1"}, 1000.5, "req-1")
    await writer.put("k", entry)
    assert await reader.get("k") == entry


async def test_concurrent_writers_of_one_key_leave_one_whole_entry(make_store):
    workers = [make_store() for _ in range(5)]
    entries = [CachedResponse(f"answer {n}", {"n": str(n)}, float(n), f"req-{n}") for n in range(25)]
    await asyncio.gather(*(workers[n % 5].put("k", entry) for n, entry in enumerate(entries)))
    stored = await make_store().get("k")
    assert stored in entries  # one writer's entry, never fields of two


async def test_an_answer_cached_through_one_worker_is_served_through_another(client, tmp_path, postgres_url):
    databases = [Database(postgres_url), Database(postgres_url)]
    try:
        first = Harness(
            client,
            tmp_path / "a",
            hooks=[ResponseCacheHook(PostgresResponseCacheStore(databases[0])), SecretRedactionHook()],
        )
        second = Harness(
            client,
            tmp_path / "b",
            hooks=[ResponseCacheHook(PostgresResponseCacheStore(databases[1])), SecretRedactionHook()],
        )
        async with first as a:
            answered = await a.run("What is the price of ACME?")
        async with second as b:
            served = await b.run("What is the price of ACME?")
    finally:
        for database in databases:
            await database.close()

    assert answered.result is not None and answered.result.short_circuit is None
    assert served.result is not None and served.result.short_circuit is not None
    assert served.result.short_circuit.reason == "cache_match"
    assert served.result.response == answered.result.response
    assert "plan" not in served.activity_types()
