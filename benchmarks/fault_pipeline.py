"""The demo pipeline with slowed, observable points: what the fault suite's workers run.

    AGENT_PIPELINE=benchmarks.fault_pipeline:build_activities \\
    AGENT_FAULT_DIR=/tmp/faults AGENT_FAULT_DELAY_SECONDS=1 python worker.py

:func:`build_activities` builds exactly the demo's pipeline (``demo.pipeline.build_activities``: same
hooks in the same order, same tools, planner, synthesizer, store, review settings and memory) with these
substitutions, none of which changes an outcome:

- a ``fault-probe`` hook registered first, implementing every hook stage the demo's requests reach and
  returning the neutral value of each (``None``, the plan, the response);
- each demo tool, the planner and the synthesizer wrapped, keeping their identity (tool specs, names,
  ``read_only``, ``approval_required``) so cache dimensions and idempotency keys are unchanged;
- the ``application-audit`` hook's writer wrapped, so the write in the ``DetachedEffect`` child's
  ``run_detached_work`` activity is slowed too.

Each slowed point, when it runs inside a worker, atomically creates ``<AGENT_FAULT_DIR>/<point>/<key>.<pid>.start``
(content: the wall-clock time), does its work, sleeps ``AGENT_FAULT_DELAY_SECONDS`` (an async sleep),
then creates ``<key>.<pid>.done``. ``<key>`` is the request's workflow id (made safe for a file name),
with the plan phase or the step id where a request passes the point more than once. The work comes
before the delay on purpose: a kill during the delay lands after the point's side effects (an outbox
write, an audit write) and before its completion reaches the server, which is where a retry must not
repeat them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

from temporalio import activity

import demo.pipeline
from activities import LifecycleActivities, Tool, ToolContext
from activities.planning import PlanningRequest
from client.settings import Settings
from hooks import PipelineHook
from hooks.builtin import AuditHook
from workflows.models import Plan, SynthesizeInput, SynthesizeOutput

FAULT_DIR_ENV = "AGENT_FAULT_DIR"
FAULT_DELAY_ENV = "AGENT_FAULT_DELAY_SECONDS"
PROBE_NAME = "fault-probe"

# The probe's stages, each a kill point of the same name. The demo's requests reach all of them:
# on_error only on a failed request (the refused trade), before_remember only on a completed one.
HOOK_POINTS = (
    "before_run",
    "before_planning",
    "after_planning",
    "before_tool",
    "after_tool",
    "after_execution",
    "after_synthesis",
    "after_answer",
    "before_remember",
    "on_error",
    "on_finish",
)
PLANNING, TOOL_STEP, SYNTHESIS, DETACHED_EFFECT = "planning", "tool_step", "synthesis", "detached_effect"
POINTS = (*HOOK_POINTS, PLANNING, TOOL_STEP, SYNTHESIS, DETACHED_EFFECT)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def marker_key(workflow_id: str, part: str | None = None) -> str:
    """A file-name-safe key: no dots, so ``<key>.<pid>.<kind>`` splits unambiguously."""
    key = _UNSAFE.sub("_", workflow_id)
    return f"{key}__{_UNSAFE.sub('_', part)}" if part else key


def parse_marker(name: str) -> tuple[str, int, str] | None:
    """``(key, pid, kind)`` of a marker file name, or ``None`` for anything else (temporary files)."""
    parts = name.rsplit(".", 2)
    if name.startswith(".") or len(parts) != 3 or parts[2] not in ("start", "done") or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


def scan_markers(root: Path, point: str) -> dict[str, dict[str, dict[int, float]]]:
    """The markers of one point as the suite reads them: key -> {"start": {pid: time}, "done": {pid:
    time}}. The time is the file's modification time, set once when the marker was written."""
    found: dict[str, dict[str, dict[int, float]]] = {}
    try:
        entries = list(os.scandir(root / point))
    except FileNotFoundError:
        return found
    for entry in entries:
        parsed = parse_marker(entry.name)
        if parsed is None:
            continue
        key, pid, kind = parsed
        try:
            mtime = entry.stat().st_mtime
        except FileNotFoundError:
            continue
        found.setdefault(key, {"start": {}, "done": {}})[kind][pid] = mtime
    return found


class FaultPoints:
    """Where markers go and how long each slowed point lasts. Without a directory nothing is written."""

    def __init__(self, directory: str | Path | None, delay_seconds: float = 0.0) -> None:
        self.directory = Path(directory) if directory else None
        self.delay_seconds = max(0.0, delay_seconds)

    @classmethod
    def from_env(cls) -> FaultPoints:
        return cls(os.environ.get(FAULT_DIR_ENV) or None, float(os.environ.get(FAULT_DELAY_ENV) or 0))

    def _mark(self, point: str, key: str, kind: str) -> None:
        if self.directory is None:
            return
        folder = self.directory / point
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{key}.{os.getpid()}.{kind}"
        # Written under a hidden name and renamed: the suite never reads a half-written marker.
        temporary = folder / f".{name}.tmp"
        temporary.write_text(f"{time.time():.6f}\n", encoding="utf-8")
        os.replace(temporary, folder / name)

    @contextlib.asynccontextmanager
    async def point(self, point: str, key: str) -> AsyncIterator[None]:
        """Mark the start; run the caller's work; then the delay; then mark the end. An exception (or
        a cancelled activity) leaves no ``.done``: the point did not complete."""
        self._mark(point, key, "start")
        yield
        await asyncio.sleep(self.delay_seconds)
        self._mark(point, key, "done")


def _activity_workflow_id(fallback: str) -> str:
    """The workflow id of the running activity (the request's, for planning, tools and synthesis)."""
    try:
        return activity.info().workflow_id or fallback
    except RuntimeError:  # called outside an activity (a unit test): the request id identifies it
        return fallback


class FaultProbe(PipelineHook):
    """Slows and marks every hook stage the demo's requests reach; changes nothing.

    Registered first, so it is the first participant of each stage; the demo's required
    ``allowed-operations`` stays the last after_planning participant. Its timeout is well above the
    delay, so an invocation that is not killed never times out.
    """

    name = PROBE_NAME

    def __init__(self, points: FaultPoints) -> None:
        self.points = points
        self.timeout_seconds = max(10.0, 4 * points.delay_seconds)

    async def _pass(self, point: str, workflow_id: str, part: str | None = None) -> None:
        async with self.points.point(point, marker_key(workflow_id, part)):
            pass

    async def before_run(self, ctx, run) -> None:
        await self._pass("before_run", ctx.workflow_id)

    async def before_planning(self, ctx) -> None:
        await self._pass("before_planning", ctx.workflow_id)

    async def after_planning(self, ctx, plan: Plan) -> Plan:
        await self._pass("after_planning", ctx.workflow_id, f"p{ctx.plan_phase}")
        return plan

    async def before_tool(self, ctx, call) -> None:
        await self._pass("before_tool", ctx.workflow_id, call.step_id)

    async def after_tool(self, ctx, call, outcome) -> None:
        await self._pass("after_tool", ctx.workflow_id, call.step_id)

    async def after_execution(self, ctx, execution) -> None:
        await self._pass("after_execution", ctx.workflow_id)

    async def after_synthesis(self, ctx, response: str) -> str:
        await self._pass("after_synthesis", ctx.workflow_id)
        return response

    async def after_answer(self, ctx, answer) -> None:
        await self._pass("after_answer", ctx.workflow_id)

    async def before_remember(self, ctx, candidate) -> None:
        await self._pass("before_remember", ctx.workflow_id)

    async def on_error(self, ctx, error) -> None:
        await self._pass("on_error", ctx.workflow_id)

    async def on_finish(self, ctx, outcome) -> None:
        await self._pass("on_finish", ctx.workflow_id)


def slowed_tool(tool: Tool, points: FaultPoints) -> Tool:
    """The same tool object with a slowed ``run``: a subclass of its class (so ``spec()``, identity,
    ``read_only`` and ``approval_required`` are the class's own) over a copy of its state."""
    base = type(tool)

    async def run(self, arguments, ctx: ToolContext):
        key = marker_key(_activity_workflow_id(ctx.request_id), ctx.step_id)
        async with points.point(TOOL_STEP, key):
            return await base.run(self, arguments, ctx)

    cls = type(base.__name__, (base,), {"run": run, "__module__": base.__module__})
    wrapped = copy.copy(tool)
    wrapped.__class__ = cls
    return wrapped


class SlowedPlanner:
    """The planner, slowed per planning phase; its name (a cache dimension) and the way it offers the
    tools are the inner planner's."""

    def __init__(self, inner: Any, points: FaultPoints) -> None:
        self.inner, self.points = inner, points
        self.name = getattr(inner, "name", type(inner).__name__)
        self.tools_as_functions = bool(getattr(inner, "tools_as_functions", False))

    async def plan(self, request: PlanningRequest) -> Plan:
        key = marker_key(_activity_workflow_id(request.request_id), f"p{request.phase}")
        async with self.points.point(PLANNING, key):
            return await self.inner.plan(request)


class SlowedSynthesizer:
    """The synthesizer, slowed; its name (a cache dimension) is the inner synthesizer's."""

    def __init__(self, inner: Any, points: FaultPoints) -> None:
        self.inner, self.points = inner, points
        self.name = getattr(inner, "name", type(inner).__name__)

    async def synthesize(self, input: SynthesizeInput) -> SynthesizeOutput:
        async with self.points.point(SYNTHESIS, marker_key(_activity_workflow_id(input.request_id))):
            return await self.inner.synthesize(input)


class SlowedAuditWriter:
    """The audit hook's writer: admission unchanged, the (detached) write slowed."""

    def __init__(self, inner: Any, points: FaultPoints) -> None:
        self.inner, self.points = inner, points

    def admit(self, record: dict[str, Any]) -> None:
        self.inner.admit(record)

    async def write(self, record: dict[str, Any], *, key: str) -> bool:
        # The activity runs in the DetachedEffect child; the key names the request it belongs to.
        workflow_id = str(record.get("workflow_id") or key.rsplit(":", 1)[0])
        async with self.points.point(DETACHED_EFFECT, marker_key(workflow_id)):
            return await self.inner.write(record, key=key)


def build_activities(settings: Settings) -> LifecycleActivities:
    """``demo.pipeline.build_activities`` itself, run with the slowed parts substituted for the ones it
    builds, so any change to the demo's factory is measured too (a substituted name it no longer uses
    fails loudly here rather than silently measuring an unslowed pipeline)."""
    points = FaultPoints.from_env()
    demo_hooks, demo_tools = demo.pipeline.demo_hooks, demo.pipeline.demo_tools
    planner_cls, synthesizer_cls = demo.pipeline.RulePlanner, demo.pipeline.TemplateSynthesizer

    def hooks(*args: Any, **kwargs: Any) -> list:
        built = demo_hooks(*args, **kwargs)
        audits = [hook for hook in built if isinstance(hook, AuditHook)]
        if len(audits) != 1:
            raise RuntimeError(
                f"the demo pipeline has {len(audits)} AuditHook(s); the fault pipeline slows exactly one"
            )
        audits[0].writer = SlowedAuditWriter(audits[0].writer, points)
        return [FaultProbe(points), *built]

    substitutes = {
        "demo_hooks": hooks,
        "demo_tools": lambda *a, **k: [slowed_tool(tool, points) for tool in demo_tools(*a, **k)],
        "RulePlanner": lambda *a, **k: SlowedPlanner(planner_cls(*a, **k), points),
        "TemplateSynthesizer": lambda *a, **k: SlowedSynthesizer(synthesizer_cls(*a, **k), points),
    }
    unused = sorted(set(substitutes) - set(demo.pipeline.build_activities.__code__.co_names))
    if unused:
        raise RuntimeError(
            f"demo.pipeline.build_activities no longer uses {unused}; update benchmarks/fault_pipeline.py"
        )
    # A worker builds its pipeline once, at start-up, before any activity runs: patching is safe here.
    with mock.patch.multiple(demo.pipeline, **substitutes):
        return demo.pipeline.build_activities(settings)
