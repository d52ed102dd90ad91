"""The entry points as a user runs them: `worker.py --dev` (embedded server + UI), a request started with
the Temporal CLI alone, and the `agent-lifecycle` CLI reading results and records."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import psycopg
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from client.devserver import temporal_cli_path
from workflows.listing import LIST_STAGE_SIGNAL, LISTING_TIMER_SUMMARY

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

    # The worker's default listing delay: the request was listed at its first stage (with its kind) and at
    # its end; a stage between is listed only when an activity it waited on for 2 s asked (a loaded
    # machine) — no timer lists a stage of a request that waits on activities.
    shown = _temporal(env, "workflow", "show", "--workflow-id", workflow_id, "--output", "json")
    assert shown.returncode == 0, shown.stderr
    events = json.loads(shown.stdout)["events"]
    listed = [
        base64.b64decode(
            e["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"]["indexedFields"][name]["data"]
        )
        for e in events
        if "upsertWorkflowSearchAttributesEventAttributes" in e
        for name in e["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"]["indexedFields"]
        if name == "AgentLifecycleStage"
    ]
    assert listed[0] == b'"planning"' and listed[-1] == b'"completed"', listed
    timers = [
        base64.b64decode(e["userMetadata"]["summary"]["data"]) for e in events if "timerStartedEventAttributes" in e
    ]
    # Only a managed lease's renewal timer may run (the request outlived a renewal).
    assert json.dumps(LISTING_TIMER_SUMMARY, ensure_ascii=False).encode() not in timers, timers
    assert all(t.startswith('"renew lease \u00b7 '.encode()) for t in timers), timers
    asked = [
        e
        for e in events
        if e.get("workflowExecutionSignaledEventAttributes", {}).get("signalName") == LIST_STAGE_SIGNAL
    ]
    assert len(listed) - 2 <= len(asked)

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
    [line] = [line for line in listed.stdout.splitlines() if " pg-1 " in line]  # one line per request
    assert "succeeded" in line and "What is the price of ACME?" in line, listed.stdout
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


def test_a_worker_started_before_its_server_waits_for_it_within_a_bound(tmp_path):
    """A worker whose Temporal server is not up yet (restarting, or started after it) keeps trying, and
    polls once the server answers; with no server within ``AGENT_TEMPORAL_WAIT_SECONDS`` it stops with an
    error naming the address."""
    port = _free_port()
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }
    gave_up = subprocess.run(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env={**env, "AGENT_TEMPORAL_WAIT_SECONDS": "1"},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert gave_up.returncode == 1, gave_up.stdout + gave_up.stderr
    assert f"Temporal at 127.0.0.1:{port} is not reachable yet" in gave_up.stderr
    assert f"error: no Temporal server at 127.0.0.1:{port}; start one with" in gave_up.stderr
    assert "worker polling" not in gave_up.stdout

    log_path = tmp_path / "worker.log"
    with open(log_path, "w+") as log:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        server = None
        try:
            deadline = time.monotonic() + 60
            while "is not reachable yet" not in log_path.read_text():
                assert worker.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
            server = subprocess.Popen(
                [temporal_cli_path(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
                + ["--ui-port", str(_free_port()), "--headless", "--log-level", "error"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            while "worker polling" not in log_path.read_text():
                assert worker.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline + 60, log_path.read_text()
                time.sleep(0.2)
        finally:
            for proc in (worker, server):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=30)


def test_a_live_record_is_found_by_request_id_as_well_as_by_workflow_id(dev_worker):
    env = dev_worker
    ran = _cli(env, "run", "What is the price of ACME?", "--request-id", "live-1", "--metadata", '{"cache": "bypass"}')
    assert ran.returncode == 0, ran.stdout + ran.stderr
    by_request = _cli(env, "record", "live-1", "--live", "--json")
    by_workflow = _cli(env, "record", "request-live-1", "--live", "--json")
    missing = _cli(env, "record", "no-such-request", "--live")
    assert by_request.returncode == by_workflow.returncode == 0, by_request.stderr + by_workflow.stderr
    assert (
        json.loads(by_request.stdout)["workflow_id"]
        == json.loads(by_workflow.stdout)["workflow_id"]
        == "request-live-1"
    )
    assert missing.returncode == 1 and "neither a workflow id nor a request id" in missing.stderr


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver on 127.0.0.1: keeps the span names of every ``POST /v1/traces``."""

    spans: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    type(self).spans += [span.name for span in scope.spans]
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_cli_exports_its_spans_over_otlp_http_and_a_bad_exporter_is_a_startup_error(dev_worker):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            **dev_worker,
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        }
        ran = _cli(env, "run", "What is the price of ACME?", "--metadata", '{"cache": "bypass"}')
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "StartWorkflow:RequestLifecycle" in _Collector.spans
    finally:
        server.shutdown()
    bad = _cli({**dev_worker, "OTEL_TRACES_EXPORTER": "jaeger"}, "list")
    assert bad.returncode == 2 and "configuration error: OTEL_TRACES_EXPORTER: unknown exporter 'jaeger'" in bad.stderr
    worker = subprocess.run(
        [sys.executable, "worker.py"], cwd=ROOT, env={**dev_worker, "OTEL_METRICS_EXPORTER": "prometheus"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert worker.returncode == 2 and "unknown exporter 'prometheus'" in worker.stderr


def test_a_negative_stage_listing_delay_is_a_startup_error(tmp_path):
    env = {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_STAGE_LISTING_DELAY_SECONDS": "-1"}
    run = subprocess.run(
        [sys.executable, "worker.py", "--check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "AGENT_STAGE_LISTING_DELAY_SECONDS: Input should be greater than or equal to 0" in run.stderr


@pytest.mark.parametrize("misspelt", [{"AGENT_REVIEWER": "carol"}, {"AGENT_MODEL_BASEURL": "http://127.0.0.1:9/v1"}])
def test_a_misspelt_variable_stops_the_worker_the_check_and_the_cli_naming_the_fix(tmp_path, misspelt):
    env = {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state"), **misspelt}
    [variable] = misspelt
    closest = {"AGENT_REVIEWER": "AGENT_REVIEWERS", "AGENT_MODEL_BASEURL": "AGENT_MODEL_BASE_URL"}[variable]
    for command in (["worker.py", "--check"], ["worker.py"], ["-m", "client.cli", "list"]):
        run = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, (command, run.stdout + run.stderr)
        [line] = run.stderr.strip().splitlines()
        assert f"{variable}: not a setting; did you mean {closest}?" in line, (command, line)
