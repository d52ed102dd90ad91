"""The testing kit as a user takes it: the README's first agent (``examples/expenses``), tested with only
``agent_lifecycle`` and ``agent_lifecycle.testing`` — a scripted model, a real server and worker, a
reviewer's signed approval — and nothing of the project's own test fixtures."""

from __future__ import annotations

import pytest

from agent_lifecycle import RequestFailed
from agent_lifecycle.testing import AgentTestEnvironment, ScriptedModel, answer, call
from examples.expenses.agent import build


async def test_an_expense_is_filed_once_a_reviewer_approves():
    async with AgentTestEnvironment.start(build, model=ScriptedModel()) as env:
        env.model.push(
            call("expenses/expense-desk/file_expense", {"amount": 42, "what": "taxi"}),
            answer("Filed: 42 EUR for the taxi."),
        )
        request = await env.start_request("file my taxi, 42 euros")
        review = await env.next_review(request)
        [pending] = review.checkpoint.calls
        assert pending.arguments == {"amount": 42, "what": "taxi"}
        result = await env.approve(request)
        assert result.response == "Filed: 42 EUR for the taxi."


async def test_the_kit_runs_rejections_plain_answers_and_records():
    async with AgentTestEnvironment.start(build, model=ScriptedModel(), reviewers=("alice", "bob")) as env:
        # A model that answers in text calling no tool: its text is the answer. It was shown the tool
        # under its function name.
        env.model.push(answer("Nothing to file today."))
        plain = await env.run("hello")
        assert plain.response == "Nothing to file today."
        assert env.model.requests[0].tool_names == ["expenses__expense-desk__file_expense"]

        # A rejected call never runs: the request fails typed, and the record says who rejected it.
        env.model.push(call("expenses/expense-desk/file_expense", {"amount": 900, "what": "a sofa"}))
        request = await env.start_request("file my sofa, 900 euros")
        await env.reject(request, reviewer="bob", comment="not a business expense")
        with pytest.raises(RequestFailed) as failed:
            await env.result(request)
        assert failed.value.type == "CheckpointRejected"
        record = await env.agents.record(request.id)
        assert record.checkpoints[0].reviewer == "bob" and not record.steps


async def test_a_model_that_scripted_too_few_replies_fails_the_request_readably():
    async with AgentTestEnvironment.start(build, model=ScriptedModel()) as env:
        with pytest.raises(RequestFailed) as failed:
            await env.run("file my taxi, 42 euros")
        assert failed.value.type == "ModelRequestError"
        assert "the test scripted no reply for this request" in failed.value.message
