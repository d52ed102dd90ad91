"""The policy replay's report store: each replayed batch's requests and findings, under (replay id, batch).

A replay writes here and nowhere else. One class serves both backends (its statements are the same on
SQLite and PostgreSQL, like the declared hooks' store): a file path, or a ``postgres.Database`` shared by
workers on several machines. A batch written again (a retried activity) replaces itself, so a resumed
replay never counts a request twice.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from workflows.models import RequestReplay

from . import sqlite
from .schema import Migration, from_sqlite_schema, located
from .text import EscapedStatements, escape_existing

if TYPE_CHECKING:
    from .postgres import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS policy_replay_batches (
    replay_id  TEXT NOT NULL,
    batch      INTEGER NOT NULL,
    requests   TEXT NOT NULL,
    written_at REAL NOT NULL,
    PRIMARY KEY (replay_id, batch)
);
CREATE TABLE IF NOT EXISTS policy_replay_keys (
    replay_id TEXT NOT NULL,
    batch     INTEGER NOT NULL,
    keys      TEXT NOT NULL,
    PRIMARY KEY (replay_id, batch)
);
"""
# Its text is written escaped (``storage.text``) from the second migration on.
_ESCAPES = (escape_existing("policy_replay", 2, _SCHEMA),)
MIGRATIONS = (Migration("policy_replay", 1, from_sqlite_schema(_SCHEMA)), *_ESCAPES)


class ReplayReportStore:
    """Where replays keep what they found.

    Args:
        location: A SQLite file, or a PostgreSQL ``Database``.
    """

    def __init__(self, location: str | Path | Database, *, clock=time.time) -> None:
        self.database, self.path = located(location)
        self._clock = clock
        if self.database is not None:
            self.database.require(MIGRATIONS)
        else:
            assert self.path is not None
            sqlite.prepare(self.path, _SCHEMA, _ESCAPES)

    def migrate(self) -> None:
        """Create the table now (a worker at start-up), not at the first write."""
        if self.database is not None:
            self.database.migrate_sync(MIGRATIONS)

    def _run(self, work):
        """``work(db, now)`` in one transaction, its text escaped on the way in and out (``storage.text``)."""
        if self.database is not None:
            return self.database.run(lambda db, now: work(EscapedStatements(db), now), self._clock)
        assert self.path is not None
        with sqlite.immediate(self.path) as db:
            return work(EscapedStatements(db), self._clock())

    def save_keys(self, replay_id: str, batches: list[list[tuple[str, str]]]) -> None:
        """The records each batch replays (listed once: a retried listing replaces the same rows)."""

        def work(db, now: float) -> None:
            db.execute("DELETE FROM policy_replay_keys WHERE replay_id = ?", (replay_id,))
            for index, keys in enumerate(batches):
                db.execute("INSERT INTO policy_replay_keys VALUES (?, ?, ?)", (replay_id, index, json.dumps(keys)))

        self._run(work)

    def keys(self, replay_id: str, batch: int) -> list[tuple[str, str]]:
        def work(db, now: float) -> list[tuple]:
            return db.execute(
                "SELECT keys FROM policy_replay_keys WHERE replay_id = ? AND batch = ?", (replay_id, batch)
            ).fetchall()

        rows = self._run(work)
        return [(w, r) for w, r in json.loads(rows[0][0])] if rows else []

    def save_batch(self, replay_id: str, batch: int, requests: list[RequestReplay]) -> None:
        text = json.dumps([r.model_dump(mode="json", exclude_none=True) for r in requests])

        def work(db, now: float) -> None:
            db.execute(
                "INSERT INTO policy_replay_batches VALUES (?, ?, ?, ?) ON CONFLICT (replay_id, batch) "
                "DO UPDATE SET requests = excluded.requests, written_at = excluded.written_at",
                (replay_id, batch, text, now),
            )

        self._run(work)

    def requests(self, replay_id: str) -> list[RequestReplay]:
        """Every request the replay has replayed so far, in batch order."""

        def work(db, now: float) -> list[tuple]:
            return db.execute(
                "SELECT requests FROM policy_replay_batches WHERE replay_id = ? ORDER BY batch", (replay_id,)
            ).fetchall()

        return [RequestReplay.model_validate(item) for (text,) in self._run(work) for item in json.loads(text)]

    def delete(self, replay_id: str) -> int:
        def work(db, now: float) -> int:
            db.execute("DELETE FROM policy_replay_keys WHERE replay_id = ?", (replay_id,))
            return db.execute("DELETE FROM policy_replay_batches WHERE replay_id = ?", (replay_id,)).rowcount

        return self._run(work)
