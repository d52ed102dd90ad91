"""agent-lifecycle: a durable AI-agent request lifecycle on Temporal — plan, execute tools, synthesize,
with hooks at every stage, one workflow per request.

This is the front door: every name a first agent needs, from one import path::

    from agent_lifecycle import PipelineHook, Plan, RequiredAfterPlanningHook, ToolContext, build_pipeline, tool

The names load on first use, so importing the package costs nothing a program does not use (no
PostgreSQL driver, MCP or OpenAI package). The testing kit is :mod:`agent_lifecycle.testing`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from activities.function_tools import tool
    from activities.lifecycle import LifecycleActivities
    from activities.planning import Planner, PlanningRequest, ReadableSynthesizer, Synthesizer
    from activities.tools import Tool, ToolContext
    from client.api import AgentClient, RequestFailed, ReviewRefused
    from client.pipeline import build_pipeline
    from client.settings import Settings
    from hooks.contracts import HookRejection, PipelineContext, PipelineHook, RequiredAfterPlanningHook
    from workflows.models import ExecutionResult, FailurePolicy, Plan, PlanStep, ToolCall, ToolDecision

    from .plugin import AgentPlugin

# name -> the module that defines it (the front door is its one documented home)
_WHERE = {
    # tools: a typed function (``@tool``) or a class
    "tool": "activities.function_tools",
    "Tool": "activities.tools",
    "ToolContext": "activities.tools",
    # hooks, and the decisions they return
    "PipelineHook": "hooks.contracts",
    "RequiredAfterPlanningHook": "hooks.contracts",
    "HookRejection": "hooks.contracts",
    "PipelineContext": "hooks.contracts",
    "ToolCall": "workflows.models",
    "ToolDecision": "workflows.models",
    "FailurePolicy": "workflows.models",
    # plans, and the parts that make them and write the answer
    "Plan": "workflows.models",
    "PlanStep": "workflows.models",
    "Planner": "activities.planning",
    "PlanningRequest": "activities.planning",
    "Synthesizer": "activities.planning",
    "ReadableSynthesizer": "activities.planning",
    # the pipeline, and the Temporal plugin that runs it on a client and worker of one's own
    "build_pipeline": "client.pipeline",
    "LifecycleActivities": "activities.lifecycle",
    "Settings": "client.settings",
    "AgentPlugin": "agent_lifecycle.plugin",
    # starting requests and reading their results
    "AgentClient": "client.api",
    "RequestFailed": "client.api",
    "ReviewRefused": "client.api",
    "ExecutionResult": "workflows.models",
}

__all__ = [
    "AgentClient",
    "AgentPlugin",
    "ExecutionResult",
    "FailurePolicy",
    "HookRejection",
    "LifecycleActivities",
    "PipelineContext",
    "PipelineHook",
    "Plan",
    "PlanStep",
    "Planner",
    "PlanningRequest",
    "ReadableSynthesizer",
    "RequestFailed",
    "RequiredAfterPlanningHook",
    "ReviewRefused",
    "Settings",
    "Synthesizer",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolDecision",
    "build_pipeline",
    "tool",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
