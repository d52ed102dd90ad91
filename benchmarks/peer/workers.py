"""The worker processes of ``benchmarks.peer``: one per system, each set up as its users would set it up.

    python -m benchmarks.peer.workers lifecycle --queue-prefix P --model-url http://127.0.0.1:N/v1
    python -m benchmarks.peer.workers peer --queue-prefix P --model-url http://127.0.0.1:N/v1

- ``lifecycle``: as ``worker.py`` runs a worker — the client with the payload store and the tracing
  interceptor, the OpenTelemetry SDK (exporters ``none``), search attributes, the worker options and the
  thread pool of the settings — one worker per lifecycle kind on queue ``<P>-<kind>``: the pipeline from
  ``client.pipeline.build_pipeline`` with the model planner and synthesizer on the model server, the demo's
  quote tool, and six trivial in-process hooks (2 before_planning, 1 after_planning, 1 after_execution,
  2 after_synthesis), with one planning phase (``lifecycle_1``) or the defaults (``lifecycle_3``).
- ``peer``: the OpenAI Agents SDK's worker as its documentation sets it up — the client with
  ``OpenAIAgentsPlugin`` (its model provider: the SDK's ``OpenAIProvider`` on Chat Completions, pointed at
  the model server, the client's retries off as the plugin's default provider has them), a ``Worker``
  with Temporal's defaults (the workflow in the sandbox) on queue ``<P>-peer``. The SDK's trace export
  (to OpenAI's API, by default) is removed: its traces are made and sent nowhere, as the lifecycle's spans
  are with exporters ``none``.

Both refuse any non-loopback connection (:mod:`benchmarks.peer.loopback`), and print ``worker polling``
once they poll.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from datetime import timedelta

from pydantic import SecretStr

from benchmarks.peer import LIFECYCLE_PHASES, lifecycle_model
from benchmarks.peer.loopback import guard

POLLING = "worker polling"
PEER_QUEUE = "peer"


def queue_name(prefix: str, system: str) -> str:
    return f"{prefix}-{system}"


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(POLLING, flush=True)
    await stop.wait()


async def serve_lifecycle(prefix: str, model_url: str) -> None:
    from activities.models import ModelSettings
    from benchmarks.bench_worker import STANDARD, trivial_hooks
    from client import Settings, connect
    from client.pipeline import build_pipeline
    from demo.tools import StockQuote
    from hooks import RunMode
    from worker import build_worker, prepare
    from workflows.models import StageSettings

    settings = Settings.from_env()
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=settings.worker_threads, thread_name_prefix="agent-blocking")
    )
    client = await connect(settings)
    async with AsyncExitStack() as stack:
        for system, phases in LIFECYCLE_PHASES.items():
            activities = build_pipeline(
                settings,
                hooks=trivial_hooks(STANDARD, RunMode.LOCAL_ACTIVITY),
                tools=[StockQuote()],
                name=f"bench-{system}",
                stage_settings=None if phases is None else StageSettings(max_planning_phases=phases),
                model=ModelSettings(
                    base_url=model_url, api_key=SecretStr("bench-no-key"), model=lifecycle_model(system)
                ),
            )
            await prepare(client, settings, activities)
            worker = build_worker(
                client,
                queue_name(prefix, system),
                activities,
                sandboxed=settings.workflow_sandbox,
                **settings.worker_options(),
            )
            await stack.enter_async_context(worker)
        await _until_stopped()


async def serve_peer(address: str, prefix: str, model_url: str) -> None:
    from agents import OpenAIProvider, set_trace_processors
    from openai import AsyncOpenAI
    from temporalio.client import Client
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.worker import Worker

    from benchmarks.peer.agents_peer import AgentsPeerWorkflow, stock_quote

    set_trace_processors([])  # no exporter: traces stay in the process
    provider = OpenAIProvider(
        openai_client=AsyncOpenAI(base_url=model_url, api_key="bench-no-key", max_retries=0), use_responses=False
    )
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=60)), model_provider=provider
    )
    client = await Client.connect(address, plugins=[plugin])
    worker = Worker(
        client, task_queue=queue_name(prefix, PEER_QUEUE), workflows=[AgentsPeerWorkflow], activities=[stock_quote]
    )
    async with worker:
        await _until_stopped()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("system", choices=["lifecycle", "peer"])
    parser.add_argument("--queue-prefix", required=True)
    parser.add_argument("--model-url", required=True, help="the model server's base URL, up to /v1")
    args = parser.parse_args(argv)
    guard()
    if args.system == "lifecycle":
        from client import Settings
        from client.telemetry import configure_telemetry, shutdown_telemetry

        configure_telemetry("agent-lifecycle-bench-worker", Settings.from_env().telemetry)
        try:
            asyncio.run(serve_lifecycle(args.queue_prefix, args.model_url))
        finally:
            shutdown_telemetry()
    else:
        from client import Settings

        asyncio.run(serve_peer(Settings.from_env().temporal_address, args.queue_prefix, args.model_url))
    return 0


if __name__ == "__main__":
    from client import exit_process

    exit_process(main())
