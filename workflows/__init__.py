"""Deterministic workflow code and the models every other part shares."""

from .converter import data_converter
from .detached import DETACHED_WORKFLOW_TYPE, DetachedEffectWorkflow, detached_workflow_id
from .lease_keeper import LEASE_KEEPER_WORKFLOW_TYPE, LeaseKeeperWorkflow
from .lifecycle import WORKFLOW_TYPE, RequestLifecycleWorkflow
from .notification import REVIEW_NOTIFICATION_WORKFLOW_TYPE, ReviewNotificationWorkflow
from .support import idempotency_key

WORKFLOWS = [RequestLifecycleWorkflow, DetachedEffectWorkflow, ReviewNotificationWorkflow, LeaseKeeperWorkflow]

__all__ = [
    "DETACHED_WORKFLOW_TYPE",
    "LEASE_KEEPER_WORKFLOW_TYPE",
    "REVIEW_NOTIFICATION_WORKFLOW_TYPE",
    "WORKFLOWS",
    "WORKFLOW_TYPE",
    "DetachedEffectWorkflow",
    "LeaseKeeperWorkflow",
    "RequestLifecycleWorkflow",
    "ReviewNotificationWorkflow",
    "data_converter",
    "detached_workflow_id",
    "idempotency_key",
]
