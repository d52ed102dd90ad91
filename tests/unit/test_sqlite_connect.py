"""Several processes opening one new SQLite file at once: SQLite refuses a switch to WAL that meets another
connection's lock at once ("database is locked", its busy timeout unused), so a worker starting beside
another one failed to start. A connection now waits for the lock as for any other."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from storage import sqlite


def test_a_connection_waits_for_a_lock_that_meets_its_switch_to_wal(tmp_path):
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")  # another process, midway through creating the file's schema
    holder.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    try:
        with sqlite.connection(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert db.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        release.join()
        holder.close()
    assert time.monotonic() - started >= 0.25  # it waited for the lock, it did not fail


def test_a_lock_held_past_the_busy_timeout_still_fails_as_locked(tmp_path):
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            sqlite.connect(path, busy_timeout_seconds=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
