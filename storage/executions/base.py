"""The execution store: versioned execution records, one per request run.

Two kinds of write reach it:

* **snapshots** — the whole record, persisted by the request workflow at each lifecycle boundary
  (accepted plan, checkpoint opened, terminal). A snapshot is accepted only if its snapshot revision is
  newer than the stored one, so a stale or replayed write never replaces a newer record.
* **effect updates** — one effect brought to its terminal state by detached work, possibly after the
  request finished. Each is kept per (run, effect id), accepted once, and merged over the newest
  snapshot when the record is read, so a later snapshot cannot hide it and two concurrent completions
  never overwrite each other. They change effects only: a failed request stays failed.

The record's ``record_revision`` as read is the snapshot revision plus the number of accepted effect
updates: it only grows. Expired records (``retention`` after a success, ``error_retention`` after a
failure or cancel) are swept by writers; a sweep is safe to run from every worker at once.
"""

from __future__ import annotations

import sqlite3
import sys
from datetime import datetime, timedelta
from typing import Protocol

from workflows.models import EffectStatus, ExecutionRecord, PipelineHookEffect, RequestStatus

DEFAULT_RETENTION = timedelta(days=7)
DEFAULT_ERROR_RETENTION = timedelta(days=30)
# How often a store deletes expired records (reads never return one: deleting only reclaims space).
PURGE_INTERVAL_SECONDS = 60.0


class ExecutionStore(Protocol):
    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        """Store a snapshot unless one at least as new is stored. Returns (record revision, written)."""
        ...

    async def update_effect(self, workflow_id: str, run_id: str, effect: PipelineHookEffect) -> tuple[int, bool]:
        """Bring one effect of a run to its terminal state. Returns (record revision, written)."""
        ...

    async def get(self, key: str) -> ExecutionRecord | None:
        """The newest record whose request id or workflow id is ``key``, effect updates merged."""
        ...

    async def recent(self, limit: int = 20) -> list[ExecutionRecord]: ...

    async def get_run(self, workflow_id: str, run_id: str) -> ExecutionRecord | None:
        """The record of one run, effect updates merged."""
        ...

    async def window(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        tenant: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
    ) -> list[tuple[str, str]]:
        """The (workflow id, run id) of the records of requests started in [since, until) — of one tenant
        (metadata ``tenant_id``) and agent (``agent_id``) when given — oldest first, at most ``limit``.
        A read: what a policy replay lists before it reads the records a batch at a time."""
        ...


# SQLite result codes of a write that fails the same way however often it is tried: an error in the statement
# (a table that is gone) or a database opened read-only. Others — busy, locked, full, I/O — may pass.
_LASTING_SQLITE_CODES = frozenset({sqlite3.SQLITE_ERROR, sqlite3.SQLITE_READONLY})


def lasting(err: BaseException) -> bool:
    """Whether a store's error would come back however often the write were tried again: the data, the
    schema or the permissions refuse it, not the store's availability (a connection refused, a lock held,
    a timeout), which retries may outlast."""
    if isinstance(err, (ValueError, TypeError)):  # data no backend can take (UnicodeError among them)
        return True
    psycopg = sys.modules.get("psycopg")  # loaded where a store is on PostgreSQL; else no error is its
    if psycopg is not None and isinstance(err, psycopg.Error):
        return isinstance(
            err,
            (
                psycopg.DataError,
                psycopg.IntegrityError,
                psycopg.ProgrammingError,
                psycopg.NotSupportedError,
                psycopg.errors.RaiseException,
            ),
        )
    if isinstance(err, sqlite3.OperationalError):
        return getattr(err, "sqlite_errorcode", None) in _LASTING_SQLITE_CODES
    return isinstance(err, (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError))


def snapshot_revision(record: ExecutionRecord) -> int:
    return record.lifecycle.snapshot_revision if record.lifecycle is not None else record.record_revision


def merge_effects(record: ExecutionRecord, updates: list[PipelineHookEffect]) -> ExecutionRecord:
    """The record with each terminal effect update in place of the effect it updates (or appended when the
    snapshot never saw the effect), and ``record_revision`` counting the updates."""
    effects = list(record.effects)
    for update in updates:
        index = next((i for i, e in enumerate(effects) if e.effect_id == update.effect_id), None)
        if index is None:
            effects.append(update)
        else:
            effects[index] = update
    return record.model_copy(update={"effects": effects, "record_revision": snapshot_revision(record) + len(updates)})


def retention_for(record: ExecutionRecord, retention: timedelta, error_retention: timedelta) -> timedelta:
    """How long ``record`` is kept: a failed or cancelled request's longer, for its post-mortem."""
    failed = record.status in (RequestStatus.FAILED, RequestStatus.CANCELLED)
    return error_retention if failed else retention


def check_terminal(effect: PipelineHookEffect) -> None:
    if effect.status is EffectStatus.PENDING:
        raise ValueError(f"effect {effect.effect_id!r}: an effect update must be terminal, not pending")
