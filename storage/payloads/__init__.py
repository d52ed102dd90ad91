"""Large payloads by reference: the driver Temporal's ``ExternalStorage`` writes to and reads from, on
one SQLite file (the processes of one machine) or PostgreSQL (workers on several machines; its driver
loads on first use)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    ACTIVITY_THRESHOLD_BYTES,
    DRIVER_NAME,
    MARKER_THRESHOLD_BYTES,
    OTHER_THRESHOLD_BYTES,
    PayloadNotFound,
    PayloadStore,
    external_storage,
)
from .sqlite import SQLitePayloadStore

if TYPE_CHECKING:
    from .postgres import PostgresPayloadStore

__all__ = [
    "ACTIVITY_THRESHOLD_BYTES",
    "DRIVER_NAME",
    "MARKER_THRESHOLD_BYTES",
    "OTHER_THRESHOLD_BYTES",
    "PayloadNotFound",
    "PayloadStore",
    "PostgresPayloadStore",
    "SQLitePayloadStore",
    "external_storage",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresPayloadStore":
        from .postgres import PostgresPayloadStore

        return PostgresPayloadStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
