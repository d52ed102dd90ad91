"""The execution store on PostgreSQL, for workers on several machines.

The same guarantees as the SQLite store, held by the database rather than a file lock: a snapshot is
written by one ``INSERT … ON CONFLICT DO UPDATE … WHERE stored revision < new revision`` (so of two
concurrent writers the newer revision wins, whatever their order); an effect update is one
``INSERT … ON CONFLICT DO NOTHING`` (accepted once, by whichever worker comes first); a reader sees a
snapshot and its effect updates from one transaction's snapshot. Expired rows are swept by writers a
batch at a time with ``FOR UPDATE SKIP LOCKED``, so every worker may sweep at once without waiting on
another.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

from psycopg import AsyncConnection

from workflows.models import ExecutionRecord, LifecycleBoundary, PipelineHookEffect

from ..postgres import Database
from ..schema import Migration
from ..text import MARK, as_written_before, escape, model_from_json, model_json
from .base import (
    DEFAULT_ERROR_RETENTION,
    DEFAULT_RETENTION,
    PURGE_INTERVAL_SECONDS,
    check_terminal,
    merge_effects,
    retention_for,
    snapshot_revision,
)

MIGRATIONS = (
    Migration(
        "executions",
        1,
        """
        CREATE TABLE agent_executions (
            workflow_id       TEXT NOT NULL,
            run_id            TEXT NOT NULL,
            request_id        TEXT NOT NULL,
            status            TEXT NOT NULL,
            snapshot_revision INTEGER NOT NULL,
            started_at        TIMESTAMPTZ NOT NULL,
            updated_at        TIMESTAMPTZ NOT NULL,
            expires_at        TIMESTAMPTZ NOT NULL,
            record            JSONB NOT NULL,
            PRIMARY KEY (workflow_id, run_id)
        );
        CREATE INDEX agent_executions_request ON agent_executions (request_id);
        CREATE INDEX agent_executions_expiry ON agent_executions (expires_at);
        CREATE INDEX agent_executions_recent ON agent_executions (started_at DESC, updated_at DESC);
        CREATE TABLE agent_effect_updates (
            workflow_id TEXT NOT NULL,
            run_id      TEXT NOT NULL,
            effect_id   TEXT NOT NULL,
            effect      JSONB NOT NULL,
            updated_at  TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (workflow_id, run_id, effect_id)
        );
        CREATE INDEX agent_effect_updates_age ON agent_effect_updates (updated_at);
        """,
    ),
)

SWEEP_BATCH = 500


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _matching(value: str | None) -> tuple[str | None, str, str | None, str | None]:
    """The parameters of a metadata filter: a record whose strings are escaped holds the value escaped;
    another, the value as it is (if it could hold it at all)."""
    if value is None:
        return None, MARK, None, None
    return escape(value), MARK, escape(value), as_written_before(value)


class PostgresExecutionStore:
    """An :class:`~storage.executions.ExecutionStore` in a PostgreSQL database.

    Args:
        database: The pool (shared with the other stores of the process).
        retention: How long a successful request's record is kept.
        error_retention: How long a failed or cancelled request's record is kept.
    """

    def __init__(
        self,
        database: Database,
        *,
        retention: timedelta = DEFAULT_RETENTION,
        error_retention: timedelta = DEFAULT_ERROR_RETENTION,
        clock=time.time,
    ) -> None:
        self.database = database
        database.require(MIGRATIONS)
        self.retention = retention
        self.error_retention = error_retention
        self._clock = clock
        self._swept_at = -math.inf

    async def migrate(self) -> None:
        await self.database.migrate(MIGRATIONS)

    async def _sweep(self, conn: AsyncConnection, now: float) -> None:
        """Delete a batch of expired records, and effect updates whose run is gone and that are older than
        any retention; rows another worker is deleting are skipped, not waited for. At most once per
        ``PURGE_INTERVAL_SECONDS`` of this store's clock: reads never return an expired record, so a sweep
        only reclaims space, and a write need not pay for it."""
        if now - self._swept_at < PURGE_INTERVAL_SECONDS:
            return
        self._swept_at = now
        await conn.execute(
            "DELETE FROM agent_executions WHERE ctid IN (SELECT ctid FROM agent_executions WHERE expires_at < %s "
            "LIMIT %s FOR UPDATE SKIP LOCKED)",
            (_at(now), SWEEP_BATCH),
        )
        orphan_age = now - max(self.retention, self.error_retention).total_seconds()
        await conn.execute(
            "DELETE FROM agent_effect_updates WHERE ctid IN (SELECT u.ctid FROM agent_effect_updates u "
            "WHERE u.updated_at < %s AND NOT EXISTS (SELECT 1 FROM agent_executions e "
            "WHERE e.workflow_id = u.workflow_id AND e.run_id = u.run_id) LIMIT %s FOR UPDATE SKIP LOCKED)",
            (_at(orphan_age), SWEEP_BATCH),
        )

    @staticmethod
    async def _revision(conn: AsyncConnection, workflow_id: str, run_id: str) -> int:
        """The record revision as read: the stored snapshot's plus its accepted effect updates."""
        cursor = await conn.execute(
            "SELECT COALESCE((SELECT snapshot_revision FROM agent_executions WHERE workflow_id = %s AND run_id = %s), 0)"
            " + (SELECT COUNT(*) FROM agent_effect_updates WHERE workflow_id = %s AND run_id = %s)",
            (workflow_id, run_id, workflow_id, run_id),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        await self.migrate()
        now = self._clock()
        keep = retention_for(record, self.retention, self.error_retention)
        # Only the terminal snapshot is final; an earlier one is superseded by the next boundary's, so its
        # commit need not wait for the write-ahead log to reach disk (the database stays consistent).
        final = record.lifecycle is None or record.lifecycle.boundary is LifecycleBoundary.TERMINAL
        async with self.database.transaction() as conn:
            if not final:
                await conn.execute("SET LOCAL synchronous_commit = off")
            await self._sweep(conn, now)
            cursor = await conn.execute(
                "INSERT INTO agent_executions AS stored (workflow_id, run_id, request_id, status, snapshot_revision,"
                " started_at, updated_at, expires_at, record) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)"
                " ON CONFLICT (workflow_id, run_id) DO UPDATE SET request_id = EXCLUDED.request_id,"
                " status = EXCLUDED.status, snapshot_revision = EXCLUDED.snapshot_revision,"
                " started_at = EXCLUDED.started_at, updated_at = EXCLUDED.updated_at,"
                " expires_at = EXCLUDED.expires_at, record = EXCLUDED.record"
                " WHERE stored.snapshot_revision < EXCLUDED.snapshot_revision RETURNING 1",
                (
                    record.workflow_id,
                    record.run_id,
                    record.request_id,
                    record.status.value,
                    snapshot_revision(record),
                    record.started_at,
                    _at(now),
                    _at(now + keep.total_seconds()),
                    model_json(record),
                ),
            )
            written = await cursor.fetchone() is not None
            return await self._revision(conn, record.workflow_id, record.run_id), written

    async def update_effect(self, workflow_id: str, run_id: str, effect: PipelineHookEffect) -> tuple[int, bool]:
        check_terminal(effect)
        await self.migrate()
        now = self._clock()
        async with self.database.transaction() as conn:
            await self._sweep(conn, now)
            cursor = await conn.execute(
                "INSERT INTO agent_effect_updates VALUES (%s, %s, %s, %s::jsonb, %s) ON CONFLICT DO NOTHING",
                (workflow_id, run_id, effect.effect_id, model_json(effect), _at(now)),
            )
            written = cursor.rowcount == 1
            return await self._revision(conn, workflow_id, run_id), written

    async def _query(self, where: LiteralString, params: tuple[Any, ...], limit: int) -> list[ExecutionRecord]:
        await self.migrate()
        async with self.database.transaction() as conn:
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor = await conn.execute(
                f"SELECT workflow_id, run_id, record FROM agent_executions WHERE expires_at >= %s AND ({where}) "
                "ORDER BY started_at DESC, updated_at DESC LIMIT %s",
                (_at(self._clock()), *params, limit),
            )
            records = []
            for workflow_id, run_id, record in await cursor.fetchall():
                updates = await conn.execute(
                    "SELECT effect FROM agent_effect_updates WHERE workflow_id = %s AND run_id = %s "
                    "ORDER BY updated_at, effect_id",
                    (workflow_id, run_id),
                )
                effects = [model_from_json(PipelineHookEffect, row[0]) for row in await updates.fetchall()]
                records.append(merge_effects(model_from_json(ExecutionRecord, record), effects))
            return records

    async def get(self, key: str) -> ExecutionRecord | None:
        rows = await self._query("request_id = %s OR workflow_id = %s", (key, key), 1)
        return rows[0] if rows else None

    async def get_run(self, workflow_id: str, run_id: str) -> ExecutionRecord | None:
        rows = await self._query("workflow_id = %s AND run_id = %s", (workflow_id, run_id), 1)
        return rows[0] if rows else None

    async def recent(self, limit: int = 20) -> list[ExecutionRecord]:
        return await self._query("TRUE", (), limit)

    async def window(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        tenant: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
    ) -> list[tuple[str, str]]:
        await self.migrate()
        async with self.database.transaction() as conn:
            cursor = await conn.execute(
                "SELECT workflow_id, run_id FROM agent_executions WHERE expires_at >= %s "
                "AND (%s::timestamptz IS NULL OR started_at >= %s::timestamptz) "
                "AND (%s::timestamptz IS NULL OR started_at < %s::timestamptz) "
                "AND (%s::text IS NULL OR record->'metadata'->>'tenant_id' = "
                "(CASE WHEN record ? %s THEN %s::text ELSE %s::text END)) "
                "AND (%s::text IS NULL OR record->'metadata'->>'agent_id' = "
                "(CASE WHEN record ? %s THEN %s::text ELSE %s::text END)) "
                "ORDER BY started_at, workflow_id, run_id LIMIT %s",
                (
                    _at(self._clock()),
                    since,
                    since,
                    until,
                    until,
                    *_matching(tenant),
                    *_matching(agent),
                    limit,
                ),
            )
            return [(w, r) for w, r in await cursor.fetchall()]
