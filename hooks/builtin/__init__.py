"""Hooks that ship with the framework; each is also a worked example of one stage contract."""

from .activity_coordination import ActivityAnnouncementHook, ActivityCleanupHook, activity_signal_id
from .allowed_operations import AllowedOperationsHook, Operation
from .audit import AuditHook, AuditWriter, JsonlAuditWriter
from .conversation_history import ConversationHistoryHook
from .knowledge_context import KnowledgeContextHook
from .memory import KnowledgeExtractionHook, MemoryEnrichmentHook, MemoryOptions, MemoryRecordHook, build_memory_hooks
from .memory_model import HeuristicMemoryModel, extract_entities
from .response_cache import ResponseCacheHook
from .secret_redaction import COMMON_SECRET_PATTERNS, SecretRedactionHook, redact
from .user_memory import UserMemoryEnrichmentHook, UserMemoryExtractionHook, build_user_memory_hooks

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
