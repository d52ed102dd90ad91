"""The declared hooks' shared state: one SQLite file used by the worker processes of one machine, or
PostgreSQL (``AGENT_DATABASE_URL``) shared by workers on several machines.

Tables:

* ``agent_hooks`` — one row per declared hook (definition, version) with its operational state:
  ``enabled`` and the circuit breaker's rolling window — the length of the current streak of counted
  blocks/timeouts (``consecutive_blocks``) and the times of its latest ones (``recent_blocks``, a JSON list
  of at most the threshold's count). A worker's start-up refreshes definitions but never re-enables a
  tripped hook: only an operator does (``agent-lifecycle hooks enable ID``).
* ``hook_executions`` — the audit table: one row per invocation, unique ``dedup_key`` (so an activity
  retry never writes twice), the error truncated to 256 characters and the full error AES-256-GCM
  encrypted in ``error_detail`` (nonce in ``error_nonce``), metadata JSON. ``hook_id`` references
  ``agent_hooks`` with ``ON DELETE SET NULL``: deleting a hook keeps its executions.
* ``hook_breaker_events`` — every trip and every operator reset.
* ``hook_decision_cache`` — prompt decisions shared by all workers, with an expiry.
* ``tenant_hook_budget`` — per-tenant monthly token budgets, deducted atomically.

Every read-check-write is one function run in one transaction that behaves as if it ran alone: a
``BEGIN IMMEDIATE`` transaction on SQLite (WAL and a busy timeout let processes share the file), a
serializable one on PostgreSQL, retried on a conflict — so a breaker trips once, an audit row is written
once per dedup key, a budget deduction and a turn's call count are exact, whatever the number of workers.
The statements are the same on both backends (upserts as ``INSERT … ON CONFLICT``); only the schema
differs.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from storage import sqlite
from storage.schema import Migration, from_sqlite_schema, located
from storage.text import EscapedStatements, escape_existing

from .security import SecretBox

if TYPE_CHECKING:
    from storage.postgres import Database

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 256
DEFAULT_BREAKER_THRESHOLD = 5
DEFAULT_BREAKER_WINDOW_SECONDS = 60.0
DEFAULT_MONTHLY_TOKEN_BUDGET = 1_000_000
GLOBAL_TENANT = "__global__"  # the sentinel tenant of requests that name none

_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_hooks (
    id                  TEXT PRIMARY KEY,
    version             INTEGER NOT NULL,
    event               TEXT NOT NULL,
    handler_type        TEXT NOT NULL,
    scope               TEXT NOT NULL,
    tenant_id           TEXT,
    agent_id            TEXT,
    definition          TEXT NOT NULL,
    enabled             INTEGER NOT NULL DEFAULT 1,
    consecutive_blocks  INTEGER NOT NULL DEFAULT 0,
    window_started_at   REAL,
    tripped_at          REAL,
    updated_at          REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS hook_executions (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    dedup_key     TEXT NOT NULL UNIQUE,
    hook_id       TEXT REFERENCES agent_hooks(id) ON DELETE SET NULL,
    hook_label    TEXT NOT NULL,
    hook_version  INTEGER NOT NULL,
    event         TEXT NOT NULL,
    handler_type  TEXT NOT NULL,
    tenant_id     TEXT,
    workflow_id   TEXT,
    run_id        TEXT,
    activity_id   TEXT,
    request_id    TEXT,
    decision      TEXT NOT NULL,
    reason        TEXT,
    status        TEXT NOT NULL,
    duration_ms   REAL NOT NULL,
    error         TEXT,
    error_detail  BLOB,
    error_nonce   BLOB,
    metadata      TEXT NOT NULL,
    created_at    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS hook_executions_hook ON hook_executions (hook_id, created_at);
CREATE INDEX IF NOT EXISTS hook_executions_workflow ON hook_executions (workflow_id);
CREATE TABLE IF NOT EXISTS hook_breaker_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    hook_id    TEXT NOT NULL,
    action     TEXT NOT NULL,
    detail     TEXT NOT NULL,
    actor      TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS hook_decision_cache (
    cache_key  TEXT PRIMARY KEY,
    hook_id    TEXT NOT NULL,
    decision   TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS hook_turn_invocations (
    hook_id    TEXT NOT NULL,
    turn_key   TEXT NOT NULL,
    calls      INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (hook_id, turn_key)
);
CREATE TABLE IF NOT EXISTS tenant_hook_budget (
    tenant_id    TEXT NOT NULL,
    month        TEXT NOT NULL,
    budget_total INTEGER NOT NULL,
    used         INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, month)
);
"""


# Text is written escaped (``storage.text``): a NUL or a lone surrogate in a hook's reason, error or
# metadata is stored and read back as it was; the escaping migration makes text written before it read
# back unchanged. Then the breaker's rolling window: the times of the streak's latest blocks. A row from
# before it (no times, a streak counted from ``window_started_at``) is read as that many blocks at the
# streak's start — the earliest they can have been, so the migration never trips a hook sooner than the
# window says.
_AFTER_SCHEMA = (
    escape_existing("declared_hooks", 2, _SCHEMA),
    Migration("declared_hooks", 3, "ALTER TABLE agent_hooks ADD COLUMN recent_blocks TEXT"),
)
# The same tables on PostgreSQL.
MIGRATIONS = (Migration("declared_hooks", 1, from_sqlite_schema(_SCHEMA)), *_AFTER_SCHEMA)


class Statements(Protocol):
    """What a read-check-write function is given: ``execute`` with ``?`` placeholders, on either backend."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Any: ...


@dataclass
class ExecutionRow:
    """One audit row as written (and as read back): its fields are the columns of ``hook_executions``."""

    dedup_key: str
    hook_id: str | None
    hook_label: str
    hook_version: int
    event: str
    handler_type: str
    decision: str  # allow | block | skip
    reason: str
    status: str  # completed | error | timeout
    duration_ms: float
    tenant_id: str | None = None
    workflow_id: str | None = None
    run_id: str | None = None
    activity_id: str | None = None
    request_id: str | None = None
    error: str | None = None  # truncated on write
    error_detail: bytes | None = None
    error_nonce: bytes | None = None
    metadata: dict[str, Any] | None = None
    created_at: float = 0.0
    id: int | None = None


_EXECUTION_COLUMNS = tuple(f.name for f in fields(ExecutionRow))


@dataclass
class HookState:
    enabled: bool
    consecutive_blocks: int  # the current streak of counted blocks/timeouts
    tripped_at: float | None
    recent_blocks: list[float] = field(default_factory=list)  # the times of the streak's latest ones, oldest first


@dataclass
class BudgetCharge:
    remaining: int
    total: int
    warn: bool  # 20 % or less left


class HookStore:
    """The store of declared hooks.

    Args:
        location: A SQLite database file (its directory is created), or a PostgreSQL :class:`Database`.
        secrets: Encrypts ``error_detail``; without it the full error is not kept (only the truncated text).
        breaker_threshold: Consecutive blocks/timeouts that trip a hook (default 5) ...
        breaker_window_seconds: ... within this rolling window (default one minute).
        default_budget: A tenant's monthly prompt-token budget unless set with :meth:`set_budget`.
    """

    def __init__(
        self,
        location: str | Path | Database,
        *,
        secrets: SecretBox | None = None,
        breaker_threshold: int = DEFAULT_BREAKER_THRESHOLD,
        breaker_window_seconds: float = DEFAULT_BREAKER_WINDOW_SECONDS,
        default_budget: int = DEFAULT_MONTHLY_TOKEN_BUDGET,
        clock=time.time,
    ) -> None:
        self.database, self.path = located(location)
        self.secrets = secrets
        self.breaker_threshold = breaker_threshold
        self.breaker_window_seconds = breaker_window_seconds
        self.default_budget = default_budget
        self._clock = clock
        if self.database is not None:
            self.database.require(MIGRATIONS)
        else:
            assert self.path is not None
            sqlite.prepare(self.path, _SCHEMA, _AFTER_SCHEMA)

    def _transaction(self, work):
        """``work(db, now)`` in one transaction that behaves as if it ran alone (on SQLite an immediate one,
        foreign keys on: deleting a hook nulls its rows; on PostgreSQL a serializable one, retried). Its
        text goes in escaped and comes back as it was (``storage.text``)."""
        if self.database is not None:
            return self.database.run(lambda db, now: work(EscapedStatements(db), now), self._clock)
        assert self.path is not None
        with sqlite.immediate(self.path, foreign_keys=True) as db:
            return work(EscapedStatements(db), self._clock())

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        if self.database is not None:
            return self.database.run(lambda db, now: EscapedStatements(db).execute(sql, params).fetchall(), self._clock)
        assert self.path is not None
        with sqlite.connection(self.path, foreign_keys=True) as db:
            return EscapedStatements(db).execute(sql, params).fetchall()

    def _named(self, columns: Sequence[str], rest: str, params: tuple = ()) -> list[dict[str, Any]]:
        """The rows of ``SELECT columns rest``, each a map of column name to value."""
        rows = self._read(f"SELECT {', '.join(columns)} {rest}", params)
        return [dict(zip(columns, row, strict=True)) for row in rows]

    # ------------------------------------------------------------------------------------------------
    # Definitions and state
    # ------------------------------------------------------------------------------------------------

    def register(self, hook: Any) -> None:
        """Record a declared hook's definition; a new hook starts enabled, an existing one keeps its state."""
        definition = hook.model_dump_json()

        def work(db: Statements, now: float) -> None:
            db.execute(
                "INSERT INTO agent_hooks (id, version, event, handler_type, scope, tenant_id, agent_id, definition, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET version = excluded.version, "
                "event = excluded.event, handler_type = excluded.handler_type, scope = excluded.scope, "
                "tenant_id = excluded.tenant_id, agent_id = excluded.agent_id, definition = excluded.definition, "
                "updated_at = excluded.updated_at",
                (
                    hook.id,
                    hook.version,
                    hook.event.value,
                    hook.handler_type,
                    hook.scope,
                    hook.tenant_id,
                    hook.agent_id,
                    definition,
                    now,
                ),
            )

        self._transaction(work)

    def state(self, hook_id: str) -> HookState:
        rows = self._read(
            "SELECT enabled, consecutive_blocks, tripped_at, recent_blocks, window_started_at FROM agent_hooks "
            "WHERE id = ?",
            (hook_id,),
        )
        if not rows:
            return HookState(enabled=True, consecutive_blocks=0, tripped_at=None)
        enabled, consecutive, tripped_at, recent, started = rows[0]
        return HookState(
            enabled=bool(enabled),
            consecutive_blocks=consecutive,
            tripped_at=tripped_at,
            recent_blocks=self._block_times(recent, consecutive, started),
        )

    def enable(self, hook_id: str, *, actor: str = "operator") -> bool:
        """Re-enable a hook and reset its breaker (audited). False when no such hook is recorded."""

        def work(db: Statements, now: float) -> bool:
            changed = db.execute(
                "UPDATE agent_hooks SET enabled = 1, consecutive_blocks = 0, window_started_at = NULL, "
                "recent_blocks = NULL, tripped_at = NULL, updated_at = ? WHERE id = ?",
                (now, hook_id),
            ).rowcount
            if changed:
                db.execute(
                    "INSERT INTO hook_breaker_events (hook_id, action, detail, actor, created_at) VALUES (?, 'reset', ?, ?, ?)",
                    (hook_id, "re-enabled by operator", actor, now),
                )
            return changed == 1

        return self._transaction(work)

    def delete_hook(self, hook_id: str) -> bool:
        """Remove a hook's definition; its executions stay (their ``hook_id`` becomes NULL)."""
        return self._transaction(
            lambda db, now: db.execute("DELETE FROM agent_hooks WHERE id = ?", (hook_id,)).rowcount == 1
        )

    def breaker_events(self, hook_id: str | None = None) -> list[dict[str, Any]]:
        where, params = ("WHERE hook_id = ?", (hook_id,)) if hook_id else ("", ())
        columns = ("hook_id", "action", "detail", "actor", "created_at")
        return self._named(columns, f"FROM hook_breaker_events {where} ORDER BY id", params)

    # ------------------------------------------------------------------------------------------------
    # The audit table and the breaker
    # ------------------------------------------------------------------------------------------------

    def seal_error(self, error: str | None, dedup_key: str) -> tuple[str | None, bytes | None, bytes | None]:
        """(truncated text, encrypted full text, nonce). The ciphertext is bound to its row's dedup key."""
        if error is None:
            return None, None, None
        truncated = error if len(error) <= MAX_ERROR_CHARS else error[: MAX_ERROR_CHARS - 1] + "…"
        if self.secrets is None:
            return truncated, None, None
        nonce, sealed = self.secrets.seal(
            error.encode(errors="surrogatepass"), dedup_key.encode(errors="surrogatepass")
        )
        return truncated, sealed, nonce

    def open_error(self, row: ExecutionRow) -> str | None:
        """The full error of an audit row, decrypted with the configured key."""
        if row.error_detail is None or row.error_nonce is None:
            return None
        if self.secrets is None:
            raise ValueError("no hook secret key is configured; the full error cannot be read")
        opened = self.secrets.open(row.error_nonce, row.error_detail, row.dedup_key.encode(errors="surrogatepass"))
        return opened.decode(errors="surrogatepass")

    def record_execution(self, row: ExecutionRow, *, counts_as_block: bool | None) -> bool:
        """Write one audit row (ignored when its dedup key exists) and, only if it was written, move the
        hook's breaker in the same transaction: a block/timeout (``counts_as_block``) joins its streak, any
        other decision ends it, and None (an invocation that says nothing of the hook's endpoint) leaves it
        as it is. Returns whether this write tripped the breaker."""
        error, detail, nonce = self.seal_error(row.error, row.dedup_key)

        def work(db: Statements, now: float) -> bool:
            known = (
                row.hook_id is not None
                and db.execute("SELECT 1 FROM agent_hooks WHERE id = ?", (row.hook_id,)).fetchone()
            )
            inserted = db.execute(
                "INSERT INTO hook_executions (dedup_key, hook_id, hook_label, hook_version, event, handler_type, "
                "tenant_id, workflow_id, run_id, activity_id, request_id, decision, reason, status, duration_ms, error, "
                "error_detail, error_nonce, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (dedup_key) DO NOTHING",
                (
                    row.dedup_key,
                    row.hook_id if known else None,
                    row.hook_label,
                    row.hook_version,
                    row.event,
                    row.handler_type,
                    row.tenant_id,
                    row.workflow_id,
                    row.run_id,
                    row.activity_id,
                    row.request_id,
                    row.decision,
                    row.reason,
                    row.status,
                    row.duration_ms,
                    error,
                    detail,
                    nonce,
                    json.dumps(row.metadata or {}, sort_keys=True, default=str),
                    now,
                ),
            ).rowcount
            if inserted != 1 or not known or row.decision == "skip" or row.hook_id is None or counts_as_block is None:
                return False
            return self._move_breaker(db, now, row.hook_id, counts_as_block)

        tripped = self._transaction(work)
        if tripped:  # logged once committed (a transaction may run again after a conflict)
            logger.warning(
                "security.hook.circuit_breaker hook=%s %d consecutive blocks/timeouts within %gs",
                row.hook_id,
                self.breaker_threshold,
                self.breaker_window_seconds,
            )
        return tripped

    def _move_breaker(self, db: Statements, now: float, hook_id: str, counts_as_block: bool) -> bool:
        """Move the hook's breaker by one invocation, in the caller's transaction (so two workers recording
        at once are serialized: neither's block is lost). An invocation that does not count (an allow, a
        completed non-block) ends the streak. A counted one joins it; the hook trips when the streak's
        last ``breaker_threshold`` blocks/timeouts all fall within ``breaker_window_seconds`` of each
        other — a rolling window, however long the streak has run."""
        enabled, consecutive, started, recent = db.execute(
            "SELECT enabled, consecutive_blocks, window_started_at, recent_blocks FROM agent_hooks WHERE id = ?",
            (hook_id,),
        ).fetchone()
        if not enabled:
            return False
        if not counts_as_block:
            db.execute(
                "UPDATE agent_hooks SET consecutive_blocks = 0, window_started_at = NULL, recent_blocks = NULL "
                "WHERE id = ?",
                (hook_id,),
            )
            return False
        times = sorted([*self._block_times(recent, consecutive, started), now])[-self.breaker_threshold :]
        spread = times[-1] - times[0]
        tripped = len(times) >= self.breaker_threshold and spread <= self.breaker_window_seconds
        db.execute(
            "UPDATE agent_hooks SET consecutive_blocks = ?, window_started_at = ?, recent_blocks = ?, enabled = ?, "
            "tripped_at = ? WHERE id = ?",
            (
                consecutive + 1,
                times[0],
                json.dumps(times),
                0 if tripped else 1,
                now if tripped else None,
                hook_id,
            ),
        )
        if tripped:
            detail = (
                f"{len(times)} consecutive blocks/timeouts within {spread:.3g}s "
                f"(window {self.breaker_window_seconds:g}s)"
            )
            db.execute(
                "INSERT INTO hook_breaker_events (hook_id, action, detail, actor, created_at) VALUES (?, 'trip', ?, NULL, ?)",
                (hook_id, detail, now),
            )
        return tripped

    def _block_times(self, recent: str | None, consecutive: int, started: float | None) -> list[float]:
        """The times of a streak's latest counted blocks, oldest first, at most ``breaker_threshold``. A
        row written before the times were kept has its streak read as blocks at the streak's start."""
        if recent is None:
            if not consecutive or started is None:
                return []
            return [float(started)] * min(consecutive, self.breaker_threshold)
        try:
            values = json.loads(recent)
        except ValueError:
            values = None
        if not isinstance(values, list):
            return []
        times = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return sorted(t for t in times if math.isfinite(t))[-self.breaker_threshold :]

    def executions(
        self, *, hook_label: str | None = None, workflow_id: str | None = None, limit: int = 100
    ) -> list[ExecutionRow]:
        clauses, params = [], []
        if hook_label is not None:
            clauses.append("hook_label = ?")
            params.append(hook_label)
        if workflow_id is not None:
            clauses.append("workflow_id = ?")
            params.append(workflow_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._named(_EXECUTION_COLUMNS, f"FROM hook_executions {where} ORDER BY id LIMIT ?", (*params, limit))
        return [ExecutionRow(**{**row, "metadata": json.loads(row["metadata"])}) for row in rows]

    # ------------------------------------------------------------------------------------------------
    # Prompt decision cache and tenant budgets
    # ------------------------------------------------------------------------------------------------

    def cached_decision(self, key: str) -> dict[str, Any] | None:
        rows = self._read(
            "SELECT decision FROM hook_decision_cache WHERE cache_key = ? AND expires_at > ?", (key, self._clock())
        )
        return json.loads(rows[0][0]) if rows else None

    def cache_decision(self, key: str, hook_id: str, decision: dict[str, Any], ttl_seconds: float) -> None:
        def work(db: Statements, now: float) -> None:
            db.execute("DELETE FROM hook_decision_cache WHERE expires_at <= ?", (now,))
            db.execute(
                "INSERT INTO hook_decision_cache VALUES (?, ?, ?, ?) ON CONFLICT (cache_key) DO UPDATE SET "
                "hook_id = excluded.hook_id, decision = excluded.decision, expires_at = excluded.expires_at",
                (key, hook_id, json.dumps(decision, sort_keys=True), now + ttl_seconds),
            )

        self._transaction(work)

    def take_turn_invocation(self, hook_id: str, turn_key: str, cap: int) -> tuple[bool, int]:
        """Count one evaluator call of ``hook_id`` in a turn (a request run), atomically, unless the cap is
        reached: (allowed, calls so far). Concurrent steps of one run share the count."""

        def work(db: Statements, now: float) -> tuple[bool, int]:
            db.execute("DELETE FROM hook_turn_invocations WHERE updated_at < ?", (now - 86_400,))
            row = db.execute(
                "SELECT calls FROM hook_turn_invocations WHERE hook_id = ? AND turn_key = ?", (hook_id, turn_key)
            ).fetchone()
            calls = row[0] if row else 0
            if calls >= cap:
                return False, calls
            db.execute(
                "INSERT INTO hook_turn_invocations VALUES (?, ?, 1, ?) ON CONFLICT(hook_id, turn_key) "
                "DO UPDATE SET calls = hook_turn_invocations.calls + 1, updated_at = excluded.updated_at",
                (hook_id, turn_key, now),
            )
            return True, calls + 1

        return self._transaction(work)

    def _month(self, now: float) -> str:
        return datetime.fromtimestamp(now, UTC).strftime("%Y-%m")

    def _ensure_budget(self, db: Statements, tenant: str, month: str) -> None:
        db.execute(
            "INSERT INTO tenant_hook_budget (tenant_id, month, budget_total, used) VALUES (?, ?, ?, 0) "
            "ON CONFLICT (tenant_id, month) DO NOTHING",
            (tenant, month, self.default_budget),
        )

    def set_budget(self, tenant: str, total: int, *, used: int | None = None) -> None:
        """Set a tenant's budget for the current month (and optionally what is already used)."""

        def work(db: Statements, now: float) -> None:
            month = self._month(now)
            self._ensure_budget(db, tenant, month)
            db.execute(
                "UPDATE tenant_hook_budget SET budget_total = ? WHERE tenant_id = ? AND month = ?",
                (total, tenant, month),
            )
            if used is not None:
                db.execute(
                    "UPDATE tenant_hook_budget SET used = ? WHERE tenant_id = ? AND month = ?", (used, tenant, month)
                )

        self._transaction(work)

    def budget_remaining(self, tenant: str) -> tuple[int, int]:
        """(remaining, total) of the tenant's budget this month."""

        def work(db: Statements, now: float) -> tuple[int, int]:
            month = self._month(now)
            self._ensure_budget(db, tenant, month)
            total, used = db.execute(
                "SELECT budget_total, used FROM tenant_hook_budget WHERE tenant_id = ? AND month = ?", (tenant, month)
            ).fetchone()
            return max(0, total - used), total

        return self._transaction(work)

    def charge_budget(self, tenant: str, tokens: int) -> BudgetCharge:
        """Deduct ``tokens`` atomically (one UPDATE in an immediate transaction) and report what is left."""

        def work(db: Statements, now: float) -> BudgetCharge:
            month = self._month(now)
            self._ensure_budget(db, tenant, month)
            db.execute(
                "UPDATE tenant_hook_budget SET used = used + ? WHERE tenant_id = ? AND month = ?",
                (max(0, tokens), tenant, month),
            )
            total, used = db.execute(
                "SELECT budget_total, used FROM tenant_hook_budget WHERE tenant_id = ? AND month = ?", (tenant, month)
            ).fetchone()
            remaining = max(0, total - used)
            return BudgetCharge(remaining=remaining, total=total, warn=remaining <= total * 0.2)

        return self._transaction(work)
