"""The execution store in one SQLite file: the embedded default, safe for several worker processes on
one machine (WAL journal, busy timeout, ``BEGIN IMMEDIATE`` around every read-check-write)."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from datetime import datetime, timedelta
from pathlib import Path

from workflows.models import ExecutionRecord, LifecycleBoundary, PipelineHookEffect

from .. import sqlite
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

# Expired records are deleted by a write at most this often (per store object).

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    workflow_id       TEXT NOT NULL,
    run_id            TEXT NOT NULL,
    request_id        TEXT NOT NULL,
    status            TEXT NOT NULL,
    snapshot_revision INTEGER NOT NULL,
    started_at        TEXT NOT NULL,
    updated_at        REAL NOT NULL,
    expires_at        REAL NOT NULL,
    record            TEXT NOT NULL,
    PRIMARY KEY (workflow_id, run_id)
);
CREATE INDEX IF NOT EXISTS executions_request ON executions (request_id);
CREATE INDEX IF NOT EXISTS executions_expiry ON executions (expires_at);
CREATE TABLE IF NOT EXISTS effect_updates (
    workflow_id TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    effect_id   TEXT NOT NULL,
    effect      TEXT NOT NULL,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (workflow_id, run_id, effect_id)
);
"""


class SQLiteExecutionStore:
    """An :class:`ExecutionStore` in one SQLite file.

    Args:
        path: The database file; its directory is created.
        retention: How long a successful request's record is kept.
        error_retention: How long a failed or cancelled request's record is kept (late effect updates
            do not extend or shorten it).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retention: timedelta = DEFAULT_RETENTION,
        error_retention: timedelta = DEFAULT_ERROR_RETENTION,
        clock=time.time,
    ) -> None:
        self.path = Path(path)
        sqlite.private_directory(self.path.parent)
        self.retention = retention
        self.error_retention = error_retention
        self._clock = clock
        self._purged_at = -math.inf
        self._connections = sqlite.ThreadConnections(self.path)
        with sqlite.immediate(self.path) as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(executions)")}
            if "record_revision" in columns:  # a store written before effect updates existed
                db.execute("ALTER TABLE executions RENAME COLUMN record_revision TO snapshot_revision")
        with sqlite.connection(self.path) as db:
            db.executescript(_SCHEMA)

    def _write(self, work, *, flush: bool = True) -> tuple[int, bool]:
        """Run ``work(db, now)`` in one immediate transaction, after purging expired records (at most once
        per ``PURGE_INTERVAL_SECONDS`` of this store's clock: reads never return an expired record, so a
        purge only reclaims space).

        Unless ``flush``, the commit is not flushed to disk before this returns: for a snapshot its
        workflow writes again at its next boundary — it survives a crash of the process, and the file
        stays consistent whatever happens (see :meth:`storage.sqlite.ThreadConnections.immediate`)."""
        now = self._clock()
        with self._connections.immediate(flush_every_commit=flush) as db:
            if now - self._purged_at >= PURGE_INTERVAL_SECONDS:
                db.execute("DELETE FROM executions WHERE expires_at < ?", (now,))
                orphan_age = now - max(self.retention, self.error_retention).total_seconds()
                db.execute(
                    "DELETE FROM effect_updates WHERE updated_at < ? AND NOT EXISTS (SELECT 1 FROM executions e "
                    "WHERE e.workflow_id = effect_updates.workflow_id AND e.run_id = effect_updates.run_id)",
                    (orphan_age,),
                )
                self._purged_at = now
            return work(db, now)

    @staticmethod
    def _update_count(db: sqlite3.Connection, workflow_id: str, run_id: str) -> int:
        return db.execute(
            "SELECT COUNT(*) FROM effect_updates WHERE workflow_id = ? AND run_id = ?", (workflow_id, run_id)
        ).fetchone()[0]

    def _save(self, record: ExecutionRecord) -> tuple[int, bool]:
        revision = snapshot_revision(record)
        keep = retention_for(record, self.retention, self.error_retention)

        def work(db: sqlite3.Connection, now: float) -> tuple[int, bool]:
            row = db.execute(
                "SELECT snapshot_revision FROM executions WHERE workflow_id = ? AND run_id = ?",
                (record.workflow_id, record.run_id),
            ).fetchone()
            updates = self._update_count(db, record.workflow_id, record.run_id)
            if row is not None and row[0] >= revision:
                return row[0] + updates, False
            db.execute(
                "INSERT OR REPLACE INTO executions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.workflow_id,
                    record.run_id,
                    record.request_id,
                    record.status.value,
                    revision,
                    record.started_at.isoformat(),
                    now,
                    now + keep.total_seconds(),
                    model_json(record),
                ),
            )
            return revision + updates, True

        # Only the terminal snapshot is final; an earlier one is superseded by the next boundary's.
        final = record.lifecycle is None or record.lifecycle.boundary is LifecycleBoundary.TERMINAL
        return self._write(work, flush=final)

    def _update_effect(self, workflow_id: str, run_id: str, effect: PipelineHookEffect) -> tuple[int, bool]:
        check_terminal(effect)

        def work(db: sqlite3.Connection, now: float) -> tuple[int, bool]:
            inserted = db.execute(
                "INSERT OR IGNORE INTO effect_updates VALUES (?, ?, ?, ?, ?)",
                (workflow_id, run_id, effect.effect_id, model_json(effect), now),
            ).rowcount
            row = db.execute(
                "SELECT snapshot_revision FROM executions WHERE workflow_id = ? AND run_id = ?", (workflow_id, run_id)
            ).fetchone()
            return (row[0] if row else 0) + self._update_count(db, workflow_id, run_id), inserted == 1

        return self._write(work)

    def _query(self, where: str, params: tuple, limit: int) -> list[ExecutionRecord]:
        with sqlite.connection(self.path) as db:
            rows = db.execute(
                f"SELECT workflow_id, run_id, record FROM executions WHERE expires_at >= ? AND ({where}) "
                "ORDER BY started_at DESC, updated_at DESC LIMIT ?",
                (self._clock(), *params, limit),
            ).fetchall()
            records = []
            for workflow_id, run_id, text in rows:
                updates = [
                    model_from_json(PipelineHookEffect, u[0])
                    for u in db.execute(
                        "SELECT effect FROM effect_updates WHERE workflow_id = ? AND run_id = ? ORDER BY updated_at",
                        (workflow_id, run_id),
                    )
                ]
                records.append(merge_effects(model_from_json(ExecutionRecord, text), updates))
            return records

    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        return await asyncio.to_thread(self._save, record)

    async def update_effect(self, workflow_id: str, run_id: str, effect: PipelineHookEffect) -> tuple[int, bool]:
        return await asyncio.to_thread(self._update_effect, workflow_id, run_id, effect)

    async def get(self, key: str) -> ExecutionRecord | None:
        rows = await asyncio.to_thread(self._query, "request_id = ? OR workflow_id = ?", (key, key), 1)
        return rows[0] if rows else None

    async def get_run(self, workflow_id: str, run_id: str) -> ExecutionRecord | None:
        rows = await asyncio.to_thread(self._query, "workflow_id = ? AND run_id = ?", (workflow_id, run_id), 1)
        return rows[0] if rows else None

    async def recent(self, limit: int = 20) -> list[ExecutionRecord]:
        return await asyncio.to_thread(self._query, "1 = 1", (), limit)

    def _window(
        self, since: datetime | None, until: datetime | None, tenant: str | None, agent: str | None, limit: int | None
    ) -> list[tuple[str, str]]:
        where, params = ["expires_at >= ?"], [self._clock()]
        # started_at is an ISO text written in UTC by the workflow: ordered as the times are.
        if since is not None:
            where.append("julianday(started_at) >= julianday(?)")
            params.append(since.isoformat())
        if until is not None:
            where.append("julianday(started_at) < julianday(?)")
            params.append(until.isoformat())
        # A record whose strings are escaped (``storage.text``) holds the value escaped.
        for key, value in (("tenant_id", tenant), ("agent_id", agent)):
            if value is not None:
                where.append(
                    f"json_extract(record, '$.metadata.{key}') = "
                    f"(CASE WHEN json_type(record, '$.\"{MARK}\"') IS NULL THEN ? ELSE ? END)"
                )
                params += [as_written_before(value), escape(value)]
        with sqlite.connection(self.path) as db:
            rows = db.execute(
                f"SELECT workflow_id, run_id FROM executions WHERE {' AND '.join(where)} "
                "ORDER BY julianday(started_at), workflow_id, run_id LIMIT ?",
                (*params, -1 if limit is None else limit),
            ).fetchall()
        return [(w, r) for w, r in rows]

    async def window(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        tenant: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
    ) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self._window, since, until, tenant, agent, limit)
