"""The payload store in one SQLite file, shared by the processes of one machine."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from .. import sqlite
from .base import DEFAULT_RETENTION, PayloadStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payloads (
    key          TEXT PRIMARY KEY,
    data         BLOB NOT NULL,
    size         INTEGER NOT NULL,
    last_used_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS payloads_last_used ON payloads (last_used_at);
"""


class SQLitePayloadStore(PayloadStore):
    """The payload driver on one SQLite file.

    Args:
        path: The database file; its directory is created.
        retention: How long an entry is kept after it was last written or read.
        cache_bytes: Bytes of recently written or read payloads kept in memory.
    """

    def __init__(
        self, path: str | Path, *, retention: timedelta = DEFAULT_RETENTION, cache_bytes: int = 64 * 1024 * 1024
    ) -> None:
        super().__init__(retention=retention, cache_bytes=cache_bytes)
        self.path = Path(path)
        sqlite.private_directory(self.path.parent)
        with sqlite.connection(self.path) as db:
            db.executescript(_SCHEMA)
        # Writes and reads come in small and often (one per large payload): each thread keeps its
        # connection, and every write is flushed to disk before it returns (a history refers to it).
        self._connections = sqlite.ThreadConnections(self.path)

    @property
    def location(self) -> str:
        return str(self.path)

    def _write_now(self, entries: list[tuple[str, bytes]], now: float, sweep_before: float | None) -> None:
        with self._connections.immediate() as db:
            db.executemany(
                "INSERT INTO payloads (key, data, size, last_used_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET last_used_at = max(last_used_at, excluded.last_used_at)",
                [(key, data, len(data), now) for key, data in entries],
            )
            if sweep_before is not None:
                db.execute("DELETE FROM payloads WHERE last_used_at < ?", (sweep_before,))

    def _read_now(self, keys: list[str]) -> dict[str, tuple[bytes, float]]:
        found: dict[str, tuple[bytes, float]] = {}
        with self._connections.reading() as db:
            for key in keys:
                row = db.execute("SELECT data, last_used_at FROM payloads WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    found[key] = (row[0], row[1])
        return found

    async def _write(self, entries: list[tuple[str, bytes]], now: float, sweep_before: float | None) -> None:
        await asyncio.to_thread(self._write_now, entries, now, sweep_before)

    async def _read(self, keys: list[str]) -> dict[str, tuple[bytes, float]]:
        return await asyncio.to_thread(self._read_now, keys)
