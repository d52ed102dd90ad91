"""Whatever arrives at an entry point — the workflow input, a signal, an update, a query — ends within
seconds in a typed failure or in an ignore kept (bounded) in the record: no payload, several payloads,
another encoding than JSON, wrong types, very large or very many payloads. A workflow task that fails
and retries forever is the one outcome that must never happen, so every test also checks the history
for failed workflow tasks."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowQueryFailedError, WorkflowUpdateFailedError
from temporalio.common import RawValue

from workflows.models import (
    MAX_IGNORED_FIELD_CHARS,
    MAX_IGNORED_MESSAGES,
    EffectStatus,
    ExecutionRecord,
    PipelineHookEffect,
    PlanStep,
    RequestResult,
    RequestStatus,
)

from .doubles import FixedPlanner, eventually
from .harness import Harness

MESSAGE = PlanStep(
    step_id="notify",
    namespace="demo-tools",
    agent="notify-service",
    capability="send_message",
    arguments={"to": "alice", "text": "hello"},
)


def raw(encoding: bytes, data: bytes = b"") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


BAD_INPUTS = {
    "no payload": [],
    "two payloads": [{"request": "What is the price of ACME?"}, {"request": "again"}],
    "binary, not JSON": [raw(b"binary/plain", b"\x00\x01\x02")],
    "an unknown encoding": [raw(b"application/x-made-up", b"{}")],
    "a protobuf payload": [raw(b"json/protobuf", b"{}")],
    "JSON null": [raw(b"binary/null")],
    "JSON that does not parse": [raw(b"json/plain", b'{"request": ')],
    "a JSON list": [["What is the price of ACME?"]],
    "wrong types": [{"request": 42, "metadata": "none"}],
}


def failed_workflow_tasks(history) -> int:
    return sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in history.events)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
async def test_a_malformed_workflow_input_fails_the_request_at_once_with_invalid_request(client, tmp_path, case):
    async with Harness(client, tmp_path) as h:
        handle = await client.start_workflow(
            "RequestLifecycle",
            args=BAD_INPUTS[case],
            id=f"bad-{uuid.uuid4()}",
            task_queue=h.task_queue,
            result_type=RequestResult,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=10)
        history = await handle.fetch_history()
        h.histories.append(history)
        record = await handle.query("execution_record", result_type=ExecutionRecord)

    assert failed.value.cause.type == "InvalidRequest" and failed.value.cause.non_retryable
    assert failed_workflow_tasks(history) == 0
    assert record.status is RequestStatus.FAILED and record.error.type == "InvalidRequest"
    assert not [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]


async def waiting_request(h: Harness, leftovers: list[WorkflowHandle]) -> tuple[WorkflowHandle, str]:
    handle = await h.start("Send a message to alice")
    leftovers.append(handle)
    checkpoint = await h.wait_for_checkpoint(handle)
    return handle, checkpoint.checkpoint_id


async def record_of(handle: WorkflowHandle) -> ExecutionRecord:
    return await handle.query("execution_record", result_type=ExecutionRecord)


async def test_malformed_signals_are_ignored_with_their_reason_and_the_request_goes_on(client, tmp_path, leftovers):
    async with Harness(client, tmp_path, planner=FixedPlanner(MESSAGE)) as h:
        handle, cp = await waiting_request(h, leftovers)
        huge = {"checkpoint_id": cp, "reviewer": "alice", "comment": "x" * 100_000}
        sent = [
            ("approve", []),
            ("approve", [{"checkpoint_id": cp, "reviewer": "alice"}, {"checkpoint_id": cp, "reviewer": "bob"}]),
            ("approve", [raw(b"binary/plain", b"approve!")]),
            ("reject", [raw(b"application/x-made-up", b"{}")]),
            ("reject", [raw(b"json/plain", b"{not json")]),
            ("approve", [["a", "list"]]),
            ("approve", [{"checkpoint_id": cp, "reviewer": {"name": "alice"}}]),
            ("approve", [huge]),
            ("approve", [{"checkpoint_id": "c" * 5000, "reviewer": "r" * 5000}]),
            ("effect_update", [{"effect_id": "audit-write"}]),
            ("no_such_signal", [{"hello": "world"}]),
        ]
        for name, args in sent:
            await handle.signal(name, args=args)

        record = await eventually(
            lambda: _with_ignored(handle, len(sent)), what="every malformed signal to be recorded as ignored"
        )
        assert await handle.query("pending_checkpoint") is not None  # nothing was decided
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice", "comment": "ok"})
        out = await h.finish(handle)

    reasons = [i.reason for i in record.ignored_reviews]
    assert "expected one JSON payload, got 0" in reasons[0] and "got 2" in reasons[1]
    assert "not JSON" in reasons[2] and "not JSON" in reasons[3] and "not valid JSON" in reasons[4]
    assert "invalid ApproveSignal" in reasons[5] and "reviewer" in reasons[6]
    assert "the limit is 16384" in reasons[7]
    assert "invalid ApproveSignal" in reasons[8]  # ids longer than the model allows
    assert "invalid EffectUpdateSignal" in reasons[9]
    assert record.ignored_reviews[10].via == "no_such_signal" and "no signal named" in reasons[10]
    assert all(
        len(getattr(i, f)) <= MAX_IGNORED_FIELD_CHARS
        for i in record.ignored_reviews
        for f in ("checkpoint_id", "reviewer", "reason")
    )
    assert out.failure is None and [c.status.value for c in out.record.checkpoints] == ["approved"]
    assert failed_workflow_tasks(out.history) == 0
    assert (await out.stored()).status is RequestStatus.SUCCEEDED  # the terminal persist fitted


async def _with_ignored(handle: WorkflowHandle, count: int) -> ExecutionRecord | None:
    record = await record_of(handle)
    return record if len(record.ignored_reviews) >= count else None


async def test_a_flood_of_signals_keeps_a_bounded_record_and_the_request_finishes(client, tmp_path, leftovers):
    async with Harness(client, tmp_path, planner=FixedPlanner(MESSAGE)) as h:
        handle, cp = await waiting_request(h, leftovers)
        flood = 80
        await asyncio.gather(
            *(
                handle.signal("reject", {"checkpoint_id": f"cp-x-{i}", "reviewer": "z" * 120, "reason": "y" * 1900})
                for i in range(flood)
            )
        )

        async def all_counted() -> ExecutionRecord | None:
            record = await record_of(handle)
            return record if len(record.ignored_reviews) + record.ignored_dropped >= flood else None

        record = await eventually(all_counted, what="the flood to be processed")
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice"})
        out = await h.finish(handle)

    assert (
        len(record.ignored_reviews) == MAX_IGNORED_MESSAGES and record.ignored_dropped == flood - MAX_IGNORED_MESSAGES
    )
    assert out.failure is None and failed_workflow_tasks(out.history) == 0
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED and stored.ignored_dropped == flood - MAX_IGNORED_MESSAGES
    assert len(stored.model_dump_json()) < 200_000  # bounded in bytes, not just in count


async def test_malformed_reviews_are_refused_before_acceptance_with_a_typed_error(client, tmp_path, leftovers):
    async with Harness(client, tmp_path, planner=FixedPlanner(MESSAGE)) as h:
        handle, cp = await waiting_request(h, leftovers)
        bad = [
            [],
            [{"checkpoint_id": cp, "reviewer": "alice", "decision": "approve"}, {"x": 1}],
            [raw(b"binary/plain", b"approve")],
            [{"checkpoint_id": cp, "reviewer": "alice", "decision": "maybe"}],
            [{"checkpoint_id": cp, "reviewer": "alice", "decision": "approve", "comment": "x" * 50_000}],
        ]
        for args in bad:
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await asyncio.wait_for(handle.execute_update("review", args=args), timeout=10)
            assert refused.value.cause.type == "InvalidReview", args
        assert await handle.query("pending_checkpoint") is not None
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice"})
        out = await h.finish(handle)

    assert out.failure is None and failed_workflow_tasks(out.history) == 0


async def test_queries_with_arguments_fail_with_a_typed_error_and_change_nothing(client, tmp_path, leftovers):
    async with Harness(client, tmp_path, planner=FixedPlanner(MESSAGE)) as h:
        handle, cp = await waiting_request(h, leftovers)
        for args in ([{"x": 1}], [raw(b"binary/plain", b"?")], ["a", "b", "c"]):
            with pytest.raises(WorkflowQueryFailedError, match="takes no arguments"):
                await handle.query("execution_record", args=args)
        with pytest.raises(WorkflowQueryFailedError):
            await handle.query("no_such_query")
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice"})
        out = await h.finish(handle)

    assert out.failure is None and failed_workflow_tasks(out.history) == 0


async def test_only_the_requests_own_detached_child_can_complete_its_effect(client, tmp_path, leftovers):
    """A forged ``effect_update`` — for an effect the request never detached, or without the token the
    request gave its child — is ignored; the child's own update still lands."""
    from hooks import PipelineHook
    from hooks.builtin import AuditHook, JsonlAuditWriter

    class Hold(PipelineHook):
        name = "hold"
        timeout_seconds = 60

        def __init__(self) -> None:
            self.release = asyncio.Event()

        async def after_synthesis(self, ctx, response):
            await self.release.wait()
            return response

    hold = Hold()
    hooks = [AuditHook(JsonlAuditWriter(tmp_path / "audit.jsonl")), hold]
    async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(MESSAGE)) as h:
        handle, cp = await waiting_request(h, leftovers)
        await handle.signal("approve", {"checkpoint_id": cp, "reviewer": "alice"})

        async def announced() -> ExecutionRecord | None:
            record = await record_of(handle)
            return record if record.effect("audit-write") is not None else None

        effect = (await eventually(announced, what="the audit effect to be announced")).effect("audit-write")
        forged = effect.model_copy(update={"status": EffectStatus.FAILED, "summary": "forged"}).model_dump(mode="json")
        invented = PipelineHookEffect(effect_id="invented", name="invented", status=EffectStatus.SUCCEEDED).model_dump(
            mode="json"
        )
        for payload in (
            {"effect": forged, "token": ""},
            {"effect": forged, "token": "0" * 32},
            {"effect": invented, "token": "0" * 32},
        ):
            await handle.signal("effect_update", payload)

        async def forgeries_ignored() -> ExecutionRecord | None:
            record = await record_of(handle)
            return record if sum(i.via == "effect_update" for i in record.ignored_reviews) == 3 else None

        record = await eventually(forgeries_ignored, what="the forged updates to be ignored")
        hold.release.set()
        out = await h.finish(handle)
        stored = await eventually(lambda: _settled(out), what="the detached child to report")

    assert out.failure is None
    reasons = [i.reason for i in record.ignored_reviews if i.via == "effect_update"]
    assert reasons.count("the update does not come from the effect's own DetachedEffect child") == 2
    assert reasons[2] == "this request handed no detached work to that effect"
    effect = stored.effect("audit-write")
    assert effect.status is EffectStatus.SUCCEEDED and effect.summary != "forged"
    assert out.record.effect("invented") is None and stored.effect("invented") is None


async def _settled(out):
    stored = await out.stored()
    effect = stored.effect("audit-write") if stored else None
    return stored if effect is not None and effect.status is not EffectStatus.PENDING else None
