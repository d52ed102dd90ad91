"""The payload store's contract against both backends: a payload stored by one process (its own cache, its
own connections) is read by another — as a worker on another machine reads what a workflow worker wrote
—, content addressing stores a payload once, a missing reference is a clear error, and the sweep keeps
what was used recently."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import StorageDriverClaim

from storage.payloads import PayloadNotFound, PayloadStore, PostgresPayloadStore, SQLitePayloadStore

from .conftest import Backend

StoreFactory = Callable[..., PayloadStore]


@pytest.fixture
def make_store(backend: Backend) -> StoreFactory:
    """``make_store(**options)``: another process's payload store on this test's database or file."""

    def make(**options: Any) -> PayloadStore:
        if backend.postgres:
            return PostgresPayloadStore(backend.database(), **options)
        return SQLitePayloadStore(backend.file("payloads.sqlite3"), **options)

    return make


def payload(text: str) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=text.encode())


async def test_a_payload_stored_by_one_process_is_read_by_another(make_store):
    writer, reader = make_store(), make_store()
    big = payload("x" * 300_000)

    claims = await writer.store(None, [big, payload("small"), big])  # type: ignore[arg-type]
    assert claims[0].claim_data == claims[2].claim_data  # content-addressed: one entry
    assert await reader.retrieve(None, claims) == [big, payload("small"), big]  # type: ignore[arg-type]


async def test_many_writers_storing_the_same_payloads_at_once_store_each_once(make_store):
    writers = [make_store() for _ in range(6)]
    payloads = [payload(f"value {n} " * 200) for n in range(20)]

    claims = await asyncio.gather(*(w.store(None, payloads) for w in writers))  # type: ignore[arg-type]
    assert all(c == claims[0] for c in claims)
    assert await make_store().retrieve(None, claims[0]) == payloads  # type: ignore[arg-type]


async def test_a_missing_reference_is_a_clear_error(make_store):
    claim = StorageDriverClaim({"key": "0" * 64, "size": "10"})
    with pytest.raises(PayloadNotFound, match="is not in the payload store"):
        await make_store().retrieve(None, [claim])  # type: ignore[arg-type]


async def test_the_sweep_deletes_only_what_was_not_used_within_the_retention(make_store):
    old, fresh = payload("old " * 100), payload("fresh " * 100)
    first = make_store(retention=timedelta(seconds=1))
    [old_claim] = await first.store(None, [old])  # type: ignore[arg-type]
    await asyncio.sleep(1.5)
    await make_store(retention=timedelta(seconds=1)).store(None, [fresh])  # type: ignore[arg-type]  # sweeps

    reader = make_store()
    with pytest.raises(PayloadNotFound):
        await reader.retrieve(None, [old_claim])  # type: ignore[arg-type]
    [fresh_claim] = await first.store(None, [fresh])  # type: ignore[arg-type]
    assert await reader.retrieve(None, [fresh_claim]) == [fresh]  # type: ignore[arg-type]


@pytest.mark.parametrize("use", ["store", "retrieve"])
async def test_an_entry_a_process_keeps_using_from_its_cache_is_never_swept(make_store, use):
    """A long-lived worker that keeps sending (or reading) the same payload serves it from its cache; the
    store's last use of it is still brought up to date, so a sweep elsewhere never deletes what new
    histories reference. An entry nobody uses is swept as before."""
    kept, dropped = payload("kept " * 100), payload("dropped " * 100)
    retention = timedelta(seconds=2)
    writer = make_store(retention=retention)
    [kept_claim, dropped_claim] = await writer.store(None, [kept, dropped])  # type: ignore[arg-type]
    user = writer if use == "store" else make_store(retention=retention)
    for _ in range(7):  # 3.5 s of use: well past the retention
        if use == "store":
            await user.store(None, [kept])  # type: ignore[arg-type]
        else:
            assert await user.retrieve(None, [kept_claim]) == [kept]  # type: ignore[arg-type]
        await asyncio.sleep(0.5)
    await make_store(retention=retention).store(None, [payload("another process sweeps")])  # type: ignore[arg-type]

    reader = make_store()
    assert await reader.retrieve(None, [kept_claim]) == [kept]  # type: ignore[arg-type]
    with pytest.raises(PayloadNotFound):
        await reader.retrieve(None, [dropped_claim])  # type: ignore[arg-type]
