"""The OpenAI Agents SDK on Temporal (``openai-agents`` with ``temporalio-openai-agents``), set up as its
documentation sets it up, for the benchmark's request.

An ``Agent`` whose model is a Chat Completions model on the local model server (the worker's
``OpenAIAgentsPlugin`` gets a model provider for it; each model call is the plugin's
``invoke_model_activity``) and whose one tool is the quote activity through ``activity_as_tool``. Its
hooks are the SDK's own hook points for what the lifecycle's hooks do, each doing the same work
(:mod:`benchmarks.peer.policy`):

| hook | the SDK's hook point |
| --- | --- |
| request context | the agent's ``instructions`` as a function (called for every model turn) |
| plan guard | ``RunHooks.on_llm_end`` (after every model turn): raises on a tool call not on the allow-list |
| tool allow-list | a tool input guardrail on the quote tool (every call): ``reject_content`` for a refused tool |
| result redactor | a tool output guardrail on the quote tool (every call): ``reject_content`` with the masked result |
| answer redactor | an output guardrail on the final answer: trips when it would mask anything (the SDK cannot rewrite the answer) |
| audit | ``RunHooks.on_agent_end`` |

The workflow runs in Temporal's sandbox, as the plugin expects (it adds its passthrough modules). It
returns the answer and how many times each hook ran, so the benchmark checks every hook ran.

This module imports only what the workflow needs; the worker process is :mod:`benchmarks.peer.workers`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from agents import (
        Agent,
        AgentHookContext,
        GuardrailFunctionOutput,
        ModelResponse,
        OutputGuardrail,
        RunContextWrapper,
        RunHooks,
        Runner,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
        ToolOutputGuardrail,
        ToolOutputGuardrailData,
    )
    from temporalio.openai_agents.workflow import activity_as_tool

    from benchmarks.peer import AGENTS_MODEL, INSTRUCTIONS, PeerAnswer, PeerInput, policy
    from demo.tools import quote_price

AGENTS_WORKFLOW = "BenchAgentsPeer"


@activity.defn
async def stock_quote(symbol: str) -> dict[str, Any]:
    """Current price of a stock (read-only)."""
    return {"symbol": symbol, "price": quote_price(symbol), "currency": "USD"}


class PolicyRunHooks(RunHooks[Any]):
    """The plan guard after every model turn; the audit once the agent answers."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        self.counts["plan-guard"] += 1
        refused = policy.refused_tools(
            getattr(item, "name", "") for item in response.output if item.type == "function_call"
        )
        if refused:
            raise ApplicationError(f"the plan calls tools not on the allow-list: {refused}", non_retryable=True)

    async def on_agent_end(self, context: AgentHookContext[Any], agent: Agent[Any], output: Any) -> None:
        self.counts["audit"] += 1
        policy.audit(workflow.info().workflow_id, "completed", str(output))


def _quote_tool(counts: Counter[str]) -> Any:
    async def allow_list(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        counts["tool-allow-list"] += 1
        name = data.context.tool_name
        if policy.tool_allowed(name):
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.reject_content(policy.denial(name))

    async def redact_result(data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        counts["result-redactor"] += 1
        text = str(data.output)
        masked = policy.redact(text)
        return (
            ToolGuardrailFunctionOutput.allow()
            if masked == text
            else ToolGuardrailFunctionOutput.reject_content(masked)
        )

    tool = activity_as_tool(
        stock_quote, start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=3)
    )
    return dataclasses.replace(
        tool,
        tool_input_guardrails=[ToolInputGuardrail(guardrail_function=allow_list, name="tool-allow-list")],
        tool_output_guardrails=[ToolOutputGuardrail(guardrail_function=redact_result, name="result-redactor")],
    )


def _answer_redactor(counts: Counter[str]) -> OutputGuardrail[Any]:
    async def check(context: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> GuardrailFunctionOutput:
        counts["answer-redactor"] += 1
        text = str(output)
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=policy.redact(text) != text)

    return OutputGuardrail(guardrail_function=check, name="answer-redactor")


@workflow.defn(name=AGENTS_WORKFLOW)
class AgentsPeerWorkflow:
    """One request: the agent runs until the model answers in text."""

    @workflow.run
    async def run(self, input: PeerInput) -> PeerAnswer:
        counts: Counter[str] = Counter()

        async def instructions(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
            counts["request-context"] += 1
            return f"{INSTRUCTIONS}\n{policy.context_note(input.request)}"

        agent = Agent(
            name="quote-agent",
            instructions=instructions,
            model=AGENTS_MODEL,
            tools=[_quote_tool(counts)],
            output_guardrails=[_answer_redactor(counts)],
        )
        result = await Runner.run(agent, input.request, hooks=PolicyRunHooks(counts))
        return PeerAnswer(answer=str(result.final_output), hook_invocations=dict(counts))
