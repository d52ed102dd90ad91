"""Hook effects and detached work.

An ordinary effect is recorded exactly as the hook reported it. A detached effect is announced pending
before the hook returns, carried by a real ``DetachedEffect`` child workflow (id
``<request>/effect/<effect id>``, ``ParentClosePolicy.ABANDON``) and brought to its terminal state under
the same effect id — in the live record while the request still runs, in the store afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from temporalio.api.enums.v1 import EventType, ParentClosePolicy
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from activities import Tool
from hooks import (
    DetachedContext,
    DetachedWorkResult,
    HookRejection,
    PipelineHook,
    PlanStep,
    RequiredAfterPlanningHook,
    Stage,
)
from hooks.builtin.audit import EFFECT_ID as AUDIT_EFFECT_ID
from hooks.builtin.audit import AuditHook, JsonlAuditWriter
from workflows import data_converter, detached_workflow_id
from workflows.models import (
    ApproveSignal,
    DetachedEffectInput,
    EffectStatus,
    ExecutionRecord,
    PipelineHookEffect,
    RequestStatus,
)

from .doubles import FixedPlanner, NoArguments, decision, quote
from .harness import Harness, Outcome

T = TypeVar("T")
QUOTE = "What is the price of ACME?"


def one_quote() -> FixedPlanner:
    return FixedPlanner(quote("quote-acme", "ACME"))


async def eventually(read: Callable[[], Awaitable[T]], check: Callable[[T], bool], *, timeout: float = 90.0) -> T:
    """Poll ``read`` until ``check`` holds (no timing is asserted: the deadline only bounds a hang)."""
    async with asyncio.timeout(timeout):
        while True:
            value = await read()
            if check(value):
                return value
            await asyncio.sleep(0.1)


def events(out: Outcome, event_type: int) -> list[Any]:
    return [e for e in out.history.events if e.event_type == event_type]


def child_starts(out: Outcome) -> list[Any]:
    return [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in events(out, EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED)
    ]


def effects_with_id(record: ExecutionRecord, effect_id: str) -> list[PipelineHookEffect]:
    return [e for e in record.effects if e.effect_id == effect_id]


async def stored_terminal(out: Outcome, *effect_ids: str) -> ExecutionRecord:
    """The stored record once every named effect is terminal there."""

    def done(record: ExecutionRecord | None) -> bool:
        return record is not None and all(
            (e := record.effect(eid)) is not None and e.status is not EffectStatus.PENDING for eid in effect_ids
        )

    return await eventually(out.stored, done)


async def finish_child(h: Harness, client: Client, out: Outcome, effect_id: str) -> PipelineHookEffect:
    """Wait for the effect's child workflow, and replay its history with the request's when the harness closes."""
    handle = client.get_workflow_handle(
        detached_workflow_id(out.workflow_id, effect_id), result_type=PipelineHookEffect
    )
    effect = await handle.result()
    h.histories.append(await handle.fetch_history())
    return effect


async def child_input(client: Client, child_id: str) -> DetachedEffectInput:
    history = await client.get_workflow_handle(child_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    return (await data_converter.decode(started.input.payloads, [DetachedEffectInput]))[0]


class Detacher(PipelineHook):
    """An after_execution hook that detaches one piece of work per effect id.

    ``gate`` holds every detached work until the test opens it; ``fail_with`` makes the work raise.
    """

    name = "detacher"

    def __init__(
        self,
        *effect_ids: str,
        gate: asyncio.Event | None = None,
        fail_with: BaseException | None = None,
    ) -> None:
        self.effect_ids = effect_ids or ("write",)
        self.gate = gate
        self.fail_with = fail_with
        self.calls: list[DetachedContext] = []
        self.hook_returned: list[str] = []

    async def after_execution(self, ctx, execution):
        for effect_id in self.effect_ids:
            ctx.detach(
                effect_id,
                name=f"Write {effect_id}",
                payload={"effect": effect_id, "steps": [s.step_id for s in execution.steps]},
                data={"queued": effect_id},
            )
        self.hook_returned.append(ctx.workflow_id)

    async def run_detached(self, work: DetachedContext) -> DetachedWorkResult:
        self.calls.append(work)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return DetachedWorkResult(data={"wrote": work.payload}, summary=f"wrote {work.effect_id}")


# --------------------------------------------------------------------------------------------------
# Ordinary effects
# --------------------------------------------------------------------------------------------------


async def test_a_reported_effect_is_recorded_with_every_field(client, tmp_path):
    started = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)

    class Reporter(PipelineHook):
        name = "reporter"

        async def after_execution(self, ctx, execution):
            # Reported twice under one id: the later report replaces the earlier one (one card).
            ctx.report_effect("lookup", name="draft", status="pending", data={"draft": True})
            ctx.report_effect(
                "lookup",
                name="Index lookup",
                status=EffectStatus.SUCCEEDED,
                data={"hits": 3, "ids": ["a", "b", "c"], "nested": {"ok": True}},
                summary="3 documents",
                started_at=started,
                duration_ms=12.5,
                schema_version=3,
            )
            ctx.report_effect(
                "notify-ops",
                name="Ops notification",
                status="failed",
                data=None,
                summary="pager refused",
                error="pager: 503 Service Unavailable",
                started_at=started,
                duration_ms=0.25,
            )

    async with Harness(client, tmp_path, hooks=[Reporter()], planner=one_quote()) as h:
        out = await h.run(QUOTE)

    assert out.failure is None
    stored = await out.stored()
    for record in (out.record, stored):
        assert [e.effect_id for e in record.effects] == ["lookup", "notify-ops"]
        lookup, notify = record.effects
        assert lookup == PipelineHookEffect(
            effect_id="lookup",
            schema_version=3,
            name="Index lookup",
            status=EffectStatus.SUCCEEDED,
            data={"hits": 3, "ids": ["a", "b", "c"], "nested": {"ok": True}},
            started_at=started,
            duration_ms=12.5,
            summary="3 documents",
            error=None,
            hook="reporter",
            stage=Stage.AFTER_EXECUTION,
        )
        assert notify == PipelineHookEffect(
            effect_id="notify-ops",
            schema_version=1,
            name="Ops notification",
            status=EffectStatus.FAILED,
            data=None,
            started_at=started,
            duration_ms=0.25,
            summary="pager refused",
            error="pager: 503 Service Unavailable",
            hook="reporter",
            stage=Stage.AFTER_EXECUTION,
        )
        # Effect outcome and invocation outcome are separate: the invocation itself succeeded.
        (invocation,) = record.invocations(Stage.AFTER_EXECUTION, "reporter")
        assert invocation.outcome == "succeeded" and invocation.error is None
        assert decision(invocation) == ("fail_open", "continue", "accepted")
    # No detached work: no child workflow.
    assert child_starts(out) == []


async def test_effects_of_a_failing_invocation_are_kept_and_a_pending_one_is_failed(client, tmp_path):
    class Crashes(PipelineHook):
        name = "crashes"
        max_attempts = 1

        async def after_execution(self, ctx, execution):
            ctx.report_effect("read", name="Read", status="succeeded", data={"n": 1}, summary="read 1")
            ctx.report_effect("write", name="Write", status="pending", data={"n": 2})
            raise HookRejection("backend refused the write")

    async with Harness(client, tmp_path, hooks=[Crashes()], planner=one_quote()) as h:
        out = await h.run(QUOTE)

    assert out.failure is None and "ACME is trading at" in out.result.response
    stored = await out.stored()
    for record in (out.record, stored):
        (invocation,) = record.invocations(Stage.AFTER_EXECUTION, "crashes")
        assert invocation.outcome == "failed" and invocation.error == "backend refused the write"
        assert decision(invocation) == ("fail_open", "continue", "hook_error")
        read, write = record.effect("read"), record.effect("write")
        assert (read.status, read.summary, read.error, read.data) == ("succeeded", "read 1", None, {"n": 1})
        assert (write.status, write.error, write.data) == ("failed", "backend refused the write", {"n": 2})
        assert len(record.effects) == 2


async def test_an_effect_reporting_error_does_not_change_the_business_outcome(client, tmp_path):
    """An error in reporting an effect is a diagnostic, never the business outcome; here a required hook's effect data is not JSON."""

    class Governed(RequiredAfterPlanningHook, PipelineHook):
        name = "governed"
        max_attempts = 1

        def after_planning(self, ctx, plan):
            ctx.report_effect("policy", name="Policy check", data={"checked": {"ACME"}})  # a set: not JSON
            return plan

    async with Harness(client, tmp_path, hooks=[Governed()], planner=one_quote()) as h:
        out = await h.run(QUOTE)

    assert out.failure is None, out.failure
    assert "ACME is trading at" in out.result.response
    (invocation,) = out.record.invocations(Stage.AFTER_PLANNING, "governed")
    assert invocation.outcome == "succeeded"
    assert decision(invocation) == ("fail_closed", "continue", "accepted")
    assert [s.step_id for s in out.record.steps] == ["quote-acme"]


# --------------------------------------------------------------------------------------------------
# The child workflow
# --------------------------------------------------------------------------------------------------


async def test_detached_work_runs_in_an_abandoned_child_and_brings_the_same_effect_to_succeeded(client, tmp_path):
    """The child signals the request while it still runs: the live record's one card changes status."""
    child_done = asyncio.Event()
    hold = asyncio.Event()

    class WaitForChild(PipelineHook):
        """Keeps the request open until the child has finished, then until the test lets it go."""

        name = "wait-for-child"
        timeout_seconds = 90.0
        max_attempts = 1

        async def after_synthesis(self, ctx, response):
            await client.get_workflow_handle(detached_workflow_id(ctx.workflow_id, "write")).result()
            child_done.set()
            await hold.wait()
            return response

    detacher = Detacher("write")
    async with Harness(client, tmp_path, hooks=[detacher, WaitForChild()], planner=one_quote()) as h:
        handle = await h.start(QUOTE)
        await asyncio.wait_for(child_done.wait(), 90)
        live = await handle.query("execution_record", result_type=ExecutionRecord)
        # Forged updates change nothing: a second terminal one, a pending one, a pending one for an unknown id.
        forged = live.effect("write").model_copy(update={"status": EffectStatus.FAILED, "error": "forged"})
        await handle.signal("effect_update", forged)
        await handle.signal("effect_update", forged.model_copy(update={"status": EffectStatus.PENDING}))
        await handle.signal("effect_update", forged.model_copy(update={"effect_id": "ghost", "status": "pending"}))
        hold.set()
        out = await h.finish(handle)
        child_effect = await finish_child(h, client, out, "write")

    assert out.failure is None
    child_id = f"{out.workflow_id}/effect/write"
    assert detached_workflow_id(out.workflow_id, "write") == child_id

    # The parent's history: one child start, with the id and the ABANDON policy.
    (start,) = child_starts(out)
    assert start.workflow_id == child_id
    assert start.workflow_type.name == "DetachedEffect"
    assert start.parent_close_policy == ParentClosePolicy.PARENT_CLOSE_POLICY_ABANDON
    assert start.task_queue.name == h.task_queue
    signals = events(out, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    assert [s.workflow_execution_signaled_event_attributes.signal_name for s in signals] == ["effect_update"] * 4
    assert [e.effect_id for e in out.record.effects] == ["write"]  # no card from a pending update

    # The child is a real execution on the server, with the request as its parent.
    desc = await client.get_workflow_handle(child_id).describe()
    assert desc.workflow_type == "DetachedEffect"
    assert desc.parent_id == out.workflow_id and desc.parent_run_id == out.record.run_id
    assert desc.status is WorkflowExecutionStatus.COMPLETED
    work = await child_input(client, child_id)
    assert work.work.effect_id == "write" and work.work.hook == "detacher"
    assert work.work.payload == {"effect": "write", "steps": ["quote-acme"]}
    assert work.effect.status is EffectStatus.PENDING  # as announced
    assert [(c.effect_id, c.workflow_id, c.request_id, c.attempt) for c in detacher.calls] == [
        ("write", out.workflow_id, out.workflow_id, 1)
    ]

    # Pending when the hook returned; succeeded under the same id, one card, in the live record...
    expected = {"wrote": {"effect": "write", "steps": ["quote-acme"]}}
    assert live.effect("write").status is EffectStatus.SUCCEEDED
    for record in (live, out.record):
        (effect,) = effects_with_id(record, "write")
        assert (effect.status, effect.data, effect.summary, effect.error) == (
            "succeeded",
            expected,
            "wrote write",
            None,
        )
        assert (effect.name, effect.hook, effect.stage) == ("Write write", "detacher", Stage.AFTER_EXECUTION)
        assert effect.started_at is not None and effect.duration_ms is not None and effect.duration_ms >= 0
    assert child_effect == out.record.effect("write")
    (invocation,) = out.record.invocations(Stage.AFTER_EXECUTION, "detacher")
    assert invocation.outcome == "succeeded"

    # ... and in the store: still one card.
    stored = await stored_terminal(out, "write")
    (effect,) = effects_with_id(stored, "write")
    assert (effect.status, effect.data, effect.error) == ("succeeded", expected, None)
    assert stored.status is RequestStatus.SUCCEEDED


async def test_a_hook_that_detaches_without_run_detached_fails_open_and_starts_nothing(client, tmp_path):
    class NoWorker(PipelineHook):
        name = "no-worker"
        max_attempts = 1

        async def after_execution(self, ctx, execution):
            ctx.detach("orphan", name="Orphan", payload={})

    async with Harness(client, tmp_path, hooks=[NoWorker()], planner=one_quote()) as h:
        out = await h.run(QUOTE)

    assert out.failure is None
    (invocation,) = out.record.invocations(Stage.AFTER_EXECUTION, "no-worker")
    assert invocation.outcome == "failed" and "implements no run_detached" in invocation.error
    assert decision(invocation) == ("fail_open", "continue", "hook_error")
    assert child_starts(out) == []
    assert out.record.effects == []  # detach refused before announcing anything


class BeforePlanningDetacher(PipelineHook):
    """Detaches ``prefetch`` at before_planning; ``gate`` holds the work until the test opens it."""

    name = "early-detacher"

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate

    async def before_planning(self, ctx):
        ctx.detach("prefetch", name="Prefetch", payload={"request": ctx.request}, data={"queued": True})

    async def run_detached(self, work: DetachedContext) -> DetachedWorkResult:
        if self.gate is not None:
            await self.gate.wait()
        return DetachedWorkResult(data={"prefetched": work.payload["request"]}, summary="prefetched")


async def test_an_effect_completing_while_the_request_waits_at_a_checkpoint(client, tmp_path):
    marked = quote("quote-acme", "ACME")
    marked.metadata = {"approval_required": "every quote is reviewed"}
    async with Harness(client, tmp_path, hooks=[BeforePlanningDetacher()], planner=FixedPlanner(marked)) as h:
        handle = await h.start(QUOTE)
        checkpoint = await h.wait_for_checkpoint(handle)
        child = client.get_workflow_handle(detached_workflow_id(handle.id, "prefetch"), result_type=PipelineHookEffect)
        await child.result()
        h.histories.append(await child.fetch_history())
        # Suspended at the checkpoint: the store's newest snapshot has the effect update merged over it...
        suspended = await eventually(
            lambda: h.store.get(handle.id),
            lambda r: r is not None and r.lifecycle is not None and r.lifecycle.boundary == "checkpoint_opened",
        )
        assert suspended.status is RequestStatus.SUSPENDED and suspended.request_completion == "pending"
        (effect,) = effects_with_id(suspended, "prefetch")
        assert effect.status is EffectStatus.SUCCEEDED and effect.data == {"prefetched": QUOTE}
        assert suspended.record_revision == suspended.lifecycle.snapshot_revision + 1
        # ... and the waiting request received the same update.
        live = await handle.query("execution_record", result_type=ExecutionRecord)
        (effect,) = effects_with_id(live, "prefetch")
        assert effect.status is EffectStatus.SUCCEEDED and live.checkpoints[0].status == "pending"
        await handle.signal("approve", ApproveSignal(checkpoint_id=checkpoint.checkpoint_id, reviewer="rita"))
        out = await h.finish(handle)

    assert out.failure is None
    stored = await out.stored()
    (effect,) = effects_with_id(stored, "prefetch")
    assert effect.status is EffectStatus.SUCCEEDED and effect.summary == "prefetched"
    assert stored.status is RequestStatus.SUCCEEDED and stored.lifecycle.boundary == "terminal"
    assert stored.record_revision == stored.lifecycle.snapshot_revision + 1 == suspended.record_revision + 1
    (start,) = child_starts(out)
    assert start.parent_close_policy == ParentClosePolicy.PARENT_CLOSE_POLICY_ABANDON


# --------------------------------------------------------------------------------------------------
# The evidence table — invocation status beside effect status at each point in time — with the demo AuditHook
# --------------------------------------------------------------------------------------------------


class ScriptedAuditWriter(JsonlAuditWriter):
    """The demo's JSON-lines writer, held by ``gate`` and optionally failing every write."""

    def __init__(self, path, *, gate: asyncio.Event | None = None, fail_with: str | None = None, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.gate = gate
        self.fail_with = fail_with
        self.admitted = 0
        self.writes = 0

    def admit(self, record):
        super().admit(record)
        self.admitted += 1

    async def write(self, record, *, key):
        self.writes += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise OSError(self.fail_with)
        return await super().write(record, key=key)


def audit_invocation(record: ExecutionRecord):
    (invocation,) = record.invocations(Stage.AFTER_EXECUTION, "application-audit")
    return invocation


async def test_audit_submission_accepted_is_pending_then_the_writer_succeeds(client, tmp_path):
    gate = asyncio.Event()
    writer = ScriptedAuditWriter(tmp_path / "audit.jsonl", gate=gate)
    async with Harness(client, tmp_path, hooks=[AuditHook(writer)], planner=one_quote()) as h:
        out = await h.run(QUOTE)
        # Submission accepted, write still running: invocation succeeded, effect pending.
        invocation = audit_invocation(out.record)
        assert invocation.outcome == "succeeded" and decision(invocation) == ("fail_open", "continue", "accepted")
        (pending,) = effects_with_id(out.record, AUDIT_EFFECT_ID)
        assert pending.status is EffectStatus.PENDING and pending.data == {"step_count": 1}
        assert pending.name == "Application audit write" and pending.error is None
        before = await out.stored()
        assert before.effect(AUDIT_EFFECT_ID).status is EffectStatus.PENDING
        assert not (tmp_path / "audit.jsonl").exists()

        gate.set()
        stored = await stored_terminal(out, AUDIT_EFFECT_ID)
        await finish_child(h, client, out, AUDIT_EFFECT_ID)

    # Writer reports success: the invocation is still succeeded, the same effect is succeeded.
    assert audit_invocation(stored).outcome == "succeeded"
    (effect,) = effects_with_id(stored, AUDIT_EFFECT_ID)
    assert effect.status is EffectStatus.SUCCEEDED and effect.error is None
    assert effect.summary == "Audit writer acknowledged completion"
    assert effect.data["written"] is True and effect.data["step_count"] == 1
    assert effect.data["workflow_id"] == out.workflow_id and effect.data["tools"] == ["stock-service/stock_quote"]
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 1 and f'"key": "{out.workflow_id}:{out.record.run_id}:{AUDIT_EFFECT_ID}"' in lines[0]
    assert writer.writes == 1


async def test_audit_writer_failure_fails_the_effect_after_the_child_retries(client, tmp_path):
    writer = ScriptedAuditWriter(tmp_path / "audit.jsonl", fail_with="audit store is read-only")
    async with Harness(client, tmp_path, hooks=[AuditHook(writer)], planner=one_quote()) as h:
        out = await h.run(QUOTE)
        stored = await stored_terminal(out, AUDIT_EFFECT_ID)
        await finish_child(h, client, out, AUDIT_EFFECT_ID)

    assert out.failure is None
    # The writer failed: the invocation is still succeeded, the effect failed with the writer's error.
    assert audit_invocation(stored).outcome == "succeeded"
    (effect,) = effects_with_id(stored, AUDIT_EFFECT_ID)
    assert effect.status is EffectStatus.FAILED
    assert effect.error == "audit store is read-only"
    assert stored.status is RequestStatus.SUCCEEDED
    # Every attempt the child allows was used, and no more.
    work = await child_input(client, detached_workflow_id(out.workflow_id, AUDIT_EFFECT_ID))
    assert writer.writes == work.max_attempts > 1
    assert not (tmp_path / "audit.jsonl").exists()


async def test_audit_submission_refused_fails_the_invocation_open_and_the_effect_without_a_child(client, tmp_path):
    writer = ScriptedAuditWriter(tmp_path / "audit.jsonl", max_record_bytes=10)
    async with Harness(client, tmp_path, hooks=[AuditHook(writer)], planner=one_quote()) as h:
        out = await h.run(QUOTE)

    assert out.failure is None and "ACME is trading at" in out.result.response
    stored = await out.stored()
    for record in (out.record, stored):
        invocation = audit_invocation(record)
        assert invocation.outcome == "failed" and invocation.error_type == "HookError"
        assert "the writer admits at most 10" in invocation.error
        assert decision(invocation) == ("fail_open", "continue", "hook_error")
        (effect,) = effects_with_id(record, AUDIT_EFFECT_ID)
        assert effect.status is EffectStatus.FAILED and effect.error == invocation.error
    assert writer.admitted == 0 and writer.writes == 0
    # Nothing was started: no child event in the history, no such execution on the server.
    assert child_starts(out) == []
    with pytest.raises(RPCError) as err:
        await client.get_workflow_handle(detached_workflow_id(out.workflow_id, AUDIT_EFFECT_ID)).describe()
    assert err.value.status is RPCStatusCode.NOT_FOUND
    assert not (tmp_path / "audit.jsonl").exists()


# --------------------------------------------------------------------------------------------------
# Late updates: after the request completed
# --------------------------------------------------------------------------------------------------


async def test_an_effect_completes_after_the_request_and_the_stored_record_grows_by_one(client, tmp_path):
    gate = asyncio.Event()
    detacher = Detacher("write", gate=gate)
    async with Harness(client, tmp_path, hooks=[detacher], planner=one_quote()) as h:
        out = await h.run(QUOTE)
        # The request returned while its detached work is held.
        assert out.failure is None and out.result.steps[0].status == "succeeded"
        child = client.get_workflow_handle(detached_workflow_id(out.workflow_id, "write"))
        assert (await child.describe()).status is WorkflowExecutionStatus.RUNNING
        assert out.record.effect("write").status is EffectStatus.PENDING
        terminal = await out.stored()
        assert terminal.status is RequestStatus.SUCCEEDED and terminal.request_completion == "completed"
        (pending,) = effects_with_id(terminal, "write")
        assert pending.status is EffectStatus.PENDING
        assert terminal.record_revision == terminal.lifecycle.snapshot_revision == out.record.record_revision

        gate.set()
        stored = await stored_terminal(out, "write")
        await finish_child(h, client, out, "write")

    (effect,) = effects_with_id(stored, "write")
    assert effect.status is EffectStatus.SUCCEEDED and effect.summary == "wrote write"
    assert effect.started_at == pending.started_at  # the same card, brought to its terminal state
    assert stored.status is RequestStatus.SUCCEEDED and stored.request_completion == "completed"
    assert stored.lifecycle == terminal.lifecycle
    assert stored.record_revision == terminal.record_revision + 1
    assert stored.final_response == out.result.response
    # The late update tried the (finished) request first; its history does not change.
    assert events(out, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED) == []


class BrokenSynthesizer:
    name = "broken-synthesizer"

    async def synthesize(self, input):
        raise ApplicationError("model unavailable", non_retryable=True)


async def test_a_failed_request_stays_failed_after_a_late_effect_update(client, tmp_path):
    gate = asyncio.Event()
    async with Harness(
        client, tmp_path, hooks=[Detacher("write", gate=gate)], planner=one_quote(), synthesizer=BrokenSynthesizer()
    ) as h:
        out = await h.run(QUOTE)
        assert out.failure is not None and out.failure.type == "SynthesisFailed"
        terminal = await out.stored()
        assert terminal.status is RequestStatus.FAILED and terminal.request_completion == "failed"
        assert terminal.effect("write").status is EffectStatus.PENDING

        gate.set()
        stored = await stored_terminal(out, "write")
        await finish_child(h, client, out, "write")

    assert stored.effect("write").status is EffectStatus.SUCCEEDED
    assert stored.status is RequestStatus.FAILED and stored.request_completion == "failed"
    assert stored.error == terminal.error and stored.error.type == "SynthesisFailed"
    assert stored.final_response is None
    assert stored.record_revision == terminal.record_revision + 1


class HeldTool(Tool):
    """A tool that waits until it is cancelled."""

    namespace = "test-tools"
    agent = "slow-service"
    capability = "wait"
    Arguments = NoArguments

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def run(self, arguments, ctx):
        self.entered.set()
        await asyncio.Event().wait()


async def test_a_cancelled_request_stays_cancelled_after_a_late_effect_update(client, tmp_path):
    gate, tool = asyncio.Event(), HeldTool()
    planner = FixedPlanner(PlanStep(step_id="wait", namespace="test-tools", agent="slow-service", capability="wait"))
    async with Harness(client, tmp_path, hooks=[BeforePlanningDetacher(gate)], tools=[tool], planner=planner) as h:
        handle = await h.start(QUOTE)
        await asyncio.wait_for(tool.entered.wait(), 60)
        await handle.cancel()
        out = await h.finish(handle)
        assert isinstance(out.failure, CancelledError)
        terminal = await out.stored()
        assert terminal.status is RequestStatus.CANCELLED and terminal.request_completion == "cancelled"
        assert terminal.effect("prefetch").status is EffectStatus.PENDING
        # The abandoned child outlives the cancelled request.
        child = client.get_workflow_handle(detached_workflow_id(out.workflow_id, "prefetch"))
        assert (await child.describe()).status is WorkflowExecutionStatus.RUNNING

        gate.set()
        stored = await stored_terminal(out, "prefetch")
        await finish_child(h, client, out, "prefetch")

    (effect,) = effects_with_id(stored, "prefetch")
    assert effect.status is EffectStatus.SUCCEEDED and effect.data == {"prefetched": QUOTE}
    assert stored.status is RequestStatus.CANCELLED and stored.request_completion == "cancelled"
    assert stored.error == terminal.error and stored.error.type == "Cancelled"
    assert stored.record_revision == terminal.record_revision + 1


async def test_a_late_failure_is_recorded_on_the_same_card(client, tmp_path):
    gate = asyncio.Event()
    detacher = Detacher("write", gate=gate, fail_with=ApplicationError("ledger rejected", non_retryable=True))
    async with Harness(client, tmp_path, hooks=[detacher], planner=one_quote()) as h:
        out = await h.run(QUOTE)
        terminal = await out.stored()
        gate.set()
        stored = await stored_terminal(out, "write")
        await finish_child(h, client, out, "write")

    (effect,) = effects_with_id(stored, "write")
    assert effect.status is EffectStatus.FAILED and effect.error == "ledger rejected"
    assert effect.data == {"queued": "write"}  # what the hook announced; the failed work reported nothing
    assert [c.attempt for c in detacher.calls] == [1]  # non-retryable: one attempt
    assert detacher_invocation_succeeded(stored)
    assert stored.status is RequestStatus.SUCCEEDED
    assert stored.record_revision == terminal.record_revision + 1


def detacher_invocation_succeeded(record: ExecutionRecord) -> bool:
    (invocation,) = record.invocations(Stage.AFTER_EXECUTION, "detacher")
    return invocation.outcome == "succeeded"


async def test_concurrent_late_updates_both_survive(client, tmp_path):
    gate = asyncio.Event()
    detacher = Detacher("write-a", "write-b", gate=gate)
    async with Harness(client, tmp_path, hooks=[detacher], planner=one_quote()) as h:
        out = await h.run(QUOTE)
        assert out.failure is None
        terminal = await out.stored()
        assert [(e.effect_id, e.status.value) for e in terminal.effects] == [
            ("write-a", "pending"),
            ("write-b", "pending"),
        ]
        # Both children are waiting inside their work before either is let go.
        await eventually(lambda: asyncio.sleep(0, len(detacher.calls)), lambda n: n == 2)
        gate.set()
        stored = await stored_terminal(out, "write-a", "write-b")
        for effect_id in ("write-a", "write-b"):
            await finish_child(h, client, out, effect_id)

    assert {c.effect_id for c in detacher.calls} == {"write-a", "write-b"}
    assert [e.effect_id for e in stored.effects] == ["write-a", "write-b"]
    for effect_id in ("write-a", "write-b"):
        (effect,) = effects_with_id(stored, effect_id)
        assert effect.status is EffectStatus.SUCCEEDED
        assert effect.data == {"wrote": {"effect": effect_id, "steps": ["quote-acme"]}}
    assert stored.status is RequestStatus.SUCCEEDED
    assert stored.record_revision == terminal.record_revision + 2
    assert {s.workflow_id for s in child_starts(out)} == {
        f"{out.workflow_id}/effect/write-a",
        f"{out.workflow_id}/effect/write-b",
    }
