"""The response cache in one SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from .. import sqlite
from ..text import EscapedStatements, escape_existing
from .base import CachedResponse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS response_cache (
    key         TEXT PRIMARY KEY,
    response    TEXT NOT NULL,
    variation   TEXT NOT NULL,
    written_at  REAL NOT NULL,
    request_id  TEXT NOT NULL
)
"""
# Its text is written escaped (``storage.text``), from this migration on.
ESCAPES = (escape_existing("response_cache", 2, _SCHEMA),)


class SQLiteResponseCacheStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        sqlite.private_directory(self.path.parent)
        with sqlite.connection(self.path) as db:
            db.execute(_SCHEMA)
        sqlite.migrate(self.path, ESCAPES)

    def _get(self, key: str) -> CachedResponse | None:
        with sqlite.connection(self.path) as db:
            row = (
                EscapedStatements(db)
                .execute("SELECT response, variation, written_at, request_id FROM response_cache WHERE key = ?", (key,))
                .fetchone()
            )
        return None if row is None else CachedResponse(row[0], json.loads(row[1]), row[2], row[3])

    def _put(self, key: str, entry: CachedResponse) -> None:
        with sqlite.connection(self.path) as db:
            EscapedStatements(db).execute(
                "INSERT OR REPLACE INTO response_cache VALUES (?, ?, ?, ?, ?)",
                (key, entry.response, json.dumps(entry.variation, sort_keys=True), entry.written_at, entry.request_id),
            )

    async def get(self, key: str) -> CachedResponse | None:
        return await asyncio.to_thread(self._get, key)

    async def put(self, key: str, entry: CachedResponse) -> None:
        await asyncio.to_thread(self._put, key, entry)
