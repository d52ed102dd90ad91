"""Hooks that ship with the framework; each is also a worked example of one stage contract."""

from .allowed_operations import AllowedOperationsHook, Operation
from .audit import AuditHook, AuditWriter, JsonlAuditWriter
from .knowledge_context import KnowledgeContextHook
from .response_cache import ResponseCacheHook
from .secret_redaction import COMMON_SECRET_PATTERNS, SecretRedactionHook, redact

__all__ = [
    "COMMON_SECRET_PATTERNS",
    "AllowedOperationsHook",
    "AuditHook",
    "AuditWriter",
    "JsonlAuditWriter",
    "KnowledgeContextHook",
    "Operation",
    "ResponseCacheHook",
    "SecretRedactionHook",
    "redact",
]
