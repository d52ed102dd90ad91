"""Plugins: named bundles of tool hooks, the four shipped plugins through
real requests, how plugins are registered and scheduled, and per-tool metrics in the execution record
and as OpenTelemetry metrics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.enums.v1 import EventType

from activities import Tool
from activities.telemetry import TOOL_CALLS_METRIC, TOOL_DURATION_METRIC, TOOL_FAILURES_METRIC
from activities.tools import ToolContext
from demo.tools import quote_price
from hooks import (
    HookRegistry,
    InvalidPipelineConfigError,
    PlanStep,
    Plugin,
    RunMode,
    Stage,
    ToolDecision,
    allow_list,
    redact,
    retry_on_error,
    truncate_results,
)
from workflows.models import EffectStatus, Plan, RequestStatus, StageSettings, StepStatus

from .doubles import FixedPlanner, NoArguments, decision, quote
from .harness import Harness, Outcome

SK = "sk-test1234567890abcdefABCDEF"
AKIA = "AKIAIOSFODNN7EXAMPLE"
ACME = f"ACME is trading at {quote_price('ACME')} USD."
NOT_AVAILABLE = "The tool demo-tools/stock-service/execute_trade is not available in this deployment."

# --------------------------------------------------------------------------------------------------
# Test tools and helpers
# --------------------------------------------------------------------------------------------------


def trade(step_id: str = "trade") -> PlanStep:
    return PlanStep(
        step_id=step_id,
        namespace="demo-tools",
        agent="stock-service",
        capability="execute_trade",
        arguments={"symbol": "ACME", "side": "buy", "quantity": 5},
    )


class PathArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, max_length=200)


class Reader(Tool):
    """Returns the content of a "file" it holds (a config, a log line): the result a model then reads.
    The content is never in the step's arguments, so only the result can carry it."""

    namespace = "test-tools"
    agent = "files"
    capability = "read"
    read_only = True
    Arguments = PathArguments

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = files or {}

    async def run(self, arguments: PathArguments, ctx: ToolContext):
        return self.files.get(arguments.path, "(empty)")


class Failing(Tool):
    namespace = "test-tools"
    agent = "broker"
    capability = "place_order"
    Arguments = NoArguments

    def __init__(self, message: str = "broker offline") -> None:
        self.message = message
        self.attempts = 0

    async def run(self, arguments, ctx: ToolContext):
        self.attempts += 1
        raise RuntimeError(self.message)


def step(step_id: str, tool: type[Tool], **arguments: Any) -> PlanStep:
    return PlanStep(
        step_id=step_id, namespace=tool.namespace, agent=tool.agent, capability=tool.capability, arguments=arguments
    )


def read(step_id: str, path: str | None = None) -> PlanStep:
    return step(step_id, Reader, path=path or step_id)


class TwoPhasePlanner:
    """Plans ``steps`` in phase 1 and asks to plan again; phase 2 records what it was shown and stops."""

    name = "two-phase-planner"

    def __init__(self, *steps: PlanStep) -> None:
        self.steps = steps
        self.prior_results: list = []
        self.prompts: list[str] = []

    async def plan(self, request) -> Plan:
        self.prompts.append(request.prompt)
        if request.phase == 1:
            return Plan(phase=1, steps=[s.model_copy(deep=True) for s in self.steps], continue_after=True)
        self.prior_results = [r.model_copy(deep=True) for r in request.prior_results]
        return Plan(phase=request.phase, steps=[])


def steps_by_id(out: Outcome):
    return {s.step_id: s for s in out.record.steps}


def executed_steps(out: Outcome) -> list[str]:
    return [a.summary.rsplit("(", 1)[1].rstrip(")") for a in out.tool_activities]


def server_scheduled_types(out: Outcome) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in out.history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


# --------------------------------------------------------------------------------------------------
# A plugin is a named bundle of tool hooks
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", None, 7])
def test_a_plugin_without_a_name_is_refused(name):
    with pytest.raises(ValueError, match="non-empty name"):
        Plugin(name, before_tool=lambda ctx, call: None)
    for factory in (
        lambda: allow_list(["a/b"], name=name),
        lambda: redact(name=name),
        lambda: retry_on_error(name=name),
        lambda: truncate_results(10, name=name),
    ):
        with pytest.raises(ValueError, match="non-empty name"):
            factory()


def test_a_plugin_whose_name_was_blanked_is_refused_by_the_registry():
    plugin = redact()
    plugin.name = ""
    with pytest.raises(InvalidPipelineConfigError) as err:
        HookRegistry([plugin])
    assert err.value.reason == "empty_name" and err.value.index == 0


@pytest.mark.parametrize(
    "plugins, index, name",
    [
        (lambda: [allow_list(["echo/say"]), allow_list(["files/read"])], 1, "allow-list"),
        (lambda: [redact(name="guard"), truncate_results(100, name="guard")], 1, "guard"),
        (lambda: [retry_on_error(), redact(), retry_on_error()], 2, "retry-on-error"),
    ],
    ids=["same-factory", "different-plugins-one-name", "not-adjacent"],
)
def test_two_plugins_with_the_same_name_are_refused_by_the_registry(plugins, index, name):
    with pytest.raises(InvalidPipelineConfigError) as err:
        HookRegistry(plugins())
    assert err.value.reason == "duplicate_name"
    assert (err.value.index, err.value.hook) == (index, name)
    assert repr(name) in str(err.value)


def test_a_plugin_name_must_also_be_unique_among_ordinary_hooks():
    class Hook:
        name = "redact"

        def after_synthesis(self, ctx, response):
            return response

    with pytest.raises(InvalidPipelineConfigError) as err:
        HookRegistry([Hook(), redact()])
    assert (err.value.reason, err.value.index, err.value.hook) == ("duplicate_name", 1, "redact")


def test_a_plugin_without_stages_or_with_a_wrong_signature_is_refused():
    with pytest.raises(InvalidPipelineConfigError) as err:
        HookRegistry([Plugin("nothing")])
    assert err.value.reason == "no_stage" and err.value.hook == "nothing"
    with pytest.raises(InvalidPipelineConfigError) as err:
        HookRegistry([Plugin("one-arg", before_tool=lambda call: None)])
    assert err.value.reason == "signature_mismatch" and err.value.hook == "one-arg"
    with pytest.raises(ValueError, match="max_chars"):
        truncate_results(0)


def test_a_plugin_is_registered_only_at_the_stages_it_bundles_as_a_local_activity():
    registry = HookRegistry([allow_list(["echo/say"]), redact(), retry_on_error(), truncate_results(10)])
    assert [(e.name, e.stages) for e in registry.entries] == [
        ("allow-list", [Stage.BEFORE_TOOL]),
        ("redact", [Stage.AFTER_TOOL]),
        ("retry-on-error", [Stage.ON_TOOL_ERROR]),
        ("truncate-results", [Stage.AFTER_TOOL]),
    ]
    assert all(e.run_mode is RunMode.LOCAL_ACTIVITY for e in registry.entries)
    assert all(e.max_attempts == 1 and e.timeout_seconds == 5.0 for e in registry.entries)


# --------------------------------------------------------------------------------------------------
# allow_list
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "allowed",
    [["stock-service/stock_quote"], ["demo-tools/stock-service/stock_quote"]],
    ids=["agent/capability", "namespace/agent/capability"],
)
async def test_allow_list_denies_a_tool_not_named_and_the_model_reads_the_denial(client, tmp_path, allowed):
    planner = FixedPlanner(quote("quote-acme", "ACME"), trade())
    async with Harness(client, tmp_path, hooks=[allow_list(allowed)], planner=planner) as h:
        out = await h.run("quote ACME and buy 5")

    assert out.failure is None, out.failure
    assert out.result.response == f"{ACME}\nI skipped stock-service/execute_trade (trade): {NOT_AVAILABLE}"
    assert executed_steps(out) == ["quote-acme"]
    assert not (tmp_path / "ledger.jsonl").exists()  # the trade never reached the ledger
    steps = steps_by_id(out)
    assert steps["quote-acme"].status is StepStatus.SUCCEEDED
    denied = steps["trade"]
    assert (denied.status, denied.skip_reason, denied.skipped_by) == (StepStatus.SKIPPED, "policy", "allow-list")
    assert denied.skip_detail == "not on the allow-list" and denied.result == NOT_AVAILABLE
    by_step = {i.step_id: decision(i) for i in out.record.invocations(Stage.BEFORE_TOOL, "allow-list")}
    assert by_step == {
        "quote-acme": ("fail_closed", "continue", "allowed"),
        "trade": ("fail_closed", "deny", "policy"),
    }
    assert out.record.tool_metrics["stock-service/execute_trade"].skipped == 1
    assert out.record.tool_metrics["stock-service/execute_trade"].calls == 0


@pytest.mark.parametrize(
    "allowed",
    [["other-tools/stock-service/stock_quote"], ["stock_quote"], ["stock-service"], []],
    ids=["other-namespace", "capability-only", "agent-only", "empty"],
)
async def test_allow_list_allows_only_an_exact_tool_name(client, tmp_path, allowed):
    plugin = allow_list(allowed, name="kill-switch", message="Ask an admin for this tool.")
    async with Harness(client, tmp_path, hooks=[plugin], planner=FixedPlanner(quote("quote-acme", "ACME"))) as h:
        out = await h.run("quote ACME")

    assert out.failure is None, out.failure
    assert executed_steps(out) == []
    [s] = out.record.steps
    assert (s.status, s.skipped_by, s.result) == (StepStatus.SKIPPED, "kill-switch", "Ask an admin for this tool.")
    assert out.result.response == "I skipped stock-service/stock_quote (quote-acme): Ask an admin for this tool."


# --------------------------------------------------------------------------------------------------
# redact
# --------------------------------------------------------------------------------------------------


async def test_redact_masks_secrets_in_a_result_before_the_planner_or_synthesizer_reads_it(client, tmp_path):
    leaky = f"config: api_key={SK} aws={AKIA} region=eu-west-1"
    planner = TwoPhasePlanner(read("leaky"), read("clean"))
    near_misses = "all clear: ticket sk-123, task-abcdefghijklmnopqrstuvwxyz0123, AKIA1234 and risk-0123456789abcdefgh"
    reader = Reader({"leaky": leaky, "clean": near_misses})
    async with Harness(client, tmp_path, hooks=[redact()], tools=[reader], planner=planner) as h:
        out = await h.run("read the config")

    assert out.failure is None, out.failure
    masked = "config: api_key=[REDACTED] aws=[REDACTED] region=eu-west-1"
    assert out.result.response == f"files/read (leaky): {masked}\nfiles/read (clean): {near_misses}"
    assert out.record.model_draft.matches(out.result.response)  # the synthesizer never saw the secrets
    steps = steps_by_id(out)
    assert steps["leaky"].result == masked
    assert steps["leaky"].output == leaky  # the raw output stays in the record
    assert steps["clean"].result == near_misses  # conservative patterns: look-alikes are left alone
    # The planner of the next phase read the masked result only.
    shown = json.dumps([r.model_dump(mode="json") for r in planner.prior_results])
    assert [r.step_id for r in planner.prior_results] == ["leaky", "clean"]
    assert planner.prior_results[0].result == masked
    assert SK not in shown and AKIA not in shown
    assert not any(SK in p or AKIA in p for p in planner.prompts)
    # One effect per redacted step, with counts and never the secret.
    effect = out.record.effect("redaction:leaky")
    assert effect is not None
    assert (effect.hook, effect.stage, effect.status) == ("redact", Stage.AFTER_TOOL, EffectStatus.SUCCEEDED)
    assert effect.data == {"redactions": 2, "by_pattern": {"api_key_sk": 1, "aws_access_key_id": 1}}
    assert effect.summary == "2 value(s) masked as [REDACTED]"
    assert SK not in json.dumps(effect.model_dump(mode="json")) and AKIA not in json.dumps(
        effect.model_dump(mode="json")
    )
    assert out.record.effect("redaction:clean") is None
    by_step = {i.step_id: decision(i) for i in out.record.invocations(Stage.AFTER_TOOL, "redact")}
    assert by_step == {
        "leaky": ("fail_closed", "continue", "rewritten"),
        "clean": ("fail_closed", "continue", "accepted"),
    }
    stored = await out.stored()
    assert stored.effect("redaction:leaky").data["redactions"] == 2
    assert SK not in stored.final_response


async def test_redact_keeps_a_secret_in_a_tool_error_from_the_model(client, tmp_path):
    failing = Failing(f"authentication failed for key {SK}")
    planner = TwoPhasePlanner(step("order", Failing))
    async with Harness(
        client,
        tmp_path,
        hooks=[redact()],
        tools=[failing],
        planner=planner,
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("place the order")

    assert out.failure is None, out.failure
    order = steps_by_id(out)["order"]
    assert order.status is StepStatus.FAILED
    assert order.result == "error: authentication failed for key [REDACTED]"
    assert out.record.effect("redaction:order").data["redactions"] == 1
    # Neither the next planning phase nor the synthesizer may read the secret.
    shown = json.dumps([r.model_dump(mode="json") for r in planner.prior_results])
    assert [r.step_id for r in planner.prior_results] == ["order"]
    leaks = {where: text for where, text in (("planner", shown), ("synthesizer", out.result.response)) if SK in text}
    assert leaks == {}, f"the secret reached the model: {leaks}"


# --------------------------------------------------------------------------------------------------
# retry_on_error
# --------------------------------------------------------------------------------------------------


async def test_retry_on_error_reports_a_tool_failure_as_a_readable_result(client, tmp_path):
    failing = Failing()
    async with Harness(
        client,
        tmp_path,
        hooks=[retry_on_error()],
        tools=[failing, Reader({"ok": "fine"})],
        planner=FixedPlanner(step("order", Failing), read("ok")),
        settings=StageSettings(tool_max_attempts=2),
    ) as h:
        out = await h.run("place the order")

    assert out.failure is None, out.failure
    readable = "The tool test-tools/broker/place_order failed: broker offline. Try another approach or tell the user."
    order = steps_by_id(out)["order"]
    # Handled: the step succeeds with the readable result, so the plan can go on; the error is kept.
    assert (order.status, order.error, order.error_handled_by) == (StepStatus.SUCCEEDED, None, "retry-on-error")
    assert order.recovered_from is not None and order.recovered_from.error == "broker offline"
    assert order.result == order.output == readable
    assert failing.attempts == 2  # the tool's own retries come first
    assert out.result.response == f"broker/place_order (order) failed: {readable}\nfiles/read (ok): fine"
    [inv] = out.record.invocations(Stage.ON_TOOL_ERROR, "retry-on-error")
    assert inv.step_id == "order" and decision(inv) == ("fail_closed", "continue", "handled")
    assert out.record.tool_metrics["broker/place_order"].failures == 1


# --------------------------------------------------------------------------------------------------
# truncate_results
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_chars", [10, 13, 60, 200])
async def test_truncate_results_caps_the_result_that_reaches_the_model(client, tmp_path, max_chars):
    long = "".join(f"line {i:03d}. " for i in range(40))  # 400 characters
    seen: dict[str, str] = {}

    def after(ctx, call, outcome):
        seen[call.step_id] = outcome.result

    plugins = [truncate_results(max_chars), Plugin("after-truncation", after_tool=after)]
    planner = FixedPlanner(read("long"), read("short"))
    reader = Reader({"long": long, "short": "tiny"})
    async with Harness(client, tmp_path, hooks=plugins, tools=[reader], planner=planner) as h:
        out = await h.run("read it")

    assert out.failure is None, out.failure
    steps = steps_by_id(out)
    result = steps["long"].result
    assert len(result) <= max_chars, f"truncate_results({max_chars}) let {len(result)} characters through: {result!r}"
    if max_chars >= len(" …[truncated]"):
        assert result.endswith(" …[truncated]")
        assert long.startswith(result.removesuffix(" …[truncated]"))
    assert steps["long"].output == long  # the record keeps the raw output
    assert steps["short"].result == "tiny"
    assert seen == {"long": result, "short": "tiny"}  # later hooks read the truncated text
    assert out.result.response.splitlines()[0] == f"files/read (long): {result}"
    by_step = {i.step_id: decision(i)[2] for i in out.record.invocations(Stage.AFTER_TOOL, "truncate-results")}
    assert by_step == {"long": "rewritten", "short": "accepted"}


# --------------------------------------------------------------------------------------------------
# How plugins run
# --------------------------------------------------------------------------------------------------


async def test_plugins_run_as_local_activities_with_summaries(client, tmp_path):
    observed: list[str] = []

    async def observe_async(ctx, call, outcome):
        observed.append(call.step_id)

    plugins = [
        allow_list(["files/read", "broker/place_order"]),
        redact(),
        retry_on_error(),
        truncate_results(100),
        Plugin("server-side", after_tool=observe_async, run_mode=RunMode.ACTIVITY),
    ]
    async with Harness(
        client,
        tmp_path,
        hooks=plugins,
        tools=[Reader({"r": "hello"}), Failing()],
        planner=FixedPlanner(read("r"), step("f", Failing)),
        settings=StageSettings(tool_max_attempts=1),
    ) as h:
        out = await h.run("read and order")

    assert out.failure is None, out.failure
    local = sorted((a.activity_type, a.summary) for a in out.scheduled if a.local and a.activity_type.endswith("_hook"))
    assert local == sorted(
        [
            ("before_tool_hook", "before_tool · allow-list · r"),
            ("before_tool_hook", "before_tool · allow-list · f"),
            ("after_tool_hook", "after_tool · redact · r"),
            ("after_tool_hook", "after_tool · redact · f"),
            ("after_tool_hook", "after_tool · truncate-results · r"),
            ("after_tool_hook", "after_tool · truncate-results · f"),
            ("on_tool_error_hook", "on_tool_error · retry-on-error · f"),
        ]
    )
    # Local activities are markers, not server-scheduled activities; a plugin may opt out.
    server = server_scheduled_types(out)
    assert "before_tool_hook" not in server and "on_tool_error_hook" not in server
    assert server.count("after_tool_hook") == 2
    assert sorted(a.summary for a in out.scheduled if not a.local and a.activity_type == "after_tool_hook") == [
        "after_tool · server-side · f",
        "after_tool · server-side · r",
    ]
    assert sorted(observed) == ["f", "r"]  # an async plugin function works like a plain one
    # Every invocation names its plugin in the record.
    names = {(i.hook, i.stage.value, i.step_id) for i in out.record.pipeline_hooks}
    assert names == {
        ("allow-list", "before_tool", "r"),
        ("allow-list", "before_tool", "f"),
        ("redact", "after_tool", "r"),
        ("redact", "after_tool", "f"),
        ("truncate-results", "after_tool", "r"),
        ("truncate-results", "after_tool", "f"),
        ("server-side", "after_tool", "r"),
        ("server-side", "after_tool", "f"),
        ("retry-on-error", "on_tool_error", "f"),
    }


@pytest.mark.parametrize(
    "plugin, phase, cause, cause_type, exception_type",
    [
        (
            lambda: Plugin("exploder", after_tool=lambda ctx, call, outcome: 1 / 0),
            "after_tool",
            "division by zero",
            "HookError",
            "ZeroDivisionError",
        ),
        (
            lambda: Plugin("yes-man", before_tool=lambda ctx, call: True),
            "before_tool",
            "before_tool must return ToolDecision or None, got bool",
            "InvalidHookResult",
            None,
        ),
        (
            lambda: Plugin("rewriter", before_tool=lambda ctx, call: ToolDecision.modify({"path": ""})),
            "before_tool",
            "rewritten arguments are invalid",
            "InvalidHookResult",
            None,
        ),
    ],
    ids=["raises", "wrong-type", "invalid-modify"],
)
async def test_a_failing_plugin_ends_the_run_with_an_extension_error_naming_it(
    client, tmp_path, plugin, phase, cause, cause_type, exception_type
):
    plugin = plugin()
    async with Harness(
        client, tmp_path, hooks=[plugin], tools=[Reader({"r": "hello"})], planner=FixedPlanner(read("r"))
    ) as h:
        out = await h.run("read it")

    assert out.failure is not None and out.failure.type == "ExtensionError", out.failure
    assert out.failure.non_retryable
    details = out.failure_details()
    assert (details["extension"], details["phase"], details["cause_type"]) == (plugin.name, phase, cause_type)
    assert details["cause"].startswith(cause)
    assert details.get("exception_type") == exception_type
    assert plugin.name in out.failure.message
    [inv] = out.record.invocations(Stage(phase), plugin.name)
    assert inv.step_id == "r" and decision(inv)[:2] == ("fail_closed", "terminate")
    assert out.record.status is RequestStatus.FAILED
    assert executed_steps(out) == ([] if phase == "before_tool" else ["r"])


# --------------------------------------------------------------------------------------------------
# Per-tool metrics
# --------------------------------------------------------------------------------------------------


class ProbeArguments(BaseModel):
    n: int = 0  # two probes with different values are two calls (identical ones would run once)


class ProbeOk(Tool):
    namespace = "test-tools"
    agent = "metrics-probe"
    capability = "ok"
    read_only = True
    Arguments = ProbeArguments

    async def run(self, arguments, ctx):
        return "fine"


class ProbeFail(Tool):
    namespace = "test-tools"
    agent = "metrics-probe"
    capability = "fail"
    Arguments = NoArguments

    async def run(self, arguments, ctx):
        raise RuntimeError("probe failed")


def metric_points(reader, name: str) -> dict[tuple, float]:
    """Cumulative value (counters) or count (histograms) per label set."""
    points: dict[tuple, float] = {}
    data = reader.get_metrics_data()
    if data is None:
        return points
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    value = point.count if hasattr(point, "count") else point.value
                    points[tuple(sorted(point.attributes.items()))] = value
    return points


def histogram_sums(reader, name: str) -> dict[tuple, float]:
    sums: dict[tuple, float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        sums[tuple(sorted(point.attributes.items()))] = point.sum
    return sums


def delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def labels(**values: str) -> tuple:
    return tuple(sorted(values.items()))


async def test_per_tool_metrics_are_in_the_record_and_exported_as_otel_metrics(client, tmp_path, metric_reader):
    deny_one = Plugin(
        "deny-one",
        before_tool=lambda ctx, call: ToolDecision.deny("not this one") if call.step_id == "denied" else None,
    )
    planner = FixedPlanner(
        step("ok-1", ProbeOk, n=1), step("ok-2", ProbeOk, n=2), step("denied", ProbeOk, n=3), step("fail-1", ProbeFail)
    )
    names = (TOOL_CALLS_METRIC, TOOL_FAILURES_METRIC, TOOL_DURATION_METRIC)
    async with Harness(
        client,
        tmp_path,
        hooks=[deny_one, retry_on_error()],
        tools=[ProbeOk(), ProbeFail()],
        planner=planner,
        settings=StageSettings(tool_max_attempts=2),
    ) as h:
        before = {name: metric_points(metric_reader, name) for name in names}
        out = await h.run("probe")
        after = {name: metric_points(metric_reader, name) for name in names}

    assert out.failure is None, out.failure
    # In the record: executions per tool (not attempts), failures, skipped steps, durations.
    metrics = out.record.tool_metrics
    assert set(metrics) == {"metrics-probe/ok", "metrics-probe/fail"}
    ok, fail = metrics["metrics-probe/ok"], metrics["metrics-probe/fail"]
    assert (ok.calls, ok.failures, ok.skipped) == (2, 0, 1)
    assert (fail.calls, fail.failures, fail.skipped) == (1, 1, 0)  # handled by retry-on-error, still a failure
    steps = steps_by_id(out)
    assert ok.total_duration_ms == pytest.approx(steps["ok-1"].duration_ms + steps["ok-2"].duration_ms)
    assert ok.max_duration_ms == max(steps["ok-1"].duration_ms, steps["ok-2"].duration_ms)
    assert fail.total_duration_ms == pytest.approx(steps["fail-1"].duration_ms) == fail.max_duration_ms
    assert steps["denied"].duration_ms is None
    stored = await out.stored()
    assert stored.tool_metrics == metrics

    # As OpenTelemetry metrics: every attempt, labelled by tool and outcome; the denied step is not a call.
    ok_label = labels(tool="metrics-probe/ok", outcome="succeeded")
    fail_label = labels(tool="metrics-probe/fail", outcome="failed")
    assert delta(before[TOOL_CALLS_METRIC], after[TOOL_CALLS_METRIC]) == {ok_label: 2, fail_label: 2}
    assert delta(before[TOOL_FAILURES_METRIC], after[TOOL_FAILURES_METRIC]) == {labels(tool="metrics-probe/fail"): 2}
    assert delta(before[TOOL_DURATION_METRIC], after[TOOL_DURATION_METRIC]) == {ok_label: 2, fail_label: 2}
    sums = histogram_sums(metric_reader, TOOL_DURATION_METRIC)
    assert sums[ok_label] >= 0 and sums[fail_label] >= 0
