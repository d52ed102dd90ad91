"""Text no database takes as it is — NUL (PostgreSQL refuses it in ``text`` and ``jsonb``), lone surrogates
(no UTF-8 encoding at all) and the escape character ``␛`` itself — written to every store that keeps
request-derived text, on both backends: nothing fails, and everything reads back exactly as it was
written. Text those stores wrote before they escaped theirs reads back unchanged too."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.types.json import Jsonb
from temporalio.api.common.v1 import Payload

from activities.memory import MIGRATIONS as MEMORY_MIGRATIONS
from activities.memory import MemoryStore
from hooks.declarative import HookStore
from hooks.declarative.store import MIGRATIONS as HOOK_MIGRATIONS
from hooks.declarative.store import ExecutionRow
from hooks.memory import EpisodicEvent, KnowledgeFragment, UserFact
from storage.executions import PostgresExecutionStore, SQLiteExecutionStore
from storage.payloads import PostgresPayloadStore, SQLitePayloadStore
from storage.replays import ReplayReportStore
from storage.responses import CachedResponse, PostgresResponseCacheStore, SQLiteResponseCacheStore
from storage.responses.postgres import MIGRATIONS as RESPONSE_MIGRATIONS
from storage.text import ESCAPE
from workflows.models import (
    EffectStatus,
    ExecutionRecord,
    LifecycleBoundary,
    MemoryCandidate,
    PipelineHookEffect,
    RecordLifecycle,
    RequestReplay,
    RequestStatus,
)

from .conftest import Backend

NUL = "\x00"
HIGH, LOW = "\ud800", "\udfff"  # halves of a surrogate pair, each on its own
# Every kind of text no backend takes as it is, and text that merely looks like its escaped form.
HOSTILE = f"price{NUL} of {HIGH}ACME{LOW} {ESCAPE} {ESCAPE}u0000 \\u0000{NUL}"
STARTED = datetime(2026, 1, 1, tzinfo=UTC)


def hostile_record(revision: int = 1, **changes) -> ExecutionRecord:
    return ExecutionRecord(
        request_id="req-hostile",
        workflow_id="wf-hostile",
        run_id="run-1",
        request=HOSTILE,
        metadata={f"key{NUL}": [HOSTILE, {HIGH: LOW}], "tenant_id": f"t{NUL}1", "agent_id": ESCAPE},
        status=RequestStatus.SUCCEEDED,
        record_revision=revision,
        started_at=STARTED,
        final_response=HOSTILE,
        effects=[PipelineHookEffect(effect_id="e1", name=HOSTILE, hook="h", status=EffectStatus.PENDING)],
        lifecycle=RecordLifecycle(
            boundary=LifecycleBoundary.TERMINAL, completion="completed", snapshot_revision=revision
        ),
        **changes,
    )


async def test_a_record_and_its_effect_updates_read_back_exactly_and_are_found_by_their_tenant(backend: Backend):
    store = (
        PostgresExecutionStore(backend.database())
        if backend.postgres
        else SQLiteExecutionStore(backend.file("executions.sqlite3"))
    )
    record = hostile_record()
    assert await store.save(record) == (1, True)
    update = PipelineHookEffect(
        effect_id="e1", name="audit", hook="h", status=EffectStatus.FAILED, error=HOSTILE, data={NUL: HOSTILE}
    )
    assert await store.update_effect("wf-hostile", "run-1", update) == (2, True)

    stored = await store.get("req-hostile")
    assert stored is not None
    assert stored.request == HOSTILE and stored.final_response == HOSTILE
    assert stored.metadata == record.metadata
    assert stored.effects == [update]
    assert stored.model_copy(update={"effects": record.effects, "record_revision": 1}) == record
    assert await store.window(tenant=f"t{NUL}1", agent=ESCAPE) == [("wf-hostile", "run-1")]
    assert await store.window(tenant="t1") == []


async def test_a_record_written_before_the_escaping_reads_back_as_written(backend: Backend):
    """An older worker wrote the escape character as it is, unmarked: it still reads as it was."""
    old = ExecutionRecord(
        request_id="req-old",
        workflow_id="wf-old",
        run_id="run-1",
        request=f"{ESCAPE}u0000 {ESCAPE}{ESCAPE}",
        metadata={"tenant_id": f"a{ESCAPE}b"},
        started_at=STARTED,
    )
    if backend.postgres:
        database = backend.database()
        store = PostgresExecutionStore(database)
        await store.migrate()
        with psycopg.connect(backend.url or "", autocommit=True) as conn:
            conn.execute(
                "INSERT INTO agent_executions VALUES (%s, %s, %s, %s, 0, %s, now(), now() + interval '1 day', %s)",
                (
                    "wf-old",
                    "run-1",
                    "req-old",
                    "running",
                    STARTED,
                    Jsonb(old.model_dump(mode="json")),
                ),
            )
    else:
        store = SQLiteExecutionStore(backend.file("executions.sqlite3"))
        with sqlite3.connect(backend.file("executions.sqlite3")) as db:
            db.execute(
                "INSERT INTO executions VALUES (?, ?, ?, ?, 0, ?, 0, 1e12, ?)",
                ("wf-old", "run-1", "req-old", "running", STARTED.isoformat(), old.model_dump_json()),
            )
    assert await store.get("req-old") == old
    assert await store.window(tenant=f"a{ESCAPE}b") == [("wf-old", "run-1")]


async def test_memory_writes_every_facet_and_reads_it_back_exactly(backend: Backend):
    store = MemoryStore(backend.database() if backend.postgres else backend.file("memory.sqlite3"))
    conversation = f"conv{NUL}{HIGH}"
    await store.save(
        MemoryCandidate(conversation_id=conversation, request=HOSTILE, answer=HOSTILE, facts={NUL: LOW}),
        request_id="r1",
    )
    [remembered] = await store.recent(conversation)
    assert (remembered.request, remembered.answer, remembered.facts) == (HOSTILE, HOSTILE, {NUL: LOW})

    event = EpisodicEvent(event_id=f"e{NUL}", agent_domain="demo", request_id="r1", entities=[HIGH], outcome=HOSTILE,
                          summary=HOSTILE, occurred_at=STARTED)  # fmt: skip
    written = await store.record_events([event])
    assert written.ok, written.error
    events = await store.recent_events("demo", entities=[HIGH], since=STARTED, limit=5)
    assert events.ok, events.error
    assert [(e.event_id, e.summary, e.entities) for e in events.items] == [(f"e{NUL}", HOSTILE, [HIGH])]

    fact = UserFact(user_id=f"u{LOW}", key=f"k{NUL}", value=HOSTILE)
    written = await store.remember_facts([fact])
    assert written.ok, written.error
    facts = await store.user_facts(f"u{LOW}", limit=5)
    assert [(f.key, f.value) for f in facts.items] == [(f"k{NUL}", HOSTILE)]

    fragment = KnowledgeFragment(fragment_id="f1", agent_domain="demo", title=HOSTILE, text=HOSTILE, entities=[NUL])
    written = await store.store_fragment(fragment)
    assert written.ok, written.error
    [found] = (await store.related_fragments("demo", entities=[NUL], limit=5)).items
    assert (found.title, found.text, found.entities) == (HOSTILE, HOSTILE, [NUL])


def test_a_hooks_audit_row_with_hostile_reason_error_and_metadata_reads_back_exactly(backend: Backend):
    store = HookStore(backend.database() if backend.postgres else backend.file("hooks.sqlite3"))
    row = ExecutionRow(
        dedup_key=f"wf/run/act/{HIGH}",
        hook_id=None,
        hook_label=f"guard{NUL}",
        hook_version=1,
        event="pre_tool_use",
        handler_type="http",
        decision="block",
        reason=HOSTILE,
        status="completed",
        duration_ms=1.0,
        tenant_id=f"t{NUL}",
        workflow_id="wf",
        error=HOSTILE,
        metadata={"body": HOSTILE, NUL: [LOW]},
    )
    store.record_execution(row, counts_as_block=True)
    [read] = store.executions(workflow_id="wf")
    assert (read.dedup_key, read.hook_label, read.reason, read.error, read.tenant_id, read.metadata) == (
        row.dedup_key,
        row.hook_label,
        HOSTILE,
        HOSTILE,
        f"t{NUL}",
        row.metadata,
    )
    assert store.executions(hook_label=f"guard{NUL}") == [read]


async def test_a_cached_response_reads_back_exactly(backend: Backend):
    store = (
        PostgresResponseCacheStore(backend.database())
        if backend.postgres
        else SQLiteResponseCacheStore(backend.file("cache.sqlite3"))
    )
    entry = CachedResponse(HOSTILE, {"locale": f"en{NUL}", HIGH: LOW}, 1000.5, f"req{NUL}")
    await store.put("key", entry)
    assert await store.get("key") == entry


async def test_a_payload_with_nul_bytes_and_an_unencodable_request_reads_back_exactly(backend: Backend):
    store = (
        PostgresPayloadStore(backend.database())
        if backend.postgres
        else SQLitePayloadStore(backend.file("payloads.sqlite3"))
    )
    hostile = Payload(
        metadata={"encoding": b"json/plain"}, data=HOSTILE.encode("utf-8", "surrogatepass") + b"\x00" * 3000
    )
    claims = await store.store(None, [hostile])  # type: ignore[arg-type]
    fresh = (
        PostgresPayloadStore(backend.database())
        if backend.postgres
        else SQLitePayloadStore(backend.file("payloads.sqlite3"))
    )
    assert await fresh.retrieve(None, claims) == [hostile]  # type: ignore[arg-type]


def test_a_replay_report_reads_back_exactly(backend: Backend):
    store = ReplayReportStore(backend.database() if backend.postgres else backend.file("replays.sqlite3"))
    report = RequestReplay(
        request_id=HOSTILE, workflow_id=f"wf{NUL}", run_id=HIGH, tenant=LOW, started_at=STARTED, status="succeeded"
    )
    store.save_batch(f"replay{NUL}", 0, [report])
    store.save_keys(f"replay{NUL}", [[(f"wf{NUL}", HIGH)]])
    assert store.requests(f"replay{NUL}") == [report]
    assert store.keys(f"replay{NUL}", 0) == [(f"wf{NUL}", HIGH)]


ALL_MIGRATIONS = (*MEMORY_MIGRATIONS, *HOOK_MIGRATIONS, *RESPONSE_MIGRATIONS)
OLD_TEXT = f"written before: {ESCAPE} {ESCAPE}u0000 {ESCAPE}{ESCAPE}"


async def test_text_the_stores_wrote_before_they_escaped_it_reads_back_unchanged(backend: Backend):
    """The tables as an older worker left them, holding the escape character as it is: the escaping
    migration keeps every such text as it was."""
    if backend.postgres:
        database = backend.database()
        # The schema as it stood before: every migration but the escaping ones.
        await database.migrate([m for m in ALL_MIGRATIONS if not m.sql.startswith("UPDATE")])
        with psycopg.connect(backend.url or "", autocommit=True) as conn:
            old_rows(conn.execute, "%s")
        memory, hooks = MemoryStore(backend.database()), HookStore(backend.database())
        cache = PostgresResponseCacheStore(backend.database())
    else:
        from activities.memory import _SCHEMA, _SHARED_SCHEMA, _SUMMARY_SCHEMA
        from hooks.declarative.store import _SCHEMA as HOOK_SCHEMA
        from storage.responses.sqlite import _SCHEMA as RESPONSE_SCHEMA

        path = backend.file("old.sqlite3")
        with sqlite3.connect(path) as db:
            db.executescript(
                _SCHEMA
                + ";\n"
                + _SUMMARY_SCHEMA
                + ";\n"
                + _SHARED_SCHEMA
                + ";\n"
                + HOOK_SCHEMA
                + ";\n"
                + RESPONSE_SCHEMA
            )
            old_rows(db.execute, "?")
        memory, hooks, cache = MemoryStore(path), HookStore(path), SQLiteResponseCacheStore(path)

    [remembered] = await memory.recent("c1")
    assert (remembered.request, remembered.answer) == (OLD_TEXT, OLD_TEXT)
    assert [f.value for f in (await memory.user_facts("u1", limit=5)).items] == [OLD_TEXT]
    [row] = hooks.executions(workflow_id="wf")
    assert (row.reason, row.error) == (OLD_TEXT, OLD_TEXT)
    cached = await cache.get("k1")
    assert cached is not None and cached.response == OLD_TEXT
    # And written again now, it reads back the same.
    await memory.save(MemoryCandidate(conversation_id="c1", request=OLD_TEXT, answer=OLD_TEXT), request_id="r2")
    assert [(e.request, e.answer) for e in await memory.recent("c1")] == [(OLD_TEXT, OLD_TEXT)] * 2


def old_rows(execute, mark: str) -> None:
    """Rows as a worker from before the escaping wrote them (``mark``: the backend's placeholder)."""
    p = lambda n: ", ".join([mark] * n)  # noqa: E731
    execute(f"INSERT INTO conversation_memory VALUES ({p(6)})", ("c1", "r1", OLD_TEXT, OLD_TEXT, "{}", 1.0))
    execute(f"INSERT INTO user_facts VALUES ({p(5)})", ("u1", "k", OLD_TEXT, None, 1.0))
    execute(
        "INSERT INTO hook_executions (dedup_key, hook_label, hook_version, event, handler_type, workflow_id, "
        f"decision, reason, status, duration_ms, error, metadata, created_at) VALUES ({p(13)})",
        ("d1", "guard", 1, "pre_tool_use", "http", "wf", "block", OLD_TEXT, "completed", 1.0, OLD_TEXT, "{}", 1.0),
    )
    execute(
        f"INSERT INTO {'agent_' if mark == '%s' else ''}response_cache VALUES ({p(5)})",
        ("k1", OLD_TEXT, '{"locale": "en"}', 1.0, "req-1"),
    )


def test_the_escaping_migrations_are_the_only_ones_left_out_above():
    # ``test_text_the_stores_wrote_before_they_escaped_it_reads_back_unchanged`` builds the old schema
    # from every migration that creates something: the escaping ones are exactly those that update.
    escaping = [m for m in ALL_MIGRATIONS if m.sql.startswith("UPDATE")]
    assert [(m.component, m.version) for m in escaping] == [
        ("conversation_memory", 3),
        ("shared_memory", 2),
        ("declared_hooks", 2),
        ("response_cache", 2),
    ]
    with pytest.raises(UnicodeEncodeError):  # and why it matters: no backend encodes this as it is
        HOSTILE.encode("utf-8")
