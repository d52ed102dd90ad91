"""The execution store: where finished (and, later, in-flight) execution records are kept.

The default is one SQLite file, safe for several worker processes (WAL journal, busy timeout). Writes
are revision-gated per run: a snapshot whose ``record_revision`` is not newer than the stored one is
refused, so a late or replayed write can never replace a newer record.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from workflows.models import ExecutionRecord, RequestStatus

DEFAULT_RETENTION = timedelta(days=7)
DEFAULT_ERROR_RETENTION = timedelta(days=30)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    workflow_id     TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    status          TEXT NOT NULL,
    record_revision INTEGER NOT NULL,
    started_at      TEXT NOT NULL,
    updated_at      REAL NOT NULL,
    expires_at      REAL NOT NULL,
    record          TEXT NOT NULL,
    PRIMARY KEY (workflow_id, run_id)
);
CREATE INDEX IF NOT EXISTS executions_request ON executions (request_id);
CREATE INDEX IF NOT EXISTS executions_expiry ON executions (expires_at);
"""


class ExecutionStore(Protocol):
    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        """Store ``record`` unless a revision at least as new is stored. Returns (stored revision, written)."""
        ...

    async def get(self, key: str) -> ExecutionRecord | None:
        """The newest record whose request id or workflow id is ``key``."""
        ...

    async def recent(self, limit: int = 20) -> list[ExecutionRecord]: ...


class SQLiteExecutionStore:
    """An :class:`ExecutionStore` in one SQLite file.

    Args:
        path: The database file; its directory is created.
        retention: How long a successful request's record is kept.
        error_retention: How long a failed or cancelled request's record is kept.
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.retention = retention
        self.error_retention = error_retention
        self._clock = clock
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _save(self, record: ExecutionRecord) -> tuple[int, bool]:
        now = self._clock()
        failed = record.status in (RequestStatus.FAILED, RequestStatus.CANCELLED)
        keep = self.error_retention if failed else self.retention
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM executions WHERE expires_at < ?", (now,))
            row = db.execute(
                "SELECT record_revision FROM executions WHERE workflow_id = ? AND run_id = ?",
                (record.workflow_id, record.run_id),
            ).fetchone()
            if row is not None and row[0] >= record.record_revision:
                db.execute("COMMIT")
                return row[0], False
            db.execute(
                "INSERT OR REPLACE INTO executions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.workflow_id,
                    record.run_id,
                    record.request_id,
                    record.status.value,
                    record.record_revision,
                    record.started_at.isoformat(),
                    now,
                    now + keep.total_seconds(),
                    record.model_dump_json(),
                ),
            )
            db.execute("COMMIT")
            return record.record_revision, True
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def _query(self, sql: str, params: tuple) -> list[ExecutionRecord]:
        db = self._connect()
        try:
            rows = db.execute(sql, params).fetchall()
        finally:
            db.close()
        return [ExecutionRecord.model_validate_json(row[0]) for row in rows]

    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        return await asyncio.to_thread(self._save, record)

    async def get(self, key: str) -> ExecutionRecord | None:
        rows = await asyncio.to_thread(
            self._query,
            "SELECT record FROM executions WHERE (request_id = ? OR workflow_id = ?) AND expires_at >= ? "
            "ORDER BY started_at DESC LIMIT 1",
            (key, key, self._clock()),
        )
        return rows[0] if rows else None

    async def recent(self, limit: int = 20) -> list[ExecutionRecord]:
        return await asyncio.to_thread(
            self._query,
            "SELECT record FROM executions WHERE expires_at >= ? ORDER BY updated_at DESC LIMIT ?",
            (self._clock(), limit),
        )
