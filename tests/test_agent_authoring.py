"""The agent as an agent developer writes it, through Temporal and a real model endpoint: instructions per
pipeline and per request, the model chosen in code, tools from typed functions, several pipelines on one
worker, and a reviewer's rejection told to the model."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import Field, SecretStr
from temporalio.exceptions import ApplicationError

from activities import ToolContext, tool
from activities.models import ModelSettings, function_name
from activities.models.planner import PLANNER_SYSTEM_PROMPT
from agent_lifecycle.testing import model as ai
from client import Settings
from client.api import AgentClient
from client.cli import _command, _parser
from client.pipeline import PipelineSettingsError, build_pipeline
from demo.tools import demo_tools
from hooks import RunPatch
from worker import build_workers
from workflows.models import PlanStep, RequestInput, StageSettings, ToolDecision

from .doubles import FixedPlanner
from .harness import Harness

QUOTE = function_name("demo-tools/stock-service/stock_quote")


def settings_for(tmp_path, server: ai.OpenAIServer | None = None, **env: str) -> Settings:
    values = {"AGENT_STATE_DIR": str(tmp_path / "state"), **env}
    if server is not None:
        values |= {"AGENT_MODEL_BASE_URL": server.base_url, "AGENT_MODEL_API_KEY": "sk-test"}
    return Settings.from_env(values)


def model_settings(server: ai.OpenAIServer, name: str = "m") -> ModelSettings:
    return ModelSettings(base_url=server.base_url, api_key=SecretStr("sk-test"), model=name, timeout_seconds=5)


def pipeline_harness(client, tmp_path, **pipeline: Any) -> Harness:
    """A harness whose worker serves the pipeline ``build_pipeline`` makes of ``pipeline``."""
    h = Harness(client, tmp_path)
    settings = pipeline.pop("settings", None) or settings_for(tmp_path)
    pipeline.setdefault("tools", demo_tools(tmp_path))
    pipeline.setdefault("store", h.store)
    pipeline.setdefault("ungated", True)  # these pipelines test authoring, not the gate
    h.activities = build_pipeline(settings, **pipeline)
    return h


def system_and_user(received: ai.Received) -> tuple[str, str]:
    system, user, *_ = received.messages
    assert (system["role"], user["role"]) == ("system", "user")
    return system["content"], user["content"]


class Formal:
    """A before_run hook that sees the instructions it is given and adds one of its own."""

    name = "formal"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def before_run(self, ctx, run):
        self.seen.append(run.instructions)
        return RunPatch(instructions=run.instructions + "\nBe formal.")


# --------------------------------------------------------------------------------------------------
# Instructions
# --------------------------------------------------------------------------------------------------


async def test_the_pipelines_instructions_then_the_requests_reach_the_planner_and_the_synthesizer(
    client, tmp_path, server
):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("Done."), ai.answer("ACME is at 42.5."))
    formal = Formal()
    async with pipeline_harness(
        client,
        tmp_path,
        model=model_settings(server),
        instructions="You are the desk's quote assistant.",
        hooks=[formal],
        stage_settings=StageSettings(dedicated_synthesis=True),
    ) as h:
        request = RequestInput(request="Price of ACME?", instructions="Answer in euros.")
        outcome = await h.finish(await h.start(request.model_dump(mode="json")))

    assert outcome.result is not None, outcome.failure
    assert outcome.result.response == "ACME is at 42.5."
    # before_run saw the pipeline's instructions, then the request's, and rewrote them
    assert formal.seen == ["You are the desk's quote assistant.\n\nAnswer in euros."]
    told = "You are the desk's quote assistant.\n\nAnswer in euros.\nBe formal."
    planning, replanning, synthesis = server.requests
    for received in (planning, replanning, synthesis):
        system, user = system_and_user(received)
        # the model's system message: the planner's or synthesizer's own prompt, then the instructions
        assert system.endswith(f"\n\n<instructions>\n{told}\n</instructions>")
        assert "<instructions>" not in user and user.endswith("Price of ACME?")
    assert system_and_user(planning) == system_and_user(replanning)  # the same in every phase
    assert outcome.record is not None and outcome.record.instructions == told
    stored = await outcome.stored()
    assert stored is not None and stored.instructions == told


async def test_a_request_without_instructions_runs_with_the_pipelines_and_one_without_any_sends_none(
    client, tmp_path, server
):
    server.push(ai.answer("Hello."), ai.answer("Hello again."))
    async with pipeline_harness(client, tmp_path, model=model_settings(server), instructions="Be brief.") as h:
        first = await h.run("Say hello")
    async with pipeline_harness(client, tmp_path, model=model_settings(server)) as h:
        second = await h.run("Say hello")

    assert first.result is not None and second.result is not None
    briefed, plain = system_and_user(server.requests[0]), system_and_user(server.requests[1])
    assert briefed == (
        f"{PLANNER_SYSTEM_PROMPT}\n\n<instructions>\nBe brief.\n</instructions>",
        "User request:\nSay hello",
    )
    assert plain == (PLANNER_SYSTEM_PROMPT, "User request:\nSay hello")
    assert first.record is not None and first.record.instructions == "Be brief."
    assert second.record is not None and second.record.instructions == ""


async def test_the_client_and_the_cli_give_a_request_its_own_instructions(client, tmp_path, server, capsys):
    server.push(ai.answer("Bonjour."), ai.answer("Hallo."))
    async with pipeline_harness(client, tmp_path, model=model_settings(server), instructions="Be brief.") as h:
        agents = AgentClient(client, Settings(task_queue=h.task_queue))
        by_client = await h.finish(await agents.start("Say hello", instructions="Answer in French."))
        args = _parser().parse_args(["run", "Say hello", "--instructions", "Answer in German."])
        assert await _command(agents, args) == 0
        [workflow_id] = [line.split()[1] for line in capsys.readouterr().err.splitlines() if line.startswith("started")]
        by_cli = await h.finish(client.get_workflow_handle(workflow_id))

    assert by_client.result is not None and by_cli.result is not None
    told = [system_and_user(received)[0].split("<instructions>\n", 1)[1] for received in server.requests]
    assert told == [
        "Be brief.\n\nAnswer in French.\n</instructions>",
        "Be brief.\n\nAnswer in German.\n</instructions>",
    ]
    assert by_cli.record is not None and by_cli.record.instructions == "Be brief.\n\nAnswer in German."


def test_a_requests_instructions_are_bounded_text():
    with pytest.raises(ValueError, match="instructions"):
        RequestInput(request="hi", instructions="x" * 8_001)
    with pytest.raises(ValueError, match="instructions"):
        RequestInput.model_validate({"request": "hi", "instructions": {"role": "system"}})


# --------------------------------------------------------------------------------------------------
# The model chosen in code
# --------------------------------------------------------------------------------------------------


async def test_the_model_named_in_code_is_the_one_called_on_the_settings_endpoint(client, tmp_path, server):
    server.push(ai.answer("Hello."))
    settings = settings_for(tmp_path, server)
    async with pipeline_harness(client, tmp_path, settings=settings, model="desk-model") as h:
        outcome = await h.run("Say hello")

    assert outcome.result is not None and outcome.result.response == "Hello."
    [sent] = server.requests
    assert sent.body["model"] == "desk-model"
    assert outcome.record is not None and outcome.record.planner == "openai:desk-model"


def test_a_model_variable_naming_another_model_than_the_code_stops_the_pipeline(tmp_path, server):
    for variable in ("AGENT_MODEL", "AGENT_PLANNER_MODEL", "AGENT_SYNTHESIZER_MODEL"):
        settings = settings_for(tmp_path, server, **{variable: "env-model"})
        with pytest.raises(PipelineSettingsError, match=f"^{variable}: .*'desk-model'.*'env-model'"):
            build_pipeline(settings, model="desk-model")
        with pytest.raises(PipelineSettingsError, match=f"^{variable}: "):
            build_pipeline(settings, model=model_settings(server, "desk-model"))
    # the same model in both places is one choice, not a conflict
    same = build_pipeline(settings_for(tmp_path, server, AGENT_MODEL="desk-model"), model="desk-model")
    assert same.planner.name == "openai:desk-model"
    with pytest.raises(ValueError, match="names no model"):
        build_pipeline(settings_for(tmp_path, server), model=" ")


# --------------------------------------------------------------------------------------------------
# Tools from typed functions
# --------------------------------------------------------------------------------------------------

calls: list[tuple[str, str, str]] = []


@tool(agent="desk", read_only=True)
async def desk_quote(
    symbol: Annotated[str, Field(pattern=r"^[A-Z]{1,5}$")], currency: str = "USD", ctx: ToolContext | None = None
) -> dict:
    """The desk's price of a stock.

    Args:
        symbol: The ticker, in upper case.
        currency: The price's currency.
    """
    assert ctx is not None
    calls.append((symbol, currency, ctx.idempotency_key))
    return {"symbol": symbol, "price": 42.5, "currency": currency}


async def test_the_model_is_offered_a_function_tool_its_bad_call_is_refused_and_its_good_call_runs(
    client, tmp_path, server
):
    name = function_name(desk_quote.spec().key)
    server.push(
        ai.tool_calls((name, {"symbol": "acme"})),
        ai.tool_calls((name, {"symbol": "ACME", "currency": "EUR"})),
        ai.answer("ACME is at 42.5 EUR."),
    )
    calls.clear()
    async with pipeline_harness(client, tmp_path, model=model_settings(server), tools=[desk_quote]) as h:
        outcome = await h.run("Price of ACME in euros?")

    assert outcome.result is not None, outcome.failure
    assert outcome.result.response == "ACME is at 42.5 EUR."
    offered = server.requests[0].tool(name)
    assert offered["description"] == "The desk's price of a stock."
    assert offered["parameters"]["properties"]["symbol"]["description"] == "The ticker, in upper case."
    assert set(offered["parameters"]["properties"]) == {"symbol", "currency"}
    # the malformed call never ran: the model was told why and called again
    repair = server.requests[1].messages[-1]
    assert repair["role"] == "tool" and "symbol" in repair["content"] and repair["content"].startswith("Not run")
    assert [(symbol, currency) for symbol, currency, _ in calls] == [("ACME", "EUR")]
    assert [(s.tool, s.status) for s in outcome.result.steps] == [("desk/desk_quote", "succeeded")]
    assert '"price": 42.5' in server.requests[2].messages[-1]["content"]


# --------------------------------------------------------------------------------------------------
# Several pipelines on one worker process
# --------------------------------------------------------------------------------------------------


async def test_two_pipelines_in_one_process_each_serve_their_task_queue_with_their_own_parts(client, tmp_path, server):
    formal = Formal()
    desk, helpdesk = Harness(client, tmp_path), Harness(client, tmp_path)
    desk.activities = build_pipeline(
        settings_for(tmp_path),
        name="desk",
        model=model_settings(server, "desk-model"),
        instructions="You quote prices.",
        tools=[desk_quote],
        store=desk.store,
        ungated=True,
    )
    helpdesk.activities = build_pipeline(
        settings_for(tmp_path),
        name="helpdesk",
        model=model_settings(server, "help-model"),
        instructions="You answer questions.",
        hooks=[formal],
        tools=demo_tools(tmp_path),
        store=helpdesk.store,
        ungated=True,
    )
    workers = build_workers(client, {desk.task_queue: desk.activities, helpdesk.task_queue: helpdesk.activities})
    server.push(ai.answer("Desk here."), ai.answer("Helpdesk here."))
    async with workers[0], workers[1]:
        first = await desk.run("Who are you?")
        second = await helpdesk.run("Who are you?")
    await desk.replay()
    await helpdesk.replay()

    assert first.result is not None and first.result.response == "Desk here."
    assert second.result is not None and second.result.response == "Helpdesk here."
    to_desk, to_helpdesk = server.requests
    assert (to_desk.body["model"], to_helpdesk.body["model"]) == ("desk-model", "help-model")
    assert to_desk.tool_names == [function_name(desk_quote.spec().key)]
    assert QUOTE in to_helpdesk.tool_names and function_name(desk_quote.spec().key) not in to_helpdesk.tool_names
    assert system_and_user(to_desk)[0].endswith("<instructions>\nYou quote prices.\n</instructions>")
    assert system_and_user(to_helpdesk)[0].endswith(
        "<instructions>\nYou answer questions.\nBe formal.\n</instructions>"
    )
    assert formal.seen == ["You answer questions."]  # the desk's requests never reached the helpdesk's hook
    assert first.record is not None and second.record is not None
    assert (first.record.pipeline, second.record.pipeline) == ("desk", "helpdesk")


def test_one_worker_process_refuses_an_ambiguous_set_of_pipelines(client, tmp_path):
    one = build_pipeline(settings_for(tmp_path), name="one", tools=demo_tools(tmp_path))
    other = build_pipeline(settings_for(tmp_path), name="one", tools=demo_tools(tmp_path))
    with pytest.raises(ValueError, match="needs at least one"):
        build_workers(client, {})
    with pytest.raises(ValueError, match="one pipeline is given for task queues 'a' and 'b'"):
        build_workers(client, {"a": one, "b": one})
    with pytest.raises(ValueError, match="'a' and 'b' are both named 'one'"):
        build_workers(client, {"a": one, "b": other})


# --------------------------------------------------------------------------------------------------
# A reviewer's rejection told to the model
# --------------------------------------------------------------------------------------------------

transfers: list[tuple[str, int]] = []


@tool(agent="bank", approval_required=True)
async def transfer(to: str, amount: Annotated[int, Field(gt=0)]) -> dict:
    """Transfer money to someone.

    Args:
        to: Who receives it.
        amount: How much, in whole euros.
    """
    transfers.append((to, amount))
    return {"to": to, "amount": amount, "done": True}


async def reject_first_checkpoint(h: Harness, text: str) -> tuple[Any, str]:
    handle = await h.start(text)
    checkpoint = await h.wait_for_checkpoint(handle)
    await handle.signal(
        "reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "carol", "reason": "over the daily limit"}
    )
    return await h.finish(handle), checkpoint.checkpoint_id


async def test_a_rejection_told_to_the_model_skips_the_calls_and_the_model_answers_from_it(client, tmp_path, server):
    name = function_name(transfer.spec().key)
    server.push(
        ai.tool_calls((name, {"to": "bob", "amount": 5000})),
        ai.answer("I could not send the money: carol rejected the transfer as over the daily limit."),
    )
    transfers.clear()
    async with pipeline_harness(
        client, tmp_path, model=model_settings(server), tools=[transfer], on_reject="tell_model"
    ) as h:
        outcome, checkpoint_id = await reject_first_checkpoint(h, "Send bob 5000 euros")

    assert outcome.result is not None, outcome.failure
    assert outcome.result.response.startswith("I could not send the money")
    assert transfers == []
    assert "execute_tool_step" not in outcome.activity_types()
    # the model's next turn read the rejection as the call's result
    told = server.requests[1].messages[-1]
    assert told["role"] == "tool"
    assert told["content"] == "[skipped] bank/transfer was not run: carol rejected it: over the daily limit"
    record = outcome.record
    assert record is not None
    [step] = record.steps
    assert (step.status.value, step.skip_reason, step.skip_detail) == ("skipped", "confirmation", "rejected by carol")
    [decided] = record.checkpoints
    assert (decided.checkpoint_id, decided.status.value, decided.reviewer, decided.comment) == (
        checkpoint_id,
        "rejected",
        "carol",
        "over the daily limit",
    )
    stored = await outcome.stored()
    assert stored is not None and stored.status.value == "succeeded"
    assert stored.checkpoints[0].status.value == "rejected" and stored.steps[0].skip_detail == "rejected by carol"


async def test_by_default_a_rejection_still_fails_the_request_before_any_call_runs(client, tmp_path, server):
    server.push(ai.tool_calls((function_name(transfer.spec().key), {"to": "bob", "amount": 5000})))
    transfers.clear()
    async with pipeline_harness(client, tmp_path, model=model_settings(server), tools=[transfer]) as h:
        outcome, _ = await reject_first_checkpoint(h, "Send bob 5000 euros")

    assert isinstance(outcome.failure, ApplicationError)
    assert outcome.failure.type == "CheckpointRejected" and outcome.failure.non_retryable
    assert transfers == [] and len(server.requests) == 1
    assert outcome.record is not None and outcome.record.steps == []


class InEuros:
    """A before_tool hook that rewrites a function tool's arguments, as it would a class tool's."""

    name = "in-euros"

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def before_tool(self, ctx, call):
        self.seen.append(call.tool_key)
        return ToolDecision.modify({**call.arguments, "currency": "EUR"})


async def test_a_rule_planner_calls_a_function_tool_by_its_key_through_its_hooks(client, tmp_path):
    def step(step_id: str, arguments: dict[str, Any]) -> PlanStep:
        return PlanStep(
            step_id=step_id, namespace="functions", agent="desk", capability="desk_quote", arguments=arguments
        )

    planner = FixedPlanner(step("q-1", {"symbol": "ACME"}))
    guard = InEuros()
    calls.clear()
    async with pipeline_harness(client, tmp_path, planner=planner, tools=[desk_quote], hooks=[guard]) as h:
        outcome = await h.run("Price of ACME?")
    refusing = Harness(client, tmp_path, planner=FixedPlanner(step("q-1", {"symbol": 5})), tools=[desk_quote])
    async with refusing:
        invalid = await refusing.run("Price of 5?")

    assert outcome.result is not None, outcome.failure
    assert guard.seen == ["functions/desk/desk_quote"]
    assert [(symbol, currency) for symbol, currency, _ in calls] == [("ACME", "EUR")]  # rewritten, then run
    [ran] = outcome.result.steps
    assert (ran.tool, ran.status) == ("desk/desk_quote", "succeeded")
    # arguments that do not fit the function's hints never reach it: the plan is invalid
    assert isinstance(invalid.failure, ApplicationError), invalid.result
    assert invalid.failure.type == "PlanningFailed" and "argument symbol: Input should be a valid string" in str(
        invalid.failure
    )
    assert len(calls) == 1
