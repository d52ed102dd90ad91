"""What the lifecycle costs on top of bare Temporal, measured in one run against the embedded dev server.

    python -m benchmarks.lifecycle_bench            # full run (a few minutes on 2 cores)
    python -m benchmarks.lifecycle_bench --quick    # fewer samples, 25 concurrent (well under a minute)

Prints one JSON document to stdout (progress goes to stderr). Every figure stands beside the bare
Temporal floor measured in the same run: ``BenchFloor`` (see :mod:`benchmarks`), a workflow that runs
the same number of empty activities in the same shape, registered on the same worker.

- ``added_latency_per_hook_invocation``: (T with 20 hooks − T with 0 hooks) / 20 on a request that plans
  no steps; the 20 trivial hooks are split 5/5/5/5 over the four stages. Floor: (T(base + 20 empty
  activities) − T(base)) / 20, where base is the 4 activities a 0-hook request runs (resolve, plan,
  synthesize, 2 persists). Reported for hooks run as activities and as local activities.
- ``standard_request_latency_ms``: p50/p95 of sequential requests that run 6 trivial hook invocations,
  a plan of 3 independent ``stock_quote`` steps (run in parallel) and synthesis: 14 activities. Floor:
  14 empty activities in the same order, the 3 tool slots in parallel.
- ``throughput``: requests/s with 100 standard requests started at once (25 with ``--quick``), and the
  floor's at the same concurrency.
- ``history_events_per_request``: events in one standard request's history, and the floor's.

Server, worker and client share this process's machine: the figures are relative, not capacity planning.
No tracing interceptor or OpenTelemetry SDK is installed unless ``--tracing`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import temporalio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import LifecycleActivities, SQLiteExecutionStore, ToolRegistry
from benchmarks import FLOOR_WORKFLOW_TYPE, FloorBatch, FloorInput, FloorWorkflow, floor_noop
from client.devserver import temporal_cli_path
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import demo_tools
from hooks import HookRegistry, PipelineHook, RunMode
from workflows import WORKFLOW_TYPE, WORKFLOWS, data_converter
from workflows.models import ExecutionResult, Plan, RequestInput, RequestResult, Stage

HOOKS_PER_STAGE_20 = 5  # 20 hooks = 5 per stage
NO_STEP_REQUEST = "Hello, how are you today?"  # the rule planner plans no steps for this
STANDARD_REQUEST = "What is the price of AAA BBB CCC?"  # three independent stock_quote steps

# Activities of a 0-hook request that plans no steps: resolve_pipeline, plan, persist (accepted plan),
# synthesize, persist (terminal).
BASE_SHAPE = [FloorBatch()] * 5
# The standard request: resolve, 2 before_planning, plan, 1 after_planning, persist, 3 tools in
# parallel, 1 after_execution, synthesize, 2 after_synthesis, persist = 14 activities.
STANDARD_SHAPE = [FloorBatch()] * 6 + [FloorBatch(count=3)] + [FloorBatch()] * 5


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# Trivial hooks: each implements one stage and does nothing but return what the stage expects
# --------------------------------------------------------------------------------------------------


class _TrivialHook(PipelineHook):
    def __init__(self, name: str, run_mode: RunMode) -> None:
        self.name = name
        self.run_mode = run_mode


class NoopBeforePlanning(_TrivialHook):
    async def before_planning(self, ctx: Any) -> None:
        return None


class NoopAfterPlanning(_TrivialHook):
    async def after_planning(self, ctx: Any, plan: Plan) -> Plan:
        return plan


class NoopAfterExecution(_TrivialHook):
    async def after_execution(self, ctx: Any, execution: ExecutionResult) -> None:
        return None


class NoopAfterSynthesis(_TrivialHook):
    async def after_synthesis(self, ctx: Any, response: str) -> str:
        return response


_BY_STAGE = {
    Stage.BEFORE_PLANNING: NoopBeforePlanning,
    Stage.AFTER_PLANNING: NoopAfterPlanning,
    Stage.AFTER_EXECUTION: NoopAfterExecution,
    Stage.AFTER_SYNTHESIS: NoopAfterSynthesis,
}


def trivial_hooks(per_stage: dict[Stage, int], run_mode: RunMode = RunMode.ACTIVITY) -> list[PipelineHook]:
    """``per_stage[stage]`` one-stage hooks for each stage, in lifecycle order."""
    hooks: list[PipelineHook] = []
    for stage, cls in _BY_STAGE.items():
        for i in range(per_stage.get(stage, 0)):
            hooks.append(cls(f"noop-{stage.value.replace('_', '-')}-{i + 1}", run_mode))
    return hooks


PIPELINES: dict[str, tuple[dict[Stage, int], RunMode]] = {
    "hooks0": ({}, RunMode.ACTIVITY),
    "hooks20": ({s: HOOKS_PER_STAGE_20 for s in Stage}, RunMode.ACTIVITY),
    "hooks20_local": ({s: HOOKS_PER_STAGE_20 for s in Stage}, RunMode.LOCAL_ACTIVITY),
    # 6 invocations: 2 before_planning, 1 after_planning, 1 after_execution, 2 after_synthesis.
    "standard": (
        {Stage.BEFORE_PLANNING: 2, Stage.AFTER_PLANNING: 1, Stage.AFTER_EXECUTION: 1, Stage.AFTER_SYNTHESIS: 2},
        RunMode.ACTIVITY,
    ),
}


# --------------------------------------------------------------------------------------------------
# Running requests
# --------------------------------------------------------------------------------------------------


@dataclass
class Bench:
    client: Client
    queues: dict[str, str]  # pipeline name -> task queue of its worker

    async def lifecycle(self, pipeline: str, request: str) -> tuple[float, str]:
        """One request through ``RequestLifecycle``; (milliseconds from start to result, workflow id)."""
        workflow_id = f"bench-{pipeline}-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        result = await self.client.execute_workflow(
            WORKFLOW_TYPE,
            RequestInput(request=request),
            id=workflow_id,
            task_queue=self.queues[pipeline],
            result_type=RequestResult,
        )
        elapsed = (time.perf_counter() - started) * 1000.0
        if not isinstance(result, RequestResult):
            raise RuntimeError(f"unexpected result {result!r}")
        return elapsed, workflow_id

    async def floor(self, pipeline: str, batches: Sequence[FloorBatch]) -> tuple[float, str]:
        """One ``BenchFloor`` run on the same worker as ``pipeline``."""
        workflow_id = f"bench-floor-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        await self.client.execute_workflow(
            FLOOR_WORKFLOW_TYPE,
            FloorInput(batches=list(batches)),
            id=workflow_id,
            task_queue=self.queues[pipeline],
            result_type=int,
        )
        return (time.perf_counter() - started) * 1000.0, workflow_id

    async def history_events(self, workflow_id: str) -> list[Any]:
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        return list(history.events)


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


def ratio(value: float, floor: float) -> float | None:
    return round(value / floor, 2) if floor > 0 else None


async def interleaved(
    rounds: int, runs: dict[str, Callable[[], Awaitable[tuple[float, str]]]], ids: dict[str, list[str]] | None = None
) -> dict[str, list[float]]:
    """Run each named coroutine factory ``rounds`` times, round-robin, so drift hits all alike. The
    workflow ids are appended to ``ids[name]`` when ``ids`` is given."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            elapsed, workflow_id = await run()
            samples[name].append(elapsed)
            if ids is not None:
                ids.setdefault(name, []).append(workflow_id)
    return samples


def activity_types(events: Sequence[Any]) -> list[str]:
    found = []
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            found.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            found.append("local:" + event.marker_recorded_event_attributes.marker_name)
    return found


# --------------------------------------------------------------------------------------------------
# The measurements
# --------------------------------------------------------------------------------------------------


async def check_shapes(bench: Bench) -> dict[str, Any]:
    """Run one request of each kind, check it did what the benchmark assumes, and count its history."""
    counts: dict[str, Any] = {}
    for pipeline, request, expected in (
        ("hooks0", NO_STEP_REQUEST, 5),
        ("hooks20", NO_STEP_REQUEST, 25),
        ("hooks20_local", NO_STEP_REQUEST, 25),
        ("standard", STANDARD_REQUEST, 14),
    ):
        _, workflow_id = await bench.lifecycle(pipeline, request)
        events = await bench.history_events(workflow_id)
        types = activity_types(events)
        if len(types) != expected:
            raise RuntimeError(f"{pipeline}: expected {expected} activities, history has {len(types)}: {types}")
        if pipeline == "standard":
            tools = [t for t in types if t == "execute_tool_step"]
            hooks = [t for t in types if t.endswith("_hook")]
            if len(tools) != 3 or len(hooks) != 6:
                raise RuntimeError(f"standard request ran {len(tools)} tools and {len(hooks)} hooks: {types}")
        counts[pipeline] = len(events)
    for name, pipeline, batches in (
        ("floor_base", "hooks0", BASE_SHAPE),
        ("floor_base_plus20", "hooks20", BASE_SHAPE + [FloorBatch()] * 20),
        ("floor_base_plus20_local", "hooks20_local", BASE_SHAPE + [FloorBatch(local=True)] * 20),
        ("floor_standard", "standard", STANDARD_SHAPE),
    ):
        _, workflow_id = await bench.floor(pipeline, batches)
        counts[name] = len(await bench.history_events(workflow_id))
    return counts


async def hook_latency(bench: Bench, rounds: int) -> dict[str, Any]:
    plus20 = BASE_SHAPE + [FloorBatch()] * 20
    plus20_local = BASE_SHAPE + [FloorBatch(local=True)] * 20
    samples = await interleaved(
        rounds,
        {
            "lifecycle_0": lambda: bench.lifecycle("hooks0", NO_STEP_REQUEST),
            "lifecycle_20": lambda: bench.lifecycle("hooks20", NO_STEP_REQUEST),
            "lifecycle_20_local": lambda: bench.lifecycle("hooks20_local", NO_STEP_REQUEST),
            "floor_0": lambda: bench.floor("hooks0", BASE_SHAPE),
            "floor_20": lambda: bench.floor("hooks20", plus20),
            "floor_20_local": lambda: bench.floor("hooks20_local", plus20_local),
        },
    )
    med = {name: statistics.median(values) for name, values in samples.items()}

    def per_hook(with_20: str, with_0: str) -> float:
        return round((med[with_20] - med[with_0]) / 20, 3)

    def figure(life20: str, floor20: str) -> dict[str, Any]:
        life = per_hook(life20, "lifecycle_0")
        floor = per_hook(floor20, "floor_0")
        return {
            "lifecycle_ms": life,
            "floor_ms": floor,
            "ratio_to_floor": ratio(life, floor),
            "added_over_floor_ms": round(life - floor, 3),
            "median_total_ms": {
                "lifecycle_0_hooks": round(med["lifecycle_0"], 2),
                "lifecycle_20_hooks": round(med[life20], 2),
                "floor_0_extra_activities": round(med["floor_0"], 2),
                "floor_20_extra_activities": round(med[floor20], 2),
            },
        }

    return {
        "method": "(median T with 20 hooks - median T with 0 hooks) / 20; sequential requests that plan no "
        "steps; 20 trivial async hooks, 5 per stage; floor: (T(5+20 empty activities) - T(5)) / 20",
        "samples_each": rounds,
        # What a 0-hook request costs beyond 5 empty activities (resolve, plan, persist, synthesize, persist).
        "fixed_overhead_per_request_ms": round(med["lifecycle_0"] - med["floor_0"], 2),
        "activity": figure("lifecycle_20", "floor_20"),
        "local_activity": figure("lifecycle_20_local", "floor_20_local"),
    }


async def standard_latency(bench: Bench, requests: int) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The latency figures, and the history event count of every request measured."""
    ids: dict[str, list[str]] = {}
    samples = await interleaved(
        requests,
        {
            "lifecycle": lambda: bench.lifecycle("standard", STANDARD_REQUEST),
            "floor": lambda: bench.floor("standard", STANDARD_SHAPE),
        },
        ids,
    )
    life, floor = summary(samples["lifecycle"]), summary(samples["floor"])
    # How many workflow tasks the 3 parallel completions take depends on timing, so counts vary a little.
    events = {name: [len(await bench.history_events(w)) for w in workflow_ids] for name, workflow_ids in ids.items()}
    return {
        "method": "sequential requests, lifecycle and floor alternating; 6 trivial hook invocations "
        "(2 before_planning, 1 after_planning, 1 after_execution, 2 after_synthesis), plan, 3 parallel "
        "stock_quote steps, synthesize, 2 persists = 14 activities; floor: 14 empty activities, same shape",
        "lifecycle": life,
        "floor": floor,
        "ratio_p50": ratio(life["p50"], floor["p50"]),
        "ratio_p95": ratio(life["p95"], floor["p95"]),
    }, events


async def burst(run: Callable[[], Awaitable[tuple[float, str]]], concurrency: int) -> tuple[float, list[float]]:
    """Start ``concurrency`` runs at once; (requests/s over the burst, each run's latency)."""
    started = time.perf_counter()
    results = await asyncio.gather(*(run() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return concurrency / elapsed, [r[0] for r in results]


async def throughput(bench: Bench, concurrency: int, rounds: int) -> dict[str, Any]:
    life_rps: list[float] = []
    floor_rps: list[float] = []
    life_lat: list[float] = []
    floor_lat: list[float] = []
    for i in range(rounds):
        log(f"throughput round {i + 1}/{rounds}: {concurrency} concurrent standard requests")
        rps, lat = await burst(lambda: bench.lifecycle("standard", STANDARD_REQUEST), concurrency)
        life_rps.append(rps)
        life_lat.extend(lat)
        log(f"  lifecycle {rps:.1f} req/s; floor next")
        rps, lat = await burst(lambda: bench.floor("standard", STANDARD_SHAPE), concurrency)
        floor_rps.append(rps)
        floor_lat.extend(lat)
        log(f"  floor {rps:.1f} req/s")
    life, floor = statistics.median(life_rps), statistics.median(floor_rps)
    return {
        "method": f"{concurrency} requests started at once; requests / wall time from first start to last "
        f"result; median of {rounds} round(s), lifecycle and floor alternating",
        "concurrency": concurrency,
        "rounds": rounds,
        "lifecycle_rps": round(life, 2),
        "floor_rps": round(floor, 2),
        "ratio_to_floor": ratio(life, floor),
        "lifecycle_rps_rounds": [round(r, 2) for r in life_rps],
        "floor_rps_rounds": [round(r, 2) for r in floor_rps],
        "latency_under_load_ms": {
            "lifecycle": {"p50": round(percentile(life_lat, 50), 1), "p95": round(percentile(life_lat, 95), 1)},
            "floor": {"p50": round(percentile(floor_lat, 50), 1), "p95": round(percentile(floor_lat, 95), 1)},
        },
    }


# --------------------------------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------------------------------


def build_worker(
    client: Client, task_queue: str, pipeline: str, state_dir: Path, store: SQLiteExecutionStore
) -> Worker:
    per_stage, run_mode = PIPELINES[pipeline]
    activities = LifecycleActivities(
        registry=HookRegistry(trivial_hooks(per_stage, run_mode), pipeline=f"bench-{pipeline}"),
        tools=ToolRegistry(demo_tools(state_dir)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=store,
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[*WORKFLOWS, FloorWorkflow],
        activities=[*activities.activities(), floor_noop],
    )


@contextmanager
def bytecode_cache(directory: Path) -> Iterator[None]:
    """Cache compiled bytecode in ``directory`` for the duration, whatever ``PYTHONDONTWRITEBYTECODE`` says.

    The workflow sandbox re-imports the workflow modules for every workflow run. Where
    PYTHONDONTWRITEBYTECODE is set and no .pyc exists, each run compiles them from source, which a
    deployed worker (pip-installed or precompiled) does not. The source tree is left untouched.
    """
    saved = sys.pycache_prefix, sys.dont_write_bytecode
    sys.pycache_prefix, sys.dont_write_bytecode = str(directory), False
    try:
        yield
    finally:
        sys.pycache_prefix, sys.dont_write_bytecode = saved


def cli_version() -> str | None:
    try:
        out = subprocess.run([temporal_cli_path(), "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    hook_rounds = args.hook_rounds or (4 if quick else 20)
    sequential = args.requests or (6 if quick else 30)
    burst_rounds = args.burst_rounds or (1 if quick else 2)
    concurrency = args.concurrency or (25 if quick else 100)
    warmup = 1 if quick else 5
    began = time.perf_counter()
    load_before = os.getloadavg()

    interceptors: list[Any] = []
    if args.tracing:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from temporalio.contrib.opentelemetry import TracingInterceptor

        trace.set_tracer_provider(TracerProvider())  # spans are created and dropped (no exporter)
        interceptors.append(TracingInterceptor())

    with tempfile.TemporaryDirectory(prefix="lifecycle-bench-") as tmp:
        state_dir = Path(tmp)
        store = SQLiteExecutionStore(state_dir / "executions.sqlite3")
        log("starting the embedded dev server (existing binary, in-memory database)")
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli_path(),
            data_converter=data_converter,
            interceptors=interceptors,
            dev_server_log_level="error",
        )
        async with AsyncExitStack() as stack:
            if not args.no_bytecode_cache:
                stack.enter_context(bytecode_cache(state_dir / "pycache"))
            stack.push_async_callback(env.shutdown)
            run_id = uuid.uuid4().hex[:8]
            queues = {name: f"bench-{name}-{run_id}" for name in PIPELINES}
            for name, queue in queues.items():
                await stack.enter_async_context(build_worker(env.client, queue, name, state_dir, store))
            bench = Bench(env.client, queues)

            log("checking each request kind's shape and counting its history events")
            events = await check_shapes(bench)
            log(f"warming up ({warmup} round(s) of every request kind)")
            await hook_latency(bench, warmup)
            await standard_latency(bench, warmup)  # (histories fetched too: that is warm-up as well)
            if not quick:
                await burst(lambda: bench.lifecycle("standard", STANDARD_REQUEST), min(concurrency, 20))
                await burst(lambda: bench.floor("standard", STANDARD_SHAPE), min(concurrency, 20))

            log(f"added latency per hook invocation ({hook_rounds} sequential samples of each of 6 kinds)")
            hooks = await hook_latency(bench, hook_rounds)
            log(f"standard request latency ({sequential} sequential requests, and as many floor runs)")
            standard, standard_events = await standard_latency(bench, sequential)
            log(f"throughput at concurrency {concurrency}")
            rps = await throughput(bench, concurrency, burst_rounds)

    life_events = statistics.median(standard_events["lifecycle"])
    floor_events = statistics.median(standard_events["floor"])
    return {
        "benchmark": "benchmarks.lifecycle_bench",
        "mode": "quick" if quick else "full",
        "environment": {
            "cpu_count": os.cpu_count(),
            "temporalio": temporalio.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "server": "embedded Temporal CLI dev server (in-memory SQLite), worker and client in this process",
            "temporal_cli": cli_version(),
            "tracing": bool(args.tracing),
            "bytecode_cache": not args.no_bytecode_cache,
            # The machine may be shared (other processes compete for the same cores): read the figures
            # as ratios to the floor, which the same load hits alike.
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
        },
        "added_latency_per_hook_invocation": hooks,
        "standard_request_latency_ms": standard,
        "throughput": rps,
        "history_events_per_request": {
            "method": "events in the history of each sequential standard request (and floor run) measured "
            "above: median, min, max; per hook invocation: (events with 20 hooks - events with 0) / 20",
            "lifecycle": life_events,
            "floor": floor_events,
            "ratio_to_floor": ratio(life_events, floor_events),
            "lifecycle_range": [min(standard_events["lifecycle"]), max(standard_events["lifecycle"])],
            "floor_range": [min(standard_events["floor"]), max(standard_events["floor"])],
            "per_hook_invocation": {
                "activity": round((events["hooks20"] - events["hooks0"]) / 20, 2),
                "activity_floor": round((events["floor_base_plus20"] - events["floor_base"]) / 20, 2),
                "local_activity": round((events["hooks20_local"] - events["hooks0"]) / 20, 2),
                "local_activity_floor": round((events["floor_base_plus20_local"] - events["floor_base"]) / 20, 2),
            },
            "first_run_of_each_kind": events,
        },
        "wall_seconds": round(time.perf_counter() - began, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lifecycle_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples: well under a minute")
    parser.add_argument("--concurrency", type=int, help="requests started at once (default 100, quick 25)")
    parser.add_argument("--requests", type=int, help="sequential standard requests (default 30, quick 6)")
    parser.add_argument("--hook-rounds", type=int, help="samples per hook-latency kind (default 20, quick 4)")
    parser.add_argument("--burst-rounds", type=int, help="throughput rounds (default 2, quick 1)")
    parser.add_argument("--tracing", action="store_true", help="install the OTel SDK and TracingInterceptor")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="do not cache bytecode for the run (with PYTHONDONTWRITEBYTECODE set, every sandboxed workflow "
        "run then recompiles the workflow modules from source)",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    # Only the JSON goes to stdout. The dev server (a child process) and the SDK core's native logger
    # write to file descriptor 1 on their own, so fd 1 points at stderr while the benchmark runs and the
    # JSON is written to a duplicate of the original stdout.
    sys.stdout.flush()
    json_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=2)
    with json_out:
        json_out.write(text + "\n")
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
