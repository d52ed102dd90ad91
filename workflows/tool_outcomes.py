"""A tool step's result as its tool left it, and the outcome its after_tool hooks see — one definition for
the workflow and for the tool step's activity, which runs in-process tool hooks around the tool (see
``activities.tool_steps``)."""

from __future__ import annotations

import json
from typing import Literal

from .models import ExecutionRecord, StepResult, StepStatus, ToolMetrics, ToolOutcomeView, ToolStepOutput

_OUTCOME_STATUS: dict[StepStatus, Literal["executed", "failed", "skipped"]] = {
    StepStatus.SUCCEEDED: "executed",
    StepStatus.FAILED: "failed",
    StepStatus.SKIPPED: "skipped",
}


def apply_output(result: StepResult, output: ToolStepOutput) -> None:
    """``result`` as a tool that succeeded with ``output`` leaves it: its output, and the text a model
    reads of it (the tool's own formatting, else the output as JSON)."""
    result.status = StepStatus.SUCCEEDED
    result.output = output.output
    if output.text is not None:
        result.result = output.text
    elif isinstance(output.output, str):
        result.result = output.output
    else:
        result.result = json.dumps(output.output, ensure_ascii=False, sort_keys=True)


def outcome_view(result: StepResult) -> ToolOutcomeView:
    """What after_tool hooks see of a step's outcome (the raw output only for one that ran and succeeded)."""
    recovered = result.recovered_from
    cached = result.cached_from is not None
    return ToolOutcomeView.model_validate(
        {
            "status": "cached" if cached else _OUTCOME_STATUS[result.status],
            "output": result.output if result.status is StepStatus.SUCCEEDED and not cached else None,
            "reason": result.skip_reason,
            "extension": result.skipped_by,
            "error": result.error,
            "result": result.result or "",
            "recovered_from": (recovered.error or recovered.error_type) if recovered is not None else None,
            "from_step": result.cached_from,
        }
    )


def count_tool_metrics(record: ExecutionRecord, result: StepResult) -> None:
    """Count a finished step in its tool's metrics: a call, a failure, a cached answer or a skip."""
    metrics = record.tool_metrics.setdefault(result.tool, ToolMetrics())
    if result.status is StepStatus.SKIPPED:
        metrics.skipped += 1
        return
    if result.cached_from is not None:
        metrics.cached += 1
        return
    metrics.calls += 1
    metrics.failures += result.status is StepStatus.FAILED or result.recovered_from is not None
    duration = result.duration_ms or 0.0
    metrics.total_duration_ms += duration
    metrics.max_duration_ms = max(metrics.max_duration_ms, duration)
