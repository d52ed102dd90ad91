"""The OpenAI-compatible synthesizer against a real HTTP server and the real ``openai`` client: what the
model reads (step results, enrichments, instructions, facts), the answer and its confidence, the
streamed variant, typed failures and the token budget."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr
from temporalio.exceptions import ApplicationError

from activities.models import ModelCallLog, ModelSettings, OpenAISynthesizer
from agent_lifecycle.testing import model as ai
from workflows.models import (
    ENRICHMENT_CONVERSATION_HISTORY,
    ENRICHMENT_RAG_CONTEXT,
    ExecutionResult,
    Plan,
    StepResult,
    StepStatus,
    SynthesizeInput,
)


def synthesizer(server: ai.OpenAIServer, **overrides) -> OpenAISynthesizer:
    values = {"base_url": server.base_url, "api_key": SecretStr("sk-test"), "model": "writer", "timeout_seconds": 5}
    return OpenAISynthesizer(ModelSettings(**(values | overrides)))


def synthesize_input(steps: list[StepResult] | None = None) -> SynthesizeInput:
    if steps is None:
        steps = [
            StepResult(
                step_id="stock_quote-1",
                tool="stock-service/stock_quote",
                status=StepStatus.SUCCEEDED,
                result='{"price": 42.5, "symbol": "ACME"}',
            ),
            StepResult(
                step_id="send_message-1",
                tool="notify-service/send_message",
                status=StepStatus.FAILED,
                result="error: outbox unavailable",
            ),
        ]
    return SynthesizeInput(
        request="Tell alice the price of ACME",
        request_id="r-1",
        plan=Plan(),
        execution=ExecutionResult(steps=steps),
        enrichments={
            ENRICHMENT_RAG_CONTEXT: "ACME reports earnings on Thursday.",
            ENRICHMENT_CONVERSATION_HISTORY: "user: hello",
            "private_note": "not a well-known key",
        },
        instructions="Answer in one sentence.",
        facts={"timezone": "Europe/Paris"},
    )


async def failure(awaitable) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        await awaitable
    return caught.value


async def test_the_answer_is_written_from_the_step_results_enrichments_instructions_and_facts(server):
    server.push(ai.answer("ACME is at 42.5 USD; the message to alice could not be sent.", usage=(80, 14)))
    log = ModelCallLog()

    output = await synthesizer(server).synthesize(synthesize_input(), calls=log)

    assert output.response == "ACME is at 42.5 USD; the message to alice could not be sent."
    assert output.confidence == 0.5  # one of the two steps succeeded
    [sent] = server.requests
    assert "tools" not in sent.body and sent.body["model"] == "writer"
    system, user = sent.messages
    assert system["role"] == "system" and user["role"] == "user"
    # the run's instructions follow the synthesizer's own, in the system message, and only there
    assert system["content"].endswith("\n\n<instructions>\nAnswer in one sentence.\n</instructions>")
    assert user["content"] == (
        "<facts>\ntimezone: Europe/Paris\n</facts>\n\n"
        "<agent_memory>\nACME reports earnings on Thursday.\n</agent_memory>\n\n"
        "<conversation_history>\nuser: hello\n</conversation_history>\n\n"
        "<tool_results>\n"
        '- stock_quote-1 (stock-service/stock_quote, succeeded): {"price": 42.5, "symbol": "ACME"}\n'
        "- send_message-1 (notify-service/send_message, failed): error: outbox unavailable\n"
        "</tool_results>\n\n"
        "User request:\nTell alice the price of ACME"
    )
    [call] = log.calls
    assert (call.stage, call.phase, call.model, call.total_tokens, call.finish_reason) == (
        "synthesis",
        None,
        "writer",
        94,
        "stop",
    )
    assert call.response is not None and call.response.matches(output.response)


async def test_confidence_is_the_share_of_succeeded_steps_and_one_half_when_none_ran(server):
    server.push(ai.answer("I found nothing to do."), ai.answer("Done."))
    writer = synthesizer(server)
    quote = StepResult(step_id="q", tool="stock-service/stock_quote", status=StepStatus.SUCCEEDED, result="1")

    assert (await writer.synthesize(synthesize_input([]))).confidence == 0.5
    assert (await writer.synthesize(synthesize_input([quote]))).confidence == 1.0
    assert "(no tool ran)" in server.requests[0].messages[1]["content"]


async def test_streaming_yields_several_chunks_then_the_full_text_and_usage(server):
    server.push(ai.streamed(["ACME ", "is at ", "42.5 ", "USD."], usage=(70, 9)))

    stream = synthesizer(server).synthesize_stream(synthesize_input())
    chunks = [chunk async for chunk in stream]

    assert chunks == ["ACME ", "is at ", "42.5 ", "USD."]
    assert stream.text == "ACME is at 42.5 USD."
    assert stream.output is not None and stream.output.response == stream.text and stream.output.confidence == 0.5
    assert stream.call is not None and stream.call.streamed
    assert (stream.call.prompt_tokens, stream.call.completion_tokens, stream.call.finish_reason) == (70, 9, "stop")
    assert stream.usage.total_tokens == 79 and stream.usage.calls == 1
    body = server.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_a_stream_closed_early_is_recorded_as_abandoned(server):
    server.push(ai.streamed(["one ", "two ", "three"]))
    log = ModelCallLog()

    stream = synthesizer(server).synthesize_stream(synthesize_input(), calls=log)
    assert await anext(stream) == "one "
    await stream.aclose()

    assert stream.output is None and [c.error_type for c in log.calls] == ["Cancelled"]


@pytest.mark.parametrize(
    "reply, kind, retryable",
    [
        (ai.error(500, "upstream failed", kind="server_error"), "ModelUnavailable", True),
        (ai.error(401, "Incorrect API key provided"), "ModelRequestError", False),
        (ai.refusal("I won't write that."), "ModelRefusal", False),
        (ai.empty(), "EmptyCompletion", False),
    ],
)
async def test_synthesis_failures_are_typed_activity_errors(server, reply, kind, retryable):
    server.push(reply)

    err = await failure(synthesizer(server).synthesize(synthesize_input()))

    assert err.type == kind and err.non_retryable is not retryable
    assert [c["error_type"] for c in err.details[0]["model_calls"]] == [kind]


async def test_a_streamed_failure_is_raised_from_the_iteration(server):
    server.push(ai.error(429, "slow down", headers={"Retry-After": "2"}))

    stream = synthesizer(server).synthesize_stream(synthesize_input())
    err = await failure(anext(stream))

    assert err.type == "ModelUnavailable" and err.next_retry_delay is not None
    assert err.next_retry_delay.total_seconds() == 2


async def test_a_spent_budget_refuses_synthesis_before_any_call(server):
    writer = synthesizer(server)

    whole = await failure(writer.synthesize(synthesize_input(), calls=ModelCallLog(max_tokens_remaining=0)))
    streamed = await failure(anext(writer.synthesize_stream(synthesize_input(), calls=ModelCallLog(-3))))

    assert whole.type == streamed.type == "TokenBudgetExceeded" and whole.non_retryable
    assert server.requests == []


async def test_a_call_keeps_prompt_and_answer_by_digest_with_masked_previews_of_at_most_200_characters(server):
    secret = "sk-live-0123456789abcdefghij"
    server.push(ai.answer(f"Your key is {secret}. " + "x" * 500))
    log = ModelCallLog()
    input = synthesize_input().model_copy(update={"facts": {"key": f"The key is {secret}."}})

    output = await synthesizer(server).synthesize(input, calls=log)

    [call] = log.calls
    assert call.prompt is not None and call.response is not None
    assert call.prompt.matches(json.dumps(server.requests[0].messages, ensure_ascii=False, sort_keys=True))
    assert call.response.matches(output.response) and call.response.chars == len(output.response)
    for preview in (call.prompt.preview, call.response.preview):
        assert secret not in preview and "[REDACTED]" in preview and len(preview) <= 200
