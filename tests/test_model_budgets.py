"""What counts against a request's model token budget besides its planner and synthesizer: a prompt hook's
evaluator and a memory summarizer (the conversation memory's summary, a memory hook's summaries), each
call kept in the record as a model call of its own kind — and refused before it is sent, with the
planner's error, when what the request has left cannot hold it. Real token counts from the scripted
OpenAI-compatible server."""

from __future__ import annotations

from pydantic import SecretStr

from activities.memory import ConversationMemoryStore, MemoryStore
from activities.models import ModelSettings, OpenAIMemoryModel, OpenAIPlanner, function_name
from activities.tools import ToolRegistry
from agent_lifecycle.testing import model as ai
from hooks.builtin.memory import MemoryOptions, MemoryRecordHook
from workflows.models import RequestResult, StageSettings, StepStatus

from .doubles import CapturingPlanner, FixedPlanner
from .harness import Harness
from .test_conversations import agents_for, keep_histories, new_id
from .test_declared_hooks import Echo, Shell, declare, echo, prompt_hook, rows, runtime_for, steps

SHELL = function_name("test-tools/shell/exec")


def settings(server: ai.OpenAIServer) -> ModelSettings:
    return ModelSettings(base_url=server.base_url, api_key=SecretStr("sk-test"), model="m", timeout_seconds=5)


def decide(decision: str, reason: str, usage: ai.Usage) -> ai.Reply:
    arguments = {"decision": decision, "reason": reason, "injection_detected": False}
    return ai.tool_calls(("decide", arguments), usage=usage, model="judge-1")


def judged_harness(client, tmp_path, server: ai.OpenAIServer, tool: Shell, **stage: object) -> tuple[Harness, object]:
    """A model planner over the shell tool, a prompt hook (``judge``) on shell calls evaluated by the same
    server, and a budget of 1000 tokens per request."""
    rt = runtime_for(tmp_path / "hooks.sqlite3")
    hooks = declare(rt, prompt_hook("judge", server.base_url))
    harness = Harness(
        client,
        tmp_path,
        hooks=hooks,
        tools=[tool],
        planner=OpenAIPlanner(settings(server), ToolRegistry([tool])),
        settings=StageSettings(max_model_tokens_per_request=1000, **stage),  # type: ignore[arg-type]
    )
    return harness, rt


async def test_a_prompt_hooks_evaluation_is_one_of_the_requests_model_calls_and_spends_its_budget(
    client, tmp_path, server
):
    tool = Shell()
    server.push(
        ai.tool_calls((SHELL, {"cmd": "ls"}), usage=(10, 5)),
        decide("allow", "harmless", (100, 20)),
        ai.answer("Listed.", usage=(10, 5)),
    )
    h, rt = judged_harness(client, tmp_path, server, tool)
    async with h:
        out = await h.run("List the files")

    assert out.result is not None, out.failure
    assert tool.ran == ["ls"]
    record = out.record
    assert record is not None
    assert [(c.stage, c.hook) for c in record.model_calls] == [
        ("planning", None),
        ("hook", "judge"),
        ("planning", None),
    ]
    evaluation = record.model_calls[1]
    assert (evaluation.model, evaluation.prompt_tokens, evaluation.completion_tokens, evaluation.total_tokens) == (
        "judge-1",
        100,
        20,
        120,
    )
    assert evaluation.error_type is None and evaluation.prompt is not None and evaluation.latency_ms > 0
    assert record.model_usage.total_tokens == 150 and record.model_usage.calls == 3
    # The planner's next call is capped by what is left after the evaluation: 1000 - 15 - 120.
    planning, judging, answering = server.requests
    assert judging.body["model"] == "judge-1" and judging.body["max_tokens"] == 256
    assert answering.body["max_tokens"] == 865
    [row] = [r for r in rows(rt, workflow_id=out.workflow_id) if r.decision != "skip"]
    assert (row.decision, row.metadata["prompt_tokens"]) == ("allow", 120)


async def test_an_evaluation_the_budget_cannot_hold_is_refused_unsent_and_blocks_the_call(client, tmp_path, server):
    tool = Shell()
    # The request allows 100 tokens; planning spends 15, and the evaluator's prompt alone is more than the
    # 85 left: no evaluation is sent, the call is blocked (a blocking event fails closed) and the model
    # reads why; planning goes on with what is left.
    server.push(
        ai.tool_calls((SHELL, {"cmd": "rm -rf /tmp/x"}), usage=(10, 5)),
        ai.answer("I could not run it.", usage=(10, 5)),
    )
    h, rt = judged_harness(client, tmp_path, server, tool)
    async with h:
        out = await h.run("Clean up", {"max_model_tokens": 100})

    assert out.result is not None, out.failure
    assert tool.ran == [] and not out.tool_activities
    [blocked] = out.record.steps if out.record else []
    assert blocked.status is StepStatus.SKIPPED and blocked.skip_detail == "token_budget_exceeded"
    assert [r.body.get("model") for r in server.requests] == ["m", "m"]  # the evaluator was never called
    assert server.requests[1].body["max_tokens"] == 85
    record = out.record
    assert record is not None
    assert [(c.stage, c.error_type) for c in record.model_calls] == [
        ("planning", None),
        ("hook", "TokenBudgetExceeded"),
        ("planning", None),
    ]
    refused = record.model_calls[1]
    assert refused.hook == "judge" and refused.tokens == 0 and "no request was sent" in (refused.error_message or "")
    assert record.model_usage.total_tokens == 30 and record.model_usage.failed_calls == 1
    [row] = rows(rt, workflow_id=out.workflow_id)
    assert (row.decision, row.status, row.reason) == ("block", "error", "token_budget_exceeded")
    assert "TokenBudgetExceeded" not in (row.error or "") and "no request was sent" in (row.error or "")
    # What a request could not afford says nothing about the hook: its breaker did not move.
    assert rt.store.state("judge").consecutive_blocks == 0


async def test_the_conversation_memorys_summary_counts_and_one_the_budget_cannot_hold_falls_back(
    client, tmp_path, server
):
    server.push(ai.answer("The user asked about topic 1.", usage=(60, 10)))
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, planner=CapturingPlanner(), memory=memory) as h:
        h.activities.memory_summarizer = OpenAIMemoryModel(settings(server))
        agents, conversation = agents_for(h), new_id("budget")
        accepted = []
        for n in range(1, 6):
            # The fifth turn allows 20 tokens: the summary it would fold is more than that.
            metadata = {"max_model_tokens": 20} if n == 5 else None
            accepted.append(await agents.submit_turn(conversation, f"tell me about topic {n}", metadata=metadata))
            await agents.turn_result(accepted[-1])
        fourth, fifth = [
            await h.finish(h.client.get_workflow_handle(a.workflow_id, result_type=RequestResult)) for a in accepted[3:]
        ]
        await keep_histories(h, conversation, [a.workflow_id for a in accepted[:3]])

    # The fourth turn folded its oldest exchange with the model: its call is in the turn's record.
    assert fourth.record is not None and fourth.record.memory is not None
    assert (fourth.record.memory.summary, fourth.record.memory.model_calls) == ("model", [])
    [call] = fourth.record.model_calls
    assert (call.stage, call.hook, call.total_tokens, call.error_type) == ("memory", None, 70, None)
    assert fourth.record.model_usage.total_tokens == 70
    [sent] = server.requests
    assert sent.body["messages"][0]["content"].startswith("Update the summary of a conversation")
    # The fifth could not afford it: the heuristic's summary, no error, the refusal in the record.
    assert fifth.record is not None and fifth.record.memory is not None
    assert fifth.record.memory.summary == "heuristic" and fifth.record.diagnostics == []
    [refused] = fifth.record.model_calls
    assert (refused.stage, refused.error_type, refused.tokens) == ("memory", "TokenBudgetExceeded", 0)
    recalled = await memory.recall(conversation)
    assert "topic 1" in recalled.summary and "topic 2" in recalled.summary


async def test_a_memory_hooks_summaries_count_in_its_invocation_and_fall_back_when_unaffordable(
    client, tmp_path, server
):
    server.push(ai.answer('{"summaries": [{"step_id": "e", "summary": "Echoed hello."}]}', usage=(80, 20)))
    store = MemoryStore(tmp_path / "memory.sqlite3")
    hook = MemoryRecordHook(store, model=OpenAIMemoryModel(settings(server)), options=MemoryOptions(agent_domain="d"))
    async with Harness(client, tmp_path, hooks=[hook], tools=[Echo()], planner=FixedPlanner(echo("e", "hello"))) as h:
        afforded = await h.run("Say hello")
        refused = await h.run("Say hello again", {"max_model_tokens": 10})

    assert afforded.failure is None and refused.failure is None
    assert afforded.record is not None and refused.record is not None
    [call] = afforded.record.model_calls
    assert (call.stage, call.hook, call.total_tokens) == ("memory", "memory-record", 100)
    coverage = afforded.record.effect("episodic_memory_records").data["summary_coverage"]  # type: ignore[union-attr,index]
    assert (coverage["model"], coverage["fallback_cause"]) == (1, None)
    [call] = refused.record.model_calls
    assert (call.stage, call.hook, call.error_type) == ("memory", "memory-record", "TokenBudgetExceeded")
    coverage = refused.record.effect("episodic_memory_records").data["summary_coverage"]  # type: ignore[union-attr,index]
    assert (coverage["heuristic"], coverage["fallback_cause"]) == (1, "model_error: TokenBudgetExceeded")
    assert len(server.requests) == 1
    assert steps(refused)["e"].status is StepStatus.SUCCEEDED
