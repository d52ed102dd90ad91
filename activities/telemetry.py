"""Spans and metrics the activities emit. Providers are configured by the process (worker.py or tests)."""

from __future__ import annotations

from opentelemetry import metrics, trace

from workflows.models import HookDecision

INSTRUMENTATION = "agent_lifecycle"
SHORT_CIRCUIT_METRIC = "orchestration.pipeline.short_circuit.decision"

_short_circuit_counter: metrics.Counter | None = None


def tracer() -> trace.Tracer:
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
