"""Spans and metrics the activities emit. Providers are configured by the process (worker.py or tests)."""

from __future__ import annotations

import functools
import time

from opentelemetry import metrics, trace

from workflows.models import HookDecision

INSTRUMENTATION = "agent_lifecycle"
SHORT_CIRCUIT_METRIC = "orchestration.pipeline.short_circuit.decision"

TOOL_CALLS_METRIC = "agent.tool.calls"
TOOL_FAILURES_METRIC = "agent.tool.failures"
TOOL_DURATION_METRIC = "agent.tool.duration"

_short_circuit_counter: metrics.Counter | None = None
_tool_instruments: tuple[metrics.Counter, metrics.Counter, metrics.Histogram] | None = None


@functools.cache
def tracer() -> trace.Tracer:
    """This package's tracer (one per process: before a provider is set, a proxy that follows it)."""
    return trace.get_tracer(INSTRUMENTATION)


def hook_span_name(stage: str, hook: str) -> str:
    return f"pipeline.hook.{stage}.{hook}"


def decision_attributes(decision: HookDecision) -> dict[str, str]:
    return {
        "pipeline.hook.decision.failure_policy": decision.failure_policy.value,
        "pipeline.hook.decision.action": decision.action.value,
        "pipeline.hook.decision.reason": decision.reason,
    }


def record_short_circuit(kind: str, reason: str, status: str) -> None:
    """Count a short-circuit decision. Labels are bounded: no hook names, no sources."""
    global _short_circuit_counter
    if _short_circuit_counter is None:
        _short_circuit_counter = metrics.get_meter(INSTRUMENTATION).create_counter(
            SHORT_CIRCUIT_METRIC, description="Short-circuit decisions by provenance kind, reason and status"
        )
    _short_circuit_counter.add(1, {"kind": kind, "reason": reason, "status": status})


def record_tool_call(tool: str, outcome: str, started_monotonic: float) -> None:
    """Count one tool execution attempt and its duration, labelled by tool (``agent/capability``)."""
    global _tool_instruments
    if _tool_instruments is None:
        meter = metrics.get_meter(INSTRUMENTATION)
        _tool_instruments = (
            meter.create_counter(TOOL_CALLS_METRIC, description="Tool execution attempts"),
            meter.create_counter(TOOL_FAILURES_METRIC, description="Tool execution attempts that raised"),
            meter.create_histogram(TOOL_DURATION_METRIC, unit="ms", description="Tool execution duration"),
        )
    calls, failures, duration = _tool_instruments
    labels = {"tool": tool, "outcome": outcome}
    calls.add(1, labels)
    if outcome != "succeeded":
        failures.add(1, {"tool": tool})
    duration.record((time.monotonic() - started_monotonic) * 1000.0, labels)
