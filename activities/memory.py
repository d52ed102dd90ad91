"""Conversation memory: what completed runs remember, per conversation (after before_remember hooks).

The default is one SQLite file, safe for several worker processes. Saving is idempotent per request, so
a retried ``remember`` activity never stores an exchange twice.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Protocol

from workflows.models import MemoryCandidate

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


class ConversationMemory(Protocol):
    async def save(self, candidate: MemoryCandidate, *, request_id: str) -> None: ...

    async def recent(self, conversation_id: str, limit: int = 10) -> list[MemoryCandidate]:
        """The conversation's remembered exchanges, oldest first."""
        ...


class SQLiteConversationMemory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def _save(self, candidate: MemoryCandidate, request_id: str) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO conversation_memory VALUES (?, ?, ?, ?, ?, ?)",
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
        with self._connect() as db:
            rows = db.execute(
                "SELECT request, answer, facts FROM conversation_memory WHERE conversation_id = ? "
                "ORDER BY saved_at DESC LIMIT ?",
                (conversation_id, limit),
            ).fetchall()
        return [
            MemoryCandidate(conversation_id=conversation_id, request=r, answer=a, facts=json.loads(f))
            for r, a, f in reversed(rows)
        ]

    async def save(self, candidate: MemoryCandidate, *, request_id: str) -> None:
        await asyncio.to_thread(self._save, candidate, request_id)

    async def recent(self, conversation_id: str, limit: int = 10) -> list[MemoryCandidate]:
        return await asyncio.to_thread(self._recent, conversation_id, limit)
