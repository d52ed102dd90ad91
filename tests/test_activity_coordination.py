"""Managed activity coordination: the announcement hands its signal to the request owner.

A request quicker than the signal's renew interval never renews it: one timer, and the release on exit.
One that runs longer hands the signal to a ``LeaseKeeper`` child workflow (timers and one short
``renew_lease`` activity per renewal, no worker slot held in between) and, on every exit, stops that
keeper and waits for its result before it releases the signal. The history shows the order (the keeper
has ended before ``release_lease`` is scheduled); the record shows both effects terminal with their
counts before the terminal persist; the SQLite registry shows the signal gone. A request waiting at a
checkpoint adds a bounded handful of events for its lease, however long it waits.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.exceptions import CancelledError
from temporalio.testing import WorkflowEnvironment

from activities.memory import MemoryStore
from hooks import HookRejection, PipelineHook, PipelineShortCircuit, RequiredAfterPlanningHook, ToolDecision
from hooks.builtin import ActivityAnnouncementHook, ActivityCleanupHook, activity_signal_id
from hooks.memory import ActivitySignal, ReadResult, WriteResult
from workflows import data_converter
from workflows.models import (
    Checkpoint,
    EffectStatus,
    ExecutionRecord,
    LeaseCall,
    LeaseKeeperInput,
    LeaseKeeperReport,
    ManagedLease,
    PlanStep,
    RequestStatus,
    ReviewSettings,
    Stage,
    StageSettings,
)

from .doubles import BlockingTool, CapturingPlanner, FixedPlanner, HeldTool, eventually, quote
from .harness import Harness, Outcome
from .test_checkpoints import scheduled_ids

QUOTE = "What is the price of ACME?"
RENEWAL, CLEANUP = "activity_signal_renewal", "activity_signal_cleanup"


def coordination_hooks(memory: Any, agent: str = "quote-agent", **options: Any) -> list:
    return [ActivityAnnouncementHook(memory, agent=agent, **options), ActivityCleanupHook(memory, agent=agent)]


def lease_order(out: Outcome) -> list[str]:
    return [t for t in out.activity_types() if t in ("keep_lease", "release_lease")]


def keeper_children(out: Outcome) -> list[int]:
    """Event ids at which the request started a LeaseKeeper child."""
    return [
        e.event_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        and e.start_child_workflow_execution_initiated_event_attributes.workflow_type.name == "LeaseKeeper"
    ]


def keeper_closed_before_release(out: Outcome) -> bool:
    """Whether every LeaseKeeper child had completed before release_lease was scheduled: cleanup never
    races a renewal."""
    release_at = next(
        e.event_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "release_lease"
    )
    started = set(keeper_children(out))
    closed = [
        e.event_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED
        and e.child_workflow_execution_completed_event_attributes.initiated_event_id in started
    ]
    return len(closed) == len(started) and all(c < release_at for c in closed)


def assert_released_after_join(out: Outcome, record: ExecutionRecord, exit: str, keepers: int = 0) -> None:
    """The keeper children (none for a request quicker than the renew interval), stopped before the one
    release; both effects terminal with counts, in the record. No keep_lease activity ever runs."""
    assert lease_order(out) == ["release_lease"]
    assert len(keeper_children(out)) == keepers
    assert keeper_closed_before_release(out)
    types = out.activity_types()
    assert types.index("release_lease") < len(types) - 1 and types[-1] == "persist_execution_record"
    renewal, cleanup = record.effect(RENEWAL), record.effect(CLEANUP)
    assert renewal.status is EffectStatus.SUCCEEDED, renewal
    assert renewal.data["loop"] == "joined" and renewal.data["exit"] == exit
    assert renewal.data["keepers"] == keepers and renewal.data["errors"] == 0
    assert cleanup.status is EffectStatus.SUCCEEDED, cleanup
    assert cleanup.data["renewal_joined_first"] is True and cleanup.data["exit"] == exit
    assert (cleanup.data["submitted"], cleanup.data["errors"], cleanup.data["provider_call_status"]) == (
        1,
        0,
        "returned",
    )
    assert cleanup.data["observed"]["removed"] is True
    assert cleanup.hook == "activity-announcement"  # completed by the owner, not by activity-cleanup


async def test_a_managed_request_announces_renews_nothing_quick_and_cleans_up_on_success(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(
        client, tmp_path, hooks=coordination_hooks(memory), planner=FixedPlanner(quote("q", "ACME"))
    ) as h:
        out = await h.run(QUOTE)

    assert out.failure is None
    signal_id = activity_signal_id("quote-agent", out.record.request_id)
    announced = out.record.effect("activity_signal")
    assert announced.status is EffectStatus.SUCCEEDED
    assert announced.data["signal_id"] == signal_id and announced.data["entities"] == ["ACME"]
    # The cleanup hook ran (after synthesis) but is a pass-through: the owner reports the cleanup.
    assert [i.hook for i in out.record.pipeline_hooks][-1] == "activity-cleanup"
    assert "release_lease" in out.activity_types()
    assert out.activity_types().index("release_lease") > out.activity_types().index("after_synthesis_hook")
    stored = await out.stored()
    assert_released_after_join(out, stored, "completed")
    assert await memory.signal(signal_id) is None


class FailingPlanner:
    name = "failing-planner"

    async def plan(self, request):
        raise RuntimeError("planner is down")


class RejectEverything(RequiredAfterPlanningHook, PipelineHook):
    name = "reject-everything"

    def after_planning(self, ctx, plan):
        raise HookRejection("not today")


class AnswerFromCache(PipelineHook):
    name = "answer-from-cache"

    def before_planning(self, ctx):
        return PipelineShortCircuit(response="cached", source="test")


class StopAtTool(PipelineHook):
    name = "stop-at-tool"

    def before_tool(self, ctx, call):
        return ToolDecision.stop("stopped before the tool", reason="test")


def message(step_id: str = "notify") -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace="demo-tools",
        agent="notify-service",
        capability="send_message",
        arguments={"to": "bob", "text": "hi"},
    )


EXITS = {
    # name: (extra hooks after coordination, planner, expected exit, expected failure type, status)
    "short_circuit": ([AnswerFromCache()], None, "completed", None, RequestStatus.SUCCEEDED),
    "failure": ([], FailingPlanner(), "error", "PlanningFailed", RequestStatus.FAILED),
    "required_rejection": ([RejectEverything()], None, "error", "RequiredAfterPlanningError", RequestStatus.FAILED),
    "stop": ([StopAtTool()], None, "stopped", None, RequestStatus.STOPPED),
}


@pytest.mark.parametrize("exit_path", list(EXITS))
async def test_cleanup_runs_on_every_exit_after_the_renewal_loop_is_joined(client, tmp_path, exit_path):
    extra, planner, exit, failure_type, status = EXITS[exit_path]
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    hooks = [coordination_hooks(memory)[0], *extra, coordination_hooks(memory)[1]]
    async with Harness(client, tmp_path, hooks=hooks, planner=planner or FixedPlanner(quote("q", "ACME"))) as h:
        out = await h.run(QUOTE)

    if failure_type:
        assert out.failure is not None and out.failure.type == failure_type
    else:
        assert out.failure is None
    stored = await out.stored()
    assert stored.status is status
    assert_released_after_join(out, stored, exit)
    assert await memory.signal(activity_signal_id("quote-agent", stored.request_id)) is None


async def test_cleanup_runs_when_a_checkpoint_is_rejected(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=coordination_hooks(memory), planner=FixedPlanner(message())) as h:
        handle = await h.start("Send a message to bob")
        checkpoint = await h.wait_for_checkpoint(handle)
        # While it waits, the signal is announced and visible to other agents.
        [live] = (await memory.active()).items
        assert live.agent == "quote-agent"
        await handle.signal("reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "reason": "no"})
        out = await h.finish(handle)

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    # The checkpoint handed the lease to its keeper as it opened.
    assert_released_after_join(out, await out.stored(), "error", keepers=1)
    assert (await memory.active()).items == []


async def test_cleanup_runs_when_the_request_is_cancelled(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    tool = BlockingTool()
    planner = FixedPlanner(
        PlanStep(step_id="wait", namespace="test-tools", agent="slow-service", capability="wait_forever")
    )
    async with Harness(client, tmp_path, hooks=coordination_hooks(memory), tools=[tool], planner=planner) as h:
        handle = await h.start("wait for ACME")
        await asyncio.wait_for(tool.started.wait(), timeout=30)
        assert len((await memory.active()).items) == 1
        await handle.cancel()
        out = await h.finish(handle)

    assert isinstance(out.failure, CancelledError)
    stored = await out.stored()
    assert stored.status is RequestStatus.CANCELLED
    assert_released_after_join(out, stored, "cancelled")
    assert (await memory.active()).items == []


class RecordingCoordinator:
    """The real SQLite registry, remembering what each renewal reported (the expiry it set)."""

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.renewals: list[WriteResult] = []
        self.ttls: list[float] = []

    async def announce(self, signal: ActivitySignal, *, ttl_seconds: float) -> WriteResult:
        return await self.memory.announce(signal, ttl_seconds=ttl_seconds)

    async def renew(self, signal_id: str, *, ttl_seconds: float) -> WriteResult:
        result = await self.memory.renew(signal_id, ttl_seconds=ttl_seconds)
        self.renewals.append(result)
        self.ttls.append(ttl_seconds)
        return result

    async def remove(self, signal_id: str) -> WriteResult:
        return await self.memory.remove(signal_id)

    async def active(self) -> ReadResult[ActivitySignal]:
        return await self.memory.active()


DAY = 24 * 3600.0
WINDOW = timedelta(minutes=3)
DECISIONS = ("approve", "reject")


def _summary(event) -> str:
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return ""
    return data_converter.payload_converter.from_payload(event.user_metadata.summary, str)


def wait_events(out: Outcome) -> list:
    """The events the request's history gained while it waited at its checkpoint: after the checkpoint's
    expiry timer started (the last command of its opening), before what ended the wait — a reviewer's
    decision, the timer firing, or a cancellation."""
    events = list(out.history.events)
    start = next(
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and _summary(e).startswith("awaiting review")
    )
    timer = events[start].event_id

    def ends(e) -> bool:
        return (
            (
                e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                and e.workflow_execution_signaled_event_attributes.signal_name in DECISIONS
            )
            or (
                e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
                and e.timer_fired_event_attributes.started_event_id == timer
            )
            or e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
        )

    end = next(i for i in range(start + 1, len(events)) if ends(events[i]))
    return events[start + 1 : end]


async def settled_at_checkpoint(handle) -> Checkpoint:
    """The request's open checkpoint, read once the request is idle at it (its expiry timer started, its
    lease keeper's start handled, no workflow task in flight). Waiting by history, not by polling a query:
    the time-skipping server answers a query that arrives during a workflow task with a workflow task of
    its own, recorded in the history, which a wait's count would wrongly charge to the request."""

    async def idle() -> bool:
        events = list((await handle.fetch_history()).events)
        opened = [
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and _summary(e).startswith("awaiting review")
        ]
        return bool(
            opened
            and any(e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED for e in events[opened[0] :])
            and events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        )

    await eventually(idle, what="the request idle at its checkpoint")
    checkpoint = await handle.query("pending_checkpoint", result_type=Checkpoint | None)
    assert checkpoint is not None
    return checkpoint


def most_in_window(events: list) -> int:
    """The most of ``events`` that fall in any 3 minutes (by event time)."""
    times = sorted(e.event_time.ToDatetime() for e in events)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= WINDOW:
            first += 1
        most = max(most, last - first + 1)
    return most


def redispatched(events: list) -> set[int]:
    """The events of workflow tasks the server dispatched again (a task that timed out or failed on a
    loaded machine, and its scheduling and start): the server's retries, not the request's doing."""
    lost = {
        e.workflow_task_timed_out_event_attributes.scheduled_event_id
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
        else e.workflow_task_failed_event_attributes.scheduled_event_id
        for e in events
        if e.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    }
    return {
        e.event_id
        for e in events
        if e.event_id in lost
        or (
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
            and e.workflow_task_started_event_attributes.scheduled_event_id in lost
        )
        or e.event_type in (EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED)
    }


def assert_flat(waited: list) -> None:
    """Nothing the request did itself while it waited: no activity, no local activity's marker, no timer
    of its own fired — at most the keeper's start reaching it (a workflow task the server had to dispatch
    again is the server's, and not counted)."""
    names = ", ".join(f"{e.event_id} {EventType.Name(e.event_type).removeprefix('EVENT_TYPE_')}" for e in waited)
    waited = [e for e in waited if e.event_id not in redispatched(waited)]
    assert len(waited) <= 5, names
    assert most_in_window(waited) <= 5, names
    assert not {
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_MARKER_RECORDED,
        EventType.EVENT_TYPE_TIMER_FIRED,
        EventType.EVENT_TYPE_TIMER_STARTED,
    } & {e.event_type for e in waited}, names


async def skip(env: WorkflowEnvironment, seconds: float, step: float = 60.0) -> None:
    """Let ``seconds`` of time pass on the time-skipping server, in steps (one long sleep is one call,
    which would time out while the worker renews)."""
    while seconds > 0:
        await env.sleep(min(step, seconds))
        seconds -= step


async def keeper_history(client: Client, out: Outcome) -> WorkflowHistory:
    """The history of the request's one lease keeper (its latest run)."""
    [keeper_id] = {
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    }
    return await client.get_workflow_handle(keeper_id).fetch_history()


def renewals_in(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def test_a_day_at_a_checkpoint_adds_a_handful_of_events_while_the_keeper_renews_the_lease(time_env, tmp_path):
    """A request that waits a day for its reviewer keeps its lease alive the whole day (every renewal
    reaches the registry) while its own history stays flat: the lease went to its keeper as the
    checkpoint opened, so the day adds the keeper's start reaching the request and nothing else."""
    coordinator = RecordingCoordinator(MemoryStore(tmp_path / "memory.sqlite3"))
    hooks = coordination_hooks(coordinator, ttl_seconds=1800.0, renew_interval_seconds=600.0)
    async with Harness(
        time_env.client,
        tmp_path,
        hooks=hooks,
        planner=FixedPlanner(message()),
        review=ReviewSettings(checkpoint_expiry_seconds=2 * DAY),
        search_attributes=False,
    ) as h:
        handle = await h.start("Send a message to bob")
        checkpoint = await settled_at_checkpoint(handle)
        await skip(time_env, DAY, step=3600.0)
        renewed = len(coordinator.renewals)
        assert len((await coordinator.active()).items) == 1  # still announced after a day
        await handle.signal("reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "reason": "late"})
        out = await h.finish(handle)
        keeper = await keeper_history(time_env.client, out)
        h.histories.append(keeper)

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    waited = wait_events(out)
    assert len(waited) <= 50
    assert_flat(waited)
    # Renewed every 10 minutes all day, each before the TTL ran out, none by the request itself.
    assert renewed >= DAY // 600 - 1
    assert all(r.ok and r.detail["found"] for r in coordinator.renewals)
    expiries = [r.detail["expires_at"] for r in coordinator.renewals]
    assert expiries == sorted(expiries)
    assert scheduled_ids(out, "renew_lease") == []
    assert renewals_in(keeper) == ["renew_lease"] * len(coordinator.renewals)
    stored = await out.stored()
    assert_released_after_join(out, stored, "error", keepers=1)
    assert stored.effect(RENEWAL).data["submitted"] == stored.effect(RENEWAL).data["returned"] == renewed
    assert (await coordinator.active()).items == []


WAIT_EXITS = {
    # how the wait ends: (failure type, exit, status)
    "approve": (None, "completed", RequestStatus.SUCCEEDED),
    "reject": ("CheckpointRejected", "error", RequestStatus.FAILED),
    "expiry": ("CheckpointExpired", "error", RequestStatus.FAILED),
    "cancel": ("Cancelled", "cancelled", RequestStatus.CANCELLED),
}


@pytest.mark.parametrize("ended_by", list(WAIT_EXITS))
async def test_a_lease_renewed_every_second_is_kept_through_a_wait_and_released_once_however_it_ends(
    time_env, tmp_path, ended_by
):
    """A lease renewed every second, through a minute at a checkpoint: the registry sees a renewal every
    second of the wait, the request's history gains at most the keeper's start, and however the wait
    ends — approval, rejection, expiry, cancellation — the keeper is stopped and joined before the one
    release."""
    failure_type, exit, status = WAIT_EXITS[ended_by]
    coordinator = RecordingCoordinator(MemoryStore(tmp_path / "memory.sqlite3"))
    hooks = coordination_hooks(coordinator, ttl_seconds=3.0, renew_interval_seconds=1.0)
    expiry = 60.0 if ended_by == "expiry" else DAY
    async with Harness(
        time_env.client,
        tmp_path,
        hooks=hooks,
        planner=FixedPlanner(message()),
        review=ReviewSettings(checkpoint_expiry_seconds=expiry),
        search_attributes=False,
    ) as h:
        handle = await h.start("Send a message to bob")
        checkpoint = await settled_at_checkpoint(handle)
        before = len(coordinator.renewals)
        if ended_by == "expiry":
            out = await h.finish(handle)  # the server skips to the expiry
        else:
            await skip(time_env, 60.0, step=20.0)
            cp = checkpoint.checkpoint_id
            if ended_by == "approve":
                await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "ops", "comment": "ok"})
            elif ended_by == "reject":
                await handle.signal("reject", {"checkpoint_id": cp, "reviewer": "ops", "reason": "no"})
            else:
                await handle.cancel()
            out = await h.finish(handle)
        keeper = await keeper_history(time_env.client, out)
        h.histories.append(keeper)

    if failure_type is None:
        assert out.failure is None, out.failure
        assert "execute_tool_step" in out.activity_types()
    elif failure_type == "Cancelled":
        assert isinstance(out.failure, CancelledError)
    else:
        assert out.failure is not None and out.failure.type == failure_type
    assert_flat(wait_events(out))
    assert len(coordinator.renewals) - before >= 55  # a minute of waiting, renewed every second
    assert all(r.ok and r.detail["found"] for r in coordinator.renewals)
    assert renewals_in(keeper) == ["renew_lease"] * len(renewals_in(keeper))
    assert len(renewals_in(keeper)) + len(scheduled_ids(out, "renew_lease")) == len(coordinator.renewals)
    stored = await out.stored()
    assert stored.status is status
    assert_released_after_join(out, stored, exit, keepers=1)
    assert stored.effect(RENEWAL).data["returned"] == len(coordinator.renewals)
    assert (await coordinator.active()).items == []


async def test_a_keeper_that_ends_before_it_is_stopped_is_noticed_and_replaced(client, tmp_path):
    """A keeper terminated while the request waits: the request notices as it ends, counts it as an
    error of the renewal, and a new keeper renews at once; the lease is still released once, after the
    new keeper is joined. (On the dev server: the time-skipping server does not tell a parent that its
    child was terminated.)"""
    coordinator = RecordingCoordinator(MemoryStore(tmp_path / "memory.sqlite3"))
    hooks = coordination_hooks(coordinator, ttl_seconds=1.5, renew_interval_seconds=0.5)
    async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(message())) as h:
        handle = await h.start("Send a message to bob")
        checkpoint = await h.wait_for_checkpoint(handle)

        async def keeper_started() -> str | None:
            for e in (await handle.fetch_history()).events:
                if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                    return e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
            return None

        keeper_id = await eventually(keeper_started, what="the keeper's start")
        await eventually(lambda: _async(len(coordinator.renewals) >= 2), what="renewals by the first keeper")
        await client.get_workflow_handle(keeper_id).terminate("an operator's mistake")
        lost_at = len(coordinator.renewals)
        await eventually(lambda: _async(len(coordinator.renewals) >= lost_at + 3), what="renewals by a new keeper")
        renewed_after = len(coordinator.renewals) - lost_at
        await handle.signal("reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "reason": "no"})
        out = await h.finish(handle)
        h.histories.append(await keeper_history(client, out))

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    assert renewed_after >= 3  # the new keeper renewed on
    started = keeper_children(out)
    assert len(started) == 2
    closed = {
        e.event_type: e.event_id
        for e in out.history.events
        if e.event_type
        in (
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED,
        )
    }
    release_at = scheduled_ids(out, "release_lease")
    assert len(release_at) == 1
    assert closed[EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED] < started[1]
    assert started[1] < closed[EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED] < release_at[0]
    stored = await out.stored()
    renewal = stored.effect(RENEWAL)
    assert renewal.status is EffectStatus.FAILED  # a keeper was lost: the renewal effect says so
    assert renewal.data["keepers"] == 2 and renewal.data["errors"] == 1
    assert "ended before it was stopped" in renewal.data["last_error"]
    assert stored.effect(CLEANUP).status is EffectStatus.SUCCEEDED
    assert (await coordinator.active()).items == []


async def test_a_request_working_past_its_renewal_bound_hands_the_lease_to_a_keeper(client, tmp_path):
    """Without a wait, a request that works on for ``lease_renewals_in_request`` renewals (two here) hands
    the lease to a keeper all the same, so a long tool step cannot grow its history without bound."""
    coordinator = RecordingCoordinator(MemoryStore(tmp_path / "memory.sqlite3"))
    hooks = coordination_hooks(coordinator, ttl_seconds=1.5, renew_interval_seconds=0.5)
    tool = HeldTool()
    async with Harness(
        client,
        tmp_path,
        hooks=hooks,
        tools=[tool],
        planner=FixedPlanner(HeldTool.step()),
        settings=StageSettings(lease_renewals_in_request=2),
    ) as h:
        handle = await h.start("hold on")
        await asyncio.wait_for(tool.started.wait(), timeout=30)
        await eventually(lambda: _async(len(coordinator.renewals) >= 5), what="renewals by the keeper")
        tool.release.set()
        out = await h.finish(handle)
        h.histories.append(await keeper_history(client, out))

    assert out.failure is None, out.failure
    assert len(scheduled_ids(out, "renew_lease")) == 2
    stored = await out.stored()
    assert_released_after_join(out, stored, "completed", keepers=1)
    assert stored.effect(RENEWAL).data["returned"] == len(coordinator.renewals)


async def test_a_request_longer_than_the_renew_interval_renews_its_lease_itself(client, tmp_path):
    """Renewals of a request that runs a few intervals are its own local activities, each after a durable
    timer: no keeper child, no activity task, no worker slot held between them."""
    coordinator = RecordingCoordinator(MemoryStore(tmp_path / "memory.sqlite3"))
    hooks = coordination_hooks(coordinator, ttl_seconds=1.5, renew_interval_seconds=0.5)
    tool = HeldTool()
    async with Harness(client, tmp_path, hooks=hooks, tools=[tool], planner=FixedPlanner(HeldTool.step())) as h:
        handle = await h.start("hold on")
        await asyncio.wait_for(tool.started.wait(), timeout=30)
        await asyncio.sleep(3.0)  # renewals fall due while the tool holds the request
        tool.release.set()
        out = await h.finish(handle)

    assert out.failure is None, out.failure
    assert len(coordinator.renewals) >= 2 and all(r.ok for r in coordinator.renewals)
    assert keeper_children(out) == []
    renewals = scheduled_ids(out, "renew_lease")
    assert len(renewals) == len(coordinator.renewals)
    assert all(a.local for a in out.scheduled if a.activity_type == "renew_lease")
    stored = await out.stored()
    assert_released_after_join(out, stored, "completed")
    assert stored.effect(RENEWAL).data["returned"] == len(renewals)


async def test_direct_cleanup_hook_removes_the_signal_itself_when_no_owner_holds_it(client, tmp_path):
    memory = MemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(
        client, tmp_path, hooks=coordination_hooks(memory, managed=False), planner=FixedPlanner(quote("q", "ACME"))
    ) as h:
        out = await h.run(QUOTE)

    assert out.failure is None
    assert lease_order(out) == []  # no owner: nothing renews or releases
    stored = await out.stored()
    assert stored.effect(RENEWAL) is None
    cleanup = stored.effect(CLEANUP)
    assert cleanup.status is EffectStatus.SUCCEEDED and cleanup.hook == "activity-cleanup"
    assert cleanup.data["mode"] == "direct" and cleanup.data["removed"] is True
    assert await memory.signal(activity_signal_id("quote-agent", stored.request_id)) is None


class SeeEachOther:
    """The real registry, whose ``active()`` waits until both agents have announced (so neither request
    reads before the other has written), and whose ``remove()`` waits until both have read (so the quicker
    request cannot withdraw its signal before the slower one has seen it)."""

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.readers = 0
        self.both_read = asyncio.Event()

    async def announce(self, signal, *, ttl_seconds):
        return await self.memory.announce(signal, ttl_seconds=ttl_seconds)

    async def renew(self, signal_id, *, ttl_seconds):
        return await self.memory.renew(signal_id, ttl_seconds=ttl_seconds)

    async def remove(self, signal_id):
        async with asyncio.timeout(30):
            await self.both_read.wait()
        return await self.memory.remove(signal_id)

    async def active(self):
        async with asyncio.timeout(30):
            while len((read := await self.memory.active()).items) < 2:
                await asyncio.sleep(0.05)
        self.readers += 1
        if self.readers == 2:
            self.both_read.set()
        return read


async def test_two_concurrent_requests_of_different_agents_see_each_others_activity(client, tmp_path):
    coordinator = SeeEachOther(MemoryStore(tmp_path / "memory.sqlite3"))
    planners = {"research-agent": CapturingPlanner(), "trading-desk": CapturingPlanner()}
    async with (
        Harness(
            client,
            tmp_path / "a",
            hooks=coordination_hooks(coordinator, "research-agent"),
            planner=planners["research-agent"],
        ) as a,
        Harness(
            client,
            tmp_path / "b",
            hooks=coordination_hooks(coordinator, "trading-desk"),
            planner=planners["trading-desk"],
        ) as b,
    ):
        out_a, out_b = await asyncio.gather(
            a.run("What is the price of ACME?"), b.run("Quote ACME and MSFT for the desk")
        )

    for out, other, activity in (
        (out_a, "trading-desk", "Quote ACME and MSFT"),
        (out_b, "research-agent", "What is the price of ACME?"),
    ):
        assert out.failure is None
        text = out.record.enrichments["activity_coordination"]
        assert f"{other} is working on: {activity}" in text and "ACME" in text
        selected = out.record.effect("activity_context").data["selected"]
        assert [s["agent"] for s in selected] == [other]
    for agent, planner in planners.items():
        [prompt] = planner.prompts
        assert "<agent_coordination>" in prompt and "is working on" in prompt and f"{agent} is working on" not in prompt
    assert (await coordinator.memory.active()).items == []


async def test_an_unreadable_registry_fails_open_and_no_lease_is_declared(client, tmp_path):
    path = tmp_path / "memory.sqlite3"
    memory = MemoryStore(path)
    path.write_bytes(b"not a database" * 512)
    async with Harness(
        client, tmp_path, hooks=coordination_hooks(memory), planner=FixedPlanner(quote("q", "ACME"))
    ) as h:
        out = await h.run(QUOTE)

    assert out.failure is None and "ACME is trading at" in out.result.response
    signal = out.record.effect("activity_signal")
    assert signal.status is EffectStatus.FAILED and signal.data["provider_call_status"] == "error"
    assert "not a database" in signal.error
    context = out.record.effect("activity_context")
    assert context.status is EffectStatus.FAILED and context.data["read_status"] == "read_failed"
    assert lease_order(out) == [] and out.record.effect(RENEWAL) is None
    # The cleanup hook, without an owner, tried the removal itself and reported its error.
    assert out.record.effect(CLEANUP).status is EffectStatus.FAILED


async def test_a_lease_keeper_continues_as_new_keeps_its_counts_renews_the_newest_lease_and_stops_on_signal(
    client, tmp_path
):
    """The LeaseKeeper child on its own: it renews every interval, continues as new after
    ``renewals_per_run`` renewals carrying its counts, renews the newest declaration once it is replaced,
    and returns its counts when told to stop."""
    coordinator = RecordingCoordinator(MemoryStore(tmp_path / "memory.sqlite3"))
    announcement = coordination_hooks(coordinator)[0]
    async with Harness(client, tmp_path, hooks=[announcement]) as h:
        signal = ActivitySignal(signal_id="sig-1", agent="quote-agent", activity="keeper test", request_id="r1")
        await coordinator.announce(signal, ttl_seconds=30)
        lease = ManagedLease(
            lease_id="sig-1",
            hook=announcement.name,
            stage=Stage.BEFORE_PLANNING,
            ttl_seconds=3.0,
            renew_interval_seconds=0.5,
            renewal_effect_id=RENEWAL,
            cleanup_effect_id=CLEANUP,
        )
        handle = await client.start_workflow(
            "LeaseKeeper",
            LeaseKeeperInput(call=LeaseCall(lease=lease, request_id="r1", workflow_id="w1"), renewals_per_run=2),
            id=f"keeper-{tmp_path.name}",
            task_queue=h.task_queue,
            result_type=LeaseKeeperReport,
        )
        await eventually(lambda: _async(len(coordinator.renewals) >= 5), what="five renewals")
        await handle.signal("replace_lease", lease.model_copy(update={"ttl_seconds": 9.0}))
        seen = len(coordinator.renewals)
        await eventually(lambda: _async(len(coordinator.renewals) >= seen + 2), what="renewals of the new lease")
        await handle.signal("stop_keeping")
        report = await handle.result()
        runs = [e async for e in client.list_workflows(f"WorkflowId = 'keeper-{tmp_path.name}'")]
        for run in runs:
            h.histories.append(await client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history())

    assert report.renewed == report.submitted >= seen + 2 and report.errors == 0
    assert len(runs) >= 3  # continued as new every two renewals, counts carried across
    assert coordinator.ttls[-1] == 9.0 and coordinator.ttls[0] == 3.0


async def _async(value):
    return value or None
