"""OpenTelemetry providers for a process (worker, demo, CLI), set once at start-up from
``settings.telemetry`` (:class:`~client.settings.TelemetrySettings`: the standard ``OTEL_*`` variables,
read as the OpenTelemetry SDK documents them, and ``AGENT_PROMETHEUS_BIND``; ``docs/configuration.md``
lists them).

Temporal's own metrics — the SDK's worker and client metrics (``temporal_workflow_task_execution_latency``,
``temporal_activity_execution_latency``, ``temporal_request``, slots, polls…) — come from the SDK's native
runtime, which exports them to one destination, set before any client connects: the Prometheus scrape
endpoint ``AGENT_PROMETHEUS_BIND`` names, or else, when ``OTEL_METRICS_EXPORTER`` lists ``otlp``, the
same OTLP metrics endpoint (protocol, headers, interval) as the process's own metrics. Only processes
that run a worker (the worker, the demo) export them.

A value outside what the settings accept is refused when they are read (naming the variable). What only
this process can find out — ``otlp`` without the OTLP exporters installed (the ``otel`` extra:
``pip install 'agent-lifecycle[otel]'``), a Prometheus address it cannot listen on — is a
:class:`TelemetryConfigError` at start-up naming the variable, never a process that silently exports
nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

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

from .settings import TelemetrySettings

PROMETHEUS_BIND = "AGENT_PROMETHEUS_BIND"
_OTLP_MODULES = {
    ("traces", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    ("traces", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    ("metrics", "http/protobuf"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    ("metrics", "grpc"): ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
}

Signal = Literal["traces", "metrics"]


class TelemetryConfigError(ValueError):
    """A telemetry setting this process cannot honour."""


def _otlp(telemetry: TelemetrySettings, signal: Signal) -> Any:
    """The OTLP exporter of ``signal``, sending where the settings say (endpoint and headers)."""
    protocol = telemetry.protocol(signal)
    module_name, class_name = _OTLP_MODULES[(signal, protocol)]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise TelemetryConfigError(
            f"OTEL_{signal.upper()}_EXPORTER=otlp over {protocol} needs the OTLP exporters: "
            "pip install 'agent-lifecycle[otel]'"
        ) from None
    return getattr(module, class_name)(endpoint=telemetry.endpoint(signal), headers=telemetry.headers(signal))


def _exporters(telemetry: TelemetrySettings, signal: Signal) -> list[Any]:
    console = ConsoleSpanExporter if signal == "traces" else ConsoleMetricExporter
    return [_otlp(telemetry, signal) if name == "otlp" else console() for name in telemetry.exporters(signal)]


def temporal_metrics_config(telemetry: TelemetrySettings) -> PrometheusConfig | OpenTelemetryConfig | None:
    """Where the Temporal SDK's own metrics go: ``AGENT_PROMETHEUS_BIND``'s scrape endpoint, else the
    OTLP metrics endpoint when ``OTEL_METRICS_EXPORTER`` lists ``otlp``, else nowhere."""
    if telemetry.prometheus_bind:
        return PrometheusConfig(bind_address=telemetry.prometheus_bind)
    if "otlp" not in telemetry.metrics_exporter:
        return None
    return OpenTelemetryConfig(
        url=telemetry.endpoint("metrics"),
        headers=telemetry.headers("metrics"),
        metric_periodicity=timedelta(milliseconds=telemetry.metric_export_interval_ms),
        metric_temporality=(
            OpenTelemetryMetricTemporality.DELTA
            if telemetry.otlp_metrics_temporality == "delta"
            else OpenTelemetryMetricTemporality.CUMULATIVE
        ),
        http=telemetry.protocol("metrics") == "http/protobuf",
    )


def temporal_runtime(telemetry: TelemetrySettings) -> Runtime | None:
    """A Temporal runtime that exports the SDK's metrics as the settings say, or None (the default runtime).

    Raises:
        TelemetryConfigError: a Prometheus address the process cannot listen on, an endpoint it cannot use.
    """
    config = temporal_metrics_config(telemetry)
    if config is None:
        return None
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=config))
    except ValueError as err:  # e.g. the Prometheus address is in use
        variable = PROMETHEUS_BIND if isinstance(config, PrometheusConfig) else "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
        raise TelemetryConfigError(f"{variable}: {err}") from None


def configure_telemetry(
    service_name: str,
    telemetry: TelemetrySettings,
    *,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    temporal_metrics: bool = False,
) -> None:
    """Install this process's tracer and meter providers: the exporters ``telemetry`` names, and any
    ``span_processors`` / ``metric_readers`` of the process's own (the demo keeps its spans to print them).
    With ``temporal_metrics`` (a process that runs a worker) also the Temporal runtime that exports the
    SDK's own metrics; call this before any Temporal client connects.

    A signal that goes nowhere gets no provider: OpenTelemetry's default one records nothing, so spans
    and metrics nobody reads cost nothing. A span still carries its request's trace context (the trace id
    the record keeps, the context passed on to activities and children).

    Raises:
        TelemetryConfigError: an exporter this process cannot use (not installed, an address in use).
    """
    span_exporters, metric_exporters = _exporters(telemetry, "traces"), _exporters(telemetry, "metrics")
    runtime = temporal_runtime(telemetry) if temporal_metrics else None
    if runtime is not None:
        Runtime.set_default(runtime, error_if_already_set=False)
    resource = Resource.create({"service.name": telemetry.service_name or service_name})
    processors = [*(BatchSpanProcessor(exporter) for exporter in span_exporters), *span_processors]
    if processors:
        tracer_provider = TracerProvider(resource=resource)
        for processor in processors:
            tracer_provider.add_span_processor(processor)
        trace.set_tracer_provider(tracer_provider)
        _configured.append(tracer_provider)
    interval = telemetry.metric_export_interval_ms
    readers = [
        *(PeriodicExportingMetricReader(exporter, export_interval_millis=interval) for exporter in metric_exporters),
        *metric_readers,
    ]
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
        _configured.append(meter_provider)


# The providers configure_telemetry made in this process: the only ones shutdown_telemetry stops (a process
# whose providers were installed by someone else — an embedding application, a test — keeps them running).
_configured: list[TracerProvider | MeterProvider] = []


def shutdown_telemetry() -> None:
    """Flush and stop the providers configure_telemetry made (call before exiting: exit_process skips
    atexit handlers)."""
    while _configured:
        _configured.pop().shutdown()
