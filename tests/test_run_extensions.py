"""The run-extension stages and outcomes against a real Temporal server, as an application sees them:
after_recall's transient memory, before_plan's tool filtering and context per planning attempt (and a
malformed model plan retried as an attempt of its own), after_planning's stop, the honest after_tool
outcomes (cached reads, duplicate writes, a reviewer's decline of one call), and where every error that
on_error observes comes from."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from activities.memory import ConversationMemoryStore
from activities.models import ModelSettings, OpenAIPlanner, OpenAISynthesizer, function_name
from activities.tools import Tool, ToolContext, ToolRegistry
from agent_lifecycle.testing import model as ai
from client.pipeline import NoPlanner
from demo.agent import RulePlanner
from demo.tools import QuoteArguments, demo_tools, quote_price
from hooks import PlanAttempt, PlanAttemptPatch, RecallPatch, RecallView, Stage, Stop, ToolDecision
from hooks.declarative import DeclaredHookRuntime, HookStore, declared_hooks, parse_hooks
from workflows.models import (
    AnswerView,
    FallbackRequest,
    MemoryCandidate,
    Plan,
    PlanStep,
    RecalledMemory,
    RecallOutcome,
    RequestStatus,
    ReviewRequest,
    RunErrorView,
    RunOutcomeView,
    StepStatus,
    StopInfo,
    ToolCall,
    ToolOutcomeView,
)

from .doubles import NS, FixedPlanner, quote
from .harness import Harness, Outcome

ROOT = Path(__file__).resolve().parent.parent
QUOTE = function_name("demo-tools/stock-service/stock_quote")
QUOTE_KEY = f"{NS}/stock-service/stock_quote"
TRADE_KEY = f"{NS}/stock-service/execute_trade"
MESSAGE_KEY = f"{NS}/notify-service/send_message"


def trade(step_id: str, symbol: str = "ACME", quantity: int = 1) -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="stock-service",
        capability="execute_trade",
        arguments={"symbol": symbol, "side": "buy", "quantity": quantity},
    )


def message(step_id: str, to: str) -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="notify-service",
        capability="send_message",
        arguments={"to": to, "text": "hello"},
    )


class PhasedPlanner:
    """Plans the given phases in order (each but the last asks for another), keeping what it was asked."""

    name = "phased-planner"

    def __init__(self, *phases: list[PlanStep]) -> None:
        self.phases = phases
        self.requests: list[Any] = []

    async def plan(self, request) -> Plan:
        self.requests.append(request)
        steps = self.phases[request.phase - 1]
        return Plan(
            phase=request.phase,
            steps=[s.model_copy(deep=True) for s in steps],
            continue_after=request.phase < len(self.phases),
        )


class Observer:
    """Keeps what on_error and on_finish observed."""

    name = "observer"

    def __init__(self) -> None:
        self.errors: list[RunErrorView] = []
        self.finished: list[RunOutcomeView] = []

    async def on_error(self, ctx, error: RunErrorView) -> None:
        self.errors.append(error)

    async def on_finish(self, ctx, outcome: RunOutcomeView) -> None:
        self.finished.append(outcome)


async def cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``agent-lifecycle`` as a reviewer runs it: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", *args, cwd=ROOT, env=env, stdout=-1, stderr=-1
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, stdout.decode(), stderr.decode()


def executed_steps(out: Outcome) -> list[str]:
    """The step of each tool activity the request scheduled, in order (its summary names it)."""
    return [a.summary.rsplit("(", 1)[1].rstrip(")") for a in out.tool_activities if a.summary]


# --------------------------------------------------------------------------------------------------
# after_recall
# --------------------------------------------------------------------------------------------------


class ForgetAcme:
    """after_recall: plan without the exchanges that mention ACME."""

    name = "forget-acme"

    def __init__(self) -> None:
        self.seen: list[RecallView] = []

    def after_recall(self, ctx, recall: RecallView) -> RecallPatch | None:
        self.seen.append(recall)
        kept = [e for e in recall.memory.exchanges if "ACME" not in e.request]
        return RecallPatch(memory=recall.memory.model_copy(update={"exchanges": kept}))


async def test_after_recall_plans_with_a_transient_view_and_the_run_saves_from_the_memory_as_loaded(client, tmp_path):
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    planner = PhasedPlanner([quote("quote-init", "INIT")])
    forget = ForgetAcme()
    async with Harness(client, tmp_path, hooks=[forget], memory=memory, planner=planner) as h:
        await memory.save(
            MemoryCandidate(conversation_id="conv-r", request="What is the price of ACME?", answer="ACME is 1."),
            request_id="earlier-1",
        )
        await memory.save(
            MemoryCandidate(conversation_id="conv-r", request="And of BOLT?", answer="BOLT is 2."),
            request_id="earlier-2",
        )
        out = await h.run("What is the price of INIT?", {"conversation_id": "conv-r"})

    assert out.failure is None, out.failure
    # The hook saw the memory as loaded, oldest first; the planner saw its view of it.
    [seen] = forget.seen
    assert [e.request for e in seen.memory.exchanges] == ["What is the price of ACME?", "And of BOLT?"]
    history = planner.requests[0].enrichments["conversation_history"]
    assert "BOLT is 2." in history and "ACME" not in history
    assert out.record is not None
    assert out.record.recall == RecallOutcome(conversation_id="conv-r", exchanges=2, changed_by=["forget-acme"])
    assert "recall · conv-r" in out.summaries and "after_recall · forget-acme" in out.summaries
    # What the run saved starts from the memory as loaded: the forgotten exchange is still there.
    assert [c.request for c in await memory.recent("conv-r")] == [
        "What is the price of ACME?",
        "And of BOLT?",
        "What is the price of INIT?",
    ]


class BrokenMemory(ConversationMemoryStore):
    async def recall(self, conversation_id: str) -> RecalledMemory:
        raise RuntimeError("memory database unreachable")


async def test_a_memory_that_cannot_be_loaded_is_a_memory_error_the_run_recovers_from(client, tmp_path):
    observer = Observer()
    memory = BrokenMemory(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[ForgetAcme(), observer], memory=memory) as h:
        out = await h.run("What is the price of ACME?", {"conversation_id": "conv-b"})

    assert out.failure is None and out.result is not None
    assert out.record is not None and out.record.recall is not None
    assert "memory database unreachable" in (out.record.recall.error or "")
    assert not out.record.invocations(hook="forget-acme")  # after_recall had nothing to see
    [error] = observer.errors
    assert (error.origin, error.type, error.recovered) == ("memory", "MemoryError", True)
    assert observer.finished[0].status == "completed"


# --------------------------------------------------------------------------------------------------
# before_plan
# --------------------------------------------------------------------------------------------------


class Narrow:
    """before_plan: keep only ``tools``; optionally set the attempt's context text."""

    def __init__(self, name: str, tools: list[str] | None, context: str | None = None) -> None:
        self.name, self.tools, self.context = name, tools, context
        self.attempts: list[PlanAttempt] = []

        self.governed: list[tuple[int, int | None, list[str], list[str]]] = []

    def before_plan(self, ctx, attempt: PlanAttempt) -> PlanAttemptPatch:
        self.attempts.append(attempt)
        return PlanAttemptPatch(tools=self.tools, context_text=self.context)

    def after_planning(self, ctx, plan: Plan) -> None:
        """What after_planning is told besides the plan: the attempt, its tools, the steps so far."""
        self.governed.append((plan.phase, ctx.attempt, [t.key for t in ctx.tools], [s.step_id for s in ctx.steps]))


class RecordingRulePlanner(RulePlanner):
    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def plan(self, request) -> Plan:
        self.requests.append(request)
        return await super().plan(request)


async def test_before_plan_narrows_the_tools_by_intersection_and_adds_context_for_the_attempt(client, tmp_path):
    first = Narrow("reads-and-messages", [QUOTE_KEY, "notify-service/send_message"])
    second = Narrow("everything-please", [QUOTE_KEY, TRADE_KEY, MESSAGE_KEY], context="Prefer one quote per ticker.")
    planner = RecordingRulePlanner()
    async with Harness(client, tmp_path, hooks=[first, second], planner=planner) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None, out.failure
    # Each hook saw the attempt with the tools as descriptors (what they do, whether they write).
    [attempt] = first.attempts
    assert (attempt.phase, attempt.attempt, attempt.ask) == (1, 0, "What is the price of ACME?")
    described = {t.key: (t.description, t.writes) for t in attempt.tools}
    assert described[QUOTE_KEY] == ("Current price of a stock (read-only)", False)
    assert described[TRADE_KEY][1] is True
    # The later hook could not bring the trade back; the planner saw the tools left, and the context.
    assert second.attempts[0].tool_keys == [QUOTE_KEY, MESSAGE_KEY]
    [request] = planner.requests
    assert [t.key for t in request.tools] == [QUOTE_KEY, MESSAGE_KEY]
    assert request.context_text == "Prefer one quote per ticker."
    assert "<planning_context>\nPrefer one quote per ticker.\n</planning_context>" in request.prompt
    assert "execute_trade" not in request.prompt
    assert [s.tool for s in out.record.steps] == ["stock-service/stock_quote"]


async def test_a_plan_calling_a_tool_the_attempt_was_not_left_is_invalid(client, tmp_path):
    only_quotes = Narrow("only-quotes", [QUOTE_KEY])
    async with Harness(client, tmp_path, hooks=[only_quotes], planner=FixedPlanner(trade("trade-acme"))) as h:
        out = await h.run("Buy 1 ACME")

    assert isinstance(out.failure, ApplicationError) and out.failure.type == "PlanningFailed"
    assert "not available to this planning attempt" in out.failure.message
    assert out.tool_activities == []


class AddTrade:
    """after_planning: add a trade to whatever was planned (an ordinary hook: fails open)."""

    name = "add-trade"

    def after_planning(self, ctx, plan: Plan) -> Plan:
        return plan.model_copy(update={"steps": [*plan.steps, trade("trade-added")]})


async def test_an_after_planning_rewrite_is_checked_against_the_tools_the_attempt_had(client, tmp_path):
    async with Harness(
        client, tmp_path, hooks=[Narrow("only-quotes", [QUOTE_KEY]), AddTrade()], planner=RecordingRulePlanner()
    ) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None, out.failure
    [rejected] = out.record.invocations(hook="add-trade")
    assert rejected.error_type == "InvalidPlan" and "not available to this planning attempt" in (rejected.error or "")
    assert executed_steps(out) == ["quote-acme"]  # the last valid plan ran; no trade


class SeePlan:
    name = "see-plan"

    def __init__(self) -> None:
        self.plans: list[Plan] = []

    def after_planning(self, ctx, plan: Plan) -> Plan:
        self.plans.append(plan)
        return plan


async def test_when_no_tool_is_left_the_phase_is_answered_without_a_planner_call(client, tmp_path):
    planner, seen = FixedPlanner(quote("quote-acme", "ACME")), SeePlan()
    async with Harness(client, tmp_path, hooks=[Narrow("nothing", []), seen], planner=planner) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None and out.result is not None
    assert planner.calls == 0 and "plan" not in out.activity_types()
    # The planning hooks surround the synthetic answer plan: after_planning saw it, and nothing ran.
    [plan] = seen.plans
    assert plan.steps == [] and plan.rationale == "no tool is available to this planning attempt"
    assert out.tool_activities == [] and out.record.steps == []


async def test_a_malformed_model_plan_is_retried_as_an_attempt_of_its_own_after_before_plan(client, tmp_path, server):
    watch = Narrow("watch", None)
    model = ModelSettings(base_url=server.base_url, api_key=None, model="m", timeout_seconds=5)
    planner = OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path)))
    server.push(
        ai.tool_calls((QUOTE, {"symbol": "acme"}, "call_bad")),  # lower case: the tool's pattern refuses it
        ai.tool_calls((QUOTE, {"symbol": "ACME"}, "call_good")),
        ai.answer("That is all."),
    )
    async with Harness(client, tmp_path, hooks=[watch], planner=planner) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None, out.failure
    assert [(a.phase, a.attempt) for a in watch.attempts] == [(1, 0), (1, 1), (2, 0)]
    # after_planning is told which attempt produced the plan it governs.
    assert [(phase, attempt) for phase, attempt, _, _ in watch.governed] == [(1, 1), (2, 0)]
    plans = [a.summary for a in out.scheduled if a.activity_type == "plan"]
    assert plans == ["plan · phase 1", "plan · phase 1 · attempt 2", "plan · phase 2"]
    # The retry sent the model its own malformed turn and what was wrong with the call, by its id.
    retry = server.requests[1].messages
    assert retry[-2]["tool_calls"][0]["id"] == "call_bad"
    assert retry[-1]["tool_call_id"] == "call_bad" and "Not run" in retry[-1]["content"]
    assert [c.turn for c in out.record.model_calls] == [1, 2, 1]


async def test_a_model_plan_still_malformed_on_its_last_attempt_is_invalid(client, tmp_path, server):
    model = ModelSettings(base_url=server.base_url, api_key=None, model="m", timeout_seconds=5)
    planner = OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path)))
    server.push(ai.tool_calls((QUOTE, {"symbol": "acme"})), ai.tool_calls((QUOTE, {"symbol": "still bad"})))
    async with Harness(client, tmp_path, planner=planner) as h:
        out = await h.run("What is the price of ACME?")

    assert isinstance(out.failure, ApplicationError) and out.failure.type == "PlanningFailed"
    assert out.failure_details()["cause_type"] == "InvalidPlan" and "attempt 2" in out.failure.message
    assert len(server.requests) == 2 and [c.turn for c in out.record.model_calls] == [1, 2]


# --------------------------------------------------------------------------------------------------
# after_planning may stop the run
# --------------------------------------------------------------------------------------------------


class ClosedMarket:
    name = "closed-market"

    def after_planning(self, ctx, plan: Plan) -> Plan | Stop:
        return Stop(text="Markets are closed; nothing was traded.", reason="market-closed")


class Rewriter:
    name = "rewriter"

    def __init__(self) -> None:
        self.calls = 0

    def after_synthesis(self, ctx, response: str) -> str:
        self.calls += 1
        return response + " (checked)"


async def test_after_planning_may_stop_the_run_before_any_tool_and_only_finalizers_run(client, tmp_path):
    rewriter, observer = Rewriter(), Observer()
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, hooks=[ClosedMarket(), rewriter, observer], memory=memory) as h:
        out = await h.run("Buy 10 ACME", {"conversation_id": "conv-s"})

    assert out.failure is None and out.result is not None
    assert out.result.response == "Markets are closed; nothing was traded."
    assert out.result.stopped == StopInfo(extension="closed-market", phase="after_planning", reason="market-closed")
    assert out.tool_activities == [] and rewriter.calls == 0
    assert out.record.status is RequestStatus.STOPPED and out.record.memory is None
    assert await memory.recent("conv-s") == []
    assert [f.status for f in observer.finished] == ["stopped"] and observer.errors == []


# --------------------------------------------------------------------------------------------------
# The after_tool outcome union: cached reads, duplicate writes, declined calls
# --------------------------------------------------------------------------------------------------


class Outcomes:
    """before_tool and after_tool: what each step's call and outcome looked like."""

    name = "outcomes"

    def __init__(self, rewrite: dict[str, dict[str, Any]] | None = None) -> None:
        self.rewrite = rewrite or {}
        self.calls: list[str] = []
        self.outcomes: dict[str, ToolOutcomeView] = {}

    def before_tool(self, ctx, call: ToolCall) -> ToolDecision | None:
        self.calls.append(call.step_id)
        if call.step_id in self.rewrite:
            return ToolDecision.modify(self.rewrite[call.step_id])
        return None

    def after_tool(self, ctx, call: ToolCall, outcome: ToolOutcomeView) -> None:
        self.outcomes[call.step_id] = outcome


async def test_an_identical_read_passes_before_tool_and_is_answered_from_the_earlier_step(client, tmp_path):
    outcomes = Outcomes()
    planner = PhasedPlanner([quote("quote-acme", "ACME")], [quote("quote-again", "ACME"), quote("quote-init", "INIT")])
    async with Harness(client, tmp_path, hooks=[outcomes], planner=planner) as h:
        out = await h.run("What is the price of ACME, twice?")

    assert out.failure is None, out.failure
    assert "quote-again" in outcomes.calls  # a cached read still passes through before_tool
    assert executed_steps(out) == ["quote-acme", "quote-init"]
    cached = outcomes.outcomes["quote-again"]
    assert (cached.status, cached.from_step, cached.output) == ("cached", "quote-acme", None)
    assert cached.result == outcomes.outcomes["quote-acme"].result
    step = next(s for s in out.record.steps if s.step_id == "quote-again")
    assert (step.status, step.cached_from) == (StepStatus.SUCCEEDED, "quote-acme")
    assert step.output == {"symbol": "ACME", "price": quote_price("ACME"), "currency": "USD"}
    metrics = out.record.tool_metrics["stock-service/stock_quote"]
    assert (metrics.calls, metrics.cached) == (2, 1)


async def test_a_rewrite_of_a_cached_candidate_makes_it_a_call_of_its_own(client, tmp_path):
    outcomes = Outcomes(rewrite={"quote-again": {"symbol": "BOLT"}})
    planner = PhasedPlanner([quote("quote-acme", "ACME")], [quote("quote-again", "ACME")])
    async with Harness(client, tmp_path, hooks=[outcomes], planner=planner) as h:
        out = await h.run("Quotes")

    assert executed_steps(out) == ["quote-acme", "quote-again"]
    assert outcomes.outcomes["quote-again"].status == "executed"
    assert out.record.steps[-1].output["symbol"] == "BOLT"


class FlakyQuote(Tool):
    """A read-only quote that fails on its first call (after the activity's retries: never retried here)."""

    namespace, agent, capability = NS, "stock-service", "stock_quote"
    description = "Current price of a stock (read-only)"
    read_only = True
    Arguments = QuoteArguments

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, arguments: QuoteArguments, ctx: ToolContext) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise ApplicationError("quote service down", non_retryable=True)
        return {"symbol": arguments.symbol, "price": 1.0}


async def test_a_failed_step_is_never_reused_as_a_cached_read(client, tmp_path):
    tool, outcomes = FlakyQuote(), Outcomes()
    planner = PhasedPlanner([quote("quote-acme", "ACME")], [quote("quote-again", "ACME")])
    async with Harness(client, tmp_path, hooks=[outcomes], planner=planner, tools=[tool]) as h:
        out = await h.run("Quotes")

    assert [outcomes.outcomes[s].status for s in ("quote-acme", "quote-again")] == ["failed", "executed"]
    assert tool.calls == 2 and executed_steps(out) == ["quote-acme", "quote-again"]


async def test_an_identical_write_is_not_run_twice(client, tmp_path):
    outcomes = Outcomes()
    planner = PhasedPlanner([trade("trade-1")], [trade("trade-2"), trade("trade-3", quantity=2)])
    async with Harness(client, tmp_path, hooks=[outcomes], planner=planner) as h:
        out = await h.run("Buy 1 ACME")

    assert out.failure is None, out.failure
    assert executed_steps(out) == ["trade-1", "trade-3"]
    repeated = outcomes.outcomes["trade-2"]
    assert (repeated.status, repeated.reason) == ("skipped", "duplicate")
    step = next(s for s in out.record.steps if s.step_id == "trade-2")
    assert (step.status, step.skip_reason, step.skip_detail) == (
        StepStatus.SKIPPED,
        "duplicate",
        "same call as trade-1",
    )
    ledger = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(ledger) == 2


async def test_a_reviewer_may_decline_one_call_and_the_planner_sees_it_skipped(client, tmp_path, leftovers):
    outcomes = Outcomes()
    planner = PhasedPlanner([message("msg-alice", "alice"), message("msg-bob", "bob")], [])
    async with Harness(client, tmp_path, hooks=[outcomes], planner=planner) as h:
        handle = await h.start("Message alice and bob")
        leftovers.append(handle)
        checkpoint = await h.wait_for_checkpoint(handle)
        assert [c.step_id for c in checkpoint.calls] == ["msg-alice", "msg-bob"]
        # A decline must name a call of the checkpoint, and only an approval may decline.
        for bad in (
            ReviewRequest(checkpoint_id=checkpoint.checkpoint_id, reviewer="ops", decision="approve", declined=["x"]),
            ReviewRequest(
                checkpoint_id=checkpoint.checkpoint_id, reviewer="ops", decision="reject", declined=["msg-bob"]
            ),
        ):
            with pytest.raises(WorkflowUpdateFailedError):
                await handle.execute_update("review", bad)
        # The reviewer reads the calls in their inbox and approves one, declining the other, from the CLI.
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "AGENT_STATE_DIR": str(tmp_path / "cli-state"),
        }
        code, shown, err = await cli(env, "show", handle.id)
        assert code == 0, err
        assert "approve --decline <step id> skips that call" in shown
        code, acked, err = await cli(
            env, "approve", handle.id, "--reviewer", "ops", "--comment", "not bob", "--decline", "msg-bob"
        )
        assert code == 0, err
        assert json.loads(acked)["declined"] == ["msg-bob"]
        out = await h.finish(handle)

    assert out.failure is None, out.failure
    assert executed_steps(out) == ["msg-alice"]
    declined = outcomes.outcomes["msg-bob"]
    assert (declined.status, declined.reason) == ("skipped", "confirmation")
    assert declined.result == "notify-service/send_message was not run: ops declined it: not bob"
    assert out.record.checkpoints[0].declined == ["msg-bob"] and out.record.checkpoints[0].status == "approved"
    # The next phase's planner read the declined call as skipped for confirmation, and could plan around it.
    prior = {r.step_id: (r.status, r.skip_reason) for r in planner.requests[1].prior_results}
    assert prior == {"msg-alice": (StepStatus.SUCCEEDED, None), "msg-bob": (StepStatus.SKIPPED, "confirmation")}


# --------------------------------------------------------------------------------------------------
# on_error: where each error comes from
# --------------------------------------------------------------------------------------------------


class FailingSave(ConversationMemoryStore):
    async def save(self, candidate: MemoryCandidate, *, request_id: str) -> None:
        raise RuntimeError("memory disk full")


class Unformattable(Tool):
    """A read-only tool whose result formatter breaks: its output is kept, the model reads it completed."""

    namespace, agent, capability = NS, "stock-service", "stock_quote"
    description = "Current price of a stock (read-only)"
    read_only = True
    Arguments = QuoteArguments

    async def run(self, arguments: QuoteArguments, ctx: ToolContext) -> Any:
        return {"symbol": arguments.symbol, "price": 3.0}

    def format(self, output: Any) -> str:
        raise KeyError("currency")


class Huge:
    name = "huge"

    def after_tool(self, ctx, call: ToolCall, outcome: ToolOutcomeView) -> str:
        return "x" * (2 * 1024 * 1024)


ORIGIN_CASES = ["memory", "tool", "formatter", "config", "harness", "event"]


def failing_gateway_hook(tmp_path: Path) -> Any:
    """A declared pre_tool_use command hook whose handler crashes (exit 1): a blocking event fails closed."""
    runtime = DeclaredHookRuntime(store=HookStore(tmp_path / "hooks.sqlite3"), environ={"PATH": os.environ["PATH"]})
    entry = {"id": "broken-gate", "event": "pre_tool_use", "handler_type": "command", "config": {"command": "false"}}
    [hook] = declared_hooks(parse_hooks({"hooks": [entry]}), runtime)
    return hook


class UnplannedAtRequestTime:
    """A pipeline's planner that is missing only once a request runs (a worker refuses ``NoPlanner`` itself
    at start-up): it fails as ``NoPlanner`` does."""

    name = "unplanned"

    async def plan(self, request: Any) -> Any:
        return await NoPlanner().plan(request)


@pytest.mark.parametrize("case", ORIGIN_CASES)
async def test_on_error_observes_each_error_with_the_origin_where_it_arose(client, tmp_path, case):
    observer = Observer()
    options: dict[str, Any] = {}
    hooks: list[Any] = [observer]
    if case == "memory":
        options["memory"] = FailingSave(tmp_path / "memory.sqlite3")
    elif case == "tool":
        options["tools"] = [FlakyQuote()]
    elif case == "formatter":
        options["tools"] = [Unformattable()]
    elif case == "config":
        options["planner"] = UnplannedAtRequestTime()
    elif case == "harness":
        hooks.insert(0, Huge())
    elif case == "event":
        hooks.insert(0, failing_gateway_hook(tmp_path))
    async with Harness(client, tmp_path, hooks=hooks, **options) as h:
        out = await h.run("What is the price of ACME?")

    expected = {
        "memory": ("memory", "MemoryError", True),
        "tool": ("tool", "ApplicationError", True),
        "formatter": ("formatter", "FormatterError", True),
        "config": ("config", "PlanningFailed", False),
        "harness": ("harness", "PayloadTooLarge", False),
        "event": ("event", "EventHookFailed", True),
    }[case]
    [error] = observer.errors
    assert (error.origin, error.type, error.recovered) == expected
    [finished] = observer.finished
    if error.recovered:  # the run went on and completed; the error is observed, not its outcome
        assert out.failure is None and finished.status == "completed" and finished.error is None
    else:
        assert out.failure is not None and finished.error == error
    if case == "formatter":
        step = out.record.steps[0]
        assert step.output == {"symbol": "ACME", "price": 3.0} and step.result == "stock-service/stock_quote completed."
        assert out.record.diagnostics[0].error_type == "FormatterError"
    if case == "tool":
        assert error.details == {"step_id": "quote-acme", "tool": QUOTE_KEY}
    if case == "event":  # the call was blocked (fail closed) and the run answered without it
        assert error.details["hook"] == "broken-gate" and error.details["event"] == "pre_tool_use"
        assert out.tool_activities == [] and out.record.steps[0].skip_reason == "policy"


# --------------------------------------------------------------------------------------------------
# The fallback model
# --------------------------------------------------------------------------------------------------

UNAVAILABLE = {"retry-after-ms": "10"}  # the activity's retries come at once


def unavailable() -> ai.Reply:
    return ai.error(503, "overloaded", headers=UNAVAILABLE, kind="server_error")


class RedactForFallback:
    """before_fallback: the fallback never reads the ticker; keeps what it was shown."""

    name = "redact-for-fallback"

    def __init__(self, stop: bool = False) -> None:
        self.stop = stop
        self.seen: list[FallbackRequest] = []

    def before_fallback(self, ctx, fallback: FallbackRequest) -> FallbackRequest | Stop:
        self.seen.append(fallback)
        if self.stop:
            return Stop(text="The assistant is unavailable; try again later.", reason="no-fallback")
        return fallback.model_copy(update={"ask": fallback.ask.replace("ACME", "[company]")})


class AnsweredBy:
    name = "answered-by"

    def __init__(self) -> None:
        self.seen: list[AnswerView] = []

    def after_answer(self, ctx, answer: AnswerView) -> None:
        self.seen.append(answer)


def fallback_harness(client, tmp_path, primary: ai.OpenAIServer, fallback: ai.OpenAIServer, hooks: list[Any]):
    model = ModelSettings(
        base_url=primary.base_url, api_key=None, model="primary-m", timeout_seconds=5, fallback_model="fallback-m"
    )
    model = model.model_copy(update={"fallback_base_url": fallback.base_url})
    tools = ToolRegistry(demo_tools(tmp_path))
    return Harness(
        client, tmp_path, hooks=hooks, planner=OpenAIPlanner(model, tools), synthesizer=OpenAISynthesizer(model)
    )


async def test_an_unavailable_primary_hands_the_run_to_the_fallback_after_before_fallback(client, tmp_path, server):
    redact, answered = RedactForFallback(), AnsweredBy()
    server.push(unavailable(), unavailable(), unavailable())
    async with ai.OpenAIServer() as fallback:
        fallback.push(ai.tool_calls((QUOTE, {"symbol": "ACME"}, "call_q")), ai.answer("It costs a lot."))
        async with fallback_harness(client, tmp_path, server, fallback, [redact, answered]) as h:
            out = await h.run("What is the price of ACME?")

    assert out.failure is None, out.failure
    assert out.result is not None and out.result.response == "It costs a lot."
    [seen] = redact.seen
    assert (seen.stage, seen.phase, seen.fallback_model) == ("planning", 1, "openai:fallback-m")
    assert "overloaded" in seen.reason and seen.ask == "What is the price of ACME?"
    # The fallback was asked the redacted request in both of its planning turns (the second wrote the
    # answer); the record keeps the original, and says who answered.
    prompts = [r.messages[1]["content"] for r in fallback.requests]
    assert all("[company]" in p and "ACME?" not in p for p in prompts)
    assert out.record.request == "What is the price of ACME?" and out.record.ask is None
    assert out.record.handled_by == "fallback" and answered.seen[0].answered_by == "fallback"
    routes = [(c.route, c.model, c.error_type) for c in out.record.model_calls]
    assert routes[:3] == [("primary", "primary-m", "ModelUnavailable")] * 3
    assert {(r, m) for r, m, _ in routes[3:]} == {("fallback", "fallback-m")} and len(routes) == 5
    assert "plan · phase 1 · fallback" in out.summaries and "before_fallback · redact-for-fallback" in out.summaries


async def test_before_fallback_may_stop_the_run_instead(client, tmp_path, server):
    server.push(unavailable(), unavailable(), unavailable())
    async with ai.OpenAIServer() as fallback:
        async with fallback_harness(client, tmp_path, server, fallback, [RedactForFallback(stop=True)]) as h:
            out = await h.run("What is the price of ACME?")
    assert fallback.requests == []
    assert out.result is not None and out.result.response == "The assistant is unavailable; try again later."
    assert out.result.stopped == StopInfo(
        extension="redact-for-fallback", phase="before_fallback", reason="no-fallback"
    )


async def test_a_failing_fallback_ends_the_request_with_fallback_failed(client, tmp_path, server):
    observer = Observer()
    server.push(unavailable(), unavailable(), unavailable())
    async with ai.OpenAIServer() as fallback:
        fallback.push(ai.error(401, "bad key"))
        async with fallback_harness(client, tmp_path, server, fallback, [observer]) as h:
            out = await h.run("What is the price of ACME?")
    assert isinstance(out.failure, ApplicationError) and out.failure.type == "FallbackFailed"
    assert out.failure_details()["cause_type"] == "ModelRequestError"
    [error] = observer.errors
    assert (error.origin, error.type, error.recovered) == ("fallback", "FallbackFailed", False)


class RefuseAtStart:
    name = "refuse-at-start"

    def before_run(self, ctx, run):
        raise RuntimeError("refused")


async def test_neither_a_hook_error_nor_a_refused_request_hands_the_run_over(client, tmp_path, server):
    redact = RedactForFallback()
    server.push(ai.error(400, "bad request"))
    async with ai.OpenAIServer() as fallback:
        async with fallback_harness(client, tmp_path, server, fallback, [redact]) as h:
            refused = await h.run("What is the price of ACME?")
        async with fallback_harness(client, tmp_path, server, fallback, [RefuseAtStart(), redact]) as h:
            hook_failed = await h.run("What is the price of ACME?")
    assert refused.failure is not None and refused.failure.type == "ModelRequestError"
    assert hook_failed.failure is not None and hook_failed.failure.type == "ExtensionError"
    assert fallback.requests == [] and redact.seen == []


# --------------------------------------------------------------------------------------------------
# The prompt budget, and the model's own turns
# --------------------------------------------------------------------------------------------------


async def test_a_prompt_that_would_not_fit_the_window_fails_before_the_call(client, tmp_path, server):
    observer = Observer()
    model = ModelSettings(base_url=server.base_url, api_key=None, model="m", timeout_seconds=5, context_window=1200)
    planner = OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path)))
    async with Harness(client, tmp_path, hooks=[observer], planner=planner) as h:
        out = await h.run("What is the price of ACME?")

    assert server.requests == []
    assert isinstance(out.failure, ApplicationError) and out.failure.type == "PromptBudgetExceeded"
    assert "window may be prompt" in out.failure.message
    [call] = out.record.model_calls
    assert (call.error_type, call.latency_ms, call.response) == ("PromptBudgetExceeded", 0.0, None)
    [error] = observer.errors
    assert (error.origin, error.type) == ("budget", "PromptBudgetExceeded")


async def test_a_pipeline_token_counter_decides_the_prompt_budget(client, tmp_path, server):
    counted: list[int] = []

    def counter(messages, tools) -> int:
        counted.append(len(messages))
        return 10

    model = ModelSettings(base_url=server.base_url, api_key=None, model="m", timeout_seconds=5, context_window=1200)
    planner = OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path)), token_counter=counter)
    server.push(ai.answer("Nothing to do."))
    async with Harness(client, tmp_path, planner=planner) as h:
        out = await h.run("What is the price of ACME?")
    assert out.failure is None and counted == [2]


async def test_later_phases_replay_the_models_own_turn_and_answer_each_call_by_its_id(client, tmp_path, server):
    model = ModelSettings(base_url=server.base_url, api_key=None, model="m", timeout_seconds=5)
    planner = OpenAIPlanner(model, ToolRegistry(demo_tools(tmp_path)))
    turn = ai.completion(
        {
            "content": "Let me look both up.",
            "tool_calls": [
                {"id": "call_Xy1", "type": "function", "function": {"name": QUOTE, "arguments": '{"symbol": "ACME"}'}},
                {"id": "call_Zq2", "type": "function", "function": {"name": QUOTE, "arguments": '{"symbol":"BOLT"}'}},
            ],
        },
        finish_reason="tool_calls",
    )
    server.push(turn, ai.answer("That is all."))
    async with Harness(client, tmp_path, planner=planner) as h:
        out = await h.run("Prices of ACME and BOLT?")

    assert out.failure is None, out.failure
    replayed = server.requests[1].messages[2:]
    assert replayed[0]["role"] == "assistant" and replayed[0]["content"] == "Let me look both up."
    assert [c["id"] for c in replayed[0]["tool_calls"]] == ["call_Xy1", "call_Zq2"]
    assert replayed[0]["tool_calls"][1]["function"]["arguments"] == '{"symbol":"BOLT"}'  # as the model wrote it
    assert [(m["role"], m["tool_call_id"]) for m in replayed[1:]] == [("tool", "call_Xy1"), ("tool", "call_Zq2")]
    assert str(quote_price("BOLT")) in replayed[2]["content"]


class RecallAudit:
    """after_recall and before_planning: leaves the memory as loaded and notes what planning is given."""

    name = "recall-audit"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def after_recall(self, ctx, recall: RecallView) -> RecallPatch | None:
        self.seen.append(f"after_recall:{len(recall.memory.exchanges)}")
        return None

    def before_planning(self, ctx) -> None:
        self.seen.append(f"before_planning:{ctx.enrichments.get('conversation_history', '')}")


@pytest.mark.parametrize("forget", [False, True], ids=["as-loaded", "changed"])
async def test_after_recall_runs_on_into_before_planning_while_it_leaves_the_memory_as_loaded(client, tmp_path, forget):
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    audit = RecallAudit()
    hooks = [ForgetAcme(), audit] if forget else [audit]
    planner = PhasedPlanner([quote("q", "INIT")])
    async with Harness(client, tmp_path, hooks=hooks, memory=memory, planner=planner) as h:
        await memory.save(
            MemoryCandidate(conversation_id="conv-o", request="What is the price of ACME?", answer="ACME is 1."),
            request_id="earlier-1",
        )
        out = await h.run("What is the price of INIT?", {"conversation_id": "conv-o"})

    assert out.failure is None, out.failure
    types = list(
        dict.fromkeys(
            a.recorded_type
            for a in out.scheduled
            if a.recorded_type and a.recorded_type.startswith(("after_recall:", "before_planning:"))
        )
    )
    if forget:  # the memory changed: before_planning ran in the planning activity, on the view after_recall left
        assert types == ["after_recall:forget-acme + recall-audit → before_planning:recall-audit"]
        [fused] = [a for a in out.scheduled if a.summary == "before_planning · recall-audit"]
        assert (fused.batched, fused.recorded_type) == (True, None)  # reported by the planning activity
        assert audit.seen == ["after_recall:0", "before_planning:"]
    else:
        assert types == ["after_recall:recall-audit → before_planning:recall-audit"]
        history = "user: What is the price of ACME?\nassistant: ACME is 1."
        assert audit.seen == ["after_recall:1", f"before_planning:{history}"]
    assert out.record is not None and not out.record.diagnostics
    assert [i.stage.value for i in out.record.pipeline_hooks if i.hook == "recall-audit"] == [
        "after_recall",
        "before_planning",
    ]


async def test_identical_calls_of_one_phase_run_once_writes_included(client, tmp_path):
    """Two equal trades and two equal quotes in one phase, with no dependency between them: one of each
    runs; the other trade is a duplicate and the other quote is answered from the one that ran."""
    outcomes = Outcomes()
    plan = [trade("trade-1"), trade("trade-2"), quote("quote-1", "ACME"), quote("quote-2", "ACME")]
    async with Harness(client, tmp_path, hooks=[outcomes], planner=PhasedPlanner(plan)) as h:
        out = await h.run("Buy 1 ACME, twice; quote it twice")

    assert out.failure is None, out.failure
    assert executed_steps(out) == ["trade-1", "quote-1"]
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 1
    by_id = {s.step_id: s for s in out.record.steps}
    assert (by_id["trade-2"].status, by_id["trade-2"].skip_reason, by_id["trade-2"].skip_detail) == (
        StepStatus.SKIPPED,
        "duplicate",
        "same call as trade-1",
    )
    assert (by_id["quote-2"].status, by_id["quote-2"].cached_from) == (StepStatus.SUCCEEDED, "quote-1")
    assert by_id["quote-2"].output == by_id["quote-1"].output
    assert [outcomes.outcomes[s].status for s in ("trade-2", "quote-2")] == ["skipped", "cached"]


async def test_a_step_whose_tool_ran_stays_in_the_failed_record_when_after_tool_fails(client, tmp_path):
    class Broken:
        name = "broken"
        max_attempts = 1

        def after_tool(self, ctx, call: ToolCall, outcome: ToolOutcomeView) -> None:
            raise RuntimeError("formatter crashed")

    async with Harness(client, tmp_path, hooks=[Broken()], planner=PhasedPlanner([trade("trade-1")])) as h:
        out = await h.run("Buy 1 ACME")

    assert out.failure is not None and out.failure.type == "ExtensionError"
    assert len((tmp_path / "ledger.jsonl").read_text().splitlines()) == 1
    for record in (out.record, await out.stored()):
        [step] = record.steps
        assert (step.step_id, step.status) == ("trade-1", StepStatus.SUCCEEDED)
        assert step.output is not None and step.idempotency_key
        assert record.status.value == "failed"


class Views:
    """What each tool-call and planning hook is told besides its subject, as the contracts give it."""

    name = "views"

    def __init__(self) -> None:
        self.planning: list[tuple[int | None, list[tuple[str, str, bool]], list[str], str | None]] = []
        self.before: dict[str, tuple[str, list[str], str | None, bool]] = {}
        self.after: dict[str, list[str]] = {}

    def after_planning(self, ctx, plan: Plan) -> None:
        tools = [(t.key, t.description, t.writes) for t in ctx.tools]
        self.planning.append((ctx.attempt, tools, [s.step_id for s in ctx.steps], ctx.conversation_id))

    def before_tool(self, ctx, call: ToolCall) -> None:
        self.before[call.step_id] = (call.brief, [s.step_id for s in ctx.steps], ctx.conversation_id, ctx.cancelled)

    def after_tool(self, ctx, call: ToolCall, outcome: ToolOutcomeView) -> None:
        self.after[call.step_id] = [f"{s.step_id}:{s.status}" for s in ctx.steps]


class ContextReader(Tool):
    """A read-only quote that keeps what its context said: the application's context, the conversation."""

    namespace, agent, capability = NS, "stock-service", "stock_quote"
    description = "Current price of a stock (read-only)"
    read_only = True
    Arguments = QuoteArguments
    seen: list[tuple[dict, str | None]] = []

    async def run(self, arguments: QuoteArguments, ctx: ToolContext) -> Any:
        ContextReader.seen.append((dict(ctx.context), ctx.conversation_id))
        return {"symbol": arguments.symbol, "price": 1.0}


async def test_hooks_and_tools_are_told_what_their_contracts_give(client, tmp_path):
    views, tool = Views(), ContextReader()
    ContextReader.seen = []
    second = quote("quote-bolt", "BOLT")
    second.metadata["brief"] = "the second ticker the user named"
    planner = PhasedPlanner([quote("quote-acme", "ACME")], [second])
    metadata = {"conversation_id": "conv-views", "tenant_id": "t1"}
    async with Harness(client, tmp_path, hooks=[views], planner=planner, tools=[tool]) as h:
        out = await h.run("Quotes for ACME and BOLT", metadata)

    assert out.failure is None, out.failure
    quote_tool = (QUOTE_KEY, "Current price of a stock (read-only)", False)
    assert views.planning == [(0, [quote_tool], [], "conv-views"), (0, [quote_tool], ["quote-acme"], "conv-views")]
    rationale = out.record.plans[0].plan.rationale
    assert views.before == {
        "quote-acme": (rationale, [], "conv-views", False),
        "quote-bolt": ("the second ticker the user named", ["quote-acme"], "conv-views", False),
    }
    assert views.after == {"quote-acme": [], "quote-bolt": ["quote-acme:succeeded"]}
    assert ContextReader.seen == [(metadata, "conv-views"), (metadata, "conv-views")]


async def test_a_synchronous_hook_that_runs_past_its_timeout_is_stopped_and_sees_itself_cancelled(client, tmp_path):
    """A plain ``def`` hook runs in a thread of its own: when its invocation times out it is stopped — and
    ``ctx.cancelled``, for a hook that catches everything, says so — instead of running on."""

    class Slow:
        name = "slow"
        timeout_seconds = 1.0
        max_attempts = 1
        ended = threading.Event()

        def after_execution(self, ctx, execution) -> None:
            deadline = time.monotonic() + 30
            try:
                while time.monotonic() < deadline and not ctx.cancelled:
                    time.sleep(0.02)
            finally:
                Slow.ended.set()

    async with Harness(client, tmp_path, hooks=[Slow()]) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is None  # after_execution fails open: the timeout is recorded, the request goes on
    [inv] = out.record.invocations(Stage.AFTER_EXECUTION, "slow")
    assert inv.outcome.value == "timed_out"
    assert await asyncio.to_thread(Slow.ended.wait, 10)  # stopped long before its 30 s
