"""The response cache on PostgreSQL: one table every worker reads; a write is one upsert."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from ..postgres import Database
from ..schema import Migration
from ..text import escape, escape_existing, from_document, to_document, unescape
from .base import CachedResponse

_SCHEMA = """
CREATE TABLE agent_response_cache (
    key        TEXT PRIMARY KEY,
    response   TEXT NOT NULL,
    variation  JSONB NOT NULL,
    written_at DOUBLE PRECISION NOT NULL,
    request_id TEXT NOT NULL
);
"""
MIGRATIONS = (
    Migration("response_cache", 1, _SCHEMA),
    # Its text is written escaped (``storage.text``) from here on, its variation as an escaped document.
    escape_existing("response_cache", 2, _SCHEMA),
)


class PostgresResponseCacheStore:
    def __init__(self, database: Database) -> None:
        self.database = database
        database.require(MIGRATIONS)

    async def migrate(self) -> None:
        await self.database.migrate(MIGRATIONS)

    async def get(self, key: str) -> CachedResponse | None:
        await self.migrate()
        async with self.database.transaction() as conn:
            cursor = await conn.execute(
                "SELECT response, variation, written_at, request_id FROM agent_response_cache WHERE key = %s",
                (escape(key),),
            )
            row = await cursor.fetchone()
        if row is None:
            return None
        return CachedResponse(unescape(row[0]), from_document(row[1]), row[2], unescape(row[3]))

    async def put(self, key: str, entry: CachedResponse) -> None:
        await self.migrate()
        async with self.database.transaction() as conn:
            await conn.execute(
                "INSERT INTO agent_response_cache VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET "
                "response = EXCLUDED.response, variation = EXCLUDED.variation, written_at = EXCLUDED.written_at, "
                "request_id = EXCLUDED.request_id",
                (
                    escape(key),
                    escape(entry.response),
                    Jsonb(to_document(entry.variation)),
                    entry.written_at,
                    escape(entry.request_id),
                ),
            )
