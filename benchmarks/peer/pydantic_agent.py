"""pydantic-ai's agent for the benchmark, durable through its Temporal integration, set up as its
documentation sets it up: an ``Agent`` with the ``TemporalDurability`` capability (the path that replaces
the deprecated ``TemporalAgent`` wrapper), a name (its activities are named after it), a Chat Completions
model (``OpenAIChatModel`` with an ``OpenAIProvider`` on the local model server, the client's retries off
as the OpenAI Agents peer has them: Temporal retries the model activity), the quote tool as a function
tool (the capability runs it as an activity), and the hooks pydantic-ai offers for what the lifecycle's
hooks do, each doing the same work (:mod:`benchmarks.peer.policy`):

| hook | pydantic-ai's hook point |
| --- | --- |
| request context | an instructions function (called for every model request) |
| plan guard | ``Hooks`` ``after_model_request`` (after every model turn): raises on a tool call not on the allow-list |
| tool allow-list | ``Hooks`` ``before_tool_execute`` (every call): ``SkipToolExecution`` with a denial for a refused tool |
| result redactor | ``Hooks`` ``after_tool_execute`` (every call): the result with account numbers masked |
| answer redactor | ``Hooks`` ``after_run``: the run's output with account numbers masked |
| audit | ``Hooks`` ``after_run``, after the redactor |

The hooks run in workflow code, as pydantic-ai runs every capability hook that is not made a durable
operation. Inside a workflow they must be attached when the agent is built (the integration refuses
capabilities given per run), so each run's workflow hands them its counter through :data:`HOOK_COUNTS`.

The agent is built once per worker process, from ``BENCH_MODEL_URL`` (the worker sets it from its
``--model-url``; unset, a port nothing listens on), in this module: the workflow module
(:mod:`benchmarks.peer.pydantic_peer`) imports it through Temporal's sandbox, as the integration's
documentation advises for modules the workflow only uses, so each workflow run does not build it again.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from contextvars import ContextVar
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent, ModelRequestContext, RunContext, ToolDefinition
from pydantic_ai.capabilities import Hooks
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.exceptions import SkipToolExecution
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.run import AgentRunResult
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from benchmarks.peer import INSTRUCTIONS, PYDANTIC_MODEL, PYDANTIC_MODEL_URL_VARIABLE, policy
from demo.tools import quote_price

AGENT_NAME = "quote_agent"
# hook -> invocations in the current run; the workflow sets a fresh counter before it runs the agent.
HOOK_COUNTS: ContextVar[Counter[str]] = ContextVar("bench_pydantic_ai_hook_counts")


async def stock_quote(symbol: str) -> dict[str, Any]:
    """Current price of a stock (read-only)."""
    return {"symbol": symbol, "price": quote_price(symbol), "currency": "USD"}


def _counted(hook: str) -> None:
    HOOK_COUNTS.get()[hook] += 1


async def request_context(ctx: RunContext[Any]) -> str:
    _counted("request-context")
    return policy.context_note(ctx.prompt if isinstance(ctx.prompt, str) else "")


hooks: Hooks[Any] = Hooks()


@hooks.on.after_model_request
async def plan_guard(
    ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
) -> ModelResponse:
    _counted("plan-guard")
    refused = policy.refused_tools(part.tool_name for part in response.parts if isinstance(part, ToolCallPart))
    if refused:
        raise ApplicationError(f"the plan calls tools not on the allow-list: {refused}", non_retryable=True)
    return response


@hooks.on.before_tool_execute
async def tool_allow_list(
    ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: dict[str, Any]
) -> dict[str, Any]:
    _counted("tool-allow-list")
    if not policy.tool_allowed(call.tool_name):
        raise SkipToolExecution(policy.denial(call.tool_name))
    return args


@hooks.on.after_tool_execute
async def result_redactor(
    ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: dict[str, Any], result: Any
) -> Any:
    _counted("result-redactor")
    return policy.redact_value(result)


@hooks.on.after_run
async def answer_redactor(ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
    _counted("answer-redactor")
    masked = policy.redact(str(result.output))
    return result if masked == result.output else dataclasses.replace(result, output=masked)


@hooks.on.after_run
async def audit(ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
    _counted("audit")
    policy.audit(workflow.info().workflow_id, "completed", str(result.output))
    return result


def build_agent(model_url: str) -> Agent[None, str]:
    client = AsyncOpenAI(base_url=model_url, api_key="bench-no-key", max_retries=0)
    model = OpenAIChatModel(PYDANTIC_MODEL, provider=OpenAIProvider(openai_client=client))
    return Agent(
        model,
        name=AGENT_NAME,
        instructions=[INSTRUCTIONS, request_context],
        tools=[stock_quote],
        capabilities=[hooks, TemporalDurability()],
    )


agent = build_agent(os.environ.get(PYDANTIC_MODEL_URL_VARIABLE, "http://127.0.0.1:9/v1"))
