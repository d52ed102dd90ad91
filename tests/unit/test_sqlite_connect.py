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


def test_the_writers_of_one_process_take_turns_instead_of_meeting_the_lock(tmp_path):
    """Sixteen threads each hold a write transaction for 10 ms, through two stores' connections to one file,
    each connection told by SQLite to fail at once on a lock it meets (``busy_timeout=0``): taking turns in
    the process, none meets another's lock, and every write lands."""
    path = tmp_path / "store.sqlite3"
    with sqlite.immediate(path) as db:
        db.execute("CREATE TABLE t (writer INTEGER, n INTEGER)")
    stores = [sqlite.ThreadConnections(path), sqlite.ThreadConnections(str(path))]
    failures: list[BaseException] = []
    start = threading.Barrier(16)

    def write(writer: int) -> None:
        store = stores[writer % 2]
        with store.reading() as db:
            db.execute("PRAGMA busy_timeout=0")  # SQLite's own wait: none
        start.wait()
        try:
            for n in range(5):
                with store.immediate() as db:
                    db.execute("INSERT INTO t VALUES (?, ?)", (writer, n))
                    time.sleep(0.01)
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with sqlite.connection(path) as db:
        assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 16 * 5


def test_a_turn_not_given_within_the_busy_timeout_fails_as_locked(tmp_path):
    path = tmp_path / "store.sqlite3"
    with sqlite.immediate(path) as db:
        db.execute("CREATE TABLE t (x)")
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with sqlite.immediate(path):
            taken.set()
            done.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(5)
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            with sqlite.ThreadConnections(path, busy_timeout_seconds=0.2).immediate():
                pass
        assert 0.15 <= time.monotonic() - started < 2
    finally:
        done.set()
        holder.join()


@pytest.mark.parametrize("way", ["sqlite", "turns"])
def test_the_writers_benchmark_measures_each_way(way):
    from benchmarks.sqlite_writers import measure

    figures = measure(way, threads=4, writes=40, size=100)
    assert figures["writes_per_second"] > 0
    assert 0 <= figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
