"""The worker processes of ``benchmarks.peer``: one per framework, each set up as its users would set it up.

    python -m benchmarks.peer.workers lifecycle --queue-prefix P --model-url http://127.0.0.1:N/v1
    python -m benchmarks.peer.workers openai_agents --queue-prefix P --model-url http://127.0.0.1:N/v1
    python -m benchmarks.peer.workers pydantic_ai --queue-prefix P --model-url http://127.0.0.1:N/v1

- ``lifecycle``: as ``worker.py`` runs a worker — the client with the payload store and the tracing
  interceptor, the OpenTelemetry SDK (exporters ``none``), search attributes, the worker options and the
  thread pool of the settings. One worker per way of starting a request, on queue ``<P>-<system>``
  (``lifecycle``: through ``AgentClient``; ``lifecycle_plain``: through a plain Temporal client), the
  same pipeline on both but for the model name (so the model server counts each apart):
  ``client.pipeline.build_pipeline`` with the model planner and synthesizer on the model server and its
  defaults, the demo's quote tool and the hooks of :mod:`benchmarks.peer.lifecycle_hooks`.
- ``openai_agents``: the OpenAI Agents SDK's worker as its documentation sets it up — the client with
  ``OpenAIAgentsPlugin`` (its model provider: the SDK's ``OpenAIProvider`` on Chat Completions, pointed at
  the model server, the client's retries off as the plugin's default provider has them), a ``Worker``
  with Temporal's defaults (the workflow in the sandbox). The SDK's trace export (to OpenAI's API, by
  default) is removed: its traces are made and sent nowhere, as the lifecycle's spans are with exporters
  ``none``.
- ``pydantic_ai``: pydantic-ai's worker as its documentation sets it up — the client with
  ``PydanticAIPlugin`` (its payload converter, its sandbox passthrough modules; it registers the agent's
  activities from the workflow's ``__pydantic_ai_agents__``), a ``Worker`` with Temporal's defaults.

Each refuses any non-loopback connection (:mod:`benchmarks.peer.loopback`), and prints ``worker
polling`` once it polls.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from datetime import timedelta

from pydantic import SecretStr

from benchmarks.peer import LIFECYCLES, OPENAI_AGENTS, PYDANTIC_AI, PYDANTIC_MODEL_URL_VARIABLE, model_name
from benchmarks.peer.loopback import guard

POLLING = "worker polling"
LIFECYCLE_WORKER = "lifecycle"
WORKER_KINDS: tuple[str, ...] = (LIFECYCLE_WORKER, OPENAI_AGENTS, PYDANTIC_AI)


def queue_name(prefix: str, system: str) -> str:
    return f"{prefix}-{system}"


def worker_kind(system: str) -> str:
    """The worker process that serves ``system``."""
    return LIFECYCLE_WORKER if system in LIFECYCLES else system


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(POLLING, flush=True)
    await stop.wait()


async def serve_lifecycle(prefix: str, model_url: str) -> None:
    from activities.models import ModelSettings
    from benchmarks.peer.lifecycle_hooks import user_hooks
    from client import Settings, connect
    from client.pipeline import build_pipeline
    from demo.tools import StockQuote
    from worker import build_worker, prepare

    settings = Settings.from_env()
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=settings.worker_threads, thread_name_prefix="agent-blocking")
    )
    client = await connect(settings)
    async with AsyncExitStack() as stack:
        for system in LIFECYCLES:
            activities = build_pipeline(
                settings,
                hooks=user_hooks(),
                tools=[StockQuote()],
                name=f"bench-{system}",
                model=ModelSettings(base_url=model_url, api_key=SecretStr("bench-no-key"), model=model_name(system)),
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


async def serve_openai_agents(address: str, prefix: str, model_url: str) -> None:
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
        client, task_queue=queue_name(prefix, OPENAI_AGENTS), workflows=[AgentsPeerWorkflow], activities=[stock_quote]
    )
    async with worker:
        await _until_stopped()


async def serve_pydantic_ai(address: str, prefix: str, model_url: str) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    os.environ[PYDANTIC_MODEL_URL_VARIABLE] = model_url  # read as the agent's module is imported (below)
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin

    from benchmarks.peer.pydantic_peer import PydanticPeerWorkflow

    client = await Client.connect(address, plugins=[PydanticAIPlugin()])
    worker = Worker(client, task_queue=queue_name(prefix, PYDANTIC_AI), workflows=[PydanticPeerWorkflow])
    async with worker:
        await _until_stopped()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=WORKER_KINDS)
    parser.add_argument("--queue-prefix", required=True)
    parser.add_argument("--model-url", required=True, help="the model server's base URL, up to /v1")
    args = parser.parse_args(argv)
    guard()
    from client import Settings

    if args.kind == LIFECYCLE_WORKER:
        from client.telemetry import configure_telemetry, shutdown_telemetry

        configure_telemetry("agent-lifecycle-bench-worker", Settings.from_env().telemetry)
        try:
            asyncio.run(serve_lifecycle(args.queue_prefix, args.model_url))
        finally:
            shutdown_telemetry()
    elif args.kind == OPENAI_AGENTS:
        asyncio.run(serve_openai_agents(Settings.from_env().temporal_address, args.queue_prefix, args.model_url))
    else:
        asyncio.run(serve_pydantic_ai(Settings.from_env().temporal_address, args.queue_prefix, args.model_url))
    return 0


if __name__ == "__main__":
    from client import exit_process

    exit_process(main())
