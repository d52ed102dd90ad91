"""The shadow evaluator on its own: a candidate pipeline's decision stages against a hand-made record (the
end-to-end replay over recorded demo traffic is tests/test_policy_replay.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from activities import LifecycleActivities, ToolRegistry
from activities.policy_replay import ShadowEvaluator
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import demo_tools
from hooks import HookRegistry, NotReplayed, PipelineHook
from hooks.builtin import AllowedOperationsHook
from storage.executions import SQLiteExecutionStore
from workflows.models import (
    AcceptedPlan,
    ExecutionRecord,
    FindingKind,
    Plan,
    PlanStep,
    RequestStatus,
    RunMode,
    StepResult,
    StepStatus,
    ToolDecision,
)

NOW = datetime(2026, 11, 30, tzinfo=UTC)
QUOTE = "demo-tools/stock-service/stock_quote"


def _pipeline(tmp_path: Path, *hooks) -> LifecycleActivities:
    return LifecycleActivities(
        registry=HookRegistry(list(hooks)),
        tools=ToolRegistry(demo_tools(tmp_path)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(tmp_path / "executions.sqlite3"),
    )


def _record(**step) -> ExecutionRecord:
    """A request that quoted ACME."""
    plan = Plan(
        phase=1,
        steps=[
            PlanStep(
                step_id="quote-acme",
                namespace="demo-tools",
                agent="stock-service",
                capability="stock_quote",
                arguments={"symbol": "ACME"},
            )
        ],
    )
    result = {
        "step_id": "quote-acme",
        "tool": "stock-service/stock_quote",
        "status": StepStatus.SUCCEEDED,
        "arguments": {"symbol": "ACME"},
        **step,
    }
    return ExecutionRecord(
        request_id="r1",
        workflow_id="request-r1",
        run_id="run-1",
        request="What is the price of ACME?",
        metadata={"tenant_id": "t1"},
        status=RequestStatus.SUCCEEDED,
        started_at=NOW,
        plans=[AcceptedPlan(phase=1, plan=plan, accepted_at=NOW)],
        steps=[StepResult(**result)],
    )


class Deny(PipelineHook):
    name = "deny-quotes"

    def __init__(self, **options) -> None:
        self.__dict__.update(options)
        self.seen_shadow: list[bool] = []

    def before_tool(self, ctx, call):
        self.seen_shadow.append(ctx.shadow)
        return ToolDecision.deny("no quotes today")


class OptOut(PipelineHook):
    name = "opt-out"

    def before_tool(self, ctx, call):
        if ctx.shadow:
            raise NotReplayed("writes to the ledger")
        return None


class Rewrite(PipelineHook):
    name = "uppercase"

    def before_tool(self, ctx, call):
        return ToolDecision.modify({"symbol": "ACMX"})


class MarkForReview(PipelineHook):
    name = "review-quotes"

    def after_planning(self, ctx, plan):
        for step in plan.steps:
            step.metadata["approval_required"] = "quotes need a second pair of eyes"
        return plan


def _kinds(replay) -> list[tuple[FindingKind, str | None]]:
    return [(f.kind, f.hook) for f in replay.findings]


@pytest.mark.asyncio
async def test_an_in_process_hook_runs_in_shadow_and_its_denial_is_newly_blocked(tmp_path: Path) -> None:
    hook = Deny()
    replay = await ShadowEvaluator(_pipeline(tmp_path, hook)).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.NEWLY_BLOCKED, "deny-quotes")]
    assert hook.seen_shadow == [True]
    assert replay.findings[0].candidate == "deny: no quotes today"
    assert replay.tenant == "t1" and replay.calls == 1


@pytest.mark.asyncio
async def test_a_hook_that_calls_out_runs_only_when_shadow_safe(tmp_path: Path) -> None:
    remote = Deny(run_mode=RunMode.ACTIVITY)
    replay = await ShadowEvaluator(_pipeline(tmp_path, remote)).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.NOT_REPLAYED, "deny-quotes")]
    assert remote.seen_shadow == []  # never called, and never read as an allow

    marked = Deny(calls_service=True)
    assert _kinds(await ShadowEvaluator(_pipeline(tmp_path, marked)).evaluate(_record())) == [
        (FindingKind.NOT_REPLAYED, "deny-quotes")
    ]

    safe = Deny(run_mode=RunMode.ACTIVITY, shadow_safe=True)
    replay = await ShadowEvaluator(_pipeline(tmp_path, safe)).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.NEWLY_BLOCKED, "deny-quotes")]


@pytest.mark.asyncio
async def test_a_hook_may_opt_out_of_replay(tmp_path: Path) -> None:
    replay = await ShadowEvaluator(_pipeline(tmp_path, OptOut())).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.NOT_REPLAYED, "opt-out")]
    assert replay.findings[0].detail == "writes to the ledger"


@pytest.mark.asyncio
async def test_a_recorded_denial_the_candidate_lifts_is_newly_allowed(tmp_path: Path) -> None:
    denied = _record(status=StepStatus.SKIPPED, skip_reason="policy", skipped_by="allow-list", arguments=None)
    replay = await ShadowEvaluator(_pipeline(tmp_path)).evaluate(denied)
    assert _kinds(replay) == [(FindingKind.NEWLY_ALLOWED, "allow-list")]


@pytest.mark.asyncio
async def test_rewrites_and_approval_rules_are_compared(tmp_path: Path) -> None:
    replay = await ShadowEvaluator(_pipeline(tmp_path, MarkForReview(), Rewrite())).evaluate(_record())
    kinds = {f.kind: f for f in replay.findings}
    assert set(kinds) == {FindingKind.ARGUMENTS_CHANGED, FindingKind.NEWLY_NEEDS_APPROVAL}
    changed = kinds[FindingKind.ARGUMENTS_CHANGED]
    assert (changed.recorded_arguments, changed.candidate_arguments) == ({"symbol": "ACME"}, {"symbol": "ACMX"})
    assert kinds[FindingKind.NEWLY_NEEDS_APPROVAL].detail == "quotes need a second pair of eyes"


@pytest.mark.asyncio
async def test_the_required_gate_now_rejecting_is_reported_before_any_call(tmp_path: Path) -> None:
    strict = AllowedOperationsHook(["demo-tools/notify-service/send_message"])
    replay = await ShadowEvaluator(_pipeline(tmp_path, strict)).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.REQUIRED_GATE_NOW_REJECTS, "allowed-operations")]
    assert replay.calls == 0
    assert "does not allow" in replay.findings[0].detail

    lenient = AllowedOperationsHook([QUOTE])
    assert (await ShadowEvaluator(_pipeline(tmp_path, lenient)).evaluate(_record())).findings == []


@pytest.mark.asyncio
async def test_arguments_rewritten_by_the_recorded_pipeline_are_flagged_when_the_plan_references_a_step(
    tmp_path: Path,
) -> None:
    record = _record(modified_by=["old-rewriter"])
    record.plans[0].plan.steps[0].arguments = {"symbol": "{{steps.lookup.output.symbol}}"}
    replay = await ShadowEvaluator(_pipeline(tmp_path)).evaluate(record)
    assert [f.kind for f in replay.findings] == [FindingKind.DEPENDS_ON_UNRECORDED]


@pytest.mark.asyncio
async def test_a_prompt_hook_replays_only_its_cached_decisions(tmp_path: Path) -> None:
    from hooks.declarative import DeclaredHookRuntime, HookStore
    from hooks.declarative.config import PromptHook
    from hooks.declarative.dispatch import declared_hook
    from hooks.declarative.handlers import prompt_cache_key

    store = HookStore(tmp_path / "hooks.sqlite3")
    spec = PromptHook.model_validate(
        {
            "id": "judge",
            "event": "pre_tool_use",
            "handler_type": "prompt",
            "matcher": "stock_quote",
            "config": {"prompt_template": "Allow quotes?", "model": "m", "endpoint": "http://127.0.0.1:9/v1"},
        }
    )
    pipeline = _pipeline(tmp_path, declared_hook(spec, DeclaredHookRuntime(store=store, allow_loopback=True)))
    replay = await ShadowEvaluator(pipeline).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.NOT_REPLAYED, "judge")]
    assert "no cached decision" in replay.findings[0].detail

    key = prompt_cache_key("judge", 1, "stock-service/stock_quote", {"symbol": "ACME"})
    store.cache_decision(key, "judge", {"decision": "block", "reason": "no", "injection_detected": False}, 60)
    replay = await ShadowEvaluator(pipeline).evaluate(_record())
    assert _kinds(replay) == [(FindingKind.NEWLY_BLOCKED, "judge")]
    assert store.budget_remaining("global")[0] == store.default_budget  # nothing spent


@pytest.mark.asyncio
async def test_a_shadow_safe_http_hook_is_called_without_an_audit_row(tmp_path: Path) -> None:
    from hooks.declarative import DeclaredHookRuntime, HookStore
    from hooks.declarative.config import HttpHook
    from hooks.declarative.dispatch import declared_hook

    from ..hook_servers import Reply, Webhook

    server = Webhook(Reply(body={"decision": "block", "reason": "quotes are closed"}))
    try:
        store = HookStore(tmp_path / "hooks.sqlite3")
        spec = HttpHook.model_validate(
            {
                "id": "remote",
                "event": "pre_tool_use",
                "handler_type": "http",
                "shadow_safe": True,
                "config": {"url": server.url},
            }
        )
        store.register(spec)
        pipeline = _pipeline(tmp_path, declared_hook(spec, DeclaredHookRuntime(store=store, allow_loopback=True)))
        replay = await ShadowEvaluator(pipeline).evaluate(_record())
        assert _kinds(replay) == [(FindingKind.NEWLY_BLOCKED, "remote")]
        assert "quotes are closed" in replay.findings[0].candidate
        assert server.calls == 1
        assert store.executions() == []  # no audit row, no breaker move
    finally:
        server.close()
