"""Hooks that ship with the framework; each is also a worked example of one stage contract.

The names below load on first use: a process that needs one of them (the settings read ``MemoryOptions``,
the plugins ``redact``) does not import every built-in hook and the stores behind them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from .activity_coordination import ActivityAnnouncementHook, ActivityCleanupHook, activity_signal_id
    from .allowed_operations import AllowedOperationsHook, Operation
    from .audit import AuditHook, AuditWriter, JsonlAuditWriter
    from .conversation_history import ConversationHistoryHook
    from .knowledge_context import KnowledgeContextHook
    from .memory import (
        KnowledgeExtractionHook,
        MemoryEnrichmentHook,
        MemoryOptions,
        MemoryRecordHook,
        build_memory_hooks,
    )
    from .memory_model import HeuristicMemoryModel, extract_entities
    from .response_cache import ResponseCacheHook
    from .secret_redaction import COMMON_SECRET_PATTERNS, SecretRedactionHook, redact
    from .user_memory import UserMemoryEnrichmentHook, UserMemoryExtractionHook, build_user_memory_hooks

_WHERE = {
    "ActivityAnnouncementHook": ".activity_coordination",
    "ActivityCleanupHook": ".activity_coordination",
    "activity_signal_id": ".activity_coordination",
    "AllowedOperationsHook": ".allowed_operations",
    "Operation": ".allowed_operations",
    "AuditHook": ".audit",
    "AuditWriter": ".audit",
    "JsonlAuditWriter": ".audit",
    "ConversationHistoryHook": ".conversation_history",
    "KnowledgeContextHook": ".knowledge_context",
    "KnowledgeExtractionHook": ".memory",
    "MemoryEnrichmentHook": ".memory",
    "MemoryOptions": ".memory",
    "MemoryRecordHook": ".memory",
    "build_memory_hooks": ".memory",
    "HeuristicMemoryModel": ".memory_model",
    "extract_entities": ".memory_model",
    "ResponseCacheHook": ".response_cache",
    "COMMON_SECRET_PATTERNS": ".secret_redaction",
    "SecretRedactionHook": ".secret_redaction",
    "redact": ".secret_redaction",
    "UserMemoryEnrichmentHook": ".user_memory",
    "UserMemoryExtractionHook": ".user_memory",
    "build_user_memory_hooks": ".user_memory",
}

__all__ = [
    "COMMON_SECRET_PATTERNS",
    "ActivityAnnouncementHook",
    "ActivityCleanupHook",
    "AllowedOperationsHook",
    "AuditHook",
    "AuditWriter",
    "ConversationHistoryHook",
    "HeuristicMemoryModel",
    "JsonlAuditWriter",
    "KnowledgeContextHook",
    "KnowledgeExtractionHook",
    "MemoryEnrichmentHook",
    "MemoryOptions",
    "MemoryRecordHook",
    "Operation",
    "ResponseCacheHook",
    "SecretRedactionHook",
    "UserMemoryEnrichmentHook",
    "UserMemoryExtractionHook",
    "activity_signal_id",
    "build_memory_hooks",
    "build_user_memory_hooks",
    "extract_entities",
    "redact",
]

__getattr__ = lazy_getattr(globals(), _WHERE)
