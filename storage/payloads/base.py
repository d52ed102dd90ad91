"""Large payloads by reference: a storage driver for Temporal's ``ExternalStorage`` on our own store.

Every payload a worker or client sends above a size threshold — a hook's view with a large enrichment, a
tool's 30 KB output, a planning prompt — is written here and travels through Temporal as a reference of
about a hundred bytes, so a request's history grows with the number of calls it makes, not with the size
of what they carry. Payloads are content-addressed (the key is the sha256 of the serialized payload):
the same value sent to twenty hooks is written once, and a small in-process cache serves the reads a
worker makes of what it just wrote. ``external_storage()`` builds the ``ExternalStorage`` the clients and
workers of one deployment share; every process that reads a request's history or result (the CLI too)
needs the same store.

Retention: an entry is kept for at least ``retention`` after it was last written or read, by any process
(the sweep runs at most once an hour per process, from any process); it must outlive the histories that
reference it. A process that keeps writing or reading an entry from its cache brings the entry's last use
in the store up to date at most once every eighth of the retention, and the sweep allows for that lag: an
entry a long-lived worker keeps sending (a conversation's state carried across continue-as-new, a large
prompt part) is never swept from under the histories that still reference it.

Two backends share everything here but the two statements that write and read entries: one SQLite file
for the processes of one machine (``SQLitePayloadStore``), PostgreSQL for workers on several machines
(``PostgresPayloadStore``) — a reference written on one machine must be readable on every other.
"""

from __future__ import annotations

import hashlib
import logging
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

logger = logging.getLogger(__name__)

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
# A process brings an entry's last use in the store up to date when the one it knows is older than this
# share of the retention.
REFRESH_SHARE = 1 / 8


class PayloadNotFound(LookupError):
    """A reference whose payload is not (or no longer) in the store."""


class PayloadStore(StorageDriver):
    """The payload driver: content-addressed entries, a bounded in-process cache of what this process
    wrote or read (with the last use the store holds for each), and an hourly sweep. A backend implements
    :meth:`_write` and :meth:`_read`.

    Args:
        retention: How long an entry is kept after it was last written or read.
        cache_bytes: Bytes of recently written or read payloads kept in memory.
    """

    def __init__(self, *, retention: timedelta = DEFAULT_RETENTION, cache_bytes: int = 64 * 1024 * 1024) -> None:
        self.retention = retention
        self.refresh_seconds = retention.total_seconds() * REFRESH_SHARE
        # key -> (data, the entry's last use as the store holds it, as far as this process knows)
        self._cache: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
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
        """Insert ``entries`` (key, data), or bring their last use up to ``now`` (never back); with
        ``sweep_before``, also delete entries last used before it."""

    @abstractmethod
    async def _read(self, keys: list[str]) -> dict[str, tuple[bytes, float]]:
        """The stored data and last use (epoch seconds) of those ``keys`` that are stored."""

    def _remember(self, key: str, data: bytes, used: float) -> None:
        known = self._cache.pop(key, None)
        if known is not None:
            self._cache_bytes -= len(known[0])
            used = max(used, known[1])
        self._cache[key] = (data, used)
        self._cache_bytes += len(data)
        while self._cache_bytes > self._cache_limit and self._cache:
            _, (dropped, _) = self._cache.popitem(last=False)
            self._cache_bytes -= len(dropped)

    async def _write_used(self, entries: list[tuple[str, bytes]], now: float) -> None:
        """Write ``entries`` as used ``now`` (this process's hourly sweep with them), and cache them so."""
        sweep = now - self._swept_at > SWEEP_INTERVAL_SECONDS
        if sweep:
            self._swept_at = now
        # An entry's last use in the store lags its last use by up to ``refresh_seconds``: the sweep allows
        # for that, so nothing used within the retention is deleted.
        sweep_before = now - self.retention.total_seconds() - self.refresh_seconds if sweep else None
        await self._write(entries, now, sweep_before)
        for key, data in entries:
            self._remember(key, data, now)

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        entries = []
        for payload in payloads:
            data = payload.SerializeToString(deterministic=True)
            entries.append((hashlib.sha256(data).hexdigest(), data))
        now = time.time()
        due = {
            key: data
            for key, data in entries
            if key not in self._cache or now - self._cache[key][1] > self.refresh_seconds
        }
        if due:
            await self._write_used(list(due.items()), now)
        for key, _ in entries:
            if key in self._cache:  # (one larger than the whole cache is never kept)
                self._cache.move_to_end(key)
        return [StorageDriverClaim({"key": key, "size": str(len(data))}) for key, data in entries]

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        keys = [claim.claim_data["key"] for claim in claims]
        found = {key: self._cache[key] for key in keys if key in self._cache}
        for key in found:
            self._cache.move_to_end(key)
        missing = [key for key in keys if key not in found]
        if missing:
            read = await self._read(missing)
            found.update(read)
            for key, (data, used) in read.items():
                self._remember(key, data, used)
        payloads = []
        for key in keys:
            if key not in found:
                raise PayloadNotFound(f"payload {key} is not in the payload store {self.location}")
            payloads.append(Payload.FromString(found[key][0]))
        now = time.time()
        due = {key: data for key, (data, used) in found.items() if now - used > self.refresh_seconds}
        if due:  # a read is a use: the entry must outlive the history that just read it
            try:
                await self._write_used(list(due.items()), now)
            except Exception as err:  # noqa: BLE001 - the read succeeded; only its refresh did not
                logger.warning("could not bring the last use of %d payloads up to date: %s", len(due), err)
        return payloads


def external_storage(driver: StorageDriver) -> ExternalStorage:
    """Temporal's ``ExternalStorage`` with ``driver``: activity payloads from 2 KiB, anything else only
    when it would not fit inline (1 MiB)."""

    def select(context: StorageDriverSelectContext, payload: Payload) -> StorageDriver | None:
        limit = _THRESHOLDS.get(payload.metadata.get(BY_REFERENCE_METADATA, b""), OTHER_THRESHOLD_BYTES)
        return driver if payload.ByteSize() >= limit else None

    return ExternalStorage(drivers=[driver], driver_selector=select, payload_size_threshold=ACTIVITY_THRESHOLD_BYTES)
