"""Versioned execution records.

Through the workflow: a full snapshot at each lifecycle boundary (accepted plan, checkpoint opened,
terminal), with ``lifecycle`` evidence and a growing revision. On the store's own: revision-gated
snapshots, effect updates merged over the newest snapshot (accepted once per effect, concurrent writers
all surviving), normal and error retention with purging, and legacy records reading as completion
``unknown``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import CancelledError

from activities import Tool
from hooks import PipelineHook, PlanStep
from storage.executions import SQLiteExecutionStore
from workflows import data_converter
from workflows.models import (
    ApproveSignal,
    EffectStatus,
    ExecutionRecord,
    LifecycleBoundary,
    PipelineHookEffect,
    RecordLifecycle,
    RejectSignal,
    RequestError,
    RequestStatus,
    StepResult,
    StepStatus,
)

from .conftest import with_payload_store
from .doubles import FixedPlanner, NoArguments, quote
from .harness import Harness, Outcome

# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

STARTED = datetime(2026, 1, 1, tzinfo=UTC)
COMPLETION = {
    RequestStatus.SUCCEEDED: "completed",
    RequestStatus.FAILED: "failed",
    RequestStatus.CANCELLED: "cancelled",
}


def pending(effect_id: str, **data) -> PipelineHookEffect:
    return PipelineHookEffect(
        effect_id=effect_id, name=f"Effect {effect_id}", status=EffectStatus.PENDING, data=data or None, hook="h"
    )


def terminal(effect_id: str, status: EffectStatus = EffectStatus.SUCCEEDED, **data) -> PipelineHookEffect:
    return PipelineHookEffect(
        effect_id=effect_id,
        name=f"Effect {effect_id}",
        status=status,
        data=data or None,
        hook="h",
        error="writer failed" if status is EffectStatus.FAILED else None,
    )


def snapshot(
    revision: int,
    *,
    workflow_id: str = "wf-1",
    run_id: str = "run-1",
    status: RequestStatus = RequestStatus.SUCCEEDED,
    effects: list[PipelineHookEffect] | None = None,
    response: str = "",
    boundary: LifecycleBoundary = LifecycleBoundary.TERMINAL,
) -> ExecutionRecord:
    """A full snapshot as the workflow writes it: ``record_revision`` and lifecycle evidence agree."""
    return ExecutionRecord(
        request_id=f"req-{workflow_id}",
        workflow_id=workflow_id,
        run_id=run_id,
        request="What is the price of ACME?",
        status=status,
        record_revision=revision,
        started_at=STARTED,
        final_response=response,
        effects=list(effects or []),
        lifecycle=RecordLifecycle(
            boundary=boundary, completion=COMPLETION.get(status, "pending"), snapshot_revision=revision
        ),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def effect_update_rows(path, workflow_id: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM effect_updates WHERE workflow_id = ?", (workflow_id,)).fetchone()[0]


def execution_rows(path, workflow_id: str) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM executions WHERE workflow_id = ?", (workflow_id,)).fetchone()[0]


# --------------------------------------------------------------------------------------------------
# Snapshots at each lifecycle boundary, through the workflow
# --------------------------------------------------------------------------------------------------


class RecordingStore:
    """The harness's store, keeping a copy of every snapshot the workflow asked it to save."""

    def __init__(self, inner: SQLiteExecutionStore) -> None:
        self.inner = inner
        self.saved: list[tuple[ExecutionRecord, tuple[int, bool]]] = []

    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        result = await self.inner.save(record)
        self.saved.append((record.model_copy(deep=True), result))
        return result

    def __getattr__(self, name):
        return getattr(self.inner, name)


def boundaries(store: RecordingStore) -> list[tuple[str, str, int, int, str, tuple[int, bool]]]:
    return [
        (
            r.lifecycle.boundary.value,
            r.lifecycle.completion,
            r.lifecycle.snapshot_revision,
            r.record_revision,
            r.status.value,
            res,
        )
        for r, res in store.saved
    ]


def persist_summaries(out: Outcome) -> list[str]:
    return [a.summary for a in out.scheduled if a.activity_type == "persist_execution_record"]


class Hold(Tool):
    """A tool that waits until the test lets it finish."""

    namespace = "test-tools"
    agent = "hold"
    capability = "wait"
    Arguments = NoArguments

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self, arguments, ctx):
        self.entered.set()
        await self.release.wait()
        return {"held": True}


def hold_plan() -> FixedPlanner:
    return FixedPlanner(PlanStep(step_id="hold", namespace="test-tools", agent="hold", capability="wait"))


async def held(h: Harness, hold: Hold) -> tuple[Any, ExecutionRecord | None]:
    """Start a request whose plan is ``hold``'s step; once the tool runs, what the store holds of it."""
    handle = await h.start("hold on")
    await asyncio.wait_for(hold.entered.wait(), 60)
    return handle, await h.store.get(handle.id)


def marked_quote() -> PlanStep:
    step = quote("quote-acme", "ACME")
    step.metadata = {"approval_required": "a reviewer looks at every quote"}
    return step


async def stored_at(out_or_store, key: str, boundary: str) -> ExecutionRecord:
    async with asyncio.timeout(60):
        while True:
            record = await out_or_store.get(key)
            if record is not None and record.lifecycle is not None and record.lifecycle.boundary == boundary:
                return record
            await asyncio.sleep(0.05)


async def test_a_snapshot_is_persisted_at_accepted_plan_and_terminal(client, tmp_path):
    hold = Hold()
    h = Harness(client, tmp_path, tools=[hold], planner=hold_plan())
    recording = h.activities.store = RecordingStore(h.store)
    async with h:
        # The tool is running: the accepted plan's snapshot is what the store holds.
        handle, accepted = await held(h, hold)
        assert accepted.lifecycle == RecordLifecycle(
            boundary="accepted_plan", completion="pending", snapshot_revision=1
        )
        assert accepted.record_revision == 1 and accepted.request_completion == "pending"
        assert accepted.status is RequestStatus.RUNNING and accepted.completed_at is None
        assert [p.phase for p in accepted.plans] == [1] and accepted.steps == []
        hold.release.set()
        out = await h.finish(handle)

    assert out.failure is None
    stored = await out.stored()
    assert stored.lifecycle == RecordLifecycle(boundary="terminal", completion="completed", snapshot_revision=2)
    assert stored.record_revision == 2 and stored.status is RequestStatus.SUCCEEDED
    assert [s.step_id for s in stored.steps] == ["hold"] and stored.steps[0].output == {"held": True}
    assert stored == out.record  # the terminal snapshot is the whole live record
    assert boundaries(recording) == [
        ("accepted_plan", "pending", 1, 1, "running", (1, True)),
        ("terminal", "completed", 2, 2, "succeeded", (2, True)),
    ]
    assert persist_summaries(out) == [
        "bookkeeping · persist record · accepted_plan · revision 1",
        "bookkeeping · persist record · terminal · revision 2",
    ]


async def test_a_checkpoint_persists_accepted_plan_checkpoint_opened_and_terminal(client, tmp_path):
    h = Harness(client, tmp_path, planner=FixedPlanner(marked_quote()))
    recording = h.activities.store = RecordingStore(h.store)
    async with h:
        handle = await h.start("quote ACME, carefully")
        checkpoint = await h.wait_for_checkpoint(handle)
        opened = await stored_at(h.store, handle.id, "checkpoint_opened")
        assert opened.lifecycle == RecordLifecycle(
            boundary="checkpoint_opened", completion="pending", snapshot_revision=2
        )
        assert opened.record_revision == 2 and opened.status is RequestStatus.SUSPENDED
        assert [(c.checkpoint_id, c.status.value) for c in opened.checkpoints] == [
            (checkpoint.checkpoint_id, "pending")
        ]
        assert [p.phase for p in opened.plans] == [1] and opened.steps == []
        await handle.signal("approve", ApproveSignal(checkpoint_id=checkpoint.checkpoint_id, reviewer="rita"))
        out = await h.finish(handle)

    assert out.failure is None
    stored = await out.stored()
    assert stored.lifecycle == RecordLifecycle(boundary="terminal", completion="completed", snapshot_revision=3)
    assert stored.record_revision == 3 and stored.status is RequestStatus.SUCCEEDED
    assert stored.checkpoints[0].status == "approved" and stored.checkpoints[0].reviewer == "rita"
    assert [s.step_id for s in stored.steps] == ["quote-acme"]
    assert boundaries(recording) == [
        ("accepted_plan", "pending", 1, 1, "running", (1, True)),
        ("checkpoint_opened", "pending", 2, 2, "suspended", (2, True)),
        ("terminal", "completed", 3, 3, "succeeded", (3, True)),
    ]
    assert persist_summaries(out) == [
        "bookkeeping · persist record · accepted_plan · revision 1",
        "bookkeeping · persist record · checkpoint_opened · revision 2",
        "bookkeeping · persist record · terminal · revision 3",
    ]


class AcceptPlan:
    """after_planning, in-process: accepts the plan as it is, with an effect of its own."""

    def __init__(self, name: str) -> None:
        self.name = name

    def after_planning(self, ctx, plan):
        ctx.report_effect(f"{self.name}-seen", name="Plan seen", status="succeeded", data={"steps": len(plan.steps)})
        return plan


class Enrich:
    """before_planning, in-process: adds an enrichment (its local activity comes before planning)."""

    name = "enrich"

    def before_planning(self, ctx):
        ctx.enrichments["desk"] = "equities"


class RewritePlan:
    """after_planning, in-process: renames the plan's steps."""

    name = "rewrite-plan"

    def after_planning(self, ctx, plan):
        return plan.model_copy(update={"steps": [s.model_copy(update={"step_id": "hold-2"}) for s in plan.steps]})


class FailingFirstSave(RecordingStore):
    """Refuses the first snapshot it is asked to save, as a store that is down for a moment would."""

    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        if not self.saved and not getattr(self, "refused", False):
            self.refused = True
            raise ConnectionError("store unavailable")
        return await super().save(record)


def after_planning_marker(out: Outcome) -> dict:
    """What the planning activity that ran the phase's after_planning hooks recorded as its result."""
    found = [output for output in out.planning_outputs() if output.get("after")]
    assert len(found) == 1, found
    return found[0]


async def test_after_planning_hooks_that_accept_the_plan_write_its_snapshot_themselves(client, tmp_path):
    """The planning activity that runs a phase's after_planning hooks on its plan writes the accepted plan's
    snapshot when they leave the plan as it is: the store has it, with their invocations and effects, before the
    tool runs, and no local activity of its own writes it. The snapshot is the workflow's record at that
    point; the harness replays the history (whose workflow clock after the first local activities reads
    differently in replay)."""
    hold = Hold()
    hooks = [Enrich(), AcceptPlan("a"), AcceptPlan("b")]
    h = Harness(with_payload_store(client, tmp_path), tmp_path, tools=[hold], planner=hold_plan(), hooks=hooks)
    recording = h.activities.store = RecordingStore(h.store)
    async with h:
        handle, accepted = await held(h, hold)
        assert accepted.lifecycle == RecordLifecycle(
            boundary="accepted_plan", completion="pending", snapshot_revision=1
        )
        assert [(i.hook, i.stage.value, i.sequence, i.outcome.value) for i in accepted.pipeline_hooks] == [
            ("enrich", "before_planning", 1, "succeeded"),
            ("a", "after_planning", 1, "succeeded"),
            ("b", "after_planning", 2, "succeeded"),
        ]
        assert accepted.enrichments == {"desk": "equities"}
        assert [e.effect_id for e in accepted.effects] == ["planning_enrichment:desk", "a-seen", "b-seen"]
        assert [[s.step_id for s in p.plan.steps] for p in accepted.plans] == [["hold"]] and accepted.steps == []
        hold.release.set()
        out = await h.finish(handle)

    assert out.failure is None
    assert persist_summaries(out) == ["bookkeeping · persist record · terminal · revision 2"]
    written, final = recording.saved[0][0], out.record
    assert after_planning_marker(out)["snapshot"] == {"revision": 1, "written": True}
    assert boundaries(recording) == [
        ("accepted_plan", "pending", 1, 1, "running", (1, True)),
        ("terminal", "completed", 2, 2, "succeeded", (2, True)),
    ]
    # The planning activity ran the before_planning hook too, then the planner, then the after_planning
    # hooks; what it wrote is what the workflow went on with: the same invocations (their times too), the
    # same effects (each enrichment change as its hook ended) and enrichments, and the plan accepted as the
    # last hook ended.
    [planning] = [o for o in out.planning_outputs() if o.get("before")]
    assert [e["hook"] for e in planning["before"]] == ["enrich"] and planning == after_planning_marker(out)
    assert written.pipeline_hooks == final.pipeline_hooks[:3]
    assert written.effects == final.effects[: len(written.effects)]
    assert written.enrichments == final.enrichments
    assert written.plans == final.plans
    last = final.pipeline_hooks[-1]
    assert final.plans[0].accepted_at == last.started_at + timedelta(milliseconds=last.duration_ms)
    assert await out.stored() == final


async def test_without_a_payload_store_the_record_stays_out_of_history_and_the_workflow_writes_the_plan(
    client, tmp_path
):
    """Without a payload store the planning activity is not handed the record (it would enter the history
    inline): it runs the phase's hooks on its plan, and the workflow writes the accepted plan's snapshot
    after them, before the tool."""
    hold = Hold()
    h = Harness(client, tmp_path, tools=[hold], planner=hold_plan(), hooks=[AcceptPlan("a")])
    recording = h.activities.store = RecordingStore(h.store)
    async with h:
        handle, accepted = await held(h, hold)
        assert accepted.lifecycle.boundary == "accepted_plan" and accepted.record_revision == 1
        hold.release.set()
        out = await h.finish(handle)

    assert out.failure is None
    assert after_planning_marker(out).get("snapshot") is None
    [planning] = [e for e in out.history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED][:1]
    sent = data_converter.payload_converter.from_payloads(
        planning.activity_task_scheduled_event_attributes.input.payloads
    )
    assert sent[0]["hooks"]["after"] and "write" not in sent[0]["hooks"]
    assert persist_summaries(out) == [
        "bookkeeping · persist record · accepted_plan · revision 1",
        "bookkeeping · persist record · terminal · revision 2",
    ]
    assert [b[:3] for b in boundaries(recording)] == [("accepted_plan", "pending", 1), ("terminal", "completed", 2)]
    assert await out.stored() == out.record


async def test_after_planning_hooks_that_change_the_plan_leave_its_snapshot_to_the_workflow(client, tmp_path):
    h = Harness(client, tmp_path, tools=[Hold()], planner=hold_plan(), hooks=[RewritePlan(), AcceptPlan("after")])
    recording = h.activities.store = RecordingStore(h.store)
    tool = h.tools[0]
    assert isinstance(tool, Hold)
    async with h:
        handle, accepted = await held(h, tool)
        assert [[s.step_id for s in p.plan.steps] for p in accepted.plans] == [["hold-2"]]
        tool.release.set()
        out = await h.finish(handle)

    assert out.failure is None
    assert after_planning_marker(out).get("snapshot") is None  # not tried: the hooks changed the plan
    assert persist_summaries(out) == [
        "bookkeeping · persist record · accepted_plan · revision 1",
        "bookkeeping · persist record · terminal · revision 2",
    ]
    assert [b[:3] for b in boundaries(recording)] == [("accepted_plan", "pending", 1), ("terminal", "completed", 2)]


async def test_a_snapshot_the_hooks_could_not_write_is_written_by_the_workflow_with_the_next_revision(client, tmp_path):
    """A store that fails the hooks' write fails neither the hooks nor the request: their outcomes stand
    (they ran once), and the workflow writes the snapshot itself, with the revision after the one offered
    (an attempt whose result was lost may have written that one)."""
    hold = Hold()
    h = Harness(
        with_payload_store(client, tmp_path), tmp_path, tools=[hold], planner=hold_plan(), hooks=[AcceptPlan("a")]
    )
    recording = h.activities.store = FailingFirstSave(h.store)
    async with h:
        handle, accepted = await held(h, hold)
        assert accepted.lifecycle.boundary == "accepted_plan" and accepted.record_revision == 2
        hold.release.set()
        out = await h.finish(handle)

    assert out.failure is None
    tried = after_planning_marker(out)["snapshot"]
    assert (tried["revision"], tried.get("written", False)) == (1, False)
    assert persist_summaries(out) == [
        "bookkeeping · persist record · accepted_plan · revision 2",
        "bookkeeping · persist record · terminal · revision 3",
    ]
    assert [b[:3] for b in boundaries(recording)] == [("accepted_plan", "pending", 2), ("terminal", "completed", 3)]
    assert [(i.hook, i.outcome.value) for i in out.record.pipeline_hooks] == [("a", "succeeded")]
    assert await out.stored() == out.record


async def test_a_rejected_checkpoint_persists_a_failed_terminal_snapshot(client, tmp_path):
    h = Harness(client, tmp_path, planner=FixedPlanner(marked_quote()))
    recording = h.activities.store = RecordingStore(h.store)
    async with h:
        handle = await h.start("quote ACME, carefully")
        checkpoint = await h.wait_for_checkpoint(handle)
        await stored_at(h.store, handle.id, "checkpoint_opened")
        await handle.signal(
            "reject", RejectSignal(checkpoint_id=checkpoint.checkpoint_id, reviewer="rita", reason="no")
        )
        out = await h.finish(handle)

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    stored = await out.stored()
    assert stored.lifecycle == RecordLifecycle(boundary="terminal", completion="failed", snapshot_revision=3)
    assert stored.status is RequestStatus.FAILED and stored.request_completion == "failed"
    assert stored.error.type == "CheckpointRejected" and stored.steps == []
    assert [b[:3] for b in boundaries(recording)] == [
        ("accepted_plan", "pending", 1),
        ("checkpoint_opened", "pending", 2),
        ("terminal", "failed", 3),
    ]


# --------------------------------------------------------------------------------------------------
# Effect updates on the store: concurrent, once per effect, terminal only
# --------------------------------------------------------------------------------------------------


async def test_concurrent_effect_updates_from_tasks_threads_and_stores_all_survive(tmp_path):
    path = tmp_path / "x.sqlite3"
    ids = [f"e{i:02d}" for i in range(30)]
    stores = [SQLiteExecutionStore(path) for _ in range(3)]
    assert await stores[0].save(snapshot(3, effects=[pending(i) for i in ids])) == (3, True)

    def in_thread(effect_id: str) -> tuple[int, bool]:
        # Its own event loop and its own store instance, on the same file.
        return asyncio.run(SQLiteExecutionStore(path).update_effect("wf-1", "run-1", terminal(effect_id, n=effect_id)))

    async def from_threads(batch: list[str]) -> list[tuple[int, bool]]:
        with ThreadPoolExecutor(max_workers=len(batch)) as pool:
            return list(
                await asyncio.gather(*(asyncio.get_running_loop().run_in_executor(pool, in_thread, i) for i in batch))
            )

    async def from_tasks(batch: list[str]) -> list[tuple[int, bool]]:
        return list(
            await asyncio.gather(
                *(stores[n % 3].update_effect("wf-1", "run-1", terminal(i, n=i)) for n, i in enumerate(batch))
            )
        )

    by_threads, by_tasks = await asyncio.gather(from_threads(ids[:15]), from_tasks(ids[15:]))
    results = by_threads + by_tasks
    assert all(written for _, written in results)
    # Serialized: each accepted update saw every earlier one.
    assert sorted(revision for revision, _ in results) == list(range(4, 34))

    for store in stores:
        record = await store.get("wf-1")
        assert record.record_revision == 3 + len(ids)
        assert record.lifecycle.snapshot_revision == 3
        assert [e.effect_id for e in record.effects] == ids  # in place: one card each, snapshot order
        assert all(e.status is EffectStatus.SUCCEEDED and e.data == {"n": e.effect_id} for e in record.effects)


async def test_a_second_terminal_update_of_an_effect_is_refused(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    await store.save(snapshot(2, effects=[pending("write"), pending("other")]))
    assert await store.update_effect("wf-1", "run-1", terminal("write", n=1)) == (3, True)
    assert await store.update_effect("wf-1", "run-1", terminal("write", EffectStatus.FAILED)) == (3, False)
    assert await store.update_effect("wf-1", "run-1", terminal("write", n=2)) == (3, False)
    record = await store.get("wf-1")
    assert record.record_revision == 3
    assert [(e.effect_id, e.status.value, e.data) for e in record.effects] == [
        ("write", "succeeded", {"n": 1}),
        ("other", "pending", None),
    ]


async def test_racing_terminal_updates_of_one_effect_accept_exactly_one(tmp_path):
    path = tmp_path / "x.sqlite3"
    await SQLiteExecutionStore(path).save(snapshot(1, effects=[pending("write")]))
    updates = [terminal("write", EffectStatus.SUCCEEDED if n % 2 else EffectStatus.FAILED, n=n) for n in range(12)]
    results = await asyncio.gather(*(SQLiteExecutionStore(path).update_effect("wf-1", "run-1", u) for u in updates))
    winners = [u for u, (_, written) in zip(updates, results, strict=True) if written]
    assert len(winners) == 1
    assert [revision for revision, _ in results] == [2] * len(updates)
    record = await SQLiteExecutionStore(path).get("wf-1")
    assert record.effects == [winners[0]] and record.record_revision == 2


async def test_a_pending_effect_update_is_refused(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    await store.save(snapshot(1, effects=[pending("write")]))
    with pytest.raises(ValueError, match="must be terminal"):
        await store.update_effect("wf-1", "run-1", pending("write", n=1))
    record = await store.get("wf-1")
    assert record.record_revision == 1 and record.effects == [pending("write")]
    # The refused update did not use up the effect's one terminal update.
    assert await store.update_effect("wf-1", "run-1", terminal("write")) == (2, True)


async def test_a_stale_or_equal_snapshot_never_replaces_a_newer_one_or_erases_effect_updates(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    assert await store.save(snapshot(2, effects=[pending("write")], response="two", status=RequestStatus.RUNNING)) == (
        2,
        True,
    )
    assert await store.update_effect("wf-1", "run-1", terminal("write", n=1)) == (3, True)

    # Older and equal snapshots are refused; the update stays merged.
    assert await store.save(snapshot(1, effects=[pending("write")], response="one")) == (3, False)
    assert await store.save(snapshot(2, effects=[], response="two again")) == (3, False)
    record = await store.get("wf-1")
    assert record.final_response == "two" and record.record_revision == 3
    assert record.effects == [terminal("write", n=1)]

    # A newer snapshot that never saw the update replaces the snapshot, not the update.
    assert await store.save(snapshot(3, effects=[pending("write")], response="three")) == (4, True)
    record = await store.get("wf-1")
    assert record.final_response == "three" and record.status is RequestStatus.SUCCEEDED
    assert record.effects == [terminal("write", n=1)]
    assert record.record_revision == 4 and record.lifecycle.snapshot_revision == 3

    # Concurrent stale writers after the fact change nothing.
    results = await asyncio.gather(*(store.save(snapshot(r, response=f"r{r}")) for r in (1, 2, 3, 1, 2, 3)))
    assert results == [(4, False)] * 6
    assert (await store.get("wf-1")).final_response == "three"


async def test_record_revision_only_grows_across_snapshots_and_updates(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    seen = []
    effects = [pending("a"), pending("b")]
    for step in [
        lambda: store.save(snapshot(1, effects=effects, status=RequestStatus.RUNNING)),
        lambda: store.update_effect("wf-1", "run-1", terminal("a")),
        lambda: store.save(snapshot(2, effects=effects, status=RequestStatus.SUSPENDED)),
        lambda: store.save(snapshot(1, effects=effects)),  # stale
        lambda: store.update_effect("wf-1", "run-1", terminal("b")),
        lambda: store.update_effect("wf-1", "run-1", terminal("b")),  # duplicate
        lambda: store.save(snapshot(3, effects=effects)),
    ]:
        await step()
        seen.append((await store.get("wf-1")).record_revision)
    assert seen == [1, 2, 3, 3, 4, 4, 5]


async def test_an_effect_update_before_any_snapshot_is_kept_and_shows_with_the_snapshot(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    revision, written = await store.update_effect("wf-1", "run-1", terminal("write", n=1))
    assert written and revision == 1
    assert await store.get("wf-1") is None  # nothing to show without a snapshot
    # The snapshot arrives (it still has the effect pending, and never saw "extra").
    await store.update_effect("wf-1", "run-1", terminal("extra", EffectStatus.FAILED))
    assert await store.save(snapshot(1, effects=[pending("write")])) == (3, True)
    record = await store.get("wf-1")
    assert record.effects == [terminal("write", n=1), terminal("extra", EffectStatus.FAILED)]
    assert record.record_revision == 3
    # Updates belong to their run: another run of the same workflow id does not see them.
    await store.save(snapshot(1, run_id="run-2", effects=[pending("write")]).model_copy(update={"request_id": "other"}))
    other = await store.get_run("wf-1", "run-2")
    assert other.effects == [pending("write")] and other.record_revision == 1


# --------------------------------------------------------------------------------------------------
# Failure state and retention
# --------------------------------------------------------------------------------------------------


async def test_a_failed_record_stays_failed_after_late_updates(tmp_path):
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    failed = snapshot(2, status=RequestStatus.FAILED, effects=[pending("write")]).model_copy(
        update={"error": RequestError(type="RequiredAfterPlanningError", message="refused")}
    )
    await store.save(failed)
    await store.update_effect("wf-1", "run-1", terminal("write"))
    record = await store.get("wf-1")
    assert record.status is RequestStatus.FAILED and record.request_completion == "failed"
    assert record.error.type == "RequiredAfterPlanningError"
    assert record.effect("write").status is EffectStatus.SUCCEEDED


async def test_normal_and_error_retention_are_configurable_and_separate(tmp_path):
    clock = Clock()
    store = SQLiteExecutionStore(
        tmp_path / "x.sqlite3", retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock
    )
    await store.save(snapshot(1, workflow_id="ok"))
    await store.save(snapshot(1, workflow_id="failed", status=RequestStatus.FAILED))
    await store.save(snapshot(1, workflow_id="cancelled", status=RequestStatus.CANCELLED))

    clock.now += 3600 - 1
    assert {r.workflow_id for r in await store.recent()} == {"ok", "failed", "cancelled"}
    clock.now += 2
    assert await store.get("ok") is None
    assert {r.workflow_id for r in await store.recent()} == {"failed", "cancelled"}
    clock.now += 4 * 3600 - 2
    assert (await store.get("failed")).status is RequestStatus.FAILED
    clock.now += 2
    assert await store.get("failed") is None and await store.get("cancelled") is None
    assert await store.recent() == []


async def test_retention_follows_the_newest_snapshot_status(tmp_path):
    clock = Clock()
    store = SQLiteExecutionStore(
        tmp_path / "x.sqlite3", retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock
    )
    await store.save(snapshot(1, status=RequestStatus.RUNNING, boundary=LifecycleBoundary.ACCEPTED_PLAN))
    await store.save(snapshot(2, status=RequestStatus.FAILED))
    clock.now += 2 * 3600
    assert (await store.get("wf-1")).status is RequestStatus.FAILED


async def test_late_updates_do_not_extend_a_failed_records_retention(tmp_path):
    clock = Clock()
    store = SQLiteExecutionStore(
        tmp_path / "x.sqlite3", retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock
    )
    await store.save(snapshot(2, status=RequestStatus.FAILED, effects=[pending("a"), pending("b")]))
    clock.now += 4 * 3600
    assert await store.update_effect("wf-1", "run-1", terminal("a")) == (3, True)
    clock.now += 3600 - 1
    assert await store.update_effect("wf-1", "run-1", terminal("b")) == (4, True)
    record = await store.get("wf-1")
    assert record.status is RequestStatus.FAILED and record.record_revision == 4
    clock.now += 2  # five hours after the failed snapshot, whatever updated it since
    assert await store.get("wf-1") is None


async def test_late_updates_do_not_extend_a_successful_records_retention(tmp_path):
    clock = Clock()
    store = SQLiteExecutionStore(
        tmp_path / "x.sqlite3", retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock
    )
    await store.save(snapshot(2, effects=[pending("a")]))
    clock.now += 3600 - 1
    await store.update_effect("wf-1", "run-1", terminal("a"))
    clock.now += 2
    assert await store.get("wf-1") is None


async def test_expired_records_and_their_orphaned_effect_updates_are_purged(tmp_path):
    clock = Clock()
    path = tmp_path / "x.sqlite3"
    store = SQLiteExecutionStore(path, retention=timedelta(hours=1), error_retention=timedelta(hours=5), clock=clock)
    await store.save(snapshot(1, effects=[pending("a")]))
    await store.update_effect("wf-1", "run-1", terminal("a"))
    await store.save(snapshot(1, workflow_id="keep", status=RequestStatus.FAILED, effects=[pending("a")]))
    await store.update_effect("keep", "run-1", terminal("a"))
    assert execution_rows(path, "wf-1") == 1 and effect_update_rows(path, "wf-1") == 1

    clock.now += 2 * 3600
    await store.save(snapshot(1, workflow_id="trigger-1"))  # any write purges
    assert execution_rows(path, "wf-1") == 0
    assert execution_rows(path, "keep") == 1 and effect_update_rows(path, "keep") == 1

    clock.now += 4 * 3600  # past the longest retention: the orphaned update goes too
    await store.save(snapshot(1, workflow_id="trigger-2"))
    assert effect_update_rows(path, "wf-1") == 0
    assert execution_rows(path, "keep") == 0 and effect_update_rows(path, "keep") == 0
    # A snapshot of the purged run written again starts without the old update.
    assert await store.save(snapshot(1, effects=[pending("a")])) == (1, True)
    assert (await store.get("wf-1")).effects == [pending("a")]
    assert {r.workflow_id for r in await store.recent()} == {"trigger-2", "wf-1"}


# --------------------------------------------------------------------------------------------------
# Legacy records: no lifecycle evidence
# --------------------------------------------------------------------------------------------------


def legacy_record(revision: int = 4) -> ExecutionRecord:
    return ExecutionRecord(
        request_id="req-old",
        workflow_id="wf-old",
        run_id="run-1",
        request="What is the price of ACME?",
        status=RequestStatus.SUCCEEDED,
        record_revision=revision,
        started_at=STARTED,
        completed_at=STARTED + timedelta(seconds=2),
        steps=[
            StepResult(step_id="q1", tool="stock-service/stock_quote", status=StepStatus.SUCCEEDED, output={"p": 1}),
            StepResult(step_id="q2", tool="stock-service/stock_quote", status=StepStatus.SUCCEEDED, output={"p": 2}),
        ],
        effects=[pending("write")],
        final_response="ok",
        lifecycle=None,
    )


async def test_a_record_without_lifecycle_reads_as_completion_unknown(tmp_path):
    record = legacy_record()
    assert record.request_completion == "unknown"  # every step succeeded, status succeeded: still unknown
    store = SQLiteExecutionStore(tmp_path / "x.sqlite3")
    assert await store.save(record) == (4, True)
    stored = await store.get("req-old")
    assert stored.lifecycle is None and stored.request_completion == "unknown"
    assert all(s.status is StepStatus.SUCCEEDED for s in stored.steps)
    # Legacy revision gating uses the record's revision; a late update keeps completion unknown.
    assert await store.save(legacy_record(3)) == (4, False)
    assert await store.update_effect("wf-old", "run-1", terminal("write")) == (5, True)
    stored = await store.get("wf-old")
    assert stored.request_completion == "unknown" and stored.record_revision == 5
    assert stored.effect("write").status is EffectStatus.SUCCEEDED


async def test_a_store_written_by_an_older_writer_reads_as_completion_unknown(tmp_path):
    path = tmp_path / "old.sqlite3"
    old = json.loads(legacy_record(2).model_dump_json())
    del old["lifecycle"]  # the older writer never wrote the field
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE executions (workflow_id TEXT NOT NULL, run_id TEXT NOT NULL, request_id TEXT NOT NULL, "
            "status TEXT NOT NULL, record_revision INTEGER NOT NULL, started_at TEXT NOT NULL, "
            "updated_at REAL NOT NULL, expires_at REAL NOT NULL, record TEXT NOT NULL, "
            "PRIMARY KEY (workflow_id, run_id))"
        )
        db.execute(
            "INSERT INTO executions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ("wf-old", "run-1", "req-old", "succeeded", 2, STARTED.isoformat(), 1.0, 9e18, json.dumps(old)),
        )
    store = SQLiteExecutionStore(path)
    stored = await store.get("req-old")
    assert stored is not None and stored.lifecycle is None
    assert stored.request_completion == "unknown" and stored.status is RequestStatus.SUCCEEDED
    assert stored.record_revision == 2
    # The migrated store takes effect updates and newer snapshots as usual.
    assert await store.update_effect("wf-old", "run-1", terminal("write")) == (3, True)
    assert await store.save(snapshot(3, workflow_id="wf-old")) == (4, True)
    newest = await store.get("wf-old")
    assert newest.request_completion == "completed" and newest.effect("write").status is EffectStatus.SUCCEEDED


# --------------------------------------------------------------------------------------------------
# A cancelled request's terminal snapshot
# --------------------------------------------------------------------------------------------------


class HeldAfterPlanning(PipelineHook):
    """An ordinary after_planning hook that waits (until the worker stops)."""

    name = "held-reviewer"
    timeout_seconds = 90.0
    max_attempts = 1

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def after_planning(self, ctx, plan):
        self.entered.set()
        await asyncio.Event().wait()
        return plan


class HeldSynthesizer:
    name = "held-synthesizer"

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def synthesize(self, input):
        self.entered.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize("where", ["execute_tool_step", "after_planning_hook", "synthesize"])
async def test_a_cancelled_request_persists_a_cancelled_terminal_snapshot_and_runs_nothing_more(
    client, tmp_path, where
):
    """Cancelling wherever the request waits ends it as cancelled: nothing but the terminal snapshot
    is scheduled after the activity it was waiting on, and the record says ``cancelled``."""
    hold, hook, synthesizer = Hold(), HeldAfterPlanning(), HeldSynthesizer()
    step = PlanStep(step_id="hold", namespace="test-tools", agent="hold", capability="wait")
    kwargs = {
        "execute_tool_step": dict(tools=[hold], planner=FixedPlanner(step)),
        "after_planning_hook": dict(planner=FixedPlanner(quote("quote-acme", "ACME")), hooks=[hook]),
        "synthesize": dict(planner=FixedPlanner(quote("quote-acme", "ACME")), synthesizer=synthesizer),
    }[where]
    entered = {
        "execute_tool_step": hold.entered,
        "after_planning_hook": hook.entered,
        "synthesize": synthesizer.entered,
    }
    async with Harness(client, tmp_path, **kwargs) as h:
        handle = await h.start("cancel me")
        await asyncio.wait_for(entered[where].wait(), 60)
        await handle.cancel()
        out = await h.finish(handle)

    types = out.activity_types()
    waited = "plan" if where == "after_planning_hook" else where  # the planning activity runs its hooks
    assert types[types.index(waited) + 1 :] == ["persist_execution_record"], types
    assert isinstance(out.failure, CancelledError), repr(out.failure)
    stored = await out.stored()
    assert stored.status is RequestStatus.CANCELLED and stored.request_completion == "cancelled"
    assert stored.lifecycle.boundary == "terminal" and stored.error.type == "Cancelled"
    assert stored.final_response is None
