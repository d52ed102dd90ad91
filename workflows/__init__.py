"""Deterministic workflow code and the models every other part shares.

The workflows themselves load on first use (``workflows.WORKFLOWS``, ``workflows.RequestLifecycleWorkflow``,
...), so a process that needs only the models (a client, the CLI) never imports the workflow code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .conversation import CONVERSATION_WORKFLOW_TYPE, ConversationWorkflow
    from .converter import data_converter
    from .detached import DETACHED_WORKFLOW_TYPE, DetachedEffectWorkflow, detached_workflow_id
    from .lease_keeper import LEASE_KEEPER_WORKFLOW_TYPE, LeaseKeeperWorkflow
    from .lifecycle import WORKFLOW_TYPE, RequestLifecycleWorkflow
    from .notification import REVIEW_NOTIFICATION_WORKFLOW_TYPE, ReviewNotificationWorkflow
    from .policy_replay import POLICY_REPLAY_WORKFLOW_TYPE, PolicyReplayWorkflow, policy_replay_workflow_id
    from .support import idempotency_key

    WORKFLOWS: list[type]

_WHERE = {
    "CONVERSATION_WORKFLOW_TYPE": "names",
    "ConversationWorkflow": "conversation",
    "data_converter": "converter",
    "DETACHED_WORKFLOW_TYPE": "names",
    "DetachedEffectWorkflow": "detached",
    "detached_workflow_id": "detached",
    "LEASE_KEEPER_WORKFLOW_TYPE": "names",
    "LeaseKeeperWorkflow": "lease_keeper",
    "WORKFLOW_TYPE": "names",
    "RequestLifecycleWorkflow": "lifecycle",
    "REVIEW_NOTIFICATION_WORKFLOW_TYPE": "names",
    "ReviewNotificationWorkflow": "notification",
    "POLICY_REPLAY_WORKFLOW_TYPE": "names",
    "PolicyReplayWorkflow": "policy_replay",
    "policy_replay_workflow_id": "policy_replay",
    "idempotency_key": "support",
}


def __getattr__(name: str) -> Any:
    if name == "WORKFLOWS":  # every workflow a worker of the lifecycle registers
        return [
            __getattr__("RequestLifecycleWorkflow"),
            __getattr__("DetachedEffectWorkflow"),
            __getattr__("ReviewNotificationWorkflow"),
            __getattr__("LeaseKeeperWorkflow"),
            __getattr__("PolicyReplayWorkflow"),
            __getattr__("ConversationWorkflow"),
        ]
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONVERSATION_WORKFLOW_TYPE",
    "ConversationWorkflow",
    "DETACHED_WORKFLOW_TYPE",
    "LEASE_KEEPER_WORKFLOW_TYPE",
    "POLICY_REPLAY_WORKFLOW_TYPE",
    "REVIEW_NOTIFICATION_WORKFLOW_TYPE",
    "WORKFLOWS",
    "WORKFLOW_TYPE",
    "DetachedEffectWorkflow",
    "LeaseKeeperWorkflow",
    "PolicyReplayWorkflow",
    "RequestLifecycleWorkflow",
    "ReviewNotificationWorkflow",
    "data_converter",
    "detached_workflow_id",
    "idempotency_key",
    "policy_replay_workflow_id",
]
