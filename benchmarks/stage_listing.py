"""What listing a request's stage costs the server, side by side: the standard request under bursts of
concurrent requests, on one benchmark worker per stage listing delay (``AGENT_STAGE_LISTING_DELAY_SECONDS``)
and the inline peer, all on one dev server.

    python -m benchmarks.stage_listing                                  # delays 0, 2 and 10 s (5-6 minutes)
    python -m benchmarks.stage_listing --delays 0,2 --rounds 2 --concurrency 50

Each round starts ``--concurrency`` standard requests at once for every kind, in an order shuffled each
round (with a fixed seed), each burst once the server and the workers are idle; per kind: requests per
second, and the CPU per request of the server and of the worker that ran the burst (from ``/proc``).
Prints one JSON document (the medians over the rounds) to stdout, progress and a table to stderr. The
server and the workers are set up as in :mod:`benchmarks.lifecycle_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.bench_worker import STANDARD
from benchmarks.lifecycle_bench import STANDARD_REQUEST, Bench, log, ratio, settle, start_worker
from benchmarks.processes import Server, cpu_seconds, stop_all
from client import Settings, connect
from storage.executions import SQLiteExecutionStore

PEER = "inline peer"


def kind_name(delay: str) -> str:
    return f"lifecycle, delay {delay} s"


async def measure(delays: list[str], rounds: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stage-listing-") as tmp_name:
        tmp = Path(tmp_name)
        state = tmp / "state"
        state.mkdir()
        server = Server(tmp)
        procs = []
        try:
            log(f"starting the dev server and one benchmark worker per delay ({', '.join(delays)} s)")
            await server.start()
            procs.extend(server.procs)
            settings = Settings(temporal_address=server.address, state_dir=state)
            client = await connect(settings)
            store = SQLiteExecutionStore(settings.execution_store_path)
            runs: dict[str, Callable[[], Awaitable[tuple[float, str]]]] = {}
            pid_of: dict[str, int] = {}
            for delay in delays:
                prefix = f"listing-{uuid.uuid4().hex[:8]}"
                home = tmp / f"worker-{delay}"
                home.mkdir()
                extra = {"AGENT_STAGE_LISTING_DELAY_SECONDS": delay, "AGENT_STATE_DIR": str(state)}
                worker = await start_worker(home, server, prefix, True, extra)
                procs.append(worker)
                bench = Bench(client, prefix, store)
                runs[kind_name(delay)] = lambda bench=bench: bench.lifecycle("standard_local", STANDARD_REQUEST)
                pid_of[kind_name(delay)] = worker.pid
                if PEER not in runs:
                    runs[PEER] = lambda bench=bench: bench.peer(STANDARD_REQUEST, STANDARD)
                    pid_of[PEER] = worker.pid
            log("warming up")
            for _ in range(3):
                for run in runs.values():
                    await run()
            samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
            shuffle = random.Random(12)
            for n in range(rounds):
                order = list(runs)
                shuffle.shuffle(order)
                for name in order:
                    await settle([server.pid, *pid_of.values()], limit=30.0)
                    server_before, worker_before = cpu_seconds(server.pid), cpu_seconds(pid_of[name])
                    started = time.perf_counter()
                    await asyncio.gather(*(runs[name]() for _ in range(concurrency)))
                    elapsed = time.perf_counter() - started
                    server_ms = (cpu_seconds(server.pid) - server_before) * 1000.0 / concurrency
                    worker_ms = (cpu_seconds(pid_of[name]) - worker_before) * 1000.0 / concurrency
                    samples[name].append((concurrency / elapsed, server_ms, worker_ms))
                    log(
                        f"  round {n + 1}/{rounds} {name}: {concurrency / elapsed:.1f} req/s, server {server_ms:.0f} ms, worker {worker_ms:.0f} ms per request"
                    )
        finally:
            stop_all(procs)
    result: dict[str, Any] = {
        "benchmark": "benchmarks.stage_listing",
        "method": f"{concurrency} standard requests started at once per kind and round; medians of {rounds} rounds; "
        "CPU per request of the server and of the worker that ran the burst",
        "concurrency": concurrency,
        "rounds": rounds,
    }
    peer_rps = statistics.median(s[0] for s in samples[PEER])
    for name, rows in samples.items():
        rps = statistics.median(s[0] for s in rows)
        result[name] = {
            "rps": round(rps, 2),
            "rps_ratio_to_inline": ratio(rps, peer_rps),
            "server_cpu_ms_per_request": round(statistics.median(s[1] for s in rows), 1),
            "worker_cpu_ms_per_request": round(statistics.median(s[2] for s in rows), 1),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stage_listing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--delays", default="0,2,10", help="stage listing delays in seconds, comma-separated")
    parser.add_argument("--rounds", type=int, default=4, help="bursts of each kind (default 4)")
    parser.add_argument("--concurrency", type=int, default=100, help="requests started at once (default 100)")
    args = parser.parse_args(argv)
    delays = [d.strip() for d in args.delays.split(",") if d.strip()]
    try:
        valid = bool(delays) and all(float(d) >= 0 for d in delays)
    except ValueError:
        valid = False
    if not valid:
        parser.error(f"--delays: one or more delays of 0 seconds or more, comma-separated (not {args.delays!r})")
    result = asyncio.run(measure(delays, args.rounds, args.concurrency))
    log("medians:")
    for name in [*map(kind_name, delays), PEER]:
        row = result[name]
        print(
            f"  {name:26s} {row['rps']:6.2f} req/s ({row['rps_ratio_to_inline']}x)  server {row['server_cpu_ms_per_request']:6.1f} ms"
            f"  worker {row['worker_cpu_ms_per_request']:6.1f} ms per request",
            file=sys.stderr,
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
