"""Protective hooks fail closed, and a cached answer never stands in for work that was not done.

The demo's knowledge base leaks a key (``sk-demo-…``) into the synthesized answer; ``secret-redaction``
masks it. When redaction cannot run (it raises or times out) the request fails — the unredacted answer
is neither returned, nor printed, nor cached. The response cache stores an answer only when the
workflow declares the run cacheable: every executed step succeeded and called a ``read_only`` tool, no
checkpoint, no stop, no failed hook, not itself a short-circuit.
"""

from __future__ import annotations

import asyncio

import pytest

from client.cli import format_record
from client.settings import Settings
from demo.pipeline import KNOWLEDGE_FILE, demo_hooks
from hooks import PipelineHook, ToolDecision
from hooks.builtin import KnowledgeContextHook, ResponseCacheHook, SecretRedactionHook
from workflows.models import FailurePolicy, InvocationOutcome, RequestStatus, Stage

from .doubles import decision
from .harness import Harness, Outcome

QUOTE = "What is the price of ACME?"
SECRET = "sk-demo-"
ALL_OPERATIONS = [
    "demo-tools/stock-service/stock_quote",
    "demo-tools/stock-service/execute_trade",
    "demo-tools/notify-service/send_message",
]


class BrokenRedaction(SecretRedactionHook):
    """``secret-redaction`` as shipped (fail closed), but it cannot do its job: it raises or hangs."""

    timeout_seconds = 1.0
    max_attempts = 2

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    async def after_synthesis(self, ctx, response):
        if self.mode == "timeout":
            await asyncio.sleep(5)
        raise RuntimeError("redaction backend unavailable")


def cache(tmp_path) -> ResponseCacheHook:
    return ResponseCacheHook(tmp_path / "cache.sqlite3", ttl_seconds=300)


def served_from_cache(out: Outcome) -> bool:
    return (
        out.result is not None
        and out.result.short_circuit is not None
        and out.result.short_circuit.reason == "cache_match"
    )


@pytest.mark.parametrize("mode", ["raises", "timeout"])
async def test_a_redaction_that_cannot_run_fails_the_request_and_nothing_unredacted_leaves_or_is_cached(
    client, tmp_path, mode
):
    hooks = [cache(tmp_path), KnowledgeContextHook(KNOWLEDGE_FILE), BrokenRedaction(mode)]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        first = await h.run(QUOTE)
        second = await h.run(QUOTE)

    assert first.result is None and first.failure.type == "ExtensionError" and first.failure.non_retryable
    details = first.failure_details()
    assert (details["extension"], details["phase"], details["failure_policy"]) == (
        "secret-redaction",
        "after_synthesis",
        "fail_closed",
    )
    [redaction] = first.record.invocations(Stage.AFTER_SYNTHESIS)
    expected_outcome = InvocationOutcome.TIMED_OUT if mode == "timeout" else InvocationOutcome.FAILED
    assert redaction.outcome is expected_outcome
    assert decision(redaction)[:2] == ("fail_closed", "terminate")
    stored = await first.stored()
    assert stored.status is RequestStatus.FAILED and stored.final_response is None
    # The draft that quoted the key is kept only by digest and a masked preview, and never printed.
    assert stored.model_draft is not None and SECRET not in stored.model_draft.preview
    assert SECRET not in format_record(stored) and SECRET not in str(first.failure)
    assert stored.cache is not None and not stored.cache.cacheable
    assert stored.effect("response_cache_write").data["stored"] is False
    # The repeat is not served the unredacted answer from the cache: it is planned again, and fails again.
    assert not served_from_cache(second) and second.failure.type == "ExtensionError"
    assert second.record.effect("response_cache_lookup").data["found"] is False


class MyRedaction(PipelineHook):
    """A redaction hook of one's own that says nothing of its failure policy, and cannot run."""

    name = "my-redaction"
    max_attempts = 1

    async def after_synthesis(self, ctx, response):
        raise RuntimeError("redaction backend unavailable")


async def test_an_after_synthesis_hook_with_no_policy_fails_closed_and_the_answer_never_leaks(client, tmp_path):
    # The knowledge base quotes a key; the answer carries it until a redaction hook rewrites it.
    hooks = [KnowledgeContextHook(KNOWLEDGE_FILE), MyRedaction()]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        out = await h.run(QUOTE)

    assert out.result is None and out.failure.type == "ExtensionError" and out.failure.non_retryable
    details = out.failure_details()
    assert (details["extension"], details["phase"], details["failure_policy"]) == (
        "my-redaction",
        "after_synthesis",
        "fail_closed",
    )
    [redaction] = out.record.invocations(Stage.AFTER_SYNTHESIS)
    assert redaction.outcome is InvocationOutcome.FAILED
    assert decision(redaction)[:2] == ("fail_closed", "terminate")
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.final_response is None
    assert stored.model_draft is not None and SECRET not in stored.model_draft.preview
    assert SECRET not in format_record(stored) and SECRET not in str(out.failure)
    assert "after_answer" not in [i.stage.value for i in stored.pipeline_hooks]


class FlakyFormatter(PipelineHook):
    """An optional after_synthesis hook (fail open, as it says: the stage fails closed by default) that fails."""

    name = "flaky-formatter"
    max_attempts = 1
    failure_policy = FailurePolicy.FAIL_OPEN

    def after_synthesis(self, ctx, response):
        raise RuntimeError("formatter down")


async def test_an_answer_whose_after_synthesis_chain_had_a_failed_hook_is_returned_but_never_cached(client, tmp_path):
    hooks = [cache(tmp_path), KnowledgeContextHook(KNOWLEDGE_FILE), SecretRedactionHook(), FlakyFormatter()]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        first = await h.run(QUOTE)
        second = await h.run(QUOTE)

    assert first.failure is None and "[REDACTED]" in first.result.response and SECRET not in first.result.response
    assert first.record.cache.cacheable is False
    assert first.record.cache.reasons == ["hook flaky-formatter failed at after_synthesis"]
    assert not served_from_cache(second)


async def test_a_read_only_answer_is_cached_and_served_after_every_after_synthesis_hook_ran(client, tmp_path):
    hooks = [cache(tmp_path), KnowledgeContextHook(KNOWLEDGE_FILE), SecretRedactionHook()]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        first = await h.run(QUOTE)
        second = await h.run(QUOTE)

    assert first.failure is None and first.record.cache.cacheable
    assert served_from_cache(second)
    assert second.result.response == first.result.response and SECRET not in second.result.response
    assert second.tool_activities == []


async def test_side_effects_are_never_answered_from_the_cache(client, tmp_path):
    """The demo pipeline with every operation allowed: a repeated trade buys again and a repeated message
    waits for its reviewer again — neither is answered "Bought …" / "Message sent" from the cache."""
    settings = Settings(state_dir=tmp_path, allowed_operations=ALL_OPERATIONS)
    async with Harness(client, tmp_path, hooks=demo_hooks(settings), pipeline="demo") as h:
        trades = [await h.run("Buy 10 ACME") for _ in range(2)]
        messages = [await h.run("Send a message to alice saying hello", approve_as="ops") for _ in range(2)]

    for out in (*trades, *messages):
        assert out.failure is None and not served_from_cache(out)
        assert out.record.cache.cacheable is False
        assert out.record.effect("response_cache_write").data["stored"] is False
    assert any("execute_trade, which is not read_only" in r for r in trades[0].record.cache.reasons)
    assert "a checkpoint was opened" in messages[0].record.cache.reasons
    assert [s.status.value for out in trades for s in out.record.steps] == ["succeeded", "succeeded"]
    assert all(out.record.checkpoints for out in messages)
    outbox = (tmp_path / "outbox.jsonl").read_text().splitlines()
    assert len(outbox) == 2


class DenyQuotes(PipelineHook):
    name = "deny-quotes"

    def before_tool(self, ctx, call):
        return ToolDecision.deny("Quotes are paused.")


class StopAtTool(PipelineHook):
    name = "stop-at-tool"

    def before_tool(self, ctx, call):
        return ToolDecision.stop("Not today.", reason="closed")


@pytest.mark.parametrize(
    "extra,reason",
    [(DenyQuotes(), "step quote-acme skipped"), (StopAtTool(), "the run was stopped")],
    ids=["denied step", "stopped run"],
)
async def test_a_denied_step_or_a_stop_is_not_cached(client, tmp_path, extra, reason):
    async with Harness(client, tmp_path, hooks=[cache(tmp_path), extra]) as h:
        first = await h.run(QUOTE)
        second = await h.run(QUOTE)

    assert first.failure is None and reason in first.record.cache.reasons
    assert not served_from_cache(second)


def test_a_hook_may_declare_its_own_failure_policy_only_where_it_can_apply():
    from hooks import HookRegistry, InvalidPipelineConfigError, RequiredAfterPlanningHook

    class Gate(RequiredAfterPlanningHook, PipelineHook):
        name = "gate"
        failure_policy = FailurePolicy.FAIL_OPEN

        def after_planning(self, ctx, plan):
            return plan

    class Odd(PipelineHook):
        name = "odd"
        failure_policy = "sometimes"

        def after_synthesis(self, ctx, response):
            return response

    with pytest.raises(InvalidPipelineConfigError, match="does not apply to after_planning") as gate:
        HookRegistry([Gate()])
    with pytest.raises(InvalidPipelineConfigError, match="not one of") as odd:
        HookRegistry([Odd()])
    assert gate.value.reason == odd.value.reason == "invalid_option"
    [entry] = HookRegistry([SecretRedactionHook()]).entries
    assert entry.failure_policy is FailurePolicy.FAIL_CLOSED
