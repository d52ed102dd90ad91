"""Temporal's own worker and client metrics, exported by a worker as an operator configures it: scraped
from the Prometheus endpoint ``AGENT_PROMETHEUS_BIND`` names, or pushed to an OTLP/HTTP receiver when
``OTEL_METRICS_EXPORTER=otlp``. A real ``worker.py --dev`` runs a real request; everything on 127.0.0.1."""

from __future__ import annotations

import http.server
import re
import threading
import time
import urllib.request
from typing import ClassVar

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from .test_entrypoints import _cli, _free_port, _running_worker

# What an operator watches first: workflow and activity task latencies and the client's RPC requests.
SDK_METRICS = (
    "temporal_workflow_task_execution_latency",
    "temporal_activity_execution_latency",
    "temporal_request",
)


def _run_one_request(env: dict) -> None:
    ran = _cli(env, "run", "What is the price of ACME?", "--metadata", '{"cache": "bypass"}')
    assert ran.returncode == 0, ran.stdout + ran.stderr


def _eventually(check, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_worker_serves_temporal_metrics_for_prometheus(tmp_path):
    bind = f"127.0.0.1:{_free_port()}"
    with _running_worker(tmp_path, AGENT_PROMETHEUS_BIND=bind) as env:
        _run_one_request(env)

        def scraped() -> str | None:
            with urllib.request.urlopen(f"http://{bind}/metrics", timeout=5) as response:
                text = response.read().decode()
            return text if all(f"\n{name}" in text for name in SDK_METRICS) else None

        text = _eventually(scraped, "the SDK's metrics on the scrape endpoint")
    samples = [line for line in text.splitlines() if line.startswith("temporal_workflow_task_execution_latency")]
    assert any('workflow_type="RequestLifecycle"' in line and 'task_queue="agent-requests"' in line for line in samples)
    assert any(line.startswith("temporal_activity_execution_latency_count") for line in text.splitlines())
    # An in-process hook is a series of its own: its local activity's type names its stage and hook.
    named = re.compile(r'activity_type="(before_planning|after_synthesis|after_answer|on_finish):[^"]+"')
    local = [line for line in text.splitlines() if line.startswith("temporal_local_activity")]
    assert any(named.search(line) for line in local), local[:10]


class _MetricsCollector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver on 127.0.0.1: keeps the metric names of every ``POST /v1/metrics``."""

    names: ClassVar[set[str]] = set()
    paths: ClassVar[set[str]] = set()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).paths.add(self.path)
        if self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    type(self).names.update(metric.name for metric in scope.metrics)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_worker_pushes_temporal_metrics_to_an_otlp_collector(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetricsCollector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    otlp = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }
    try:
        with _running_worker(tmp_path, **otlp) as env:
            _run_one_request(env)
            _eventually(
                lambda: all(name in _MetricsCollector.names for name in SDK_METRICS),
                f"the SDK's metrics at the collector (got {sorted(_MetricsCollector.names)[:20]})",
            )
    finally:
        server.shutdown()
    assert _MetricsCollector.paths == {"/v1/metrics"}
