"""Planning and execution: one activity per plan step, ``depends_on`` order, concurrency, failing tools,
idempotency keys, and the planner's own failures."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel, ConfigDict
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import LifecycleActivities, Tool, ToolRegistry
from activities.tools import ToolContext
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import ExecuteTrade, StockQuote, TradeArguments, demo_tools, quote_price
from hooks import HookRegistry, PlanStep, Stage
from storage.executions import SQLiteExecutionStore
from workflows import data_converter
from workflows.models import Plan, RequestStatus, StageSettings, ToolStepInput, ToolStepOutput

from .doubles import FixedPlanner, NoArguments, quote, started_attempts
from .harness import Harness, Outcome

NS = "demo-tools"


def message(step_id: str, text: str, depends_on: list[str] | None = None) -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace=NS,
        agent="notify-service",
        capability="send_message",
        arguments={"to": "ops", "text": text},
        depends_on=depends_on or [],
    )


def step(step_id: str, namespace: str, agent: str, capability: str, depends_on: list[str] | None = None, **arguments):
    return PlanStep(
        step_id=step_id,
        namespace=namespace,
        agent=agent,
        capability=capability,
        arguments=arguments,
        depends_on=depends_on or [],
    )


class NameArgument(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class FailingTool(Tool):
    namespace = "test-tools"
    agent = "broker"
    capability = "place_order"
    Arguments = NoArguments

    def __init__(self) -> None:
        self.attempts: list[int] = []

    async def run(self, arguments, ctx: ToolContext):
        self.attempts.append(ctx.attempt)
        raise RuntimeError(f"broker offline (attempt {ctx.attempt})")


class KeyRecorder(Tool):
    """Records the context of every call and fails the first attempt of each step."""

    namespace = "test-tools"
    agent = "recorder"
    capability = "record"
    Arguments = NameArgument

    def __init__(self) -> None:
        self.calls: list[ToolContext] = []

    async def run(self, arguments, ctx: ToolContext):
        self.calls.append(ctx)
        if ctx.attempt == 1:
            raise RuntimeError("first attempt lost")
        return {"name": arguments.name, "key": ctx.idempotency_key}


class Rendezvous(Tool):
    """Succeeds only when ``parties`` calls are in flight at once: proof of concurrency without timing."""

    namespace = "test-tools"
    agent = "sync"
    capability = "rendezvous"
    Arguments = NameArgument

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.all_here = asyncio.Event()

    async def run(self, arguments, ctx: ToolContext):
        self.arrived += 1
        if self.arrived >= self.parties:
            self.all_here.set()
        await asyncio.wait_for(self.all_here.wait(), timeout=10)
        return {"name": arguments.name}


class RetriedTrade(Tool):
    """The demo ExecuteTrade, but the activity fails after the ledger write on its first attempt."""

    namespace = ExecuteTrade.namespace
    agent = ExecuteTrade.agent
    capability = ExecuteTrade.capability
    Arguments = TradeArguments

    def __init__(self, inner: ExecuteTrade) -> None:
        self.inner = inner
        self.outputs: list[tuple[int, str, dict]] = []

    async def run(self, arguments, ctx: ToolContext):
        output = await self.inner.run(arguments, ctx)
        self.outputs.append((ctx.attempt, ctx.idempotency_key, output))
        if ctx.attempt == 1:
            raise RuntimeError("connection lost after the ledger write")
        return output


def step_of(summary: str) -> str:
    return summary.rsplit("(", 1)[1].rstrip(")")


def tool_events(out: Outcome) -> dict[str, dict[str, object]]:
    """Per step id: the execute_tool_step scheduled/started/completed/failed events of its activity."""
    by_scheduled: dict[int, str] = {}
    events: dict[str, dict[str, object]] = {}

    for e in out.history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name != "execute_tool_step":
                continue
            summary = data_converter.payload_converter.from_payload(e.user_metadata.summary, str)
            by_scheduled[e.event_id] = step_of(summary)
            events[step_of(summary)] = {"scheduled": e}
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            sid = by_scheduled.get(e.activity_task_started_event_attributes.scheduled_event_id)
            if sid:
                events[sid]["started"] = e
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = by_scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id)
            if sid:
                events[sid]["completed"] = e
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            sid = by_scheduled.get(e.activity_task_failed_event_attributes.scheduled_event_id)
            if sid:
                events[sid]["failed"] = e
    return events


# --------------------------------------------------------------------------------------------------
# One activity per step
# --------------------------------------------------------------------------------------------------


async def test_each_plan_step_is_one_labelled_activity(client, tmp_path):
    planner = FixedPlanner(quote("quote-acme", "ACME"), quote("quote-msft", "MSFT"), message("tell-ops", "done"))
    async with Harness(client, tmp_path, planner=planner) as h:
        out = await h.run("two quotes and a message", approve_as="ops-reviewer")

    assert out.failure is None
    assert [a.summary for a in out.tool_activities] == [
        "execute · stock-service/stock_quote (quote-acme)",
        "execute · stock-service/stock_quote (quote-msft)",
        "execute · notify-service/send_message (tell-ops)",
    ]
    assert out.activity_types().count("execute_tool_step") == 3
    steps = {s.step_id: s for s in out.record.steps}
    assert [s.step_id for s in out.record.steps] == ["quote-acme", "quote-msft", "tell-ops"]
    assert all(s.status.value == "succeeded" for s in steps.values())
    assert steps["quote-acme"].output == {"symbol": "ACME", "price": quote_price("ACME"), "currency": "USD"}
    assert steps["quote-acme"].tool == "stock-service/stock_quote"
    assert steps["tell-ops"].output == {"to": "ops", "delivered": True, "replayed": False}
    outbox = [json.loads(line) for line in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [(m["to"], m["text"]) for m in outbox] == [("ops", "done")]
    assert [(s.step_id, s.status) for s in out.result.steps] == [
        ("quote-acme", "succeeded"),
        ("quote-msft", "succeeded"),
        ("tell-ops", "succeeded"),
    ]


async def test_an_empty_plan_schedules_no_tool_and_still_synthesizes(client, tmp_path):
    async with Harness(client, tmp_path, planner=FixedPlanner()) as h:
        out = await h.run("hello there")

    assert out.failure is None
    assert out.tool_activities == []
    assert "synthesize" in out.activity_types()
    assert out.record.steps == []
    assert "found nothing to do" in out.result.response


# --------------------------------------------------------------------------------------------------
# depends_on and concurrency
# --------------------------------------------------------------------------------------------------


async def test_depends_on_is_honoured_and_independent_steps_run_concurrently(client, tmp_path):
    planner = FixedPlanner(
        quote("a", "ACME"),
        quote("b", "MSFT"),
        message("c", "both quoted", depends_on=["a", "b"]),
        quote("d", "IBM", depends_on=["c"]),
        quote("e", "ORCL"),
    )
    async with Harness(client, tmp_path, planner=planner) as h:
        out = await h.run("dependent steps", approve_as="ops-reviewer")

    assert out.failure is None
    ev = tool_events(out)
    assert set(ev) == {"a", "b", "c", "d", "e"}
    scheduled = {sid: ev[sid]["scheduled"] for sid in ev}
    completed = {sid: ev[sid]["completed"] for sid in ev}

    # a, b and e are independent: scheduled together in one workflow task, before any step completed.
    wft = {sid: scheduled[sid].activity_task_scheduled_event_attributes.workflow_task_completed_event_id for sid in ev}
    assert wft["a"] == wft["b"] == wft["e"]
    first_completion = min(c.event_id for c in completed.values())
    assert max(scheduled[s].event_id for s in ("a", "b", "e")) < first_completion

    # c waits for both of its dependencies, d for c.
    assert scheduled["c"].event_id > max(completed["a"].event_id, completed["b"].event_id)
    assert scheduled["d"].event_id > completed["c"].event_id
    assert wft["c"] != wft["a"] and wft["d"] != wft["c"]

    assert [s.step_id for s in out.record.steps] == ["a", "b", "c", "d", "e"]  # plan order, not finish order
    assert all(s.status.value == "succeeded" for s in out.record.steps)


async def test_independent_steps_are_in_flight_at_the_same_time(client, tmp_path):
    rendezvous = Rendezvous(parties=3)
    planner = FixedPlanner(*(step(f"meet-{i}", "test-tools", "sync", "rendezvous", name=str(i)) for i in range(3)))
    async with Harness(
        client, tmp_path, planner=planner, tools=[rendezvous], settings=StageSettings(tool_max_attempts=1)
    ) as h:
        out = await h.run("meet")

    assert out.failure is None
    assert [s.status.value for s in out.record.steps] == ["succeeded"] * 3
    assert rendezvous.arrived == 3


async def test_a_dependent_step_is_not_started_while_its_dependency_runs(client, tmp_path):
    class Overlap(Tool):
        """ "first" waits a moment for any other call to arrive; a correct executor never sends one."""

        namespace = "test-tools"
        agent = "sync"
        capability = "overlap"
        Arguments = NameArgument

        def __init__(self) -> None:
            self.in_flight = 0
            self.arrival = asyncio.Event()

        async def run(self, arguments, ctx):
            self.in_flight += 1
            self.arrival.set()
            try:
                if arguments.name == "first":
                    self.arrival.clear()
                    try:
                        await asyncio.wait_for(self.arrival.wait(), timeout=1)
                    except TimeoutError:
                        pass
                return {"name": arguments.name, "others_in_flight": self.in_flight - 1}
            finally:
                self.in_flight -= 1

    planner = FixedPlanner(
        step("first", "test-tools", "sync", "overlap", name="first"),
        step("second", "test-tools", "sync", "overlap", depends_on=["first"], name="second"),
    )
    async with Harness(client, tmp_path, planner=planner, tools=[Overlap()]) as h:
        out = await h.run("in order")

    outputs = {s.step_id: s.output for s in out.record.steps}
    assert outputs == {
        "first": {"name": "first", "others_in_flight": 0},
        "second": {"name": "second", "others_in_flight": 0},
    }
    ev = tool_events(out)
    assert ev["second"]["scheduled"].event_id > ev["first"]["completed"].event_id


async def test_a_dependent_step_starts_when_its_own_dependencies_finish_not_all_running_steps(client, tmp_path):
    class Handshake(Tool):
        """ "slow" finishes only once "after-fast" has started; "after-fast" depends on "fast" only."""

        namespace = "test-tools"
        agent = "sync"
        capability = "handshake"
        Arguments = NameArgument

        def __init__(self) -> None:
            self.after_fast_started = asyncio.Event()

        async def run(self, arguments, ctx):
            if arguments.name == "after-fast":
                self.after_fast_started.set()
            if arguments.name == "slow":
                await asyncio.wait_for(self.after_fast_started.wait(), timeout=5)
            return {"name": arguments.name}

    planner = FixedPlanner(
        step("fast", "test-tools", "sync", "handshake", name="fast"),
        step("slow", "test-tools", "sync", "handshake", name="slow"),
        step("after-fast", "test-tools", "sync", "handshake", depends_on=["fast"], name="after-fast"),
    )
    async with Harness(
        client, tmp_path, planner=planner, tools=[Handshake()], settings=StageSettings(tool_max_attempts=1)
    ) as h:
        out = await h.run("handshake")

    assert [(s.step_id, s.status.value) for s in out.record.steps] == [
        ("fast", "succeeded"),
        ("slow", "succeeded"),
        ("after-fast", "succeeded"),
    ]
    ev = tool_events(out)
    assert ev["fast"]["completed"].event_id < ev["after-fast"]["scheduled"].event_id < ev["slow"]["completed"].event_id


# --------------------------------------------------------------------------------------------------
# Failing tools
# --------------------------------------------------------------------------------------------------


async def test_a_failing_tool_fails_its_step_skips_dependents_and_the_request_still_answers(client, tmp_path):
    failing = FailingTool()
    planner = FixedPlanner(
        quote("quote-acme", "ACME"),
        step("order", "test-tools", "broker", "place_order"),
        message("confirm", "order placed", depends_on=["order"]),
        quote("after-confirm", "MSFT", depends_on=["confirm"]),
        quote("also-acme", "IBM", depends_on=["quote-acme"]),
    )
    async with Harness(
        client,
        tmp_path,
        planner=planner,
        tools=[*demo_tools(tmp_path), failing],
        settings=StageSettings(tool_max_attempts=2),
    ) as h:
        out = await h.run("order and confirm", approve_as="ops-reviewer")

    assert out.failure is None
    assert failing.attempts == [1, 2]
    assert started_attempts(out, "execute_tool_step").count(2) == 1
    # Skipped steps cost nothing: no activity for them.
    assert [step_of(a.summary) for a in out.tool_activities] == ["quote-acme", "order", "also-acme"]

    steps = {s.step_id: s for s in out.record.steps}
    assert [s.step_id for s in out.record.steps] == ["quote-acme", "order", "confirm", "after-confirm", "also-acme"]
    assert steps["order"].status.value == "failed"
    assert steps["order"].error == "broker offline (attempt 2)"
    assert steps["order"].error_type == "RuntimeError"
    assert steps["confirm"].status.value == "skipped"
    assert steps["confirm"].skip_reason == "missing"
    assert steps["confirm"].skip_detail == "dependency_not_succeeded: order"
    assert steps["after-confirm"].status.value == "skipped"
    assert steps["after-confirm"].skip_detail == "dependency_not_succeeded: confirm"
    assert steps["quote-acme"].status.value == steps["also-acme"].status.value == "succeeded"
    assert not (tmp_path / "outbox.jsonl").exists()

    assert "synthesize" in out.activity_types()
    response = out.result.response
    assert "I could not complete broker/place_order (order): error: broker offline (attempt 2)" in response
    assert "I skipped notify-service/send_message (confirm): dependency_not_succeeded: order" in response
    assert "ACME is trading at" in response
    assert out.result.confidence == pytest.approx(2 / 5)
    assert [(s.step_id, s.status) for s in out.result.steps][1:3] == [("order", "failed"), ("confirm", "skipped")]
    stored = await out.stored()
    assert stored.status is RequestStatus.SUCCEEDED
    assert [s.status.value for s in stored.steps] == ["succeeded", "failed", "skipped", "skipped", "succeeded"]


async def test_tool_max_attempts_bounds_the_retries(client, tmp_path):
    failing = FailingTool()
    planner = FixedPlanner(step("order", "test-tools", "broker", "place_order"))
    async with Harness(
        client, tmp_path, planner=planner, tools=[failing], settings=StageSettings(tool_max_attempts=1)
    ) as h:
        out = await h.run("order")

    assert failing.attempts == [1]
    assert out.record.steps[0].error == "broker offline (attempt 1)"
    assert started_attempts(out, "execute_tool_step") == [1]


# --------------------------------------------------------------------------------------------------
# Idempotency
# --------------------------------------------------------------------------------------------------


async def test_each_tool_receives_a_stable_idempotency_key_across_retries(client, tmp_path):
    recorder = KeyRecorder()
    planner = FixedPlanner(
        step("one", "test-tools", "recorder", "record", name="one"),
        step("two", "test-tools", "recorder", "record", name="two"),
    )
    async with Harness(client, tmp_path, planner=planner, tools=[recorder]) as h:
        first = await h.run("record twice")
        second = await h.run("record twice")

    for out in (first, second):
        assert out.failure is None
        calls = [c for c in recorder.calls if c.request_id == out.workflow_id]
        for step_id in ("one", "two"):
            expected = out.idempotency_key(step_id, {"name": step_id})
            mine = [c for c in calls if c.step_id == step_id]
            assert [(c.attempt, c.idempotency_key) for c in mine] == [(1, expected), (2, expected)]
            recorded = next(s for s in out.record.steps if s.step_id == step_id)
            assert recorded.idempotency_key == expected
            assert recorded.output == {"name": step_id, "key": expected}
    keys = {c.idempotency_key for c in recorder.calls}
    assert len(keys) == 4  # distinct per step and per request
    assert first.idempotency_key("one", {"name": "one"}).startswith("one-")


async def test_a_retried_trade_writes_the_ledger_once(client, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    trade = RetriedTrade(ExecuteTrade(ledger))
    async with Harness(client, tmp_path, tools=[StockQuote(), trade]) as h:
        out = await h.run("Buy 10 ACME")

    assert out.failure is None
    key = out.idempotency_key("trade-acme", {"symbol": "ACME", "side": "buy", "quantity": 10})
    assert [(attempt, k, o["replayed"]) for attempt, k, o in trade.outputs] == [(1, key, False), (2, key, True)]
    assert trade.outputs[0][2]["order_id"] == trade.outputs[1][2]["order_id"]
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(entries) == 1
    assert entries[0]["idempotency_key"] == key
    assert (entries[0]["symbol"], entries[0]["side"], entries[0]["quantity"]) == ("ACME", "buy", 10)
    result = out.record.steps[0]
    assert result.status.value == "succeeded" and result.output["replayed"] is True
    assert started_attempts(out, "execute_tool_step") == [2]
    assert f"Bought 10 ACME at {quote_price('ACME')}" in out.result.response


# --------------------------------------------------------------------------------------------------
# execute_tool_step on its own
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def lifecycle_activities(tmp_path) -> LifecycleActivities:
    return LifecycleActivities(
        registry=HookRegistry([]),
        tools=ToolRegistry(demo_tools(tmp_path)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(tmp_path / "executions.sqlite3"),
    )


@pytest.mark.parametrize(
    "bad_step, message_start, detail",
    [
        (
            quote("q", "acme"),
            "invalid arguments for demo-tools/stock-service/stock_quote",
            "String should match pattern",
        ),
        (
            step("q", NS, "stock-service", "stock_quote"),
            "invalid arguments for demo-tools/stock-service/stock_quote",
            "Field required",
        ),
        (
            step("t", NS, "stock-service", "execute_trade", symbol="ACME", side="hold", quantity=1),
            "invalid arguments for demo-tools/stock-service/execute_trade",
            "Input should be 'buy' or 'sell'",
        ),
        (
            step("t", NS, "stock-service", "execute_trade", symbol="ACME", side="buy", quantity=0),
            "invalid arguments for demo-tools/stock-service/execute_trade",
            "greater than 0",
        ),
        (step("x", NS, "stock-service", "crystal_ball"), "unknown tool demo-tools/stock-service/crystal_ball", ""),
    ],
)
async def test_execute_tool_step_rejects_bad_arguments_without_retry(
    lifecycle_activities, tmp_path, bad_step, message_start, detail
):
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as raised:
        await env.run(
            lifecycle_activities.tool_steps.execute_tool_step,
            ToolStepInput(step=bad_step, request_id="req-1", idempotency_key="k-1"),
        )
    err = raised.value
    assert err.type == "InvalidArguments"
    assert err.non_retryable
    assert err.message.startswith(message_start)
    assert detail in err.message
    assert not (tmp_path / "ledger.jsonl").exists()  # a rejected trade writes nothing


async def test_execute_tool_step_runs_a_valid_step_with_its_key(lifecycle_activities, tmp_path):
    env = ActivityEnvironment()
    output = await env.run(
        lifecycle_activities.tool_steps.execute_tool_step,
        ToolStepInput(
            step=step("t", NS, "stock-service", "execute_trade", symbol="ACME", side="sell", quantity=3),
            request_id="req-1",
            idempotency_key="t-key",
        ),
    )
    assert isinstance(output, ToolStepOutput)
    assert output.output["replayed"] is False and output.output["quantity"] == 3
    entries = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(e["idempotency_key"], e["side"]) for e in entries] == [("t-key", "sell")]


# --------------------------------------------------------------------------------------------------
# Planner failures
# --------------------------------------------------------------------------------------------------


class PlanWatcher:
    """An after_planning hook: must never be scheduled when planning failed."""

    name = "plan-watcher"

    async def after_planning(self, ctx, plan):
        return plan


INVALID_PLANNER_PLANS = {
    "unknown_tool": (
        [step("x", NS, "stock-service", "crystal_ball")],
        ["step 'x': unknown tool demo-tools/stock-service/crystal_ball"],
    ),
    "duplicate_and_forward": (
        [quote("a", "ACME", depends_on=["b"]), quote("b", "MSFT"), quote("b", "IBM")],
        [
            "step 'a': depends_on 'b' names a later step (cycle or forward reference)",
            "step 'b': duplicate step_id",
        ],
    ),
    "bad_arguments": (
        [quote("a", "acme")],
        ["step 'a': argument symbol: String should match pattern '^[A-Z]{1,5}$'"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID_PLANNER_PLANS))
async def test_a_planner_producing_an_invalid_plan_fails_the_request(client, tmp_path, case):
    steps, problems = INVALID_PLANNER_PLANS[case]
    planner = FixedPlanner(*steps)
    async with Harness(client, tmp_path, planner=planner, hooks=[PlanWatcher()]) as h:
        out = await h.run("plan badly")

    assert out.failure is not None
    assert out.failure.type == "PlanningFailed"
    assert out.failure.non_retryable
    cause = "planner produced an invalid plan: " + "; ".join(problems)
    assert out.failure.message == f"planning failed: {cause}"
    assert out.failure_details() == {"cause": cause, "cause_type": "InvalidPlan"}
    assert planner.calls == 1  # an invalid plan is not retried
    assert started_attempts(out, "plan") == [1]
    types = out.activity_types()
    assert "after_planning_hook" not in types and "execute_tool_step" not in types and "synthesize" not in types
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED
    assert stored.error.type == "PlanningFailed"
    assert stored.plans == [] and stored.steps == []
    assert stored.invocations(Stage.AFTER_PLANNING) == []


async def test_a_planner_returning_something_else_fails_the_request(client, tmp_path):
    class DictPlanner:
        name = "dict-planner"

        async def plan(self, request):
            return {"steps": []}

    async with Harness(client, tmp_path, planner=DictPlanner()) as h:
        out = await h.run("plan badly")

    assert out.failure.type == "PlanningFailed"
    assert out.failure_details() == {"cause": "planner returned dict, not a Plan", "cause_type": "InvalidPlan"}
    assert out.tool_activities == []


async def test_a_raising_planner_fails_the_request_after_retries(client, tmp_path):
    class DownPlanner:
        name = "down-planner"
        calls = 0

        async def plan(self, request):
            DownPlanner.calls += 1
            raise RuntimeError("model unavailable")

    async with Harness(client, tmp_path, planner=DownPlanner(), hooks=[PlanWatcher()]) as h:
        out = await h.run("quote ACME")

    assert DownPlanner.calls == 3
    assert started_attempts(out, "plan") == [3]
    assert out.failure.type == "PlanningFailed"
    assert out.failure.non_retryable
    assert out.failure.message == "planning failed: model unavailable"
    assert out.failure_details() == {"cause": "model unavailable", "cause_type": "RuntimeError"}
    types = out.activity_types()
    assert types.count("plan") == 1
    assert "after_planning_hook" not in types and "execute_tool_step" not in types and "synthesize" not in types
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.error.type == "PlanningFailed"


async def test_a_planner_that_recovers_on_retry_lets_the_request_succeed(client, tmp_path):
    class FlakyPlanner:
        name = "flaky-planner"
        calls = 0

        async def plan(self, request):
            FlakyPlanner.calls += 1
            if FlakyPlanner.calls == 1:
                raise ConnectionError("rate limited")
            return Plan(phase=request.phase, steps=[quote("quote-acme", "ACME")])

    async with Harness(client, tmp_path, planner=FlakyPlanner()) as h:
        out = await h.run("quote ACME")

    assert out.failure is None
    assert FlakyPlanner.calls == 2
    assert out.record.planner == "flaky-planner"
    assert [step_of(a.summary) for a in out.tool_activities] == ["quote-acme"]
