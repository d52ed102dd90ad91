# ruff: noqa: F401  (the names are re-exported; ``__all__`` is computed on first use)
"""The extension API: stage contracts, the required marker, plugins, and the validated registry.

The names load on first use (each stage's hook Protocol from ``workflows.stages``), so a process that
needs one module of the package — the settings read ``hooks.builtin.memory`` — does not import them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workflows.models import (
        AnswerView,
        EffectStatus,
        ExecutionResult,
        FailurePolicy,
        FallbackRequest,
        MemoryCandidate,
        MemoryExchange,
        PlanStep,
        RecalledMemory,
        RecallPatch,
        RecallView,
        RunErrorView,
        RunMode,
        RunOutcomeView,
        RunPatch,
        RunView,
        SkipMemory,
        Stage,
        StepResult,
        StepStatus,
        Stop,
        ToolCall,
        ToolDecision,
        ToolErrorResolution,
        ToolOutcomeView,
    )
    from workflows.stages import *  # noqa: F403  (each stage's hook Protocol)

    from .contracts import (
        DetachedContext,
        DetachedWorkResult,
        HookRejection,
        LeaseContext,
        LeaseObservation,
        NotReplayed,
        PipelineContext,
        PipelineGate,
        PipelineHook,
        PipelineShortCircuit,
        PipelineShortCircuitDecision,
        RequiredAfterPlanningHook,
        ShortCircuitKind,
    )
    from .plugins import Plugin, allow_list, redact, retry_on_error, truncate_results
    from .registry import HookRegistry, InvalidPipelineConfigError, InvalidRequiredAfterPlanningHookError

_WHERE = {
    "AnswerView": "workflows.models",
    "EffectStatus": "workflows.models",
    "ExecutionResult": "workflows.models",
    "MemoryCandidate": "workflows.models",
    "FailurePolicy": "workflows.models",
    "PlanStep": "workflows.models",
    "RunErrorView": "workflows.models",
    "RunMode": "workflows.models",
    "RunOutcomeView": "workflows.models",
    "RunPatch": "workflows.models",
    "RunView": "workflows.models",
    "SkipMemory": "workflows.models",
    "Stage": "workflows.models",
    "StepResult": "workflows.models",
    "StepStatus": "workflows.models",
    "Stop": "workflows.models",
    "ToolCall": "workflows.models",
    "ToolDecision": "workflows.models",
    "ToolErrorResolution": "workflows.models",
    "ToolOutcomeView": "workflows.models",
    "FallbackRequest": "workflows.models",
    "MemoryExchange": "workflows.models",
    "RecalledMemory": "workflows.models",
    "RecallPatch": "workflows.models",
    "RecallView": "workflows.models",
    "DetachedContext": ".contracts",
    "DetachedWorkResult": ".contracts",
    "HookRejection": ".contracts",
    "LeaseContext": ".contracts",
    "LeaseObservation": ".contracts",
    "NotReplayed": ".contracts",
    "PipelineContext": ".contracts",
    "PipelineGate": ".contracts",
    "PipelineHook": ".contracts",
    "PipelineShortCircuit": ".contracts",
    "PipelineShortCircuitDecision": ".contracts",
    "RequiredAfterPlanningHook": ".contracts",
    "ShortCircuitKind": ".contracts",
    "Plugin": ".plugins",
    "allow_list": ".plugins",
    "redact": ".plugins",
    "retry_on_error": ".plugins",
    "truncate_results": ".plugins",
    "HookRegistry": ".registry",
    "InvalidPipelineConfigError": ".registry",
    "InvalidRequiredAfterPlanningHookError": ".registry",
}

_OWN = [
    "AnswerView",
    "DetachedContext",
    "DetachedWorkResult",
    "EffectStatus",
    "ExecutionResult",
    "FailurePolicy",
    "FallbackRequest",
    "HookRegistry",
    "HookRejection",
    "InvalidPipelineConfigError",
    "InvalidRequiredAfterPlanningHookError",
    "LeaseContext",
    "LeaseObservation",
    "NotReplayed",
    "MemoryCandidate",
    "MemoryExchange",
    "PipelineContext",
    "PipelineGate",
    "PipelineHook",
    "PipelineShortCircuit",
    "PipelineShortCircuitDecision",
    "PlanStep",
    "Plugin",
    "RecallPatch",
    "RecallView",
    "RecalledMemory",
    "RequiredAfterPlanningHook",
    "RunErrorView",
    "RunMode",
    "RunOutcomeView",
    "RunPatch",
    "RunView",
    "ShortCircuitKind",
    "SkipMemory",
    "Stage",
    "StepResult",
    "StepStatus",
    "Stop",
    "ToolCall",
    "ToolDecision",
    "ToolErrorResolution",
    "ToolOutcomeView",
    "allow_list",
    "redact",
    "retry_on_error",
    "truncate_results",
]


def _stage_names() -> list[str]:
    return list(importlib.import_module("workflows.stages").__all__)


def __getattr__(name: str) -> Any:
    if name == "__all__":  # what the package exports: the names above and each stage's hook Protocol
        return [*_OWN, *_stage_names()]
    if name in _WHERE:
        module = _WHERE[name]
        value = getattr(importlib.import_module(module, __name__ if module.startswith(".") else None), name)
    elif name == "stages" or name in _stage_names():
        stages = importlib.import_module("workflows.stages")
        value = stages if name == "stages" else getattr(stages, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
