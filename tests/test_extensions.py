"""Run-level lifecycle extensions: before_run, after_answer, before_remember, on_error,
on_finish, each extension's private state per run, observer failures, and names. Every run goes through
``RequestLifecycle`` on the real dev server; every history is replayed when its harness closes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError

from activities.memory import ConversationMemoryStore
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import quote_price
from hooks import (
    AnswerView,
    HookRegistry,
    HookRejection,
    InvalidPipelineConfigError,
    MemoryCandidate,
    PipelineHook,
    PipelineShortCircuit,
    PlanStep,
    Plugin,
    RequiredAfterPlanningHook,
    RunErrorView,
    RunOutcomeView,
    RunPatch,
    RunView,
    SkipMemory,
    Stage,
    Stop,
)
from storage.executions import SQLiteExecutionStore
from workflows.models import Diagnostic, FailurePolicy, MemoryOutcome, Plan, RequestStatus, StageSettings, StopInfo

from .doubles import BlockingTool, FixedPlanner, decision, quote, started_attempts
from .harness import Harness, Outcome

ACME_ASK = "What is the price of ACME?"
ACME = f"ACME is trading at {quote_price('ACME')} USD."
MSFT_ASK = "What is the price of MSFT?"
MSFT = f"MSFT is trading at {quote_price('MSFT')} USD."


# --------------------------------------------------------------------------------------------------
# Doubles
# --------------------------------------------------------------------------------------------------


class RecordingPlanner(RulePlanner):
    """The demo's rule planner, keeping every request it was given (the ask, the prompt, ...)."""

    name = "recording-planner"

    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def plan(self, request):
        self.requests.append(request)
        return await super().plan(request)


class RecordingSynthesizer(TemplateSynthesizer):
    name = "recording-synthesizer"

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    async def synthesize(self, input):
        self.inputs.append(input.model_copy(deep=True))
        return await super().synthesize(input)


class FailingPlanner:
    """Fails planning outright (non-retryable), so the request ends with ``PlanningFailed``."""

    name = "failing-planner"

    def __init__(self) -> None:
        self.calls = 0

    async def plan(self, request) -> Plan:
        self.calls += 1
        raise ApplicationError("planner offline", type="PlannerDown", non_retryable=True)


class FailingSynthesizer:
    name = "failing-synthesizer"

    async def synthesize(self, input):
        raise ApplicationError("model overloaded", type="ModelDown", non_retryable=True)


BLOCKING_STEP = PlanStep(step_id="wait", namespace="test-tools", agent="slow-service", capability="wait_forever")


def message_step(step_id: str = "notify") -> PlanStep:
    """A demo ``send_message`` step: its tool is approval-required, so the plan waits at a checkpoint."""
    return PlanStep(
        step_id=step_id,
        namespace="demo-tools",
        agent="notify-service",
        capability="send_message",
        arguments={"to": "bob", "text": "hi bob"},
    )


class Watcher:
    """An extension that implements after_answer, on_error and on_finish and logs every call it gets."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, str, Any]] = []  # (stage, workflow id, what it saw)

    async def after_answer(self, ctx, answer: AnswerView):
        self.calls.append(("after_answer", ctx.workflow_id, answer.text))
        return None

    async def on_error(self, ctx, error: RunErrorView):
        self.calls.append(("on_error", ctx.workflow_id, error))

    async def on_finish(self, ctx, outcome: RunOutcomeView):
        self.calls.append(("on_finish", ctx.workflow_id, outcome))

    def seen(self, stage: str, workflow_id: str) -> list[Any]:
        return [what for s, wid, what in self.calls if s == stage and wid == workflow_id]


class Finisher:
    """An extension that only implements on_finish."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.outcomes: list[tuple[str, RunOutcomeView, dict]] = []

    async def on_finish(self, ctx, outcome: RunOutcomeView):
        self.outcomes.append((ctx.workflow_id, outcome, dict(ctx.state)))

    def seen(self, workflow_id: str) -> list[RunOutcomeView]:
        return [o for wid, o, _ in self.outcomes if wid == workflow_id]


class StopAtStart:
    def __init__(
        self, name: str = "stopper", text: str = "Cloud processing is disabled.", reason: str = "cloud-disabled"
    ):
        self.name, self.text, self.reason = name, text, reason
        self.calls = 0

    async def before_run(self, ctx, run: RunView):
        self.calls += 1
        return Stop(text=self.text, reason=self.reason)


class RefuseAtStart:
    name = "refuser"
    max_attempts = 1

    async def before_run(self, ctx, run: RunView):
        raise HookRejection("refused at start")


class RequiredGate(RequiredAfterPlanningHook):
    name = "required-gate"

    async def after_planning(self, ctx, plan: Plan) -> Plan:
        raise HookRejection("plan refused by policy")


def extension_failure(out: Outcome, extension: str, phase: str) -> dict:
    """The details of the ``ExtensionError`` a request failed with, after checking it names the extension and
    the phase and is non-retryable."""
    failure = out.failure
    assert isinstance(failure, ApplicationError), f"expected ExtensionError, got {out.failure!r} / {out.result!r}"
    assert failure.type == "ExtensionError"
    assert failure.non_retryable is True
    details = out.failure_details()
    assert (details["extension"], details["phase"]) == (extension, phase)
    assert f"extension {extension!r} failed at {phase}" in failure.message
    assert out.record.status is RequestStatus.FAILED
    assert out.record.error.type == "ExtensionError"
    assert out.record.error.details["extension"] == extension
    return details


def after(types: list[str], first: str, then: str) -> bool:
    """Every ``first`` activity is scheduled before the first ``then``."""
    return max(i for i, t in enumerate(types) if t == first) < types.index(then)


# --------------------------------------------------------------------------------------------------
# before_run
# --------------------------------------------------------------------------------------------------


async def test_before_run_rewrites_the_ask_instructions_and_facts_everything_after_sees(client, tmp_path):
    class Rewriter:
        name = "rewriter"

        async def before_run(self, ctx, run: RunView):
            return RunPatch(
                ask=MSFT_ASK, instructions="Answer in one sentence.", facts={"timezone": "UTC", "desk": "eu"}
            )

    class Localizer:
        name = "localizer"
        seen: list[RunView] = []

        async def before_run(self, ctx, run: RunView):
            Localizer.seen.append(run.model_copy(deep=True))
            return RunPatch(facts={"timezone": "America/New_York"})

    class Keeper:
        name = "keeper"
        contexts: list[tuple[str, str, dict]] = []

        async def before_run(self, ctx, run: RunView):
            return None

        async def after_answer(self, ctx, answer: AnswerView):
            Keeper.contexts.append((ctx.request, ctx.instructions, dict(ctx.facts)))
            return None

    planner, synthesizer = RecordingPlanner(), RecordingSynthesizer()
    async with Harness(
        client, tmp_path, hooks=[Rewriter(), Localizer(), Keeper()], planner=planner, synthesizer=synthesizer
    ) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None
    merged = {"timezone": "America/New_York", "desk": "eu"}  # facts merge, the later hook winning
    # A later before_run hook sees the earlier rewrite.
    assert Localizer.seen == [
        RunView(ask=MSFT_ASK, instructions="Answer in one sentence.", facts={"timezone": "UTC", "desk": "eu"})
    ]

    # The planner plans the new ask and reads the instructions and facts in its prompt.
    [planned] = planner.requests
    assert planned.request == MSFT_ASK
    assert planned.instructions == "Answer in one sentence."
    assert dict(planned.facts) == merged
    prompt = planned.prompt
    assert "<instructions>\nAnswer in one sentence.\n</instructions>" in prompt
    assert "<facts>\ndesk: eu\ntimezone: America/New_York\n</facts>" in prompt
    assert f"User request (planning phase 1):\n{MSFT_ASK}" in prompt
    assert "ACME" not in prompt and "UTC" not in prompt
    assert out.record.planning_prompt == prompt

    # The synthesizer answers the new ask, with the same instructions and facts.
    [synthesized] = synthesizer.inputs
    assert (synthesized.request, synthesized.instructions, synthesized.facts) == (
        MSFT_ASK,
        "Answer in one sentence.",
        merged,
    )
    assert [s.tool for s in out.record.steps] == ["stock-service/stock_quote"]
    assert out.record.steps[0].arguments == {"symbol": "MSFT"}
    assert out.result.response == MSFT

    # Later hooks' ctx carries the ask being served.
    assert Keeper.contexts == [(MSFT_ASK, "Answer in one sentence.", merged)]

    # The record keeps the original request beside the ask served.
    record = out.record
    assert (record.request, record.ask) == (ACME_ASK, MSFT_ASK)
    assert (record.instructions, record.facts) == ("Answer in one sentence.", merged)
    assert [(i.hook, decision(i)) for i in record.invocations(Stage.BEFORE_RUN)] == [
        ("rewriter", ("fail_closed", "continue", "modified")),
        ("localizer", ("fail_closed", "continue", "modified")),
        ("keeper", ("fail_closed", "continue", "accepted")),
    ]
    stored = await out.stored()
    assert (stored.ask, stored.instructions, stored.facts) == (MSFT_ASK, "Answer in one sentence.", merged)
    # before_run runs first, before anything else of the pipeline.
    types = out.activity_types()
    assert types[:4] == ["resolve_pipeline", "before_run_hook", "before_run_hook", "before_run_hook"]


async def test_before_run_returning_nothing_keeps_the_ask(client, tmp_path):
    class Quiet:
        name = "quiet"

        def before_run(self, ctx, run: RunView):  # a plain function is allowed too
            return None

    planner = RecordingPlanner()
    async with Harness(client, tmp_path, hooks=[Quiet()], planner=planner) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None and out.result.response == ACME
    assert [r.request for r in planner.requests] == [ACME_ASK]
    assert "<instructions>" not in planner.requests[0].prompt and "<facts>" not in planner.requests[0].prompt
    assert (out.record.ask, out.record.instructions, out.record.facts) == (None, "", {})
    [inv] = out.record.invocations(Stage.BEFORE_RUN, "quiet")
    assert decision(inv) == ("fail_closed", "continue", "accepted")


async def test_before_run_stop_ends_the_run_with_its_text_and_only_finalizers_run(client, tmp_path):
    stopper = StopAtStart()

    class Late:
        """Registered after the stopper: its before_run and after_answer are never reached, its on_finish is."""

        name = "late"
        calls: list[str] = []

        async def before_run(self, ctx, run):
            Late.calls.append("before_run")

        async def before_planning(self, ctx):
            Late.calls.append("before_planning")

        async def after_answer(self, ctx, answer):
            Late.calls.append("after_answer")

        async def on_error(self, ctx, error):
            Late.calls.append("on_error")

        async def on_finish(self, ctx, outcome: RunOutcomeView):
            Late.calls.append(f"on_finish:{outcome.status}")

    finisher = Finisher("finisher")
    planner = RecordingPlanner()
    async with Harness(client, tmp_path, hooks=[stopper, Late(), finisher], planner=planner) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None
    result = out.result
    assert result.response == "Cloud processing is disabled."
    assert result.stopped.model_dump() == {"extension": "stopper", "phase": "before_run", "reason": "cloud-disabled"}
    assert result.short_circuit is None and result.steps == [] and result.diagnostics == []

    # Nothing after the stop but the finalizers and the terminal persist.
    assert out.summaries == [
        "resolve_pipeline",
        "before_run · stopper",
        "on_finish · late",
        "on_finish · finisher",
        "bookkeeping · persist record · terminal · revision 1",
    ]
    assert planner.requests == [] and stopper.calls == 1
    assert Late.calls == ["on_finish:stopped"]
    [seen] = finisher.seen(out.workflow_id)
    assert seen.status == "stopped" and seen.response == "Cloud processing is disabled."
    assert seen.stopped == StopInfo(extension="stopper", phase="before_run", reason="cloud-disabled")
    assert seen.error is None

    record = out.record
    assert record.status is RequestStatus.STOPPED
    assert record.stopped == result.stopped
    assert record.final_response == "Cloud processing is disabled."
    assert record.model_draft is None and record.steps == [] and record.error is None
    [inv] = record.invocations(Stage.BEFORE_RUN)
    assert (inv.hook, decision(inv)) == ("stopper", ("fail_closed", "stop", "stopped"))
    stored = await out.stored()
    assert stored.status is RequestStatus.STOPPED and stored.request_completion == "stopped"
    assert stored.stopped == result.stopped and stored.final_response == "Cloud processing is disabled."
    assert (await h.client.get_workflow_handle(out.workflow_id).describe()).status == WorkflowExecutionStatus.COMPLETED


class _EmptyAsk:
    name = "bad"

    async def before_run(self, ctx, run):
        return RunPatch(ask="   ")


class _WrongType:
    name = "bad"

    async def before_run(self, ctx, run):
        return "What is the price of MSFT?"  # a str, not a RunPatch


class _Rejects:
    """Its own on_finish still runs after its before_run failed."""

    name = "bad"
    finished: list[tuple[str, str]] = []

    async def before_run(self, ctx, run):
        raise HookRejection("not today")

    async def on_finish(self, ctx, outcome):
        _Rejects.finished.append((ctx.workflow_id, outcome.status))


class _Raises:
    name = "bad"
    max_attempts = 2
    calls = 0

    async def before_run(self, ctx, run):
        _Raises.calls += 1
        raise RuntimeError("lookup backend down")


@pytest.mark.parametrize(
    ("hook", "cause", "cause_type", "exception_type", "attempts"),
    [
        (_EmptyAsk, "before_run rewrote the ask to empty text", "InvalidHookResult", None, 1),
        (_WrongType, "before_run must return RunPatch, Stop or None, got str", "InvalidHookResult", None, 1),
        (_Rejects, "not today", "HookError", "HookRejection", 1),
        (_Raises, "lookup backend down", "HookError", "RuntimeError", 2),
    ],
    ids=["empty-ask", "wrong-type", "rejection", "raise-after-retries"],
)
async def test_a_failing_before_run_ends_the_run_with_extension_error(
    client, tmp_path, hook, cause, cause_type, exception_type, attempts
):
    watcher = Watcher("watcher")
    planner = RecordingPlanner()
    async with Harness(client, tmp_path, hooks=[hook(), watcher], planner=planner) as h:
        out = await h.run(ACME_ASK)

    details = extension_failure(out, "bad", "before_run")
    assert details["cause"] == cause
    assert details["cause_type"] == cause_type
    assert details["exception_type"] == exception_type
    assert started_attempts(out, "before_run_hook") == [attempts]
    # Nothing of the pipeline ran; the observers did, on_error first.
    assert planner.requests == []
    finalizers = ["on_finish_hook"] * (2 if hook is _Rejects else 1)
    assert out.activity_types() == [
        "resolve_pipeline",
        "before_run_hook",
        "on_error_hook",
        *finalizers,
        "persist_execution_record",
    ]
    if hook is _Rejects:
        assert [status for wid, status in _Rejects.finished if wid == out.workflow_id] == ["error"]
    [error] = watcher.seen("on_error", out.workflow_id)
    assert (error.origin, error.type) == ("extension", "ExtensionError")
    assert (
        error.details["extension"] == "bad"
        and error.details["phase"] == "before_run"
        and error.details["cause"] == cause
    )
    [finished] = watcher.seen("on_finish", out.workflow_id)
    assert finished.status == "error" and finished.error == error
    assert watcher.seen("after_answer", out.workflow_id) == []
    [inv] = out.record.invocations(Stage.BEFORE_RUN, "bad")
    assert inv.outcome.value == "failed" and inv.error == cause
    assert decision(inv)[:2] == ("fail_closed", "terminate")
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.error.type == "ExtensionError"
    assert stored.ask is None  # no rewrite was applied


# --------------------------------------------------------------------------------------------------
# after_answer
# --------------------------------------------------------------------------------------------------


async def test_after_answer_rewrites_chain_in_order_and_the_record_keeps_the_model_draft(client, tmp_path):
    class Polish:
        name = "polish"

        async def after_synthesis(self, ctx, response: str) -> str:
            return response + " (polished)"

    class Check:
        name = "check"
        seen: list[AnswerView] = []

        async def after_answer(self, ctx, answer: AnswerView):
            Check.seen.append(answer.model_copy(deep=True))
            return answer.text + " [checked]"

    class Sign:
        name = "sign"
        seen: list[str] = []

        def after_answer(self, ctx, answer: AnswerView):
            Sign.seen.append(answer.text)
            return answer.text + " -- bot"

    class Pass:
        name = "pass"

        async def after_answer(self, ctx, answer: AnswerView):
            return None

    async with Harness(client, tmp_path, hooks=[Polish(), Check(), Sign(), Pass()]) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None
    final = f"{ACME} (polished) [checked] -- bot"
    assert out.result.response == final
    [seen] = Check.seen
    assert (seen.text, seen.handled_by) == (f"{ACME} (polished)", "pipeline")
    assert [(s.step_id, s.tool, s.status) for s in seen.steps] == [
        ("quote-acme", "stock-service/stock_quote", "succeeded")
    ]
    assert Sign.seen == [f"{ACME} (polished) [checked]"]
    record = out.record
    assert record.model_draft.matches(ACME)  # the synthesizer's own text
    assert record.final_response == final
    assert record.stopped is None and record.status is RequestStatus.SUCCEEDED
    assert [(i.hook, decision(i)) for i in record.invocations(Stage.AFTER_ANSWER)] == [
        ("check", ("fail_closed", "continue", "rewritten")),
        ("sign", ("fail_closed", "continue", "rewritten")),
        ("pass", ("fail_closed", "continue", "accepted")),
    ]
    types = out.activity_types()
    assert after(types, "after_synthesis_hook", "after_answer_hook")
    assert (
        types[-1] == "persist_execution_record"
        and max(i for i, t in enumerate(types) if t == "after_answer_hook") < len(types) - 1
    )
    stored = await out.stored()
    assert stored.model_draft.matches(ACME) and stored.final_response == final


async def test_after_answer_applies_to_short_circuited_answers(client, tmp_path):
    class Closed:
        name = "closed"

        async def before_planning(self, ctx):
            return PipelineShortCircuit(response="Markets are closed today.", source="calendar")

    class Tag:
        name = "tag"
        seen: list[AnswerView] = []

        async def after_answer(self, ctx, answer: AnswerView):
            Tag.seen.append(answer.model_copy(deep=True))
            return answer.text + " (from the calendar)"

    planner = RecordingPlanner()
    async with Harness(client, tmp_path, hooks=[Closed(), Tag()], planner=planner) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None
    [seen] = Tag.seen
    assert (seen.text, seen.handled_by, seen.steps) == ("Markets are closed today.", "short_circuit", [])
    assert out.result.response == "Markets are closed today. (from the calendar)"
    assert out.result.short_circuit.source == "calendar"
    assert planner.requests == [] and "plan" not in out.activity_types() and "synthesize" not in out.activity_types()
    assert out.record.final_response == "Markets are closed today. (from the calendar)"
    assert out.record.model_draft is None


async def test_an_observing_after_answer_hook_never_sees_an_empty_answer_nor_fails_it(client, tmp_path):
    """An after_synthesis hook leaves the answer empty: after_answer does not run (it runs once a non-empty
    answer exists), and the request completes as it does without the observer."""

    class Blank:
        name = "blank"

        async def after_synthesis(self, ctx, response: str) -> str:
            return ""

    class Observer:
        name = "observer"
        seen: list[str] = []

        async def after_answer(self, ctx, answer: AnswerView):
            Observer.seen.append(answer.text)
            return None

    async with Harness(client, tmp_path, hooks=[Blank(), Observer()]) as h:
        observed = await h.run(ACME_ASK)
    async with Harness(client, tmp_path / "without", hooks=[Blank()]) as h:
        alone = await h.run(ACME_ASK)

    for out in (observed, alone):
        assert out.failure is None, out.failure
        assert out.result.response == "" and out.record.status is RequestStatus.SUCCEEDED
    assert Observer.seen == []
    assert "after_answer_hook" not in observed.activity_types()
    assert observed.record.invocations(Stage.AFTER_ANSWER) == []


async def test_after_answer_stop_replaces_the_answer_and_marks_the_run_stopped(client, tmp_path):
    class Guard:
        name = "guard"

        async def after_answer(self, ctx, answer: AnswerView):
            return Stop(text="That answer is withheld.", reason="pii")

    class Later:
        name = "later"
        calls = 0

        async def after_answer(self, ctx, answer: AnswerView):
            Later.calls += 1
            return answer.text + " [later]"

    finisher = Finisher("finisher")
    async with Harness(client, tmp_path, hooks=[Guard(), Later(), finisher]) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None
    result = out.result
    assert result.response == "That answer is withheld."
    assert result.stopped == StopInfo(extension="guard", phase="after_answer", reason="pii")
    assert [s.step_id for s in result.steps] == ["quote-acme"]
    assert Later.calls == 0 and out.record.invocations(Stage.AFTER_ANSWER, "later") == []
    [seen] = finisher.seen(out.workflow_id)
    assert (seen.status, seen.response, seen.stopped) == ("stopped", "That answer is withheld.", result.stopped)
    record = out.record
    assert record.status is RequestStatus.STOPPED and record.stopped == result.stopped
    assert record.model_draft.matches(ACME) and record.final_response == "That answer is withheld."
    [inv] = record.invocations(Stage.AFTER_ANSWER)
    assert decision(inv) == ("fail_closed", "stop", "stopped")
    stored = await out.stored()
    assert stored.status is RequestStatus.STOPPED and stored.final_response == "That answer is withheld."
    assert out.activity_types()[-2:] == ["on_finish_hook", "persist_execution_record"]


@pytest.mark.parametrize(
    ("returned", "cause"),
    [
        ("", "after_answer produced an empty answer"),
        ("  \n ", "after_answer produced an empty answer"),
        (Stop(text="", reason="blank"), "after_answer produced an empty answer"),
        (42, "after_answer must return str, Stop or None, got int"),
    ],
    ids=["empty", "blank", "empty-stop", "wrong-type"],
)
async def test_an_empty_or_invalid_answer_is_an_extension_error(client, tmp_path, returned, cause):
    class Blank:
        name = "blank"
        calls = 0

        async def after_answer(self, ctx, answer: AnswerView):
            Blank.calls += 1
            return returned

    watcher = Finisher("finisher")
    async with Harness(client, tmp_path, hooks=[Blank(), watcher]) as h:
        out = await h.run(ACME_ASK)

    details = extension_failure(out, "blank", "after_answer")
    assert details["cause"] == cause and details["cause_type"] == "InvalidHookResult"
    assert Blank.calls == 1 and started_attempts(out, "after_answer_hook") == [1]  # not a request to retry
    assert out.record.model_draft.matches(ACME) and out.record.final_response is None
    assert out.record.stopped is None
    [seen] = watcher.seen(out.workflow_id)
    assert seen.status == "error" and seen.error.type == "ExtensionError" and seen.error.origin == "extension"


# --------------------------------------------------------------------------------------------------
# before_remember, with a conversation memory store
# --------------------------------------------------------------------------------------------------


class FactsAtStart:
    name = "facts"

    async def before_run(self, ctx, run):
        return RunPatch(ask=MSFT_ASK, facts={"timezone": "UTC"})


class AnswerTag:
    name = "answer-tag"

    async def after_answer(self, ctx, answer):
        return answer.text + " [final]"


async def test_a_completed_run_remembers_its_exchange_under_the_conversation(client, tmp_path):
    class Peek:
        name = "peek"
        seen: list[MemoryCandidate] = []

        async def before_remember(self, ctx, candidate: MemoryCandidate):
            Peek.seen.append(candidate.model_copy(deep=True))
            return None

    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[FactsAtStart(), AnswerTag(), Peek()], memory=memory) as h:
        with_conversation = await h.run(ACME_ASK, {"conversation_id": "conv-1"})
        without = await h.run(ACME_ASK, request_id="req-no-conversation")

    expected = MemoryCandidate(
        conversation_id="conv-1", request=MSFT_ASK, answer=f"{MSFT} [final]", facts={"timezone": "UTC"}
    )
    assert with_conversation.failure is None and with_conversation.result.response == f"{MSFT} [final]"
    assert await memory.recent("conv-1") == [expected]
    assert with_conversation.record.memory == MemoryOutcome(action="saved", conversation_id="conv-1")
    # Without a conversation id the request id is the conversation.
    assert without.failure is None
    assert await memory.recent("req-no-conversation") == [
        expected.model_copy(update={"conversation_id": "req-no-conversation"})
    ]
    assert without.record.memory == MemoryOutcome(action="saved", conversation_id="req-no-conversation")
    assert Peek.seen == [expected, expected.model_copy(update={"conversation_id": "req-no-conversation"})]

    types = with_conversation.activity_types()
    assert types.count("remember") == 1 and types.count("before_remember_hook") == 1
    assert after(types, "after_answer_hook", "before_remember_hook")
    assert after(types, "before_remember_hook", "remember")
    assert types[-1] == "persist_execution_record"
    [inv] = with_conversation.record.invocations(Stage.BEFORE_REMEMBER, "peek")
    assert decision(inv) == ("fail_closed", "continue", "accepted")
    stored = await with_conversation.stored()
    assert stored.memory == MemoryOutcome(action="saved", conversation_id="conv-1")


async def test_a_before_remember_replacement_is_what_is_saved(client, tmp_path):
    class Redactor:
        name = "redactor"

        async def before_remember(self, ctx, candidate: MemoryCandidate):
            return candidate.model_copy(update={"answer": "[answer redacted]", "facts": {}})

    class Next:
        name = "next"
        seen: list[MemoryCandidate] = []

        async def before_remember(self, ctx, candidate: MemoryCandidate):
            Next.seen.append(candidate.model_copy(deep=True))
            return None

    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[FactsAtStart(), Redactor(), Next()], memory=memory) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-2"})

    replacement = MemoryCandidate(conversation_id="conv-2", request=MSFT_ASK, answer="[answer redacted]", facts={})
    assert out.failure is None and out.result.response == MSFT  # the answer itself is untouched
    assert Next.seen == [replacement]
    assert await memory.recent("conv-2") == [replacement]
    assert out.record.memory == MemoryOutcome(action="saved", conversation_id="conv-2", by="redactor")
    assert [(i.hook, decision(i)) for i in out.record.invocations(Stage.BEFORE_REMEMBER)] == [
        ("redactor", ("fail_closed", "continue", "memory_replaced")),
        ("next", ("fail_closed", "continue", "accepted")),
    ]


async def test_skip_memory_saves_nothing_and_ends_the_before_remember_chain(client, tmp_path):
    class Private:
        name = "private"

        async def before_remember(self, ctx, candidate):
            return SkipMemory(reason="private conversation")

    class Restore:
        """Would put the candidate back; it must never be asked."""

        name = "restore"
        calls = 0

        async def before_remember(self, ctx, candidate):
            Restore.calls += 1
            return candidate

    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[Private(), Restore()], memory=memory) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-3"})

    assert out.failure is None and out.result.response == ACME
    assert Restore.calls == 0 and out.record.invocations(Stage.BEFORE_REMEMBER, "restore") == []
    assert "remember" not in out.activity_types()
    assert await memory.recent("conv-3") == []
    assert out.record.memory == MemoryOutcome(
        action="skipped", conversation_id="conv-3", by="private", reason="private conversation"
    )
    [inv] = out.record.invocations(Stage.BEFORE_REMEMBER)
    assert decision(inv) == ("fail_closed", "skip", "memory_skipped")
    assert (await out.stored()).memory.action == "skipped"


class _StopAfterAnswer:
    name = "stopper"

    async def after_answer(self, ctx, answer):
        return Stop(text="Withheld.", reason="policy")


@pytest.mark.parametrize("ending", ["stopped-before-run", "stopped-after-answer", "failed"])
async def test_stopped_and_failed_runs_are_not_remembered(client, tmp_path, ending):
    class Peek:
        name = "peek"
        calls = 0

        async def before_remember(self, ctx, candidate):
            Peek.calls += 1

    first = {
        "stopped-before-run": StopAtStart(),
        "stopped-after-answer": _StopAfterAnswer(),
        "failed": RefuseAtStart(),
    }[ending]
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[first, Peek()], memory=memory) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-4"})

    if ending == "failed":
        assert out.failure is not None and out.failure.type == "ExtensionError"
    else:
        assert out.failure is None and out.result.stopped is not None
    assert Peek.calls == 0
    assert "before_remember_hook" not in out.activity_types() and "remember" not in out.activity_types()
    assert await memory.recent("conv-4") == []
    assert out.record.memory is None


async def test_a_best_effort_answer_is_not_remembered_and_after_answer_is_told(client, tmp_path):
    """The run hits its phase cap before the planner is done: the answer is best-effort — after_answer
    sees ``best_effort``, before_remember is never asked and nothing is saved."""

    class Endless(RulePlanner):
        async def plan(self, request):
            plan = await super().plan(request)
            return plan.model_copy(update={"continue_after": True})

    class Told:
        name = "told"
        seen: list[bool] = []

        async def after_answer(self, ctx, answer: AnswerView):
            Told.seen.append(answer.best_effort)

    class Peek:
        name = "peek"
        calls = 0

        async def before_remember(self, ctx, candidate):
            Peek.calls += 1

    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    settings = StageSettings(max_planning_phases=1)
    async with Harness(
        client, tmp_path, hooks=[Told(), Peek()], memory=memory, planner=Endless(), settings=settings
    ) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-best-effort"})

    assert out.failure is None and out.record.phase_cap_reached
    assert Told.seen == [True] and Peek.calls == 0
    assert "before_remember_hook" not in out.activity_types() and "remember" not in out.activity_types()
    assert await memory.recent("conv-best-effort") == []
    assert out.record.memory == MemoryOutcome(
        action="skipped",
        conversation_id="conv-best-effort",
        reason="a best-effort answer (the phase cap was hit)",
    )


class _RememberRaises:
    name = "bad-memory"
    max_attempts = 1

    async def before_remember(self, ctx, candidate):
        raise RuntimeError("vector index down")


class _RememberWrongType:
    name = "bad-memory"

    async def before_remember(self, ctx, candidate):
        return {"answer": "not a candidate"}


@pytest.mark.parametrize(
    ("hook", "cause", "cause_type"),
    [
        (_RememberRaises, "vector index down", "HookError"),
        (
            _RememberWrongType,
            "before_remember must return MemoryCandidate, SkipMemory or None, got dict",
            "InvalidHookResult",
        ),
    ],
    ids=["raises", "wrong-type"],
)
async def test_a_failing_before_remember_is_an_extension_error_and_saves_nothing(
    client, tmp_path, hook, cause, cause_type
):
    finisher = Finisher("finisher")
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[hook(), finisher], memory=memory) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-6"})

    details = extension_failure(out, "bad-memory", "before_remember")
    assert (details["cause"], details["cause_type"]) == (cause, cause_type)
    assert "remember" not in out.activity_types()
    assert await memory.recent("conv-6") == [] and out.record.memory is None
    [seen] = finisher.seen(out.workflow_id)
    assert seen.status == "error" and seen.error.origin == "extension"


class BrokenMemory(ConversationMemoryStore):
    async def save(self, candidate, *, request_id):
        raise OSError("disk full")


async def test_a_memory_save_failure_keeps_the_completed_answer_and_is_a_diagnostic(client, tmp_path):
    last = Finisher("last")
    memory = BrokenMemory(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[AnswerTag(), last], memory=memory) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-7"})

    assert out.failure is None and out.result.response == f"{ACME} [final]"
    [diagnostic] = out.result.diagnostics
    assert (diagnostic.extension, diagnostic.phase, diagnostic.error_type) == ("(memory)", "remember", "MemoryError")
    assert "disk full" in diagnostic.error
    assert out.activity_types().count("plan") == 1  # the turn is never run again
    [seen] = last.seen(out.workflow_id)
    assert seen.status == "completed" and seen.diagnostics == [diagnostic]
    assert out.record.status is RequestStatus.SUCCEEDED and out.record.memory is None
    assert out.record.diagnostics == [diagnostic]
    assert await memory.recent("conv-7") == []


async def test_without_a_memory_store_before_remember_is_never_invoked(client, tmp_path):
    class Peek:
        name = "peek"
        calls = 0

        async def before_remember(self, ctx, candidate):
            Peek.calls += 1

    async with Harness(client, tmp_path, hooks=[Peek()]) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-5"})

    assert out.failure is None and out.result.response == ACME
    assert Peek.calls == 0
    assert "before_remember_hook" not in out.activity_types() and "remember" not in out.activity_types()
    assert out.record.memory is None and out.record.invocations(Stage.BEFORE_REMEMBER) == []


# --------------------------------------------------------------------------------------------------
# on_error and on_finish, for every outcome
# --------------------------------------------------------------------------------------------------


async def drive(case: str, client, tmp_path: Path, observers: list[Any], leftovers: list) -> tuple[Outcome, Any]:
    """Run one request that ends as ``case`` with ``observers`` registered after the case's own hooks;
    returns the outcome and the case's tool (for the cancelled case)."""
    hooks: list[Any] = list(observers)
    options: dict[str, Any] = {}
    tool = None
    if case == "stopped":
        hooks.insert(0, StopAtStart())
    elif case == "extension":
        hooks.insert(0, RefuseAtStart())
    elif case == "planner":
        options["planner"] = FailingPlanner()
    elif case == "synthesizer":
        options["synthesizer"] = FailingSynthesizer()
    elif case == "hook":
        hooks.append(RequiredGate())
    elif case == "confirmation":
        options["planner"] = FixedPlanner(quote("quote-acme", "ACME"), message_step())
    elif case == "cancelled":
        tool = BlockingTool()
        options["tools"] = [tool]
        options["planner"] = FixedPlanner(BLOCKING_STEP)
    async with Harness(client, tmp_path, hooks=hooks, **options) as h:
        handle = await h.start(ACME_ASK)
        leftovers.append(handle)
        if case == "confirmation":
            checkpoint = await h.wait_for_checkpoint(handle)
            await handle.signal(
                "reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "ops", "reason": "no"}
            )
        elif case == "cancelled":
            await asyncio.wait_for(tool.started.wait(), timeout=30)
            await handle.cancel()
        out = await h.finish(handle)
    return out, tool


ERROR_CASES = {
    # case: (origin, error type)
    "extension": ("extension", "ExtensionError"),
    "planner": ("model", "PlanningFailed"),
    "synthesizer": ("model", "SynthesisFailed"),
    "hook": ("extension", "RequiredAfterPlanningError"),
    "confirmation": ("confirmation", "CheckpointRejected"),
    "cancelled": ("cancelled", "Cancelled"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
async def test_on_error_observes_the_error_with_its_origin_before_on_finish(client, tmp_path, leftovers, case):
    origin, error_type = ERROR_CASES[case]
    first, second = Watcher("first"), Watcher("second")
    out, _ = await drive(case, client, tmp_path, [first, second], leftovers)

    if case == "cancelled":
        assert isinstance(out.failure, CancelledError)
    else:
        assert isinstance(out.failure, ApplicationError) and out.failure.type == error_type
    for watcher in (first, second):
        [error] = watcher.seen("on_error", out.workflow_id)
        assert (error.origin, error.type) == (origin, error_type)
        [finished] = watcher.seen("on_finish", out.workflow_id)
        assert finished.status == ("cancelled" if case == "cancelled" else "error")
        assert finished.error == error and finished.response is None and finished.stopped is None
        # Each watcher's on_error came before its on_finish, and its after_answer never ran.
        stages = [s for s, wid, _ in watcher.calls if wid == out.workflow_id]
        assert stages == ["on_error", "on_finish"]
    if case != "cancelled":
        assert error.message == out.failure.message
        assert error.details == out.failure_details()
    if case == "extension":
        assert error.details["extension"] == "refuser" and error.details["phase"] == "before_run"
    if case == "confirmation":
        assert error.details["reason"] == "no" and error.details["reviewer"] == "ops"
    if case == "planner":
        assert error.details["cause"] == "planner offline"
    if case == "synthesizer":
        assert error.details["cause"] == "model overloaded"
        assert [(st.step_id, st.status) for st in error.steps] == [("quote-acme", "succeeded")]
    if case == "hook":
        assert error.details["hook"] == "required-gate"
    # Every on_error before any on_finish, in registration order, then the terminal persist.
    assert out.summaries[-5:] == [
        "on_error · first",
        "on_error · second",
        "on_finish · first",
        "on_finish · second",
        "bookkeeping · persist record · terminal · revision " + str(out.record.record_revision),
    ]
    stored = await out.stored()
    assert stored.status is (RequestStatus.CANCELLED if case == "cancelled" else RequestStatus.FAILED)
    assert stored.error.type == error_type and stored.diagnostics == []


@pytest.mark.parametrize("case", ["completed", "stopped", "planner", "cancelled"])
async def test_on_finish_runs_exactly_once_per_extension_for_every_outcome(client, tmp_path, leftovers, case):
    """Also for an extension whose earlier stages were never reached (``tracker`` implements after_answer)."""
    tracker, audit = Watcher("tracker"), Finisher("audit")
    out, _ = await drive(case, client, tmp_path, [tracker, audit], leftovers)

    status = {"completed": "completed", "stopped": "stopped", "planner": "error", "cancelled": "cancelled"}[case]
    [tracked] = tracker.seen("on_finish", out.workflow_id)
    [audited] = audit.seen(out.workflow_id)
    assert tracked.status == audited.status == status
    assert tracked == audited
    assert [i.hook for i in out.record.invocations(Stage.ON_FINISH)] == ["tracker", "audit"]
    assert [a.summary for a in out.scheduled if a.activity_type == "on_finish_hook"] == [
        "on_finish · tracker",
        "on_finish · audit",
    ]
    assert out.activity_types()[-3:] == ["on_finish_hook", "on_finish_hook", "persist_execution_record"]
    answered = tracker.seen("after_answer", out.workflow_id)
    if case == "completed":
        assert out.failure is None and tracked.response == out.result.response == ACME and tracked.error is None
        assert answered == [ACME]
    elif case == "stopped":
        assert out.failure is None and tracked.response == "Cloud processing is disabled."
        assert tracked.stopped == StopInfo(extension="stopper", phase="before_run", reason="cloud-disabled")
        assert answered == []
    elif case == "planner":
        assert out.failure.type == "PlanningFailed" and tracked.error.origin == "model"
        assert answered == []
    else:
        assert isinstance(out.failure, CancelledError) and tracked.error.origin == "cancelled"
        assert answered == []
    expected_status = {
        "completed": RequestStatus.SUCCEEDED,
        "stopped": RequestStatus.STOPPED,
        "planner": RequestStatus.FAILED,
        "cancelled": RequestStatus.CANCELLED,
    }[case]
    assert (await out.stored()).status is expected_status


async def test_cancelling_while_a_tool_runs_still_runs_the_finalizers(client, tmp_path, leftovers):
    class BrokenOnError:
        name = "broken"
        max_attempts = 1

        async def on_error(self, ctx, error):
            raise RuntimeError("alerting is down")

    tool = BlockingTool()
    first, finisher = Watcher("watcher"), Finisher("finisher")
    async with Harness(
        client, tmp_path, hooks=[BrokenOnError(), first, finisher], tools=[tool], planner=FixedPlanner(BLOCKING_STEP)
    ) as h:
        handle = await h.start(ACME_ASK)
        leftovers.append(handle)
        await asyncio.wait_for(tool.started.wait(), timeout=30)
        await handle.cancel()
        out = await h.finish(handle)

    # The client sees the cancellation, not the observer's failure.
    assert isinstance(out.failure, CancelledError)
    [error] = first.seen("on_error", out.workflow_id)
    assert (error.origin, error.type) == ("cancelled", "Cancelled")
    [finished] = finisher.seen(out.workflow_id)
    assert finished.status == "cancelled" and finished.error == error
    assert finished.diagnostics == [
        Diagnostic(extension="broken", phase="on_error", error="alerting is down", error_type="HookError")
    ]
    [watched] = first.seen("on_finish", out.workflow_id)
    assert watched.status == "cancelled"
    types = out.activity_types()
    assert types.index("execute_tool_step") < types.index("on_error_hook") < types.index("on_finish_hook")
    assert "synthesize" not in types and "after_answer_hook" not in types
    assert types[-1] == "persist_execution_record"
    stored = await out.stored()
    assert stored.status is RequestStatus.CANCELLED and stored.request_completion == "cancelled"
    assert stored.error.type == "Cancelled"
    assert stored.diagnostics == finished.diagnostics
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED


# --------------------------------------------------------------------------------------------------
# Observer failures never replace the outcome and never stop later observers
# --------------------------------------------------------------------------------------------------


class BrokenFinish:
    name = "broken-finish"
    max_attempts = 1

    async def on_finish(self, ctx, outcome):
        raise RuntimeError("flush failed")


class ChattyFinish:
    name = "chatty-finish"

    async def on_finish(self, ctx, outcome):
        return "done"  # observers must return None


async def test_an_on_finish_failure_on_a_successful_run_is_a_diagnostic(client, tmp_path):
    last = Finisher("last")
    async with Harness(client, tmp_path, hooks=[BrokenFinish(), ChattyFinish(), last]) as h:
        out = await h.run(ACME_ASK)

    assert out.failure is None and out.result.response == ACME
    expected = [
        Diagnostic(extension="broken-finish", phase="on_finish", error="flush failed", error_type="HookError"),
        Diagnostic(
            extension="chatty-finish",
            phase="on_finish",
            error="on_finish observes only and must return None, got str",
            error_type="InvalidHookResult",
        ),
    ]
    assert out.result.diagnostics == expected
    # The later observer still ran and saw the earlier failures.
    [seen] = last.seen(out.workflow_id)
    assert seen.status == "completed" and seen.diagnostics == expected
    record = out.record
    assert record.status is RequestStatus.SUCCEEDED and record.error is None
    assert record.diagnostics == expected
    assert [(i.hook, i.outcome.value, decision(i)[:2]) for i in record.invocations(Stage.ON_FINISH)] == [
        ("broken-finish", "failed", ("fail_open", "continue")),
        ("chatty-finish", "failed", ("fail_open", "continue")),
        ("last", "succeeded", ("fail_open", "continue")),
    ]
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED and stored.diagnostics == expected


async def test_a_stopped_run_keeps_observer_failures_in_its_diagnostics(client, tmp_path):
    last = Finisher("last")
    async with Harness(client, tmp_path, hooks=[StopAtStart(), BrokenFinish(), last]) as h:
        out = await h.run(ACME_ASK)

    expected = [Diagnostic(extension="broken-finish", phase="on_finish", error="flush failed", error_type="HookError")]
    assert out.failure is None and out.result.stopped is not None
    assert out.result.response == "Cloud processing is disabled."
    assert out.result.diagnostics == expected
    [seen] = last.seen(out.workflow_id)
    assert seen.status == "stopped" and seen.diagnostics == expected
    assert out.record.status is RequestStatus.STOPPED and out.record.diagnostics == expected


async def test_observer_failures_during_a_failed_run_never_replace_the_original_error(client, tmp_path):
    class BrokenError:
        name = "broken-error"
        max_attempts = 1

        async def on_error(self, ctx, error):
            raise HookRejection("pager refused")

    later = Watcher("later")
    async with Harness(client, tmp_path, hooks=[BrokenError(), BrokenFinish(), later], planner=FailingPlanner()) as h:
        out = await h.run(ACME_ASK)

    failure = out.failure
    assert isinstance(failure, ApplicationError) and failure.type == "PlanningFailed"
    assert out.failure_details()["cause"] == "planner offline"
    expected = [
        Diagnostic(extension="broken-error", phase="on_error", error="pager refused", error_type="HookError"),
        Diagnostic(extension="broken-finish", phase="on_finish", error="flush failed", error_type="HookError"),
    ]
    # Later observers of both stages still ran.
    [error] = later.seen("on_error", out.workflow_id)
    assert error.origin == "model" and error.type == "PlanningFailed"
    [finished] = later.seen("on_finish", out.workflow_id)
    assert finished.status == "error" and finished.diagnostics == expected
    record = out.record
    assert record.status is RequestStatus.FAILED and record.error.type == "PlanningFailed"
    assert record.diagnostics == expected
    stored = await out.stored()
    assert stored.error.type == "PlanningFailed" and stored.diagnostics == expected


# --------------------------------------------------------------------------------------------------
# Private state per extension and per run
# --------------------------------------------------------------------------------------------------


SECRET = "s3cr3t-state-token"


class Counter:
    """Counts its own invocations in ``ctx.state`` across stages, and keeps a secret there."""

    name = "counter"

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def _count(self, stage: str, ctx) -> None:
        self.seen.append((stage, json.loads(json.dumps(ctx.state))))
        ctx.state["n"] = ctx.state.get("n", 0) + 1

    async def before_run(self, ctx, run):
        self._count("before_run", ctx)
        ctx.state["secret"] = SECRET

    async def before_planning(self, ctx):
        self._count("before_planning", ctx)

    async def after_synthesis(self, ctx, response: str) -> str:
        self._count("after_synthesis", ctx)
        return response

    async def after_answer(self, ctx, answer):
        self._count("after_answer", ctx)

    async def on_finish(self, ctx, outcome):
        self.seen.append(("on_finish", json.loads(json.dumps(ctx.state))))


class Peer:
    """Another extension at the same stages: it keeps its own key and records what its ctx.state holds."""

    name = "peer"

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def _look(self, stage: str, ctx) -> None:
        self.seen.append((stage, json.loads(json.dumps(ctx.state))))
        ctx.state["peer"] = ctx.state.get("peer", 0) + 10

    async def before_run(self, ctx, run):
        self._look("before_run", ctx)

    async def before_planning(self, ctx):
        self._look("before_planning", ctx)

    async def after_synthesis(self, ctx, response: str) -> str:
        self._look("after_synthesis", ctx)
        return response

    async def after_answer(self, ctx, answer):
        self._look("after_answer", ctx)

    async def on_finish(self, ctx, outcome):
        self.seen.append(("on_finish", json.loads(json.dumps(ctx.state))))


async def test_private_state_grows_across_a_hooks_stages_and_no_other_hook_or_prompt_sees_it(client, tmp_path):
    counter, peer = Counter(), Peer()
    planner, synthesizer = RecordingPlanner(), RecordingSynthesizer()
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(
        client, tmp_path, hooks=[counter, peer], planner=planner, synthesizer=synthesizer, memory=memory
    ) as h:
        out = await h.run(ACME_ASK, {"conversation_id": "conv-state"})

    assert out.failure is None and out.result.response == ACME
    assert counter.seen == [
        ("before_run", {}),
        ("before_planning", {"n": 1, "secret": SECRET}),
        ("after_synthesis", {"n": 2, "secret": SECRET}),
        ("after_answer", {"n": 3, "secret": SECRET}),
        ("on_finish", {"n": 4, "secret": SECRET}),
    ]
    assert peer.seen == [
        ("before_run", {}),
        ("before_planning", {"peer": 10}),
        ("after_synthesis", {"peer": 20}),
        ("after_answer", {"peer": 30}),
        ("on_finish", {"peer": 40}),
    ]
    # Never shown to prompts, the planner, the synthesizer, memory, the result or the record.
    [planned] = planner.requests
    assert (
        SECRET not in planned.prompt
        and SECRET not in json.dumps(dict(planned.facts))
        and SECRET not in planned.instructions
    )
    assert SECRET not in synthesizer.inputs[0].model_dump_json()
    assert SECRET not in out.result.model_dump_json()
    assert SECRET not in out.record.model_dump_json()
    assert SECRET not in (await out.stored()).model_dump_json()
    assert [SECRET in m.model_dump_json() for m in await memory.recent("conv-state")] == [False]


async def test_concurrent_runs_of_one_pipeline_each_get_their_own_state(client, tmp_path):
    class Tally:
        """One shared object across both runs: any count kept on it instead of in ctx.state would mix."""

        name = "tally"

        def __init__(self) -> None:
            self.arrived = 0
            self.both_started: asyncio.Event | None = None
            self.finished: dict[str, dict] = {}

        async def before_run(self, ctx, run):
            if self.both_started is None:
                self.both_started = asyncio.Event()
            ctx.state["run"] = ctx.request_id
            ctx.state["n"] = ctx.state.get("n", 0) + 1
            self.arrived += 1
            if self.arrived >= 2:
                self.both_started.set()
            await asyncio.wait_for(self.both_started.wait(), timeout=8)  # both runs are in flight now

        async def after_answer(self, ctx, answer):
            ctx.state["n"] = ctx.state.get("n", 0) + 1
            ctx.state["answers"] = [*ctx.state.get("answers", []), answer.text]

        async def on_finish(self, ctx, outcome):
            self.finished[ctx.request_id] = dict(ctx.state)

    tally = Tally()
    async with Harness(client, tmp_path, hooks=[tally]) as h:
        handles = [await h.start(ACME_ASK, request_id="run-acme"), await h.start(MSFT_ASK, request_id="run-msft")]
        acme, msft = await asyncio.gather(*(h.finish(handle) for handle in handles))

    assert acme.failure is None and msft.failure is None
    assert (acme.result.response, msft.result.response) == (ACME, MSFT)
    assert tally.arrived == 2
    assert tally.finished == {
        "run-acme": {"run": "run-acme", "n": 2, "answers": [ACME]},
        "run-msft": {"run": "run-msft", "n": 2, "answers": [MSFT]},
    }


class _NotJson:
    name = "stateful"

    async def before_run(self, ctx, run):
        ctx.state["when"] = {1, 2}  # a set is not JSON


class _TooLarge:
    name = "stateful"

    async def before_run(self, ctx, run):
        ctx.state["blob"] = "x" * 70_000


class _NotADict:
    name = "stateful"

    async def before_run(self, ctx, run):
        ctx.state = ["not", "a", "map"]


class _NaN:
    name = "stateful"

    async def before_run(self, ctx, run):
        ctx.state["ratio"] = float("nan")


@pytest.mark.parametrize(
    ("hook", "cause_fragment"),
    [
        (_NotJson, "private state of 'stateful' is not JSON"),
        (_NaN, "private state of 'stateful' is not JSON"),
        (_TooLarge, "the limit is 65536"),
        (_NotADict, "ctx.state must stay a dict, got list"),
    ],
    ids=["set", "nan", "too-large", "not-a-dict"],
)
async def test_invalid_private_state_at_a_decision_stage_is_an_extension_error(client, tmp_path, hook, cause_fragment):
    finisher = Finisher("finisher")
    planner = RecordingPlanner()
    async with Harness(client, tmp_path, hooks=[hook(), finisher], planner=planner) as h:
        out = await h.run(ACME_ASK)

    details = extension_failure(out, "stateful", "before_run")
    assert cause_fragment in details["cause"] and details["cause_type"] == "InvalidHookResult"
    assert started_attempts(out, "before_run_hook") == [1]
    assert planner.requests == []
    [seen] = finisher.seen(out.workflow_id)
    assert seen.status == "error"


async def test_invalid_private_state_at_a_pipeline_stage_fails_open_and_is_not_kept(client, tmp_path):
    class Hoarder:
        name = "hoarder"
        failure_policy = FailurePolicy.FAIL_OPEN  # an optional rewrite at after_synthesis, which fails closed
        finished_with: list[dict] = []

        async def before_run(self, ctx, run):
            ctx.state["n"] = 1

        async def before_planning(self, ctx):
            ctx.enrichments["rag_context"] = "should not survive"
            ctx.state["when"] = datetime.now(UTC)  # not JSON

        async def after_synthesis(self, ctx, response: str) -> str:
            ctx.state["blob"] = "x" * 70_000  # too large
            return response + " (rewritten)"

        async def on_finish(self, ctx, outcome):
            Hoarder.finished_with.append(dict(ctx.state))

    planner = RecordingPlanner()
    async with Harness(client, tmp_path, hooks=[Hoarder()], planner=planner) as h:
        out = await h.run(ACME_ASK)

    # The run goes on without the failed invocations' changes.
    assert out.failure is None and out.result.response == ACME
    assert "should not survive" not in planner.requests[0].prompt and out.record.enrichments == {}
    invocations = {i.stage: i for i in out.record.invocations(hook="hoarder")}
    for stage in (Stage.BEFORE_PLANNING, Stage.AFTER_SYNTHESIS):
        assert invocations[stage].outcome.value == "failed"
        assert invocations[stage].error_type == "InvalidHookResult"
        assert decision(invocations[stage])[:2] == ("fail_open", "continue")
    assert "is not JSON" in invocations[Stage.BEFORE_PLANNING].error
    assert "the limit is 65536" in invocations[Stage.AFTER_SYNTHESIS].error
    assert started_attempts(out, "after_synthesis_hook") == [1]
    # Only the state of the invocations that succeeded was carried.
    assert Hoarder.finished_with == [{"n": 1}]


# --------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------


class _Named:
    def __init__(self, name: Any, *stages: str) -> None:
        self.name = name
        for stage in stages:
            setattr(self, stage, _STAGE_FUNCS[stage])


def _two(ctx, x):
    return None


def _one(ctx):
    return None


_STAGE_FUNCS = {
    "after_synthesis": lambda ctx, response: response,
    "before_planning": _one,
    "before_run": _two,
    "after_answer": _two,
    "before_remember": _two,
    "on_error": _two,
    "on_finish": _two,
}


class _Unnamed(PipelineHook):
    async def on_finish(self, ctx, outcome):
        return None


@pytest.mark.parametrize(
    ("hooks", "reason", "index"),
    [
        ([_Named("audit", "after_synthesis"), _Named("audit", "on_finish")], "duplicate_name", 1),
        ([_Named("guard", "before_run"), _Named("guard", "after_answer", "on_finish")], "duplicate_name", 1),
        ([_Named("memo", "before_planning"), Plugin("memo", before_tool=lambda ctx, call: None)], "duplicate_name", 1),
        (
            [Plugin("redact", after_tool=lambda ctx, call, outcome: None), _Named("redact", "before_remember")],
            "duplicate_name",
            1,
        ),
        ([_Named("ok", "on_finish"), _Named("", "before_run")], "empty_name", 1),
        ([_Named("   ", "on_error")], "empty_name", 0),
        ([_Named(None, "after_answer")], "empty_name", 0),
        ([_Unnamed()], "empty_name", 0),
    ],
    ids=[
        "pipeline-hook-and-extension",
        "two-extensions",
        "hook-and-plugin",
        "plugin-and-extension",
        "empty",
        "blank",
        "missing",
        "base-class-default",
    ],
)
def test_the_registry_refuses_empty_and_duplicate_names_across_hooks_and_extensions(hooks, reason, index):
    with pytest.raises(InvalidPipelineConfigError) as raised:
        HookRegistry(hooks)
    assert raised.value.reason == reason
    assert raised.value.index == index


def test_distinct_names_register_hooks_and_extensions_in_one_registry():
    registry = HookRegistry(
        [
            _Named("enrich", "before_planning"),
            _Named("context", "before_run", "on_finish"),
            Plugin("allow", before_tool=lambda ctx, call: None),
            _Named("answers", "after_answer", "before_remember", "on_error"),
        ]
    )
    assert [(e.name, [s.value for s in e.stages]) for e in registry.entries] == [
        ("enrich", ["before_planning"]),
        ("context", ["before_run", "on_finish"]),
        ("allow", ["before_tool"]),
        ("answers", ["after_answer", "before_remember", "on_error"]),
    ]


# --------------------------------------------------------------------------------------------------
# Cancellation at other points: in a hook, in a local-activity hook, at a checkpoint
# --------------------------------------------------------------------------------------------------


async def settled_at_checkpoint(h: Harness, handle: WorkflowHandle) -> None:
    """Wait until the opened checkpoint is persisted and no activity is in flight: the request is waiting
    for its reviewer and nothing else."""
    async with asyncio.timeout(30):
        while True:
            stored = await h.store.get(handle.id)
            pending = (await handle.describe()).raw_description.pending_activities
            if stored is not None and stored.lifecycle.boundary.value == "checkpoint_opened" and not pending:
                return
            await asyncio.sleep(0.05)


class BlockingStart:
    """A before_run hook that blocks until its activity is cancelled."""

    name = "blocking-start"
    timeout_seconds = 120.0

    def __init__(self, run_mode: str) -> None:
        self.run_mode = run_mode
        self.started = asyncio.Event()

    async def before_run(self, ctx, run):
        self.started.set()
        await asyncio.Event().wait()


@pytest.mark.parametrize("where", ["hook-activity", "hook-local-activity", "checkpoint"])
async def test_cancelling_anywhere_still_notifies_on_error_and_on_finish_once(client, tmp_path, leftovers, where):
    watcher, finisher = Watcher("watcher"), Finisher("finisher")
    hooks: list[Any] = [watcher, finisher]
    options: dict[str, Any] = {}
    blocker = None
    if where == "checkpoint":
        options["planner"] = FixedPlanner(message_step())
    else:
        blocker = BlockingStart("activity" if where == "hook-activity" else "local_activity")
        hooks.insert(0, blocker)
    async with Harness(client, tmp_path, hooks=hooks, **options) as h:
        handle = await h.start(ACME_ASK)
        leftovers.append(handle)
        if blocker is not None:
            await asyncio.wait_for(blocker.started.wait(), timeout=30)
        else:
            await h.wait_for_checkpoint(handle)
            await settled_at_checkpoint(h, handle)
        await handle.cancel()
        out = await h.finish(handle)

    assert isinstance(out.failure, CancelledError)
    [error] = watcher.seen("on_error", out.workflow_id)
    assert (error.origin, error.type) == ("cancelled", "Cancelled")
    assert [o.status for o in finisher.seen(out.workflow_id)] == ["cancelled"]
    assert [o.status for o in watcher.seen("on_finish", out.workflow_id)] == ["cancelled"]
    assert watcher.seen("after_answer", out.workflow_id) == []
    assert "plan" not in out.activity_types() or where == "checkpoint"
    assert "execute_tool_step" not in out.activity_types()
    stored = await out.stored()
    assert stored.status is RequestStatus.CANCELLED and stored.error.type == "Cancelled"
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED


class HoldingStore(SQLiteExecutionStore):
    """Holds the first accepted-plan snapshot write open, so a test can cancel the request while the
    workflow waits on it. Every other write goes through."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.holding = asyncio.Event()

    async def save(self, record):
        if (
            record.lifecycle is not None
            and record.lifecycle.boundary.value == "accepted_plan"
            and not self.holding.is_set()
        ):
            self.holding.set()
            await asyncio.Event().wait()
        return await super().save(record)


async def test_cancelling_while_a_record_snapshot_is_persisted_cancels_the_request(client, tmp_path, leftovers):
    """A cancel that arrives while the workflow waits on its accepted-plan snapshot must end the request as
    cancelled (and notify on_error and on_finish), not be swallowed as a failed persist."""
    watcher, finisher = Watcher("watcher"), Finisher("finisher")
    h = Harness(client, tmp_path, hooks=[watcher, finisher])
    store = HoldingStore(tmp_path / "executions.sqlite3")
    h.activities.store = store
    async with h:
        handle = await h.start(ACME_ASK)
        leftovers.append(handle)
        await asyncio.wait_for(store.holding.wait(), timeout=30)
        await handle.cancel()
        out = await h.finish(handle)

    assert isinstance(out.failure, CancelledError), f"the cancel was lost: the request ended with {out.result!r}"
    assert "execute_tool_step" not in out.activity_types()
    assert [o.status for o in finisher.seen(out.workflow_id)] == ["cancelled"]
    [error] = watcher.seen("on_error", out.workflow_id)
    assert error.origin == "cancelled"
    stored = await out.stored()
    assert stored.status is RequestStatus.CANCELLED


class BlockingObserver:
    """An observer that blocks in ``stage`` until its activity is cancelled."""

    timeout_seconds = 120.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = asyncio.Event()

    async def _block(self, ctx, subject):
        self.started.set()
        await asyncio.Event().wait()


class BlockingOnFinish(BlockingObserver):
    async def on_finish(self, ctx, outcome):
        await self._block(ctx, outcome)


class BlockingOnError(BlockingObserver):
    async def on_error(self, ctx, error):
        await self._block(ctx, error)


async def test_a_cancel_during_an_on_finish_never_stops_later_finalizers_or_the_terminal_record(
    client, tmp_path, leftovers
):
    """The run completed; a cancel arrives while the first on_finish runs. The later on_finish still runs
    (once) and the terminal record is still persisted: cleanup hooks run after cancellation, and an
    observer never prevents later observers."""
    blocking, last = BlockingOnFinish("slow-finish"), Finisher("last")
    async with Harness(client, tmp_path, hooks=[blocking, last]) as h:
        handle = await h.start(ACME_ASK)
        leftovers.append(handle)
        await asyncio.wait_for(blocking.started.wait(), timeout=30)
        await handle.cancel()
        out = await h.finish(handle)

    assert [o.status for o in last.seen(out.workflow_id)] == ["completed"], "the later on_finish never ran"
    assert out.activity_types()[-1] == "persist_execution_record", "no terminal record was persisted"
    stored = await out.stored()
    assert stored.request_completion in ("completed", "cancelled"), f"stored record left {stored.status}"
    assert stored.final_response == ACME


async def test_a_cancel_during_on_error_still_runs_on_finish_and_persists_the_record(client, tmp_path, leftovers):
    """The run failed (ExtensionError); a cancel arrives while on_error runs. on_finish still runs once and
    the terminal record is persisted."""
    blocking, last = BlockingOnError("slow-error"), Finisher("last")
    async with Harness(client, tmp_path, hooks=[RefuseAtStart(), blocking, last]) as h:
        handle = await h.start(ACME_ASK)
        leftovers.append(handle)
        await asyncio.wait_for(blocking.started.wait(), timeout=30)
        await handle.cancel()
        out = await h.finish(handle)

    assert out.failure is not None
    assert [o.status for o in last.seen(out.workflow_id)] in (["error"], ["cancelled"]), "on_finish never ran"
    assert out.activity_types()[-1] == "persist_execution_record", "no terminal record was persisted"
    stored = await out.stored()
    assert stored is not None and stored.request_completion in ("failed", "cancelled")
    assert stored.error is not None
