"""The response cache's entries: answers a later identical request may be served, keyed by the request's
normalized text. One interface, on one SQLite file (the processes of one machine) or PostgreSQL (workers
on several machines: a request answered through one worker is served from the cache through any other;
its driver loads on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import CachedResponse, ResponseCacheStore
from .sqlite import SQLiteResponseCacheStore

if TYPE_CHECKING:
    from .postgres import PostgresResponseCacheStore

__all__ = ["CachedResponse", "PostgresResponseCacheStore", "ResponseCacheStore", "SQLiteResponseCacheStore"]


def __getattr__(name: str) -> Any:
    if name == "PostgresResponseCacheStore":
        from .postgres import PostgresResponseCacheStore

        return PostgresResponseCacheStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
