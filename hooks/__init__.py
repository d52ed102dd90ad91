"""The extension API: stage contracts, the required marker, and the validated registry."""

from workflows.models import EffectStatus, ExecutionResult, Plan, PlanStep, RunMode, Stage, StepResult, StepStatus

from .contracts import (
    AfterExecutionHook,
    AfterPlanningHook,
    AfterSynthesisHook,
    BeforePlanningDecisionHook,
    BeforePlanningHook,
    DetachedContext,
    DetachedWorkResult,
    HookRejection,
    PipelineContext,
    PipelineGate,
    PipelineHook,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    RequiredAfterPlanningHook,
    ShortCircuitKind,
)
from .registry import HookRegistry, InvalidPipelineConfigError, InvalidRequiredAfterPlanningHookError

__all__ = [
    "AfterExecutionHook",
    "AfterPlanningHook",
    "AfterSynthesisHook",
    "BeforePlanningDecisionHook",
    "BeforePlanningHook",
    "DetachedContext",
    "DetachedWorkResult",
    "EffectStatus",
    "ExecutionResult",
    "HookRegistry",
    "HookRejection",
    "InvalidPipelineConfigError",
    "InvalidRequiredAfterPlanningHookError",
    "PipelineContext",
    "PipelineGate",
    "PipelineHook",
    "PipelineShortCircuit",
    "PipelineShortCircuitDecision",
    "Plan",
    "PlanStep",
    "RequiredAfterPlanningHook",
    "RunMode",
    "ShortCircuitKind",
    "Stage",
    "StepResult",
    "StepStatus",
]
