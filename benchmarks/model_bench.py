"""What the model planner adds over a bare ``openai`` call to the same server, measured in one run.

    python -m benchmarks.model_bench                 # 300 calls of each kind
    python -m benchmarks.model_bench --calls 50      # quicker

A local OpenAI-compatible server (the tests' scripted server, real HTTP on 127.0.0.1, in a thread of
its own so serving costs nothing on the measured event loop) answers every call with the same tool call.
Two kinds of call alternate, so drift on the machine hits both alike:

- ``bare``: ``AsyncOpenAI.chat.completions.create`` with exactly the messages and tools the planner sends;
- ``planner``: ``OpenAIPlanner.plan`` on the same request — the call plus what the planner does around it:
  the token budget check, the ``chat <model>`` span and the GenAI metrics, the prompt and response kept
  by digest with masked previews, the tool call parsed, validated against the tool's arguments model and
  turned into a plan step.

Prints one JSON document: the p50/p95 of each kind in milliseconds and the ratio of the p50s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from pydantic import SecretStr

from activities.models import PLANNER_SYSTEM_PROMPT, ModelCallLog, ModelSettings, OpenAIPlanner, function_name
from activities.planning import PlanningRequest, PromptInput, build_planning_prompt
from activities.tools import ToolRegistry
from agent_lifecycle.testing import model as ai
from demo.tools import demo_tools

QUOTE = "demo-tools/stock-service/stock_quote"


class ServerThread:
    """The scripted server on its own event loop in a daemon thread."""

    def __init__(self) -> None:
        self.server = ai.OpenAIServer()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.server.__aenter__())
        self._ready.set()
        self._loop.run_forever()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(calls: int, state: Path) -> dict[str, object]:
    thread = ServerThread()
    server = thread.server
    reply = ai.tool_calls((function_name(QUOTE), {"symbol": "ACME"}))
    server.push(*[reply] * (2 * calls + 20))
    settings = ModelSettings(base_url=server.base_url, api_key=SecretStr("bench"), model="bench-model")
    tools = ToolRegistry(demo_tools(state))
    planner = OpenAIPlanner(settings, tools)
    client = planner.chat.client
    specs = tools.specs()
    prompt = build_planning_prompt(
        PromptInput(request="Price of ACME?", enrichments={}, tools=specs, phase=1, tools_as_functions=True)
    )
    request = PlanningRequest(
        request="Price of ACME?", request_id="bench", prompt=prompt, enrichments={}, tools=specs, phase=1
    )
    functions = [
        {
            "type": "function",
            "function": {
                "name": planner.names.name(spec.key),
                "description": spec.description or spec.key,
                "parameters": spec.parameters or {"type": "object", "properties": {}},
            },
        }
        for spec in specs
    ]
    messages = [{"role": "system", "content": PLANNER_SYSTEM_PROMPT}, {"role": "user", "content": prompt}]

    bare_request: dict[str, Any] = {
        "model": "bench-model",
        "messages": messages,
        "tools": functions,
        "max_tokens": settings.max_output_tokens,
    }

    async def bare() -> None:
        await client.chat.completions.create(**bare_request)

    async def planned() -> None:
        plan = await planner.plan(request, calls=ModelCallLog())
        assert plan.steps and plan.steps[0].capability == "stock_quote"

    samples: dict[str, list[float]] = {"bare": [], "planner": []}
    for _ in range(10):  # warm-up: connections, imports, the first span and metric
        await bare()
        await planned()
    for _ in range(calls):
        for kind, call in (("bare", bare), ("planner", planned)):
            started = time.perf_counter()
            await call()
            samples[kind].append((time.perf_counter() - started) * 1000.0)
    figures: dict[str, object] = {
        kind: {"p50_ms": round(statistics.median(values), 3), "p95_ms": round(percentile(values, 0.95), 3)}
        for kind, values in samples.items()
    }
    figures["planner_over_bare_p50"] = round(
        statistics.median(samples["planner"]) / statistics.median(samples["bare"]), 3
    )
    figures["calls_per_kind"] = calls
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    with TemporaryDirectory() as state:
        figures = asyncio.run(measure(args.calls, Path(state)))
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
