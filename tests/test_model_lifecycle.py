"""Model requests through Temporal, as a service sees them: a streamed answer read by a client while the
model writes it (in batches, with the guarded answer last), the model's failures as the request's typed
failure, a provider's Retry-After obeyed by the activity's retry, every model call in the record, and the
per-request token budget that a request's metadata may lower but never raise."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import astuple
from datetime import timedelta

import pytest
from pydantic import SecretStr
from temporalio.api.enums.v1 import EventType

from activities.models import ModelSettings, OpenAIPlanner, OpenAISynthesizer, function_name
from activities.tools import ToolRegistry
from agent_lifecycle.testing import model as ai
from client import Settings
from client.api import AgentClient, answer_chunks
from client.cli import _print_answer
from demo.tools import demo_tools, quote_price
from hooks import PipelineHook, RunPatch
from hooks.builtin.secret_redaction import SecretRedactionHook
from workflows.model_steps import ANSWERS
from workflows.models import AnswerChunk, FailurePolicy, RequestStatus, StageSettings
from workflows.stages import STAGE_SEPARATOR, hook_stage_of

from .conftest import with_payload_store
from .doubles import quote
from .harness import Harness, Outcome

QUOTE = function_name("demo-tools/stock-service/stock_quote")
PUBLISH_SIGNAL = "__temporal_workflow_stream_publish"


def model_harness(client, tmp_path, server: ai.OpenAIServer, *, hooks=(), **settings) -> Harness:
    """A model planner and synthesizer; the pipeline asks for the synthesizer's own call (these tests are
    about it) unless ``dedicated_synthesis=False`` is given. Large payloads go by reference through the
    payload store, as a deployment's do by default."""
    settings.setdefault("dedicated_synthesis", True)
    model = ModelSettings(base_url=server.base_url, api_key=SecretStr("sk-test"), model="m", timeout_seconds=5)
    return Harness(
        with_payload_store(client, tmp_path),
        tmp_path,
        hooks=hooks,
        planner=OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path))),
        synthesizer=OpenAISynthesizer(model),
        settings=StageSettings(**settings),
    )


async def streamed_request(h: Harness, text: str) -> tuple[Outcome, list[AnswerChunk]]:
    """Start a request that asks to stream its answer, read the stream while it runs, then the outcome."""
    handle = await h.start({"request": text, "stream_answer": True}, workflow_id=f"req-{uuid.uuid4()}")
    chunks = [chunk async for chunk in answer_chunks(h.client, handle.id)]
    return await h.finish(handle), chunks


def publish_signals(outcome: Outcome) -> int:
    return sum(
        1
        for e in outcome.history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == PUBLISH_SIGNAL
    )


def scheduled(outcome: Outcome, activity_type: str) -> list[str]:
    """``<type>#<activity id>`` of each activity of ``activity_type`` the request scheduled, in order."""
    return [
        f"{activity_type}#{e.activity_task_scheduled_event_attributes.activity_id}"
        for e in outcome.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    ]


def plan_activity(outcome: Outcome, phase: int) -> str:
    """The ``plan`` activity of ``phase`` (one attempt per phase), as a chunk names its writer."""
    return scheduled(outcome, "plan")[phase - 1]


def synthesize_activity(outcome: Outcome) -> str:
    [synthesize] = scheduled(outcome, "synthesize")
    return synthesize


# --------------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------------


async def test_a_client_reads_the_answer_while_it_is_written_in_batches_and_the_guarded_answer_last(
    client, tmp_path, server
):
    pieces = [f"word{n} " for n in range(30)] + ["key sk-live-0123456789abcdefghij."]
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("Enough."), ai.streamed(pieces))
    async with model_harness(client, tmp_path, server, hooks=[SecretRedactionHook()]) as h:
        outcome, chunks = await streamed_request(h, "What is the price of ACME?")

    assert outcome.result is not None, outcome.failure
    *drafts, final = chunks
    assert [c.text for c in drafts] == pieces and {(c.activity, c.attempt) for c in drafts} == {
        (synthesize_activity(outcome), 1)
    }
    assert not any(c.final for c in drafts)
    # after_synthesis rewrote the answer: the stream ends with what the client receives, not the draft
    assert final.final and final.text == outcome.result.response
    assert "sk-live-" not in final.text and "sk-live-" in "".join(c.text for c in drafts)
    assert 1 <= publish_signals(outcome) < len(pieces)  # batched: history grows with batches, not tokens
    record = outcome.record
    assert record is not None and [c.streamed for c in record.model_calls] == [False, False, True]
    assert record.model_draft is not None and record.model_draft.matches("".join(c.text for c in drafts))
    assert server.requests[2].body["stream"] is True


async def test_a_pipeline_that_forbids_streaming_publishes_only_the_final_answer(client, tmp_path, server):
    server.push(ai.answer("Nothing to call."), ai.answer("Hello there."))
    async with model_harness(client, tmp_path, server, answer_streaming=False) as h:
        outcome, chunks = await streamed_request(h, "Say hello")

    assert outcome.result is not None and outcome.result.response == "Hello there."
    assert chunks == [AnswerChunk(text="Hello there.", final=True)]
    assert publish_signals(outcome) == 0
    assert "stream" not in server.requests[1].body


async def test_a_request_that_did_not_ask_to_stream_has_no_stream_and_sends_no_chunks(client, tmp_path, server):
    server.push(ai.answer("Nothing to call."), ai.answer("Hello."))
    async with model_harness(client, tmp_path, server) as h:
        outcome = await h.run("Say hello")

    assert outcome.result is not None and publish_signals(outcome) == 0
    assert "stream" not in server.requests[1].body


# --------------------------------------------------------------------------------------------------
# The model planner's own answer
# --------------------------------------------------------------------------------------------------


async def test_a_planner_turn_that_answers_in_text_is_the_draft_guarded_streamed_and_recorded_without_a_synthesis_call(
    client, tmp_path, server, capsys
):
    answer = "ACME trades at its quoted price; key sk-live-0123456789abcdefghij."
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer(answer))
    async with model_harness(client, tmp_path, server, hooks=[SecretRedactionHook()], dedicated_synthesis=False) as h:
        outcome, chunks = await streamed_request(h, "What is the price of ACME?")
        # The CLI prints the draft as it came, then says the hooks rewrote it and prints the stored answer.
        await _print_answer(AgentClient(h.client, Settings()), outcome.workflow_id)
        printed = capsys.readouterr().out

    assert outcome.result is not None, outcome.failure
    # after_synthesis guarded the planner's draft as it guards a synthesizer's
    response = outcome.result.response
    assert response.startswith("ACME trades at its quoted price") and "sk-live-" not in response
    assert outcome.result.confidence == 1.0
    assert printed == f"{answer}\n[the hooks rewrote the answer; the stored answer is:]\n{response}\n"
    # The answering turn streamed its text as the model wrote it (the turn that called the tool wrote
    # none), then the stream ends with the answer as after_synthesis guarded it.
    *drafts, final = chunks
    assert "".join(c.text for c in drafts) == answer and len(drafts) == len(answer.split())
    assert {(c.activity, c.attempt, c.final, c.retracted) for c in drafts} == {
        (plan_activity(outcome, 2), 1, False, False)
    }
    assert final == AnswerChunk(text=response, final=True)
    assert 1 <= publish_signals(outcome) < len(drafts)  # batched
    assert [r.body.get("stream") for r in server.requests] == [True, True]
    assert "synthesize" not in outcome.activity_types() and len(server.requests) == 2
    record = outcome.record
    assert record is not None and [(c.stage, c.phase) for c in record.model_calls] == [("planning", 1), ("planning", 2)]
    assert all(c.streamed for c in record.model_calls)
    draft = record.model_draft
    assert draft is not None and (draft.stage, draft.phase) == ("planning", 2) and draft.matches(answer)
    assert "sk-live-" not in draft.preview
    assert record.final_response == response


async def test_a_preamble_the_model_writes_before_calling_tools_is_streamed_then_retracted(
    client, tmp_path, server, capsys
):
    calls = [{"id": "call_q", "type": "function", "function": {"name": QUOTE, "arguments": '{"symbol": "ACME"}'}}]
    server.push(
        ai.completion({"content": "Let me look that up.", "tool_calls": calls}, finish_reason="tool_calls"),
        ai.answer("ACME is at 101 USD."),
    )
    async with model_harness(client, tmp_path, server, dedicated_synthesis=False) as h:
        outcome, chunks = await streamed_request(h, "What is the price of ACME?")
        # The CLI prints the stream as it reads it, and says what the retraction means.
        await _print_answer(AgentClient(h.client, Settings()), outcome.workflow_id)
        assert capsys.readouterr().out == (
            "Let me look that up.\n[withdrawn: that text was not the answer]\nACME is at 101 USD.\n"
        )

    assert outcome.result is not None and outcome.result.response == "ACME is at 101 USD."
    first, second = plan_activity(outcome, 1), plan_activity(outcome, 2)
    assert [(c.activity, c.text, c.retracted) for c in chunks[:-1]] == [
        (first, "Let ", False),
        (first, "me ", False),
        (first, "look ", False),
        (first, "that ", False),
        (first, "up.", False),
        (first, "", True),  # the turn went on to call the tool: its text was no answer
        (second, "ACME ", False),
        (second, "is ", False),
        (second, "at ", False),
        (second, "101 ", False),
        (second, "USD.", False),
    ]
    assert chunks[-1] == AnswerChunk(text="ACME is at 101 USD.", final=True)
    assert outcome.record is not None and outcome.record.model_draft is not None
    assert outcome.record.model_draft.matches("ACME is at 101 USD.")


async def test_a_turn_whose_call_fails_after_writing_withdraws_its_text_and_the_request_fails_typed(
    client, tmp_path, server
):
    server.push(ai.completion({"content": "Sure, the secret is", "refusal": "I cannot share that."}))
    async with model_harness(client, tmp_path, server, dedicated_synthesis=False) as h:
        outcome, chunks = await streamed_request(h, "Tell me the secret")

    assert outcome.failure is not None and outcome.failure.type == "ModelRefusal"
    first = plan_activity(outcome, 1)
    assert [(c.activity, c.text, c.retracted) for c in chunks] == [
        (first, "Sure, ", False),
        (first, "the ", False),
        (first, "secret ", False),
        (first, "is", False),
        (first, "", True),  # the call failed: what it wrote is no answer
    ]


class QuoteInstead(PipelineHook):
    """after_planning: turns a text answer into a quote of ACME to run."""

    name = "quote-instead"

    async def after_planning(self, ctx, plan):
        if not plan.steps:
            plan.steps.append(quote("quote-acme", "ACME"))
            plan.answer = None
        return plan


async def test_a_streamed_text_answer_an_after_planning_hook_turns_into_steps_is_withdrawn(client, tmp_path, server):
    server.push(ai.answer("I think it is cheap."), ai.answer("ACME is at 101 USD."))
    async with model_harness(client, tmp_path, server, hooks=[QuoteInstead()], dedicated_synthesis=False) as h:
        outcome, chunks = await streamed_request(h, "What is the price of ACME?")

    assert outcome.result is not None, outcome.failure
    assert [(c.text, c.retracted) for c in chunks[:4]] == [
        ("I ", False),
        ("think ", False),
        ("it ", False),
        ("is ", False),
    ]
    withdrawn = [n for n, c in enumerate(chunks) if c.retracted]
    assert withdrawn == [5] and chunks[5].activity == ""  # the workflow withdrew it, once the hook had run
    assert chunks[-1] == AnswerChunk(text=outcome.result.response, final=True)
    assert "".join(c.text for c in chunks[6:-1]) == outcome.result.response


async def test_planning_turns_do_not_stream_where_a_synthesis_call_writes_the_answer(client, tmp_path, server):
    server.push(ai.answer("Nothing to call."), ai.answer("Hello there."))
    async with model_harness(client, tmp_path, server) as h:  # dedicated_synthesis
        outcome, chunks = await streamed_request(h, "Say hello")

    assert outcome.result is not None and outcome.result.response == "Hello there."
    assert "stream" not in server.requests[0].body and server.requests[1].body["stream"] is True
    assert {c.activity for c in chunks[:-1]} == {synthesize_activity(outcome)}
    assert "".join(c.text for c in chunks[:-1]) == "Hello there." and chunks[-1].final


async def test_the_model_reads_the_request_in_its_context_the_same_in_every_phase_and_the_tools_as_functions(
    client, tmp_path, server
):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is quoted."))
    async with model_harness(client, tmp_path, server, dedicated_synthesis=False) as h:
        outcome = await h.run("What is the price of ACME?", {"rag_context": "ACME reports on Friday."})

    assert outcome.result is not None, outcome.failure
    first, second = server.requests
    user = first.messages[1]
    assert user == {
        "role": "user",
        "content": "<agent_memory>\nACME reports on Friday.\n</agent_memory>\n\nUser request:\nWhat is the price of ACME?",
    }
    # Phase 2 sends the same conversation, the model's own turn and its answered call after it.
    assert second.messages[:2] == first.messages[:2]
    assert [m["role"] for m in second.messages[2:]] == ["assistant", "tool"]
    assert QUOTE in [tool["function"]["name"] for tool in first.body["tools"]]  # the tools go as functions
    assert outcome.record is not None and outcome.record.planning_prompt == user["content"]


async def test_a_synthesis_call_still_writes_the_answer_after_the_phase_cap_or_when_the_pipeline_asks(
    client, tmp_path, server
):
    server.push(
        ai.tool_calls((QUOTE, {"symbol": "ACME"})),  # capped: the only phase ran a tool
        ai.answer("Synthesized after the cap."),
        ai.answer("No call needed."),  # a dedicated synthesizer rewrites even a text turn
        ai.answer("Synthesized on request."),
    )
    async with model_harness(client, tmp_path, server, dedicated_synthesis=False, max_planning_phases=1) as h:
        capped = await h.run("What is the price of ACME?")
    async with model_harness(client, tmp_path, server, dedicated_synthesis=True) as h:
        dedicated = await h.run("Say hello")

    assert capped.result is not None and capped.result.response == "Synthesized after the cap."
    assert capped.record is not None and capped.record.phase_cap_reached
    assert capped.record.model_draft is not None and capped.record.model_draft.stage == "synthesis"
    assert dedicated.result is not None and dedicated.result.response == "Synthesized on request."
    assert "synthesize" in capped.activity_types() and "synthesize" in dedicated.activity_types()
    assert len(server.requests) == 4


# --------------------------------------------------------------------------------------------------
# Failures, retries, the record
# --------------------------------------------------------------------------------------------------


async def test_a_refused_model_request_fails_the_request_at_once_with_its_status_and_message(client, tmp_path, server):
    server.push(ai.error(401, "Incorrect API key provided: sk-te***"))
    async with model_harness(client, tmp_path, server) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.failure is not None and outcome.failure.type == "ModelRequestError"
    details = outcome.failure_details()
    assert (details["status"], details["message"]) == (401, "Incorrect API key provided: sk-te***")
    assert outcome.activity_types().count("plan") == 1 and len(server.requests) == 1  # not retried
    assert "execute_tool_step" not in outcome.activity_types()
    stored = await outcome.stored()
    assert stored is not None and stored.status is RequestStatus.FAILED
    assert stored.error is not None and stored.error.type == "ModelRequestError"
    [call] = stored.model_calls
    assert (call.stage, call.status, call.error_type) == ("planning", 401, "ModelRequestError")


async def test_a_rate_limited_call_is_retried_after_the_providers_retry_after_and_both_calls_are_recorded(
    client, tmp_path, server
):
    server.push(
        ai.error(429, "Rate limit reached", headers={"Retry-After": "1.5"}, kind="rate_limit_error"),
        ai.tool_calls((QUOTE, {"symbol": "ACME"})),
        ai.answer("Enough."),
        ai.answer("ACME is quoted."),
    )
    async with model_harness(client, tmp_path, server) as h:
        started = time.monotonic()
        outcome = await h.run("What is the price of ACME?")
        elapsed = time.monotonic() - started

    assert outcome.result is not None, outcome.failure
    assert elapsed >= 1.5  # the retry waited as long as the provider asked
    record = outcome.record
    assert record is not None
    assert [(c.stage, c.phase, c.error_type, c.status) for c in record.model_calls] == [
        ("planning", 1, "ModelUnavailable", 429),
        ("planning", 1, None, None),
        ("planning", 2, None, None),
        ("synthesis", None, None, None),
    ]
    assert record.steps[0].output == {"symbol": "ACME", "price": quote_price("ACME"), "currency": "USD"}


async def test_a_synthesis_the_model_wrote_but_after_synthesis_refused_shows_both_outcomes(client, tmp_path, server):
    class Refuses(PipelineHook):
        name = "answer-checker"
        failure_policy = FailurePolicy.FAIL_CLOSED
        max_attempts = 1

        async def after_synthesis(self, ctx, response):
            raise RuntimeError("the checker is down")

    server.push(ai.answer("Nothing to call."), ai.answer("A fine answer.", usage=(40, 4)))
    async with model_harness(client, tmp_path, server, hooks=[Refuses()]) as h:
        outcome = await h.run("Say something")

    assert outcome.failure is not None and outcome.failure.type == "ExtensionError"
    stored = await outcome.stored()
    assert stored is not None and stored.status is RequestStatus.FAILED
    synthesis = stored.model_calls[-1]
    assert (synthesis.stage, synthesis.error_type, synthesis.total_tokens) == ("synthesis", None, 44)
    assert stored.model_draft is not None and stored.model_draft.chars == len("A fine answer.")
    assert stored.final_response is None


# --------------------------------------------------------------------------------------------------
# The token budget
# --------------------------------------------------------------------------------------------------


async def test_the_token_budget_stops_before_the_next_call_and_metadata_may_only_lower_it(client, tmp_path, server):
    # Each call spends 10 + 5 tokens. The pipeline allows 1000; the first request lowers it to 20, so
    # planning phase 2 still runs (5 left) and synthesis is refused before any call is sent.
    server.push(
        ai.tool_calls((QUOTE, {"symbol": "ACME"})),
        ai.answer("Enough."),
        # the second request asks for 5000: the pipeline's 1000 stands
        ai.answer("Nothing to call."),
        ai.answer("Done."),
    )
    async with model_harness(client, tmp_path, server, max_model_tokens_per_request=1000) as h:
        lowered = await h.run("What is the price of ACME?", {"max_model_tokens": 20})
        raised = await h.run("Say hello", {"max_model_tokens": 5000})
        invalid = await h.run({"request": "Say hello", "metadata": {"max_model_tokens": "lots"}})

    assert lowered.failure is not None and lowered.failure.type == "TokenBudgetExceeded"
    assert lowered.record is not None and lowered.record.model_usage.total_tokens == 30
    assert [r.body["max_tokens"] for r in server.requests[:2]] == [20, 5]  # each call capped by what is left
    assert "synthesize" in lowered.activity_types() and len(lowered.record.steps) == 1
    assert raised.result is not None and server.requests[2].body["max_tokens"] == 1000
    assert server.requests[3].body["max_tokens"] == 1000 - 15
    assert invalid.failure is not None and invalid.failure.type == "InvalidRequest"
    assert "max_model_tokens" in invalid.failure.message
    assert len(server.requests) == 4


async def test_cancelling_a_request_cancels_the_model_call_in_flight(client, tmp_path, server):
    server.push(ai.slow(30))
    async with model_harness(client, tmp_path, server) as h:
        handle = await h.start("What is the price of ACME?")
        await server.wait_for_requests(1, timeout=15)
        await handle.cancel()
        await asyncio.wait_for(server.disconnected.wait(), 15)
        outcome = await h.finish(handle)

    assert outcome.failure is not None and outcome.record is not None
    assert outcome.record.status is RequestStatus.CANCELLED
    assert "execute_tool_step" not in outcome.activity_types()


# --------------------------------------------------------------------------------------------------
# The stages after a text answer: one local activity while each leaves the run as it was
# --------------------------------------------------------------------------------------------------


class Tail(PipelineHook):
    """Implements every stage after a planning turn; keeps what each invocation saw. With ``count``, it
    also changes its private state at each one (so no stage leaves the run as it was)."""

    def __init__(self, name: str, *, count: bool = False) -> None:
        self.name = name
        self.count = count
        self.seen: list[tuple[str, object, int]] = []

    def _saw(self, stage: str, subject: object, ctx) -> None:
        self.seen.append((stage, subject, ctx.state.get("n", 0)))
        if self.count:
            ctx.state["n"] = ctx.state.get("n", 0) + 1

    async def after_planning(self, ctx, plan):
        self._saw("after_planning", (ctx.plan_phase, len(plan.steps), plan.answer), ctx)
        return plan

    async def after_execution(self, ctx, execution):
        self._saw("after_execution", [s.status.value for s in execution.steps], ctx)

    async def after_synthesis(self, ctx, response):
        self._saw("after_synthesis", response, ctx)
        return response

    async def after_answer(self, ctx, answer):
        self._saw("after_answer", answer.text, ctx)


def hook_markers(outcome: Outcome) -> list[tuple[str, list[str]]]:
    """Each local activity marker of in-process hooks, in order: its type, and the stages whose hooks it
    ran (from its result)."""
    found = []
    for recorded, result in outcome.local_results():
        if hook_stage_of(recorded) is None:
            continue
        ran = [recorded.split(":")[0]]
        if isinstance(result, dict) and "entries" in result:
            parts = [part.split(":")[0] for part in recorded.split(STAGE_SEPARATOR)]
            ran = [
                stage
                for stage, entries in zip(parts, [result["entries"], *result.get("ahead", [])], strict=False)
                if entries
            ]
        found.append((recorded, ran))
    return found


def run_on_types(outcome: Outcome) -> list[str]:
    """The local activity types that offered the hooks of more than one stage."""
    return [recorded for recorded, _ in hook_markers(outcome) if STAGE_SEPARATOR in recorded]


async def test_the_stages_after_a_text_answer_run_in_its_planning_activity_and_each_hook_is_recorded_at_its_stage(
    client, tmp_path, server, spans
):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    audit, second = Tail("audit"), Tail("second")
    async with model_harness(client, tmp_path, server, hooks=[audit, second], dedicated_synthesis=False) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and outcome.result.response == "ACME is up.", outcome.failure
    tail = "audit + second"
    # Each phase's after_planning hooks ran in its planning activity; the stages after the text answer ran on
    # in the one that answered: no local activity, no marker of their own.
    outputs = outcome.planning_outputs()
    assert [output["after"][0]["hook"] for output in outputs] == ["audit", "audit"]
    assert "ahead" not in outputs[0]  # tool calls: nothing ran on
    assert [[e["hook"] for e in stage] for stage in outputs[1]["ahead"]] == [["audit", "second"]] * 3
    assert hook_markers(outcome) == []
    assert outcome.shown_summaries("plan")[-1] == (
        f"plan · phase 2 with after_planning:{tail} {ANSWERS} "
        f"after_execution:{tail} · after_synthesis:{tail} · after_answer:{tail}"
    )
    # Each hook saw what it would have seen had each stage run on its own.
    assert audit.seen == [
        ("after_planning", (1, 1, None), 0),
        ("after_planning", (2, 0, "ACME is up."), 0),
        ("after_execution", ["succeeded"], 0),
        ("after_synthesis", "ACME is up.", 0),
        ("after_answer", "ACME is up.", 0),
    ]
    assert second.seen == audit.seen
    # Every invocation is its own entry, at its own stage and sequence, with its decision.
    record = outcome.record
    assert record is not None and not record.diagnostics
    tail_entries = [(i.stage.value, i.hook, i.sequence) for i in record.pipeline_hooks][2:]
    assert tail_entries == [
        (stage, hook, n)
        for stage in ("after_planning", "after_execution", "after_synthesis", "after_answer")
        for n, hook in enumerate(("audit", "second"), start=1)
    ]
    assert all(i.decision is not None and i.outcome.value == "succeeded" for i in record.pipeline_hooks)
    assert [h.summary for h in outcome.scheduled if h.batched][-8:] == [
        f"{stage} · {hook}"
        for stage in ("after_planning", "after_execution", "after_synthesis", "after_answer")
        for hook in ("audit", "second")
    ]
    names = [s.name for s in spans.get_finished_spans() if s.name.startswith("pipeline.hook.after_answer.")]
    assert sorted(names) == ["pipeline.hook.after_answer.audit", "pipeline.hook.after_answer.second"]


def persist_summaries(outcome: Outcome) -> list[str]:
    return [a.summary for a in outcome.scheduled if a.activity_type == "persist_execution_record"]


def end_attempt(outcome: Outcome) -> dict | None:
    """What the activity that tried to write the terminal snapshot with the run's last hooks (a hook local
    activity or a planning activity) says of it (None: none tried)."""
    tried = [
        result["end"]
        for recorded, result in outcome.local_results()
        if hook_stage_of(recorded) is not None and isinstance(result, dict) and result.get("end")
    ]
    tried += [output["end"] for output in outcome.planning_outputs() if output.get("end")]
    assert len(tried) <= 1, tried
    if not tried:
        return None
    return {"revision": tried[0]["revision"], "written": tried[0].get("written", False)}


async def test_the_last_hooks_write_the_terminal_snapshot_when_they_leave_the_text_answer_as_it_is(
    client, tmp_path, server
):
    """After the planner's text answer, the local activity that runs every hook of every stage left writes
    the request's terminal snapshot itself: no local activity of its own writes it, and the store holds
    exactly the workflow's record — every invocation with its time and decision, the accepted plans, the
    answer, its draft and cache verdict, completed as the last hook ended. The harness replays the
    history."""
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    async with model_harness(
        client, tmp_path, server, hooks=[Tail("audit"), Tail("second")], dedicated_synthesis=False
    ) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and outcome.result.response == "ACME is up.", outcome.failure
    assert persist_summaries(outcome) == []  # the accepted plan of phase 1 and the end: both with their hooks
    assert end_attempt(outcome) == {"revision": 2, "written": True}
    record = outcome.record
    assert record is not None and record.status is RequestStatus.SUCCEEDED
    assert (record.lifecycle.boundary.value, record.lifecycle.completion, record.record_revision) == (
        "terminal",
        "completed",
        2,
    )
    last = record.pipeline_hooks[-1]
    assert record.completed_at == last.started_at + timedelta(milliseconds=last.duration_ms)
    assert record.final_response == "ACME is up." and record.model_draft is not None
    assert record.cache is not None and record.cache.cacheable and record.cache.response is None
    assert await outcome.stored() == record


class Audit(PipelineHook):
    """An on_finish observer: keeps each outcome it is shown."""

    name = "audit-log"

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str | None]] = []

    async def on_finish(self, ctx, outcome):
        self.outcomes.append((outcome.status, outcome.response))


async def test_on_finish_runs_with_the_last_hooks_and_the_terminal_write_when_nothing_else_comes_before_the_end(
    client, tmp_path, server
):
    """An on_finish observer joins the last hooks' activity (here the planning activity that answered): it
    is shown the run completed with the answer, once, and the terminal snapshot that activity writes holds
    its invocation — no marker of its own, no write of the workflow's."""
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    audit = Audit()
    async with model_harness(client, tmp_path, server, hooks=[Tail("tail"), audit], dedicated_synthesis=False) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and outcome.result.response == "ACME is up.", outcome.failure
    assert audit.outcomes == [("completed", "ACME is up.")]
    assert persist_summaries(outcome) == []
    assert end_attempt(outcome) == {"revision": 2, "written": True}
    # The same activity as the answer's stages: the planning activity that answered, no marker at all.
    assert hook_markers(outcome) == []
    assert outcome.shown_summaries("plan")[-1].endswith(" · on_finish:audit-log")
    assert [e["hook"] for e in outcome.planning_outputs()[-1]["ahead"][-1]] == ["audit-log"]
    record = outcome.record
    assert record is not None and not record.diagnostics
    assert [i.stage.value for i in record.pipeline_hooks].count("on_finish") == 1
    assert await outcome.stored() == record


async def test_on_finish_is_shown_the_outcome_once_where_the_answers_hooks_change_the_run(client, tmp_path, server):
    """Where the answer's hooks change the run (here a redaction), on_finish does not run ahead: it is shown
    the outcome as it is, once."""
    answer = "ACME is up; key sk-live-0123456789abcdefghij."
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer(answer))
    audit = Audit()
    async with model_harness(
        client, tmp_path, server, hooks=[SecretRedactionHook(), audit], dedicated_synthesis=False
    ) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None, outcome.failure
    [(status, response)] = audit.outcomes
    assert status == "completed" and response == outcome.result.response and "sk-live-" not in response
    assert persist_summaries(outcome)[-1] == "bookkeeping · persist record · terminal · revision 2"
    assert outcome.record is not None and not outcome.record.diagnostics


class RefusesFirstEnd:
    """The harness's store, refusing the first terminal snapshot it is asked to save (down for a moment)."""

    def __init__(self, inner) -> None:
        self.inner, self.refused = inner, False

    async def save(self, record):
        if record.lifecycle is not None and record.lifecycle.boundary.value == "terminal" and not self.refused:
            self.refused = True
            raise ConnectionError("store unavailable")
        return await self.inner.save(record)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_a_terminal_snapshot_the_last_hooks_could_not_write_is_written_by_the_workflow(client, tmp_path, server):
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    audit = Tail("audit")
    h = model_harness(client, tmp_path, server, hooks=[audit], dedicated_synthesis=False)
    h.activities.store = RefusesFirstEnd(h.store)
    async with h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and outcome.result.response == "ACME is up.", outcome.failure
    assert len(audit.seen) == 5  # the hooks ran once: their outcomes stand
    assert end_attempt(outcome) == {"revision": 2, "written": False}
    assert persist_summaries(outcome) == ["bookkeeping · persist record · terminal · revision 3"]
    stored = await outcome.stored()
    assert stored == outcome.record and stored.record_revision == 3


class EnrichingTail(Tail):
    """A Tail that also adds an enrichment before planning (so its first planning activity runs it)."""

    async def before_planning(self, ctx):
        self._saw("before_planning", None, ctx)
        ctx.enrichments["desk"] = "equities"


@pytest.mark.parametrize(
    "hook, metadata",
    [(Tail("audit"), None), (EnrichingTail("audit"), None), (EnrichingTail("audit"), {"max_model_tokens": 5000})],
    ids=["after-planning", "with-before-planning", "with-a-token-budget"],
)
async def test_a_first_plan_that_answers_in_text_ends_the_request_in_its_planning_activity(
    client, tmp_path, server, hook, metadata
):
    """A request the planner answers at once: its one planning activity runs the before_planning hooks (where
    there are), the planner, the after_planning hooks, the stages after the answer and writes the terminal
    snapshot — no local activity or write of its own. What the later hooks receive is what they would
    receive at their stage: the enrichments the before_planning hooks left, the token budget the planner's
    call left."""
    server.push(ai.answer("Nothing to call."))
    audit = hook
    async with model_harness(client, tmp_path, server, hooks=[audit], dedicated_synthesis=False) as h:
        outcome = await h.run("Say something", metadata)

    assert outcome.result is not None and outcome.result.response == "Nothing to call.", outcome.failure
    stages = ["after_planning", "after_execution", "after_synthesis", "after_answer"]
    if isinstance(audit, EnrichingTail):
        stages.insert(0, "before_planning")
    assert [stage for stage, _, _ in audit.seen] == stages
    assert hook_markers(outcome) == [] and persist_summaries(outcome) == []
    assert [a.activity_type for a in outcome.scheduled] == [
        "resolve_pipeline",
        *(["before_planning_hook"] if isinstance(audit, EnrichingTail) else []),
        "plan",
        *(f"{stage}_hook" for stage in stages if stage != "before_planning"),
    ]
    assert end_attempt(outcome) == {"revision": 1, "written": True}
    record = outcome.record
    assert record is not None and not record.diagnostics and record.final_response == "Nothing to call."
    assert [i.stage.value for i in record.pipeline_hooks] == stages
    if isinstance(audit, EnrichingTail):
        assert record.enrichments["desk"] == "equities"
        assert [e.effect_id for e in record.effects] == ["planning_enrichment:desk"]
    assert await outcome.stored() == record


async def test_an_answer_the_fallback_model_gives_ends_the_request_in_its_planning_activity(client, tmp_path, server):
    """The primary model is unavailable on every retry of the first phase's planning: the attempt handed to the
    fallback gets its hooks and its record built again, failed calls included, so the activity that answers
    runs them and writes the end as this workflow would — no rewrite, no hook run twice."""
    unavailable = ai.error(503, "overloaded", headers={"retry-after-ms": "10"}, kind="server_error")
    server.push(*[unavailable] * 4)  # the first planning activity's call, then the planning attempt's three
    audit = EnrichingTail("audit")
    async with ai.OpenAIServer() as fallback:
        fallback.push(ai.answer("Nothing to call."))
        model = ModelSettings(
            base_url=server.base_url, api_key=SecretStr("sk-test"), model="m", timeout_seconds=5, fallback_model="f"
        ).model_copy(update={"fallback_base_url": fallback.base_url})
        async with Harness(
            with_payload_store(client, tmp_path),
            tmp_path,
            hooks=[audit],
            planner=OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path))),
            synthesizer=OpenAISynthesizer(model),
            settings=StageSettings(dedicated_synthesis=False),
        ) as h:
            outcome = await h.run("Say something", {"max_model_tokens": 5000})

    assert outcome.result is not None and outcome.result.response == "Nothing to call.", outcome.failure
    stages = ["before_planning", "after_planning", "after_execution", "after_synthesis", "after_answer"]
    assert [stage for stage, _, _ in audit.seen] == stages
    assert outcome.shown_summaries("plan")[-1] == (
        "plan · phase 1 · fallback with after_planning:audit "
        f"{ANSWERS} after_execution:audit · after_synthesis:audit · after_answer:audit"
    )
    assert end_attempt(outcome) == {"revision": 1, "written": True}
    assert persist_summaries(outcome) == [] and hook_markers(outcome) == []
    record = outcome.record
    assert record is not None and not record.diagnostics and record.handled_by == "fallback"
    assert [call.route for call in record.model_calls] == ["primary"] * 4 + ["fallback"]
    assert [i.stage.value for i in record.pipeline_hooks] == stages
    assert await outcome.stored() == record


async def test_last_hooks_that_change_the_answer_leave_the_terminal_snapshot_to_the_workflow(client, tmp_path, server):
    answer = "ACME is up; key sk-live-0123456789abcdefghij."
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer(answer))
    async with model_harness(
        client, tmp_path, server, hooks=[Tail("audit"), SecretRedactionHook()], dedicated_synthesis=False
    ) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and "sk-live-" not in outcome.result.response, outcome.failure
    assert end_attempt(outcome) is None  # not tried: the redaction changed the answer
    assert persist_summaries(outcome) == ["bookkeeping · persist record · terminal · revision 2"]
    assert await outcome.stored() == outcome.record


async def test_a_stage_that_changes_the_run_hands_the_next_stage_back_to_the_workflow(client, tmp_path, server):
    # The counter changes its private state at every stage: each stage runs on its own, and each sees
    # what the stage before left.
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    counter = Tail("counter", count=True)
    async with model_harness(client, tmp_path, server, hooks=[counter], dedicated_synthesis=False) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None, outcome.failure
    # Each activity was offered the stages after its own, and ran only its own: the record says which.
    # (Each phase's after_planning ran in its planning activity.)
    assert [ran for _, ran in hook_markers(outcome)] == [["after_execution"], ["after_synthesis"], ["after_answer"]]
    assert run_on_types(outcome)[0] == "after_execution:counter → after_synthesis:counter → after_answer:counter"
    assert [(stage, n) for stage, _, n in counter.seen] == [
        ("after_planning", 0),
        ("after_planning", 1),
        ("after_execution", 2),
        ("after_synthesis", 3),
        ("after_answer", 4),
    ]
    assert outcome.record is not None and not outcome.record.diagnostics


async def test_an_answer_rewritten_at_after_synthesis_reaches_after_answer_as_rewritten(client, tmp_path, server):
    answer = "ACME is up; key sk-live-0123456789abcdefghij."
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer(answer))
    audit = Tail("audit")
    async with model_harness(
        client, tmp_path, server, hooks=[audit, SecretRedactionHook()], dedicated_synthesis=False
    ) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None, outcome.failure
    response = outcome.result.response
    assert "sk-live-" not in response
    # The planning activity that answered ran on into after_execution and after_synthesis; the redaction
    # changed the answer, so after_answer ran on its own, on the redacted answer.
    assert len(outcome.planning_outputs()[-1]["ahead"]) == 2
    assert [ran for _, ran in hook_markers(outcome)] == [["after_answer"]]
    assert audit.seen[-1] == ("after_answer", response, 0)
    assert audit.seen[-2] == ("after_synthesis", answer, 0)


async def test_after_synthesis_runs_on_into_after_answer_after_a_synthesis_call(client, tmp_path, server):
    server.push(ai.answer("Nothing to call."), ai.answer("A fine answer."))
    audit = Tail("audit")
    async with model_harness(client, tmp_path, server, hooks=[audit]) as h:
        outcome = await h.run("Say something")

    assert outcome.result is not None and outcome.result.response == "A fine answer.", outcome.failure
    assert run_on_types(outcome) == ["after_synthesis:audit → after_answer:audit"]
    assert audit.seen[-2:] == [("after_synthesis", "A fine answer.", 0), ("after_answer", "A fine answer.", 0)]
    # They were the run's last hooks, and left the answer as it was: their activity wrote the end.
    assert end_attempt(outcome) == {"revision": 1, "written": True}
    assert persist_summaries(outcome) == []
    record = outcome.record
    assert record is not None and record.model_draft is not None and record.model_draft.stage == "synthesis"
    assert await outcome.stored() == record


async def test_hooks_run_ahead_on_a_run_that_changed_are_kept_as_diagnostics_and_run_again(
    client, tmp_path, server, monkeypatch
):
    # A broken carry rule (every stage "hands on") makes the planning activity that answered run
    # after_execution, after_synthesis and after_answer on what the run no longer is: the workflow finds
    # their calls changed when it reaches each stage, keeps what ran as a diagnostic and runs the stage's
    # hooks again on the run as it is — no outcome of a stale call is taken.
    import activities.hook_stages

    monkeypatch.setattr(activities.hook_stages, "hands_on", lambda spec, ran: bool(ran))
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    counter = Tail("counter", count=True)
    async with model_harness(client, tmp_path, server, hooks=[counter], dedicated_synthesis=False) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and outcome.result.response == "ACME is up.", outcome.failure
    assert len(outcome.planning_outputs()[-1]["ahead"]) == 3  # what ran on, in the planning activity
    record = outcome.record
    assert record is not None
    stale = [(d.phase, d.extension) for d in record.diagnostics if d.error_type == "StaleRunAhead"]
    assert stale and {phase for phase, _ in stale} <= {"after_execution", "after_synthesis", "after_answer"}
    # What the record keeps as each stage's invocation saw what the stage before left.
    taken = [(i.stage.value, i.sequence) for i in record.pipeline_hooks]
    assert taken == [
        ("after_planning", 1),
        ("after_planning", 1),
        ("after_execution", 1),
        ("after_synthesis", 1),
        ("after_answer", 1),
    ]
    last_seen = {stage: n for stage, _, n in counter.seen}
    assert last_seen == {"after_planning": 1, "after_execution": 2, "after_synthesis": 3, "after_answer": 4}
    # The activity, taking the run as unchanged, wrote a terminal snapshot too: the workflow found its
    # record was not that snapshot and wrote its own with the next revision.
    assert end_attempt(outcome) == {"revision": 2, "written": True}
    assert persist_summaries(outcome) == ["bookkeeping · persist record · terminal · revision 3"]
    assert await outcome.stored() == record


async def test_hooks_run_ahead_for_stages_a_stopped_run_never_reached_are_kept_as_diagnostics(
    client, tmp_path, server, monkeypatch
):
    import activities.hook_stages
    import workflows.model_steps
    from hooks import Stop

    class Stops(Tail):
        async def after_planning(self, ctx, plan):
            await super().after_planning(ctx, plan)
            return Stop(text="Stopped here.", reason="enough") if ctx.plan_phase == 2 else plan

    monkeypatch.setattr(activities.hook_stages, "hands_on", lambda spec, ran: bool(ran))
    # The planning activity does not run the phase's hooks (as where one of them is not in-process): the
    # text answer's after_planning hooks run in a local activity that runs on into the stages after it.
    monkeypatch.setattr(workflows.model_steps.ModelSteps, "_fused", lambda self, *args, **kwargs: None)
    server.push(ai.tool_calls((QUOTE, {"symbol": "ACME"})), ai.answer("ACME is up."))
    stops = Stops("stops")
    async with model_harness(client, tmp_path, server, hooks=[stops], dedicated_synthesis=False) as h:
        outcome = await h.run("What is the price of ACME?")

    assert outcome.result is not None and outcome.result.response == "Stopped here.", outcome.failure
    record = outcome.record
    assert record is not None and record.stopped is not None
    unreached = {(d.phase, d.extension) for d in record.diagnostics if d.error_type == "StaleRunAhead"}
    assert unreached == {("after_execution", "stops"), ("after_synthesis", "stops"), ("after_answer", "stops")}
    assert [i.stage.value for i in record.pipeline_hooks] == ["after_planning", "after_planning"]
    # The terminal snapshot the activity wrote said completed; the run stopped: the workflow's own, after it.
    assert end_attempt(outcome) == {"revision": 2, "written": True}
    assert persist_summaries(outcome) == ["bookkeeping · persist record · terminal · revision 3"]
    stored = await outcome.stored()
    assert stored == record and stored.status is RequestStatus.STOPPED


class Front(PipelineHook):
    """A before_run and before_planning hook that keeps what each invocation saw; with ``rewrite`` its
    before_run rewrites the ask (so before_run does not leave the run as it was)."""

    def __init__(self, name: str, *, rewrite: str | None = None) -> None:
        self.name = name
        self.rewrite = rewrite
        self.seen: list[tuple[str, str, dict]] = []

    async def before_run(self, ctx, run):
        self.seen.append(("before_run", run.ask, dict(ctx.enrichments)))
        return RunPatch(ask=self.rewrite) if self.rewrite else None

    async def before_planning(self, ctx):
        self.seen.append(("before_planning", ctx.request, dict(ctx.enrichments)))
        ctx.enrichments[f"{self.name}_note"] = "checked"


async def test_before_run_runs_on_into_before_planning_in_one_local_activity(client, tmp_path, server):
    server.push(ai.answer("Hello."))
    guard, context = Front("guard"), Front("context")
    async with model_harness(client, tmp_path, server, hooks=[guard, context], dedicated_synthesis=False) as h:
        outcome = await h.run("Say hello", {"rag_context": "Greetings are short."})

    assert outcome.result is not None and outcome.result.response == "Hello.", outcome.failure
    both = "guard + context"
    assert run_on_types(outcome)[0] == f"before_run:{both} → before_planning:{both}"
    assert hook_markers(outcome)[0][1] == ["before_run", "before_planning"]
    # before_planning saw the enrichments the metadata promotes, and each hook what the one before left.
    assert guard.seen[:2] == [
        ("before_run", "Say hello", {}),
        ("before_planning", "Say hello", {"rag_context": "Greetings are short."}),
    ]
    assert context.seen[1] == (
        "before_planning",
        "Say hello",
        {"rag_context": "Greetings are short.", "guard_note": "checked"},
    )
    record = outcome.record
    assert record is not None and not record.diagnostics
    assert [(i.stage.value, i.hook, i.sequence) for i in record.pipeline_hooks][:4] == [
        ("before_run", "guard", 1),
        ("before_run", "context", 2),
        ("before_planning", "guard", 1),
        ("before_planning", "context", 2),
    ]
    assert "Greetings are short." in str(server.requests[0].messages)


async def test_a_before_run_rewrite_hands_before_planning_back_to_the_workflow(client, tmp_path, server):
    server.push(ai.answer("Hello."))
    guard = Front("guard", rewrite="Say hello politely")
    async with model_harness(client, tmp_path, server, hooks=[guard], dedicated_synthesis=False) as h:
        outcome = await h.run("Say hello")

    assert outcome.result is not None, outcome.failure
    # The rewrite stopped the local activity at before_run: the first planning activity ran before_planning.
    assert [ran for _, ran in hook_markers(outcome)][:1] == [["before_run"]]
    assert run_on_types(outcome)[0] == "before_run:guard → before_planning:guard"
    fused = ("before_planning_hook", "before_planning · guard", True, True, None)  # reported by the planning activity
    assert [astuple(a) for a in outcome.scheduled if a.summary == "before_planning · guard"] == [fused]
    # before_planning ran on the rewritten ask.
    assert guard.seen[1] == ("before_planning", "Say hello politely", {})
    assert outcome.record is not None and not outcome.record.diagnostics
