"""Human-in-the-loop checkpoints: a plan with a step that needs approval waits for
a reviewer; the ``approve``/``reject`` signals and the validated ``review`` update decide it; expiry fails
closed; bad or late reviews change nothing; the reviewer's CLI inbox. All against real Temporal servers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from demo.tools import quote_price
from hooks import HookRejection, PlanStep, RequiredAfterPlanningHook, RunMode
from workflows import data_converter
from workflows import search_attributes as sa
from workflows.models import ApprovalReason, Checkpoint, ExecutionRecord, Plan, ReviewAck, ReviewRequest, ReviewSettings

from .doubles import FixedPlanner, eventually, quote
from .harness import Harness, Outcome, marker_activity_type, marker_stage_activity

ROOT = Path(__file__).resolve().parent.parent
NS = "demo-tools"
DAY = timedelta(hours=24)


# --------------------------------------------------------------------------------------------------
# Doubles and readers
# --------------------------------------------------------------------------------------------------


def message(step_id: str, to: str, text: str) -> PlanStep:
    """A demo ``send_message`` step (its tool is approval-required)."""
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="notify-service",
        capability="send_message",
        arguments={"to": to, "text": text},
    )


class CountingPlanHook:
    """An ordinary after_planning hook that counts its calls (by phase) and, optionally, marks steps for
    approval through ``step.metadata["approval_required"]``."""

    def __init__(self, name: str = "counter", mark: dict[str, Any] | None = None) -> None:
        self.name = name
        self.mark = mark or {}
        self.phases: list[int] = []

    async def after_planning(self, ctx, plan: Plan) -> Plan:
        self.phases.append(plan.phase)
        for step in plan.steps:
            if step.step_id in self.mark:
                step.metadata["approval_required"] = self.mark[step.step_id]
        return plan


class Hold:
    """Blocks its stage until released, so a test can look at (or signal) the request at that point.

    A hook that blocks runs as an activity: while a local activity runs, its workflow task is open, and
    the request answers queries and updates only when that task heartbeats (every few seconds)."""

    run_mode = RunMode.ACTIVITY
    timeout_seconds = 60.0
    max_attempts = 1

    def __init__(self, name: str) -> None:
        self.name = name
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def _hold(self) -> None:
        self.entered.set()
        await self.release.wait()


class HoldBeforePlanning(Hold):
    async def before_planning(self, ctx):
        await self._hold()


class HoldAfterExecution(Hold):
    async def after_execution(self, ctx, execution):
        await self._hold()


class TwoMessagePhases:
    """Phase 1 sends one message and asks for another phase; phase 2 sends a second one: two checkpoints."""

    name = "two-message-phases"

    async def plan(self, request) -> Plan:
        if request.phase == 1:
            return Plan(phase=1, steps=[message("first", "alice", "one")], continue_after=True)
        return Plan(phase=request.phase, steps=[message("second", "bob", "two")])


async def start(h: Harness, leftovers: list, request: str = "please do it", **kwargs) -> WorkflowHandle:
    handle = await h.start(request, **kwargs)
    leftovers.append(handle)
    return handle


async def live_record(handle: WorkflowHandle) -> ExecutionRecord:
    return await handle.query("execution_record", result_type=ExecutionRecord)


async def pending(handle: WorkflowHandle) -> Checkpoint | None:
    return await handle.query("pending_checkpoint", result_type=Checkpoint | None)


async def search_attrs(handle: WorkflowHandle) -> tuple[str | None, bool | None]:
    attrs = (await handle.describe()).typed_search_attributes
    return attrs.get(sa.LIFECYCLE_STAGE), attrs.get(sa.AWAITING_REVIEW)


async def in_review_inbox(client: Client, workflow_id: str) -> bool:
    """Whether the inbox's visibility query lists the request."""
    query = f"{sa.AWAITING_REVIEW_QUERY} AND WorkflowId = '{workflow_id}'"
    return [e.id async for e in client.list_workflows(query)] == [workflow_id]


async def stored_at(h: Harness, workflow_id: str, boundary: str) -> ExecutionRecord:
    async def check():
        record = await h.store.get(workflow_id)
        return (
            record
            if record is not None and record.lifecycle is not None and record.lifecycle.boundary.value == boundary
            else None
        )

    return await eventually(check, what=f"the stored record at {boundary}")


def events(out_or_history, event_type) -> list:
    history = out_or_history.history if isinstance(out_or_history, Outcome) else out_or_history
    return [e for e in history.events if e.event_type == event_type]


def signal_events(out: Outcome) -> list:
    return events(out, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)


def scheduled_ids(out: Outcome, activity_type: str) -> list[int]:
    """Event ids at which ``activity_type`` was scheduled, or recorded as a local activity's marker (a
    stage's ``<stage>_hook`` also where a batch ran that stage's hooks, and ``after_planning_hook`` where a
    planning activity was scheduled to run them on its plan)."""
    found = []
    for e in out.history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = e.activity_task_scheduled_event_attributes.activity_type.name
            summary = data_converter.payload_converter.from_payload(e.user_metadata.summary, str)
            if scheduled == activity_type or (
                activity_type == "after_planning_hook" and scheduled == "plan" and " with after_planning:" in summary
            ):
                found.append(e.event_id)
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = e.marker_recorded_event_attributes
            if activity_type in (marker_activity_type(marker), marker_stage_activity(marker)):
                found.append(e.event_id)
    return found


def tool_step_ids(out: Outcome) -> list[str]:
    return [a.summary.rsplit("(", 1)[1].rstrip(")") for a in out.tool_activities]


def awaiting_review_upserts(out: Outcome) -> list[bool]:
    """The AgentAwaitingReview value of every search-attribute upsert in history, in order."""
    values = []
    for e in events(out, EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES):
        fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        if sa.AWAITING_REVIEW.name in fields:
            values.append(data_converter.payload_converter.from_payload(fields[sa.AWAITING_REVIEW.name], bool))
    return values


def outbox(state_dir: Path) -> list[dict]:
    path = Path(state_dir) / "outbox.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ignored(record: ExecutionRecord) -> list[tuple[str, str, str, str]]:
    return [(i.via, i.checkpoint_id, i.reviewer, i.reason) for i in record.ignored_reviews]


async def refused_update(handle: WorkflowHandle, **request: Any) -> ApplicationError:
    with pytest.raises(WorkflowUpdateFailedError) as caught:
        await handle.execute_update("review", ReviewRequest(**request), result_type=ReviewAck)
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == "InvalidReview"
    return cause


# --------------------------------------------------------------------------------------------------
# Opening a checkpoint; approval by signal
# --------------------------------------------------------------------------------------------------


async def test_an_approval_required_tool_opens_a_checkpoint_and_approval_runs_the_plan_once(
    client, tmp_path, leftovers
):
    counter = CountingPlanHook()
    planner = FixedPlanner(quote("quote-acme", "ACME"), message("notify", "bob", "hi bob"))
    async with Harness(client, tmp_path, hooks=[counter], planner=planner) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)

        # The checkpoint: id, phase, the accepted plan, the reasons, requested-at and a 24 h expiry.
        live = await live_record(handle)
        assert checkpoint.checkpoint_id.startswith("cp-1-")
        assert checkpoint.phase == 1
        assert checkpoint.status.value == "pending" and checkpoint.reviewer is None and checkpoint.decided_at is None
        assert [s.step_id for s in checkpoint.plan.steps] == ["quote-acme", "notify"]
        assert checkpoint.plan == live.plans[0].plan
        assert checkpoint.reasons == [
            ApprovalReason(step_id="notify", tool="notify-service/send_message", reason="tool requires approval")
        ]
        assert checkpoint.requested_at >= live.started_at
        assert checkpoint.expires_at - checkpoint.requested_at == DAY
        assert live.status.value == "suspended" and live.lifecycle_stage == "awaiting_review"
        assert live.checkpoints == [checkpoint]

        # Persisted as suspended at the checkpoint.
        stored = await stored_at(h, handle.id, "checkpoint_opened")
        assert stored.status.value == "suspended"
        assert stored.request_completion == "pending"
        assert [(c.checkpoint_id, c.status.value) for c in stored.checkpoints] == [
            (checkpoint.checkpoint_id, "pending")
        ]
        assert stored.steps == []

        # Operators can find it: search attributes on the execution, and the inbox's visibility query.
        assert await search_attrs(handle) == ("awaiting_review", True)
        await eventually(lambda: in_review_inbox(client, handle.id), what="the request in the review inbox")

        # Nothing of the plan ran while it waited.
        waiting_history = await handle.fetch_history()
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in waiting_history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert "execute_tool_step" not in scheduled and "synthesize" not in scheduled
        assert outbox(tmp_path) == []

        # The exact signal a reviewer sends with the Temporal CLI.
        await handle.signal(
            "approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops-lead", "comment": "looks right"}
        )
        out = await h.finish(handle)

        assert out.failure is None
        assert out.result.response.endswith("Message sent to bob.")
        assert tool_step_ids(out) == ["quote-acme", "notify"]  # the approved plan, each step once
        assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("bob", "hi bob")]

        # after_planning ran once, before the approval; never again after it.
        approved_at_event = [e.event_id for e in signal_events(out)]
        assert len(approved_at_event) == 1
        assert len(scheduled_ids(out, "after_planning_hook")) == 1
        assert max(scheduled_ids(out, "after_planning_hook")) < approved_at_event[0]
        assert min(scheduled_ids(out, "execute_tool_step")) > approved_at_event[0]
        assert counter.phases == [1]

        record = out.record
        [decided] = record.checkpoints
        assert decided.checkpoint_id == checkpoint.checkpoint_id
        assert (decided.status.value, decided.reviewer, decided.comment) == ("approved", "ops-lead", "looks right")
        assert decided.decided_at is not None and decided.decided_at >= decided.requested_at
        assert record.ignored_reviews == []
        assert record.status.value == "succeeded"
        assert await pending(handle) is None

        stored = await h.store.get(handle.id)
        assert stored.status.value == "succeeded" and stored.request_completion == "completed"
        assert stored.lifecycle.boundary.value == "terminal"
        assert (stored.checkpoints[0].status.value, stored.checkpoints[0].reviewer) == ("approved", "ops-lead")

        assert await search_attrs(handle) == ("completed", False)
        assert awaiting_review_upserts(out)[0] is True and awaiting_review_upserts(out)[-1] is False

        async def gone() -> bool:
            return not await in_review_inbox(client, handle.id)

        await eventually(gone, what="the request to leave the review inbox")


@pytest.mark.parametrize(
    "mark, reason",
    [
        ("large order: a human must confirm", "large order: a human must confirm"),
        (True, "marked for approval by an after_planning hook"),
        (False, None),
    ],
    ids=["reason-text", "true", "false"],
)
async def test_an_after_planning_hook_can_mark_a_step_for_approval(client, tmp_path, leftovers, mark, reason):
    marker = CountingPlanHook("marker", mark={"quote-msft": mark})
    planner = FixedPlanner(quote("quote-acme", "ACME"), quote("quote-msft", "MSFT"))  # no approval-required tool
    async with Harness(client, tmp_path, hooks=[marker], planner=planner) as h:
        handle = await start(h, leftovers)
        if reason is None:
            out = await h.finish(handle)
            assert out.failure is None
            assert out.record.checkpoints == []
            assert signal_events(out) == []
            assert True not in awaiting_review_upserts(out)
            assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
            return

        checkpoint = await h.wait_for_checkpoint(handle)
        assert checkpoint.reasons == [
            ApprovalReason(step_id="quote-msft", tool="stock-service/stock_quote", reason=reason)
        ]
        assert checkpoint.plan.steps[1].metadata == {"approval_required": mark}
        assert await search_attrs(handle) == ("awaiting_review", True)
        await handle.signal("approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "risk", "comment": ""})
        out = await h.finish(handle)

    assert out.failure is None
    assert tool_step_ids(out) == ["quote-acme", "quote-msft"]
    assert marker.phases == [1]
    assert len(scheduled_ids(out, "after_planning_hook")) == 1
    assert [(c.status.value, c.reviewer) for c in out.record.checkpoints] == [("approved", "risk")]


async def test_a_required_hook_rejection_stops_before_any_checkpoint_opens(client, tmp_path, leftovers):
    class NoMessages(RequiredAfterPlanningHook):
        name = "no-messages"

        async def after_planning(self, ctx, plan):
            if any(s.capability == "send_message" for s in plan.steps):
                raise HookRejection("messages are not allowed here")
            return plan

    async with Harness(
        client, tmp_path, hooks=[NoMessages()], planner=FixedPlanner(message("notify", "bob", "hi"))
    ) as h:
        out = await h.finish(await start(h, leftovers))

    assert out.failure is not None and out.failure.type == "RequiredAfterPlanningError"
    assert out.record.checkpoints == []
    assert True not in awaiting_review_upserts(out)
    assert out.tool_activities == []
    assert outbox(tmp_path) == []


async def test_the_expiry_is_configurable(client, tmp_path, leftovers):
    review = ReviewSettings(checkpoint_expiry_seconds=90)
    async with Harness(client, tmp_path, planner=FixedPlanner(message("notify", "bob", "hi")), review=review) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        assert checkpoint.expires_at - checkpoint.requested_at == timedelta(seconds=90)
        await handle.signal("approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "comment": ""})
        out = await h.finish(handle)
    assert out.failure is None and len(outbox(tmp_path)) == 1


# --------------------------------------------------------------------------------------------------
# Rejection and expiry
# --------------------------------------------------------------------------------------------------


async def test_reject_fails_the_request_and_no_tool_of_the_plan_runs(client, tmp_path, leftovers):
    planner = FixedPlanner(quote("quote-acme", "ACME"), message("notify", "bob", "hi bob"))
    async with Harness(client, tmp_path, planner=planner) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        await handle.signal(
            "reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops-lead", "reason": "wrong recipient"}
        )
        out = await h.finish(handle)

    failure = out.failure
    assert isinstance(failure, ApplicationError)
    assert failure.type == "CheckpointRejected" and failure.non_retryable
    details = out.failure_details()
    assert details["reviewer"] == "ops-lead" and details["reason"] == "wrong recipient"
    assert details["checkpoint_id"] == checkpoint.checkpoint_id and details["phase"] == 1

    assert "execute_tool_step" not in out.activity_types()
    assert "synthesize" not in out.activity_types()
    assert outbox(tmp_path) == []
    assert out.record.steps == []
    [decided] = out.record.checkpoints
    assert (decided.status.value, decided.reviewer, decided.comment) == ("rejected", "ops-lead", "wrong recipient")
    assert decided.decided_at is not None

    stored = await out.stored()
    assert stored.status.value == "failed" and stored.request_completion == "failed"
    assert stored.error.type == "CheckpointRejected" and stored.error.details["reason"] == "wrong recipient"
    assert stored.checkpoints[0].status.value == "rejected"
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    assert await search_attrs(handle) == ("failed", False)


@pytest.mark.parametrize("expiry_seconds", [None, 5.0], ids=["default-24h", "configured-5s"])
async def test_expiry_fails_closed_and_never_approves(time_env, tmp_path, leftovers, expiry_seconds):
    review = ReviewSettings(checkpoint_expiry_seconds=expiry_seconds) if expiry_seconds else None
    expected = timedelta(seconds=expiry_seconds) if expiry_seconds else DAY
    async with Harness(
        time_env.client,
        tmp_path,
        planner=FixedPlanner(message("notify", "bob", "hi bob")),
        review=review,
        search_attributes=False,
    ) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        assert checkpoint.expires_at - checkpoint.requested_at == expected
        # A review that is not a decision (unknown checkpoint) does not hold the expiry off or approve.
        await handle.signal("approve", {"checkpoint_id": "cp-1-00000000", "reviewer": "ops", "comment": "?"})
        out = await h.finish(handle)  # the time-skipping server jumps to the expiry

    failure = out.failure
    assert isinstance(failure, ApplicationError)
    assert failure.type == "CheckpointExpired" and failure.non_retryable
    details = out.failure_details()
    assert details["checkpoint_id"] == checkpoint.checkpoint_id
    assert details["expires_at"] == checkpoint.expires_at.isoformat()
    assert details["reviewer"] is None

    assert out.tool_activities == []
    assert outbox(tmp_path) == []
    [expired] = out.record.checkpoints
    assert expired.status.value == "expired" and expired.reviewer is None
    assert expired.decided_at is not None and expired.decided_at >= expired.expires_at
    assert ignored(out.record) == [("approve", "cp-1-00000000", "ops", "unknown checkpoint 'cp-1-00000000'")]
    stored = await out.stored()
    assert stored.status.value == "failed" and stored.error.type == "CheckpointExpired"
    assert stored.checkpoints[0].status.value == "expired"


# --------------------------------------------------------------------------------------------------
# Reviews that change nothing
# --------------------------------------------------------------------------------------------------


async def test_bad_and_second_reviews_change_nothing_and_are_recorded_as_ignored(client, tmp_path, leftovers):
    hold = HoldAfterExecution("hold")
    review = ReviewSettings(reviewers=["alice", "bob"])
    async with Harness(
        client, tmp_path, hooks=[hold], planner=FixedPlanner(message("notify", "carol", "hello")), review=review
    ) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        cp = checkpoint.checkpoint_id

        await handle.signal("approve", {"checkpoint_id": "cp-9-deadbeef", "reviewer": "alice", "comment": "x"})
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "mallory", "comment": "let me"})
        await handle.signal("reject", {"checkpoint_id": cp, "reviewer": "mallory", "reason": "no"})
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "", "comment": ""})
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "   ", "comment": ""})
        await handle.signal("approve", {"reviewer": "alice"})  # decodable, but no checkpoint id
        await handle.signal("reject", {"checkpoint_id": cp})  # no reviewer
        before = [
            ("approve", "cp-9-deadbeef", "alice", "unknown checkpoint 'cp-9-deadbeef'"),
            ("approve", cp, "mallory", "reviewer 'mallory' may not review this pipeline's checkpoints"),
            ("reject", cp, "mallory", "reviewer 'mallory' may not review this pipeline's checkpoints"),
            ("approve", cp, "", "reviewer is required"),
            ("approve", cp, "   ", "reviewer is required"),
            ("approve", "", "alice", "checkpoint_id is required"),
            ("reject", cp, "", "reviewer is required"),
        ]

        async def all_ignored() -> ExecutionRecord | None:
            record = await live_record(handle)
            return record if len(record.ignored_reviews) >= len(before) else None

        record = await eventually(all_ignored, what="the bad reviews to be recorded")
        assert ignored(record) == before
        # ... and nothing changed: still pending, still suspended, nothing ran.
        assert await pending(handle) == checkpoint
        assert record.status.value == "suspended" and record.steps == []
        assert await search_attrs(handle) == ("awaiting_review", True)
        assert "execute_tool_step" not in [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in (await handle.fetch_history()).events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]

        # The decision, then a second approval and a rejection of the same checkpoint while the request
        # is still running (held in after_execution).
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice", "comment": "fine"})
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "bob", "comment": "me too"})
        await handle.signal("reject", {"checkpoint_id": cp, "reviewer": "bob", "reason": "changed my mind"})
        after = [
            ("approve", cp, "bob", f"checkpoint {cp!r} is already approved"),
            ("reject", cp, "bob", f"checkpoint {cp!r} is already approved"),
        ]

        async def second_ignored() -> ExecutionRecord | None:
            record = await live_record(handle)
            return record if len(record.ignored_reviews) >= len(before) + len(after) else None

        await eventually(second_ignored, what="the second decisions to be recorded")
        hold.release.set()
        out = await h.finish(handle)

        # A signal after the request completed fails at the client: the workflow is closed.
        with pytest.raises(RPCError) as late:
            await handle.signal("reject", {"checkpoint_id": cp, "reviewer": "alice", "reason": "too late"})
        assert late.value.status == RPCStatusCode.NOT_FOUND
        with pytest.raises(RPCError) as late_update:
            await handle.execute_update(
                "review", ReviewRequest(checkpoint_id=cp, reviewer="alice", decision="reject"), result_type=ReviewAck
            )
        assert late_update.value.status == RPCStatusCode.NOT_FOUND
        later_history = await handle.fetch_history()
        assert len(later_history.events) == len(out.history.events)  # nothing reached the closed workflow
        final = await live_record(handle)

    assert out.failure is None
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("carol", "hello")]
    assert tool_step_ids(out) == ["notify"]
    [decided] = out.record.checkpoints
    assert (decided.status.value, decided.reviewer, decided.comment) == ("approved", "alice", "fine")
    assert ignored(out.record) == before + after
    assert all(i.received_at >= checkpoint.requested_at for i in out.record.ignored_reviews)
    assert len(signal_events(out)) == len(before) + 1 + len(after)  # the late signal never reached history
    assert ignored(final) == before + after and final.checkpoints == out.record.checkpoints
    stored = await out.stored()
    assert ignored(stored) == before + after
    assert stored.checkpoints[0].reviewer == "alice"


async def test_a_signal_with_wrongly_typed_fields_is_recorded_as_ignored_not_dropped(client, tmp_path, leftovers):
    """A reviewer typing ``--input '{"checkpoint_id": "...", "reviewer": 42}'`` gets no decision, and the
    attempt is kept in the record with its reason (``ApproveSignal``: "a malformed review is recorded as
    ignored, not dropped")."""
    async with Harness(client, tmp_path, planner=FixedPlanner(message("notify", "erin", "hi"))) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        cp = checkpoint.checkpoint_id
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": 42, "comment": "ok"})
        await handle.signal("reject", {"checkpoint_id": 7, "reviewer": "alice", "reason": "no"})
        await handle.signal("approve", {"checkpoint_id": "cp-0-marker", "reviewer": "alice"})  # processed last

        async def marker_seen() -> ExecutionRecord | None:
            record = await live_record(handle)
            return record if any(i.checkpoint_id == "cp-0-marker" for i in record.ignored_reviews) else None

        record = await eventually(marker_seen, what="the signals to be processed")
        assert await pending(handle) == checkpoint  # nothing was decided
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice", "comment": "ok"})
        out = await h.finish(handle)

    assert out.failure is None
    assert [i.via for i in record.ignored_reviews] == ["approve", "reject", "approve"]
    assert all(i.reason for i in record.ignored_reviews)
    assert [(c.status.value, c.reviewer) for c in out.record.checkpoints] == [("approved", "alice")]


async def test_reviews_before_a_checkpoint_opens_are_ignored_and_the_query_is_null(client, tmp_path, leftovers):
    before_planning, after_execution = HoldBeforePlanning("hold-before"), HoldAfterExecution("hold-after")
    async with Harness(
        client,
        tmp_path,
        hooks=[before_planning, after_execution],
        planner=FixedPlanner(message("notify", "dan", "hey")),
    ) as h:
        handle = await start(h, leftovers)
        await asyncio.wait_for(before_planning.entered.wait(), 30)

        # No checkpoint yet: the query is null, a guessed id is ignored (signal) or refused (update).
        assert await pending(handle) is None
        await handle.signal("approve", {"checkpoint_id": "cp-1-guess", "reviewer": "ops", "comment": ""})
        refused = await refused_update(handle, checkpoint_id="cp-1-guess", reviewer="ops", decision="approve")
        assert refused.message == "unknown checkpoint 'cp-1-guess'"
        before_planning.release.set()

        checkpoint = await h.wait_for_checkpoint(handle)
        assert checkpoint.checkpoint_id != "cp-1-guess" and checkpoint.status.value == "pending"
        assert await pending(handle) == checkpoint
        await handle.signal("approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "comment": ""})

        # Decided: the query is null again while the request carries on.
        await asyncio.wait_for(after_execution.entered.wait(), 30)
        assert await pending(handle) is None
        assert (await live_record(handle)).checkpoints[0].status.value == "approved"
        after_execution.release.set()
        out = await h.finish(handle)
        assert await pending(handle) is None  # and after completion

    assert out.failure is None
    assert ignored(out.record) == [("approve", "cp-1-guess", "ops", "unknown checkpoint 'cp-1-guess'")]
    assert len(outbox(tmp_path)) == 1


# --------------------------------------------------------------------------------------------------
# The review update
# --------------------------------------------------------------------------------------------------


async def test_the_review_update_refuses_each_bad_case_before_it_is_accepted(client, tmp_path, leftovers):
    review = ReviewSettings(reviewers=["alice"])
    async with Harness(client, tmp_path, planner=TwoMessagePhases(), review=review) as h:
        handle = await start(h, leftovers)
        first = await h.wait_for_checkpoint(handle)
        cp1 = first.checkpoint_id

        problems = {
            "unknown": ({"checkpoint_id": "cp-1-unknown", "reviewer": "alice"}, "unknown checkpoint 'cp-1-unknown'"),
            "not allowed": (
                {"checkpoint_id": cp1, "reviewer": "mallory"},
                "reviewer 'mallory' may not review this pipeline's checkpoints",
            ),
            "empty reviewer": ({"checkpoint_id": cp1, "reviewer": ""}, "reviewer is required"),
            "blank reviewer": ({"checkpoint_id": cp1, "reviewer": "  "}, "reviewer is required"),
            "no checkpoint id": ({"checkpoint_id": "", "reviewer": "alice"}, "checkpoint_id is required"),
        }
        for name, (request, message_text) in problems.items():
            for decision in ("approve", "reject"):
                refused = await refused_update(handle, decision=decision, **request)
                assert refused.message == message_text, name
                assert refused.non_retryable
        assert await pending(handle) == first  # nothing changed

        ack = await handle.execute_update(
            "review",
            ReviewRequest(checkpoint_id=cp1, reviewer="alice", decision="approve", comment="go"),
            result_type=ReviewAck,
        )
        assert isinstance(ack, ReviewAck)
        assert (ack.checkpoint_id, ack.decision, ack.reviewer) == (cp1, "approve", "alice")
        assert ack.accepted_at >= first.requested_at

        # Already decided (the same checkpoint, again).
        refused = await refused_update(handle, checkpoint_id=cp1, reviewer="alice", decision="reject")
        assert refused.message == f"checkpoint {cp1!r} is already approved"

        second = await h.wait_for_checkpoint(handle)
        assert second.phase == 2 and second.checkpoint_id != cp1
        assert [s.step_id for s in second.plan.steps] == ["second"]
        # A stale id: the first phase's checkpoint, while the second waits.
        refused = await refused_update(handle, checkpoint_id=cp1, reviewer="alice", decision="approve")
        assert refused.message == f"checkpoint {cp1!r} is already approved"
        assert await pending(handle) == second

        ack = await handle.execute_update(
            "review",
            ReviewRequest(checkpoint_id=second.checkpoint_id, reviewer="alice", decision="reject", comment="not bob"),
            result_type=ReviewAck,
        )
        assert (ack.checkpoint_id, ack.decision, ack.reviewer) == (second.checkpoint_id, "reject", "alice")
        out = await h.finish(handle)

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    details = out.failure_details()
    assert (details["checkpoint_id"], details["reviewer"], details["reason"], details["phase"]) == (
        second.checkpoint_id,
        "alice",
        "not bob",
        2,
    )
    # Only the two valid updates are in history; refused ones never are.
    accepted = events(out, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    accepted_ids = [
        data_converter.payload_converter.from_payload(
            e.workflow_execution_update_accepted_event_attributes.accepted_request.input.args.payloads[0], ReviewRequest
        ).checkpoint_id
        for e in accepted
    ]
    assert accepted_ids == [cp1, second.checkpoint_id]
    assert len(events(out, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED)) == 2
    assert events(out, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED) == []
    assert out.record.ignored_reviews == []
    assert [(c.phase, c.status.value, c.reviewer, c.comment) for c in out.record.checkpoints] == [
        (1, "approved", "alice", "go"),
        (2, "rejected", "alice", "not bob"),
    ]
    assert tool_step_ids(out) == ["first"]  # phase 1 ran; nothing of the rejected phase 2
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("alice", "one")]
    stored = await out.stored()
    assert stored.status.value == "failed" and [s.step_id for s in stored.steps] == ["first"]


# --------------------------------------------------------------------------------------------------
# Two phases with the demo planner
# --------------------------------------------------------------------------------------------------


async def test_a_two_phase_request_opens_the_checkpoint_in_phase_two_and_sends_the_real_price(
    client, tmp_path, leftovers
):
    counter = CountingPlanHook()
    async with Harness(client, tmp_path, hooks=[counter]) as h:  # the demo RulePlanner
        handle = await start(h, leftovers, "Send a message to alice with the price of ACME")
        checkpoint = await h.wait_for_checkpoint(handle)

        assert checkpoint.phase == 2 and checkpoint.checkpoint_id.startswith("cp-2-")
        [step] = checkpoint.plan.steps
        assert step.step_id == "notify" and step.tool == "notify-service/send_message"
        assert step.implicit_deps == ["quote-acme"]
        assert step.arguments == {"to": "alice", "text": "Prices: ACME {{steps.quote-acme.output.price}} USD"}
        assert checkpoint.reasons == [
            ApprovalReason(step_id="notify", tool="notify-service/send_message", reason="tool requires approval")
        ]
        live = await live_record(handle)
        assert [(s.step_id, s.status.value) for s in live.steps] == [("quote-acme", "succeeded")]  # phase 1 ran
        assert outbox(tmp_path) == []

        await handle.signal("approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "comment": "ok"})
        out = await h.finish(handle)

    assert out.failure is None
    price = quote_price("ACME")
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("alice", f"Prices: ACME {price} USD")]
    assert str(price) in out.result.response and "Message sent to alice." in out.result.response
    assert tool_step_ids(out) == ["quote-acme", "notify"]

    [approve_event] = [e.event_id for e in signal_events(out)]
    planning = scheduled_ids(out, "after_planning_hook")
    assert len(planning) == 2 and max(planning) < approve_event  # once per phase, none after approval
    assert counter.phases == [1, 2]
    quote_event, notify_event = scheduled_ids(out, "execute_tool_step")
    assert quote_event < approve_event < notify_event
    assert [p.phase for p in out.record.plans] == [1, 2]
    assert [(c.phase, c.status.value) for c in out.record.checkpoints] == [(2, "approved")]
    assert out.record.steps[1].output == {"to": "alice", "delivered": True, "replayed": False}


# --------------------------------------------------------------------------------------------------
# The reviewer's CLI
# --------------------------------------------------------------------------------------------------


async def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    # Asynchronous: the in-process worker must keep answering the CLI's queries and updates meanwhile.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, stdout.decode(), stderr.decode()


async def test_the_reviewer_cli_lists_shows_approves_and_rejects(client, dev_env, tmp_path, leftovers):
    review = ReviewSettings(reviewers=["alice"])
    async with Harness(
        client, tmp_path, planner=FixedPlanner(message("notify", "carol", "hello carol")), review=review
    ) as h:
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
            "TEMPORAL_TASK_QUEUE": h.task_queue,
            "AGENT_STATE_DIR": str(tmp_path / "cli-state"),
        }
        to_approve, to_reject = await start(h, leftovers), await start(h, leftovers)
        cp_approve = await h.wait_for_checkpoint(to_approve)
        cp_reject = await h.wait_for_checkpoint(to_reject)
        for workflow_id in (to_approve.id, to_reject.id):
            await eventually(lambda wid=workflow_id: in_review_inbox(client, wid), what=f"{workflow_id} in the inbox")

        code, stdout, stderr = await _cli(env, "inbox")
        assert code == 0, stderr
        assert f"{to_approve.id}  checkpoint {cp_approve.checkpoint_id}  phase 1" in stdout
        assert f"{to_reject.id}  checkpoint {cp_reject.checkpoint_id}  phase 1" in stdout
        assert "notify (demo-tools/notify-service/send_message): tool requires approval" in stdout

        code, stdout, stderr = await _cli(env, "show", to_approve.id)
        assert code == 0, stderr
        assert cp_approve.checkpoint_id in stdout and to_reject.id not in stdout
        assert "notify (demo-tools/notify-service/send_message): tool requires approval" in stdout
        assert 'notify: demo-tools/notify-service/send_message {"to": "carol", "text": "hello carol"}' in stdout

        code, stdout, stderr = await _cli(env, "approve", to_approve.id, "--reviewer", "mallory")
        assert code == 1, stderr
        assert "refused: reviewer 'mallory' may not review this pipeline's checkpoints" in stderr
        assert await pending(to_approve) == cp_approve

        code, stdout, stderr = await _cli(env, "approve", to_approve.id, "--reviewer", "alice", "--comment", "fine")
        assert code == 0, stderr
        ack = json.loads(stdout)
        assert (ack["checkpoint_id"], ack["decision"], ack["reviewer"]) == (
            cp_approve.checkpoint_id,
            "approve",
            "alice",
        )

        code, stdout, stderr = await _cli(
            env, "reject", to_reject.id, "--reviewer", "alice", "--comment", "wrong person"
        )
        assert code == 0, stderr
        ack = json.loads(stdout)
        assert (ack["checkpoint_id"], ack["decision"], ack["reviewer"]) == (cp_reject.checkpoint_id, "reject", "alice")

        approved = await h.finish(to_approve)
        rejected = await h.finish(to_reject)

        code, stdout, stderr = await _cli(env, "show", to_approve.id)
        assert code == 1, stderr
        assert "has no pending checkpoint" in stdout
        code, stdout, stderr = await _cli(env, "approve", to_approve.id, "--reviewer", "alice")
        assert code == 1, stderr  # refused: nothing is waiting for a reviewer
        assert "has no pending checkpoint" in stderr

        async def both_gone() -> bool:
            return not await in_review_inbox(client, to_approve.id) and not await in_review_inbox(client, to_reject.id)

        await eventually(both_gone, what="the decided requests to leave the inbox")
        code, stdout, stderr = await _cli(env, "inbox")
        assert code == 0, stderr
        assert to_approve.id not in stdout and to_reject.id not in stdout

    assert approved.failure is None
    assert (approved.record.checkpoints[0].reviewer, approved.record.checkpoints[0].comment) == ("alice", "fine")
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("carol", "hello carol")]
    assert rejected.failure is not None and rejected.failure.type == "CheckpointRejected"
    assert rejected.failure_details()["reason"] == "wrong person"
    assert rejected.tool_activities == []
    # The CLI decided through the update; the refused attempt left no trace.
    assert len(events(approved, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)) == 1
    assert approved.record.ignored_reviews == []


async def test_a_review_through_the_client_puts_the_request_ahead_of_requests_no_one_waits_on(
    client, tmp_path, leftovers
):
    # A person is waiting on a request they decide: the client gives it Temporal's highest task priority
    # before sending the decision, so the task that answers the review (and the rest of the request) is
    # served ahead of a worker's backlog. The order of other requests is unchanged.
    from client.api import REVIEWED_PRIORITY_KEY, review

    planner = FixedPlanner(quote("quote-acme", "ACME"), message("notify", "bob", "hi bob"))
    async with Harness(client, tmp_path, planner=planner) as h:
        handle = await start(h, leftovers)
        other = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        await h.wait_for_checkpoint(other)
        ack = await review(client, handle.id, "approve", "alice", checkpoint_id=checkpoint.checkpoint_id)
        out = await h.finish(handle)
        waiting = (await other.describe()).raw_description.workflow_execution_info.priority.priority_key
        await review(client, other.id, "reject", "alice")
        rejected = await h.finish(other)

    assert (ack.checkpoint_id, ack.decision) == (checkpoint.checkpoint_id, "approve") and out.result is not None
    priority = (await handle.describe()).raw_description.workflow_execution_info.priority
    assert priority.priority_key == REVIEWED_PRIORITY_KEY
    assert waiting == 0  # not decided yet: the server's default order
    assert (await other.describe()).raw_description.workflow_execution_info.priority.priority_key == 1
    assert out.record is not None and [c.status.value for c in out.record.checkpoints] == ["approved"]
    assert rejected.failure is not None


async def test_a_review_goes_on_where_the_priority_cannot_be_raised(client, tmp_path):
    # Raising the priority is best effort: where the server cannot (a request that already ended, one that
    # never was) nothing is raised, and the review itself says what happened.
    from client.api import put_first

    async with Harness(client, tmp_path, planner=FixedPlanner(quote("quote-acme", "ACME"))) as h:
        out = await h.run("quote")
    await put_first(client, out.workflow_id)  # no error: the request ended
    await put_first(client, "request-that-never-was")
    assert out.result is not None
    # Only the priority key changes: a fairness key the request was started with stays.
    from temporalio.common import Priority

    from workflows.models import RequestInput

    fair = await client.start_workflow(
        "RequestLifecycle",
        RequestInput(request="no worker polls this queue"),
        id=f"fair-{os.getpid()}-{id(out)}",
        task_queue="nobody-polls",
        priority=Priority(fairness_key="tenant-a"),
    )
    await put_first(client, fair.id)
    priority = (await fair.describe()).raw_description.workflow_execution_info.priority
    await fair.terminate("test over")
    assert (priority.priority_key, priority.fairness_key) == (1, "tenant-a")
