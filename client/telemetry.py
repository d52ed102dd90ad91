"""OpenTelemetry providers for a process, set once at start-up.

``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``console`` prints spans/metrics, ``otlp`` sends them
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (needs ``pip install opentelemetry-exporter-otlp``), unset or ``none``
keeps them in-process only.
"""

from __future__ import annotations

import os

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter


def _span_exporter(kind: str):
    if kind == "console":
        return ConsoleSpanExporter()
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # pyright: ignore[reportMissingImports]

        return OTLPSpanExporter()
    return None


def _metric_exporter(kind: str):
    if kind == "console":
        return ConsoleMetricExporter()
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter  # pyright: ignore[reportMissingImports]

        return OTLPMetricExporter()
    return None


def configure_telemetry(service_name: str) -> None:
    """Install global tracer and meter providers for this process."""
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    tracer_provider = TracerProvider(resource=resource)
    span_exporter = _span_exporter(os.environ.get("OTEL_TRACES_EXPORTER", "none"))
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(tracer_provider)
    metric_exporter = _metric_exporter(os.environ.get("OTEL_METRICS_EXPORTER", "none"))
    readers = [PeriodicExportingMetricReader(metric_exporter)] if metric_exporter is not None else []
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def shutdown_telemetry() -> None:
    """Flush and stop the providers (call before exiting: exit_process skips atexit handlers)."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if callable(shutdown):
            shutdown()
