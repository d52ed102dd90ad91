"""OpenTelemetry providers for a process (worker, demo, CLI), set once at start-up from the standard
``OTEL_*`` variables, as the OpenTelemetry SDK documents them:

| variable | values | default |
| --- | --- | --- |
| ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` | a comma-separated list of ``otlp``, ``console``, or ``none`` | ``none`` |
| ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or ``…_TRACES_PROTOCOL`` / ``…_METRICS_PROTOCOL``) | ``http/protobuf``, ``grpc`` | ``http/protobuf`` |
| ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``…_HEADERS``, ``…_TIMEOUT`` and their per-signal forms | read by the OTLP exporters | the collector on localhost |
| ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` | the resource | the process's own name |
| ``OTEL_METRIC_EXPORT_INTERVAL`` | milliseconds between metric exports | ``60000`` |
| ``AGENT_PROMETHEUS_BIND`` | ``host:port``: serve Temporal's SDK metrics at ``/metrics`` there | unset |

Temporal's own metrics — the SDK's worker and client metrics (``temporal_workflow_task_execution_latency``,
``temporal_activity_execution_latency``, ``temporal_request``, slots, polls…) — come from the SDK's native
runtime, which exports them to one destination, set before any client connects: the Prometheus scrape
endpoint ``AGENT_PROMETHEUS_BIND`` names, or else, when ``OTEL_METRICS_EXPORTER`` lists ``otlp``, the
same OTLP metrics endpoint (protocol, headers, interval) as the process's own metrics. Only processes
that run a worker (the worker, the demo) export them.

The OTLP exporters come with the ``otel`` extra (``pip install 'agent-lifecycle[otel]'``). A value outside
these — an unknown exporter, an unsupported protocol, ``otlp`` without the extra — is a
:class:`TelemetryConfigError` at start-up naming the variable, never a process that silently exports
nothing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from temporalio.runtime import (
    OpenTelemetryConfig,
    OpenTelemetryMetricTemporality,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
)

EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_PROTOCOL = "http/protobuf"
PROMETHEUS_BIND = "AGENT_PROMETHEUS_BIND"
DEFAULT_METRIC_EXPORT_INTERVAL_MS = 60_000
_DEFAULT_OTLP_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
_OTLP_MODULES = {
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
}


class TelemetryConfigError(ValueError):
    """An ``OTEL_*`` setting this process cannot honour."""


def exporter_names(env: Mapping[str, str], signal: str) -> list[str]:
    """The exporters ``OTEL_<SIGNAL>_EXPORTER`` lists (``none`` alone: none)."""
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    names = [name.strip().lower() for name in env.get(variable, "none").split(",") if name.strip()]
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        hint = f" (Temporal's metrics for Prometheus: {PROMETHEUS_BIND})" if signal == "metrics" else ""
        raise TelemetryConfigError(f"{variable}: unknown exporter {unknown[0]!r}; use {', '.join(EXPORTERS)}{hint}")
    if "none" in names and len(names) > 1:
        raise TelemetryConfigError(f"{variable}: 'none' cannot be listed with other exporters")
    return [name for name in names if name != "none"]


def otlp_protocol(env: Mapping[str, str], signal: str) -> str:
    variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    if not env.get(variable):
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    protocol = env.get(variable, DEFAULT_PROTOCOL).strip().lower() or DEFAULT_PROTOCOL
    if protocol not in PROTOCOLS:
        raise TelemetryConfigError(f"{variable}: unsupported protocol {protocol!r}; use {' or '.join(PROTOCOLS)}")
    return protocol


def _otlp(signal: str, protocol: str) -> Any:
    module_name, class_name = _OTLP_MODULES[(signal, protocol)]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise TelemetryConfigError(
            f"OTEL_{signal.upper()}_EXPORTER=otlp over {protocol} needs the OTLP exporters: "
            "pip install 'agent-lifecycle[otel]'"
        ) from None
    return getattr(module, class_name)()


def _exporters(env: Mapping[str, str], signal: str) -> list[Any]:
    console = ConsoleSpanExporter if signal == "traces" else ConsoleMetricExporter
    return [
        _otlp(signal, otlp_protocol(env, signal)) if name == "otlp" else console()
        for name in exporter_names(env, signal)
    ]


def _metric_export_interval(env: Mapping[str, str]) -> timedelta:
    text = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    try:
        millis = int(text) if text else DEFAULT_METRIC_EXPORT_INTERVAL_MS
    except ValueError:
        millis = 0
    if millis <= 0:
        raise TelemetryConfigError(f"OTEL_METRIC_EXPORT_INTERVAL: {text!r} is not a positive number of milliseconds")
    return timedelta(milliseconds=millis)


def _otlp_headers(env: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_METRICS_HEADERS`` or ``OTEL_EXPORTER_OTLP_HEADERS``: ``key=value`` pairs,
    comma-separated, values URL-encoded."""
    variable = "OTEL_EXPORTER_OTLP_METRICS_HEADERS"
    if not env.get(variable):
        variable = "OTEL_EXPORTER_OTLP_HEADERS"
    headers = {}
    for item in env.get(variable, "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise TelemetryConfigError(f"{variable}: {item.strip()!r} is not key=value")
        headers[unquote(name.strip()).lower()] = unquote(value.strip())
    return headers


def otlp_metrics_endpoint(env: Mapping[str, str], protocol: str) -> str:
    """Where OTLP metrics go, as the OpenTelemetry SDK reads it: the per-signal endpoint as it is, else
    the base endpoint (over HTTP with ``/v1/metrics`` appended), else the collector on localhost."""
    endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
    if endpoint:
        return endpoint
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or _DEFAULT_OTLP_ENDPOINTS[protocol]
    return base.rstrip("/") + "/v1/metrics" if protocol == "http/protobuf" else base


def temporal_metrics_config(env: Mapping[str, str]) -> PrometheusConfig | OpenTelemetryConfig | None:
    """Where the Temporal SDK's own metrics go: ``AGENT_PROMETHEUS_BIND``'s scrape endpoint, else the
    OTLP metrics endpoint when ``OTEL_METRICS_EXPORTER`` lists ``otlp``, else nowhere.

    Raises:
        TelemetryConfigError: a malformed ``AGENT_PROMETHEUS_BIND`` or OTLP setting.
    """
    bind = env.get(PROMETHEUS_BIND, "").strip()
    if bind:
        host, sep, port = bind.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise TelemetryConfigError(f"{PROMETHEUS_BIND}: {bind!r} is not host:port (e.g. 0.0.0.0:9464)")
        return PrometheusConfig(bind_address=bind)
    if "otlp" not in exporter_names(env, "metrics"):
        return None
    protocol = otlp_protocol(env, "metrics")
    temporality = env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "cumulative").strip().lower()
    return OpenTelemetryConfig(
        url=otlp_metrics_endpoint(env, protocol),
        headers=_otlp_headers(env),
        metric_periodicity=_metric_export_interval(env),
        metric_temporality=(
            OpenTelemetryMetricTemporality.DELTA
            if temporality == "delta"
            else OpenTelemetryMetricTemporality.CUMULATIVE
        ),
        http=protocol == "http/protobuf",
    )


def temporal_runtime(env: Mapping[str, str]) -> Runtime | None:
    """A Temporal runtime that exports the SDK's metrics as ``env`` says, or None (the default runtime).

    Raises:
        TelemetryConfigError: a bad setting, or a Prometheus address the process cannot listen on.
    """
    config = temporal_metrics_config(env)
    if config is None:
        return None
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=config))
    except ValueError as err:  # e.g. the Prometheus address is in use
        variable = PROMETHEUS_BIND if isinstance(config, PrometheusConfig) else "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
        raise TelemetryConfigError(f"{variable}: {err}") from None


def configure_telemetry(
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    temporal_metrics: bool = False,
) -> None:
    """Install this process's tracer and meter providers: the exporters the environment names, and any
    ``span_processors`` / ``metric_readers`` of the process's own (the demo keeps its spans to print them).
    With ``temporal_metrics`` (a process that runs a worker) also the Temporal runtime that exports the
    SDK's own metrics; call this before any Temporal client connects.

    Raises:
        TelemetryConfigError: a setting names an exporter or protocol this process cannot use.
    """
    env = os.environ if env is None else env
    span_exporters, metric_exporters = _exporters(env, "traces"), _exporters(env, "metrics")
    runtime = temporal_runtime(env) if temporal_metrics else None
    if runtime is not None:
        Runtime.set_default(runtime, error_if_already_set=False)
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name})
    tracer_provider = TracerProvider(resource=resource)
    for processor in [*(BatchSpanProcessor(exporter) for exporter in span_exporters), *span_processors]:
        tracer_provider.add_span_processor(processor)
    trace.set_tracer_provider(tracer_provider)
    readers = [*(PeriodicExportingMetricReader(exporter) for exporter in metric_exporters), *metric_readers]
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def shutdown_telemetry() -> None:
    """Flush and stop the providers (call before exiting: exit_process skips atexit handlers)."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()
