"""The agent's hooks: a guard before each tool call, a disclaimer after synthesis, and the required gate.

A hook is an object with a ``name`` and one or more stage methods; ``PipelineHook`` gives it the run
options' defaults. Each invocation is an activity of the request, named ``<stage> · <hook>`` in the UI.
"""

from __future__ import annotations

from agent_lifecycle import (
    HookRejection,
    PipelineContext,
    PipelineHook,
    Plan,
    RequiredAfterPlanningHook,
    ToolCall,
    ToolDecision,
)

ALLOWED_TOOLS = {"notes/notes-service/find_note", "notes/notes-service/write_note"}


class NoSecrets(PipelineHook):
    """before_tool: a note whose title says "secret" is never read or written (the step is denied, and
    the answer says so)."""

    name = "no-secrets"

    def before_tool(self, ctx: PipelineContext, call: ToolCall) -> ToolDecision | None:
        if "secret" in str(call.arguments.get("title", "")).lower():
            return ToolDecision.deny("notes about secrets are off limits", reason="secret title")
        return None


class Disclaimer(PipelineHook):
    """after_synthesis: every answer ends with where it came from."""

    name = "disclaimer"

    def after_synthesis(self, ctx: PipelineContext, response: str) -> str:
        return f"{response}\n— from the notes service"


class OnlyNotesTools(RequiredAfterPlanningHook, PipelineHook):
    """The required gate: a plan that calls anything but the notes tools fails the request before any tool
    runs (``RequiredAfterPlanningError``, never retried)."""

    name = "only-notes-tools"

    def after_planning(self, ctx: PipelineContext, plan: Plan) -> Plan:
        outside = [step.tool_key for step in plan.steps if step.tool_key not in ALLOWED_TOOLS]
        if outside:
            raise HookRejection(f"not a notes tool: {', '.join(outside)}")
        return plan
