"""Plugins: named bundles of tool hooks, registered in the same registry as any hook.

A plugin is a hook whose stage methods are the functions it was built with: ``before_tool(ctx, call)``,
``after_tool(ctx, call, outcome)``, ``on_tool_error(ctx, call, outcome)``. Its name is required — it
appears in every error, record and span, and "which plugin denied this?" is unanswerable without it.

Shipped plugins:

* :func:`allow_list` — deny any tool not named (the smallest useful kill switch);
* :func:`redact` — mask secrets in tool results before a planner or synthesizer sees them;
* :func:`retry_on_error` — report a tool failure to the model as a readable result;
* :func:`truncate_results` — cap how much of a result reaches the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from workflows.models import FailurePolicy, RunMode, ToolCall, ToolDecision, ToolErrorResolution, ToolOutcomeView

from .builtin.secret_redaction import COMMON_SECRET_PATTERNS, MASK, Rule
from .builtin.secret_redaction import redact as redact_text
from .contracts import PipelineContext

BeforeToolFunc = Callable[[PipelineContext, ToolCall], ToolDecision | None]
AfterToolFunc = Callable[[PipelineContext, ToolCall, ToolOutcomeView], str | None]
OnToolErrorFunc = Callable[[PipelineContext, ToolCall, ToolOutcomeView], ToolErrorResolution | None]


class Plugin:
    """A named bundle of tool hooks. Only the functions given become stages, so a plugin costs nothing
    (no activity) at the stages it leaves out.

    Args:
        name: Required and unique in the pipeline.
        before_tool, after_tool, on_tool_error: The stage functions, plain or async.
        run_mode, timeout_seconds, max_attempts, failure_policy: As for any hook; plugins are pure
            in-process code, so they default to local activities.
    """

    def __init__(
        self,
        name: str,
        *,
        before_tool: BeforeToolFunc | None = None,
        after_tool: AfterToolFunc | None = None,
        on_tool_error: OnToolErrorFunc | None = None,
        run_mode: RunMode = RunMode.LOCAL_ACTIVITY,
        timeout_seconds: float = 5.0,
        max_attempts: int = 1,
        failure_policy: FailurePolicy | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("a plugin needs a non-empty name")
        self.name = name
        self.run_mode = run_mode
        self.timeout_seconds = timeout_seconds
        self.max_attempts = max_attempts
        self.failure_policy = failure_policy
        for stage, fn in (("before_tool", before_tool), ("after_tool", after_tool), ("on_tool_error", on_tool_error)):
            if fn is not None:
                setattr(self, stage, fn)

    def __repr__(self) -> str:
        stages = [s for s in ("before_tool", "after_tool", "on_tool_error") if hasattr(self, s)]
        return f"Plugin({self.name!r}, stages={stages})"


def allow_list(tools: Iterable[str], *, name: str = "allow-list", message: str | None = None) -> Plugin:
    """Deny every tool not named. Names are ``agent/capability`` or ``namespace/agent/capability``.

    The model reads the denial as the step's result, so it can adapt; a denial is not an error.
    """
    allowed = frozenset(tools)

    def before_tool(ctx: PipelineContext, call: ToolCall) -> ToolDecision | None:
        if call.tool in allowed or call.tool_key in allowed:
            return None
        return ToolDecision.deny(
            message or f"The tool {call.tool_key} is not available in this deployment.", reason="not on the allow-list"
        )

    return Plugin(name, before_tool=before_tool)


def redact(patterns: Mapping[str, re.Pattern[str] | Rule] | None = None, *, name: str = "redact") -> Plugin:
    """Mask matches of ``patterns`` (default: the project's redaction set, ``workflows.masking``) in every tool result
    before a planner or synthesizer reads it, and count them in an effect (never the secret). It fails
    closed: if it cannot run, the request ends rather than let an unmasked result reach a model."""
    chosen = dict(patterns or COMMON_SECRET_PATTERNS)

    def after_tool(ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView) -> str | None:
        masked, counts = redact_text(outcome.result, chosen)
        if not counts:
            return None
        ctx.report_effect(
            f"redaction:{call.step_id}",
            name=f"Redaction of {call.tool_key} result",
            data={"redactions": sum(counts.values()), "by_pattern": counts},
            summary=f"{sum(counts.values())} value(s) masked as {MASK}",
        )
        return masked

    return Plugin(name, after_tool=after_tool, failure_policy=FailurePolicy.FAIL_CLOSED)


def retry_on_error(*, name: str = "retry-on-error") -> Plugin:
    """Report a tool failure to the model as a readable result instead of an opaque error, so it can
    adapt. The error is handled: the step succeeds with that text as its result (its dependents run on
    it); the record keeps the error in the step's ``recovered_from``, and the tool's metrics still count
    the failure."""

    def on_tool_error(ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView) -> ToolErrorResolution:
        return ToolErrorResolution(
            handled=True,
            result=f"The tool {call.tool_key} failed: {outcome.error}. Try another approach or tell the user.",
        )

    return Plugin(name, on_tool_error=on_tool_error)


def truncate_results(max_chars: int, *, name: str = "truncate-results") -> Plugin:
    """Cap the result text that reaches the model at ``max_chars`` (with a marker saying so)."""
    if max_chars < 1:
        raise ValueError("max_chars must be at least 1")
    marker = " …[truncated]"

    def after_tool(ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView) -> str | None:
        if len(outcome.result) <= max_chars:
            return None
        if max_chars < len(marker):
            return outcome.result[:max_chars]
        return outcome.result[: max_chars - len(marker)] + marker

    return Plugin(name, after_tool=after_tool)
