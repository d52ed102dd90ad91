"""The peer: the OpenAI Agents SDK on Temporal (``openai-agents`` with ``temporalio-openai-agents``), set up
as its documentation sets it up, for the benchmark's request.

An ``Agent`` whose model is a Chat Completions model on the local model server (the worker's
``OpenAIAgentsPlugin`` gets a model provider for it; each model call is the plugin's
``invoke_model_activity``), whose one tool is the quote activity through ``activity_as_tool``, and whose
six trivial hooks are the SDK's own hook points, each returning what lets the run go on:

| lifecycle stage (its hooks) | the peer's hook |
| --- | --- |
| before_planning (2) | two input guardrails, blocking (``run_in_parallel=False``: they finish before the first model call, as before_planning hooks finish before planning) |
| after_planning (1) | ``RunHooks.on_llm_end`` (after every model turn) |
| after_execution (1) | ``RunHooks.on_tool_end`` (after every tool call) |
| after_synthesis (2) | two output guardrails, on the final answer |

The workflow runs in Temporal's sandbox, as the plugin expects (it adds its passthrough modules). It
returns the answer and how many times each hook ran, so the benchmark checks every hook ran.

This module imports only what the workflow needs; the worker process is :mod:`benchmarks.peer.workers`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from agents import (
        Agent,
        GuardrailFunctionOutput,
        InputGuardrail,
        OutputGuardrail,
        RunContextWrapper,
        RunHooks,
        Runner,
        Tool,
    )
    from temporalio.openai_agents.workflow import activity_as_tool

    from benchmarks.peer import PEER_MODEL
    from demo.tools import quote_price

PEER_WORKFLOW = "BenchAgentsPeer"
INSTRUCTIONS = "You answer questions about stock prices. Use the stock_quote tool for every symbol asked about."


@dataclass
class PeerInput:
    request: str


@dataclass
class PeerAnswer:
    answer: str
    # hook -> invocations in this request
    hook_invocations: dict[str, int] = field(default_factory=dict)


@activity.defn
async def stock_quote(symbol: str) -> dict[str, Any]:
    """Current price of a stock (read-only)."""
    return {"symbol": symbol, "price": quote_price(symbol), "currency": "USD"}


class CountingRunHooks(RunHooks[Any]):
    """after_planning and after_execution: observe each model turn and each tool result."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: Any) -> None:
        self.counts["on_llm_end"] += 1

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: Any) -> None:
        self.counts["on_tool_end"] += 1


def _input_guardrail(name: str, counts: Counter[str]) -> InputGuardrail[Any]:
    async def check(context: RunContextWrapper[Any], agent: Agent[Any], request: Any) -> GuardrailFunctionOutput:
        counts[name] += 1
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)

    return InputGuardrail(guardrail_function=check, name=name, run_in_parallel=False)


def _output_guardrail(name: str, counts: Counter[str]) -> OutputGuardrail[Any]:
    async def check(context: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> GuardrailFunctionOutput:
        counts[name] += 1
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)

    return OutputGuardrail(guardrail_function=check, name=name)


@workflow.defn(name=PEER_WORKFLOW)
class AgentsPeerWorkflow:
    """One request: the agent runs until the model answers in text."""

    @workflow.run
    async def run(self, input: PeerInput) -> PeerAnswer:
        counts: Counter[str] = Counter()
        agent = Agent(
            name="quote-agent",
            instructions=INSTRUCTIONS,
            model=PEER_MODEL,
            tools=[
                activity_as_tool(
                    stock_quote,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
            ],
            input_guardrails=[_input_guardrail("screen-request", counts), _input_guardrail("tag-request", counts)],
            output_guardrails=[_output_guardrail("check-answer", counts), _output_guardrail("tag-answer", counts)],
        )
        result = await Runner.run(agent, input.request, hooks=CountingRunHooks(counts))
        return PeerAnswer(answer=str(result.final_output), hook_invocations=dict(counts))
