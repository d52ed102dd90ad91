"""Pipeline factories for ``worker.py --check`` subprocess tests (``AGENT_PIPELINE=tests.worker_pipelines:<name>``).

Each factory takes the process :class:`client.settings.Settings` and returns ``LifecycleActivities``; the
misconfigured ones raise from :class:`hooks.HookRegistry` while building it, as a real factory would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from activities import LifecycleActivities, Tool, ToolRegistry
from activities.planning import ReadableSynthesizer
from client.pipeline import build_pipeline
from client.settings import Settings
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import demo_tools
from hooks import HookRegistry, PipelineHook, RequiredAfterPlanningHook
from storage.executions import SQLiteExecutionStore
from workflows.models import FailurePolicy, Plan, PlanStep, ReviewSettings, RunMode, StageSettings, ToolDecision


class Enrich(PipelineHook):
    def __init__(self, name: str) -> None:
        self.name = name

    def before_planning(self, ctx):
        return None


class Reviewer(PipelineHook):
    """An ordinary after_planning participant."""

    def __init__(self, name: str) -> None:
        self.name = name

    def after_planning(self, ctx, plan):
        return plan


class Governed(RequiredAfterPlanningHook, PipelineHook):
    def __init__(self, name: str = "governed-plan") -> None:
        self.name = name

    def after_planning(self, ctx, plan):
        return plan


class DriftedGoverned(RequiredAfterPlanningHook, PipelineHook):
    """Required marker, but the stage method name is misspelt: it implements no after_planning."""

    name = "drifted-gate"

    def after_planing(self, ctx, plan):
        return plan


class Redact(PipelineHook):
    name = "redact"

    def after_synthesis(self, ctx, response):
        return response


def _activities(settings: Settings, hooks: list) -> LifecycleActivities:
    return LifecycleActivities(
        registry=HookRegistry(hooks, pipeline="check"),
        tools=ToolRegistry(demo_tools(settings.state_dir)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(settings.execution_store_path),
    )


def valid(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Enrich("enrich"), Reviewer("reviewer"), Governed(), Redact()])


def empty(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [])


class OptionalFormatter(PipelineHook):
    name = "optional-formatter"
    failure_policy = FailurePolicy.FAIL_OPEN

    def after_synthesis(self, ctx, response):
        return response


def fail_open_formatter(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Governed(), Redact(), OptionalFormatter()])


def empty_ungated(settings: Settings) -> LifecycleActivities:
    """No hook at all, and saying so: its tools run with no gate."""
    activities = _activities(settings, [])
    activities.ungated = True
    return activities


def no_planner(settings: Settings) -> LifecycleActivities:
    """Built with build_pipeline, a gate, and neither a planner nor a model."""
    return build_pipeline(settings, hooks=[Governed()], tools=demo_tools(settings.state_dir), name="no-planner")


def none_entry(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Enrich("first"), Enrich("second"), None, Governed()])


def stage_drift(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Enrich("enrich"), DriftedGoverned()])


def multiple_required(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Governed("gate-a"), Governed("gate-b")])


def required_not_terminal(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Governed(), Reviewer("late-reviewer")])


def duplicate_name(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Enrich("same"), Enrich("same")])


class CrashingGate(RequiredAfterPlanningHook, PipelineHook):
    """The required gate, whose worker process dies under it (SIGKILL, as an OOM kill or a lost machine
    would) the first ``crashes`` times it runs, then fails (raises) the next ``failures`` times, counted in
    a file the worker processes share."""

    name = "crashing-gate"
    timeout_seconds = 20.0
    max_attempts = 3
    run_mode = RunMode.ACTIVITY  # heartbeated: a lost worker is found within seconds

    def __init__(self, counter: Path, crashes: int, max_attempts: int, failures: int = 0) -> None:
        self.counter = counter
        self.crashes = crashes
        self.failures = failures
        self.max_attempts = max_attempts

    def after_planning(self, ctx, plan):
        done = int(self.counter.read_text() or 0) if self.counter.exists() else 0
        self.counter.write_text(str(done + 1))
        if done < self.crashes:
            os.kill(os.getpid(), signal.SIGKILL)
        if done < self.crashes + self.failures:
            raise RuntimeError(f"the gate's run {done + 1} fails")
        return plan


def crashing_gate(settings: Settings) -> LifecycleActivities:
    """``AGENT_TEST_CRASHES`` crashes under the required gate, then ``AGENT_TEST_GATE_FAILURES`` failures
    (``AGENT_TEST_GATE_ATTEMPTS`` attempts per dispatch), heartbeat timeout 2 s, at most
    ``AGENT_TEST_WORKER_LOSSES`` lost dispatches."""
    gate = CrashingGate(
        settings.state_dir / "crashes",
        int(os.environ["AGENT_TEST_CRASHES"]),
        int(os.environ.get("AGENT_TEST_GATE_ATTEMPTS", "3")),
        int(os.environ.get("AGENT_TEST_GATE_FAILURES", "0")),
    )
    return LifecycleActivities(
        registry=HookRegistry([gate], pipeline="crashing"),
        tools=ToolRegistry(demo_tools(settings.state_dir)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(settings.execution_store_path),
        settings=StageSettings(
            heartbeat_timeout_seconds=2.0, max_worker_losses=int(os.environ.get("AGENT_TEST_WORKER_LOSSES", "5"))
        ),
    )


# --------------------------------------------------------------------------------------------------
# Pipelines of one's own, built by hand (not with build_pipeline): the worker applies its settings
# around them, or refuses to start.
# --------------------------------------------------------------------------------------------------


class ScriptedPlanner:
    """Plans the steps ``AGENT_TEST_PLAN`` lists (JSON plan steps), in phase 1 only."""

    name = "scripted-planner"

    async def plan(self, request) -> Plan:
        raw = os.environ.get("AGENT_TEST_PLAN")
        steps = [PlanStep.model_validate(step) for step in json.loads(raw)] if raw and request.phase == 1 else []
        return Plan(phase=request.phase, steps=steps)


class SignMessages(PipelineHook):
    """A Python before_tool hook that rewrites every message it sees: the text gets a signature."""

    name = "sign-messages"

    def before_tool(self, ctx, call):
        if call.capability != "send_message":
            return None
        return ToolDecision.modify({**call.arguments, "text": f"{call.arguments['text']} [signed]"}, reason="sign")


def hand_built(settings: Settings, review: ReviewSettings | None = None) -> LifecycleActivities:
    """A pipeline of one's own, constructed directly: its own planner (the plan in ``AGENT_TEST_PLAN``),
    the readable synthesizer, the demo's tools and one Python before_tool rewrite. No setting is wired in:
    the worker must apply them."""
    activities = LifecycleActivities(
        registry=HookRegistry([SignMessages()], pipeline="hand-built"),
        tools=ToolRegistry(demo_tools(settings.state_dir)),
        planner=ScriptedPlanner(),
        synthesizer=ReadableSynthesizer(),
        store=SQLiteExecutionStore(settings.execution_store_path),
        review=review,
    )
    activities.ungated = True  # its tools run with no required gate, deliberately
    return activities


def own_reviewers(settings: Settings) -> LifecycleActivities:
    """A hand-built pipeline that names its own reviewers."""
    return hand_built(settings, ReviewSettings(reviewers=["bob"]))


class NarrowedGate(RequiredAfterPlanningHook, PipelineHook):
    """The required gate with one narrowing option from ``AGENT_TEST_GATE_OPTION`` (``name=json-value``)."""

    name = "narrowed-gate"

    def __init__(self) -> None:
        option, _, value = os.environ["AGENT_TEST_GATE_OPTION"].partition("=")
        setattr(self, option, json.loads(value))

    def after_planning(self, ctx, plan):
        return plan


def narrowed_required(settings: Settings) -> LifecycleActivities:
    return _activities(settings, [Enrich("enrich"), NarrowedGate()])


def own_store(settings: Settings) -> LifecycleActivities:
    """A hand-built pipeline that keeps its records in a file of its own choosing."""
    activities = hand_built(settings)
    activities.store = SQLiteExecutionStore(settings.state_dir / "mine.sqlite3")
    return activities


def not_a_pipeline(settings: Settings) -> str:
    """A factory that returns something else than the activities."""
    return "a pipeline"


# --------------------------------------------------------------------------------------------------
# Conversations: every turn calls a tool that takes a while and logs when it ran (across processes)
# --------------------------------------------------------------------------------------------------


class _NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoggedSlowTool(Tool):
    """Takes ``AGENT_TEST_TOOL_SECONDS`` (1.5 s); appends ``{"request_id", "started", "ended"}`` to
    ``spans.jsonl`` in the state directory when it finishes (an attempt cut short by a dying worker
    leaves no line)."""

    namespace = "test-tools"
    agent = "slow-service"
    capability = "take_a_while"
    read_only = True
    Arguments = _NoArguments

    def __init__(self, log: Path) -> None:
        self.log = log

    async def run(self, arguments, ctx):
        started = time.time()
        await asyncio.sleep(float(os.environ.get("AGENT_TEST_TOOL_SECONDS", "1.5")))
        line = json.dumps({"request_id": ctx.request_id, "started": started, "ended": time.time()})
        with self.log.open("a") as log:
            log.write(line + "\n")
        return "done"


class AlwaysSlow:
    name = "always-slow"

    async def plan(self, request) -> Plan:
        step = PlanStep(step_id="s1", namespace="test-tools", agent="slow-service", capability="take_a_while")
        return Plan(phase=request.phase, steps=[step] if request.phase == 1 else [])


def slow_turns(settings: Settings) -> LifecycleActivities:
    activities = LifecycleActivities(
        registry=HookRegistry([], pipeline="slow-turns"),
        tools=ToolRegistry([LoggedSlowTool(settings.state_dir / "spans.jsonl")]),
        planner=AlwaysSlow(),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(settings.execution_store_path),
        settings=StageSettings(heartbeat_timeout_seconds=2.0),
    )
    activities.ungated = True  # one read-only tool, no gate: deliberately
    return activities
