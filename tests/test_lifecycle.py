"""The whole lifecycle through the demo pipeline, read the way an operator reads it."""

from __future__ import annotations

import json
import uuid

from temporalio.api.enums.v1 import EventType

from client.api import start_request
from client.settings import Settings
from demo.pipeline import demo_hooks
from workflows.models import RequestStatus, Stage

from .conftest import with_payload_store
from .harness import Harness


async def test_quote_request_runs_every_stage_as_labelled_activities(client, tmp_path):
    stored_client = with_payload_store(client, tmp_path)  # as a deployment's worker has by default
    async with Harness(stored_client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path))) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None
    assert "ACME is trading at" in out.result.response
    assert out.result.short_circuit is None
    assert out.activity_types() == [
        "resolve_pipeline",
        "before_planning_hook",
        "before_planning_hook",
        "plan",
        "after_planning_hook",  # run by the planning activity, which also writes the accepted plan's snapshot
        "before_tool_hook",  # the allow-list plugin, a local activity
        "execute_tool_step",
        "after_tool_hook",  # the redact plugin, a local activity
        "after_execution_hook",
        "synthesize",
        "after_synthesis_hook",
        "on_finish_hook",  # the response cache stores the answer once the run is known to be cacheable
        "persist_execution_record",
    ]
    assert out.hook_summaries() == [
        "before_planning · response-cache",
        "before_planning · knowledge-context",
        "after_planning · allowed-operations",
        "after_execution · application-audit",
        "after_synthesis · secret-redaction",
    ]
    # Hooks are scheduled only at the stages they implement: two hooks at before_planning, one after.
    assert [s for s in out.summaries if s.startswith("before_planning")] == out.hook_summaries()[:2]

    stored = await out.stored()
    assert stored is not None and stored.status is RequestStatus.SUCCEEDED
    # Two snapshots (accepted plan, terminal), plus the audit effect's update once its child reports.
    assert stored.lifecycle.snapshot_revision == 2 and stored.record_revision in (2, 3)
    assert stored.lifecycle.boundary == "terminal" and stored.request_completion == "completed"
    assert [i.hook for i in stored.invocations(Stage.AFTER_SYNTHESIS)] == ["secret-redaction"]
    assert stored.cache.cacheable and stored.effect("response_cache_write").data["stored"] is True
    # The model's draft is kept apart from the final response, and only by digest and a masked preview:
    # the knowledge file's key, which the draft quoted, is in neither the draft's preview nor the answer.
    assert stored.model_draft.chars > len("sk-demo-") and not stored.model_draft.matches(stored.final_response)
    assert "sk-demo-" not in stored.model_draft.preview
    assert "sk-demo-" not in stored.final_response and "[REDACTED]" in stored.final_response
    assert stored.final_response == out.result.response


async def test_trade_is_refused_before_any_tool_runs(client, tmp_path):
    async with Harness(client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path))) as h:
        out = await h.run("Buy 10 ACME")

    assert out.failure is not None and out.failure.type == "RequiredAfterPlanningError"
    assert out.failure.non_retryable
    details = out.failure_details()
    assert details["hook"] == "allowed-operations"
    assert "execute_trade" in details["cause"]
    assert out.tool_activities == []
    assert "synthesize" not in out.activity_types()
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED
    assert stored.steps == [] and stored.plans == []
    invocation = stored.invocations(Stage.AFTER_PLANNING)[0]
    assert (invocation.decision.failure_policy, invocation.decision.action, invocation.decision.reason) == (
        "fail_closed",
        "terminate",
        "hook_error",
    )
    assert stored.error.type == "RequiredAfterPlanningError"


async def test_malformed_input_fails_with_a_typed_error(client, tmp_path):
    async with Harness(client, tmp_path) as h:
        empty = await h.run({"request": "   "})
        unknown_field = await h.run({"request": "hi", "colour": "blue"})
        too_long = await h.run({"request": "x" * 9000})

    for out in (empty, unknown_field, too_long):
        assert out.failure is not None and out.failure.type == "InvalidRequest"
        assert out.failure.non_retryable
        assert out.scheduled == []
    assert "non-whitespace" in empty.failure.message
    assert "colour" in unknown_field.failure.message
    for out in (empty, unknown_field, too_long):
        # Nothing ran and nothing was stored; the record, by query, says why the request was refused.
        assert await out.stored() is None
        assert out.record.status is RequestStatus.FAILED and out.record.error.type == "InvalidRequest"


async def test_a_new_execution_records_no_patch_and_its_stage_once_per_wait(client, tmp_path):
    """What a new request costs the server besides its work: no patch marker (this release is the
    baseline: nothing older to replay), and one stage upsert wherever it waits."""
    async with Harness(client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path))) as h:
        out = await h.run("What is the price of ACME?", metadata={"cache": "bypass"})

    assert out.failure is None
    events = out.history.events
    assert patch_markers(events) == [] and change_version_upserts(events) == 0
    upserted = [
        fields
        for e in events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
        for fields in [e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields]
    ]
    stages = [fields["AgentLifecycleStage"].data.decode() for fields in upserted if "AgentLifecycleStage" in fields]
    # Where it waits: the plan, the audit hook's detached child, then synthesis; and the end.
    assert stages == ['"planning"', '"executing"', '"after_execution"', '"synthesizing"', '"completed"'], stages


def patch_markers(events) -> list[str]:
    """The patches a history recorded, by name."""
    return [
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)["id"]
        for e in events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]


def change_version_upserts(events) -> int:
    return sum(
        1
        for e in events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
        and "TemporalChangeVersion"
        in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    )


async def test_a_request_costs_the_same_however_it_is_started(client, tmp_path):
    """Started through the client or by a plain Temporal client with nothing but its input: the same
    events, no patch marker either way; both histories replay."""
    async with Harness(client, tmp_path) as h:
        settings = Settings(task_queue=h.task_queue, state_dir=tmp_path)
        through_client = await start_request(
            client, settings, "What is the price of ACME?", metadata={"cache": "bypass"}
        )
        plain = await client.start_workflow(
            "RequestLifecycle",
            {"request": "What is the price of ACME?", "metadata": {"cache": "bypass"}},
            id=f"plain-{uuid.uuid4()}",
            task_queue=h.task_queue,
        )
        histories = []
        for handle in (through_client, plain):
            await handle.result()
            histories.append(await handle.fetch_history())
        h.histories.extend(histories)  # replayed when the harness closes

    def events(history) -> list[str]:
        return [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events]

    for history in histories:
        assert patch_markers(history.events) == [] and change_version_upserts(history.events) == 0
    assert events(histories[0]) == events(histories[1])
