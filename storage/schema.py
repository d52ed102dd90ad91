"""What every store uses whichever backend holds it: a schema step (:class:`Migration`), a SQLite schema
in PostgreSQL's types, and the errors a store call may raise when its database fails. Nothing here needs
the PostgreSQL driver, so a deployment on SQLite never imports it (``storage.postgres`` does)."""

from __future__ import annotations

import os
import re
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

DatabaseT = TypeVar("DatabaseT")


class DatabaseUnavailable(RuntimeError):
    """The database could not be reached (a wrong URL, a server down, refused credentials)."""


@dataclass(frozen=True)
class Migration:
    """One step of a store's schema: applied once per database, in ``version`` order."""

    component: str
    version: int
    sql: str


def located(location: str | os.PathLike[str] | DatabaseT) -> tuple[DatabaseT | None, Path | None]:
    """Where a store keeps its rows: ``(None, path)`` for a SQLite file, ``(database, None)`` for a
    PostgreSQL ``Database`` (whose driver a SQLite deployment never imports)."""
    if isinstance(location, (str, os.PathLike)):
        return None, Path(location)
    return location, None


def from_sqlite_schema(schema: str) -> str:
    """A store's SQLite schema in PostgreSQL's types, for a store whose statements serve both backends:
    REAL → DOUBLE PRECISION, BLOB → BYTEA, an autoincrement key → an identity column; every table and index
    created once (the migration ledger, not ``IF NOT EXISTS``, says whether it exists)."""
    return (
        re.sub(r"\bREAL\b", "DOUBLE PRECISION", schema)
        .replace("BLOB", "BYTEA")
        .replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY")
        .replace("IF NOT EXISTS ", "")
    )


def store_errors() -> tuple[type[Exception], ...]:
    """What a store call may raise when its database fails, on either backend (for stores that fail
    open). The driver's errors are among them once it is loaded; until then no store can raise one."""
    psycopg = sys.modules.get("psycopg")
    driver: tuple[type[Exception], ...] = (psycopg.Error,) if psycopg is not None else ()
    return (sqlite3.Error, DatabaseUnavailable, *driver)
