"""Baselines the lifecycle is measured against, registered on the same worker so all pay the same server,
worker, interceptor and data-converter costs.

- ``BenchFloor``: empty activities in a given shape, each carrying a payload of a given size: what
  Temporal itself costs for that many activities and bytes.
- ``BenchInlinePeer``: what the agent integrations that ship with Temporal's SDK do: hooks run inline in
  workflow code (no activity, no record entry, no span of their own) around the same ``plan``,
  ``execute_tool_step`` and ``synthesize`` activities the lifecycle schedules, with the same inputs.

The runner is :mod:`benchmarks.lifecycle_bench` (``python -m benchmarks.lifecycle_bench``); its worker
process is :mod:`benchmarks.bench_worker`.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from workflows.models import (
        ExecutionResult,
        Plan,
        PlanInput,
        PlanOutput,
        StepResult,
        StepStatus,
        SynthesizeInput,
        SynthesizeOutput,
        ToolStepInput,
        ToolStepOutput,
    )

FLOOR_WORKFLOW_TYPE = "BenchFloor"
FLOOR_ACTIVITY = "bench_floor_noop"
PEER_WORKFLOW_TYPE = "BenchInlinePeer"

__all__ = [
    "FLOOR_ACTIVITY",
    "FLOOR_WORKFLOW_TYPE",
    "PEER_WORKFLOW_TYPE",
    "FloorBatch",
    "FloorInput",
    "FloorWorkflow",
    "InlinePeerWorkflow",
    "PeerInput",
    "floor_noop",
]

_TIMEOUT = timedelta(seconds=30)
_RETRY = RetryPolicy(maximum_attempts=3)


class FloorBatch(BaseModel):
    """``count`` empty activities started together (``count > 1`` runs them in parallel), each sent about
    ``payload_bytes`` and returning about ``result_bytes``."""

    count: int = Field(default=1, ge=1)
    local: bool = False
    payload_bytes: int = Field(default=0, ge=0)
    result_bytes: int = Field(default=0, ge=0)


class FloorInput(BaseModel):
    """The batches to run, one after another."""

    batches: list[FloorBatch] = Field(default_factory=list)

    @property
    def activity_count(self) -> int:
        return sum(b.count for b in self.batches)


@activity.defn(name=FLOOR_ACTIVITY)
async def floor_noop(payload: str, result_bytes: int) -> str:
    """The empty activity: ignores what it was sent, returns ``result_bytes`` bytes."""
    return "x" * result_bytes


@workflow.defn(name=FLOOR_WORKFLOW_TYPE)
class FloorWorkflow:
    """Runs empty activities in the given shape and nothing else: the bare Temporal cost."""

    @workflow.run
    async def run(self, input: FloorInput) -> int:
        done = 0
        for batch in input.batches:
            args = ["x" * batch.payload_bytes, batch.result_bytes]
            if batch.local:
                calls = [
                    workflow.execute_local_activity(
                        FLOOR_ACTIVITY, args=args, result_type=str, start_to_close_timeout=_TIMEOUT, retry_policy=_RETRY
                    )
                    for _ in range(batch.count)
                ]
            else:
                calls = [
                    workflow.execute_activity(
                        FLOOR_ACTIVITY, args=args, result_type=str, start_to_close_timeout=_TIMEOUT, retry_policy=_RETRY
                    )
                    for _ in range(batch.count)
                ]
            await asyncio.gather(*calls)
            done += batch.count
        return done


class PeerInput(BaseModel):
    """A request for the inline peer and how many inline hooks run at each of its four stages."""

    request: str
    before_planning: int = 0
    after_planning: int = 0
    after_execution: int = 0
    after_synthesis: int = 0


# The peer's hooks: plain coroutines called from workflow code, as an integration's in-workflow hooks
# are. Each does what the lifecycle benchmark's trivial hooks do: nothing but return what its stage expects.


async def _before_planning(enrichments: dict) -> None:
    return None


async def _after_planning(plan: Plan) -> Plan:
    return plan


async def _after_execution(execution: ExecutionResult) -> None:
    return None


async def _after_synthesis(response: str) -> str:
    return response


@workflow.defn(name=PEER_WORKFLOW_TYPE)
class InlinePeerWorkflow:
    """Plan, run the plan's steps in parallel, synthesize: the lifecycle's activities with its inputs, and
    the hooks inline between them."""

    @workflow.run
    async def run(self, input: PeerInput) -> str:
        workflow_id = workflow.info().workflow_id
        enrichments: dict = {}
        for _ in range(input.before_planning):
            await _before_planning(enrichments)
        planned = await workflow.execute_activity(
            "plan",
            PlanInput(request=input.request, request_id=workflow_id, workflow_id=workflow_id, enrichments=enrichments),
            result_type=PlanOutput,
            start_to_close_timeout=_TIMEOUT,
            retry_policy=_RETRY,
        )
        plan = planned.plan
        for _ in range(input.after_planning):
            plan = await _after_planning(plan)
        outputs = await asyncio.gather(
            *(
                workflow.execute_activity(
                    "execute_tool_step",
                    ToolStepInput(step=step, request_id=workflow_id, idempotency_key=f"{workflow_id}:{step.step_id}"),
                    result_type=ToolStepOutput,
                    start_to_close_timeout=_TIMEOUT,
                    retry_policy=_RETRY,
                )
                for step in plan.steps
            )
        )
        execution = ExecutionResult(
            steps=[
                StepResult(
                    step_id=step.step_id,
                    tool=step.tool,
                    status=StepStatus.SUCCEEDED,
                    result=json.dumps(out.output, separators=(",", ":")),
                )
                for step, out in zip(plan.steps, outputs, strict=True)
            ]
        )
        for _ in range(input.after_execution):
            await _after_execution(execution)
        synthesized = await workflow.execute_activity(
            "synthesize",
            SynthesizeInput(
                request=input.request, request_id=workflow_id, plan=plan, execution=execution, enrichments=enrichments
            ),
            result_type=SynthesizeOutput,
            start_to_close_timeout=_TIMEOUT,
            retry_policy=_RETRY,
        )
        response = synthesized.response
        for _ in range(input.after_synthesis):
            response = await _after_synthesis(response)
        return response
