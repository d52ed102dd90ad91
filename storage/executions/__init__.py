"""Execution records: the interface every backend implements, and its two backends — one SQLite file
(the embedded default) and PostgreSQL (workers on several machines)."""

from .base import DEFAULT_ERROR_RETENTION, DEFAULT_RETENTION, ExecutionStore, lasting, merge_effects, snapshot_revision
from .postgres import PostgresExecutionStore
from .sqlite import SQLiteExecutionStore

__all__ = [
    "DEFAULT_ERROR_RETENTION",
    "DEFAULT_RETENTION",
    "ExecutionStore",
    "PostgresExecutionStore",
    "SQLiteExecutionStore",
    "lasting",
    "merge_effects",
    "snapshot_revision",
]
