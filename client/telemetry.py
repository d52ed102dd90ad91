"""OpenTelemetry providers for a process (worker, demo, CLI), set once at start-up from the standard
``OTEL_*`` variables, as the OpenTelemetry SDK documents them:

| variable | values | default |
| --- | --- | --- |
| ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` | a comma-separated list of ``otlp``, ``console``, or ``none`` | ``none`` |
| ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or ``…_TRACES_PROTOCOL`` / ``…_METRICS_PROTOCOL``) | ``http/protobuf``, ``grpc`` | ``http/protobuf`` |
| ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``…_HEADERS``, ``…_TIMEOUT`` and their per-signal forms | read by the OTLP exporters | the collector on localhost |
| ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` | the resource | the process's own name |

The OTLP exporters come with the ``otel`` extra (``pip install 'agent-lifecycle[otel]'``). A value outside
these — an unknown exporter, an unsupported protocol, ``otlp`` without the extra — is a
:class:`TelemetryConfigError` at start-up naming the variable, never a process that silently exports
nothing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_PROTOCOL = "http/protobuf"
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
        raise TelemetryConfigError(f"{variable}: unknown exporter {unknown[0]!r}; use {', '.join(EXPORTERS)}")
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


def configure_telemetry(
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
) -> None:
    """Install this process's tracer and meter providers: the exporters the environment names, and any
    ``span_processors`` / ``metric_readers`` of the process's own (the demo keeps its spans to print them).

    Raises:
        TelemetryConfigError: a setting names an exporter or protocol this process cannot use.
    """
    env = os.environ if env is None else env
    span_exporters, metric_exporters = _exporters(env, "traces"), _exporters(env, "metrics")
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
