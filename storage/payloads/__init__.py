"""Large payloads by reference: the driver Temporal's ``ExternalStorage`` writes to and reads from, on
one SQLite file (the processes of one machine) or PostgreSQL (workers on several machines)."""

from .base import (
    ACTIVITY_THRESHOLD_BYTES,
    DRIVER_NAME,
    MARKER_THRESHOLD_BYTES,
    OTHER_THRESHOLD_BYTES,
    PayloadNotFound,
    PayloadStore,
    external_storage,
)
from .postgres import PostgresPayloadStore
from .sqlite import SQLitePayloadStore

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
