"""The ``OTEL_*`` settings a process honours, read as the OpenTelemetry SDK documents them — and the ones
it refuses at start-up instead of exporting nothing."""

from __future__ import annotations

import pytest

from client import telemetry
from client.telemetry import TelemetryConfigError, exporter_names, otlp_protocol


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
