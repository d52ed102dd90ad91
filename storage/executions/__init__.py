"""Execution records: the interface every backend implements, and its two backends — one SQLite file
(the embedded default) and PostgreSQL (workers on several machines; its driver loads on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import DEFAULT_ERROR_RETENTION, DEFAULT_RETENTION, ExecutionStore, lasting, merge_effects, snapshot_revision
from .sqlite import SQLiteExecutionStore

if TYPE_CHECKING:
    from .postgres import PostgresExecutionStore

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


def __getattr__(name: str) -> Any:
    if name == "PostgresExecutionStore":
        from .postgres import PostgresExecutionStore

        return PostgresExecutionStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
