"""SQLite the way every store of this project uses it: one file shared by several worker processes.

The execution store, the conversation/shared memory, the response cache and the declared-hook store all
open connections here: autocommit mode, a WAL journal (readers never block the writer) and a busy
timeout (a writer waits for another process's transaction instead of failing). A read-check-write runs
in :func:`immediate`, which takes the write lock up front so two processes cannot interleave it.

What the stores keep is the requests' content: a database file is created readable by its owner alone
(0600; SQLite gives its ``-wal`` and ``-shm`` files the database's mode) in a directory only its owner may
enter (0700), as are the other files the framework writes beside them (:func:`private_directory`,
:func:`private_opener`). A file or directory that exists keeps its mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .schema import Migration

DEFAULT_BUSY_TIMEOUT_SECONDS = 30.0
PRIVATE_DIRECTORY_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_directory(path: str | Path) -> None:
    """Create ``path`` (and its parents) if missing; the directory itself only its owner may enter."""
    Path(path).mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIRECTORY_MODE)


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for ``open()`` that creates a missing file readable by its owner alone."""
    return os.open(path, flags, PRIVATE_FILE_MODE)


def _create_private(path: str | Path) -> None:
    if str(path) == ":memory:" or str(path).startswith("file:") or Path(path).exists():
        return
    private_directory(Path(path).parent)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE))
    except FileExistsError:
        pass  # another process created it first


def connect(
    path: str | Path, *, busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS, foreign_keys: bool = False
) -> sqlite3.Connection:
    """An autocommit connection with WAL and a busy timeout (the caller closes it); a missing database
    file is created 0600."""
    _create_private(path)
    db = sqlite3.connect(path, timeout=busy_timeout_seconds, isolation_level=None)
    try:
        _journal_in_wal(db, busy_timeout_seconds)
        db.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
        if foreign_keys:
            db.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        db.close()
        raise
    return db


def _journal_in_wal(db: sqlite3.Connection, timeout_seconds: float) -> None:
    """Put the file in WAL mode (a no-op once it is). SQLite answers a switch that meets another
    connection's lock — several processes opening a new file at once — with "database is locked" at
    once, without its busy timeout: the switch is tried again until that timeout has passed."""
    deadline = time.monotonic() + timeout_seconds
    pause = 0.01
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if err.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


@contextmanager
def connection(path: str | Path, **options) -> Iterator[sqlite3.Connection]:
    """A :func:`connect` connection for a read or a schema script, closed afterwards."""
    db = connect(path, **options)
    try:
        yield db
    finally:
        db.close()


_WRITERS: dict[str, threading.RLock] = {}
_WRITERS_GUARD = threading.Lock()


def _writer(path: str | Path) -> threading.RLock:
    """The turn this process's writers to the database at ``path`` take (one lock per file)."""
    key = str(path)
    if key != ":memory:" and not key.startswith("file:"):
        key = os.path.realpath(key)
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, threading.RLock())


@contextmanager
def writing(path: str | Path, busy_timeout_seconds: float = DEFAULT_BUSY_TIMEOUT_SECONDS) -> Iterator[None]:
    """Take this process's turn to write to ``path``: held around every write transaction here.

    SQLite lets one writer at a time into a file; one that finds it taken sleeps in steps (1 ms, then up to
    100 ms) and tries again, whatever the other one takes. Many threads of one process writing at once
    (a worker under load) then pay those sleeps over and over: with 32 threads writing small transactions,
    one write in a hundred waits a quarter to half a second (``python -m benchmarks.sqlite_writers``).
    Taking turns on a lock here, each writer starts as soon as the one before it commits; SQLite's wait is
    left to writers of other processes. Waiting longer than ``busy_timeout_seconds`` raises ``database is locked``, as SQLite's own
    wait does. Reentrant: a thread that nests transactions on one file meets SQLite's own lock, as it
    would without this one."""
    with _turn(_writer(path), busy_timeout_seconds):
        yield


@contextmanager
def _turn(lock: threading.RLock, busy_timeout_seconds: float) -> Iterator[None]:
    if not lock.acquire(timeout=busy_timeout_seconds):
        raise sqlite3.OperationalError("database is locked")
    try:
        yield
    finally:
        lock.release()


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on ``db``: committed when the block returns, rolled back when it
    raises. (The stores take their turn to write first: :func:`immediate`, :meth:`ThreadConnections.immediate`.)"""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextmanager
def immediate(path: str | Path, **options) -> Iterator[sqlite3.Connection]:
    """One :func:`transaction` on a fresh connection, in this process's turn to write (:func:`writing`),
    the connection closed afterwards."""
    with (
        writing(path, options.get("busy_timeout_seconds", DEFAULT_BUSY_TIMEOUT_SECONDS)),
        connection(path, **options) as db,
        transaction(db),
    ):
        yield db


_LEDGER = """
CREATE TABLE IF NOT EXISTS agent_schema_migrations (
    component  TEXT NOT NULL,
    version    INTEGER NOT NULL,
    applied_at REAL NOT NULL,
    PRIMARY KEY (component, version)
)
"""


def migrate(path: str | Path, migrations: Sequence[Migration], **options) -> None:
    """Apply each of ``migrations`` the file has not recorded, once, in one immediate transaction: the
    ledger a PostgreSQL store keeps (``storage.postgres.Database.migrate``), in a file several processes
    share. A migration's statements are separated by ``;`` at the end of a line."""
    with immediate(path, **options) as db:
        db.execute(_LEDGER)
        done = set(db.execute("SELECT component, version FROM agent_schema_migrations").fetchall())
        for migration in sorted(migrations, key=lambda m: (m.component, m.version)):
            if (migration.component, migration.version) in done:
                continue
            for statement in migration.sql.split(";\n"):
                if statement.strip():
                    db.execute(statement)
            db.execute(
                "INSERT INTO agent_schema_migrations VALUES (?, ?, ?)",
                (migration.component, migration.version, time.time()),
            )


def prepare(path: str | Path, schema: str, migrations: Sequence[Migration], **options) -> None:
    """Make a store's file ready for use: its directory created private, the tables of ``schema`` (each
    ``IF NOT EXISTS``) and then each of ``migrations`` the file has not recorded."""
    private_directory(Path(path).parent)
    with connection(path, **options) as db:
        db.executescript(schema)
    migrate(path, migrations, **options)


class ThreadConnections:
    """One open :func:`connect` connection to ``path`` per thread, kept for the thread's life: for a
    store whose writes are small and frequent, opening a connection costs more than the write."""

    def __init__(self, path: str | Path, **options) -> None:
        self.path, self.options = path, options
        self._local = threading.local()
        # The file's turn to write, found once (not on every write: it resolves the path).
        self._writer = _writer(path)
        self._busy_timeout = options.get("busy_timeout_seconds", DEFAULT_BUSY_TIMEOUT_SECONDS)

    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = connect(self.path, **self.options)
        return db

    def _discard(self) -> None:
        db = getattr(self._local, "db", None)
        self._local.db = None
        if db is not None:
            db.close()

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for reads (autocommit); closed, and opened anew next time, if the
        block raises an SQLite error."""
        db = self._connection()
        try:
            yield db
        except sqlite3.Error:
            self._discard()
            raise

    @contextmanager
    def immediate(self, *, flush_every_commit: bool = True) -> Iterator[sqlite3.Connection]:
        """As :func:`immediate`, on this thread's connection. A connection whose transaction could not be
        ended cleanly is closed, and the next use opens a new one.

        With ``flush_every_commit`` (the default) the commit is flushed to disk before it returns. Without
        it (``synchronous=NORMAL``) the file stays consistent whatever happens and the commit survives the
        process crashing, but the last commits may be lost if the machine loses power — for data that is
        written again from elsewhere, not for data that exists only here."""
        with _turn(self._writer, self._busy_timeout):
            db = self._connection()
            try:
                db.execute(f"PRAGMA synchronous={'FULL' if flush_every_commit else 'NORMAL'}")
                db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self._discard()
                raise
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    self._discard()
                raise
