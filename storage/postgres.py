"""PostgreSQL the way every store of this project uses it: one database shared by workers on many machines.

A :class:`Database` is one connection pool (``psycopg_pool.AsyncConnectionPool``) to one
``AGENT_DATABASE_URL``, opened on first use, and the schema each store declares, versioned: a store lists
its migrations (component, version, SQL) with :meth:`Database.require`, and :meth:`Database.migrate`
applies the missing ones in order. Migrating is idempotent and safe when several workers start at once —
it runs in one transaction under a transaction-scoped advisory lock, so one worker applies what is
missing and the others find it done. Workers call it at start-up; a store also migrates before its first
statement.

Code that runs in threads (the declared hooks' store) uses the synchronous side: :meth:`Database.run`
runs a read-check-write function in one serializable transaction, retried when PostgreSQL reports a
conflict with a concurrent one, so the function may be written as if it ran alone — the way SQLite's
``BEGIN IMMEDIATE`` lets it — with ``?`` placeholders, as on SQLite.

Pool size: ``AGENT_DATABASE_POOL_SIZE`` connections per worker process (default 10) for each side in
use. A worker runs at most one statement per activity slot at a time, so the pool needs no more
connections than activity slots, and the server's ``max_connections`` must cover every worker's pool.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

from workflows.extras import missing_extra

from .schema import DatabaseUnavailable, Migration

try:
    from psycopg import AsyncConnection, Connection, Cursor
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.errors import DeadlockDetected, SerializationFailure
    from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout
except ImportError as err:
    raise missing_extra("postgres", "stores on PostgreSQL (AGENT_DATABASE_URL)", err) from err

T = TypeVar("T")

DEFAULT_POOL_SIZE = 10
OPEN_TIMEOUT_SECONDS = 15.0
# The advisory lock every migrating worker takes (an arbitrary constant: "agent-lifecycle schema").
MIGRATION_LOCK = 0x6167656E74

_LEDGER = """
CREATE TABLE IF NOT EXISTS agent_schema_migrations (
    component  TEXT NOT NULL,
    version    INTEGER NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (component, version)
)
"""
_RECORD_MIGRATION = "INSERT INTO agent_schema_migrations (component, version) VALUES (%s, %s)"
# Attempts of a serializable transaction that keeps conflicting with concurrent ones.
SERIALIZATION_RETRIES = 20


def _where(url: str) -> str:
    """The URL's host, port and database, never its password."""
    info = conninfo_to_dict(url)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


class Database:
    """A pool to one PostgreSQL database and the migrations the stores on it need.

    Args:
        url: A libpq URL or connection string (``postgresql://user:pass@host:5432/db``).
        pool_size: Connections kept at most by this process.
        open_timeout_seconds: How long opening the pool waits for its first connection.
    """

    def __init__(
        self, url: str, *, pool_size: int = DEFAULT_POOL_SIZE, open_timeout_seconds: float = OPEN_TIMEOUT_SECONDS
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"the database pool needs at least one connection, not {pool_size}")
        self.url = url
        self._size = pool_size
        self._open_timeout = open_timeout_seconds
        self._pool = AsyncConnectionPool(url, min_size=1, max_size=pool_size, open=False)
        self._opened = False
        self._lock: asyncio.Lock | None = None
        self._applied: set[tuple[str, int]] = set()
        self._required: list[Migration] = []
        self._sync_pool: ConnectionPool[Connection] | None = None
        self._sync_lock = threading.Lock()

    def require(self, migrations: Sequence[Migration]) -> None:
        """Declare a store's schema: :meth:`migrate` without arguments applies it with every other one."""
        self._required += [m for m in migrations if m not in self._required]

    @property
    def location(self) -> str:
        """Host, port and database of the URL, never its password."""
        return _where(self.url)

    async def open(self) -> None:
        """Open the pool (waiting for its first connection: a wrong URL fails here, clearly)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._opened:
                try:
                    await self._pool.open(wait=True, timeout=self._open_timeout)
                except PoolTimeout:
                    await self._pool.close()
                    self._pool = AsyncConnectionPool(self.url, min_size=1, max_size=self._size, open=False)
                    raise DatabaseUnavailable(
                        f"no connection to the database within {self._open_timeout:g} s ({self.location})"
                    ) from None
                self._opened = True

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()
            self._opened = False
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Close the synchronous side's pool (the asynchronous side stays as it is)."""
        if self._sync_pool is not None:
            self._sync_pool.close()
            self._sync_pool = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection inside one transaction: committed when the block ends, rolled back when it
        raises."""
        await self.open()
        async with self._pool.connection() as conn, conn.transaction():
            yield conn

    async def migrate(self, migrations: Sequence[Migration] | None = None) -> list[Migration]:
        """Apply the ``migrations`` (by default every store's on this database) it has not seen, in
        order; the ones applied now."""
        migrations = self._required if migrations is None else migrations
        missing = [m for m in migrations if (m.component, m.version) not in self._applied]
        if not missing:
            return []
        applied: list[Migration] = []
        async with self.transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute(_LEDGER)
            cursor = await conn.execute("SELECT component, version FROM agent_schema_migrations")
            done = {(component, version) for component, version in await cursor.fetchall()}
            for migration in sorted(missing, key=lambda m: (m.component, m.version)):
                if (migration.component, migration.version) in done:
                    continue
                await conn.execute(migration.sql)  # type: ignore[arg-type]  # our own constant SQL
                await conn.execute(_RECORD_MIGRATION, (migration.component, migration.version))
                applied.append(migration)
        self._applied.update((m.component, m.version) for m in migrations)
        return applied

    # -- the synchronous side ------------------------------------------------------------------------

    def _sync(self) -> ConnectionPool[Connection]:
        """The synchronous pool, opened on first use with every required migration applied before any
        thread can use it."""
        with self._sync_lock:
            if self._sync_pool is None:
                pool = ConnectionPool(
                    self.url, connection_class=Connection, min_size=1, max_size=self._size, open=False
                )
                try:
                    pool.open(wait=True, timeout=self._open_timeout)
                except PoolTimeout:
                    pool.close()
                    raise DatabaseUnavailable(
                        f"no connection to the database within {self._open_timeout:g} s ({self.location})"
                    ) from None
                self._migrate_on(pool, self._required)
                self._sync_pool = pool
            return self._sync_pool

    def run(self, work: Callable[[QmarkConnection, float], T], clock: Callable[[], float] = time.time) -> T:
        """``work(connection, now)`` in one serializable transaction, run again (with a fresh ``now``) when
        it conflicted with a concurrent transaction — so ``work`` must only touch the database."""
        for attempt in range(SERIALIZATION_RETRIES):
            try:
                with self._sync().connection() as conn, conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                    return work(QmarkConnection(conn), clock())
            except (SerializationFailure, DeadlockDetected):
                if attempt == SERIALIZATION_RETRIES - 1:
                    raise
                time.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise AssertionError("unreachable")

    @contextmanager
    def statements(self) -> Iterator[QmarkConnection]:
        """One read-committed transaction of statements that are each atomic on their own (upserts, single
        updates), with ``?`` placeholders: committed when the block ends, rolled back when it raises."""
        with self._sync().connection() as conn, conn.transaction():
            yield QmarkConnection(conn)

    def migrate_sync(self, migrations: Sequence[Migration] | None = None) -> list[Migration]:
        """:meth:`migrate` from synchronous code."""
        return self._migrate_on(self._sync(), self._required if migrations is None else migrations)

    def _migrate_on(self, pool: ConnectionPool[Connection], migrations: Sequence[Migration]) -> list[Migration]:
        missing = [m for m in migrations if (m.component, m.version) not in self._applied]
        if not missing:
            return []
        applied: list[Migration] = []
        with pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(_LEDGER)
            done = {(c, v) for c, v in conn.execute("SELECT component, version FROM agent_schema_migrations")}
            for migration in sorted(missing, key=lambda m: (m.component, m.version)):
                if (migration.component, migration.version) not in done:
                    conn.execute(migration.sql)  # type: ignore[arg-type]  # our own constant SQL
                    conn.execute(_RECORD_MIGRATION, (migration.component, migration.version))
                    applied.append(migration)
        self._applied.update((m.component, m.version) for m in migrations)
        return applied


class QmarkConnection:
    """A connection whose ``execute`` takes SQLite's ``?`` placeholders, so one read-check-write function
    serves both backends. (The SQL it is given holds no other ``?`` and no ``%``.)"""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self._conn.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]  # our own SQL

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Cursor:
        cursor = self._conn.cursor()
        cursor.executemany(sql.replace("?", "%s"), params)  # type: ignore[arg-type]  # our own SQL
        return cursor
