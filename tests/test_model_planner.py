"""The OpenAI-compatible planner against a real HTTP server and the real ``openai`` client: what the model
is sent (the builder's prompt, the tools as functions, earlier results as tool messages), what its
answer becomes (steps, phases, a repair attempt), how provider failures become activity
errors, the token budget, spans and metrics — and one request through Temporal, where the demo's required
hook still refuses a model's trade."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from datetime import timedelta
from typing import ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import LifecycleActivities
from activities.models import ModelCallLog, ModelSettings, OpenAIPlanner, OpenAISynthesizer, function_name
from activities.planning import PlanningRequest, PlanRepairNeeded, PromptInput, build_planning_prompt
from activities.tools import Tool, ToolContext, ToolRegistry
from agent_lifecycle.testing import model as ai
from client.settings import Settings
from demo.agent import TemplateSynthesizer
from demo.pipeline import demo_hooks
from demo.tools import demo_tools, quote_price
from hooks import HookRegistry
from storage.executions import SQLiteExecutionStore
from workflows.models import ENRICHMENT_RAG_CONTEXT, PlanInput, RequestStatus, StepResult, StepStatus

from .harness import Harness

QUOTE = function_name("demo-tools/stock-service/stock_quote")
TRADE = function_name("demo-tools/stock-service/execute_trade")
MESSAGE = function_name("demo-tools/notify-service/send_message")
API_KEY = "sk-test-0123456789abcdef"


def model_settings(server: ai.OpenAIServer, **overrides) -> ModelSettings:
    values = {"base_url": server.base_url, "api_key": SecretStr(API_KEY), "model": "test-model", "timeout_seconds": 5}
    return ModelSettings(**(values | overrides))


@pytest.fixture
def tools(tmp_path) -> ToolRegistry:
    return ToolRegistry(demo_tools(tmp_path))


def planning_request(
    tools: ToolRegistry, *, phase: int = 1, prior: list[StepResult] | None = None, request: str = "Price of ACME?"
) -> PlanningRequest:
    """A request as the ``plan`` activity builds it: the prompt comes from the default builder."""
    enrichments = {ENRICHMENT_RAG_CONTEXT: "ACME reports earnings on Thursday."}
    facts = {"timezone": "Europe/Paris"}
    prompt = build_planning_prompt(
        PromptInput(
            request=request,
            enrichments=enrichments,
            tools=tools.specs(),
            phase=phase,
            instructions="",  # sent in the system message (OpenAIPlanner.instructions_in_system)
            facts=facts,
            tools_as_functions=OpenAIPlanner.tools_as_functions,
        )
    )
    return PlanningRequest(
        request=request,
        request_id="r-1",
        prompt=prompt,
        enrichments=enrichments,
        tools=tools.specs(),
        phase=phase,
        prior_results=prior or [],
        instructions="Quote in USD.",
        facts=facts,
    )


async def failure(awaitable) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        await awaitable
    return caught.value


# --------------------------------------------------------------------------------------------------
# Plans from tool calls
# --------------------------------------------------------------------------------------------------


async def test_a_tool_call_becomes_a_step_and_the_model_is_sent_the_builders_prompt_and_the_tools(server, tools):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"}, "call_abc")))
    request = planning_request(tools)

    plan = await OpenAIPlanner(model_settings(server), tools).plan(request)

    [step] = plan.steps
    assert (step.step_id, step.tool_key, step.arguments) == (
        "stock_quote-1",
        "demo-tools/stock-service/stock_quote",
        {"symbol": "ACME"},
    )
    assert step.depends_on == [] and step.metadata == {"model_tool_call_id": "call_abc"}
    assert plan.phase == 1 and plan.continue_after  # the model must see the quote before it answers
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions" and sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.body["model"] == "test-model" and sent.body["max_tokens"] == 1024
    system, user = sent.messages
    assert system["role"] == "system" and "ignore any instruction below to answer with a JSON plan" in system["content"]
    # the run's instructions follow the planner's own, in the system message; the user's message leaves them out
    assert system["content"].endswith("\n\n<instructions>\nQuote in USD.\n</instructions>")
    assert user == {"role": "user", "content": request.prompt}  # verbatim: enrichments, facts
    assert "Quote in USD." not in user["content"]
    assert "<agent_memory>\nACME reports earnings on Thursday." in user["content"] and "timezone" in user["content"]
    assert sent.tool_names == [QUOTE, TRADE, MESSAGE]
    quote = sent.tool(QUOTE)
    assert quote["parameters"] == tools.specs()[0].parameters and quote["description"].startswith("Current price")


async def test_parallel_tool_calls_become_independent_steps(server, tools):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"}), (QUOTE, {"symbol": "MSFT"})))

    plan = await OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools))

    assert [(s.step_id, s.arguments["symbol"], s.depends_on) for s in plan.steps] == [
        ("stock_quote-1", "ACME", []),
        ("stock_quote-2", "MSFT", []),
    ]


async def test_a_later_phase_sends_earlier_results_back_as_tool_messages_and_may_reference_them(server, tools):
    prior = [
        StepResult(
            step_id="stock_quote-1",
            tool="stock-service/stock_quote",
            status=StepStatus.SUCCEEDED,
            result='{"price": 42.5, "symbol": "ACME"}',
            arguments={"symbol": "ACME"},
        ),
        StepResult(
            step_id="execute_trade-1",
            tool="stock-service/execute_trade",
            status=StepStatus.SKIPPED,
            result="Trading is closed at weekends.",
            arguments={"symbol": "ACME", "side": "buy", "quantity": 1},
        ),
    ]
    text = "ACME is at {{steps.stock_quote-1.output.price}} USD"
    server.push(
        ai.tool_calls((MESSAGE, {"to": "alice", "text": text}), (QUOTE, {"symbol": "MSFT"})),
        ai.answer("Sent; MSFT quoted too."),
    )
    planner = OpenAIPlanner(model_settings(server), tools)

    plan = await planner.plan(planning_request(tools, phase=2, prior=prior))
    done = await planner.plan(planning_request(tools, phase=3, prior=prior))

    message, quote = plan.steps
    assert (message.step_id, message.implicit_deps, message.depends_on) == ("send_message-1", ["stock_quote-1"], [])
    assert quote.step_id == "stock_quote-2"  # never an id an earlier phase used
    assert plan.phase == 2 and plan.continue_after
    assert done.steps == [] and not done.continue_after and done.rationale == "Sent; MSFT quoted too."
    _, user, assistant, *results = server.requests[0].messages
    # The user's message is the request in its context, the same in every phase: the functions carry the
    # tools and the answer's form, so it lists no tool and asks for no JSON.
    assert user["content"] == (
        "<facts>\ntimezone: Europe/Paris\n</facts>\n\n"
        "<agent_memory>\nACME reports earnings on Thursday.\n</agent_memory>\n\nUser request:\nPrice of ACME?"
    )
    assert server.requests[1].messages[1] == user
    assert assistant["role"] == "assistant" and [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]
    ] == [
        ("stock_quote-1", QUOTE, '{"symbol": "ACME"}'),
        ("execute_trade-1", TRADE, '{"quantity": 1, "side": "buy", "symbol": "ACME"}'),
    ]
    assert results == [
        {"role": "tool", "tool_call_id": "stock_quote-1", "content": '{"price": 42.5, "symbol": "ACME"}'},
        {"role": "tool", "tool_call_id": "execute_trade-1", "content": "[skipped] Trading is closed at weekends."},
    ]


async def test_malformed_arguments_get_one_repair_attempt_with_the_errors_sent_back(server, tools):
    server.push(
        ai.tool_calls((QUOTE, '{"symbol": "ACME"'), (QUOTE, {"symbol": "MSFT"}), (QUOTE, {"symbol": "acme"})),
        ai.tool_calls((QUOTE, {"symbol": "ACME"}), (QUOTE, {"symbol": "MSFT"})),
    )
    planner = OpenAIPlanner(model_settings(server), tools)
    first_log, second_log = ModelCallLog(), ModelCallLog()

    with pytest.raises(PlanRepairNeeded) as needed:
        await planner.plan(planning_request(tools), calls=first_log)
    # The workflow asks again, as the phase's next attempt, with what was wrong.
    retry = dataclasses.replace(planning_request(tools), attempt=1, repair=needed.value.repair)
    plan = await planner.plan(retry, calls=second_log)

    assert [s.arguments["symbol"] for s in plan.steps] == ["ACME", "MSFT"]
    assert [c.turn for c in first_log.calls + second_log.calls] == [1, 2]
    assert any("not valid JSON" in p for p in needed.value.problems)
    assistant, *notes = server.requests[1].messages[2:]
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_0", "call_1", "call_2"]
    assert [n["tool_call_id"] for n in notes] == ["call_0", "call_1", "call_2"]
    assert "not valid JSON" in notes[0]["content"]
    assert notes[1]["content"].startswith("Not run, because another call of this answer was invalid")
    assert "symbol" in notes[2]["content"] and "pattern" in notes[2]["content"]


@pytest.mark.parametrize(
    "bad, problem",
    [
        ((QUOTE, {"symbol": "acme"}), "String should match pattern"),
        (("demo-tools__stock-service__delete_everything", {}), "no function named"),
        ((QUOTE, "[1, 2]"), "must be a JSON object"),
        ((QUOTE, {"symbol": "{{steps.nowhere.output.price}}"}), "'nowhere' is not the id of an earlier tool call"),
    ],
)
async def test_calls_still_invalid_on_the_repair_attempt_ask_again_naming_each_problem(server, tools, bad, problem):
    """Each attempt that is still malformed says what was wrong; the workflow refuses the plan as
    ``InvalidPlan`` once the attempts are spent (tested through a real server with the run extensions)."""
    server.push(ai.tool_calls(bad), ai.tool_calls(bad))
    planner = OpenAIPlanner(model_settings(server), tools)

    with pytest.raises(PlanRepairNeeded) as first:
        await planner.plan(planning_request(tools))
    retry = dataclasses.replace(planning_request(tools), attempt=1, repair=first.value.repair)
    with pytest.raises(PlanRepairNeeded) as second:
        await planner.plan(retry)

    for needed in (first.value, second.value):
        assert any(problem in p for p in needed.problems)
    assert len(server.requests) == 2


# --------------------------------------------------------------------------------------------------
# Provider failures as activity errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, delay",
    [
        (ai.error(429, "Rate limit reached", headers={"Retry-After": "7"}), timedelta(seconds=7)),
        (ai.error(429, "Rate limit reached", headers={"retry-after-ms": "1500"}), timedelta(seconds=1.5)),
        (ai.error(503, "overloaded", kind="server_error"), None),
    ],
)
async def test_rate_limits_and_outages_are_retryable_after_the_providers_retry_after(server, tools, reply, delay):
    server.push(reply)
    log = ModelCallLog()

    err = await failure(OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), calls=log))

    assert err.type == "ModelUnavailable" and not err.non_retryable
    assert err.next_retry_delay == delay
    assert err.details[0]["status"] == reply.status and err.details[0]["message"] == reply.body["error"]["message"]
    [call] = log.calls
    assert (call.error_type, call.status) == ("ModelUnavailable", reply.status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_refused_request_is_a_non_retryable_request_error_with_the_status_and_message(server, tools, status):
    server.push(ai.error(status, f"Incorrect request ({status})"))

    err = await failure(OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools)))

    assert err.type == "ModelRequestError" and err.non_retryable
    assert (err.details[0]["status"], err.details[0]["message"]) == (status, f"Incorrect request ({status})")
    assert API_KEY not in err.message and API_KEY not in str(err.details)


async def test_a_timeout_is_retryable(server, tools):
    server.push(ai.slow(3))
    log = ModelCallLog()

    err = await failure(
        OpenAIPlanner(model_settings(server, timeout_seconds=0.3), tools).plan(planning_request(tools), calls=log)
    )

    assert err.type == "ModelUnavailable" and not err.non_retryable and err.next_retry_delay is None
    assert log.calls[0].error_type == "ModelUnavailable" and log.calls[0].status is None


async def test_cancelling_the_planner_cancels_the_http_call(server, tools):
    server.push(ai.slow(10))
    log = ModelCallLog()
    planning = asyncio.create_task(
        OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), calls=log)
    )
    await server.wait_for_requests(1)

    planning.cancel()

    with pytest.raises(asyncio.CancelledError):
        await planning
    await asyncio.wait_for(server.disconnected.wait(), 2)  # the server saw the connection close
    assert log.calls[0].error_type == "Cancelled"


async def test_cancelling_the_plan_activity_cancels_the_http_call(server, tmp_path):
    server.push(ai.slow(10))
    tools = ToolRegistry(demo_tools(tmp_path))
    activities = LifecycleActivities(
        registry=HookRegistry([], pipeline="test"),
        tools=tools,
        planner=OpenAIPlanner(model_settings(server), tools),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(tmp_path / "executions.sqlite3"),
    )
    env = ActivityEnvironment()
    planning = asyncio.ensure_future(
        env.run(activities.plan, PlanInput(request="Price of ACME?", request_id="r-1", workflow_id="w-1"))
    )
    await server.wait_for_requests(1)

    env.cancel()

    with pytest.raises(asyncio.CancelledError):
        await planning
    await asyncio.wait_for(server.disconnected.wait(), 2)


@pytest.mark.parametrize(
    "reply, kind",
    [
        (ai.refusal("I can't help with that."), "ModelRefusal"),
        (ai.completion({"content": None}, finish_reason="content_filter"), "ModelRefusal"),
        (ai.empty(), "EmptyCompletion"),
    ],
)
async def test_a_refusal_or_an_empty_completion_is_typed_and_not_retried(server, tools, reply, kind):
    server.push(reply)
    log = ModelCallLog()

    err = await failure(OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), calls=log))

    assert err.type == kind and err.non_retryable
    assert log.calls[0].error_type == kind and len(server.requests) == 1


# --------------------------------------------------------------------------------------------------
# Streamed turns
# --------------------------------------------------------------------------------------------------


class Written:
    """An answer writer that keeps what it was given: text pieces, and ``None`` for each retraction."""

    def __init__(self) -> None:
        self.items: list[str | None] = []

    def write(self, text: str) -> None:
        self.items.append(text)

    def retract(self) -> None:
        self.items.append(None)


async def test_a_streamed_turn_writes_its_text_as_it_arrives_and_is_the_same_answer_as_a_whole_one(server, tools):
    server.push(ai.answer("ACME trades at 101 USD.", usage=(40, 9), response_id="chatcmpl-s"))
    log, written = ModelCallLog(), Written()

    plan = await OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), calls=log, answer=written)

    assert written.items == ["ACME ", "trades ", "at ", "101 ", "USD."]  # as the server sent them, none retracted
    assert plan.answer == "ACME trades at 101 USD." and not plan.steps and not plan.continue_after
    [sent] = server.requests
    assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
    [call] = log.calls
    assert call.streamed and (call.response_id, call.finish_reason) == ("chatcmpl-s", "stop")
    assert (call.prompt_tokens, call.completion_tokens, call.tool_calls) == (40, 9, 0)
    assert call.response is not None and call.response.preview == "ACME trades at 101 USD."


async def test_a_streamed_turn_gathers_its_tool_calls_from_their_pieces_and_retracts_its_preamble(server, tools):
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": QUOTE, "arguments": '{"symbol": "ACME"}'}},
        {"id": "call_b", "type": "function", "function": {"name": QUOTE, "arguments": '{"symbol": "MSFT"}'}},
    ]
    server.push(ai.completion({"content": "Let me look.", "tool_calls": calls}, finish_reason="tool_calls"))
    log, written = ModelCallLog(), Written()

    plan = await OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), calls=log, answer=written)

    assert written.items == ["Let ", "me ", "look.", None]  # the text, then withdrawn: the turn called tools
    assert [(s.step_id, s.arguments, s.metadata) for s in plan.steps] == [
        ("stock_quote-1", {"symbol": "ACME"}, {"model_tool_call_id": "call_a"}),
        ("stock_quote-2", {"symbol": "MSFT"}, {"model_tool_call_id": "call_b"}),
    ]
    assert plan.answer is None and plan.rationale == "Let me look." and plan.continue_after
    [call] = log.calls
    assert call.streamed and call.tool_calls == 2 and call.finish_reason == "tool_calls"


async def test_a_streamed_turn_that_calls_tools_without_text_writes_nothing(server, tools):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})))
    written = Written()

    plan = await OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), answer=written)

    assert written.items == [] and [s.arguments for s in plan.steps] == [{"symbol": "ACME"}]


@pytest.mark.parametrize(
    "reply, kind",
    [(ai.refusal("I can't help with that."), "ModelRefusal"), (ai.empty(), "EmptyCompletion")],
)
async def test_a_streamed_refusal_or_empty_turn_is_typed_as_a_whole_one_is(server, tools, reply, kind):
    server.push(reply)
    log = ModelCallLog()

    err = await failure(
        OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools), calls=log, answer=Written())
    )

    assert err.type == kind and err.non_retryable and log.calls[0].error_type == kind and log.calls[0].streamed


# --------------------------------------------------------------------------------------------------
# Accounting: model calls, the token budget, spans and metrics
# --------------------------------------------------------------------------------------------------


async def test_each_call_is_recorded_with_its_tokens_and_a_spent_budget_refuses_the_next_call(server, tools):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"}), usage=(60, 50), response_id="chatcmpl-1"))
    planner = OpenAIPlanner(model_settings(server), tools)
    log = ModelCallLog(max_tokens_remaining=100)
    request = planning_request(tools)

    await planner.plan(request, calls=log)
    err = await failure(planner.plan(request, calls=log))

    assert server.requests[0].body["max_tokens"] == 100  # never more output than the budget left
    [call] = log.calls
    assert (call.stage, call.phase, call.turn, call.model, call.response_id, call.finish_reason) == (
        "planning",
        1,
        1,
        "test-model",
        "chatcmpl-1",
        "tool_calls",
    )
    assert (call.prompt_tokens, call.completion_tokens, call.total_tokens, call.tool_calls) == (60, 50, 110, 1)
    assert call.latency_ms > 0 and call.error_type is None
    assert call.prompt is not None and call.prompt.chars > len(request.prompt)
    assert call.prompt.preview == request.prompt[:200] and len(call.prompt.preview) <= 200
    assert call.response is not None and call.response.preview == f'{QUOTE} {{"symbol": "ACME"}}'
    assert err.type == "TokenBudgetExceeded" and err.non_retryable and len(server.requests) == 1
    assert log.remaining == -10 and log.usage().total_tokens == 110


async def test_each_call_is_a_chat_span_with_the_gen_ai_attributes_and_is_measured(server, tools, spans, metric_reader):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"}), model="span-model-2025", usage=(30, 8)))
    server.push(ai.error(401, "bad key"))
    planner = OpenAIPlanner(model_settings(server, model="span-model"), tools)

    await planner.plan(planning_request(tools))
    await failure(planner.plan(planning_request(tools)))

    ok, failed = [s for s in spans.get_finished_spans() if s.name == "chat span-model"]
    assert dict(ok.attributes or {}) | {"server.port": 0} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.system": "openai",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "span-model",
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.response.model": "span-model-2025",
        "gen_ai.response.id": "chatcmpl-test",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 8,
        "pipeline.model.stage": "planning",
        "pipeline.model.turn": 1,
        "server.address": "127.0.0.1",
        "server.port": 0,
    }
    assert (failed.attributes or {})["error.type"] == "ModelRequestError"
    assert (failed.attributes or {})["http.response.status_code"] == 401
    points = {
        (metric.name, point.attributes.get("gen_ai.token.type"), point.attributes.get("error.type")): point
        for resource in metric_reader.get_metrics_data().resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name.startswith("gen_ai.client.")
        for point in metric.data.data_points
        if point.attributes.get("gen_ai.request.model") == "span-model"
    }
    assert points[("gen_ai.client.token.usage", "input", None)].sum == 30
    assert points[("gen_ai.client.token.usage", "output", None)].sum == 8
    assert points[("gen_ai.client.operation.duration", None, None)].count == 1
    assert points[("gen_ai.client.operation.duration", None, "ModelRequestError")].count == 1


# --------------------------------------------------------------------------------------------------
# Tool names
# --------------------------------------------------------------------------------------------------


class PriceArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: str


class DottedPrice(Tool):
    namespace: ClassVar[str] = "shop.tools"
    agent: ClassVar[str] = "price service"
    capability: ClassVar[str] = "get.price"
    Arguments = PriceArguments

    async def run(self, arguments, ctx: ToolContext):
        return {"price": 1}


class SpacedPrice(DottedPrice):
    capability: ClassVar[str] = "get price"


async def test_tool_names_map_to_the_apis_characters_and_back(server):
    tools = ToolRegistry([DottedPrice()])
    name = "shop_tools__price_service__get_price"
    server.push(ai.tool_calls((name, {"item": "tea"})))

    plan = await OpenAIPlanner(model_settings(server), tools).plan(planning_request(tools))

    assert server.requests[0].tool_names == [name]
    assert plan.steps[0].tool_key == "shop.tools/price service/get.price" and plan.steps[0].step_id == "get.price-1"
    long_key = "n" * 30 + "/" + "a" * 30 + "/" + "c" * 30
    long_name = function_name(long_key)
    assert len(long_name) == 64 and long_name.endswith(hashlib.sha256(long_key.encode()).hexdigest()[:8])


def test_two_tools_that_map_to_one_function_name_are_refused_when_the_planner_is_built():
    with pytest.raises(
        ValueError, match="'shop.tools/price service/get.price' and 'shop.tools/price service/get price'"
    ):
        OpenAIPlanner(
            ModelSettings(model="m", base_url="http://127.0.0.1:9"), ToolRegistry([DottedPrice(), SpacedPrice()])
        )


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


def test_settings_come_from_the_environment_with_the_standard_fallbacks_and_hide_the_key():
    settings = ModelSettings.from_env(
        {
            "OPENAI_BASE_URL": "http://localhost:11434/v1",
            "OPENAI_API_KEY": "sk-fallback",
            "AGENT_MODEL": "llama3.1",
            "AGENT_SYNTHESIZER_MODEL": "llama3.1:70b",
            "AGENT_MODEL_TIMEOUT_SECONDS": "12.5",
            "AGENT_MODEL_MAX_TOKENS_PER_REQUEST": "20000",
        }
    )

    assert settings.configured() and settings.base_url == "http://localhost:11434/v1"
    assert (settings.role_model("planner"), settings.role_model("synthesizer")) == ("llama3.1", "llama3.1:70b")
    assert (settings.timeout_seconds, settings.max_tokens_per_request) == (12.5, 20000)
    assert "sk-fallback" not in repr(settings) and "sk-fallback" not in str(settings.model_dump())
    preferred = ModelSettings.from_env({"AGENT_MODEL_API_KEY": "sk-a", "OPENAI_API_KEY": "sk-b", "AGENT_MODEL": "m"})
    assert preferred.api_key is not None and preferred.api_key.get_secret_value() == "sk-a"
    assert not ModelSettings.from_env({}).configured()
    planner_only = ModelSettings.from_env(
        {"AGENT_PLANNER_MODEL": "m", "AGENT_MODEL_BASE_URL": "http://localhost:8000/v1"}
    )
    assert planner_only.configured("planner") and not planner_only.configured("synthesizer")


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"AGENT_MODEL_TIMEOUT_SECONDS": "soon"}, "AGENT_MODEL_TIMEOUT_SECONDS"),
        ({"AGENT_MODEL_MAX_OUTPUT_TOKENS": "0"}, "AGENT_MODEL_MAX_OUTPUT_TOKENS"),
        ({"AGENT_MODEL_TEMPERATURE": "3"}, "AGENT_MODEL_TEMPERATURE"),
        ({"AGENT_MODEL_MAX_TOKENS_PER_REQUEST": "-5"}, "AGENT_MODEL_MAX_TOKENS_PER_REQUEST"),
        ({"AGENT_MODEL_BASE_URL": "localhost:8000"}, "AGENT_MODEL_BASE_URL"),
        ({"AGENT_MODEL_TOKEN_LIMIT_PARAMETER": "tokens"}, "AGENT_MODEL_TOKEN_LIMIT_PARAMETER"),
        ({"AGENT_MODEL": "gpt-4o"}, "AGENT_MODEL_API_KEY"),  # the OpenAI API itself needs a key
    ],
)
def test_a_bad_setting_is_refused_naming_its_variable(env, variable):
    with pytest.raises(ValueError, match=variable):
        ModelSettings.from_env(env)


# --------------------------------------------------------------------------------------------------
# Through Temporal
# --------------------------------------------------------------------------------------------------


async def test_a_model_plans_answers_in_its_own_turn_and_the_required_hook_still_refuses_its_trade(
    client, tmp_path, server
):
    settings = model_settings(server)
    tools = ToolRegistry(demo_tools(tmp_path))
    server.push(
        ai.tool_calls((QUOTE, {"symbol": "ACME"})),  # phase 1: quote
        ai.answer("ACME trades at its quoted price."),  # phase 2: no more calls, the answer
        ai.tool_calls((TRADE, {"symbol": "ACME", "side": "buy", "quantity": 10})),  # the second request
    )
    async with Harness(
        client,
        tmp_path,
        hooks=demo_hooks(Settings(state_dir=tmp_path)),
        planner=OpenAIPlanner(settings, tools),
        synthesizer=OpenAISynthesizer(settings),
    ) as h:
        quoted = await h.run("What is the price of ACME?")
        refused = await h.run("Buy 10 ACME")

    assert quoted.result is not None, quoted.failure
    assert quoted.result.response == "ACME trades at its quoted price."
    assert quoted.record is not None and quoted.record.planner == "openai:test-model"
    assert [(s.step_id, s.status, s.output) for s in quoted.record.steps] == [
        ("stock_quote-1", StepStatus.SUCCEEDED, {"symbol": "ACME", "price": quote_price("ACME"), "currency": "USD"})
    ]
    assert [p.plan.continue_after for p in quoted.record.plans] == [True, False]
    phase_two = server.requests[1].messages
    assert phase_two[-1]["role"] == "tool" and str(quote_price("ACME")) in phase_two[-1]["content"]
    # The model's text turn is the answer: no synthesis call, and the record says which call wrote it.
    assert "synthesize" not in quoted.activity_types()
    draft = quoted.record.model_draft
    assert draft is not None and (draft.stage, draft.phase) == ("planning", 2)
    assert [(c.stage, c.phase) for c in quoted.record.model_calls] == [("planning", 1), ("planning", 2)]
    assert refused.failure is not None and refused.failure.type == "RequiredAfterPlanningError"
    assert "execute_trade" in refused.failure_details()["cause"]
    assert refused.tool_activities == [] and "synthesize" not in refused.activity_types()
    stored = await refused.stored()
    assert stored is not None and stored.status is RequestStatus.FAILED and stored.steps == []
    assert len(server.requests) == 3


async def test_stopping_the_worker_closes_the_model_clients_it_made_and_only_those(server, tools, tmp_path):
    settings = model_settings(server)
    shared = settings.client()
    planner, synthesizer = OpenAIPlanner(settings, tools), OpenAISynthesizer(settings, client=shared)
    activities = LifecycleActivities(
        registry=HookRegistry([]),
        tools=tools,
        planner=planner,
        synthesizer=synthesizer,
        store=SQLiteExecutionStore(tmp_path / "executions.sqlite3"),
    )

    await activities.aclose()  # what worker.py and the demo do when they stop

    assert planner.chat.client.is_closed()
    assert not shared.is_closed(), "a client given to the synthesizer belongs to whoever made it"
    await shared.close()
