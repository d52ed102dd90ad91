"""Side effects of the request lifecycle: hook invocation, planner, tools, synthesis, record store."""

from storage.executions import ExecutionStore, SQLiteExecutionStore

from .lifecycle import LifecycleActivities
from .planning import Planner, PlanningRequest, PromptInput, Synthesizer, build_planning_prompt
from .tools import Tool, ToolContext, ToolRegistry

__all__ = [
    "ExecutionStore",
    "LifecycleActivities",
    "Planner",
    "PlanningRequest",
    "PromptInput",
    "SQLiteExecutionStore",
    "Synthesizer",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "build_planning_prompt",
]
