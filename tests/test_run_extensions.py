"""The run-extension stages and outcomes against a real Temporal server, as an application sees them:
after_recall's transient memory, before_plan's tool filtering and context per planning attempt (and a
malformed model plan retried as an attempt of its own), after_planning's stop, the honest after_tool
outcomes (cached reads, duplicate writes, a reviewer's decline of one call), and where every error that
on_error observes comes from."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from activities.memory import ConversationMemoryStore
from activities.models import ModelSettings, OpenAIPlanner, function_name
from activities.tools import Tool, ToolContext, ToolRegistry
from client.pipeline import NoPlanner
from demo.agent import RulePlanner
from demo.tools import QuoteArguments, demo_tools, quote_price
from hooks import PlanAttempt, PlanAttemptPatch, RecallPatch, RecallView, Stop, ToolDecision
from workflows.models import (
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

from . import openai_server as ai
from .doubles import NS, FixedPlanner, quote
from .harness import Harness, Outcome

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

    def before_plan(self, ctx, attempt: PlanAttempt) -> PlanAttemptPatch:
        self.attempts.append(attempt)
        return PlanAttemptPatch(tools=self.tools, context_text=self.context)


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
        ack = await handle.execute_update(
            "review",
            ReviewRequest(
                checkpoint_id=checkpoint.checkpoint_id,
                reviewer="ops",
                decision="approve",
                comment="not bob",
                declined=["msg-bob"],
            ),
        )
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
    assert ack is not None


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


ORIGIN_CASES = ["memory", "tool", "formatter", "config", "harness"]


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
        options["planner"] = NoPlanner()
    elif case == "harness":
        hooks.insert(0, Huge())
    async with Harness(client, tmp_path, hooks=hooks, **options) as h:
        out = await h.run("What is the price of ACME?")

    expected = {
        "memory": ("memory", "MemoryError", True),
        "tool": ("tool", "ApplicationError", True),
        "formatter": ("formatter", "FormatterError", True),
        "config": ("config", "PlanningFailed", False),
        "harness": ("harness", "PayloadTooLarge", False),
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
