"""Fault-injection suite: requests of the demo pipeline survive workers killed at every lifecycle point and
a server restart, with the outcomes a user expects, no duplicated side effects, and bounded recovery.

    python -m benchmarks.faults                   # full mode: >= 30 requests, every kill point (a few minutes)
    python -m benchmarks.faults --short           # CI mode: 8 requests, 6 kills (about a minute)
    python -m benchmarks.faults --json out.json   # also write the figures

It starts its own Temporal dev server (a database file in a temporary directory, 127.0.0.1 only) and two
``python worker.py`` subprocesses on one task queue and one state directory, running
:mod:`benchmarks.fault_pipeline` (the demo pipeline, every point slowed and marked). With several requests
in flight it SIGKILLs the worker running a request inside a hook stage, planning, a tool step, synthesis
or the detached audit write, or holding a request that waits at a checkpoint, and it kills and restarts
the server. Then it checks what a user would check: each workflow's result or typed failure against the
expected outcome, the outbox and ledger entries of each request, and how long each kill took to recover
(from the kill until the point completes again; see benchmarks/README.md). Exit code 0 only if every
target is met: 0 lost, 0 duplicated, 0 wrong, 0 stuck, recovery <= 15 s at every kill point, and every
planned kill point killed (full mode: all of them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from benchmarks.fault_pipeline import (
    DETACHED_EFFECT,
    FAULT_DELAY_ENV,
    FAULT_DIR_ENV,
    POINTS,
    TOOL_STEP,
    marker_key,
    scan_markers,
)
from benchmarks.processes import Server, spawn, stop_all
from client import Settings, connect
from client.api import describe_failure, pending_checkpoint, review, start_request
from workflows.models import RequestResult

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_WAIT, SERVER_RESTART = "checkpoint_wait", "server_restart"
KILL_POINTS = (*POINTS, CHECKPOINT_WAIT, SERVER_RESTART)
RECOVERY_TARGET_SECONDS = 15.0
NOTIFY_PREFERENCE_SECONDS = 12.0
# What a client call may raise while the server restarts or a workflow's worker is being replaced.
TRANSIENT = (RPCError, RPCTimeoutOrCancelledError, WorkflowQueryFailedError)
REQUESTS = {  # kind -> ask; Suite.judge checks each kind's expected outcome
    "quote": "What is the price of ACME?",
    "trade": "Buy 10 ACME",
    "message": "Send a message to alice with the price of ACME",
}


@dataclass(frozen=True)
class Mode:
    name: str
    requests: int  # at least this many; more (up to max_requests) while a planned kill point waits for a request
    max_requests: int
    concurrency: int
    delay: float  # seconds each marked point lasts
    stuck_after: float  # a request still running this long after the last kill (or start) is stuck
    kill_gap: tuple[float, float]  # seconds between kills, drawn uniformly
    must_cover: bool  # plan every kill point (else the CI plan: four fixed points and two hook stages)


FULL = Mode("full", 30, 60, 5, 1.0, 120.0, (3.0, 6.0), True)
SHORT = Mode("short", 8, 12, 4, 0.5, 40.0, (0.5, 1.5), False)


def log(message: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Workers:
    """``python worker.py`` subprocesses on one task queue. One that dies without the suite killing it is
    replaced, and its exit is reported."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, Path] = {}
        self.killed: set[int] = set()
        self.unexpected_exits: list[dict[str, Any]] = []

    def start(self) -> int:
        log_path = self.tmp / f"worker-{len(self.procs) + 1}.log"
        proc = spawn([sys.executable, "worker.py"], log_path, cwd=ROOT, env=self.env)
        self.procs[proc.pid], self.logs[proc.pid] = proc, log_path
        return proc.pid

    def alive(self, pid: int | None) -> bool:
        return pid in self.procs and pid not in self.killed and self.procs[pid].poll() is None

    def live(self) -> list[int]:
        return [pid for pid in self.procs if self.alive(pid)]

    async def wait_polling(self, pids: list[int], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        for pid in pids:
            while "worker polling" not in self.logs[pid].read_text(errors="replace"):
                if self.procs[pid].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"worker {pid} did not start: {self.logs[pid].read_text(errors='replace')[-2000:]}"
                    )
                await asyncio.sleep(0.2)

    def check_exits(self) -> None:
        for pid, proc in list(self.procs.items()):
            if pid not in self.killed and proc.poll() is not None:
                self.killed.add(pid)
                tail = self.logs[pid].read_text(errors="replace")[-1500:]
                self.unexpected_exits.append({"pid": pid, "returncode": proc.returncode, "log_tail": tail})
                log(f"worker {pid} exited on its own ({proc.returncode}); starting a replacement")
                self.start()


@dataclass
class Request:
    kind: str
    request_id: str
    started_at: float = 0.0
    closed_at: float | None = None  # when its driver saw the workflow close (or gave up)
    approval_seconds: float | None = None  # how long the review update took to be accepted
    claimed: bool = False  # the killer took over its review
    holder: int | None = None  # at its checkpoint: the worker that ran its last workflow task
    verdict: str = "pending"  # ok | wrong | lost | stuck
    detail: str = ""
    duplicated: bool = False

    @property
    def workflow_id(self) -> str:
        return f"request-{self.request_id}"


@dataclass
class Kill:
    point: str
    key: str  # the marker key, the waiting request's workflow id, or "server"
    pid: int | None
    at: float
    recovered_at: float | None = None
    missed: bool = False  # the point had already completed when the kill landed: not measured
    note: str = ""

    @property
    def recovery(self) -> float | None:
        return None if self.recovered_at is None else round(self.recovered_at - self.at, 2)


class Suite:
    def __init__(self, mode: Mode, tmp: Path, seed: int) -> None:
        self.mode, self.rng = mode, random.Random(seed)
        self.state, self.fault_dir = tmp / "state", tmp / "faults"
        self.server = Server(tmp)
        queue = f"faults-{uuid.uuid4().hex[:8]}"
        # The workers see only this run's settings, whatever the caller's environment configures.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "TEMPORAL_"))}
        env.update(
            {
                "TEMPORAL_ADDRESS": self.server.address,
                "TEMPORAL_TASK_QUEUE": queue,
                "AGENT_STATE_DIR": str(self.state),
                "AGENT_PIPELINE": "benchmarks.fault_pipeline:build_activities",
                FAULT_DIR_ENV: str(self.fault_dir),
                FAULT_DELAY_ENV: str(mode.delay),
                "AGENT_CHECKPOINT_EXPIRY_SECONDS": str(7 * 24 * 3600),
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.workers = Workers(tmp, env)
        self.settings = Settings(temporal_address=self.server.address, task_queue=queue, state_dir=self.state)
        self._client: Client | None = None
        self.requests: list[Request] = []
        self.kills: list[Kill] = []
        self.waiting: dict[str, Request] = {}  # at a checkpoint, not yet approved
        self.planned: set[str] = set()  # the kill points this run must reach
        # Until when the first tool-step kill holds out for a message's send (see target).
        self.notify_preference_until: float | None = None
        self.client_errors: list[str] = []
        self.restart: dict[str, Any] = {}
        self.feeding = True
        self.last_event = self.quiet_at = time.time()  # quiet_at: the last moment no kill was recovering

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the suite is not connected yet")
        return self._client

    # -- requests ------------------------------------------------------------------------------------

    async def retrying(self, what: str, call: Callable[[], Any], timeout: float = 60.0) -> Any:
        """Client calls outlive a server restart: retry what the SDK's own retries gave up on (noted)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await call()
            except TRANSIENT as err:
                if getattr(err, "status", None) == RPCStatusCode.NOT_FOUND or time.monotonic() > deadline:
                    raise
                self.client_errors.append(f"{what}: {err}"[:300])
                await asyncio.sleep(0.5)

    async def drive(self, req: Request) -> None:
        """Start one request, play the reviewer at its checkpoint, and wait until it closes."""
        client, ask = self.client, REQUESTS[req.kind]
        req.started_at = self.last_event = time.time()
        try:
            await self.retrying(
                "start",
                lambda: start_request(
                    client, self.settings, ask, metadata={"cache": "bypass"}, request_id=req.request_id
                ),
            )
        except WorkflowAlreadyStartedError:  # an earlier try got through and its answer was lost
            pass
        handle = client.get_workflow_handle(req.workflow_id)
        if req.kind == "message":
            while await self.retrying("query", lambda: pending_checkpoint(client, req.workflow_id)) is None:
                if (await self.retrying("describe", handle.describe)).status != WorkflowExecutionStatus.RUNNING:
                    return
                await asyncio.sleep(0.2)
            req.holder = await self.holder(req)  # it holds the waiting request in its cache
            self.waiting[req.workflow_id] = req
            # A reviewer takes a moment; longer while the killer still has to kill at a checkpoint and
            # waits for an earlier kill to settle.
            reviewed_at = time.time() + self.rng.uniform(0.3, 1.5)
            while not req.claimed and time.time() < reviewed_at + (15 if CHECKPOINT_WAIT in self.uncovered() else 0):
                await asyncio.sleep(0.1)
            self.waiting.pop(req.workflow_id, None)
            if not req.claimed:
                await self.approve(req)
        while (await self.retrying("describe", handle.describe)).status == WorkflowExecutionStatus.RUNNING:
            await asyncio.sleep(0.3)

    async def approve(self, req: Request) -> None:
        began = time.time()
        while time.time() - began < 60:
            try:
                await review(
                    self.client, req.workflow_id, "approve", "fault-suite", "approved by the fault suite", None
                )
                break
            except ValueError:  # nothing pending: an earlier try was accepted and its answer lost
                break
            except (*TRANSIENT, WorkflowUpdateFailedError) as err:
                self.client_errors.append(f"approve {req.workflow_id}: {type(err).__name__}: {err}"[:300])
                await asyncio.sleep(0.5)
        req.approval_seconds = round(time.time() - began, 2)

    async def feed(self) -> None:
        """Keep ``concurrency`` requests in flight; go on past ``requests`` while a planned kill point is
        still waiting for a request to reach it."""
        slots, tasks, n = asyncio.Semaphore(self.mode.concurrency), [], self.mode.requests
        kinds = ["message"] * round(n * 0.4) + ["trade"] * round(n * 0.25)
        kinds += ["quote"] * (n - len(kinds))
        self.rng.shuffle(kinds)

        async def run(req: Request) -> None:
            try:
                await self.drive(req)
            except Exception as err:  # noqa: BLE001 - judged at the end from what the server says
                self.client_errors.append(f"driving {req.workflow_id}: {type(err).__name__}: {err}"[:300])
            finally:
                req.closed_at = time.time()
                slots.release()

        while kinds or (self.uncovered() and len(self.requests) < self.mode.max_requests):
            await slots.acquire()
            # Past the planned requests, one more only once the running ones have (nearly) finished.
            while not kinds and len(self.active()) > 1 and self.uncovered():
                await asyncio.sleep(0.2)
            if not kinds and not self.uncovered():
                slots.release()
                break
            req = Request(
                kinds.pop() if kinds else self.rng.choice(list(REQUESTS)),
                f"f{len(self.requests) + 1:03d}-{uuid.uuid4().hex[:8]}",
            )
            self.requests.append(req)
            tasks.append(asyncio.create_task(run(req)))
        self.feeding = False
        await asyncio.gather(*tasks)

    def active(self) -> list[Request]:
        return [r for r in self.requests if r.started_at and r.closed_at is None]

    def uncovered(self) -> set[str]:
        return self.planned - {k.point for k in self.kills if not k.missed}

    # -- kills ---------------------------------------------------------------------------------------

    def pending(self) -> list[Kill]:
        return [k for k in self.kills if k.recovered_at is None and not k.missed]

    def recovering(self) -> set[int]:
        """Workers running the retry of a point killed earlier. Killing one would add a second fault to a
        recovery being measured, so they are spared (other requests' work on a killed worker is not)."""
        return {
            pid
            for k in self.pending()
            if k.point in POINTS
            for pid in scan_markers(self.fault_dir, k.point).get(k.key, {}).get("start", {})
        }

    def settling(self) -> bool:
        """An earlier kill's work has not been picked up again yet (no retry start, or no next step of the
        request, within the bound). Until it is, a new kill could hit the worker just taking that work,
        doubling the fault being measured; past the bound the measurement fails whatever happens next."""
        now = time.time()
        return any(
            now - k.at < RECOVERY_TARGET_SECONDS
            and not (k.point in POINTS and self.starts_after(k.at, k.key, points=(k.point,)))
            for k in self.pending()
        )

    def target(self, point: str) -> Any:
        """Something to kill at ``point`` right now, or None."""
        if point != SERVER_RESTART and self.settling():
            return None
        if point == SERVER_RESTART:  # mid-flight: some requests have finished, several are running
            started = sum(1 for r in self.requests if r.started_at)
            if started <= max(self.mode.requests // 3, self.mode.concurrency) or len(self.active()) < 2:
                return False
            # Preferably while no kill is recovering (the restart would be a second fault in its
            # measurement); when recoveries are slow there may be no such moment: then after 20 s anyway.
            return not self.pending() or time.time() - self.quiet_at > 20
        if point == CHECKPOINT_WAIT:  # a waiting request whose worker still holds it
            return next(
                (
                    r
                    for r in self.waiting.values()
                    if self.workers.alive(r.holder) and r.holder not in self.recovering()
                ),
                None,
            )
        killed, busy = {k.key for k in self.kills if k.point == point}, self.recovering()
        fresh = time.time() - self.mode.delay - 5  # an older start without a done is not running normally
        targets = [
            (key, pid)
            for key, kinds in scan_markers(self.fault_dir, point).items()
            if not kinds["done"] and key not in killed  # one kill per request and point: retries are finite
            for pid, started in kinds["start"].items()
            if started > fresh and self.workers.alive(pid) and pid not in busy
        ]
        # The first tool-step kill prefers a message's send, the step with a side effect (its retry must
        # not send twice), while a message request is running — for at most NOTIFY_PREFERENCE_SECONDS, so
        # a run whose messages wait at checkpoints still gets its tool-step kill from another request.
        if point == TOOL_STEP and not any(k.point == TOOL_STEP and k.key.endswith("__notify") for k in self.kills):
            sends = [t for t in targets if t[0].endswith("__notify")]
            if self.notify_preference_until is None:
                self.notify_preference_until = time.time() + NOTIFY_PREFERENCE_SECONDS
            if sends or (
                any(r.kind == "message" for r in self.active()) and time.time() < self.notify_preference_until
            ):
                targets = sends
        return targets[0] if targets else None

    async def kill_loop(self, plan: list[str]) -> None:
        """Kill at the planned points in whatever order requests reach them; in full mode, then at random
        points for as long as requests are being started, so kills spread over the whole run."""
        while (plan or (self.mode.must_cover and self.feeding)) and (self.feeding or self.active()):
            await asyncio.sleep(self.rng.uniform(*self.mode.kill_gap))
            if not plan:
                plan.append(self.rng.choice([p for p in KILL_POINTS if p != SERVER_RESTART]))
            deadline = time.monotonic() + 10
            while (
                chosen := next(((p, t) for p in self.rng.sample(plan, len(plan)) if (t := self.target(p))), None)
            ) is None:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            if chosen is None:
                continue
            point, target = chosen
            if point == SERVER_RESTART:
                await self.restart_server()
            elif point == CHECKPOINT_WAIT and not await self.kill_at_checkpoint(target):
                continue
            elif point != CHECKPOINT_WAIT:
                self.kill_at_marker(point, *target)
            plan.remove(point)
            self.last_event = time.time()
        if plan:
            log(f"not killed (no request reached them in time): {', '.join(plan)}")

    def kill_worker(self, pid: int) -> tuple[float, int]:
        """SIGKILL a worker; the time of the kill, and the replacement started so two are usually up."""
        self.workers.killed.add(pid)
        os.kill(pid, signal.SIGKILL)
        return time.time(), self.workers.start()

    def kill_at_marker(self, point: str, key: str, pid: int) -> None:
        at, replacement = self.kill_worker(pid)
        kill = Kill(point, key, pid, at)
        kill.missed = any(
            t <= kill.at for t in scan_markers(self.fault_dir, point).get(key, {}).get("done", {}).values()
        )
        self.kills.append(kill)
        log(
            f"killed worker {pid} in {point} of {key}{' (missed: it had completed)' if kill.missed else ''}; worker {replacement} started"
        )

    async def kill_at_checkpoint(self, req: Request) -> bool:
        """Kill the worker holding the waiting request (it ran its last workflow task), approve at once.
        If another worker has taken the request meanwhile, only approve: that is not this fault."""
        req.claimed = True
        self.waiting.pop(req.workflow_id, None)
        holder = req.holder
        if (
            holder is None
            or await self.holder(req) != holder
            or not self.workers.alive(holder)
            or holder in self.recovering()
        ):
            await self.approve(req)
            return False
        at, replacement = self.kill_worker(holder)
        self.kills.append(Kill(CHECKPOINT_WAIT, req.workflow_id, req.holder, at, note="the worker holding it"))
        log(
            f"killed worker {req.holder}, holding {req.workflow_id} at its checkpoint; worker {replacement} started; approving"
        )
        await self.approve(req)
        return True

    async def holder(self, req: Request) -> int | None:
        """The worker that ran the request's last workflow task (its ``pid@host`` identity)."""
        history = await self.retrying("history", self.client.get_workflow_handle(req.workflow_id).fetch_history)
        identities = [
            e.workflow_task_completed_event_attributes.identity
            for e in history.events
            if e.HasField("workflow_task_completed_event_attributes")
        ]
        pid = identities[-1].split("@")[0] if identities else ""
        return int(pid) if pid.isdigit() else None

    async def restart_server(self) -> None:
        for kill in self.pending():
            kill.note = "the server restarted during its recovery"
        self.restart.update(workers_before=self.workers.live(), in_flight=[r.workflow_id for r in self.active()])
        os.killpg(self.server.procs[-1].pid, signal.SIGKILL)
        self.server.procs[-1].wait(timeout=10)
        self.kills.append(Kill(SERVER_RESTART, "server", None, time.time()))
        log("killed the server; restarting it on the same port and database")
        await self.server.start()
        self.restart.update(killed_at=self.kills[-1].at, up_at=time.time())
        log(f"server back after {self.restart['up_at'] - self.restart['killed_at']:.1f} s")

    def starts_after(
        self, after: float, key: str | None = None, points: tuple[str, ...] = POINTS
    ) -> list[tuple[float, int]]:
        """(time, pid) of every ``.start`` marker written after ``after``, of one request (or one key) if
        ``key``."""
        return sorted(
            (t, pid)
            for point in points
            for k, kinds in scan_markers(self.fault_dir, point).items()
            if key is None or k == key or k.startswith(key + "__")
            for pid, t in kinds["start"].items()
            if t > after
        )

    def track_recoveries(self) -> None:
        for kill in self.pending():
            if kill.point == SERVER_RESTART:
                later = self.starts_after(self.restart["up_at"]) if "up_at" in self.restart else []
            elif kill.point == CHECKPOINT_WAIT:
                later = self.starts_after(kill.at, marker_key(kill.key))
            else:
                done = scan_markers(self.fault_dir, kill.point).get(kill.key, {}).get("done", {})
                later = sorted((t, pid) for pid, t in done.items() if t > kill.at)
            kill.recovered_at = later[0][0] if later else None

    def restart_evidence(self) -> None:
        """Did workers that lived through the restart make progress after it (they reconnected on their
        own)? And, stricter than the first progress anywhere: when did each request in flight move again?"""
        if "up_at" not in self.restart:
            return
        up, progressed = self.restart["up_at"], {pid for _, pid in self.starts_after(self.restart["up_at"])}
        self.restart["workers_before_with_progress_after"] = sorted(progressed & set(self.restart["workers_before"]))
        # A request's close counts as moving again only if it really closed (not stuck, not lost).
        closed = {r.workflow_id: r.closed_at if r.verdict in ("ok", "wrong") else None for r in self.requests}
        moved = {}
        for workflow_id in self.restart["in_flight"]:
            later = [t for t, _ in self.starts_after(up, marker_key(workflow_id))] + [
                t for t in [closed[workflow_id]] if t and t > up
            ]
            moved[workflow_id] = round(min(later) - self.restart["killed_at"], 2) if later else None
        self.restart["in_flight_moved_after"] = moved

    # -- verdicts ------------------------------------------------------------------------------------

    def journals(self) -> dict[str, dict[str, int]]:
        """Entries per request in the demo's side-effect journals (outbox, ledger; audit per workflow)."""
        counts: dict[str, dict[str, int]] = {}
        for name, owner in (("outbox", "request_id"), ("ledger", "request_id"), ("audit", "workflow_id")):
            path, counts[name] = self.state / f"{name}.jsonl", {}
            for line in filter(str.strip, path.read_text(encoding="utf-8").splitlines() if path.exists() else []):
                value = json.loads(line).get(owner)
                counts[name][value] = counts[name].get(value, 0) + 1
        return counts

    async def judge(self, req: Request, journals: dict[str, dict[str, int]]) -> None:
        """Compare what the server returns for the request with the expected outcome of its kind."""
        handle = self.client.get_workflow_handle(req.workflow_id, result_type=RequestResult)
        outbox, ledger = journals["outbox"].get(req.request_id, 0), journals["ledger"].get(req.request_id, 0)
        # Only entries count: a retried send answering ``replayed: true`` adds none.
        allowed = 1 if req.kind == "message" else 0
        req.duplicated = ledger > 0 or outbox > allowed or journals["audit"].get(req.workflow_id, 0) > 1
        try:
            if (await self.retrying("describe", handle.describe, 30)).status == WorkflowExecutionStatus.RUNNING:
                req.verdict, req.detail = "stuck", "still running at the deadline"
                return
            result, failure = await self.retrying("result", handle.result, 30), None
        except WorkflowFailureError as err:
            result, failure = None, describe_failure(err)
        except Exception as err:  # noqa: BLE001 - not found, or no result: lost to its user
            req.verdict, req.detail = "lost", f"{type(err).__name__}: {err}"
            return
        problems: list[str] = []
        if req.kind == "trade":
            if failure is None or failure["type"] != "RequiredAfterPlanningError":
                problems.append(f"expected RequiredAfterPlanningError, got {failure or 'success'}")
            history = await self.retrying("history", handle.fetch_history)
            scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events]
            if "execute_tool_step" in scheduled:
                problems.append(f"{scheduled.count('execute_tool_step')} tool activities scheduled")
        elif failure is not None or result is None:
            problems.append(f"failed: {failure['type']}: {failure['message'][:200]}" if failure else "no result")
        else:
            expected = [("quote-acme", "succeeded")] + ([("notify", "succeeded")] if req.kind == "message" else [])
            steps = [(s.step_id, s.status) for s in result.steps]
            if steps != expected or result.short_circuit is not None:
                problems.append(f"steps {steps}, short circuit {result.short_circuit}")
            if req.kind == "message" and outbox == 0:
                problems.append("no outbox entry")
        req.verdict, req.detail = ("wrong", "; ".join(problems)) if problems else ("ok", "")

    # -- the run -------------------------------------------------------------------------------------

    def kill_plan(self) -> list[str]:
        if self.mode.must_cover:  # every point once (then more at random: see kill_loop)
            return list(KILL_POINTS)
        # CI: where a lost worker costs most (a side effect, detached work, a cached workflow at a
        # checkpoint, the server), and two hook stages at random.
        others = [p for p in POINTS if p not in (TOOL_STEP, DETACHED_EFFECT)]
        return [TOOL_STEP, DETACHED_EFFECT, CHECKPOINT_WAIT, SERVER_RESTART, *self.rng.sample(others, 2)]

    async def run(self) -> None:
        await self.server.start()
        log(f"server on {self.server.address}; starting 2 workers")
        await self.workers.wait_polling([self.workers.start(), self.workers.start()])
        self._client = await connect(self.settings, tracing=False)
        plan = self.kill_plan()
        self.planned = set(plan)
        tasks = [asyncio.create_task(self.feed()), asyncio.create_task(self.kill_loop(plan))]
        try:
            while not all(t.done() for t in tasks) or self.pending():
                await asyncio.sleep(0.1)
                for task in (t for t in tasks if t.done()):
                    if (error := task.exception()) is not None:
                        raise error
                self.workers.check_exits()
                self.track_recoveries()
                if not self.pending():
                    self.quiet_at = time.time()
                if time.time() > self.last_event + self.mode.stuck_after:
                    log(f"deadline: {self.mode.stuck_after:g} s after the last kill or start")
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        journals = self.journals()
        await asyncio.gather(*(self.judge(req, journals) for req in self.requests))
        self.restart_evidence()

    def figures(self, wall: float, seed: int) -> dict[str, Any]:
        def stats(kills: list[Kill]) -> dict[str, Any]:
            values = [k.recovery for k in kills if k.recovery is not None]
            return {  # an unrecovered kill has no finite recovery: the maximum is then unknown (None)
                "kills": len(kills),
                "unrecovered": len(kills) - len(values),
                "p50": round(statistics.median(values), 2) if values else None,
                "max": max(values) if values and len(values) == len(kills) else None,
            }

        measured = [k for k in self.kills if not k.missed]
        per_point = {point: stats([k for k in measured if k.point == point]) for point in KILL_POINTS}
        verdicts, overall = [r.verdict for r in self.requests], stats(measured)
        totals = {
            "requests": len(self.requests),
            "finished": verdicts.count("ok") + verdicts.count("wrong"),
            "lost": verdicts.count("lost"),
            "duplicated": sum(r.duplicated for r in self.requests),
            "wrong": verdicts.count("wrong"),
            "stuck": verdicts.count("stuck"),
            "recovery_p50": overall["p50"],
            "recovery_max": overall["max"],
            "unrecovered": overall["unrecovered"],
        }
        slow = [
            p for p, f in per_point.items() if f["kills"] and (f["max"] is None or f["max"] > RECOVERY_TARGET_SECONDS)
        ]
        uncovered = sorted(self.uncovered(), key=KILL_POINTS.index)
        targets = {name: totals[name] == 0 for name in ("lost", "duplicated", "wrong", "stuck")}
        targets[f"recovery <= {RECOVERY_TARGET_SECONDS:g} s at every kill point"] = not slow
        targets["every planned kill point killed"] = not uncovered
        try:  # which code was measured: the commit, "-dirty" with uncommitted changes
            tree = subprocess.run(
                ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            tree = ""
        return {
            "mode": self.mode.name,
            "seed": seed,
            "tree": tree or None,
            "wall_seconds": round(wall, 1),
            "settings": asdict(self.mode),
            "totals": totals,
            "per_point": per_point,
            "targets": targets,
            "targets_met": all(targets.values()),
            "slow_points": slow,
            "uncovered_points": uncovered,
            "server_restart": self.restart,
            "requests": [{**asdict(r), "workflow_id": r.workflow_id} for r in self.requests],
            "kills": [{**asdict(k), "recovery": k.recovery} for k in self.kills],
            "unexpected_worker_exits": self.workers.unexpected_exits,
            "workers_started": len(self.workers.procs),
            "client_errors": self.client_errors[:100],
        }


def _s(value: float | None, unrecovered: int = 0) -> str:
    return f"{unrecovered} unrec." if unrecovered else "-" if value is None else f"{value:.1f}s"


def report(figures: dict[str, Any]) -> str:
    """The table a user reads; every figure behind it is in ``--json``."""
    t, restart = figures["totals"], figures["server_restart"]
    lines = [
        f"fault suite: {figures['mode']} mode, seed {figures['seed']}, delay {figures['settings']['delay']:g} s, "
        + f"tree {figures['tree']}, {figures['wall_seconds']:.0f} s wall",
        "",
        "requests  finished  lost  duplicated  wrong  stuck  recovery p50  recovery max",
        f"{t['requests']:>8}  {t['finished']:>8}  {t['lost']:>4}  {t['duplicated']:>10}  {t['wrong']:>5}  {t['stuck']:>5}  "
        + f"{_s(t['recovery_p50']):>12}  {_s(t['recovery_max'], t['unrecovered']):>12}",
        "",
        f"{'kill point':<16} {'kills':>5}  {'p50':>7}  {'max':>9}",
        *(
            f"{p:<16} {f['kills']:>5}  {_s(f['p50']):>7}  {_s(f['max'], f['unrecovered']):>9}"
            for p, f in figures["per_point"].items()
        ),
    ]
    if "in_flight_moved_after" in restart:
        moved = restart["in_flight_moved_after"]
        times = [v for v in moved.values() if v is not None]
        lines += [
            "",
            f"server restart: back after {restart['up_at'] - restart['killed_at']:.1f} s; the {len(moved)} requests in flight "
            + f"moved again within {_s(max(times, default=None))} of the kill"
            + (f" ({len(moved) - len(times)} never did)" if len(times) < len(moved) else ""),
            f"  workers alive before it that made progress after it: {restart['workers_before_with_progress_after']} "
            + f"of {restart['workers_before']}",
        ]
    lines += [
        f"  {k['point']} kill in {k['key']}: {k['note']}"
        for k in figures["kills"]
        if k["note"].startswith("the server")
    ]
    reviews = sorted(
        (r["approval_seconds"], r["workflow_id"]) for r in figures["requests"] if r["approval_seconds"] is not None
    )
    if reviews:  # a reviewer waits for the review update to be accepted: not a kill point's recovery, but felt
        lines += ["", f"review updates: {len(reviews)}, slowest {reviews[-1][0]:.1f} s ({reviews[-1][1]})"]
    bad = [r for r in figures["requests"] if r["verdict"] != "ok" or r["duplicated"]]
    lines += ["", "requests not as expected:"] if bad else []
    lines += [
        f"  {r['workflow_id']} ({r['kind']}): {r['verdict']}{', duplicated' if r['duplicated'] else ''} {r['detail']}"
        for r in bad
    ]
    lines += [f"worker {e['pid']} exited on its own with {e['returncode']}" for e in figures["unexpected_worker_exits"]]
    lines += [
        "",
        "targets:",
        *(f"  {name:<44} {'met' if met else 'NOT MET'}" for name, met in figures["targets"].items()),
    ]
    if figures["slow_points"]:
        lines.append(f"  over the bound or unrecovered: {', '.join(figures['slow_points'])}")
    if figures["uncovered_points"]:
        lines.append(f"  never killed: {', '.join(figures['uncovered_points'])}")
    return "\n".join(lines)


async def run_suite(
    *, short: bool = False, seed: int | None = None, keep: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Run the suite and return its figures (``targets_met``: whether every target was met). ``overrides``
    replace fields of the mode (``requests``, ``concurrency``, ``delay``, ...); None keeps the default."""
    mode = replace(SHORT if short else FULL, **{k: v for k, v in overrides.items() if v is not None})
    seed = random.randrange(1_000_000) if seed is None else seed
    tmp = Path(tempfile.mkdtemp(prefix="fault-suite-"))
    suite, began = Suite(mode, tmp, seed), time.perf_counter()
    log(f"{mode.name} mode, seed {seed}, working directory {tmp}")
    try:
        await suite.run()
        return suite.figures(time.perf_counter() - began, seed)
    finally:  # also on Ctrl-C, SIGTERM and errors: no worker or server outlives the suite
        stop_all([*suite.workers.procs.values(), *suite.server.procs])
        if keep:
            log(f"kept {tmp} (server and worker logs, markers, state)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.faults", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--short", action="store_true", help="CI mode: 8 requests, 6 kills")
    parser.add_argument("--seed", type=int, help="random seed (printed; the same seed makes the same choices)")
    parser.add_argument(
        "--requests", type=int, help="requests to run (full mode adds more until every point is killed)"
    )
    parser.add_argument("--concurrency", type=int, help="requests in flight at once")
    parser.add_argument("--delay", type=float, help="seconds each marked point lasts")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (logs, markers, state)")
    args = parser.parse_args(argv)

    async def run() -> dict[str, Any]:
        # SIGTERM cancels the run as Ctrl-C does, so run_suite's cleanup still runs.
        task = asyncio.current_task()
        if task is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        options = {"requests": args.requests, "concurrency": args.concurrency, "delay": args.delay}
        return await run_suite(short=args.short, seed=args.seed, keep=args.keep, **options)

    try:
        figures = asyncio.run(run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted; workers and server stopped")
        return 130
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n", encoding="utf-8")
    return 0 if figures["targets_met"] else 1


if __name__ == "__main__":
    from client import exit_process

    exit_process(main())
