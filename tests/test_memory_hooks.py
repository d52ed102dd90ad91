"""The built-in memory hooks; the memory recorder bounds its own summarizer call, within an invocation
timeout that leaves room for it.

Real requests through ``RequestLifecycle`` with the embedded SQLite backend: what one request records,
the next one's planner reads under ``<agent_memory>``; the summarizer's timeout falls back to heuristic
summaries; per-user memory needs a user id; knowledge extraction finishes after the request in its own
child workflow; an unreadable database fails open.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio.api.enums.v1 import EventType, ParentClosePolicy

from activities.memory import MemoryStore
from demo.tools import quote_price
from hooks.builtin import (
    ActivityAnnouncementHook,
    ActivityCleanupHook,
    ConversationHistoryHook,
    HeuristicMemoryModel,
    KnowledgeExtractionHook,
    MemoryEnrichmentHook,
    MemoryOptions,
    MemoryRecordHook,
    build_memory_hooks,
    build_user_memory_hooks,
)
from hooks.memory import MemoryBackends
from workflows import detached_workflow_id
from workflows.models import EffectStatus, PipelineHookEffect, RequestStatus, Stage

from .doubles import CapturingPlanner
from .harness import Harness

DOMAIN = "quotes"


class StalledModel(HeuristicMemoryModel):
    """A model that never answers (to exercise the summarizer's bound); other tasks answer normally."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, prompt: str) -> str:
        if "<task>summarize_events</task>" in prompt:
            self.calls += 1
            await asyncio.Event().wait()
        return await super().complete(prompt)


def memory_hooks(memory: MemoryStore, **options) -> list:
    hooks, coordinator = build_memory_hooks(
        MemoryBackends(episodic=memory, knowledge=None, coordinator=None),
        options=MemoryOptions(agent_domain=DOMAIN, **options),
    )
    assert coordinator is None
    return hooks


async def test_what_one_request_records_reaches_the_next_planners_prompt_inside_agent_memory(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=memory_hooks(memory), planner=planner) as h:
        first = await h.run("What is the price of ACME?")
        second = await h.run("Send a message to alice with the price of ACME", approve_as="ops")

    assert first.failure is None and second.failure is None
    assert "<agent_memory>" not in planner.prompts[0]  # nothing remembered yet
    event_id = f"{first.workflow_id}:quote-acme"
    prompt = planner.prompts[1]
    memory_section = prompt.split("<agent_memory>\n", 1)[1].split("\n</agent_memory>", 1)[0]
    assert memory_section.startswith(f'Shared memory of agent domain "{DOMAIN}"')
    assert "stock-service/stock_quote succeeded [ACME]" in memory_section and "symbol=ACME" in memory_section
    # The exact text is carried once, by the enrichment effect; the hook's effects carry metadata.
    record = second.record
    assert record.effect("planning_enrichment:rag_context").data["after"] == memory_section
    read = record.effect("memory_episodic_read")
    assert read.status is EffectStatus.SUCCEEDED
    assert (read.data["status"], read.data["returned_events"], read.data["query_limit"]) == ("read_succeeded", 1, 20)
    assert read.data["event_ids"] == [event_id]
    view = record.effect("memory_planning_context").data
    assert view["agent_domain"] == DOMAIN and view["entities"] == ["ACME"] and view["section_count"] == 1
    assert view["view"]["outcome"] == "rendered" and 0 < view["view"]["bytes_used"] <= view["view"]["byte_budget"]
    window = record.effect("memory_digest_window").data
    assert (window["returned_events"], window["coverage"], window["cache_entry_found"]) == (1, "returned_window", False)
    # Phase 2 of the message request plans from the same request-start snapshot.
    assert "<agent_memory>" in planner.prompts[2]


async def test_one_event_is_recorded_per_step_with_entities_outcome_and_importance(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=memory_hooks(memory)) as h:
        out = await h.run("What are the prices of ACME and MSFT?")

    assert out.failure is None
    effect = out.record.effect("episodic_memory_records")
    assert effect.status is EffectStatus.SUCCEEDED and effect.hook == "memory-record"
    data = effect.data
    assert data["submitted_events"] == 2 and data["provider_call_status"] == "returned"
    assert data["request_entities"] == ["ACME", "MSFT"]
    assert data["summary_coverage"]["model"] == 2 and data["summary_coverage"]["fallback_cause"] is None
    assert (data["backend_assigns_event_id"], data["backend_assigns_timestamp"]) == (False, True)
    stored = await memory.recent_events(DOMAIN, entities=["MSFT"], since=datetime(2000, 1, 1, tzinfo=UTC), limit=10)
    assert stored.ok
    events = {e.step_id: e for e in stored.items}
    assert set(events) == {"quote-acme", "quote-msft"}
    for step_id, event in events.items():
        assert event.event_id == f"{out.workflow_id}:{step_id}"
        assert event.outcome == "succeeded" and event.importance == 0.5
        assert event.entities == ["ACME", "MSFT"]
        assert (
            event.summary
            == f"currency=USD, price={quote_price(event.step_id[-4:].upper())}, symbol={event.step_id[-4:].upper()}"
        )
        assert event.recorded_at >= event.occurred_at  # kept apart: when it happened, when it was stored


async def test_a_summarizer_that_overruns_its_bound_falls_back_to_heuristic_summaries(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    model = StalledModel()
    options = MemoryOptions(agent_domain=DOMAIN, summarizer_timeout_seconds=0.5)
    recorder = MemoryRecordHook(memory, model=model, options=options)
    assert recorder.timeout_seconds == 30.5  # the invocation's bound leaves room for the summarizer's
    assert MemoryOptions.from_env({"AGENT_MEMORY_SUMMARIZER_TIMEOUT_SECONDS": "7"}).summarizer_timeout_seconds == 7.0
    assert MemoryOptions().summarizer_timeout_seconds == 120.0
    async with Harness(client, tmp_path, hooks=[recorder]) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None and model.calls == 1  # one bounded call, no retry
    [invocation] = out.record.invocations(Stage.AFTER_EXECUTION)
    assert invocation.outcome.value == "succeeded"
    effect = out.record.effect("episodic_memory_records")
    coverage = effect.data["summary_coverage"]
    assert (coverage["model"], coverage["heuristic"], coverage["fallback_cause"]) == (0, 1, "timeout")
    assert effect.data["events"][0]["summary_source"] == "heuristic"
    [event] = (await memory.recent_events(DOMAIN, entities=[], since=datetime(2000, 1, 1, tzinfo=UTC), limit=5)).items
    assert event.summary.startswith("currency=USD, price=")


async def test_user_memory_does_nothing_without_a_user_id_and_recalls_facts_with_one(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=build_user_memory_hooks(memory), planner=planner) as h:
        anonymous = await h.run("My name is Zed. What is the price of ACME?")
        told = await h.run("My name is Alice and I live in Lyon. What is the price of ACME?", {"user_id": "u-1"})
        later = await h.run("What is the price of MSFT?", {"user_id": "u-1"})

    assert anonymous.failure is None
    assert anonymous.record.effects == [] and "user_profile" not in anonymous.record.enrichments
    assert all(i.outcome.value == "succeeded" for i in anonymous.record.pipeline_hooks)
    assert "<user_profile>" not in planner.prompts[0]

    extraction = told.record.effect("user_memory_extraction")
    assert extraction.status is EffectStatus.SUCCEEDED
    assert extraction.data["submitted_facts"] == [
        {"key": "name", "value": "Alice"},
        {"key": "home_city", "value": "Lyon"},
    ]
    assert told.record.model_draft.matches(told.record.final_response)  # the response is returned unchanged
    facts = (await memory.user_facts("u-1", limit=10)).items
    assert {(f.key, f.value) for f in facts} == {("name", "Alice"), ("home_city", "Lyon")}
    assert (await memory.user_facts("Zed", limit=10)).items == []

    profile = later.record.enrichments["user_profile"]
    assert profile.startswith("<user_profile>\n") and profile.endswith("\n</user_profile>")
    assert "- name: Alice" in profile and "- home_city: Lyon" in profile
    assert profile in planner.prompts[2]  # inserted verbatim, with the hook's own tags


async def test_knowledge_extraction_finishes_after_the_request_in_a_detached_child(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    hook = KnowledgeExtractionHook(memory, options=MemoryOptions(agent_domain=DOMAIN))
    async with Harness(client, tmp_path, hooks=[hook]) as h:
        out = await h.run("What is the price of ACME?")
        child = client.get_workflow_handle(
            detached_workflow_id(out.workflow_id, "knowledge_extraction"), result_type=PipelineHookEffect
        )
        effect = await child.result()
        h.histories.append(await child.fetch_history())

    assert out.failure is None
    assert out.record.model_draft.matches(out.record.final_response)  # never mutates the response
    [start] = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert start.workflow_id == f"{out.workflow_id}/effect/knowledge_extraction"
    assert start.parent_close_policy == ParentClosePolicy.PARENT_CLOSE_POLICY_ABANDON

    assert effect.status is EffectStatus.SUCCEEDED and effect.hook == "knowledge-extraction"
    [fragment] = effect.data["fragments"]
    assert fragment["text"].startswith("ACME is trading at") and fragment["entities"] == ["ACME"]
    [outcome] = effect.data["outcomes"]
    assert outcome["fragment_id"] == fragment["fragment_id"] and outcome["observed_outcome"] == "submitted"
    assert '"fragments"' in effect.data["model_response"]
    stored = [f.text for f in await memory.fragments(DOMAIN)]
    assert stored == [fragment["text"]]

    async with asyncio.timeout(60):
        while (record := await out.stored()).effect("knowledge_extraction").status is EffectStatus.PENDING:
            await asyncio.sleep(0.1)
    assert record.effect("knowledge_extraction") == effect  # same effect id: one card that changed status


async def test_an_unreadable_memory_database_fails_open(client, tmp_path):
    path = tmp_path / "memory.sqlite3"
    memory = MemoryStore(path)
    path.write_bytes(b"this is not a database" * 256)
    hooks = [
        MemoryEnrichmentHook(memory, options=MemoryOptions(agent_domain=DOMAIN), knowledge=memory),
        MemoryRecordHook(memory, model=HeuristicMemoryModel(), options=MemoryOptions(agent_domain=DOMAIN)),
    ]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None and "ACME is trading at" in out.result.response
    assert out.record.status is RequestStatus.SUCCEEDED
    assert all(i.outcome.value == "succeeded" for i in out.record.pipeline_hooks)  # reported, not raised
    read = out.record.effect("memory_episodic_read")
    assert read.status is EffectStatus.FAILED and read.data["status"] == "read_failed"
    assert "not a database" in read.error
    assert out.record.effect("memory_digest_window").data["coverage"] == "unknown"
    assert out.record.effect("memory_planning_context").data["view"]["outcome"] == "read_failed"
    assert "rag_context" not in out.record.enrichments
    written = out.record.effect("episodic_memory_records")
    assert written.status is EffectStatus.FAILED and written.data["provider_call_status"] == "error"
    assert written.data["submitted_events"] == 1


async def test_conversation_history_reads_what_the_remember_stage_saved(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")  # one store: remember writes, the hook reads
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, hooks=[ConversationHistoryHook(memory)], planner=planner, memory=memory) as h:
        await h.run("What is the price of ACME?", {"conversation_id": "chat-7"})
        out = await h.run("And MSFT?", {"conversation_id": "chat-7"})

    history = out.record.enrichments["conversation_history"]
    assert history.startswith("user: What is the price of ACME?\nassistant: ACME is trading at")
    assert f"<conversation_history>\n{history}\n</conversation_history>" in planner.prompts[1]
    assert out.record.effect("conversation_history_read").data["returned_exchanges"] == 1


def test_the_builders_order_and_gate_hooks_by_the_configured_backends(tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    hooks, coordinator = build_memory_hooks(MemoryBackends.all(memory), options=MemoryOptions(agent_domain="ops"))
    assert [type(h) for h in hooks] == [
        ActivityAnnouncementHook,
        MemoryEnrichmentHook,
        MemoryRecordHook,
        KnowledgeExtractionHook,
        ActivityCleanupHook,
    ]
    assert coordinator is memory
    assert hooks[2].timeout_seconds == 150.0  # the default 2 min summarizer bound, plus room for the write
    episodic_only, none = build_memory_hooks(MemoryBackends(episodic=memory))
    assert [h.name for h in episodic_only] == ["memory-enrichment", "memory-record"] and none is None
    assert build_memory_hooks(MemoryBackends()) == ([], None)
    assert [h.name for h in build_user_memory_hooks(memory)] == ["user-memory-enrichment", "user-memory-extraction"]
