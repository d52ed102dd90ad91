"""Small test doubles and history readers shared by the test modules."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from activities.tools import Tool, ToolContext
from demo.agent import RulePlanner
from workflows import data_converter
from workflows.detached import detached_workflow_id
from workflows.models import EffectStatus, ExecutionRecord, HookInvocation, PipelineHookEffect, Plan, PlanStep
from workflows.stages import HOOK_BATCH_ACTIVITY

from .harness import Harness, Outcome, marker_activity_type, marker_stage_activity

NS = "demo-tools"


def quote(step_id: str, symbol: str, depends_on: list[str] | None = None) -> PlanStep:
    """A demo ``stock_quote`` step."""
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="stock-service",
        capability="stock_quote",
        arguments={"symbol": symbol},
        depends_on=depends_on or [],
    )


class FixedPlanner:
    """Always plans the same steps, so each test knows the exact plan the hooks receive."""

    name = "fixed-planner"

    def __init__(self, *steps: PlanStep) -> None:
        self.steps = steps
        self.calls = 0

    async def plan(self, request) -> Plan:
        self.calls += 1
        return Plan(phase=request.phase, steps=[s.model_copy(deep=True) for s in self.steps])


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BlockingTool(Tool):
    """A tool that never returns: the request stays in its tool step until cancelled."""

    namespace = "test-tools"
    agent = "slow-service"
    capability = "wait_forever"
    Arguments = NoArguments

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def run(self, arguments, ctx: ToolContext):
        self.started.set()
        await asyncio.Event().wait()


class HeldArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = ""  # tells one held call from another: identical calls in one phase run once


class HeldTool(BlockingTool):
    """A tool that returns once the test releases it: the request waits in its tool step until then."""

    capability = "wait_for_release"
    Arguments = HeldArguments

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def run(self, arguments, ctx: ToolContext):
        self.started.set()
        await self.release.wait()
        return "released"

    @classmethod
    def step(cls, step_id: str = "held") -> PlanStep:
        return PlanStep(
            step_id=step_id,
            namespace=cls.namespace,
            agent=cls.agent,
            capability=cls.capability,
            arguments={"label": step_id},
        )


def decision(invocation: HookInvocation) -> tuple[str, str, str]:
    """(failure_policy, action, reason) of a recorded invocation."""
    d = invocation.decision
    assert d is not None, f"no decision recorded for {invocation.hook}"
    return (d.failure_policy.value, d.action.value, d.reason)


def started_attempts(out: Outcome, activity_type: str) -> list[int]:
    """The attempt of each ActivityTaskStarted of ``activity_type`` (the last attempt the server ran), or,
    for a local activity, the attempt its marker recorded — for the hooks of a batch whose stage's
    activity is ``activity_type``, the attempts each hook's entry recorded, and so for the after_planning
    hooks a planning activity ran on its plan."""
    types = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    attempts = []
    for e in out.history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            if types[e.activity_task_started_event_attributes.scheduled_event_id] == activity_type:
                attempts.append(e.activity_task_started_event_attributes.attempt)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED and activity_type == "after_planning_hook":
            done = e.activity_task_completed_event_attributes
            if types[done.scheduled_event_id] == "plan" and done.result.payloads:
                output = data_converter.payload_converter.from_payloads(done.result.payloads)[0]
                attempts.extend(entry.get("attempts", 1) for entry in output.get("after", []))
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = e.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity" and "data" in marker.details:
                converter = data_converter.payload_converter
                data = converter.from_payloads(marker.details["data"].payloads)[0]
                kind = marker_activity_type(marker)
                if kind == activity_type:
                    attempts.append(data["attempt"])
                elif kind == HOOK_BATCH_ACTIVITY and marker_stage_activity(marker) == activity_type:
                    result = converter.from_payloads(marker.details["result"].payloads)[0]
                    attempts.extend(entry["attempts"] for entry in result["entries"])
    return attempts


class CapturingPlanner(RulePlanner):
    """The demo's rule planner, keeping every prompt it was given."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def plan(self, request) -> Plan:
        self.prompts.append(request.prompt)
        return await super().plan(request)


async def eventually(check: Callable[[], Awaitable[Any]], *, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy (visibility and the store are read while the
    workflow moves on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def span_decision(span) -> tuple[str, str, str]:
    """(failure_policy, action, reason) a hook span carries."""
    attrs = span.attributes
    return (
        attrs["pipeline.hook.decision.failure_policy"],
        attrs["pipeline.hook.decision.action"],
        attrs["pipeline.hook.decision.reason"],
    )


async def stored_effects(out: Outcome, *effect_ids: str) -> ExecutionRecord:
    """The stored record once every named effect is terminal there (a detached effect that finishes after
    the request is merged into the stored record)."""

    async def terminal() -> ExecutionRecord | None:
        record = await out.stored()
        if record is None:
            return None
        done = all((e := record.effect(i)) is not None and e.status is not EffectStatus.PENDING for i in effect_ids)
        return record if done else None

    return await eventually(terminal, timeout=30, what=f"effects {effect_ids} terminal in the stored record")


async def effect_child(h: Harness, client: Client, out: Outcome, effect_id: str) -> WorkflowHistory:
    """The finished history of an effect's ``DetachedEffect`` child (replayed with the harness's)."""
    handle = client.get_workflow_handle(
        detached_workflow_id(out.workflow_id, effect_id), result_type=PipelineHookEffect
    )
    await handle.result()
    history = await handle.fetch_history()
    h.histories.append(history)
    return history
