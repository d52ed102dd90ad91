"""Memory stores: conversation memory (the ``remember`` stage) and the shared memory the built-in memory
and coordination hooks use — episodic events, per-user facts, knowledge fragments and the activity
coordinator's signal registry.

The default is one SQLite file that needs no server and is safe for the worker processes of one machine
(WAL journal, a busy timeout, one short transaction per call); given a PostgreSQL ``Database``
(``AGENT_DATABASE_URL``) the same statements run there, shared by workers on several machines. Writes are
idempotent by id (upserts), so a retried activity never stores a thing twice. The shared-memory facets
**fail open**: a database error is logged and returned as ``read_failed`` /
``provider_call_status="error"``, never raised into a request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from hooks.memory import ActivitySignal, EpisodicEvent, KnowledgeFragment, ReadResult, UserFact, WriteResult
from storage import sqlite
from storage.schema import Migration, from_sqlite_schema, located, store_errors
from storage.text import EscapedStatements, escape_existing
from workflows.models import CHARS_PER_TOKEN, MemoryCandidate, MemoryExchange, RecalledMemory, estimate_tokens

if TYPE_CHECKING:
    from storage.postgres import Database

logger = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversation_memory (
    conversation_id TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    request         TEXT NOT NULL,
    answer          TEXT NOT NULL,
    facts           TEXT NOT NULL,
    saved_at        REAL NOT NULL,
    PRIMARY KEY (conversation_id, request_id)
)
"""

_SUMMARY_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversation_summary (
    conversation_id TEXT PRIMARY KEY,
    summary         TEXT NOT NULL,
    saved_at        REAL NOT NULL
)
"""

_SHARED_SCHEMA = """
CREATE TABLE IF NOT EXISTS episodic_events (
    event_id     TEXT PRIMARY KEY,
    agent_domain TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    step_id      TEXT,
    tool         TEXT,
    entities     TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    importance   REAL NOT NULL,
    summary      TEXT NOT NULL,
    occurred_at  REAL NOT NULL,
    recorded_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS episodic_domain_time ON episodic_events (agent_domain, occurred_at);
CREATE TABLE IF NOT EXISTS episodic_entities (
    entity   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (entity, event_id)
);
CREATE TABLE IF NOT EXISTS user_facts (
    user_id           TEXT NOT NULL,
    key               TEXT NOT NULL,
    value             TEXT NOT NULL,
    source_request_id TEXT,
    recorded_at       REAL NOT NULL,
    PRIMARY KEY (user_id, key)
);
CREATE TABLE IF NOT EXISTS knowledge_fragments (
    fragment_id       TEXT PRIMARY KEY,
    agent_domain      TEXT NOT NULL,
    title             TEXT NOT NULL,
    text              TEXT NOT NULL,
    entities          TEXT NOT NULL,
    source_request_id TEXT,
    recorded_at       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS knowledge_entities (
    entity      TEXT NOT NULL,
    fragment_id TEXT NOT NULL,
    PRIMARY KEY (entity, fragment_id)
);
CREATE TABLE IF NOT EXISTS activity_signals (
    signal_id    TEXT PRIMARY KEY,
    agent        TEXT NOT NULL,
    activity     TEXT NOT NULL,
    entities     TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    announced_at REAL NOT NULL,
    expires_at   REAL NOT NULL,
    renewals     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS activity_signals_expiry ON activity_signals (expires_at);
"""


# Text is written escaped (``storage.text``): NUL and lone surrogates are stored and read back as they were;
# the escaping migrations make text written before them read back unchanged, on either backend.
_ESCAPES = (escape_existing("conversation_memory", 3, _SCHEMA + _SUMMARY_SCHEMA),)
_SHARED_ESCAPES = (escape_existing("shared_memory", 2, _SHARED_SCHEMA),)
MIGRATIONS = (
    Migration("conversation_memory", 1, from_sqlite_schema(_SCHEMA)),
    Migration("conversation_memory", 2, from_sqlite_schema(_SUMMARY_SCHEMA)),
    *_ESCAPES,
    Migration("shared_memory", 1, from_sqlite_schema(_SHARED_SCHEMA)),
    *_SHARED_ESCAPES,
)
# What a conversation's saved memory keeps: its latest exchanges, and a summary of the older ones capped at
# an eighth of the model's context window (by the conservative token estimate); a window of this size is
# assumed when the model's is not configured.
KEPT_EXCHANGES = 3
SUMMARY_WINDOW_SHARE = 8
DEFAULT_CONTEXT_WINDOW = 8192
_CLIPPED_REQUEST_CHARS = 160
_CLIPPED_ANSWER_CHARS = 240


def summary_cap_tokens(context_window: int | None) -> int:
    """The most tokens a saved summary may take: an eighth of the model's window."""
    return (context_window or DEFAULT_CONTEXT_WINDOW) // SUMMARY_WINDOW_SHARE


def capped_summary(text: str, cap_tokens: int) -> str:
    """``text`` within ``cap_tokens`` (estimated): its newest part, the oldest cut first."""
    text = text.strip()
    if estimate_tokens(text) <= cap_tokens:
        return text
    keep = cap_tokens * CHARS_PER_TOKEN
    while keep > 0 and estimate_tokens("… " + text[-keep:]) > cap_tokens:
        keep = keep * 9 // 10
    return ("… " + text[-keep:]) if keep > 0 else ""


def _clip(text: str, chars: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def fold_heuristically(summary: str, evicted: Sequence[MemoryCandidate], cap_tokens: int) -> str:
    """Fold exchanges leaving the recent history into the summary without a model: one clipped line per
    exchange after the summary so far, the whole capped (bounded work, bounded result)."""
    lines = [summary] if summary else []
    lines += [
        f"- asked: {_clip(e.request, _CLIPPED_REQUEST_CHARS)} → answered: {_clip(e.answer, _CLIPPED_ANSWER_CHARS)}"
        for e in evicted
    ]
    return capped_summary("\n".join(lines), cap_tokens)


def summary_prompt(summary: str, evicted: Sequence[MemoryCandidate], cap_tokens: int) -> str:
    """What a summarizing model is asked: fold the exchanges into the summary, within the cap."""
    exchanges = "\n".join(f"user: {e.request}\nassistant: {e.answer}" for e in evicted)
    return (
        f"Update the summary of a conversation with the exchanges below. Keep facts, names, decisions and "
        f"open questions; at most {cap_tokens * 3 // 4} words.\n\n<summary>\n{summary}\n</summary>\n\n"
        f"<exchanges>\n{exchanges}\n</exchanges>"
    )


class ConversationMemory(Protocol):
    async def save(self, candidate: MemoryCandidate, *, request_id: str) -> None: ...

    async def recent(self, conversation_id: str, limit: int = 10) -> list[MemoryCandidate]:
        """The conversation's remembered exchanges, oldest first."""
        ...


class SummarizingMemory(ConversationMemory, Protocol):
    """A conversation memory that keeps a summary of the exchanges older than its recent history."""

    async def summary(self, conversation_id: str) -> str: ...

    async def older(self, conversation_id: str, keep: int) -> list[tuple[str, MemoryCandidate]]: ...

    async def compact(self, conversation_id: str, summary: str, evicted: Sequence[str]) -> None: ...


def _ts(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


# The columns each model is read back from, by name (``_decoded``).
_EVENT_COLUMNS = (
    "event_id",
    "agent_domain",
    "request_id",
    "step_id",
    "tool",
    "entities",
    "outcome",
    "importance",
    "summary",
    "occurred_at",
    "recorded_at",
)
_FACT_COLUMNS = ("key", "value", "source_request_id", "recorded_at")
_FRAGMENT_COLUMNS = ("fragment_id", "title", "text", "entities", "source_request_id", "recorded_at")
_SIGNAL_COLUMNS = ("signal_id", "agent", "activity", "entities", "request_id", "announced_at", "expires_at", "renewals")


def _listed(columns: Sequence[str], table: str = "") -> str:
    """``columns`` as a SELECT lists them, each of the table aliased ``table`` where one is given."""
    return ", ".join(f"{table}.{c}" if table else c for c in columns)


def _decoded(columns: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    """``row``, read as ``columns``, by name as the models take it: ``entities`` from its JSON and the
    ``*_at`` columns (seconds since the epoch) as times."""
    values = dict(zip(columns, row, strict=True))
    if "entities" in values:
        values["entities"] = json.loads(values["entities"])
    for name in columns:
        if name.endswith("_at"):
            values[name] = _ts(values[name])
    return values


def _entity_keys(entities: Sequence[str]) -> list[str]:
    return sorted({e.strip().lower() for e in entities if e and e.strip()})


class ConversationMemoryStore:
    """Conversation memory (what ``remember`` saves, what conversation history reads).

    Args:
        location: A SQLite file (created with its directory), or a PostgreSQL :class:`Database`.
        busy_timeout_seconds: On SQLite, how long a call waits for another process's write lock.
    """

    def __init__(self, location: str | Path | Database, *, busy_timeout_seconds: float = 5.0) -> None:
        self.database, self.path = located(location)
        self.busy_timeout_seconds = busy_timeout_seconds
        if self.database is not None:
            self.database.require(self._migrations())
        else:
            assert self.path is not None
            sqlite.prepare(self.path, self._schema(), self._escapes(), busy_timeout_seconds=busy_timeout_seconds)

    def _schema(self) -> str:
        return _SCHEMA + ";\n" + _SUMMARY_SCHEMA

    def _migrations(self) -> tuple[Migration, ...]:
        return MIGRATIONS[:3]

    def _escapes(self) -> tuple[Migration, ...]:
        return _ESCAPES

    @contextmanager
    def _transaction(self) -> Iterator[EscapedStatements]:
        """One short transaction (on SQLite on a fresh connection, closed afterwards: several processes
        share the file); its ``execute`` and ``executemany`` take ``?`` placeholders on both backends, and
        its text goes in escaped and comes back as it was (``storage.text``)."""
        if self.database is not None:
            with self.database.statements() as db:
                yield EscapedStatements(db)
            return
        assert self.path is not None
        with sqlite.immediate(self.path, busy_timeout_seconds=self.busy_timeout_seconds) as db:
            yield EscapedStatements(db)

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of one query, read in a transaction of its own."""
        with self._transaction() as db:
            return db.execute(sql, params).fetchall()

    def _save(self, candidate: MemoryCandidate, request_id: str) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO conversation_memory VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (conversation_id, request_id) "
                "DO UPDATE SET request = excluded.request, answer = excluded.answer, facts = excluded.facts, "
                "saved_at = excluded.saved_at",
                (
                    candidate.conversation_id,
                    request_id,
                    candidate.request,
                    candidate.answer,
                    json.dumps(candidate.facts, sort_keys=True),
                    time.time(),
                ),
            )

    def _recent(self, conversation_id: str, limit: int) -> list[MemoryCandidate]:
        rows = self._rows(
            "SELECT request, answer, facts FROM conversation_memory WHERE conversation_id = ? "
            "ORDER BY saved_at DESC LIMIT ?",
            (conversation_id, limit),
        )
        return [
            MemoryCandidate(conversation_id=conversation_id, request=r, answer=a, facts=json.loads(f))
            for r, a, f in reversed(rows)
        ]

    def _summary(self, conversation_id: str) -> str:
        with self._transaction() as db:
            row = db.execute(
                "SELECT summary FROM conversation_summary WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
        return row[0] if row else ""

    def _older(self, conversation_id: str, keep: int) -> list[tuple[str, MemoryCandidate]]:
        rows = self._rows(
            "SELECT request_id, request, answer, facts FROM conversation_memory WHERE conversation_id = ? "
            "ORDER BY saved_at DESC",
            (conversation_id,),
        )
        return [
            (i, MemoryCandidate(conversation_id=conversation_id, request=r, answer=a, facts=json.loads(f)))
            for i, r, a, f in reversed(rows[keep:])
        ]

    def _compact(self, conversation_id: str, summary: str, evicted: Sequence[str]) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO conversation_summary VALUES (?, ?, ?) ON CONFLICT (conversation_id) "
                "DO UPDATE SET summary = excluded.summary, saved_at = excluded.saved_at",
                (conversation_id, summary, time.time()),
            )
            db.executemany(
                "DELETE FROM conversation_memory WHERE conversation_id = ? AND request_id = ?",
                [(conversation_id, request_id) for request_id in evicted],
            )

    async def save(self, candidate: MemoryCandidate, *, request_id: str) -> None:
        await asyncio.to_thread(self._save, candidate, request_id)

    async def recent(self, conversation_id: str, limit: int = 10) -> list[MemoryCandidate]:
        return await asyncio.to_thread(self._recent, conversation_id, limit)

    async def summary(self, conversation_id: str) -> str:
        """The saved summary of the conversation's older exchanges ("" when none)."""
        return await asyncio.to_thread(self._summary, conversation_id)

    async def older(self, conversation_id: str, keep: int) -> list[tuple[str, MemoryCandidate]]:
        """The exchanges before the latest ``keep``, oldest first, with the request ids they were saved by."""
        return await asyncio.to_thread(self._older, conversation_id, keep)

    async def compact(self, conversation_id: str, summary: str, evicted: Sequence[str]) -> None:
        """Save the new summary and drop the exchanges it now covers, in one transaction."""
        await asyncio.to_thread(self._compact, conversation_id, summary, evicted)

    async def recall(self, conversation_id: str) -> RecalledMemory:
        """The conversation's memory as a run loads it: its summary and latest exchanges, oldest first."""
        summary = await self.summary(conversation_id)
        recent = await self.recent(conversation_id, KEPT_EXCHANGES)
        return RecalledMemory(
            summary=summary, exchanges=[MemoryExchange(request=e.request, answer=e.answer) for e in recent]
        )


class MemoryStore(ConversationMemoryStore):
    """The memory backend: conversation memory plus every shared-memory facet of :mod:`hooks.memory`
    (episodic events, user facts, knowledge fragments, activity signals), in one database.

    Args:
        location: A SQLite file (created with its directory), or a PostgreSQL :class:`Database`.
        busy_timeout_seconds: How long a call waits for another process's write lock before it fails
            (open: the hook reports the error and the request continues).
        clock: Wall-clock seconds, for recording times and signal expiry (injectable for tests).
    """

    def __init__(
        self,
        location: str | Path | Database,
        *,
        busy_timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        super().__init__(location, busy_timeout_seconds=busy_timeout_seconds)

    def _schema(self) -> str:
        return _SCHEMA + ";\n" + _SUMMARY_SCHEMA + ";\n" + _SHARED_SCHEMA

    def _migrations(self) -> tuple[Migration, ...]:
        return MIGRATIONS

    def _escapes(self) -> tuple[Migration, ...]:
        return _ESCAPES + _SHARED_ESCAPES

    # -- fail-open plumbing ---------------------------------------------------------------------------

    async def _read(self, what: str, fn: Callable[[], list[T]]) -> ReadResult[T]:
        try:
            return ReadResult("read_succeeded", await asyncio.to_thread(fn))
        except (*store_errors(), ValueError) as err:
            logger.warning("memory %s failed (continuing without it): %s", what, err)
            return ReadResult("read_failed", error=f"{type(err).__name__}: {err}")

    async def _write(self, what: str, fn: Callable[[], dict]) -> WriteResult:
        try:
            return WriteResult("returned", detail=await asyncio.to_thread(fn))
        except (*store_errors(), ValueError) as err:
            logger.warning("memory %s failed (continuing without it): %s", what, err)
            return WriteResult("error", error=f"{type(err).__name__}: {err}")

    # -- episodic events ------------------------------------------------------------------------------

    async def record_events(self, events: Sequence[EpisodicEvent]) -> WriteResult:
        def write() -> dict:
            recorded_at = self.clock()
            inserted = []
            with self._transaction() as db:
                for event in events:
                    cursor = db.execute(
                        "INSERT INTO episodic_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (
                            event.event_id,
                            event.agent_domain,
                            event.request_id,
                            event.step_id,
                            event.tool,
                            json.dumps(event.entities),
                            event.outcome,
                            event.importance,
                            event.summary,
                            event.occurred_at.timestamp(),
                            recorded_at,
                        ),
                    )
                    if cursor.rowcount:
                        inserted.append(event.event_id)
                        db.executemany(
                            "INSERT INTO episodic_entities VALUES (?, ?) ON CONFLICT DO NOTHING",
                            [(entity, event.event_id) for entity in _entity_keys(event.entities)],
                        )
            return {
                "inserted": inserted,
                "already_stored": len(events) - len(inserted),
                "recorded_at": _ts(recorded_at).isoformat(),
            }

        return await self._write("record_events", write)

    async def recent_events(
        self, agent_domain: str, *, entities: Sequence[str], since: datetime, limit: int
    ) -> ReadResult[EpisodicEvent]:
        def read() -> list[EpisodicEvent]:
            keys = _entity_keys(entities)
            columns = _listed(_EVENT_COLUMNS, "e")
            with self._transaction() as db:
                related = []
                if keys:
                    marks = ",".join("?" * len(keys))
                    related = db.execute(
                        f"SELECT DISTINCT {columns} FROM episodic_events e JOIN episodic_entities x ON x.event_id = e.event_id "
                        f"WHERE e.agent_domain = ? AND e.occurred_at >= ? AND x.entity IN ({marks}) "
                        "ORDER BY e.occurred_at DESC LIMIT ?",
                        (agent_domain, since.timestamp(), *keys, limit),
                    ).fetchall()
                recent = db.execute(
                    f"SELECT {columns} FROM episodic_events e WHERE e.agent_domain = ? AND e.occurred_at >= ? "
                    "ORDER BY e.occurred_at DESC LIMIT ?",
                    (agent_domain, since.timestamp(), limit),
                ).fetchall()
            rows = list({row[0]: row for row in [*related, *recent]}.values())[:limit]
            return [EpisodicEvent(**_decoded(_EVENT_COLUMNS, r)) for r in rows]

        return await self._read("recent_events", read)

    # -- user facts -----------------------------------------------------------------------------------

    async def remember_facts(self, facts: Sequence[UserFact]) -> WriteResult:
        def write() -> dict:
            with self._transaction() as db:
                db.executemany(
                    "INSERT INTO user_facts VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, key) DO UPDATE SET "
                    "value = excluded.value, source_request_id = excluded.source_request_id, "
                    "recorded_at = excluded.recorded_at",
                    [(f.user_id, f.key, f.value, f.source_request_id, self.clock()) for f in facts],
                )
            return {"submitted": len(facts)}

        return await self._write("remember_facts", write)

    async def user_facts(self, user_id: str, *, limit: int) -> ReadResult[UserFact]:
        def read() -> list[UserFact]:
            rows = self._rows(
                f"SELECT {_listed(_FACT_COLUMNS)} FROM user_facts WHERE user_id = ? ORDER BY recorded_at DESC LIMIT ?",
                (user_id, limit),
            )
            return [UserFact(user_id=user_id, **_decoded(_FACT_COLUMNS, r)) for r in rows]

        return await self._read("user_facts", read)

    # -- knowledge fragments --------------------------------------------------------------------------

    async def store_fragment(self, fragment: KnowledgeFragment) -> WriteResult:
        def write() -> dict:
            with self._transaction() as db:
                cursor = db.execute(
                    "INSERT INTO knowledge_fragments VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        fragment.fragment_id,
                        fragment.agent_domain,
                        fragment.title,
                        fragment.text,
                        json.dumps(fragment.entities),
                        fragment.source_request_id,
                        self.clock(),
                    ),
                )
                db.executemany(
                    "INSERT INTO knowledge_entities VALUES (?, ?) ON CONFLICT DO NOTHING",
                    [(entity, fragment.fragment_id) for entity in _entity_keys(fragment.entities)],
                )
            return {"inserted": bool(cursor.rowcount)}

        return await self._write("store_fragment", write)

    async def related_fragments(
        self, agent_domain: str, *, entities: Sequence[str], limit: int
    ) -> ReadResult[KnowledgeFragment]:
        def read() -> list[KnowledgeFragment]:
            keys = _entity_keys(entities)
            if not keys:
                return []
            marks = ",".join("?" * len(keys))
            rows = self._rows(
                f"SELECT DISTINCT {_listed(_FRAGMENT_COLUMNS, 'f')} "
                "FROM knowledge_fragments f JOIN knowledge_entities x ON x.fragment_id = f.fragment_id "
                f"WHERE f.agent_domain = ? AND x.entity IN ({marks}) ORDER BY f.recorded_at DESC LIMIT ?",
                (agent_domain, *keys, limit),
            )
            return [KnowledgeFragment(agent_domain=agent_domain, **_decoded(_FRAGMENT_COLUMNS, r)) for r in rows]

        return await self._read("related_fragments", read)

    async def fragments(self, agent_domain: str) -> list[KnowledgeFragment]:
        """Every fragment of the domain, newest first (for inspection; not fail-open)."""

        def read() -> list[KnowledgeFragment]:
            rows = self._rows(
                f"SELECT {_listed(_FRAGMENT_COLUMNS)} FROM knowledge_fragments "
                "WHERE agent_domain = ? ORDER BY recorded_at DESC",
                (agent_domain,),
            )
            return [KnowledgeFragment(agent_domain=agent_domain, **_decoded(_FRAGMENT_COLUMNS, r)) for r in rows]

        return await asyncio.to_thread(read)

    # -- activity coordinator -------------------------------------------------------------------------

    async def announce(self, signal: ActivitySignal, *, ttl_seconds: float) -> WriteResult:
        def write() -> dict:
            now = self.clock()
            expires = now + ttl_seconds
            with self._transaction() as db:
                db.execute(
                    "INSERT INTO activity_signals VALUES (?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT (signal_id) DO UPDATE SET "
                    "agent = excluded.agent, activity = excluded.activity, entities = excluded.entities, "
                    "request_id = excluded.request_id, announced_at = excluded.announced_at, "
                    "expires_at = excluded.expires_at, renewals = 0",
                    (
                        signal.signal_id,
                        signal.agent,
                        signal.activity,
                        json.dumps(signal.entities),
                        signal.request_id,
                        now,
                        expires,
                    ),
                )
            return {"expires_at": _ts(expires).isoformat()}

        return await self._write("announce", write)

    async def renew(self, signal_id: str, *, ttl_seconds: float) -> WriteResult:
        def write() -> dict:
            expires = self.clock() + ttl_seconds
            with self._transaction() as db:
                cursor = db.execute(
                    "UPDATE activity_signals SET expires_at = ?, renewals = renewals + 1 WHERE signal_id = ?",
                    (expires, signal_id),
                )
            found = bool(cursor.rowcount)
            return {"found": found, "expires_at": _ts(expires).isoformat() if found else None}

        return await self._write("renew", write)

    async def remove(self, signal_id: str) -> WriteResult:
        def write() -> dict:
            with self._transaction() as db:
                cursor = db.execute("DELETE FROM activity_signals WHERE signal_id = ?", (signal_id,))
            return {"removed": bool(cursor.rowcount)}

        return await self._write("remove", write)

    async def active(self) -> ReadResult[ActivitySignal]:
        def read() -> list[ActivitySignal]:
            rows = self._rows(
                f"SELECT {_listed(_SIGNAL_COLUMNS)} FROM activity_signals WHERE expires_at > ? ORDER BY announced_at",
                (self.clock(),),
            )
            return [ActivitySignal(**_decoded(_SIGNAL_COLUMNS, r)) for r in rows]

        return await self._read("active signals", read)

    async def signal(self, signal_id: str) -> ActivitySignal | None:
        """One signal, expired or not (for inspection; not fail-open)."""

        def read() -> ActivitySignal | None:
            with self._transaction() as db:
                row = db.execute(
                    f"SELECT {_listed(_SIGNAL_COLUMNS)} FROM activity_signals WHERE signal_id = ?",
                    (signal_id,),
                ).fetchone()
            return ActivitySignal(**_decoded(_SIGNAL_COLUMNS, row)) if row else None

        return await asyncio.to_thread(read)
