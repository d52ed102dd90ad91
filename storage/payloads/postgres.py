"""The payload store on PostgreSQL: one table every worker and client of a deployment reads, on any
machine. Writers upsert (a payload sent twice by two workers is one row); the hourly sweep deletes a
batch at a time with ``SKIP LOCKED``, so every process may sweep at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..postgres import Database
from ..schema import Migration
from .base import DEFAULT_RETENTION, PayloadStore

MIGRATIONS = (
    Migration(
        "payloads",
        1,
        """
        CREATE TABLE agent_payloads (
            key          TEXT PRIMARY KEY,
            data         BYTEA NOT NULL,
            size         INTEGER NOT NULL,
            last_used_at TIMESTAMPTZ NOT NULL
        );
        CREATE INDEX agent_payloads_last_used ON agent_payloads (last_used_at);
        """,
    ),
)
SWEEP_BATCH = 1000


class PostgresPayloadStore(PayloadStore):
    """The payload driver on a PostgreSQL database.

    Args:
        database: The pool (shared with the other stores of the process).
        retention: How long an entry is kept after it was last written or read.
        cache_bytes: Bytes of recently written or read payloads kept in memory.
    """

    def __init__(
        self, database: Database, *, retention: timedelta = DEFAULT_RETENTION, cache_bytes: int = 64 * 1024 * 1024
    ) -> None:
        super().__init__(retention=retention, cache_bytes=cache_bytes)
        self.database = database
        database.require(MIGRATIONS)

    @property
    def location(self) -> str:
        return self.database.location

    async def migrate(self) -> None:
        await self.database.migrate(MIGRATIONS)

    async def _write(self, entries: list[tuple[str, bytes]], now: float, sweep_before: float | None) -> None:
        await self.migrate()
        used = datetime.fromtimestamp(now, UTC)
        async with self.database.transaction() as conn, conn.cursor() as cursor:
            await cursor.executemany(
                "INSERT INTO agent_payloads (key, data, size, last_used_at) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (key) DO UPDATE SET last_used_at = GREATEST(agent_payloads.last_used_at, EXCLUDED.last_used_at)",
                [(key, data, len(data), used) for key, data in entries],
            )
            if sweep_before is not None:
                await cursor.execute(
                    "DELETE FROM agent_payloads WHERE key IN (SELECT key FROM agent_payloads WHERE last_used_at < %s "
                    "LIMIT %s FOR UPDATE SKIP LOCKED)",
                    (datetime.fromtimestamp(sweep_before, UTC), SWEEP_BATCH),
                )

    async def _read(self, keys: list[str]) -> dict[str, tuple[bytes, float]]:
        await self.migrate()
        async with self.database.transaction() as conn:
            cursor = await conn.execute(
                "SELECT key, data, last_used_at FROM agent_payloads WHERE key = ANY(%s)", (keys,)
            )
            return {key: (bytes(data), used.timestamp()) for key, data, used in await cursor.fetchall()}
