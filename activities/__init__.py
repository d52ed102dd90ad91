"""Side effects of the request lifecycle: hook invocation, planner, tools, synthesis, record store.

The names below load on first use, so a process that needs one light module of the package (the settings
read ``activities.models.settings``) does not import every activity.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
