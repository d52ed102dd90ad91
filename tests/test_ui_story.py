"""What an operator reads about a request without opening its record: the summary and details it was
started with (masked, bounded), the workflow's current details (what was asked, the stage, the outcome),
``AgentLifecycleStage`` at every stage, ``AgentWorkflowKind`` telling requests from their children, and
failures headed by their type, without stack traces for the expected ones. (The browser's view of the
same is tests/test_ui_browser.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import traceback
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import decode_typed_search_attributes
from temporalio.exceptions import ApplicationError

from client import Settings
from client.api import start_request
from client.devserver import temporal_cli_path
from demo.pipeline import DEMO_ALLOWED_OPERATIONS, demo_hooks
from hooks import PipelineHook, RunMode
from hooks.builtin.allowed_operations import AllowedOperationsHook
from hooks.builtin.audit import EFFECT_ID as AUDIT_EFFECT_ID
from hooks.builtin.audit import AuditHook, JsonlAuditWriter
from workflows import data_converter, detached_workflow_id
from workflows import search_attributes as sa
from workflows.converter import LifecycleFailureConverter
from workflows.listing import LIST_STAGE_SIGNAL, LISTING_HEADER, LISTING_TIMER_SUMMARY
from workflows.models import Checkpoint, RequestInput, RequestResult

from .doubles import FixedPlanner, HeldTool, eventually
from .harness import Harness, Outcome
from .test_declared_hooks import Echo, echo
from .test_declared_subagents import Delegate, delegate

SECRET = "sk-" + "x1" * 12
MESSAGE = "Send a message to alice with the price of ACME"


async def current_details(handle: WorkflowHandle) -> str:
    """What the UI shows as the workflow's current details (the SDK's built-in metadata query)."""
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


def stage_upserts(out: Outcome) -> list[dict[str, object]]:
    """Every upsert of the lifecycle's search attributes in the history, in order, as name -> value (the
    SDK's own upserts of ``TemporalChangeVersion`` left out)."""
    found = []
    for e in out.history.events:
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            if any(key.name in fields for key in sa.ALL):
                found.append({k: data_converter.payload_converter.from_payload(v) for k, v in fields.items()})
    return found


LISTING_TIMER = LISTING_TIMER_SUMMARY


def listing_timers(out: Outcome) -> tuple[int, int, int]:
    """(started, fired, cancelled) of the workflow's stage-listing timers."""
    started = {
        e.event_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and data_converter.payload_converter.from_payload(e.user_metadata.summary) == LISTING_TIMER
    }
    fired = [
        e
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
        and e.timer_fired_event_attributes.started_event_id in started
    ]
    cancelled = [
        e
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED
        and e.timer_canceled_event_attributes.started_event_id in started
    ]
    return len(started), len(fired), len(cancelled)


def listing_signals(out: Outcome) -> int:
    """How many times an activity asked the request to list its stage."""
    return listing_signals_in(out.history.events)


def listing_signals_in(events) -> int:
    return sum(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == LIST_STAGE_SIGNAL
        for e in events
    )


def failure_chain(failure: Failure) -> list[Failure]:
    chain = [failure]
    while chain[-1].HasField("cause"):
        chain.append(chain[-1].cause)
    return chain


async def test_a_request_started_by_the_client_is_summarized_masked_and_bounded(client: Client, tmp_path):
    long_tail = " and then some more words" * 40
    async with Harness(client, tmp_path) as h:
        settings = Settings(task_queue=h.task_queue, state_dir=tmp_path)
        handle = await start_request(
            client, settings, f"What is the price of ACME?\nMy key is {SECRET}{long_tail}", request_id="summary-1"
        )
        await handle.result()
        h.histories.append(await handle.fetch_history())
        description = await handle.describe()
        summary, details = await description.static_summary(), await description.static_details()

    assert summary is not None and details is not None
    assert summary.startswith("request: What is the price of ACME? My key is [REDACTED] and then")
    assert SECRET not in summary and "\n" not in summary and len(summary) <= len("request: ") + 121
    assert "**request id:** summary-1" in details and "[REDACTED]" in details and SECRET not in details
    assert len(details) < 700


async def test_a_request_started_without_a_summary_tells_its_story_in_its_current_details(client: Client, tmp_path):
    async with Harness(client, tmp_path) as h:
        handle = await h.start(f"{MESSAGE} (token {SECRET})", {"cache": "bypass"})
        checkpoint = await h.wait_for_checkpoint(handle)
        waiting = await current_details(handle)
        attributes = (await handle.describe()).typed_search_attributes
        out = await h.finish(handle, approve_as="ops")
        ended = await current_details(handle)

    assert waiting.startswith(f"**asked:** {MESSAGE} (token [REDACTED])")
    assert f"**stage:** awaiting_review — checkpoint {checkpoint.checkpoint_id}" in waiting and SECRET not in waiting
    assert attributes.get(sa.LIFECYCLE_STAGE) == "awaiting_review" and attributes.get(sa.AWAITING_REVIEW) is True
    assert attributes.get(sa.WORKFLOW_KIND) == sa.KIND_REQUEST
    assert out.result is not None
    assert "**stage:** completed" in ended
    assert "**outcome:** succeeded — answer: ACME is trading at" in ended


async def test_a_request_started_by_the_temporal_cli_has_no_summary_but_its_details_tell_the_story(
    client: Client, tmp_path
):
    async with Harness(client, tmp_path) as h:
        started = await asyncio.to_thread(
            subprocess.run,
            [
                temporal_cli_path(),
                *("workflow", "start", "--type", "RequestLifecycle", "--task-queue", h.task_queue),
                *("--workflow-id", "cli-story", "--input", f'{{"request": "What is the price of ACME? {SECRET}"}}'),
                *("--address", client.service_client.config.target_host),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert started.returncode == 0, started.stderr
        handle = client.get_workflow_handle("cli-story", result_type=RequestResult)
        await handle.result()
        h.histories.append(await handle.fetch_history())
        description = await handle.describe()
        ended = await current_details(handle)

    assert await description.static_summary() is None
    assert description.typed_search_attributes.get(sa.WORKFLOW_KIND) == sa.KIND_REQUEST
    assert ended.startswith("**asked:** What is the price of ACME? [REDACTED]\n\n**stage:** completed")
    assert "**outcome:** succeeded — answer: ACME is trading at" in ended and SECRET not in ended


async def test_the_stage_attribute_holds_the_stage_each_wait_happens_in(client: Client, tmp_path):
    # The demo pipeline: in-process hooks at before_planning, after_planning, after_execution,
    # after_synthesis and on_finish run as local activities, within the workflow task of the stage around
    # them; a listing could never show those stages, so the attribute is set where the request waits.
    async with Harness(client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path))) as h:
        out = await h.run(MESSAGE, {"cache": "bypass"}, approve_as="ops")

    assert out.result is not None
    upserts = stage_upserts(out)
    stages = [u[sa.LIFECYCLE_STAGE.name] for u in upserts]
    assert stages == [
        "planning",  # the plan activity
        "executing",  # phase 1: the quote
        "planning",  # phase 2: the message, which needs a reviewer
        "awaiting_review",
        "executing",
        "after_execution",  # the audit hook's detached child starts here
        "synthesizing",
        "completed",
    ]
    # The kind once, with the first; the review flag when the checkpoint opens and closes, and at the end.
    assert [u.get(sa.WORKFLOW_KIND.name) for u in upserts] == ["request"] + [None] * (len(upserts) - 1)
    flags = [(u[sa.LIFECYCLE_STAGE.name], u[sa.AWAITING_REVIEW.name]) for u in upserts if sa.AWAITING_REVIEW.name in u]
    assert flags == [("awaiting_review", True), ("executing", False), ("completed", False)]
    attributes = (await client.get_workflow_handle(out.workflow_id).describe()).typed_search_attributes
    assert attributes.get(sa.LIFECYCLE_STAGE) == "completed" and attributes.get(sa.AWAITING_REVIEW) is False
    # Every stage is in the record as it happens; the attribute only skips those no listing could show.
    assert out.record is not None and out.record.lifecycle_stage == "completed"


class SlowBeforePlanning(PipelineHook):
    """A before_planning hook that runs as an activity, as a remote or slow hook does."""

    name = "slow-before-planning"
    run_mode = RunMode.ACTIVITY

    async def before_planning(self, ctx) -> None:
        return None


async def test_a_hook_run_as_an_activity_is_listed_at_its_stage(client: Client, tmp_path):
    async with Harness(client, tmp_path, hooks=[SlowBeforePlanning()]) as h:
        out = await h.run(MESSAGE, {"cache": "bypass"}, approve_as="ops")

    stages = [u[sa.LIFECYCLE_STAGE.name] for u in stage_upserts(out)]
    assert stages[:2] == ["before_planning", "planning"]


async def test_without_hooks_only_the_framework_stages_are_upserted(client: Client, tmp_path):
    async with Harness(client, tmp_path) as h:
        out = await h.run(MESSAGE, {"cache": "bypass"}, approve_as="ops")

    stages = [u[sa.LIFECYCLE_STAGE.name] for u in stage_upserts(out)]
    assert stages == ["planning", "executing", "planning", "awaiting_review", "executing", "synthesizing", "completed"]
    assert out.record is not None and out.record.lifecycle_stage == "completed"


async def test_a_refused_request_names_its_failure_type_first_and_leaks_no_stack_trace(client: Client, tmp_path):
    async with Harness(client, tmp_path, hooks=[AllowedOperationsHook(DEMO_ALLOWED_OPERATIONS)]) as h:
        out = await h.run("Buy 10 ACME", {"cache": "bypass"})
        ended = await current_details(client.get_workflow_handle(out.workflow_id))

    # The client reads the typed failure with the message it was raised with.
    assert out.failure is not None and out.failure.type == "RequiredAfterPlanningError"
    assert out.failure.message.startswith("required after_planning hook 'allowed-operations' rejected the plan")
    # The history (what the UI and the CLI show): the type first, then the reason; no stack trace at all.
    failed = out.history.events[-1]
    assert failed.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
    failure = failed.workflow_execution_failed_event_attributes.failure
    assert failure.message == f"RequiredAfterPlanningError: {out.failure.message}"
    assert [f.stack_trace for f in failure_chain(failure)] == [""] * len(failure_chain(failure))
    assert '"stackTrace"' not in out.history.to_json().split("workflowExecutionFailedEventAttributes")[1]
    assert f"**outcome:** RequiredAfterPlanningError: {out.failure.message[:60]}" in ended
    assert "**stage:** failed" in ended


def test_only_expected_failures_lose_their_stack_trace_and_are_headed_by_their_type():
    converter = LifecycleFailureConverter()
    payloads = data_converter.payload_converter

    def encode(error: BaseException) -> Failure:
        try:
            raise error
        except BaseException as raised:  # noqa: BLE001 - any exception, as a workflow would raise it
            failure = Failure()
            converter.to_failure(raised, payloads, failure)
            return failure

    expected = encode(ApplicationError("plan refused", type="RequiredAfterPlanningError", non_retryable=True))
    assert (expected.message, expected.stack_trace) == ("RequiredAfterPlanningError: plan refused", "")
    decoded = converter.from_failure(expected, payloads)
    assert isinstance(decoded, ApplicationError)
    assert (decoded.type, decoded.message) == ("RequiredAfterPlanningError", "plan refused")
    # A crash, or a failure still worth retrying, keeps the stack trace an engineer needs.
    for error in (KeyError("boom"), ApplicationError("try again", type="Transient")):
        unexpected = encode(error)
        assert "test_ui_story.py" in unexpected.stack_trace, traceback.format_exc()
        assert not unexpected.message.startswith(f"{unexpected.application_failure_info.type}: ")


async def test_children_are_told_apart_from_requests_by_kind_summary_and_list_filter(client: Client, tmp_path):
    planner = FixedPlanner(delegate(), echo("e", "hi"))
    hooks = [AuditHook(JsonlAuditWriter(tmp_path / "audit.jsonl"))]
    async with Harness(client, tmp_path, tools=[Delegate(), Echo()], planner=planner, hooks=hooks) as h:
        out = await h.run(f"recurse with {SECRET}")
        subagent = client.get_workflow_handle(f"{out.workflow_id}/subagent/d", result_type=RequestResult)
        effect = client.get_workflow_handle(detached_workflow_id(out.workflow_id, AUDIT_EFFECT_ID))
        await effect.result()
        sub_history = await subagent.fetch_history()
        h.histories += [sub_history, await effect.fetch_history()]

        async def kinds() -> dict[str, str | None] | None:
            query = f"WorkflowId = '{out.workflow_id}' OR WorkflowId = '{subagent.id}' OR WorkflowId = '{effect.id}'"
            listed = {e.id: e.typed_search_attributes.get(sa.WORKFLOW_KIND) async for e in client.list_workflows(query)}
            return listed if len(listed) == 3 else None

        listed = await eventually(kinds, what="the request and two of its children listed")
        requests_only = f"{sa.REQUESTS_QUERY} AND WorkflowId STARTS_WITH '{out.workflow_id}'"
        filtered = await eventually(
            lambda: _ids(client, requests_only), what="the request alone under the requests filter"
        )
        sub_description, effect_description = await subagent.describe(), await effect.describe()

    assert out.failure is None, out.failure
    assert listed == {out.workflow_id: "request", subagent.id: "subagent", effect.id: "detached_effect"}
    assert filtered == [out.workflow_id]
    sub_summary = await sub_description.static_summary()
    assert sub_summary == "sub-agent · agents/delegate (d) · depth 1: look deeper"
    assert f"**sub-agent of:** {out.workflow_id}" in (await sub_description.static_details() or "")
    assert (
        await effect_description.static_summary()
        == "detached effect · after_execution · application-audit · audit-write"
    )
    assert f"**detached effect of:** {out.workflow_id}" in (await effect_description.static_details() or "")
    # A sub-agent starts listed as a client starts a request, with its kind: no upsert lists its kind.
    started = sub_history.events[0].workflow_execution_started_event_attributes
    at_start = decode_typed_search_attributes(started.search_attributes)
    assert at_start.get(sa.WORKFLOW_KIND) == "subagent" and at_start.get(sa.LIFECYCLE_STAGE) == "resolve_pipeline"
    assert all(
        sa.WORKFLOW_KIND.name
        not in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        for e in sub_history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    )


async def _ids(client: Client, query: str) -> list[str] | None:
    ids = [e.id async for e in client.list_workflows(query)]
    return ids or None


async def test_a_checkpoint_left_open_keeps_the_stage_until_a_decision(client: Client, tmp_path):
    # Reading a waiting request twice changes nothing: no upsert is issued while nothing moves.
    async with Harness(client, tmp_path) as h:
        handle = await h.start(MESSAGE, {"cache": "bypass"})
        checkpoint: Checkpoint = await h.wait_for_checkpoint(handle)
        before = len((await handle.fetch_history()).events)
        await asyncio.sleep(0.5)
        await current_details(handle)
        after = len((await handle.fetch_history()).events)
        await h.finish(handle, approve_as="ops")
    assert checkpoint.phase == 2 and before == after


async def test_with_a_listing_delay_a_request_lists_its_checkpoint_and_its_end_its_kind_with_the_first(
    client: Client, tmp_path
):
    # A worker's default: a stage is listed once the request has waited in it for the delay. This request,
    # started by a plain Temporal client (no listing at start), never waits that long outside its
    # checkpoint, so the stages it passes through cost no upsert — its first included, and no timer: the
    # activities it waits on keep the time — while what listings must show at once is there: the
    # checkpoint opening (with the request's kind) and closing (reviewers' inboxes), the end.
    async with Harness(client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path)), stage_listing_delay=600) as h:
        out = await h.run(MESSAGE, {"cache": "bypass"}, approve_as="ops")

    assert out.result is not None
    upserts = stage_upserts(out)
    assert [u[sa.LIFECYCLE_STAGE.name] for u in upserts] == ["awaiting_review", "executing", "completed"]
    assert upserts[0][sa.WORKFLOW_KIND.name] == "request"
    flags = [(u[sa.LIFECYCLE_STAGE.name], u[sa.AWAITING_REVIEW.name]) for u in upserts if sa.AWAITING_REVIEW.name in u]
    assert flags == [("awaiting_review", True), ("executing", False), ("completed", False)]
    assert listing_timers(out) == (0, 0, 0) and listing_signals(out) == 0
    attributes = (await client.get_workflow_handle(out.workflow_id).describe()).typed_search_attributes
    assert attributes.get(sa.LIFECYCLE_STAGE) == "completed" and attributes.get(sa.AWAITING_REVIEW) is False
    # The record and the current details still pass through every stage.
    assert out.record is not None and out.record.lifecycle_stage == "completed"


async def test_a_request_started_through_the_client_is_listed_from_its_start_without_an_upsert(
    client: Client, tmp_path
):
    # The client starts a request with its kind and first stage, so it is found from the start; its first
    # wait is then listed as any later stage is (after the delay), and the upserts left are the ones that
    # must show at once: the checkpoint opening and closing, the end.
    async with Harness(client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path)), stage_listing_delay=600) as h:
        handle = await start_request(client, Settings(task_queue=h.task_queue), MESSAGE, metadata={"cache": "bypass"})
        # Listed as a request (its kind, never upserted: see below) whatever stage a listing catches it at —
        # it reaches its checkpoint within moments, and a slow listing may first see it there.
        query = f"WorkflowId = '{handle.id}' AND {sa.REQUESTS_QUERY}"

        async def listed_at_start() -> bool:
            return bool([e.id async for e in client.list_workflows(query)])

        await eventually(listed_at_start, what="the request listed with its kind")
        out = await h.finish(handle, approve_as="ops")
    started = out.history.events[0].workflow_execution_started_event_attributes.search_attributes.indexed_fields
    at_start = {k: data_converter.payload_converter.from_payload(v) for k, v in started.items()}
    assert at_start == {sa.WORKFLOW_KIND.name: "request", sa.LIFECYCLE_STAGE.name: "resolve_pipeline"}, at_start

    assert out.result is not None
    upserts = stage_upserts(out)
    assert [u[sa.LIFECYCLE_STAGE.name] for u in upserts] == ["awaiting_review", "executing", "completed"]
    assert all(sa.WORKFLOW_KIND.name not in u for u in upserts)
    assert listing_timers(out) == (0, 0, 0) and listing_signals(out) == 0
    attributes = (await client.get_workflow_handle(out.workflow_id).describe()).typed_search_attributes
    assert attributes.get(sa.WORKFLOW_KIND) == "request" and attributes.get(sa.LIFECYCLE_STAGE) == "completed"


async def test_a_request_started_with_a_different_kind_is_listed_by_its_own(client: Client, tmp_path):
    # Attributes a request did not start with from the client (here: another kind) are not taken as its
    # listing: its first wait lists its own kind and stage at once.
    async with Harness(client, tmp_path, hooks=demo_hooks(Settings(state_dir=tmp_path)), stage_listing_delay=600) as h:
        handle = await client.start_workflow(
            "RequestLifecycle",
            RequestInput(request="What is the price of ACME?", metadata={"cache": "bypass"}),
            id=f"req-{uuid.uuid4()}",
            task_queue=h.task_queue,
            result_type=RequestResult,
            search_attributes=sa.listed_at_start(sa.KIND_CONVERSATION),
        )
        out = await h.finish(handle)

    assert out.result is not None
    upserts = stage_upserts(out)
    assert upserts[0][sa.LIFECYCLE_STAGE.name] == "planning" and upserts[0][sa.WORKFLOW_KIND.name] == "request"


async def test_with_a_listing_delay_a_wait_on_a_sub_agent_starts_the_listing_timer(client: Client, tmp_path):
    # A sub-agent is a child request, not an activity: nothing of it asks the parent to list its stage, so
    # the parent's wait on it starts the one listing timer (which never fires on a request this fast).
    planner = FixedPlanner(delegate(), echo("e", "hi"))
    async with Harness(client, tmp_path, tools=[Delegate(), Echo()], planner=planner, stage_listing_delay=600) as h:
        out = await h.run("recurse")

    assert out.failure is None, out.failure
    assert listing_timers(out) == (1, 0, 0) and listing_signals(out) == 0
    # Started in the workflow task that started the child.
    kinds = [e.event_type for e in out.history.events]
    child = kinds.index(EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
    timer = kinds.index(EventType.EVENT_TYPE_TIMER_STARTED)
    assert child < timer and EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED not in kinds[child:timer]


@pytest.mark.parametrize("sandboxed", [False, True], ids=["unsandboxed", "in-the-sandbox"])
async def test_with_a_listing_delay_a_stage_the_request_waits_in_that_long_is_listed(
    client: Client, tmp_path, sandboxed: bool
):
    # Two tool calls held by the test: the request waits in "executing" on two activities. Once the delay
    # has passed, they ask it to list its stage (one signal between them: they run in one worker). The same
    # with the workflow in Temporal's sandbox (``build_worker(sandboxed=True)``).
    tool = HeldTool()
    async with Harness(
        client,
        tmp_path,
        tools=[tool],
        planner=FixedPlanner(HeldTool.step("held-1"), HeldTool.step("held-2")),
        stage_listing_delay=0.5,
        worker_options={"sandboxed": sandboxed},
    ) as h:
        handle = await h.start("wait for the held tool", {"cache": "bypass"})
        await asyncio.wait_for(tool.started.wait(), timeout=30)

        async def listed_executing() -> bool:
            query = f"WorkflowId = '{handle.id}' AND {sa.LIFECYCLE_STAGE.name} = 'executing'"
            return bool([e.id async for e in client.list_workflows(query)])

        # The tools hold the request in "executing" until released: the listing catches up with it.
        await eventually(listed_executing, what="the request listed at executing")
        assert "executing" in await current_details(handle)
        # Both calls waited well past the delay before either was released.
        await asyncio.sleep(1.0)
        tool.release.set()
        out = await h.finish(handle)

    assert out.result is not None and [step.status for step in out.result.steps] == ["succeeded", "succeeded"]
    stages = [u[sa.LIFECYCLE_STAGE.name] for u in stage_upserts(out)]
    # Started by a plain client: its first stage ("planning") passed within the delay, so its first
    # listing is the stage it waited in, with its kind.
    assert stages[0] == "executing" and stages[-1] == "completed", stages
    assert stage_upserts(out)[0][sa.WORKFLOW_KIND.name] == "request"
    # No timer: the held calls signalled once. A stage listed between "executing" and the end was asked
    # for by a synthesis that outlasted the delay (a slow machine), each by a signal of its own.
    assert listing_timers(out) == (0, 0, 0)
    signals = listing_signals(out)
    assert signals >= 1 and len(stages) - 2 <= signals - 1, (stages, signals)
    events = list(out.history.events)
    held = {
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool_step"
    }
    released = next(
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id in held
    )
    assert listing_signals_in(events[:released]) == 1
    # What asked them: the header on each held call (the delay, and which listing it is for).
    asks = [
        data_converter.payload_converter.from_payload(
            e.activity_task_scheduled_event_attributes.header.fields[LISTING_HEADER]
        )
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool_step"
    ]
    assert asks == [{"after_seconds": 0.5, "listing": 0}] * 2, asks  # the first listing
