"""The lifecycle against the OpenAI Agents SDK on Temporal, side by side in one run.

    python -m benchmarks.peer                      # full run: both model latencies (about 10 minutes on 2 cores)
    python -m benchmarks.peer --timeline           # also one request of each system, event by event
    python -m benchmarks.peer --short              # CI mode: a few requests each (under a minute)
    python -m benchmarks.peer --output peer.json   # also write every figure and run as JSON

Three systems answer the same request on one dev server (set up to measure like a deployed server:
:data:`benchmarks.processes.SERVER_DYNAMIC_CONFIG`), each with its own worker process, all calling one
model server in a process of its own (:mod:`benchmarks.peer.model_server`): the lifecycle with one
planning phase (``lifecycle_1``), the lifecycle with its defaults (``lifecycle_3``: three phases) and the
peer (``peer``). This process is the client; neither its CPU nor the model server's is counted.

Per model latency (0 and 50 ms by default), after a warm-up:

- **p50 sequential**: ``--runs`` runs of ``--requests`` rounds, each round one request of every system
  (the order rotating each round: A B C, B C A, C A B, ...); each run's p50 per system. The table shows
  the median of the runs' p50s and their range.
- **throughput at N concurrent** and **CPU per request**: ``--bursts`` rounds, each one burst of N
  requests per system (rotating order), each burst once the processes are idle; requests per second over
  the burst, and the user + system CPU of the dev server and of that system's worker (from ``/proc``)
  over the burst, per request. Median and range of the bursts.
- **model calls per request**: calls the model server received from each system (each sends its own
  model name) over the measured requests, per request.
- **history per request**: events and serialized bytes of one request's history (and the bytes the
  lifecycle keeps out of it by reference, in its payload store).

Every request is checked: its answer must be the model's text written from all three quotes; the first
request of each system is checked further (its hooks all ran, its steps succeeded, its record's model
calls match the server's count). The processes may only talk to 127.0.0.1: each refuses and reports any
other connection (:mod:`benchmarks.peer.loopback`), and the run fails if any was tried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
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

from activities import SQLiteExecutionStore
from benchmarks.lifecycle_bench import percentile, settle
from benchmarks.peer import LIFECYCLE_PHASES, PEER_MODEL, REQUEST, lifecycle_model
from benchmarks.peer.loopback import MARK
from benchmarks.peer.model_server import expected_answer
from benchmarks.peer.timeline import breakdown, format_timeline, history_figures
from benchmarks.peer.workers import PEER_QUEUE, POLLING, queue_name
from benchmarks.processes import SERVER_DYNAMIC_CONFIG, Server, cpu_seconds, spawn, stop_all
from client import Settings, connect
from workflows import WORKFLOW_TYPE
from workflows import search_attributes as sa
from workflows.models import RequestInput, RequestResult, StepStatus

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS: tuple[str, ...] = ("lifecycle_1", "lifecycle_3", "peer")
LABELS = {
    "lifecycle_1": "lifecycle, 1 planning phase",
    "lifecycle_3": "lifecycle, defaults (3 phases)",
    "peer": "peer",
}
MODELS = {**{system: lifecycle_model(system) for system in LIFECYCLE_PHASES}, "peer": PEER_MODEL}
LIFECYCLE_HOOKS = {
    "noop-before-planning-1",
    "noop-before-planning-2",
    "noop-after-planning-1",
    "noop-after-execution-1",
    "noop-after-synthesis-1",
    "noop-after-synthesis-2",
}
PEER_HOOKS = {"screen-request", "tag-request", "on_llm_end", "on_tool_end", "check-answer", "tag-answer"}


def log(message: str) -> None:
    print(f"[peer-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Options:
    latencies: tuple[float, ...] = (0.0, 50.0)
    runs: int = 5
    requests: int = 20
    concurrency: int = 50
    bursts: int = 5
    warmup: int = 3  # sequential rounds (and one small burst per system) before each latency's figures
    timeline: bool = False

    @classmethod
    def short(cls) -> Options:
        return cls(runs=2, requests=1, concurrency=4, bursts=2, warmup=0, timeline=True)


class WrongAnswer(RuntimeError):
    """A system answered the scripted request with something else than the scripted answer."""


class Rig:
    """The dev server, the model server, the two worker processes and the clients, in a temporary directory."""

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
        port = await _wait_for_line(model_log, "model server listening on", self.procs[-1])
        self.model_url = f"http://127.0.0.1:{port.split()[-1]}/v1"
        self.stats_url = f"http://127.0.0.1:{port.split()[-1]}"
        env = dict(os.environ)
        env.update(
            TEMPORAL_ADDRESS=self.server.address,
            AGENT_STATE_DIR=str(self.tmp / "state"),
            PYTHONUNBUFFERED="1",
            OTEL_TRACES_EXPORTER="none",
            OTEL_METRICS_EXPORTER="none",
        )
        # A deployed worker runs precompiled code; the sandbox would otherwise compile the peer's workflow
        # module from source on every run when PYTHONDONTWRITEBYTECODE is set.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.tmp / "pycache")
        for system in ("lifecycle", "peer"):
            args = [sys.executable, "-m", "benchmarks.peer.workers", system, "--queue-prefix", self.prefix]
            proc = spawn([*args, "--model-url", self.model_url], self.tmp / f"{system}-worker.log", cwd=ROOT, env=env)
            self.procs.append(proc)
            self.workers[system] = proc
        for system, proc in self.workers.items():
            await _wait_for_line(self.tmp / f"{system}-worker.log", POLLING, proc)
        settings = Settings(temporal_address=self.server.address, state_dir=self.tmp / "state")
        self.lifecycle_client = await connect(settings)
        self.store = SQLiteExecutionStore(settings.execution_store_path)
        from agents import set_trace_processors
        from temporalio.openai_agents import OpenAIAgentsPlugin

        set_trace_processors([])
        self.peer_client = await Client.connect(self.server.address, plugins=[OpenAIAgentsPlugin()])

    def stop(self) -> None:
        stop_all(self.procs)

    def worker_pid(self, system: str) -> int:
        return self.workers["peer" if system == "peer" else "lifecycle"].pid

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

    async def request(self, system: str) -> tuple[float, str, Any]:
        """One request of ``system``, checked: (milliseconds start to result, workflow id, result)."""
        workflow_id = f"{system}-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        if system == "peer":
            from benchmarks.peer.agents_peer import PEER_WORKFLOW, PeerAnswer, PeerInput

            result: Any = await self.peer_client.execute_workflow(
                PEER_WORKFLOW,
                PeerInput(request=REQUEST),
                id=workflow_id,
                task_queue=queue_name(self.prefix, PEER_QUEUE),
                result_type=PeerAnswer,
            )
            answer = result.answer
        else:
            result = await self.lifecycle_client.execute_workflow(
                WORKFLOW_TYPE,
                RequestInput(request=REQUEST),
                id=workflow_id,
                task_queue=queue_name(self.prefix, system),
                result_type=RequestResult,
                search_attributes=sa.listed_at_start(),  # as the project's client starts a request
            )
            answer = result.response
        elapsed = (time.perf_counter() - started) * 1000.0
        if answer != expected_answer():
            raise WrongAnswer(f"{system} answered {answer!r}, not {expected_answer()!r}")
        return elapsed, workflow_id, result

    async def history(self, system: str, workflow_id: str) -> list[Any]:
        client = self.peer_client if system == "peer" else self.lifecycle_client
        return list((await client.get_workflow_handle(workflow_id).fetch_history()).events)


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


async def check_system(rig: Rig, system: str) -> dict[str, Any]:
    """One request, checked beyond its answer: every hook ran, the three quotes ran and succeeded, the
    model calls the system records are those the model server received."""
    before = rig.model_stats().get(MODELS[system], {})
    _, workflow_id, result = await rig.request(system)
    after = rig.model_stats().get(MODELS[system], {})
    calls = after.get("calls", 0) - before.get("calls", 0)
    events = await rig.history(system, workflow_id)
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    if system == "peer":
        ran = {hook for hook, n in result.hook_invocations.items() if n > 0}
        if ran != PEER_HOOKS:
            raise WrongAnswer(f"peer: hooks that ran {sorted(ran)}, expected {sorted(PEER_HOOKS)}")
        if scheduled.count("stock_quote") != 3 or scheduled.count("invoke_model_activity") != calls:
            raise WrongAnswer(f"peer: activities {scheduled}, {calls} model calls")
        hooks = dict(result.hook_invocations)
    else:
        record = await rig.store.get(workflow_id)
        if record is None:
            raise WrongAnswer(f"{system}: no execution record for {workflow_id}")
        ran = {invocation.hook for invocation in record.pipeline_hooks}
        if ran != LIFECYCLE_HOOKS:
            raise WrongAnswer(f"{system}: hooks that ran {sorted(ran)}, expected {sorted(LIFECYCLE_HOOKS)}")
        if [s.status for s in record.steps] != [StepStatus.SUCCEEDED] * 3:
            raise WrongAnswer(f"{system}: steps {[(s.step_id, s.status) for s in record.steps]}")
        if len(record.model_calls) != calls:
            raise WrongAnswer(f"{system}: the record has {len(record.model_calls)} model calls, the server saw {calls}")
        hooks = {}
        for invocation in record.pipeline_hooks:
            hooks[invocation.hook] = hooks.get(invocation.hook, 0) + 1
    return {"workflow_id": workflow_id, "model_calls": calls, "hook_invocations": hooks, "events": events}


def rotations(systems: Sequence[str], rounds: int) -> list[list[str]]:
    """A B C, B C A, C A B, ...: interleaved, and each system follows each other about as often."""
    return [[systems[(i + j) % len(systems)] for j in range(len(systems))] for i in range(rounds)]


async def sequential(rig: Rig, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    for order in rotations(SYSTEMS, rounds):
        for system in order:
            samples[system].append((await rig.request(system))[0])
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
        "p50_ms": percentile([r[0] for r in results], 50),
    }


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
        before, after = calls_before.get(MODELS[system], {}), calls_after.get(MODELS[system], {})
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
    result: dict[str, Any] = {"model_latency_ms": latency, "systems": {}}
    for system in SYSTEMS:
        result["systems"][system] = {
            "p50_ms": spread([r["p50_ms"] for r in runs[system]]),
            "rps": spread([b["rps"] for b in bursts[system]]),
            "cpu_ms_per_request": spread([b["cpu_ms_per_request"] for b in bursts[system]]),
            "server_cpu_ms_per_request": spread([b["server_cpu_ms_per_request"] for b in bursts[system]]),
            "worker_cpu_ms_per_request": spread([b["worker_cpu_ms_per_request"] for b in bursts[system]]),
            "model_calls": model_calls[system],
            "runs": runs[system],
            "bursts": bursts[system],
        }
    return result


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


def _kb(n: float) -> str:
    return f"{n / 1024:.1f} KB"


def table_rows(figures: dict[str, Any]) -> list[list[str]]:
    """The table's rows: model latency, figure, then one cell per system (ratios to the peer)."""
    rows: list[list[str]] = []
    concurrency = figures["options"]["concurrency"]
    for block in figures["latencies"]:
        latency = f"{block['model_latency_ms']:g} ms"
        systems = block["systems"]
        peer = systems["peer"]
        for key, name, fmt in (
            ("p50_ms", "p50 sequential", lambda v: f"{v:.0f} ms"),
            ("rps", f"throughput at {concurrency} concurrent", lambda v: f"{v:.2f} req/s"),
            ("cpu_ms_per_request", "CPU per request, server + worker", lambda v: f"{v:.0f} ms"),
            ("server_cpu_ms_per_request", "of which the dev server", lambda v: f"{v:.0f} ms"),
            ("worker_cpu_ms_per_request", "of which the worker", lambda v: f"{v:.0f} ms"),
        ):
            cells = []
            for system in SYSTEMS:
                s = systems[system][key]
                cell = f"{fmt(s['median'])} [{fmt(s['min'])} – {fmt(s['max'])}]"
                if system != "peer" and peer[key]["median"] > 0:
                    cell = f"{fmt(s['median'])} ({s['median'] / peer[key]['median']:.2f}×) [{fmt(s['min'])} – {fmt(s['max'])}]"
                cells.append(cell)
            rows.append([latency, name, *cells])
    per_request = {
        system: sorted({block["systems"][system]["model_calls"]["per_request"] for block in figures["latencies"]})
        for system in SYSTEMS
    }
    rows.append(["–", "model calls per request", *(" / ".join(f"{v:g}" for v in per_request[s]) for s in SYSTEMS)])
    cells = []
    for system in SYSTEMS:
        h = figures["history"][system]
        cell = f"{h['events']} events, {_kb(h['bytes'])}"
        if h["by_reference_bytes"]:
            cell += f" (+{_kb(h['by_reference_bytes'])} by reference)"
        if system != "peer":
            cell += f" ({h['events'] / figures['history']['peer']['events']:.2f}× events)"
        cells.append(cell)
    rows.append(["–", "history per request", *cells])
    return rows


def format_table(figures: dict[str, Any]) -> str:
    header = ["model latency", "figure", *(LABELS[s] for s in SYSTEMS)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(figures)]
    lines.append("")
    lines.append(
        "Median over runs [range]; p50: each run's p50 of sequential requests; throughput and CPU: one burst per round. "
        "Ratios are to the peer's median."
    )
    return "\n".join(lines)


def format_runs(figures: dict[str, Any]) -> str:
    """Every run and every burst, not only the medians."""
    lines = []
    for block in figures["latencies"]:
        for system in SYSTEMS:
            s = block["systems"][system]
            p50s = ", ".join(f"{r['p50_ms']:.0f}" for r in s["runs"])
            rps = ", ".join(f"{b['rps']:.2f}" for b in s["bursts"])
            cpu = ", ".join(f"{b['cpu_ms_per_request']:.0f}" for b in s["bursts"])
            lines.append(
                f"{block['model_latency_ms']:g} ms {system:<12} p50 per run (ms): {p50s}; req/s per burst: {rps}; "
                f"CPU ms/request per burst: {cpu}"
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
            log("starting the dev server, the model server and the two worker processes")
            await rig.start()
            log("checking each system's request")
            checks = {system: await check_system(rig, system) for system in SYSTEMS}
            # Histories and timelines from a request made once every system is warm, at model latency 0.
            rig.set_latency(0)
            await sequential(rig, options.warmup)
            histories: dict[str, Any] = {}
            timelines: dict[str, str] = {}
            for system in SYSTEMS:
                _, workflow_id, _ = await rig.request(system)
                events = await rig.history(system, workflow_id)
                histories[system] = {**history_figures(events), "breakdown": breakdown(events).as_dict()}
                timelines[system] = format_timeline(f"{LABELS[system]} ({workflow_id})", events)
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
            "openai-agents": _version("openai-agents"),
            "temporalio-openai-agents": _version("temporalio-openai-agents"),
            "server_dynamic_config": list(SERVER_DYNAMIC_CONFIG),
            "loadavg_before": [round(v, 2) for v in load_before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        },
        "checks": {s: {k: v for k, v in c.items() if k != "events"} for s, c in checks.items()},
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
        f"\nopenai-agents {env['openai-agents']}, temporalio-openai-agents {env['temporalio-openai-agents']}, "
        f"temporalio {env['temporalio']}; load average before {env['loadavg_before']}, after {env['loadavg_after']}; "
        f"{figures['wall_seconds']} s; outbound connection attempts: {len(attempts)}"
    )
    return figures


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
    parser.add_argument("--bursts", type=int, help="burst rounds per latency (default 5)")
    parser.add_argument("--timeline", action="store_true", help="print one request of each system, event by event")
    parser.add_argument("--output", type=Path, help="also write every figure as JSON to this file")
    args = parser.parse_args(argv)
    options = Options.short() if args.short else Options()
    if args.latencies:
        options.latencies = tuple(float(v) for v in args.latencies.split(","))
    for name in ("runs", "requests", "concurrency", "bursts"):
        if getattr(args, name):
            setattr(options, name, getattr(args, name))
    options.timeline = options.timeline or args.timeline
    from benchmarks.peer.loopback import guard

    guard()
    figures = asyncio.run(run(options))
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


__all__ = ["Options", "WrongAnswer", "format_table", "main", "run", "table_rows"]

if __name__ == "__main__":
    sys.exit(main())
