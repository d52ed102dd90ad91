"""Many threads of one process writing to one SQLite file, as a worker's record and payload writes do
under load: each writer taking its turn on the process's lock (``storage.sqlite``, what the stores do),
beside each one left to SQLite's own wait for the file's lock (its busy timeout, which sleeps in steps of
up to 100 ms whatever the other writer takes).

    python -m benchmarks.sqlite_writers                  # 32 threads, 600 writes of 3 KB, each way twice
    python -m benchmarks.sqlite_writers --threads 8 --writes 2000

Prints writes per second and the p50, p99 and longest wait-and-write of each way. Everything happens in a
temporary directory.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

from storage import sqlite


def _sqlite_wait_only(path: Path) -> Callable[[], AbstractContextManager[sqlite3.Connection]]:
    """A write transaction on the thread's own connection with nothing but SQLite's busy wait."""
    local = threading.local()

    def transaction() -> AbstractContextManager[sqlite3.Connection]:
        db = getattr(local, "db", None) or sqlite.connect(path)
        local.db = db
        return sqlite.transaction(db)

    return transaction


def measure(way: str, threads: int, writes: int, size: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="sqlite-writers-") as tmp:
        path = Path(tmp) / "store.sqlite3"
        with sqlite.immediate(path) as db:
            db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        transaction = sqlite.ThreadConnections(path).immediate if way == "turns" else _sqlite_wait_only(path)
        waits: list[float] = []

        def write(n: int) -> None:
            started = time.perf_counter()
            with transaction() as db:
                db.execute("INSERT INTO t VALUES (?, ?)", (n, os.urandom(size)))
            waits.append((time.perf_counter() - started) * 1000.0)

        began = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, range(writes)))
        elapsed = time.perf_counter() - began
    waits.sort()
    return {
        "writes_per_second": writes / elapsed,
        "p50_ms": statistics.median(waits),
        "p99_ms": waits[int(len(waits) * 0.99) - 1],
        "max_ms": waits[-1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--writes", type=int, default=600)
    parser.add_argument("--size", type=int, default=3000, help="bytes per row")
    parser.add_argument("--rounds", type=int, default=2, help="each way this many times, alternating")
    args = parser.parse_args(argv)
    for _ in range(args.rounds):
        for way, name in (("sqlite", "SQLite's wait only"), ("turns", "turns in the process")):
            f = measure(way, args.threads, args.writes, args.size)
            print(
                f"{name:<22} {f['writes_per_second']:7.0f} writes/s   p50 {f['p50_ms']:6.1f} ms   "
                f"p99 {f['p99_ms']:6.1f} ms   longest {f['max_ms']:6.1f} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
