"""Cancelling a request still leaves a persisted record that says so."""

from __future__ import annotations

import asyncio

from temporalio.exceptions import CancelledError

from workflows.models import Plan, PlanStep, RequestStatus

from .doubles import BlockingTool
from .harness import Harness


class OneStepPlanner:
    name = "one-step"

    async def plan(self, request) -> Plan:
        return Plan(
            steps=[PlanStep(step_id="wait", namespace="test-tools", agent="slow-service", capability="wait_forever")]
        )


async def test_cancelled_request_persists_a_cancelled_record(client, tmp_path):
    tool = BlockingTool()
    async with Harness(client, tmp_path, tools=[tool], planner=OneStepPlanner()) as h:
        handle = await h.start("wait for me")
        await asyncio.wait_for(tool.started.wait(), timeout=30)
        await handle.cancel()
        out = await h.finish(handle)

    assert isinstance(out.failure, CancelledError)
    assert out.activity_types()[-1] == "persist_execution_record"
    stored = await out.stored()
    assert stored.status is RequestStatus.CANCELLED
    assert stored.error.type == "Cancelled"
    assert stored.record_revision == 2  # accepted plan, then terminal
    assert stored.request_completion == "cancelled"
    assert out.record.status is RequestStatus.CANCELLED
