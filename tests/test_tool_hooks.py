"""The tool-call stages: before_tool allow (the zero value) / modify / deny / stop, after_tool on every outcome, on_tool_error,
the result cap, and the decisions, step ids, summaries and spans each invocation leaves behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.enums.v1 import EventType

from activities import Tool
from activities.tools import ToolContext
from hooks import PlanStep, RunMode, Stage, ToolCall, ToolDecision, ToolErrorResolution, ToolOutcomeView
from workflows.models import RequestStatus, StageSettings, StepStatus, StopInfo

from .doubles import FixedPlanner, NoArguments, decision, span_decision
from .harness import Harness, Outcome

TOOL_STAGE_ACTIVITIES = {"before_tool_hook", "after_tool_hook", "on_tool_error_hook"}

# --------------------------------------------------------------------------------------------------
# Test tools
# --------------------------------------------------------------------------------------------------


class SayArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=40)
    times: int = Field(default=1, ge=1, le=3)


class Echo(Tool):
    """Says its text ``times`` times and remembers exactly which arguments it was given."""

    namespace = "test-tools"
    agent = "echo"
    capability = "say"
    read_only = True
    Arguments = SayArguments

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def run(self, arguments: SayArguments, ctx: ToolContext):
        self.calls.append((ctx.step_id, arguments.model_dump()))
        return " ".join([arguments.text] * arguments.times)


class Broken(Tool):
    namespace = "test-tools"
    agent = "broker"
    capability = "place_order"
    Arguments = NoArguments

    def __init__(self) -> None:
        self.attempts = 0

    async def run(self, arguments, ctx: ToolContext):
        self.attempts += 1
        raise RuntimeError("broker offline")


class SizeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(ge=1, le=10_000)


def long_text(size: int) -> str:
    return ("0123456789abcdefghijklmnopqrstuvwxyz" * (size // 36 + 1))[:size]


class Long(Tool):
    namespace = "test-tools"
    agent = "dump"
    capability = "read"
    read_only = True
    Arguments = SizeArguments

    async def run(self, arguments: SizeArguments, ctx: ToolContext):
        return long_text(arguments.size)


class Slow(Tool):
    """Runs until it is cancelled; ``started`` is set once it is running."""

    namespace = "test-tools"
    agent = "slow"
    capability = "wait"
    read_only = True
    Arguments = NoArguments

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.finished = False
        self.cancelled = False

    async def run(self, arguments, ctx: ToolContext):
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True
        return "done"


def step(step_id: str, tool: type[Tool], depends_on: list[str] | None = None, **arguments: Any) -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace=tool.namespace,
        agent=tool.agent,
        capability=tool.capability,
        arguments=arguments,
        depends_on=depends_on or [],
    )


# --------------------------------------------------------------------------------------------------
# Test hooks
# --------------------------------------------------------------------------------------------------


class BeforeTool:
    """A before_tool hook whose verdict per call is ``decide(call)``; it remembers every call it saw."""

    def __init__(self, name: str, decide: Callable[[ToolCall], Any] = lambda call: None, **options: Any) -> None:
        self.name = name
        self.decide = decide
        self.max_attempts = 1
        for key, value in options.items():
            setattr(self, key, value)
        self.seen: list[ToolCall] = []

    async def before_tool(self, ctx, call: ToolCall):
        self.seen.append(call.model_copy(deep=True))
        return self.decide(call)

    def seen_steps(self) -> list[str]:
        return sorted(c.step_id for c in self.seen)


class AfterTool:
    def __init__(
        self, name: str, rewrite: Callable[[ToolCall, ToolOutcomeView], Any] = lambda call, outcome: None
    ) -> None:
        self.name = name
        self.rewrite = rewrite
        self.max_attempts = 1
        self.seen: dict[str, ToolOutcomeView] = {}

    async def after_tool(self, ctx, call: ToolCall, outcome: ToolOutcomeView):
        self.seen[call.step_id] = outcome.model_copy(deep=True)
        return self.rewrite(call, outcome)


class OnToolError:
    def __init__(
        self, name: str, resolve: Callable[[ToolCall, ToolOutcomeView], Any] = lambda call, outcome: None
    ) -> None:
        self.name = name
        self.resolve = resolve
        self.max_attempts = 1
        self.seen: dict[str, ToolOutcomeView] = {}

    async def on_tool_error(self, ctx, call: ToolCall, outcome: ToolOutcomeView):
        self.seen[call.step_id] = outcome.model_copy(deep=True)
        return self.resolve(call, outcome)


# --------------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------------


def executed_steps(out: Outcome) -> list[str]:
    """The step ids whose tool activity was scheduled, from the history."""
    return [a.summary.rsplit("(", 1)[1].rstrip(")") for a in out.tool_activities]


def stage_invocations(
    out: Outcome, stage: Stage, step_id: str | None = None
) -> list[tuple[str, str | None, int, tuple]]:
    return [
        (i.hook, i.step_id, i.sequence, decision(i))
        for i in out.record.invocations(stage)
        if step_id is None or i.step_id == step_id
    ]


def fits(arguments: dict[str, Any]) -> bool:
    try:
        SayArguments.model_validate(arguments)
    except ValueError:
        return False
    return True


def steps_by_id(out: Outcome):
    return {s.step_id: s for s in out.record.steps}


def tool_hook_summaries(out: Outcome) -> list[str]:
    return [a.summary for a in out.scheduled if a.activity_type in TOOL_STAGE_ACTIVITIES]


def hook_spans(spans, request_id: str, name: str) -> list:
    return [
        s
        for s in spans.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("pipeline.request_id") == request_id
    ]


ALLOWED = ("fail_closed", "continue", "allowed")
MODIFIED = ("fail_closed", "continue", "modified")
DENIED = ("fail_closed", "deny", "policy")
STOPPED = ("fail_closed", "stop", "stopped")
ACCEPTED = ("fail_closed", "continue", "accepted")
REWRITTEN = ("fail_closed", "continue", "rewritten")
HANDLED = ("fail_closed", "continue", "handled")


# --------------------------------------------------------------------------------------------------
# before_tool: allow (the zero value)
# --------------------------------------------------------------------------------------------------


async def test_a_hook_returning_nothing_or_the_zero_decision_allows_the_call(client, tmp_path):
    assert ToolDecision().action == "allow" and ToolDecision.allow() == ToolDecision()
    echo = Echo()
    returns_none = BeforeTool("returns-none", lambda call: None)
    returns_zero = BeforeTool("returns-zero", lambda call: ToolDecision())
    planner = FixedPlanner(step("s1", Echo, text="hi"), step("s2", Echo, text="there", times=2))
    async with Harness(client, tmp_path, hooks=[returns_none, returns_zero], tools=[echo], planner=planner) as h:
        out = await h.run("say hi")

    assert out.failure is None, out.failure
    assert sorted(echo.calls) == [("s1", {"text": "hi", "times": 1}), ("s2", {"text": "there", "times": 2})]
    assert executed_steps(out) == ["s1", "s2"]
    assert out.result.response == "echo/say (s1): hi\necho/say (s2): there there"
    for s in out.record.steps:
        assert s.status is StepStatus.SUCCEEDED
        assert s.modified_by == [] and s.skip_reason is None and s.skipped_by is None
    assert steps_by_id(out)["s2"].arguments == {"text": "there", "times": 2}
    for step_id in ("s1", "s2"):
        assert stage_invocations(out, Stage.BEFORE_TOOL, step_id) == [
            ("returns-none", step_id, 1, ALLOWED),
            ("returns-zero", step_id, 2, ALLOWED),
        ]
    # Both hooks saw the planned arguments; each step's hooks ran before its tool.
    assert returns_none.seen_steps() == returns_zero.seen_steps() == ["s1", "s2"]
    types = out.activity_types()
    assert types.index("before_tool_hook") < types.index("execute_tool_step")


# --------------------------------------------------------------------------------------------------
# before_tool: modify
# --------------------------------------------------------------------------------------------------


async def test_modify_rewrites_the_arguments_the_tool_receives_chained_in_registration_order(client, tmp_path):
    echo = Echo()

    def shout(call: ToolCall):
        if call.step_id != "s1":
            return None
        return ToolDecision.modify({**call.arguments, "text": call.arguments["text"].upper()}, reason="normalize")

    def repeat(call: ToolCall):
        if call.step_id != "s1":
            return None
        return ToolDecision.modify({**call.arguments, "times": 2})

    upper = BeforeTool("upper", shout)
    twice = BeforeTool("twice", repeat)
    planner = FixedPlanner(step("s1", Echo, text="hi"), step("s2", Echo, text="calm"))
    async with Harness(client, tmp_path, hooks=[upper, twice], tools=[echo], planner=planner) as h:
        out = await h.run("say hi twice")

    assert out.failure is None, out.failure
    # The second hook saw the first hook's rewrite, and the tool got the result of both.
    [twice_saw] = [c for c in twice.seen if c.step_id == "s1"]
    assert twice_saw.arguments == {"text": "HI"}
    assert sorted(echo.calls) == [("s1", {"text": "HI", "times": 2}), ("s2", {"text": "calm", "times": 1})]
    steps = steps_by_id(out)
    assert steps["s1"].arguments == {"text": "HI", "times": 2}
    assert steps["s1"].modified_by == ["upper", "twice"]
    assert steps["s2"].modified_by == [] and steps["s2"].arguments == {"text": "calm"}
    assert steps["s1"].status is StepStatus.SUCCEEDED and steps["s1"].output == "HI HI"
    assert out.result.response == "echo/say (s1): HI HI\necho/say (s2): calm"
    # The accepted plan keeps what the planner asked for; the step records what ran.
    assert out.record.plans[0].plan.steps[0].arguments == {"text": "hi"}
    assert stage_invocations(out, Stage.BEFORE_TOOL, "s1") == [
        ("upper", "s1", 1, MODIFIED),
        ("twice", "s1", 2, MODIFIED),
    ]
    assert stage_invocations(out, Stage.BEFORE_TOOL, "s2") == [("upper", "s2", 1, ALLOWED), ("twice", "s2", 2, ALLOWED)]


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        ({"text": ""}, "text"),
        ({"text": "hi", "colour": "red"}, "colour"),
        ({"times": 2}, "text"),
        ({"text": "hi", "times": 9}, "times"),
        (None, "a modify decision needs arguments"),
    ],
    ids=["too-short", "unknown-field", "missing-field", "out-of-range", "no-arguments"],
)
async def test_a_modify_that_fails_the_tools_parameters_is_an_extension_error_and_never_runs(
    client, tmp_path, arguments, fragment
):
    echo = Echo()
    rewriter = BeforeTool("rewriter", lambda call: ToolDecision(action="modify", arguments=arguments))
    watcher = AfterTool("watcher")
    planner = FixedPlanner(step("s1", Echo, text="hi"))
    async with Harness(client, tmp_path, hooks=[rewriter, watcher], tools=[echo], planner=planner) as h:
        out = await h.run("say hi")

    assert out.result is None
    assert out.failure is not None and out.failure.type == "ExtensionError", out.failure
    assert out.failure.non_retryable
    details = out.failure_details()
    assert details["extension"] == "rewriter" and details["phase"] == "before_tool"
    assert details["cause_type"] == "InvalidHookResult"
    assert fragment in details["cause"]
    if arguments is not None:
        assert details["cause"].startswith("rewritten arguments are invalid: ")
    assert "rewriter" in out.failure.message and "before_tool" in out.failure.message
    # Invalid rewritten arguments never reach execution.
    assert echo.calls == []
    assert "execute_tool_step" not in out.activity_types()
    assert "synthesize" not in out.activity_types()
    assert watcher.seen == {}
    [inv] = out.record.invocations(Stage.BEFORE_TOOL, "rewriter")
    assert inv.step_id == "s1" and inv.outcome.value == "failed"
    assert inv.error == details["cause"] and inv.error_type == "InvalidHookResult"
    assert decision(inv) == ("fail_closed", "terminate", "invalid_result")
    assert out.record.status is RequestStatus.FAILED
    assert out.record.error.type == "ExtensionError"
    assert out.record.error.details["extension"] == "rewriter"
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.request_completion == "failed"


async def test_before_tool_only_sees_arguments_that_resolved_and_validated(client, tmp_path):
    """before_tool runs once arguments are available *and validated*; a reference that cannot
    resolve skips the step as ``missing`` straight to after_tool, and invalid generated arguments take
    the normal failure path without reaching before_tool (or the tool)."""
    echo = Echo()
    gate = BeforeTool("gate")
    observer = AfterTool("observer")
    planner = FixedPlanner(
        step("long", Long, size=100),
        step("ok", Echo, depends_on=["long"], text="fine"),
        step("too-long", Echo, depends_on=["long"], text="{{steps.long.output}}"),
        step("no-field", Echo, depends_on=["long"], text="{{steps.long.output.missing}}"),
    )
    async with Harness(
        client,
        tmp_path,
        hooks=[gate, observer],
        tools=[echo, Long()],
        planner=planner,
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("chain them")

    assert out.failure is None, out.failure
    steps = steps_by_id(out)
    assert steps["ok"].status is StepStatus.SUCCEEDED
    # An unresolvable reference: skipped as missing, after_tool told so, before_tool never asked.
    assert (steps["no-field"].status, steps["no-field"].skip_reason) == (StepStatus.SKIPPED, "missing")
    assert "missing" in steps["no-field"].skip_detail
    assert (observer.seen["no-field"].status, observer.seen["no-field"].reason) == ("skipped", "missing")
    # Invalid resolved arguments (100 characters for a 40-character field) never reach the tool...
    assert [c for c in echo.calls if c[0] == "too-long"] == []
    assert steps["too-long"].status is StepStatus.FAILED
    assert "text" in (steps["too-long"].error or "")
    # ...and a before_tool hook only ever sees arguments that fit the tool's parameters.
    unvalidated = {c.step_id: c.arguments for c in gate.seen if c.agent == "echo" and not fits(c.arguments)}
    assert unvalidated == {}, f"before_tool saw arguments that fail the tool's parameters: {unvalidated}"
    assert gate.seen_steps() == ["long", "ok"]


# --------------------------------------------------------------------------------------------------
# before_tool: deny
# --------------------------------------------------------------------------------------------------


async def test_deny_skips_the_step_with_its_message_for_the_model_and_ends_the_chain(client, tmp_path, spans):
    echo = Echo()

    def deny(call: ToolCall):
        if call.step_id == "b":
            return ToolDecision.deny("Sending is disabled here.", reason="kill-switch")
        if call.step_id == "c":
            return ToolDecision(action="deny")
        return None

    first = BeforeTool("first")
    denier = BeforeTool("denier", deny)
    later = BeforeTool("later")
    observer = AfterTool("observer")
    planner = FixedPlanner(step("a", Echo, text="hi"), step("b", Echo, text="secret"), step("c", Echo, text="other"))
    async with Harness(client, tmp_path, hooks=[first, denier, later, observer], tools=[echo], planner=planner) as h:
        out = await h.run("say three things")

    # A denial is not an error: the request completes and the model reads the message.
    assert out.failure is None, out.failure
    assert out.result.response == (
        "echo/say (a): hi\n"
        "I skipped echo/say (b): Sending is disabled here.\n"
        "I skipped echo/say (c): echo/say was not run: denied by denier"
    )
    assert out.record.status is RequestStatus.SUCCEEDED
    assert [(s.step_id, s.status) for s in out.result.steps] == [("a", "succeeded"), ("b", "skipped"), ("c", "skipped")]
    # No activity for the denied tools.
    assert echo.calls == [("a", {"text": "hi", "times": 1})]
    assert executed_steps(out) == ["a"]

    steps = steps_by_id(out)
    b = steps["b"]
    assert (b.status, b.skip_reason, b.skipped_by, b.skip_detail) == (
        StepStatus.SKIPPED,
        "policy",
        "denier",
        "kill-switch",
    )
    assert b.result == "Sending is disabled here."
    assert b.output is None and b.error is None and b.duration_ms is None
    assert (steps["c"].skip_reason, steps["c"].skipped_by) == ("policy", "denier")
    assert steps["c"].result == "echo/say was not run: denied by denier"

    # The first deny ends the chain: the later hook never saw b or c.
    assert first.seen_steps() == denier.seen_steps() == ["a", "b", "c"]
    assert later.seen_steps() == ["a"]
    assert stage_invocations(out, Stage.BEFORE_TOOL, "b") == [("first", "b", 1, ALLOWED), ("denier", "b", 2, DENIED)]
    assert stage_invocations(out, Stage.BEFORE_TOOL, "a") == [
        ("first", "a", 1, ALLOWED),
        ("denier", "a", 2, ALLOWED),
        ("later", "a", 3, ALLOWED),
    ]
    # after_tool still runs on the skipped step, told who denied it.
    seen = observer.seen["b"]
    assert (seen.status, seen.reason, seen.extension) == ("skipped", "policy", "denier")
    assert seen.result == "Sending is disabled here." and seen.output is None
    # The spans say the same as the record.
    denier_spans = hook_spans(spans, out.workflow_id, "pipeline.hook.before_tool.denier")
    assert sorted(span_decision(s) for s in denier_spans) == sorted([ALLOWED, DENIED, DENIED])
    assert len(hook_spans(spans, out.workflow_id, "pipeline.hook.before_tool.later")) == 1


# --------------------------------------------------------------------------------------------------
# before_tool: stop
# --------------------------------------------------------------------------------------------------


class Watcher:
    """Observes the run-level stages a stopped run must or must not reach."""

    name = "watcher"
    max_attempts = 1

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.finished: list[Any] = []

    async def after_synthesis(self, ctx, response):
        self.calls.append("after_synthesis")
        return response

    async def after_answer(self, ctx, answer):
        self.calls.append("after_answer")

    async def on_error(self, ctx, error):
        self.calls.append("on_error")

    async def on_finish(self, ctx, outcome):
        self.calls.append("on_finish")
        self.finished.append(outcome.model_copy(deep=True))


async def test_stop_ends_the_run_with_the_hooks_text_and_cancels_running_steps(client, tmp_path):
    echo, slow = Echo(), Slow()

    class Stopper:
        name = "stopper"
        timeout_seconds = 60.0
        max_attempts = 1

        def __init__(self) -> None:
            self.seen: list[str] = []

        async def before_tool(self, ctx, call: ToolCall):
            self.seen.append(call.step_id)
            if call.step_id != "halt":
                return None
            await asyncio.wait_for(slow.started.wait(), timeout=30)  # the other step's tool is running
            return ToolDecision.stop("Cloud processing is disabled.", reason="cloud-disabled")

    stopper, watcher = Stopper(), Watcher()
    planner = FixedPlanner(
        step("slow", Slow), step("halt", Echo, text="hi"), step("after", Echo, text="later", depends_on=["halt"])
    )
    async with Harness(client, tmp_path, hooks=[stopper, watcher], tools=[echo, slow], planner=planner) as h:
        out = await h.run("do everything")
        assert not slow.finished  # the request did not wait for the running step

    expected = StopInfo(extension="stopper", phase="before_tool", reason="cloud-disabled")
    assert out.failure is None, out.failure
    assert out.result.response == "Cloud processing is disabled."
    assert out.result.stopped == expected
    assert out.record.status is RequestStatus.STOPPED
    assert out.record.stopped == expected
    assert out.record.final_response == "Cloud processing is disabled."
    stored = await out.stored()
    assert stored.status is RequestStatus.STOPPED and stored.request_completion == "stopped"
    assert stored.stopped == expected

    # The stopped step and the one depending on it never ran; the running one was cancelled.
    assert echo.calls == []
    assert executed_steps(out) == ["slow"]
    slow_scheduled = [
        e.event_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute_tool_step"
        and b"(slow)" in e.user_metadata.summary.data
    ]
    cancel_requested = [
        e.activity_task_cancel_requested_event_attributes.scheduled_event_id
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    ]
    assert cancel_requested == slow_scheduled
    assert not any(s.status is StepStatus.SUCCEEDED for s in out.record.steps)
    assert "after" not in stopper.seen

    # Stop text bypasses synthesis and answer transforms; only the finalizers run.
    types = out.activity_types()
    assert "synthesize" not in types and "after_synthesis_hook" not in types and "after_answer_hook" not in types
    assert out.record.invocations(Stage.AFTER_SYNTHESIS) == [] and out.record.invocations(Stage.AFTER_ANSWER) == []
    assert watcher.calls == ["on_finish"]
    [finish] = watcher.finished
    assert finish.status == "stopped"
    assert finish.response == "Cloud processing is disabled."
    assert finish.stopped == expected and finish.error is None
    assert stage_invocations(out, Stage.BEFORE_TOOL, "halt") == [("stopper", "halt", 1, STOPPED)]
    # The slow step's hooks ran in its own activity, cancelled with the run: the record says so.
    assert stage_invocations(out, Stage.BEFORE_TOOL, "slow") == []
    assert [(d.extension, d.error_type) for d in out.record.diagnostics if "step slow" in d.error] == [
        ("stopper", "Cancelled")
    ]


# --------------------------------------------------------------------------------------------------
# Failing tool-stage hooks
# --------------------------------------------------------------------------------------------------


def _raise(*_: Any) -> Any:
    raise RuntimeError("hook exploded")


FAILURES = {
    # (stage, failure): (the hook's callable, cause, cause_type)
    ("before_tool", "raise"): (_raise, "hook exploded", "HookError"),
    ("before_tool", "wrong_type"): (
        lambda *_: "deny",
        "before_tool must return ToolDecision or None, got str",
        "InvalidHookResult",
    ),
    ("after_tool", "raise"): (_raise, "hook exploded", "HookError"),
    ("after_tool", "wrong_type"): (lambda *_: 42, "after_tool must return str or None, got int", "InvalidHookResult"),
    ("on_tool_error", "raise"): (_raise, "hook exploded", "HookError"),
    (
        "on_tool_error",
        "wrong_type",
    ): (lambda *_: "handled", "on_tool_error must return ToolErrorResolution or None, got str", "InvalidHookResult"),
}


@pytest.mark.parametrize("run_mode", [RunMode.ACTIVITY, RunMode.LOCAL_ACTIVITY])
@pytest.mark.parametrize("stage, failure", list(FAILURES), ids=[f"{s}-{f}" for s, f in FAILURES])
async def test_a_failing_tool_stage_hook_ends_the_run_with_an_extension_error(
    client, tmp_path, stage, failure, run_mode
):
    fn, cause, cause_type = FAILURES[(stage, failure)]
    echo, broken = Echo(), Broken()
    faulty = {
        "before_tool": lambda: BeforeTool("faulty", fn),
        "after_tool": lambda: AfterTool("faulty", fn),
        "on_tool_error": lambda: OnToolError("faulty", fn),
    }[stage]()
    faulty.run_mode = run_mode
    failing_step = stage == "on_tool_error"
    planner = FixedPlanner(step("order", Broken) if failing_step else step("s1", Echo, text="hi"))
    watcher = Watcher()
    async with Harness(
        client,
        tmp_path,
        hooks=[faulty, watcher],
        tools=[echo, broken],
        planner=planner,
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("do it")

    step_id = "order" if failing_step else "s1"
    assert out.result is None
    assert out.failure is not None and out.failure.type == "ExtensionError", out.failure
    assert out.failure.non_retryable
    details = out.failure_details()
    assert (details["extension"], details["phase"], details["cause"], details["cause_type"]) == (
        "faulty",
        stage,
        cause,
        cause_type,
    )
    if failure == "raise":
        assert details["exception_type"] == "RuntimeError"
    assert out.failure.message == f"extension 'faulty' failed at {stage}: {cause}"
    [inv] = out.record.invocations(Stage(stage), "faulty")
    assert inv.step_id == step_id and inv.plan_phase == 1
    assert inv.outcome.value == "failed" and inv.error == cause and inv.error_type == cause_type
    assert decision(inv)[:2] == ("fail_closed", "terminate")
    assert out.record.status is RequestStatus.FAILED and out.record.error.type == "ExtensionError"
    assert out.record.error.details["phase"] == stage
    # The tool ran only if the hook came after it.
    assert executed_steps(out) == ([] if stage == "before_tool" else [step_id])
    assert "synthesize" not in out.activity_types()
    # The run's finalizers see the error and its origin.
    assert watcher.calls == ["on_error", "on_finish"]
    assert watcher.finished[0].status == "error" and watcher.finished[0].error.origin == "extension"
    if run_mode is RunMode.LOCAL_ACTIVITY:
        assert [a.local for a in out.scheduled if a.activity_type == f"{stage}_hook"] == [True]


# --------------------------------------------------------------------------------------------------
# after_tool
# --------------------------------------------------------------------------------------------------


async def test_after_tool_sees_every_outcome_and_rewrites_the_text_but_never_the_status(client, tmp_path):
    echo, broken = Echo(), Broken()

    def tamper(call: ToolCall, outcome: ToolOutcomeView):
        outcome.status = "executed"  # changing the view changes nothing
        outcome.output = "forged"
        return f"[1]{outcome.result}"

    denier = BeforeTool("denier", lambda call: ToolDecision.deny("No.") if call.step_id == "denied" else None)
    first = AfterTool("first", tamper)
    second = AfterTool("second", lambda call, outcome: f"[2]{outcome.result}")
    unchanged = AfterTool("unchanged", lambda call, outcome: outcome.result)
    passive = AfterTool("passive")
    planner = FixedPlanner(
        step("ok", Echo, text="hi"),
        step("denied", Echo, text="nope"),
        step("broken", Broken),
        step("blocked", Echo, depends_on=["broken"], text="never"),
    )
    async with Harness(
        client,
        tmp_path,
        hooks=[denier, first, second, unchanged, passive],
        tools=[echo, broken],
        planner=planner,
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("everything at once")

    assert out.failure is None, out.failure
    ok, denied, failed, missing = (first.seen[s] for s in ("ok", "denied", "broken", "blocked"))
    assert (ok.status, ok.output, ok.result, ok.reason, ok.error) == ("executed", "hi", "hi", None, None)
    assert (denied.status, denied.reason, denied.extension, denied.result, denied.output) == (
        "skipped",
        "policy",
        "denier",
        "No.",
        None,
    )
    assert (failed.status, failed.error, failed.result, failed.output) == (
        "failed",
        "broker offline",
        "error: broker offline",
        None,
    )
    assert (missing.status, missing.reason, missing.extension, missing.output) == ("skipped", "missing", None, None)
    assert missing.result == "dependency_not_succeeded: broken"
    # Rewrites chain in registration order.
    assert {s: v.result for s, v in second.seen.items()} == {
        "ok": "[1]hi",
        "denied": "[1]No.",
        "broken": "[1]error: broker offline",
        "blocked": "[1]dependency_not_succeeded: broken",
    }
    assert all(v.status == first.seen[s].status for s, v in second.seen.items())
    # A step skipped for a missing dependency goes straight to after_tool (no before_tool).
    assert denier.seen_steps() == ["broken", "denied", "ok"]
    assert echo.calls == [("ok", {"text": "hi", "times": 1})]

    steps = steps_by_id(out)
    assert {s: (v.status.value, v.result) for s, v in steps.items()} == {
        "ok": ("succeeded", "[2][1]hi"),
        "denied": ("skipped", "[2][1]No."),
        "broken": ("failed", "[2][1]error: broker offline"),
        "blocked": ("skipped", "[2][1]dependency_not_succeeded: broken"),
    }
    assert steps["ok"].output == "hi"  # the raw output is the tool's, not the hook's
    assert (
        steps["blocked"].skip_reason == "missing" and steps["blocked"].skip_detail == "dependency_not_succeeded: broken"
    )
    assert steps["broken"].error == "broker offline" and steps["broken"].error_handled_by is None
    assert out.result.response == (
        "echo/say (ok): [2][1]hi\n"
        "I skipped echo/say (denied): [2][1]No.\n"
        "I could not complete broker/place_order (broken): [2][1]error: broker offline\n"
        "I skipped echo/say (blocked): [2][1]dependency_not_succeeded: broken"
    )
    for step_id in ("ok", "denied", "broken", "blocked"):
        assert stage_invocations(out, Stage.AFTER_TOOL, step_id) == [
            ("first", step_id, 1, REWRITTEN),
            ("second", step_id, 2, REWRITTEN),
            ("unchanged", step_id, 3, ACCEPTED),
            ("passive", step_id, 4, ACCEPTED),
        ]


# --------------------------------------------------------------------------------------------------
# on_tool_error
# --------------------------------------------------------------------------------------------------


async def test_a_handled_tool_error_substitutes_the_result_and_the_first_handled_wins(client, tmp_path):
    echo, broken = Echo(), Broken()
    passes = OnToolError("passes")
    handler = OnToolError(
        "handler", lambda call, outcome: ToolErrorResolution(handled=True, result="The broker is down; try later.")
    )
    late = OnToolError("late", lambda call, outcome: ToolErrorResolution(handled=True, result="late"))
    observer = AfterTool("observer")
    # "then" runs only once "order" has succeeded: a handled error lets the plan go on.
    planner = FixedPlanner(step("order", Broken), step("ok", Echo, text="hi"), step("then", Echo, ["order"], text="go"))
    async with Harness(
        client,
        tmp_path,
        hooks=[passes, handler, late, observer],
        tools=[echo, broken],
        planner=planner,
        settings=StageSettings(tool_max_attempts=2),
    ) as h:
        out = await h.run("order")

    assert out.failure is None, out.failure
    assert broken.attempts == 2  # on_tool_error runs once the tool's retries are spent
    seen = passes.seen["order"]
    assert (seen.status, seen.error, seen.result) == ("failed", "broker offline", "error: broker offline")
    assert list(passes.seen) == ["order"]  # not offered a step that succeeded
    order = steps_by_id(out)["order"]
    # The error is suppressed: the step succeeded with the substitute, and the record keeps what failed.
    assert order.status is StepStatus.SUCCEEDED
    assert order.error is None and order.error_type is None
    assert order.recovered_from is not None
    assert (order.recovered_from.error, order.recovered_from.error_type) == ("broker offline", "RuntimeError")
    assert order.recovered_from.handled_by == "handler" and order.error_handled_by == "handler"
    assert order.result == order.output == "The broker is down; try later."
    assert (observer.seen["order"].status, observer.seen["order"].recovered_from) == ("executed", "broker offline")
    assert observer.seen["order"].result == "The broker is down; try later."
    # Its dependent ran, on the substitute; synthesis read it; the metrics still count the failure.
    assert steps_by_id(out)["then"].status is StepStatus.SUCCEEDED
    assert sorted(step_id for step_id, _ in echo.calls) == ["ok", "then"]
    assert out.result.response == (
        "broker/place_order (order) failed: The broker is down; try later.\necho/say (ok): hi\necho/say (then): go"
    )
    assert out.record.tool_metrics["broker/place_order"].failures == 1
    assert out.record.cache is not None and not out.record.cache.cacheable
    invocations = stage_invocations(out, Stage.ON_TOOL_ERROR)
    assert invocations[:2] == [("passes", "order", 1, ACCEPTED), ("handler", "order", 2, HANDLED)]
    assert all(step_id == "order" for _, step_id, _, _ in invocations)
    assert [s.status for s in out.result.steps] == ["succeeded", "succeeded", "succeeded"]


async def test_an_unhandled_tool_error_stays_the_steps_error(client, tmp_path):
    broken = Broken()
    passes = OnToolError("passes", lambda call, outcome: ToolErrorResolution(handled=False, result="ignored"))
    silent = OnToolError("silent")
    async with Harness(
        client,
        tmp_path,
        hooks=[passes, silent],
        tools=[broken],
        planner=FixedPlanner(step("order", Broken)),
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("order")

    assert out.failure is None, out.failure
    order = steps_by_id(out)["order"]
    assert (order.status, order.error, order.error_handled_by) == (StepStatus.FAILED, "broker offline", None)
    assert order.result == "error: broker offline"
    assert out.result.response == "I could not complete broker/place_order (order): error: broker offline"
    assert stage_invocations(out, Stage.ON_TOOL_ERROR) == [
        ("passes", "order", 1, ACCEPTED),
        ("silent", "order", 2, ACCEPTED),
    ]


# --------------------------------------------------------------------------------------------------
# The result cap
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [None, 100])
async def test_a_long_result_is_capped_after_the_hooks_have_seen_it_in_full(client, tmp_path, cap):
    limit = cap or 600
    measure = AfterTool("measure")
    expand = AfterTool("expand", lambda call, outcome: "R" * 1000 if call.step_id == "rewritten" else None)
    planner = FixedPlanner(
        step("long", Long, size=2000),
        step("exact", Long, size=limit),
        step("rewritten", Long, size=10),
    )
    settings = StageSettings(max_tool_result_chars=cap) if cap else None
    async with Harness(
        client, tmp_path, hooks=[measure, expand], tools=[Long()], planner=planner, settings=settings
    ) as h:
        out = await h.run("dump it")

    assert out.failure is None, out.failure
    assert StageSettings().max_tool_result_chars == 600
    # The hooks saw the whole text; the model reads it capped.
    assert measure.seen["long"].result == long_text(2000)
    assert measure.seen["long"].output == long_text(2000)
    steps = steps_by_id(out)
    assert len(steps["long"].result) == limit
    assert steps["long"].result == long_text(2000)[: limit - 1] + "…"
    assert steps["long"].output == long_text(2000)  # the record keeps the raw output
    assert steps["exact"].result == long_text(limit)  # at the cap: untouched
    # A hook's replacement is capped too.
    assert steps["rewritten"].result == "R" * (limit - 1) + "…"
    assert out.result.response.splitlines()[0] == f"dump/read (long): {steps['long'].result}"
    assert long_text(2000) not in out.result.response


# --------------------------------------------------------------------------------------------------
# Decisions, step ids, summaries and spans of every tool stage
# --------------------------------------------------------------------------------------------------


async def test_every_tool_stage_invocation_is_recorded_with_its_step_summary_and_span(client, tmp_path, spans):
    echo, broken = Echo(), Broken()

    def gatekeep(call: ToolCall):
        if call.step_id == "modified":
            return ToolDecision.modify({"text": "changed"})
        if call.step_id == "denied":
            return ToolDecision.deny("not today")
        return None

    class Rewriter:
        name = "rewriter"
        max_attempts = 1

        async def after_tool(self, ctx, call, outcome):
            return outcome.result.upper() if call.step_id == "modified" else None

        async def on_tool_error(self, ctx, call, outcome):
            return ToolErrorResolution(handled=True, result="substitute")

    planner = FixedPlanner(
        step("plain", Echo, text="a"),
        step("modified", Echo, text="b"),
        step("denied", Echo, text="c"),
        step("failing", Broken),
    )
    async with Harness(
        client,
        tmp_path,
        hooks=[BeforeTool("gate", gatekeep), Rewriter()],
        tools=[echo, broken],
        planner=planner,
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("record everything")

    assert out.failure is None, out.failure
    recorded = {
        (i.stage.value, i.hook, i.step_id): (i.sequence, i.plan_phase, i.outcome.value, decision(i))
        for i in out.record.pipeline_hooks
        if i.stage in (Stage.BEFORE_TOOL, Stage.AFTER_TOOL, Stage.ON_TOOL_ERROR)
    }
    assert recorded == {
        ("before_tool", "gate", "plain"): (1, 1, "succeeded", ALLOWED),
        ("before_tool", "gate", "modified"): (1, 1, "succeeded", MODIFIED),
        ("before_tool", "gate", "denied"): (1, 1, "succeeded", DENIED),
        ("before_tool", "gate", "failing"): (1, 1, "succeeded", ALLOWED),
        ("on_tool_error", "rewriter", "failing"): (1, 1, "succeeded", HANDLED),
        ("after_tool", "rewriter", "plain"): (1, 1, "succeeded", ACCEPTED),
        ("after_tool", "rewriter", "modified"): (1, 1, "succeeded", REWRITTEN),
        ("after_tool", "rewriter", "denied"): (1, 1, "succeeded", ACCEPTED),
        ("after_tool", "rewriter", "failing"): (1, 1, "succeeded", ACCEPTED),
    }
    assert len([i for i in out.record.pipeline_hooks if i.step_id]) == 9
    assert sorted(tool_hook_summaries(out)) == sorted(
        f"{stage} · {hook} · {step_id}" for stage, hook, step_id in recorded
    )
    # Per step: before_tool, (execute, on_tool_error,) after_tool.
    order = [
        a.activity_type
        for a in out.scheduled
        if a.summary and (a.summary.endswith("· failing") or a.summary.endswith("(failing)"))
    ]
    assert order == ["before_tool_hook", "execute_tool_step", "on_tool_error_hook", "after_tool_hook"]
    assert steps_by_id(out)["modified"].result == "CHANGED"
    # One span per invocation, carrying the recorded decision.
    for (stage, hook, _), (_, _, _, expected) in recorded.items():
        assert expected in [
            span_decision(s) for s in hook_spans(spans, out.workflow_id, f"pipeline.hook.{stage}.{hook}")
        ]
    for stage, count in (("before_tool", 4), ("after_tool", 4), ("on_tool_error", 1)):
        found = hook_spans(
            spans, out.workflow_id, f"pipeline.hook.{stage}.{'gate' if stage == 'before_tool' else 'rewriter'}"
        )
        assert len(found) == count
        assert all(s.attributes["pipeline.hook.stage"] == stage for s in found)
