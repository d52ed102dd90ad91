"""Run a worker for ``RequestLifecycle``.

    python worker.py            # connect to TEMPORAL_ADDRESS (default localhost:7233)
    python worker.py --dev      # first start the embedded dev server with its Web UI (port 8233)
    python worker.py --check    # validate the pipeline and exit

The pipeline comes from ``AGENT_PIPELINE`` (``module:function``; there is no default) and is validated
before anything connects: a bad setting, a misconfigured pipeline, or an MCP server of
``AGENT_MCP_SERVERS`` that cannot be listed (unless it is declared optional) exits 2 with one line naming
the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities import LifecycleActivities
from activities.mcp import McpStartupError, is_mcp_tool
from activities.policy_replay import PolicyReplayActivities
from agent_lifecycle.plugin import HEARTBEAT_THROTTLE, AgentPlugin, prepare
from client import Settings, connect_when_reachable, database, exit_process
from client.devserver import start_dev_server
from client.pipeline import PipelineRefused, PipelineSettingsError, apply_settings, check_servable
from client.settings import SettingsError
from client.telemetry import TelemetryConfigError, configure_telemetry, shutdown_telemetry
from hooks import InvalidPipelineConfigError
from hooks.contracts import hook_option
from storage.replays import ReplayReportStore
from workflows.extras import MissingExtraError
from workflows.models import FailurePolicy, Stage
from workflows.policy_replay import replay_batch_queue

logger = logging.getLogger("worker")


class PipelineLoadError(Exception):
    """``AGENT_PIPELINE`` names no factory the worker can call, or the factory returned something else."""


def load_activities(settings: Settings, *, serving: bool = True) -> LifecycleActivities:
    """Build the activities from the configured pipeline factory (which validates the hook registry),
    then apply every pipeline setting the factory did not (``client.pipeline.apply_settings``); a pipeline
    to serve is refused without a planner or with ungated tools (``client.pipeline.check_servable``; a
    candidate replayed in shadow runs nothing, and is not).

    Raises:
        PipelineRefused: a pipeline a worker must not serve.
    """
    where = settings.pipeline_factory
    if not where:
        raise PipelineLoadError(
            "AGENT_PIPELINE is not set: name the pipeline factory the worker runs (module:function, e.g. "
            "examples.first_agent.pipeline:build, or the demo's demo.pipeline:build_activities)"
        )
    module_name, _, function_name = where.partition(":")
    try:
        module = importlib.import_module(module_name)
    except MissingExtraError:  # the factory's module uses an optional part whose packages are missing
        raise
    except ImportError as err:
        raise PipelineLoadError(
            f"AGENT_PIPELINE={where}: cannot import {module_name!r} ({err}); is its folder on PYTHONPATH?"
        ) from None
    factory = getattr(module, function_name or "build_activities", None)
    if not callable(factory):
        raise PipelineLoadError(f"AGENT_PIPELINE={where}: {module_name} has no function {function_name!r}")
    try:
        activities = factory(settings)
    except (ValueError, McpStartupError):  # a bad setting, hook list or MCP server: reported as such
        raise
    except Exception as err:  # noqa: BLE001 - a factory's own bug: one line, with where it was raised
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raise PipelineLoadError(
            f"AGENT_PIPELINE={where} raised {type(err).__name__}: {err} ({frame.filename}:{frame.lineno})"
        ) from None
    if not isinstance(activities, LifecycleActivities):
        raise PipelineLoadError(
            f"AGENT_PIPELINE={where} returned {type(activities).__name__}, not LifecycleActivities "
            "(build it with client.pipeline.build_pipeline)"
        )
    apply_settings(activities, settings)
    if serving:
        check_servable(activities)
    return activities


def policy_replay_activities(settings: Settings, activities: LifecycleActivities) -> PolicyReplayActivities:
    """The ``PolicyReplay`` activities of a worker: records read from its execution store, reports kept in
    the database (or a SQLite file of the state directory), candidates built as ``AGENT_PIPELINE`` is."""
    db = database(settings)
    reports = ReplayReportStore(db if db is not None else settings.state_dir / "policy-replay.sqlite3")

    def candidate(where: str) -> LifecycleActivities:
        return load_activities(settings.model_copy(update={"pipeline_factory": where}), serving=False)

    return PolicyReplayActivities(activities.store, reports, candidate)


def build_worker(
    client: Client,
    task_queue: str,
    activities: LifecycleActivities,
    *,
    replay: PolicyReplayActivities | None = None,
    sandboxed: bool = False,
    extra_workflows: Sequence[type] = (),
    extra_activities: Sequence[Callable[..., Any]] = (),
    ui_shows_text: bool = False,
    **options: Any,
) -> Worker:
    """A worker for the lifecycle workflow, its detached-effect child, and every activity they schedule
    (plus any workflows and activities of the application's own, on the same task queue).

    The workflows run outside Temporal's sandbox unless ``sandboxed``. The sandbox guards workflow code
    against non-determinism by re-importing it for every run and proxying every activation; that is what
    an integration that runs application hooks inside its workflow needs. Here no application code runs
    in a workflow — every hook, tool, planner and store call is an activity — and the workflow code is
    the framework's own: it keeps no module state, and the tests replay every history they produce
    inside the sandbox, which fails on any call it forbids. Outside it, each activation costs about half
    as much (see benchmarks/README.md).

    ``replay``: the activities ``PolicyReplay`` schedules (every worker process has them; the workflow is
    one of ``WORKFLOWS``).

    Where the client encrypts payloads, the requests this worker runs show the Temporal UI no request text
    in their summaries and details (each records that in its manifest), unless ``ui_shows_text``
    (``AGENT_UI_SHOWS_TEXT``).

    A pipeline with no planner and no model, or with tools and no required after-planning gate (unless it
    was built ``ungated``), is refused (by the plugin): :class:`~client.pipeline.PipelineRefused`."""
    plugin = AgentPlugin(
        activities,
        data_converter=False,  # the client's (``client.connect``)
        tracing=False,  # the client's interceptor, which its workers inherit
        # a runner of the caller's own is kept
        sandboxed=sandboxed or "workflow_runner" in options,
        ui_shows_text=ui_shows_text,
        replay=replay,
        _manage=False,  # worker.run prepares the namespace and closes the pipeline itself
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=list(extra_workflows),
        activities=list(extra_activities),
        plugins=[plugin],
        **options,
    )


def build_workers(client: Client, pipelines: Mapping[str, LifecycleActivities], **options: Any) -> list[Worker]:
    """One worker per pipeline, each on its own task queue (``{task_queue: pipeline}``), to run together in
    one process (``async with`` each, or ``asyncio.gather`` their ``run()``). A request runs with the
    pipeline of the task queue it was started on — its hooks, tools, model and instructions — so a
    client chooses the pipeline by the task queue it starts the request on (``AGENT_TASK_QUEUE``).
    ``options`` are :func:`build_worker`'s, for every worker.

    Raises:
        ValueError: no pipeline, one pipeline on two task queues, or two pipelines of one name (records
            and the UI tell pipelines apart by name).
    """
    if not pipelines:
        raise ValueError("build_workers needs at least one task queue and its pipeline")
    queues: dict[int, str] = {}
    names: dict[str, str] = {}
    for task_queue, activities in pipelines.items():
        if id(activities) in queues:
            raise ValueError(f"one pipeline is given for task queues {queues[id(activities)]!r} and {task_queue!r}")
        name = activities.registry.pipeline
        if name in names:
            raise ValueError(
                f"the pipelines of task queues {names[name]!r} and {task_queue!r} are both named {name!r}: "
                "give each its own name (build_pipeline(name=...))"
            )
        queues[id(activities)], names[name] = task_queue, task_queue
    return [build_worker(client, task_queue, activities, **options) for task_queue, activities in pipelines.items()]


def build_replay_worker(
    client: Client, task_queue: str, replay: PolicyReplayActivities, *, batches: int, **options: Any
) -> Worker:
    """The worker of ``PolicyReplay``'s batches, beside the one of ``task_queue``: their own task queue
    (``workflows.policy_replay.replay_batch_queue``) and at most ``batches`` at once. A batch is CPU work in
    this process (every record's hooks judged), so a few at a time keep a core busy; the rest wait on the
    server for any worker with a free batch slot — a replay spreads over the workers, and never takes the
    slots requests run in."""
    return Worker(
        client,
        task_queue=replay_batch_queue(task_queue),
        activities=replay.activities(),
        max_concurrent_activities=batches,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        **options,
    )


@contextlib.asynccontextmanager
async def temporal_client(settings: Settings, *, dev: bool) -> AsyncIterator[Client]:
    """A connected client; with ``dev`` the embedded dev server runs for the duration."""
    env = await start_dev_server(settings) if dev else None
    try:
        yield await connect_when_reachable(settings)
    finally:
        if env is not None:
            await env.shutdown()


async def run(settings: Settings, activities: LifecycleActivities, *, dev: bool) -> None:
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=settings.worker_threads, thread_name_prefix="agent-blocking")
    )
    async with temporal_client(settings, dev=dev) as client:
        await prepare(client, settings, activities)
        replay = policy_replay_activities(settings, activities)
        worker = build_worker(
            client,
            settings.task_queue,
            activities,
            replay=replay,
            sandboxed=settings.workflow_sandbox,
            ui_shows_text=settings.protection.ui_shows_text,
            **settings.worker_options(),
        )
        replay_worker = build_replay_worker(client, settings.task_queue, replay, batches=settings.worker_replay_batches)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        hooks = ", ".join(e.name for e in activities.registry.entries) or "(none)"
        specs = activities.tools.specs()
        from_mcp = sum(is_mcp_tool(activities.tools.get(spec.key)) for spec in specs)
        print(
            f"worker polling task queue {settings.task_queue!r} on {settings.temporal_address}; hooks: {hooks}; "
            f"tools: {len(specs)} ({from_mcp} from MCP servers)"
        )
        if dev:
            print(f"Temporal UI: {settings.ui_url}/workflows")
        try:
            async with worker, replay_worker:
                await stop.wait()
        finally:
            await activities.aclose()  # MCP servers started over stdio and model clients end with the worker
        print("worker stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", action="store_true", help="start the embedded Temporal dev server (with UI) first")
    parser.add_argument("--check", action="store_true", help="validate the pipeline configuration and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
    except SettingsError as err:
        print(f"configuration error: {err}", file=sys.stderr)
        return 2
    try:
        activities = load_activities(settings)
    except (PipelineLoadError, PipelineRefused) as err:
        print(f"pipeline error: {err}", file=sys.stderr)
        return 2
    except PipelineSettingsError as err:
        print(f"configuration error: {err}", file=sys.stderr)
        return 2
    except McpStartupError as err:  # a bad AGENT_MCP_SERVERS file, or a server down at start-up
        print(f"MCP server error: {err}", file=sys.stderr)
        return 2
    except InvalidPipelineConfigError as err:
        print(f"pipeline configuration error ({err.reason}): {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # a part the factory built refused a value (e.g. two tools with one name)
        print(f"configuration error: {err}", file=sys.stderr)
        return 2
    if args.check:
        print(f"pipeline {activities.registry.pipeline} ({settings.pipeline_factory})")
        # Execution order (priority, then registration); the number is the registration index.
        for entry in activities.registry.entries:
            print(
                f"{entry.index}: {entry.name} [{', '.join(s.value for s in entry.stages)}]{_entry_options(activities, entry)}"
            )
        for spec in activities.tools.specs():
            flags = "".join(f" {flag}" for flag in ("read_only", "approval_required") if getattr(spec, flag))
            kind = "mcp tool" if is_mcp_tool(activities.tools.get(spec.key)) else f"{spec.kind}"
            print(f"{kind}: {spec.key}{flags}")
        for line in _model_lines(activities):
            print(line)
        for line in _fail_open_warnings(activities):
            print(line)
        review = activities.manifest.review
        print(
            f"planner: {_part_name(activities.planner)}; synthesizer: {_part_name(activities.synthesizer)}; "
            f"reviewers: {_reviewers(review)}; "
            f"checkpoint expiry: {review.checkpoint_expiry_seconds:g} s; "
            f"reviewers' webhook: {'yes' if review.notify else 'no'}"
        )
        print("pipeline ok")
        return 0
    try:
        configure_telemetry("agent-lifecycle-worker", settings.telemetry, temporal_metrics=True)
    except TelemetryConfigError as err:
        print(f"telemetry configuration error: {err}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(settings, activities, dev=args.dev))
    except (RuntimeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        shutdown_telemetry()
    return 0


def _reviewers(review: Any) -> str:
    """Who may decide checkpoints, and how they are verified, as ``--check`` says it."""
    if review.verification == "signed":
        signers = sorted({k.principal for k in review.keys if k.principal})
        issuers = sorted({k.issuer for k in review.keys if k.issuer})
        who = ", ".join(review.reviewers or signers) or "(any reviewer an issuer names)"
        trusted = [f"{len(review.keys)} key(s)"] + [f"issuer {i}" for i in issuers]
        return f"{who} (signed decisions: {', '.join(trusted)})"
    if review.verification == "server_identity":
        return f"{', '.join(review.reviewers) or '(any identity)'} (the server's identity)"
    return f"{', '.join(review.reviewers) or '(any named reviewer)'} (UNVERIFIED: anyone who can reach the namespace can use any name)"


def _model_lines(activities: LifecycleActivities) -> list[str]:
    """Where the pipeline's model calls go, as ``--check`` says it: each model, its endpoint, and its
    fallback's (none: the pipeline calls no model)."""
    lines = []
    for role, part in (("planner", activities.planner), ("synthesizer", activities.synthesizer)):
        for route, chat in (("", getattr(part, "chat", None)), (" fallback", getattr(part, "fallback", None))):
            settings = getattr(chat, "settings", None)
            if settings is None:
                continue
            where = settings.base_url or "https://api.openai.com/v1 (the OpenAI API: AGENT_MODEL_BASE_URL unset)"
            lines.append(f"{role}{route} model: {getattr(chat, 'model', '?')} at {where}")
    return lines or ["model: none (the pipeline calls no model)"]


# The stages that guard what leaves the request: a hook there fails closed unless it says otherwise.
PROTECTIVE_STAGES = (Stage.BEFORE_TOOL, Stage.AFTER_TOOL, Stage.AFTER_SYNTHESIS)


def _fail_open_warnings(activities: LifecycleActivities) -> list[str]:
    """A warning for each hook that fails open at a protective stage (by its own ``failure_policy``)."""
    return [
        f"warning: {entry.name} fails open at {stage.value}: if it fails, the request goes on unguarded by it"
        for entry in activities.registry.entries
        if entry.failure_policy is FailurePolicy.FAIL_OPEN
        for stage in PROTECTIVE_STAGES
        if entry.implements(stage)
    ]


def _part_name(part: Any) -> str:
    return str(getattr(part, "name", None) or type(part).__name__)


def _entry_options(activities, entry) -> str:
    """What ``--check`` shows beside a hook besides its stages: the options that are not defaults."""
    hook = activities.registry.hook(entry.name)
    shown = [
        "required" if entry.required else "",
        f"priority {hook_option(hook, 'priority')}" if hook_option(hook, "priority") else "",
        f"scope {hook_option(hook, 'scope')}" if hook_option(hook, "scope") != "global" else "",
        f"matcher {entry.tool_matcher!r} (on agent/capability)" if entry.tool_matcher else "",
        "sub-agent steps only" if entry.subagent_only else "",
    ]
    return "".join(f" {item}" for item in shown if item)


def entry() -> None:
    """Console-script entry."""
    exit_process(main())


if __name__ == "__main__":
    entry()
