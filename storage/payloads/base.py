"""Large payloads by reference: a storage driver for Temporal's ``ExternalStorage`` on our own store.

Every payload a worker or client sends above a size threshold — a hook's view with a large enrichment, a
tool's 30 KB output, a planning prompt — is written here and travels through Temporal as a reference of
about a hundred bytes, so a request's history grows with the number of calls it makes, not with the size
of what they carry. Payloads are content-addressed (the key is the sha256 of the serialized payload):
the same value sent to twenty hooks is written once, and a small in-process cache serves the reads a
worker makes of what it just wrote. ``external_storage()`` builds the ``ExternalStorage`` the clients and
workers of one deployment share; every process that reads a request's history or result (the CLI too)
needs the same store.

Retention: an entry is kept for ``retention`` after it was last written or read (the sweep runs at
most once an hour per process, from any process); it must outlive the histories that reference it.

Two backends share everything here but the two statements that write and read entries: one SQLite file
for the processes of one machine (``SQLitePayloadStore``), PostgreSQL for workers on several machines
(``PostgresPayloadStore``) — a reference written on one machine must be readable on every other.
"""

from __future__ import annotations

import hashlib
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from datetime import timedelta

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverSelectContext,
    StorageDriverStoreContext,
)

from workflows.converter import BY_REFERENCE_METADATA

DRIVER_NAME = "agent-payload-store"
# Activity inputs and results (``ByReference`` models) at or above this size go to the store; a local
# activity's result (recorded in its marker) from a larger size; workflow inputs, results, signals and
# queries only when they would hardly fit a Temporal payload, so what the UI and the CLI show stays
# readable. A local activity's input never goes (it never leaves the worker).
ACTIVITY_THRESHOLD_BYTES = 2 * 1024
MARKER_THRESHOLD_BYTES = 16 * 1024
OTHER_THRESHOLD_BYTES = 1024 * 1024
_THRESHOLDS = {b"reference": ACTIVITY_THRESHOLD_BYTES, b"marker": MARKER_THRESHOLD_BYTES}
DEFAULT_RETENTION = timedelta(days=31)
SWEEP_INTERVAL_SECONDS = 3600.0


class PayloadNotFound(LookupError):
    """A reference whose payload is not (or no longer) in the store."""


class PayloadStore(StorageDriver):
    """The payload driver: content-addressed entries, a bounded in-process cache of what this process
    wrote or read, and an hourly sweep. A backend implements :meth:`_write` and :meth:`_read`.

    Args:
        retention: How long an entry is kept after it was last written or read.
        cache_bytes: Bytes of recently written or read payloads kept in memory.
    """

    def __init__(self, *, retention: timedelta = DEFAULT_RETENTION, cache_bytes: int = 64 * 1024 * 1024) -> None:
        self.retention = retention
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._swept_at = 0.0

    def name(self) -> str:
        return DRIVER_NAME

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the entries are, for error messages (never a password)."""

    @abstractmethod
    async def _write(self, entries: list[tuple[str, bytes]], now: float, sweep_before: float | None) -> None:
        """Insert ``entries`` (key, data), or refresh their last use; with ``sweep_before``, also delete
        entries last used before it."""

    @abstractmethod
    async def _read(self, keys: list[str]) -> dict[str, bytes]:
        """The stored data of those ``keys`` that are stored."""

    def _remember(self, key: str, data: bytes) -> None:
        if key in self._cache:
            self._cache.move_to_end(key)
            return
        self._cache[key] = data
        self._cache_bytes += len(data)
        while self._cache_bytes > self._cache_limit and self._cache:
            _, dropped = self._cache.popitem(last=False)
            self._cache_bytes -= len(dropped)

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        entries = []
        for payload in payloads:
            data = payload.SerializeToString(deterministic=True)
            entries.append((hashlib.sha256(data).hexdigest(), data))
        fresh = [(key, data) for key, data in entries if key not in self._cache]
        if fresh:
            now = time.time()
            sweep = now - self._swept_at > SWEEP_INTERVAL_SECONDS
            if sweep:
                self._swept_at = now
            await self._write(fresh, now, now - self.retention.total_seconds() if sweep else None)
        for key, data in entries:
            self._remember(key, data)
        return [StorageDriverClaim({"key": key, "size": str(len(data))}) for key, data in entries]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        keys = [claim.claim_data["key"] for claim in claims]
        missing = [key for key in keys if key not in self._cache]
        if missing:
            for key, data in (await self._read(missing)).items():
                self._remember(key, data)
        payloads = []
        for key in keys:
            data = self._cache.get(key)
            if data is None:
                raise PayloadNotFound(f"payload {key} is not in the payload store {self.location}")
            payloads.append(Payload.FromString(data))
        return payloads


def external_storage(driver: StorageDriver) -> ExternalStorage:
    """Temporal's ``ExternalStorage`` with ``driver``: activity payloads from 2 KiB, anything else only
    when it would not fit inline (1 MiB)."""

    def select(context: StorageDriverSelectContext, payload: Payload) -> StorageDriver | None:
        limit = _THRESHOLDS.get(payload.metadata.get(BY_REFERENCE_METADATA, b""), OTHER_THRESHOLD_BYTES)
        return driver if payload.ByteSize() >= limit else None

    return ExternalStorage(drivers=[driver], driver_selector=select, payload_size_threshold=ACTIVITY_THRESHOLD_BYTES)
