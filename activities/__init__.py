"""Side effects of the request lifecycle: hook invocation, planner, tools, synthesis, record store.

The names below load on first use, so a process that needs one light module of the package (the settings
read ``activities.models.settings``) does not import every activity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooks._lazy import lazy_getattr

if TYPE_CHECKING:
    from .function_tools import FunctionTool, function_tool, tool
    from .lifecycle import LifecycleActivities
    from .planning import Planner, PlanningRequest, PromptInput, Synthesizer, build_planning_prompt
    from .tools import Tool, ToolContext, ToolRegistry

_WHERE = {
    "LifecycleActivities": ".lifecycle",
    "Planner": ".planning",
    "PlanningRequest": ".planning",
    "PromptInput": ".planning",
    "Synthesizer": ".planning",
    "build_planning_prompt": ".planning",
    "FunctionTool": ".function_tools",
    "function_tool": ".function_tools",
    "tool": ".function_tools",
    "Tool": ".tools",
    "ToolContext": ".tools",
    "ToolRegistry": ".tools",
}

__all__ = [
    "FunctionTool",
    "LifecycleActivities",
    "Planner",
    "PlanningRequest",
    "PromptInput",
    "Synthesizer",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "build_planning_prompt",
    "function_tool",
    "tool",
]

__getattr__ = lazy_getattr(globals(), _WHERE)
