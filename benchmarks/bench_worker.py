"""The benchmark's worker process: one worker per benchmark pipeline, set up exactly as ``worker.py`` sets
up a production worker (the same client and data converter with the payload store, the OpenTelemetry
tracing interceptor and SDK, search attributes, sticky-queue and heartbeat options), plus the baselines
of :mod:`benchmarks`.

    python -m benchmarks.bench_worker --queue-prefix bench-1234

Reads the connection and state directory from the environment, as ``worker.py`` does, and prints
``bench worker polling`` once every worker polls. It runs in its own process so the benchmark can read
its CPU time apart from the client's.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from contextlib import AsyncExitStack
from typing import Any

from activities import LifecycleActivities, ToolRegistry
from benchmarks import FloorWorkflow, InlinePeerWorkflow, floor_noop
from client import Settings, connect, exit_process
from client.telemetry import configure_telemetry, shutdown_telemetry
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import demo_tools
from hooks import HookRegistry, PipelineHook, RunMode
from storage.executions import SQLiteExecutionStore
from worker import build_worker, prepare
from workflows.models import ExecutionResult, Plan, Stage

KIB = 1024
HOOK_STAGES = (Stage.BEFORE_PLANNING, Stage.AFTER_PLANNING, Stage.AFTER_EXECUTION, Stage.AFTER_SYNTHESIS)
ENRICHMENT_BYTES = 250 * KIB


class _TrivialHook(PipelineHook):
    def __init__(self, name: str, run_mode: RunMode) -> None:
        self.name = name
        self.run_mode = run_mode


class NoopBeforePlanning(_TrivialHook):
    async def before_planning(self, ctx: Any) -> None:
        return None


class NoopAfterPlanning(_TrivialHook):
    async def after_planning(self, ctx: Any, plan: Plan) -> Plan:
        return plan


class NoopAfterExecution(_TrivialHook):
    async def after_execution(self, ctx: Any, execution: ExecutionResult) -> None:
        return None


class NoopAfterSynthesis(_TrivialHook):
    async def after_synthesis(self, ctx: Any, response: str) -> str:
        return response


class LargeEnrichment(PipelineHook):
    """Puts 250 KB of reference material in the view every later hook of the request receives."""

    name = "large-enrichment"

    async def before_planning(self, ctx: Any) -> None:
        ctx.enrichments["reference_material"] = "y" * ENRICHMENT_BYTES


_BY_STAGE = {
    Stage.BEFORE_PLANNING: NoopBeforePlanning,
    Stage.AFTER_PLANNING: NoopAfterPlanning,
    Stage.AFTER_EXECUTION: NoopAfterExecution,
    Stage.AFTER_SYNTHESIS: NoopAfterSynthesis,
}


def trivial_hooks(per_stage: dict[Stage, int], run_mode: RunMode) -> list[PipelineHook]:
    """``per_stage[stage]`` one-stage hooks for each stage, in lifecycle order."""
    return [
        cls(f"noop-{stage.value.replace('_', '-')}-{i + 1}", run_mode)
        for stage, cls in _BY_STAGE.items()
        for i in range(per_stage.get(stage, 0))
    ]


TWENTY = {stage: 5 for stage in HOOK_STAGES}
# 6 invocations: 2 before_planning, 1 after_planning, 1 after_execution, 2 after_synthesis.
STANDARD = {Stage.BEFORE_PLANNING: 2, Stage.AFTER_PLANNING: 1, Stage.AFTER_EXECUTION: 1, Stage.AFTER_SYNTHESIS: 2}
# Pipeline name -> its hooks. Local activity is what an in-process hook runs as by default.
PIPELINES: dict[str, list[PipelineHook]] = {
    "hooks0": [],
    "hooks20_activity": trivial_hooks(TWENTY, RunMode.ACTIVITY),
    "hooks20_local": trivial_hooks(TWENTY, RunMode.LOCAL_ACTIVITY),
    "standard_activity": trivial_hooks(STANDARD, RunMode.ACTIVITY),
    "standard_local": trivial_hooks(STANDARD, RunMode.LOCAL_ACTIVITY),
    "standard_sandboxed": trivial_hooks(STANDARD, RunMode.LOCAL_ACTIVITY),
    "enriched0": [LargeEnrichment()],
    "enriched20_local": [LargeEnrichment(), *trivial_hooks(TWENTY, RunMode.LOCAL_ACTIVITY)],
    "enriched20_activity": [LargeEnrichment(), *trivial_hooks(TWENTY, RunMode.ACTIVITY)],
}
# Its workers run the workflows in Temporal's sandbox, as worker.py does with AGENT_WORKFLOW_SANDBOX=true.
SANDBOXED = frozenset({"standard_sandboxed"})
# The baselines' worker: sandboxed, as the integrations that run hooks in workflow code must be, with the
# plan, tool and synthesize activities of a pipeline without hooks.
BASELINES = "baselines"


def queue_name(prefix: str, pipeline: str) -> str:
    return f"{prefix}-{pipeline}"


def pipeline_activities(settings: Settings, pipeline: str, store: SQLiteExecutionStore) -> LifecycleActivities:
    activities = LifecycleActivities(
        registry=HookRegistry(PIPELINES[pipeline], pipeline=f"bench-{pipeline}"),
        tools=ToolRegistry(demo_tools(settings.state_dir)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=store,
    )
    activities.ungated = True  # the pipelines measure the hooks' cost: no required gate, deliberately
    return activities


async def serve(settings: Settings, prefix: str) -> None:
    client = await connect(settings)
    store = SQLiteExecutionStore(settings.execution_store_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        for pipeline in PIPELINES:
            activities = pipeline_activities(settings, pipeline, store)
            await prepare(client, settings, activities)
            worker = build_worker(client, queue_name(prefix, pipeline), activities, sandboxed=pipeline in SANDBOXED)
            await stack.enter_async_context(worker)
        baselines = build_worker(
            client,
            queue_name(prefix, BASELINES),
            pipeline_activities(settings, "hooks0", store),
            sandboxed=True,
            extra_workflows=[FloorWorkflow, InlinePeerWorkflow],
            extra_activities=[floor_noop],
        )
        await stack.enter_async_context(baselines)
        print("bench worker polling", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queue-prefix", required=True, help="task queue of pipeline P: <prefix>-<P>")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    configure_telemetry("agent-lifecycle-bench-worker", settings.telemetry)
    try:
        asyncio.run(serve(settings, args.queue_prefix))
    finally:
        shutdown_telemetry()
    return 0


if __name__ == "__main__":
    exit_process(main())
