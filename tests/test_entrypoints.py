"""The entry points as a user runs them: `worker.py --dev` (embedded server + UI), a request started with
the Temporal CLI alone, and the `agent-lifecycle` CLI reading results and records."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from client.devserver import temporal_cli_path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _running_worker(tmp_path, **extra_env: str) -> Iterator[dict]:
    """`python worker.py --dev` on free ports with ``extra_env``; yields its environment; stops it with SIGTERM."""
    port, ui_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "TEMPORAL_UI_PORT": str(ui_port),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
        **extra_env,
    }
    log = open(tmp_path / "worker.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "worker.py", "--dev"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 60
    while "worker polling" not in (tmp_path / "worker.log").read_text():
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()
        assert time.monotonic() < deadline, "worker --dev did not start in time"
        time.sleep(0.2)
    env["_LOG"] = str(tmp_path / "worker.log")
    env["_PID"] = str(proc.pid)
    try:
        yield env
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()


@pytest.fixture
def dev_worker(tmp_path):
    """`python worker.py --dev` on free ports; yields its environment; stops it with SIGTERM."""
    with _running_worker(tmp_path) as env:
        yield env


def _temporal(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [temporal_cli_path(), *args, "--address", env["TEMPORAL_ADDRESS"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "client.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_temporal_cli_alone_starts_a_request_and_reads_its_record(dev_worker):
    env = dev_worker
    workflow_id = f"cli-{uuid.uuid4().hex[:8]}"
    started = _temporal(
        env,
        "workflow",
        "start",
        "--type",
        "RequestLifecycle",
        "--task-queue",
        "agent-requests",
        "--workflow-id",
        workflow_id,
        "--input",
        '{"request": "What is the price of ACME?"}',
    )
    assert started.returncode == 0, started.stderr
    result = _temporal(env, "workflow", "result", "--workflow-id", workflow_id, "--output", "json")
    assert result.returncode == 0, result.stderr
    assert "ACME is trading at" in result.stdout

    queried = _temporal(
        env, "workflow", "query", "--type", "execution_record", "--workflow-id", workflow_id, "--output", "json"
    )
    assert queried.returncode == 0, queried.stderr
    record = json.loads(queried.stdout)["queryResult"][0]
    assert record["status"] == "succeeded"
    assert [i["hook"] for i in record["pipeline_hooks"]][:2] == ["response-cache", "knowledge-context"]

    stored = _cli(env, "record", workflow_id)
    assert stored.returncode == 0, stored.stderr
    assert "status succeeded" in stored.stdout and "after_planning   #1 allowed-operations (phase 1)" in stored.stdout

    # The Web UI of the embedded server answers.
    with urllib.request.urlopen(f"http://127.0.0.1:{env['TEMPORAL_UI_PORT']}/", timeout=10) as page:
        assert page.status == 200


def test_cli_prints_results_and_typed_failures(dev_worker):
    env = dev_worker
    answered = _cli(env, "run", "What is the price of GBX?")
    assert answered.returncode == 0, answered.stderr
    assert "GBX is trading at" in json.loads(answered.stdout)["response"]

    refused = _cli(env, "run", "Sell 5 ACME", "--request-id", "trade-1")
    assert refused.returncode == 1
    failure = json.loads(refused.stdout)["failed"]
    assert failure["type"] == "RequiredAfterPlanningError"
    assert failure["details"]["hook"] == "allowed-operations"

    record = _cli(env, "record", "trade-1", "--json")
    assert record.returncode == 0, record.stderr
    stored = json.loads(record.stdout)
    assert stored["status"] == "failed" and stored["steps"] == []

    bad = _cli(env, "run", "   ")
    assert bad.returncode == 2 and "non-whitespace" in bad.stderr


def test_worker_stops_cleanly_with_its_dev_server(dev_worker):
    log = Path(dev_worker["_LOG"])
    port = int(dev_worker["TEMPORAL_ADDRESS"].rsplit(":", 1)[1])
    os.kill(int(dev_worker["_PID"]), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while "worker stopped" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                break
        assert time.monotonic() < deadline, "the embedded dev server is still listening"
        time.sleep(0.2)


def test_a_worker_on_postgresql_writes_records_the_cli_reads_from_the_database(tmp_path, postgres_url):
    with _running_worker(tmp_path, AGENT_DATABASE_URL=postgres_url) as env:
        ran = _cli(
            env, "run", "What is the price of ACME?", "--request-id", "pg-1", "--metadata", '{"cache": "bypass"}'
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "ACME is trading at" in json.loads(ran.stdout)["response"]
        record = _cli(env, "record", "pg-1", "--json")
        listed = _cli(env, "list")
    assert record.returncode == 0, record.stderr
    assert json.loads(record.stdout)["status"] == "succeeded"
    assert "request pg-1" in listed.stdout
    # nothing went to a SQLite execution store: the records are in the database only
    assert not (tmp_path / "state" / "executions.sqlite3").exists()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT request_id, status FROM agent_executions").fetchall() == [("pg-1", "succeeded")]


def test_a_worker_whose_database_is_unreachable_stops_with_a_clear_error(tmp_path, postgres_cluster):
    url = postgres_cluster.url().replace("agent@", "agent:s3cret@").replace(str(postgres_cluster.port), "1")
    env = {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_DATABASE_URL": url}
    done = subprocess.run(
        [sys.executable, "worker.py", "--dev"],
        cwd=ROOT,
        env={**env, "TEMPORAL_ADDRESS": f"127.0.0.1:{_free_port()}", "TEMPORAL_UI_PORT": str(_free_port())},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: no connection to the database" in done.stderr and "s3cret" not in done.stdout + done.stderr
