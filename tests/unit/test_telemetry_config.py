"""The telemetry settings a process honours (``settings.telemetry``: the ``OTEL_*`` variables read as the
OpenTelemetry SDK documents them, and ``AGENT_PROMETHEUS_BIND``) — and the ones it refuses when the
settings are read, or at start-up, instead of exporting nothing."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig

from client import telemetry
from client.settings import Settings, SettingsError, TelemetrySettings
from client.telemetry import TelemetryConfigError, temporal_metrics_config, temporal_runtime


def read(env: dict[str, str]) -> TelemetrySettings:
    return Settings.from_env(env).telemetry


@pytest.mark.parametrize(
    "value, names",
    [
        (None, []),
        ("none", []),
        ("", []),
        ("otlp", ["otlp"]),
        ("console,otlp", ["console", "otlp"]),
        (" OTLP , console ", ["otlp", "console"]),
    ],
)
def test_exporters_are_a_comma_separated_list(value, names):
    env = {} if value is None else {"OTEL_TRACES_EXPORTER": value}
    assert read(env).exporters("traces") == names


@pytest.mark.parametrize(
    "value, problem",
    [
        ("jaeger", "OTEL_METRICS_EXPORTER: unknown exporter 'jaeger'; use otlp, console, none"),
        ("none,otlp", "OTEL_METRICS_EXPORTER: 'none' cannot be listed with other exporters (got 'none,otlp')"),
        ("prometheus", "(Temporal's metrics for Prometheus: AGENT_PROMETHEUS_BIND)"),
    ],
)
def test_an_exporter_this_process_cannot_use_is_refused_naming_the_variable(value, problem):
    with pytest.raises(SettingsError) as caught:
        read({"OTEL_METRICS_EXPORTER": value})
    assert problem in str(caught.value) and caught.value.variables == ["OTEL_METRICS_EXPORTER"]


def test_the_protocol_per_signal_wins_over_the_general_one_and_http_protobuf_is_the_default():
    assert read({}).protocol("traces") == "http/protobuf"
    assert read({"OTEL_EXPORTER_OTLP_PROTOCOL": "GRPC"}).protocol("traces") == "grpc"
    both = read({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"})
    assert both.protocol("metrics") == "http/protobuf" and both.protocol("traces") == "grpc"
    with pytest.raises(SettingsError, match="OTEL_EXPORTER_OTLP_PROTOCOL: .*'http/protobuf' or 'grpc'.*'http/json'"):
        read({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_endpoints_follow_the_opentelemetry_rules_per_signal():
    assert read({}).endpoint("traces") == "http://localhost:4318/v1/traces"
    assert read({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}).endpoint("metrics") == "http://localhost:4317"
    base = read({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert base.endpoint("traces") == "http://collector:4318/v1/traces"
    own = read({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t/x"})
    assert own.endpoint("traces") == "https://t/x" and own.endpoint("metrics") == "http://c:4318/v1/metrics"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_both_otlp_protocols_build_their_exporter_at_the_configured_endpoint(protocol):
    settings = read({"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1"})
    exporter = telemetry._otlp(settings, "traces")
    assert type(exporter).__name__ == "OTLPSpanExporter" and protocol.split("/")[0] in type(exporter).__module__
    exporter.shutdown()


def test_otlp_without_the_exporters_installed_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(telemetry._OTLP_MODULES, ("traces", "grpc"), ("no.such.exporter", "OTLPSpanExporter"))
    with pytest.raises(TelemetryConfigError, match=r"pip install 'agent-lifecycle\[otel\]'"):
        telemetry._otlp(read({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}), "traces")


def test_temporal_metrics_go_to_the_prometheus_endpoint_else_to_the_otlp_metrics_endpoint():
    assert temporal_metrics_config(read({})) is None
    assert temporal_metrics_config(read({"OTEL_METRICS_EXPORTER": "console"})) is None
    prometheus = temporal_metrics_config(
        read({"AGENT_PROMETHEUS_BIND": "0.0.0.0:9464", "OTEL_METRICS_EXPORTER": "otlp"})
    )
    assert isinstance(prometheus, PrometheusConfig) and prometheus.bind_address == "0.0.0.0:9464"
    http = temporal_metrics_config(
        read(
            {
                "OTEL_METRICS_EXPORTER": "console,otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
                "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc, x-tenant=t1",
                "OTEL_METRIC_EXPORT_INTERVAL": "5000",
            }
        )
    )
    assert isinstance(http, OpenTelemetryConfig) and http.http
    assert http.url == "http://collector:4318/v1/metrics"
    assert http.headers == {"authorization": "Bearer abc", "x-tenant": "t1"}
    assert http.metric_periodicity == timedelta(seconds=5)
    grpc = temporal_metrics_config(
        read(
            {
                "OTEL_METRICS_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            }
        )
    )
    assert isinstance(grpc, OpenTelemetryConfig) and not grpc.http and grpc.url == "http://collector:4317"
    per_signal = temporal_metrics_config(
        read({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://otel.example/m"})
    )
    assert isinstance(per_signal, OpenTelemetryConfig) and per_signal.url == "https://otel.example/m"


@pytest.mark.parametrize(
    "env, problem",
    [
        ({"AGENT_PROMETHEUS_BIND": "9464"}, "AGENT_PROMETHEUS_BIND: not host:port (e.g. 0.0.0.0:9464) (got '9464')"),
        ({"AGENT_PROMETHEUS_BIND": "localhost:http"}, "AGENT_PROMETHEUS_BIND: not host:port"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL: Input should be a valid integer"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, "OTEL_METRIC_EXPORT_INTERVAL: Input should be greater than 0"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "token"}, "OTEL_EXPORTER_OTLP_HEADERS: 'token' is not key=value"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT: must be an http://"),
    ],
)
def test_a_bad_telemetry_setting_is_refused_when_the_settings_are_read(env, problem):
    with pytest.raises(SettingsError) as caught:
        read(env)
    assert problem in str(caught.value)


def test_headers_are_a_secret_never_shown_in_an_error():
    with pytest.raises(SettingsError) as caught:
        read({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret, broken"})
    assert "OTEL_EXPORTER_OTLP_HEADERS" in str(caught.value) and "s3cret" not in str(caught.value)
    assert "s3cret" not in repr(read({"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret"}))


def test_a_prometheus_address_in_use_is_a_startup_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bind = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(TelemetryConfigError, match="AGENT_PROMETHEUS_BIND: Failed starting Prometheus exporter"):
            temporal_runtime(read({"AGENT_PROMETHEUS_BIND": bind}))
