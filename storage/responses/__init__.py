"""The response cache's entries: answers a later identical request may be served, keyed by the request's
normalized text. One interface, on one SQLite file (the processes of one machine) or PostgreSQL (workers
on several machines: a request answered through one worker is served from the cache through any other).
"""

from .base import CachedResponse, ResponseCacheStore
from .postgres import PostgresResponseCacheStore
from .sqlite import SQLiteResponseCacheStore

__all__ = ["CachedResponse", "PostgresResponseCacheStore", "ResponseCacheStore", "SQLiteResponseCacheStore"]
