"""The lifecycle's hooks in the benchmark: where applications put theirs, each doing its work from
:mod:`benchmarks.peer.policy`, written as the hook documentation writes them (async stage methods on
``PipelineHook`` subclasses, in process, so each runs as a local activity).

| hook | stage | its work |
| --- | --- | --- |
| ``request-context`` | before_planning | the symbols asked about, into ``rag_context`` (the planner's prompt) |
| ``plan-guard`` | after_planning, the required gate | refuses a plan that calls a tool not on the allow-list |
| ``tool-allow-list`` | before_tool, every call | denies a tool not on the allow-list |
| ``result-redactor`` | after_tool, every call (fails closed) | masks account numbers in the result |
| ``answer-redactor`` | after_synthesis (fails closed) | masks account numbers in the answer |
| ``audit`` | on_finish | one audit line per request |
"""

from __future__ import annotations

from hooks import (
    HookRejection,
    PipelineContext,
    PipelineHook,
    RequiredAfterPlanningHook,
    RunOutcomeView,
    ToolCall,
    ToolDecision,
    ToolOutcomeView,
)
from workflows.models import FailurePolicy, Plan

from . import policy


class RequestContext(PipelineHook):
    name = "request-context"

    async def before_planning(self, ctx: PipelineContext) -> None:
        ctx.enrichments["rag_context"] = policy.context_note(ctx.request)


class PlanGuard(RequiredAfterPlanningHook, PipelineHook):
    name = "plan-guard"

    async def after_planning(self, ctx: PipelineContext, plan: Plan) -> Plan:
        refused = policy.refused_tools(step.capability for step in plan.steps)
        if refused:
            raise HookRejection(f"the plan calls tools not on the allow-list: {', '.join(refused)}")
        return plan


class ToolAllowList(PipelineHook):
    name = "tool-allow-list"

    async def before_tool(self, ctx: PipelineContext, call: ToolCall) -> ToolDecision | None:
        if policy.tool_allowed(call.capability):
            return None
        return ToolDecision.deny(policy.denial(call.capability), reason="not on the allow-list")


class ResultRedactor(PipelineHook):
    name = "result-redactor"
    failure_policy = FailurePolicy.FAIL_CLOSED

    async def after_tool(self, ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView) -> str | None:
        masked = policy.redact(outcome.result)
        return None if masked == outcome.result else masked


class AnswerRedactor(PipelineHook):
    name = "answer-redactor"
    failure_policy = FailurePolicy.FAIL_CLOSED

    async def after_synthesis(self, ctx: PipelineContext, response: str) -> str:
        return policy.redact(response)


class Audit(PipelineHook):
    name = "audit"

    async def on_finish(self, ctx: PipelineContext, outcome: RunOutcomeView) -> None:
        policy.audit(ctx.request_id, outcome.status, outcome.response or "")


def user_hooks() -> list[PipelineHook]:
    """The hooks in registration order (the required gate is the last after_planning participant)."""
    return [RequestContext(), PlanGuard(), ToolAllowList(), ResultRedactor(), AnswerRedactor(), Audit()]


# hook -> the stages it runs at
HOOK_STAGES = {
    "request-context": ("before_planning",),
    "plan-guard": ("after_planning",),
    "tool-allow-list": ("before_tool",),
    "result-redactor": ("after_tool",),
    "answer-redactor": ("after_synthesis",),
    "audit": ("on_finish",),
}
