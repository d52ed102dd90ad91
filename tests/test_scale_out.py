"""Workers on several machines, sharing only Temporal and PostgreSQL: two ``python worker.py`` processes —
each with a state directory of its own, as on two machines — serve 50 concurrent demo requests on one task
queue while one of them is killed with SIGKILL. Every request finishes exactly once, every record is
complete and readable through the CLI from a third worker's side, the declared audit hook wrote exactly one
row per tool call, and a circuit breaker tripped through one worker blocks on a worker started later."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from benchmarks.processes import Server, spawn, stop_all
from client import Settings, connect
from client.api import start_request
from hooks.declarative import HookStore
from storage.executions import PostgresExecutionStore
from storage.postgres import Database
from workflows.models import RequestResult, RequestStatus

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 50
QUOTE = "What is the price of ACME?"
BLOCKER = """\
import json, sys
event = json.load(sys.stdin)
sys.exit(2 if "forbidden" in event.get("prompt", "") else 0)
"""


def hooks_file(tmp: Path) -> Path:
    (tmp / "block_forbidden.py").write_text(BLOCKER)
    hooks = {
        "hooks": [
            {"id": "audit-quotes", "event": "pre_tool_use", "handler_type": "command", "matcher": "stock_quote",
             "config": {"command": ["true"]}},
            {"id": "no-forbidden", "event": "user_prompt_submit", "handler_type": "command",
             "config": {"command": [sys.executable, str(tmp / "block_forbidden.py")]}},
        ]
    }  # fmt: skip
    path = tmp / "hooks.json"
    path.write_text(json.dumps(hooks))
    return path


class Machines:
    """``python worker.py`` processes, each with its own state directory (its own "machine")."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.procs: list[subprocess.Popen] = []

    async def start(self, name: str) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        env = {**self.env, "AGENT_STATE_DIR": str(self.tmp / name)}
        proc = spawn([sys.executable, "worker.py"], log, cwd=ROOT, env=env)
        self.procs.append(proc)
        for _ in range(450):
            if "worker polling" in log.read_text(errors="replace"):
                return proc
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            await asyncio.sleep(0.2)
        raise AssertionError(f"worker {name} did not start: {log.read_text(errors='replace')[-3000:]}")


@pytest.mark.timeout(300)
async def test_two_workers_sharing_postgresql_lose_nothing_when_one_is_killed(tmp_path, postgres_url):
    server = Server(tmp_path, in_memory=True)
    await server.start()
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": server.address,
        "AGENT_DATABASE_URL": postgres_url,
        "AGENT_HOOKS_FILE": str(hooks_file(tmp_path)),
        "PYTHONUNBUFFERED": "1",
    }
    machines = Machines(tmp_path, env)
    settings = Settings(temporal_address=server.address, state_dir=tmp_path / "client", database_url=postgres_url)
    database = Database(postgres_url)
    try:
        first, _ = await machines.start("machine-a"), await machines.start("machine-b")
        client = await connect(settings, tracing=False)

        # 50 concurrent requests; machine A dies (SIGKILL) once ten have finished.
        handles = [
            await start_request(client, settings, QUOTE, metadata={"cache": "bypass"}, request_id=f"q{n}")
            for n in range(REQUESTS)
        ]
        pending = {asyncio.ensure_future(h.result()): h for h in handles}
        finished: list[RequestResult] = []
        while pending:
            done, _ = await asyncio.wait(pending, timeout=120, return_when=asyncio.FIRST_COMPLETED)
            assert done, f"{len(pending)} requests did not finish"
            for future in done:
                pending.pop(future)
                finished.append(future.result())
            if len(finished) >= 10 and first.poll() is None:
                first.send_signal(signal.SIGKILL)
        assert first.poll() is not None, "machine A was not killed mid-load"
        assert sorted(r.request_id for r in finished) == sorted(f"q{n}" for n in range(REQUESTS))
        assert all(r.short_circuit is None and [s.status for s in r.steps] == ["succeeded"] for r in finished)

        # Exactly once: one run per request, one audit row per tool call, records complete in the database.
        for handle in handles[:5]:
            runs = [e async for e in client.list_workflows(f"WorkflowId = '{handle.id}'")]
            assert len(runs) == 1
        store = PostgresExecutionStore(database)
        for n in range(REQUESTS):
            record = await store.get(f"q{n}")
            assert record is not None and record.status is RequestStatus.SUCCEEDED, n
            assert record.lifecycle is not None and record.lifecycle.boundary == "terminal"
        audit = HookStore(database).executions(hook_label="audit-quotes", limit=1000)
        assert sorted(row.workflow_id or "" for row in audit) == sorted(f"request-q{n}" for n in range(REQUESTS))

        # A breaker tripped through machine B blocks on machine C, which started after the trip.
        blocked = [
            await start_request(client, settings, f"forbidden request {n}", request_id=f"f{n}") for n in range(5)
        ]
        for handle in blocked:
            assert (await handle.result()).stopped is not None
        assert not HookStore(database).state("no-forbidden").enabled
        await machines.start("machine-c")
        machines.procs[1].send_signal(signal.SIGKILL)
        after = await (await start_request(client, settings, QUOTE, request_id="after-trip")).result()
        assert after.stopped is not None and "circuit_open" in after.response

        # The records are readable through the CLI from machine C's side (its own, empty state directory).
        cli_env = {**env, "AGENT_STATE_DIR": str(tmp_path / "machine-c")}
        shown = subprocess.run(
            [sys.executable, "-m", "client.cli", "record", "q0", "--json"],
            cwd=ROOT, env=cli_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["status"] == "succeeded"
    finally:
        stop_all(machines.procs)
        stop_all(server.procs)
        await database.close()


def test_the_database_url_must_be_a_postgresql_url():
    with pytest.raises(ValueError, match="postgresql://"):
        Settings(database_url=f"mysql://{uuid.uuid4().hex}@127.0.0.1/db")  # type: ignore[arg-type]
