"""Text every store can hold, read back exactly as it was written.

PostgreSQL refuses a NUL character in ``text`` and in ``jsonb`` (``\\u0000``), and a lone surrogate (a
half of a UTF-16 pair, which JSON can carry as ``\\ud800``) has no UTF-8 encoding at all, so neither
backend can store it as text. Both are valid in a Python string and in JSON, so a request's message, its
metadata, a hook's output or an effect's data may carry them. Every store writes them through this module,
escaped reversibly with one character, ``␛`` (U+241B, SYMBOL FOR ESCAPE):

* ``␛u0000`` stands for NUL and ``␛udXXX`` for a lone surrogate; ``␛␛`` for ``␛`` itself. Text without
  any of the three is stored as it is, so keys, ids and ordinary text look the same in the database.
* **Documents** (a record or an effect as JSON, a JSON column) are escaped only when some string in them —
  a key or a value — holds one of the three: then every string is escaped and the document carries the
  top-level key ``␛`` (:data:`MARK`). A document without it is read as it was stored, so a document written
  before this scheme reads back unchanged (none of them holds NUL or a lone surrogate; one holding ``␛``
  was not escaped and is not marked either).
* **Columns of plain text** of the stores that go through :class:`EscapedStatements` are escaped string by
  string. Text written before the scheme may hold ``␛`` unescaped; each such store escapes it once, as a
  migration (:func:`escape_existing`), before it reads or writes anything else.

Why not mark plain text the way documents are marked: every string without NUL is a text PostgreSQL may
already hold, so no spelling of an escaped value can be told apart from an old value without the
database saying which rows were written how — here, the migration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .schema import Migration

ESCAPE = "\u241b"
# The top-level key of a document whose strings are escaped (an escaped key is never ``␛`` alone: a key
# holding it has it doubled).
MARK = ESCAPE
_SPECIAL = re.compile("[\x00\ud800-\udfff\u241b]")
_ESCAPED = re.compile("\u241b(\u241b|u[0-9a-f]{4})")

ModelT = TypeVar("ModelT", bound=BaseModel)


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    return ESCAPE + ESCAPE if char == ESCAPE else f"{ESCAPE}u{ord(char):04x}"


def _unescape_sequence(match: re.Match[str]) -> str:
    code = match.group(1)
    return ESCAPE if code == ESCAPE else chr(int(code[1:], 16))


def as_written_before(text: str) -> str | None:
    """``text`` as a writer from before the escaping could have stored it: itself, or None for text
    holding NUL or a lone surrogate, which no such writer could store (for matching older rows)."""
    return None if re.search("[\x00\ud800-\udfff]", text) else text


def needs_escape(text: str) -> bool:
    """Whether ``text`` holds NUL, a lone surrogate or ``␛``."""
    return _SPECIAL.search(text) is not None


def escape(text: str) -> str:
    """``text`` as any store can hold it (unchanged unless it holds NUL, a lone surrogate or ``␛``)."""
    return _SPECIAL.sub(_escape_char, text) if needs_escape(text) else text


def unescape(text: str) -> str:
    """The text :func:`escape` was given."""
    return _ESCAPED.sub(_unescape_sequence, text) if ESCAPE in text else text


# --------------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------------


def _any_special(value: Any) -> bool:
    if isinstance(value, str):
        return needs_escape(value)
    if isinstance(value, dict):
        return any(needs_escape(k) or _any_special(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_any_special(v) for v in value)
    return False


def _map_strings(value: Any, convert: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return convert(value)
    if isinstance(value, dict):
        return {convert(k) if isinstance(k, str) else k: _map_strings(v, convert) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, convert) for v in value]
    return value


def to_document(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON object as any store can hold it: itself, or — when a key or a string in it holds NUL, a
    lone surrogate or ``␛`` — with every string escaped and the mark added."""
    if not _any_special(value):
        return value
    return {MARK: 1, **_map_strings(value, escape)}


def from_document(value: Any) -> Any:
    """The JSON object :func:`to_document` was given (a document without the mark as it is)."""
    if not isinstance(value, dict) or MARK not in value:
        return value
    return {unescape(k): _map_strings(v, unescape) for k, v in value.items() if k != MARK}


def model_json(model: BaseModel) -> str:
    """A model as JSON text any store can hold, in a text or a ``jsonb`` column: pydantic's own JSON when
    nothing in it needs escaping (the common case, and the fast one), else its escaped document."""
    try:
        text = model.model_dump_json()
    except PydanticSerializationError:  # a lone surrogate in a value has no UTF-8 encoding
        text = None
    # pydantic writes NUL as ``\u0000`` and a key holding a lone surrogate as U+FFFD (losing it): either,
    # or the escape character, takes the careful path (a false alarm only costs its time).
    if text is not None and not any(sign in text for sign in ("\\u0000", "\ufffd", ESCAPE)):
        return text
    # Its own values (datetimes, enums, ...), every key kept: escaped before they become JSON.
    python = model.model_dump(mode="python")
    if not _any_special(python):
        return text if text is not None else model.model_dump_json()
    document = {MARK: 1, **to_jsonable_python(_map_strings(python, escape))}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def model_from_json(model: type[ModelT], stored: str | dict[str, Any]) -> ModelT:
    """The model :func:`model_json` wrote — its text (or, from a ``jsonb`` column, its object)."""
    if isinstance(stored, str):
        if ESCAPE not in stored:
            return model.model_validate_json(stored)
        stored = json.loads(stored)
    return model.model_validate(from_document(stored))


# --------------------------------------------------------------------------------------------------
# Columns of plain text
# --------------------------------------------------------------------------------------------------


def _escaped_param(value: Any) -> Any:
    return escape(value) if isinstance(value, str) else value


def _read_row(row: Any) -> Any:
    if row is None:
        return None
    return tuple(unescape(v) if isinstance(v, str) else v for v in row)


class EscapedRows:
    """A cursor whose text values read back unescaped."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return _read_row(self._cursor.fetchone())

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [_read_row(row) for row in self._cursor.fetchall()]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return (_read_row(row) for row in self._cursor)


class EscapedStatements:
    """A connection (SQLite's, or :class:`storage.postgres.QmarkConnection`) whose statements write every
    text parameter escaped and read every text value back unescaped: every column of plain text a store
    writes through it holds whatever text it was given. Bytes, numbers and NULL pass as they are."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> EscapedRows:
        return EscapedRows(self._conn.execute(sql, tuple(_escaped_param(p) for p in params)))

    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> EscapedRows:
        rows = [tuple(_escaped_param(p) for p in row) for row in params]
        return EscapedRows(self._conn.executemany(sql, rows))


_TABLE = re.compile(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+) \((.*?)\n\s*\);?", re.S)
_TEXT_COLUMN = re.compile(r"^\s*(\w+)\s+TEXT\b", re.M)


def text_columns(schema: str) -> list[tuple[str, str]]:
    """The (table, column) of every ``TEXT`` column a SQLite schema script creates."""
    return [(table, column) for table, body in _TABLE.findall(schema) for column in _TEXT_COLUMN.findall(body)]


def escape_existing(component: str, version: int, schema: str) -> Migration:
    """The migration after which a store escapes the text of ``schema``'s tables: it escapes ``␛`` in their
    text columns as they stand (the same statements on SQLite and PostgreSQL). Of text written before,
    only a ``␛`` would read back as something else: no lone surrogate could be written, and a NUL (which
    SQLite could hold) reads back as it is."""
    statements = [
        f"UPDATE {table} SET {column} = replace({column}, '{ESCAPE}', '{ESCAPE}{ESCAPE}') WHERE {column} LIKE '%{ESCAPE}%'"
        for table, column in text_columns(schema)
    ]
    return Migration(component, version, ";\n".join(statements))
