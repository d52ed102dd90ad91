"""The types the lifecycle's workflows are registered under.

What a client starts, signals and lists by name, importable without the workflow code (a client or the
CLI never loads the workflows themselves)."""

from __future__ import annotations

WORKFLOW_TYPE = "RequestLifecycle"
CONVERSATION_WORKFLOW_TYPE = "Conversation"
DETACHED_WORKFLOW_TYPE = "DetachedEffect"
LEASE_KEEPER_WORKFLOW_TYPE = "LeaseKeeper"
REVIEW_NOTIFICATION_WORKFLOW_TYPE = "ReviewNotification"
POLICY_REPLAY_WORKFLOW_TYPE = "PolicyReplay"
