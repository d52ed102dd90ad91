"""Text every store can hold: NUL, lone surrogates and the escape character itself, escaped and read back
exactly; ordinary text and documents stored as they are; text written before the escaping reads back
unchanged."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

import pytest

from storage import sqlite
from storage.text import (
    ESCAPE,
    MARK,
    EscapedStatements,
    escape,
    escape_existing,
    from_document,
    model_from_json,
    model_json,
    text_columns,
    to_document,
    unescape,
)
from workflows.models import ExecutionRecord

HOSTILE = [
    "\x00",
    "a\x00b\x00",
    "\ud800",
    "\udfff tail",
    "\ud83d",  # half of an emoji's pair
    ESCAPE,
    ESCAPE + "u0000",  # text that spells an escape
    ESCAPE + ESCAPE + "ud800",
    "\x00" + ESCAPE + "\udc00",
    "\\u0000",  # a backslash and letters, not a NUL
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_escaped_into_text_postgresql_can_hold_and_read_back_exactly(text):
    stored = escape(text)
    assert "\x00" not in stored
    stored.encode("utf-8")  # no lone surrogate left: it encodes
    assert unescape(stored) == text


@pytest.mark.parametrize("text", ["", "ACME", "naïve — ✓ 🚀", "back\\slash", "tab\tnewline\n"])
def test_ordinary_text_is_stored_as_it_is(text):
    assert escape(text) == text
    assert unescape(text) == text


def test_a_document_is_marked_and_escaped_only_when_it_must_be():
    plain = {"request": "ACME", "metadata": {"locale": "en"}}
    assert to_document(plain) is plain
    hostile = {"request": "a\x00", "metadata": {"k\x00": ["\ud800", {"n": 1, "x": None}]}, "note": ESCAPE}
    stored = to_document(hostile)
    assert stored[MARK] == 1
    json.dumps(stored, ensure_ascii=False).encode("utf-8")
    assert "\\u0000" not in json.dumps(stored)
    assert from_document(stored) == hostile


def test_a_document_written_before_the_escaping_reads_back_unchanged():
    # An older writer stored a document with the escape character and no mark: it is read as it is.
    old = {"request": f"{ESCAPE}u0000 and {ESCAPE}{ESCAPE}", "metadata": {}}
    assert from_document(old) == old


def test_a_record_with_nul_and_lone_surrogates_round_trips_through_its_json():
    record = ExecutionRecord(
        request_id="r",
        workflow_id="w",
        run_id="run",
        request="price of ACME\x00?",
        metadata={"tenant\x00": "t\ud800", "list": ["\udfff", ESCAPE]},
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    text = model_json(record)
    text.encode("utf-8")
    assert "\\u0000" not in text
    assert model_from_json(ExecutionRecord, text) == record
    plain = record.model_copy(update={"request": "price of ACME?", "metadata": {}})
    assert model_json(plain) == plain.model_dump_json()  # nothing to escape: pydantic's own JSON


def test_the_text_columns_of_a_schema_are_found_whatever_its_layout():
    schema = """
CREATE TABLE IF NOT EXISTS a (
    id    TEXT PRIMARY KEY,
    n     INTEGER NOT NULL,
    body  TEXT,
    blob  BLOB
);
CREATE TABLE b (
            key  TEXT NOT NULL,
            at   REAL
        )
"""
    assert text_columns(schema) == [("a", "id"), ("a", "body"), ("b", "key")]


def test_statements_escape_text_parameters_and_unescape_text_values_but_leave_bytes_alone(tmp_path):
    path = tmp_path / "t.sqlite3"
    with sqlite.connection(path) as db:
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT, b BLOB, n REAL)")
        statements = EscapedStatements(db)
        for text in HOSTILE:
            statements.execute("INSERT INTO t VALUES (?, ?, ?, ?)", (text, text + "!", b"\x00\xff", 1.5))
        for text in HOSTILE:
            row = statements.execute("SELECT k, v, b, n FROM t WHERE k = ?", (text,)).fetchone()
            assert row == (text, text + "!", b"\x00\xff", 1.5)
        assert sorted(r[0] for r in statements.execute("SELECT k FROM t")) == sorted(HOSTILE)


def test_the_escaping_migration_keeps_text_written_before_it_and_runs_once(tmp_path):
    path = tmp_path / "old.sqlite3"
    schema = "CREATE TABLE IF NOT EXISTS t (\n    k TEXT PRIMARY KEY,\n    v TEXT\n)"
    with sqlite.connection(path) as db:
        db.executescript(schema)
        # Written before the escaping: the escape character as it is, and a NUL SQLite could hold.
        db.execute("INSERT INTO t VALUES (?, ?)", ("k1", f"a {ESCAPE} b {ESCAPE}u0000 \x00"))
    migration = escape_existing("t", 1, schema)
    sqlite.migrate(path, [migration])
    sqlite.migrate(path, [migration])  # recorded: not applied twice
    with sqlite.connection(path) as db:
        assert EscapedStatements(db).execute("SELECT v FROM t").fetchone() == (f"a {ESCAPE} b {ESCAPE}u0000 \x00",)
        assert db.execute("SELECT COUNT(*) FROM agent_schema_migrations").fetchone() == (1,)


def test_sqlite_itself_cannot_encode_a_lone_surrogate():
    # Why every store escapes, SQLite too.
    with sqlite3.connect(":memory:") as db, pytest.raises(UnicodeEncodeError):
        db.execute("SELECT ?", ("\ud800",))
