"""Deterministic workflow code and the models every other part shares."""

from .converter import data_converter
from .detached import DETACHED_WORKFLOW_TYPE, DetachedEffectWorkflow, detached_workflow_id
from .lifecycle import WORKFLOW_TYPE, RequestLifecycleWorkflow
from .support import idempotency_key

WORKFLOWS = [RequestLifecycleWorkflow, DetachedEffectWorkflow]

__all__ = [
    "DETACHED_WORKFLOW_TYPE",
    "WORKFLOWS",
    "WORKFLOW_TYPE",
    "DetachedEffectWorkflow",
    "RequestLifecycleWorkflow",
    "data_converter",
    "detached_workflow_id",
    "idempotency_key",
]
