"""The ``OTEL_*`` settings a process honours, read as the OpenTelemetry SDK documents them — and the ones
it refuses at start-up instead of exporting nothing."""

from __future__ import annotations

import re
import socket
from datetime import timedelta

import pytest
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig

from client import telemetry
from client.telemetry import (
    TelemetryConfigError,
    exporter_names,
    otlp_protocol,
    temporal_metrics_config,
    temporal_runtime,
)


@pytest.mark.parametrize(
    "value, names",
    [
        (None, []),
        ("none", []),
        ("otlp", ["otlp"]),
        ("console,otlp", ["console", "otlp"]),
        (" OTLP , console ", ["otlp", "console"]),
    ],
)
def test_exporters_are_a_comma_separated_list(value, names):
    env = {} if value is None else {"OTEL_TRACES_EXPORTER": value}
    assert exporter_names(env, "traces") == names


@pytest.mark.parametrize("value, problem", [("jaeger", "unknown exporter 'jaeger'"), ("none,otlp", "'none' cannot")])
def test_an_exporter_this_process_cannot_use_is_refused_naming_the_variable(value, problem):
    with pytest.raises(TelemetryConfigError, match=problem) as caught:
        exporter_names({"OTEL_METRICS_EXPORTER": value}, "metrics")
    assert str(caught.value).startswith("OTEL_METRICS_EXPORTER")


def test_the_protocol_per_signal_wins_over_the_general_one_and_http_protobuf_is_the_default():
    assert otlp_protocol({}, "traces") == "http/protobuf"
    assert otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "traces") == "grpc"
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}
    assert otlp_protocol(env, "metrics") == "http/protobuf"
    with pytest.raises(TelemetryConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol 'http/json'"):
        otlp_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "traces")


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_both_otlp_protocols_build_their_exporter(protocol):
    exporter = telemetry._otlp("traces", protocol)
    assert type(exporter).__name__ == "OTLPSpanExporter" and protocol.split("/")[0] in type(exporter).__module__
    exporter.shutdown()


def test_otlp_without_the_exporters_installed_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(telemetry._OTLP_MODULES, ("traces", "grpc"), ("no.such.exporter", "OTLPSpanExporter"))
    with pytest.raises(TelemetryConfigError, match=r"pip install 'agent-lifecycle\[otel\]'"):
        telemetry._otlp("traces", "grpc")


def test_temporal_metrics_go_to_the_prometheus_endpoint_else_to_the_otlp_metrics_endpoint():
    assert temporal_metrics_config({}) is None
    assert temporal_metrics_config({"OTEL_METRICS_EXPORTER": "console"}) is None
    prometheus = temporal_metrics_config({"AGENT_PROMETHEUS_BIND": "0.0.0.0:9464", "OTEL_METRICS_EXPORTER": "otlp"})
    assert isinstance(prometheus, PrometheusConfig) and prometheus.bind_address == "0.0.0.0:9464"
    http = temporal_metrics_config(
        {
            "OTEL_METRICS_EXPORTER": "console,otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc, x-tenant=t1",
            "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        }
    )
    assert isinstance(http, OpenTelemetryConfig) and http.http
    assert http.url == "http://collector:4318/v1/metrics"
    assert http.headers == {"authorization": "Bearer abc", "x-tenant": "t1"}
    assert http.metric_periodicity == timedelta(seconds=5)
    grpc = temporal_metrics_config(
        {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        }
    )
    assert isinstance(grpc, OpenTelemetryConfig) and not grpc.http and grpc.url == "http://collector:4317"
    per_signal = temporal_metrics_config(
        {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://otel.example/m"}
    )
    assert isinstance(per_signal, OpenTelemetryConfig) and per_signal.url == "https://otel.example/m"


@pytest.mark.parametrize(
    "env, problem",
    [
        ({"AGENT_PROMETHEUS_BIND": "9464"}, "AGENT_PROMETHEUS_BIND: '9464' is not host:port"),
        ({"AGENT_PROMETHEUS_BIND": "localhost:http"}, "AGENT_PROMETHEUS_BIND: 'localhost:http' is not host:port"),
        ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": "token"}, "'token' is not key=value"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "Temporal's metrics for Prometheus: AGENT_PROMETHEUS_BIND"),
    ],
)
def test_a_bad_temporal_metrics_setting_is_a_startup_error(env, problem):
    with pytest.raises(TelemetryConfigError, match=re.escape(problem)):
        temporal_metrics_config(env)


def test_a_prometheus_address_in_use_is_a_startup_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(TelemetryConfigError, match="AGENT_PROMETHEUS_BIND: Failed starting Prometheus exporter"):
            temporal_runtime({"AGENT_PROMETHEUS_BIND": bind})
