"""The lifecycle against the OpenAI Agents SDK and pydantic-ai on Temporal, side by side in one run.

    python -m benchmarks.peer                      # full run: both model latencies (10-15 minutes on 2 cores)
    python -m benchmarks.peer --timeline           # also one request of each system, event by event
    python -m benchmarks.peer --short              # CI mode: a few requests each (about a minute)
    python -m benchmarks.peer --output peer.json   # also write every figure and run as JSON
    python -m benchmarks.peer --combine a.json b.json   # one table of several runs' JSON, pooled

Four systems answer the same request on one dev server (set up to measure like a deployed server:
:data:`benchmarks.processes.SERVER_DYNAMIC_CONFIG`), all calling one model server in a process of its
own (:mod:`benchmarks.peer.model_server`), each framework with its own worker process, each with the
hooks applications put in most (:mod:`benchmarks.peer.policy`):

- ``lifecycle``: the lifecycle's defaults, requests started through the project's client
  (``AgentClient.start`` and ``AgentClient.result``: listed from their start);
- ``lifecycle_plain``: the same pipeline, requests started through a plain Temporal client with only the
  project's data converter (``start_workflow("RequestLifecycle", {"request": ...})``);
- ``openai_agents``: the OpenAI Agents SDK on Temporal (:mod:`benchmarks.peer.agents_peer`);
- ``pydantic_ai``: pydantic-ai's Temporal integration (:mod:`benchmarks.peer.pydantic_peer`).

This process is the client; neither its CPU nor the model server's is counted. Per model latency (0 and
50 ms by default), after a warm-up:

- **p50 and p95 sequential**: ``--runs`` runs of ``--requests`` rounds, each round one request of every
  system (the orders of a balanced Latin square: each system in each place, and after each other system,
  equally often; see :func:`rotations`); each run's p50 and p95 per system. The table shows the median of
  the runs' figures and their range.
- **throughput at N concurrent** and **CPU per request**: ``--bursts`` rounds, each one burst of N
  requests per system (in the same balanced orders), each burst once the processes are idle; requests per
  second over the burst, and the user + system CPU of the dev server and of that system's worker (from
  ``/proc``) over the burst, per request. Median and range of the bursts.
- **model calls per request**: calls the model server received from each system (each sends its own
  model name) over the measured requests, per request.
- **history per request**: events (and how many are markers) and serialized bytes of ``--histories``
  requests' histories, median and range (and the bytes the lifecycle keeps out of them by reference, in
  its payload store); with ``--timeline``, the first of them event by event.

Every request is checked: its answer must be the model's text written from all three quotes; the first
request of each system is checked further (every hook ran, as the lifecycle's record or the peer's hook
counters say; the quotes ran; the model calls each system records are the server's). The processes may
only talk to 127.0.0.1: each refuses and reports any other connection (:mod:`benchmarks.peer.loopback`),
and the run fails if any was tried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import temporalio
from temporalio.client import Client

from benchmarks.lifecycle_bench import percentile, settle
from benchmarks.peer import (
    HOOKS,
    LIFECYCLE,
    LIFECYCLE_PLAIN,
    LIFECYCLES,
    OPENAI_AGENTS,
    PEERS,
    PYDANTIC_AI,
    REQUEST,
    SYSTEMS,
    PeerAnswer,
    PeerInput,
    model_name,
    policy,
)
from benchmarks.peer.loopback import MARK
from benchmarks.peer.model_server import expected_answer
from benchmarks.peer.timeline import breakdown, format_timeline, history_figures
from benchmarks.peer.workers import POLLING, WORKER_KINDS, queue_name, worker_kind
from benchmarks.processes import SERVER_DYNAMIC_CONFIG, Server, cpu_seconds, spawn, stop_all
from client import Settings, connect
from storage.executions import SQLiteExecutionStore
from workflows import WORKFLOW_TYPE, data_converter
from workflows.models import StepStatus

ROOT = Path(__file__).resolve().parents[2]
REQUEST_TIMEOUT = 180.0  # seconds: a burst of 50 on 2 cores takes a few
LABELS: dict[str, str] = {
    LIFECYCLE: "lifecycle, AgentClient",
    LIFECYCLE_PLAIN: "lifecycle, plain client",
    OPENAI_AGENTS: "OpenAI Agents",
    PYDANTIC_AI: "pydantic-ai",
}
PEER_WORKFLOWS: dict[str, str] = {OPENAI_AGENTS: "BenchAgentsPeer", PYDANTIC_AI: "BenchPydanticAIPeer"}
# The activities each peer schedules: its model calls, its tool calls (pydantic-ai names them after the
# agent and its toolset).
PEER_ACTIVITIES: dict[str, tuple[str, str]] = {
    OPENAI_AGENTS: ("invoke_model_activity", "stock_quote"),
    PYDANTIC_AI: ("__model_request", "__call_tool"),
}


def log(message: str) -> None:
    print(f"[peer-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Options:
    latencies: tuple[float, ...] = (0.0, 50.0)
    runs: int = 5
    requests: int = 20
    concurrency: int = 50
    bursts: int = 8  # two cycles of the balanced orders of four systems (see rotations)
    warmup: int = 3  # sequential rounds (and one small burst per system) before each latency's figures
    timeline: bool = False
    histories: int = 10  # sequential rounds whose histories give the history figures

    @classmethod
    def short(cls) -> Options:
        return cls(runs=2, requests=1, concurrency=4, bursts=2, warmup=0, timeline=True, histories=2)


class WrongAnswer(RuntimeError):
    """A system answered the scripted request with something else than the scripted answer, or did not
    do what its hooks and history should show."""


@dataclass
class Answered:
    elapsed_ms: float  # start to result, as the caller waits
    workflow_id: str
    answer: str
    result: Any


class Rig:
    """The dev server, the model server, the worker processes and the clients, in a temporary directory."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.server = Server(tmp)
        self.procs: list[Any] = []
        self.workers: dict[str, Any] = {}
        self.prefix = f"peer-bench-{uuid.uuid4().hex[:8]}"
        self.model_url = ""
        self.stats_url = ""

    async def start(self) -> None:
        (self.tmp / "state").mkdir()
        await self.server.start()
        self.procs.extend(self.server.procs)
        model_log = self.tmp / "model-server.log"
        self.procs.append(spawn([sys.executable, "-m", "benchmarks.peer.model_server"], model_log, cwd=ROOT))
        port = (await _wait_for_line(model_log, "model server listening on", self.procs[-1])).split()[-1]
        self.model_url = f"http://127.0.0.1:{port}/v1"
        self.stats_url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        env.update(
            TEMPORAL_ADDRESS=self.server.address,
            AGENT_STATE_DIR=str(self.tmp / "state"),
            PYTHONUNBUFFERED="1",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
        )
        # A deployed worker runs precompiled code; the sandbox would otherwise compile the peers' workflow
        # modules from source on every run when PYTHONDONTWRITEBYTECODE is set.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.tmp / "pycache")
        for kind in WORKER_KINDS:
            args = [sys.executable, "-m", "benchmarks.peer.workers", kind, "--queue-prefix", self.prefix]
            log_path = self.tmp / f"{kind}-worker.log"
            self.workers[kind] = spawn([*args, "--model-url", self.model_url], log_path, cwd=ROOT, env=env)
            self.procs.append(self.workers[kind])
        for kind, proc in self.workers.items():
            await _wait_for_line(self.tmp / f"{kind}-worker.log", POLLING, proc)
        await self._connect()

    async def _connect(self) -> None:
        from agents import set_trace_processors
        from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
        from temporalio.openai_agents import OpenAIAgentsPlugin

        from client.api import AgentClient

        settings = Settings(
            temporal_address=self.server.address,
            state_dir=self.tmp / "state",
            task_queue=queue_name(self.prefix, LIFECYCLE),
        )
        self.agent_client = AgentClient(await connect(settings), settings)
        self.store = SQLiteExecutionStore(settings.execution_store_path)
        # What a service that knows only Temporal does: its client, the project's data converter, the
        # workflow by its name and its input as JSON.
        self.plain_client = await Client.connect(self.server.address, data_converter=data_converter)
        set_trace_processors([])
        self.peer_clients = {
            OPENAI_AGENTS: await Client.connect(self.server.address, plugins=[OpenAIAgentsPlugin()]),
            PYDANTIC_AI: await Client.connect(self.server.address, plugins=[PydanticAIPlugin()]),
        }

    def stop(self) -> None:
        stop_all(self.procs)

    def worker_pid(self, system: str) -> int:
        return self.workers[worker_kind(system)].pid

    @property
    def pids(self) -> list[int]:
        return [self.server.pid, *(p.pid for p in self.workers.values())]

    def model_stats(self) -> dict[str, dict[str, int]]:
        with urllib.request.urlopen(f"{self.stats_url}/stats", timeout=10) as answer:
            return json.loads(answer.read())["models"]

    def set_latency(self, ms: float) -> None:
        body = json.dumps({"ms": ms}).encode()
        request = urllib.request.Request(f"{self.stats_url}/latency", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def outbound_attempts(self) -> list[str]:
        return [
            f"{path.name}: {line}"
            for path in sorted(self.tmp.glob("*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if MARK in line
        ]

    async def request(self, system: str) -> Answered:
        """One request of ``system`` as its users start it, its answer checked; a request that takes longer
        than :data:`REQUEST_TIMEOUT` seconds (a worker retrying a failing call for ever) fails the run."""
        try:
            return await asyncio.wait_for(self._request(system), REQUEST_TIMEOUT)
        except TimeoutError:
            raise WrongAnswer(f"{system}: no answer in {REQUEST_TIMEOUT:g} s (see the worker logs)") from None

    async def _request(self, system: str) -> Answered:
        started = time.perf_counter()
        if system == LIFECYCLE:
            handle = await self.agent_client.start(REQUEST)
            result: Any = await self.agent_client.result(handle.id)
            workflow_id, answer = handle.id, result.response
        elif system == LIFECYCLE_PLAIN:
            workflow_id = f"plain-{uuid.uuid4().hex[:12]}"
            handle = await self.plain_client.start_workflow(
                WORKFLOW_TYPE, {"request": REQUEST}, id=workflow_id, task_queue=queue_name(self.prefix, system)
            )
            result = await handle.result()
            answer = result["response"]
        else:
            workflow_id = f"{system}-{uuid.uuid4().hex[:12]}"
            result = await self.peer_clients[system].execute_workflow(
                PEER_WORKFLOWS[system],
                PeerInput(request=REQUEST),
                id=workflow_id,
                task_queue=queue_name(self.prefix, system),
                result_type=PeerAnswer,
            )
            answer = result.answer
        elapsed = (time.perf_counter() - started) * 1000.0
        if answer != expected_answer():
            raise WrongAnswer(f"{system} answered {answer!r}, not {expected_answer()!r}")
        return Answered(elapsed, workflow_id, answer, result)

    async def history(self, workflow_id: str) -> list[Any]:
        return list((await self.plain_client.get_workflow_handle(workflow_id).fetch_history()).events)


async def _wait_for_line(path: Path, text: str, proc: Any, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                if text in line:
                    return line
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = path.read_text(errors="replace")[-3000:] if path.exists() else ""
            raise RuntimeError(
                f"{path.name}: no {text!r} ({'exited' if proc.poll() is not None else 'timeout'}):\n{tail}"
            )
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------------------------------
# Checks and measurements
# --------------------------------------------------------------------------------------------------


def scheduled_activities(events: Sequence[Any]) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def check_system(rig: Rig, system: str) -> dict[str, Any]:
    """One request, checked beyond its answer: every hook ran (the lifecycle's record, the peers' hook
    counters), the three quotes ran and succeeded, the model calls the system records are those the
    model server received."""
    before = rig.model_stats().get(model_name(system), {})
    answered = await rig.request(system)
    after = rig.model_stats().get(model_name(system), {})
    calls = after.get("calls", 0) - before.get("calls", 0)
    events = await rig.history(answered.workflow_id)
    scheduled = scheduled_activities(events)
    if system in PEERS:
        hooks = dict(answered.result.hook_invocations)
        model_activity, tool_activity = PEER_ACTIVITIES[system]
        model_activities = sum(name.endswith(model_activity) for name in scheduled)
        tool_activities = sum(name.endswith(tool_activity) for name in scheduled)
        if tool_activities != 3 or model_activities != calls:
            raise WrongAnswer(f"{system}: activities {scheduled}, {calls} model calls")
    else:
        record = await rig.store.get(answered.workflow_id)
        if record is None:
            raise WrongAnswer(f"{system}: no execution record for {answered.workflow_id}")
        hooks = {}
        for invocation in record.pipeline_hooks:
            if invocation.outcome != "succeeded":
                raise WrongAnswer(f"{system}: {invocation.hook} at {invocation.stage}: {invocation.outcome}")
            hooks[invocation.hook] = hooks.get(invocation.hook, 0) + 1
        if [s.status for s in record.steps] != [StepStatus.SUCCEEDED] * 3:
            raise WrongAnswer(f"{system}: steps {[(s.step_id, s.status) for s in record.steps]}")
        if len(record.model_calls) != calls:
            raise WrongAnswer(f"{system}: the record has {len(record.model_calls)} model calls, the server saw {calls}")
        if record.enrichments.get("rag_context") != policy.context_note(REQUEST):
            raise WrongAnswer(f"{system}: the request context did not reach the planner: {record.enrichments}")
        if scheduled.count("execute_tool_step") != 3:
            raise WrongAnswer(f"{system}: activities {scheduled}")
    if set(hooks) != set(HOOKS) or not all(n > 0 for n in hooks.values()):
        raise WrongAnswer(f"{system}: hooks that ran {hooks}, expected each of {list(HOOKS)}")
    return {"workflow_id": answered.workflow_id, "model_calls": calls, "hook_invocations": hooks}


def rotations(systems: Sequence[str], rounds: int) -> list[list[str]]:
    """One order of ``systems`` per round, from a balanced Latin square (Williams'): A B D C, B C A D,
    C D B A, D A C B, then again. Over each cycle of its rows (as many as there are systems; twice as
    many for an odd number) every system takes every place once and follows every other system exactly once
    within a round. A plain rotation (A B C D, B C D A, ...) would always put a system right after the same
    one, so whatever one system's burst leaves behind would fall on the same neighbour every time."""
    n = len(systems)
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    square = [[(start + k) % n for k in first] for start in range(n)]
    if n % 2:  # an odd square is balanced together with its mirror
        square += [list(reversed(row)) for row in square]
    return [[systems[k] for k in square[i % len(square)]] for i in range(rounds)]


async def sequential(rig: Rig, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    for order in rotations(SYSTEMS, rounds):
        for system in order:
            samples[system].append((await rig.request(system)).elapsed_ms)
    return samples


async def burst(rig: Rig, system: str, concurrency: int) -> dict[str, float]:
    pids = {"server": rig.server.pid, "worker": rig.worker_pid(system)}
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    results = await asyncio.gather(*(rig.request(system) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = {name: (cpu_seconds(pid) - cpu_before[name]) * 1000.0 / concurrency for name, pid in pids.items()}
    return {
        "rps": concurrency / elapsed,
        "cpu_ms_per_request": cpu["server"] + cpu["worker"],
        "server_cpu_ms_per_request": cpu["server"],
        "worker_cpu_ms_per_request": cpu["worker"],
        "p50_ms": percentile([r.elapsed_ms for r in results], 50),
    }


async def sample_histories(rig: Rig, rounds: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Each system's history figures over ``rounds`` interleaved requests, and the timeline of its first.

    How many workflow tasks a request takes varies from request to request on every system: parallel
    activities that complete before the workflow task following the first of them starts share that task.
    So one request's history is shown event by event, and the events of all of them give the median and
    the range the table compares."""
    histories: dict[str, Any] = {}
    timelines: dict[str, str] = {}
    sampled: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    for order in rotations(SYSTEMS, max(rounds, 1)):
        for system in order:
            workflow_id = (await rig.request(system)).workflow_id
            events = await rig.history(workflow_id)
            sampled[system].append(history_figures(events))
            if system not in histories:
                histories[system] = {
                    "workflow_id": workflow_id,
                    **sampled[system][0],
                    "activities": scheduled_activities(events),
                    "breakdown": breakdown(events).as_dict(),
                }
                timelines[system] = format_timeline(f"{LABELS[system]} ({workflow_id})", events)
    for system, figures in sampled.items():
        histories[system]["over_requests"] = {
            key: spread([f[key] for f in figures]) for key in ("events", "markers", "bytes", "by_reference_bytes")
        }
    return histories, timelines


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "each": [round(v, 2) for v in values],
    }


async def measure_latency(rig: Rig, latency: float, options: Options) -> dict[str, Any]:
    rig.set_latency(latency)
    if options.warmup:
        log(f"model latency {latency:g} ms: warming up")
        await sequential(rig, options.warmup)
        for system in SYSTEMS:
            await burst(rig, system, min(options.concurrency, 10))
    calls_before = rig.model_stats()
    counted = dict.fromkeys(SYSTEMS, 0)

    log(f"model latency {latency:g} ms: {options.runs} runs of {options.requests} sequential rounds")
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    for run in range(options.runs):
        samples = await sequential(rig, options.requests)
        for system, values in samples.items():
            counted[system] += len(values)
            runs[system].append(
                {"p50_ms": round(percentile(values, 50), 2), "p95_ms": round(percentile(values, 95), 2)}
            )
        log(f"  run {run + 1}: " + ", ".join(f"{s} p50 {runs[s][-1]['p50_ms']:.0f} ms" for s in SYSTEMS))

    log(f"model latency {latency:g} ms: {options.bursts} rounds of a burst of {options.concurrency} per system")
    bursts: dict[str, list[dict[str, float]]] = {system: [] for system in SYSTEMS}
    for i, order in enumerate(rotations(SYSTEMS, options.bursts)):
        for system in order:
            await settle(rig.pids, limit=30.0)
            figures = await burst(rig, system, options.concurrency)
            counted[system] += options.concurrency
            bursts[system].append({k: round(v, 2) for k, v in figures.items()})
            log(
                f"  round {i + 1} {system}: {figures['rps']:.2f} req/s, "
                f"{figures['cpu_ms_per_request']:.0f} ms CPU/request "
                f"(server {figures['server_cpu_ms_per_request']:.0f}, worker {figures['worker_cpu_ms_per_request']:.0f})"
            )
    calls_after = rig.model_stats()
    model_calls = {}
    for system in SYSTEMS:
        before, after = calls_before.get(model_name(system), {}), calls_after.get(model_name(system), {})
        delta = {
            k: after.get(k, 0) - before.get(k, 0) for k in ("calls", "tool_turns", "answer_turns", "blind_answers")
        }
        if delta["blind_answers"]:
            raise WrongAnswer(f"{system}: {delta['blind_answers']} model calls answered without the quotes")
        model_calls[system] = {
            **delta,
            "requests": counted[system],
            "per_request": round(delta["calls"] / counted[system], 3),
        }
    systems = {system: system_figures(runs[system], bursts[system], model_calls[system]) for system in SYSTEMS}
    return {"model_latency_ms": latency, "systems": systems}


def system_figures(
    runs: list[dict[str, Any]], bursts: list[dict[str, float]], model_calls: dict[str, Any]
) -> dict[str, Any]:
    """One system's figures at one model latency: the spread of its runs' p50 and p95 and of its bursts'
    throughput and CPU, its model calls, and every run and burst."""
    return {
        "p50_ms": spread([r["p50_ms"] for r in runs]),
        "p95_ms": spread([r["p95_ms"] for r in runs]),
        "rps": spread([b["rps"] for b in bursts]),
        "cpu_ms_per_request": spread([b["cpu_ms_per_request"] for b in bursts]),
        "server_cpu_ms_per_request": spread([b["server_cpu_ms_per_request"] for b in bursts]),
        "worker_cpu_ms_per_request": spread([b["worker_cpu_ms_per_request"] for b in bursts]),
        "model_calls": model_calls,
        "runs": runs,
        "bursts": bursts,
    }


def combined(outputs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several full runs' figures (each as ``--output`` wrote it) as one: every run and burst of every
    output pooled per system and model latency, the medians and ranges taken over all of them, the model
    calls summed, the histories' samples pooled. The outputs must have measured the same latencies at the
    same concurrency (``ValueError`` otherwise): a table of them compares like with like."""
    if not outputs:
        raise ValueError("no benchmark output to combine")
    first = outputs[0]
    shape = (first["options"]["concurrency"], [b["model_latency_ms"] for b in first["latencies"]])
    for output in outputs[1:]:
        if (output["options"]["concurrency"], [b["model_latency_ms"] for b in output["latencies"]]) != shape:
            raise ValueError("the outputs measured different model latencies or concurrency")
    blocks = []
    for index, block in enumerate(first["latencies"]):
        systems = {}
        for system in SYSTEMS:
            each = [output["latencies"][index]["systems"][system] for output in outputs]
            calls: dict[str, Any] = {k: sum(e["model_calls"][k] for e in each) for k in ("calls", "requests")}
            calls["per_request"] = round(calls["calls"] / calls["requests"], 3)
            runs = [run for e in each for run in e["runs"]]
            systems[system] = system_figures(runs, [b for e in each for b in e["bursts"]], calls)
        blocks.append({"model_latency_ms": block["model_latency_ms"], "systems": systems})
    history = {
        system: {
            "over_requests": {
                key: spread([v for output in outputs for v in output["history"][system]["over_requests"][key]["each"]])
                for key in ("events", "markers", "bytes", "by_reference_bytes")
            }
        }
        for system in SYSTEMS
    }
    return {"options": first["options"], "latencies": blocks, "history": history}


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

FIGURES: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("p50_ms", "p50 sequential", lambda v: f"{v:.0f} ms"),
    ("p95_ms", "p95 sequential", lambda v: f"{v:.0f} ms"),
    ("rps", "throughput at {concurrency} concurrent", lambda v: f"{v:.2f} req/s"),
    ("cpu_ms_per_request", "CPU per request, server + worker", lambda v: f"{v:.0f} ms"),
    ("server_cpu_ms_per_request", "of which the dev server", lambda v: f"{v:.0f} ms"),
    ("worker_cpu_ms_per_request", "of which the worker", lambda v: f"{v:.0f} ms"),
)


def _kb(n: float) -> str:
    return f"{n / 1024:.1f} KB"


def _ratios(value: float, peers: dict[str, float]) -> str:
    """`` (1.05× / 0.98×)``: the value against each peer's, in :data:`PEERS` order."""
    if not all(peers.values()):
        return ""
    return " (" + " / ".join(f"{value / peers[p]:.2f}×" for p in PEERS) + ")"


def table_rows(figures: dict[str, Any]) -> list[list[str]]:
    """The table's rows: model latency, figure, then one cell per system (the lifecycle's with its ratios
    to each peer)."""
    rows: list[list[str]] = []
    concurrency = figures["options"]["concurrency"]
    for block in figures["latencies"]:
        latency = f"{block['model_latency_ms']:g} ms"
        systems = block["systems"]
        for key, name, fmt in FIGURES:
            peers = {p: systems[p][key]["median"] for p in PEERS}
            cells = []
            for system in SYSTEMS:
                s = systems[system][key]
                ratio = _ratios(s["median"], peers) if system in LIFECYCLES else ""
                cells.append(f"{fmt(s['median'])}{ratio} [{fmt(s['min'])} – {fmt(s['max'])}]")
            rows.append([latency, name.format(concurrency=concurrency), *cells])
    per_request = {
        system: sorted({block["systems"][system]["model_calls"]["per_request"] for block in figures["latencies"]})
        for system in SYSTEMS
    }
    rows.append(["–", "model calls per request", *(" / ".join(f"{v:g}" for v in per_request[s]) for s in SYSTEMS)])
    over = {system: figures["history"][system]["over_requests"] for system in SYSTEMS}
    cells = []
    for system in SYSTEMS:
        events, markers = over[system]["events"], over[system]["markers"]["median"]
        cell = f"{events['median']:g} events [{events['min']:g} – {events['max']:g}] ({markers:g} marker{'' if markers == 1 else 's'})"
        if system in LIFECYCLES:
            cell += _ratios(events["median"], {p: over[p]["events"]["median"] for p in PEERS})
        cell += f", {_kb(over[system]['bytes']['median'])}"
        if over[system]["by_reference_bytes"]["median"]:
            cell += f" (+{_kb(over[system]['by_reference_bytes']['median'])} by reference)"
        cells.append(cell)
    rows.append(["–", "history per request", *cells])
    return rows


def format_table(figures: dict[str, Any]) -> str:
    header = ["model latency", "figure", *(LABELS[s] for s in SYSTEMS)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(figures)]
    lines.append("")
    lines.append(
        "Median over runs [min – max]; p50 and p95: each run's, of sequential requests; throughput and CPU: one "
        "burst per round. The lifecycle's ratios are to the medians of " + " / ".join(LABELS[p] for p in PEERS) + "."
    )
    return "\n".join(lines)


# The figures each run's ratios are given for (``--combine``'s table of each run on its own).
RATIO_FIGURES: tuple[tuple[str, str], ...] = (
    ("p50_ms", "p50"),
    ("rps", "throughput"),
    ("cpu_ms_per_request", "CPU per request"),
)


def run_ratio_rows(outputs: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Each run on its own: per output and model latency, the ratio of each lifecycle's median to each
    peer's of that run (``0.98× / 0.92×; 0.93× / 0.87×``: through ``AgentClient``, then a plain client,
    each to OpenAI Agents / pydantic-ai) for p50, throughput and CPU per request. Pooled medians can hide
    how far one run moves from another; these show it."""
    rows: list[list[str]] = []
    for number, output in enumerate(outputs, start=1):
        for block in output["latencies"]:
            systems = block["systems"]
            cells = []
            for key, _ in RATIO_FIGURES:
                peers = {p: systems[p][key]["median"] for p in PEERS}
                cells.append("; ".join(_ratios(systems[s][key]["median"], peers).strip(" ()") for s in LIFECYCLES))
            rows.append([str(number), f"{block['model_latency_ms']:g} ms", *cells])
    return rows


def format_run_ratios(outputs: Sequence[dict[str, Any]]) -> str:
    header = ["run", "model latency", *(name for _, name in RATIO_FIGURES)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in run_ratio_rows(outputs)]
    return "\n".join(lines)


def format_runs(figures: dict[str, Any]) -> str:
    """Every run and every burst, not only the medians."""
    lines = []
    for block in figures["latencies"]:
        for system in SYSTEMS:
            s = block["systems"][system]
            p50s = ", ".join(f"{r['p50_ms']:.0f}" for r in s["runs"])
            p95s = ", ".join(f"{r['p95_ms']:.0f}" for r in s["runs"])
            rps = ", ".join(f"{b['rps']:.2f}" for b in s["bursts"])
            cpu = ", ".join(f"{b['cpu_ms_per_request']:.0f}" for b in s["bursts"])
            lines.append(
                f"{block['model_latency_ms']:g} ms {system:<16} p50 per run (ms): {p50s}; p95: {p95s}; "
                f"req/s per burst: {rps}; CPU ms/request per burst: {cpu}"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


async def run(options: Options, *, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the benchmark and print its table (and timelines); returns every figure."""
    began = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp_name:
        rig = Rig(Path(tmp_name))
        try:
            log("starting the dev server, the model server and the worker processes")
            await rig.start()
            log("checking each system's request")
            checks = {system: await check_system(rig, system) for system in SYSTEMS}
            # Histories and timelines from a request made once every system is warm, at model latency 0.
            rig.set_latency(0)
            await sequential(rig, options.warmup)
            histories, timelines = await sample_histories(rig, options.histories)
            blocks = [await measure_latency(rig, latency, options) for latency in options.latencies]
            attempts = rig.outbound_attempts()
        finally:
            rig.stop()
    if attempts:
        raise RuntimeError("connections beyond 127.0.0.1 were tried:\n" + "\n".join(attempts))
    figures: dict[str, Any] = {
        "benchmark": "benchmarks.peer",
        "options": asdict(options),
        "environment": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "temporalio": temporalio.__version__,
            **{package: _version(package) for package in PACKAGES},
            "server_dynamic_config": list(SERVER_DYNAMIC_CONFIG),
            "loadavg_before": [round(v, 2) for v in load_before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        },
        "checks": checks,
        "history": histories,
        "latencies": blocks,
        "outbound_connection_attempts": attempts,
        "wall_seconds": round(time.perf_counter() - began, 1),
    }
    if options.timeline:
        for system in SYSTEMS:
            out(timelines[system])
            out("")
        figures["timelines"] = timelines
    out(format_table(figures))
    out("")
    out("Every run:")
    out(format_runs(figures))
    env = figures["environment"]
    out(
        "\n"
        + ", ".join(f"{package} {env[package]}" for package in PACKAGES)
        + f", temporalio {env['temporalio']}; load average before {env['loadavg_before']}, "
        f"after {env['loadavg_after']}; {figures['wall_seconds']} s; outbound connection attempts: {len(attempts)}"
    )
    return figures


PACKAGES = ("openai-agents", "temporalio-openai-agents", "pydantic-ai-slim")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--short", action="store_true", help="a few requests each (what CI runs)")
    parser.add_argument("--latencies", help="model latencies in ms, comma-separated (default 0,50)")
    parser.add_argument("--runs", type=int, help="sequential runs per latency (default 5)")
    parser.add_argument("--requests", type=int, help="sequential rounds per run (default 20)")
    parser.add_argument("--concurrency", type=int, help="requests per burst (default 50)")
    parser.add_argument("--bursts", type=int, help="burst rounds per latency (default 8)")
    parser.add_argument("--histories", type=int, help="requests per system whose histories are counted (default 10)")
    parser.add_argument("--timeline", action="store_true", help="print one request of each system, event by event")
    parser.add_argument("--output", type=Path, help="also write every figure as JSON to this file")
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: print one table of the runs these --output files hold, every run and burst pooled",
    )
    args = parser.parse_args(argv)
    if args.combine:
        outputs = [json.loads(path.read_text(encoding="utf-8")) for path in args.combine]
        figures = combined(outputs)
        print(format_table(figures))
        print(
            "\nEach run on its own (ratios of its medians to "
            + " / ".join(LABELS[p] for p in PEERS)
            + "; started through AgentClient, then by a plain client):"
        )
        print(format_run_ratios(outputs))
        print(f"\nEvery run of {len(args.combine)} outputs:")
        print(format_runs(figures))
        return 0
    options = Options.short() if args.short else Options()
    if args.latencies:
        options.latencies = tuple(float(v) for v in args.latencies.split(","))
    for name in ("runs", "requests", "concurrency", "bursts", "histories"):
        if getattr(args, name):
            setattr(options, name, getattr(args, name))
    options.timeline = options.timeline or args.timeline
    from benchmarks.peer.loopback import guard

    guard()

    async def until_stopped() -> dict[str, Any]:
        # SIGTERM cancels the run, which stops every process it started.
        task = asyncio.current_task()
        if task is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await run(options)

    figures = asyncio.run(until_stopped())
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


__all__ = ["Options", "WrongAnswer", "combined", "format_table", "main", "run", "run_ratio_rows", "table_rows"]

if __name__ == "__main__":
    sys.exit(main())
