"""Pipeline construction: what the registry accepts, what it refuses and why, and how
``worker.py --check`` reports it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from activities import LifecycleActivities, ToolRegistry
from client.pipeline import PipelineRefused
from client.settings import Settings
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import demo_tools
from hooks import (
    HookRegistry,
    InvalidPipelineConfigError,
    InvalidRequiredAfterPlanningHookError,
    PipelineHook,
    PipelineShortCircuitDecision,
    RequiredAfterPlanningHook,
    RunMode,
    Stage,
)
from storage.executions import SQLiteExecutionStore
from worker import build_worker
from workflows.models import ToolCall

from .worker_pipelines import Enrich, Governed, Reviewer, empty

REPO_ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------
# Tiny hooks
# --------------------------------------------------------------------------------------------------


class Decide(PipelineHook):
    def __init__(self, name: str) -> None:
        self.name = name

    async def before_planning_decision(self, ctx, gate) -> PipelineShortCircuitDecision | None:
        return None


class Observer(PipelineHook):
    def __init__(self, name: str) -> None:
        self.name = name

    async def after_execution(self, ctx, execution):
        return None


class Rewriter(PipelineHook):
    def __init__(self, name: str) -> None:
        self.name = name

    def after_synthesis(self, ctx, response):
        return response


def build_error(hooks) -> InvalidPipelineConfigError:
    with pytest.raises(InvalidPipelineConfigError) as info:
        HookRegistry(hooks)
    return info.value


# --------------------------------------------------------------------------------------------------
# None entries (named by their index) and empty lists
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 2])
def test_none_entry_is_rejected_naming_its_zero_based_index(index):
    hooks: list = [Enrich("a"), Enrich("b"), Rewriter("c")]
    hooks.insert(index, None)
    err = build_error(hooks)
    assert err.index == index
    assert f"index {index}" in str(err)
    assert "None" in str(err)
    # A general configuration error, not one of the required-hook reason codes.
    assert not isinstance(err, InvalidRequiredAfterPlanningHookError)
    assert err.reason not in {"stage_drift", "multiple_required", "required_not_terminal"}


def test_none_entry_is_rejected_even_beside_a_required_hook():
    err = build_error([Governed(), None])
    assert err.index == 1 and "index 1" in str(err)
    assert not isinstance(err, InvalidRequiredAfterPlanningHookError)


@pytest.mark.parametrize("hooks", [[], None, ()])
def test_an_empty_or_none_list_is_valid_and_registers_nothing(hooks):
    registry = HookRegistry(hooks)
    assert registry.entries == []
    assert len(registry) == 0


# --------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_name", ["", "   ", None, 42])
def test_a_hook_without_a_usable_name_is_rejected(bad_name):
    hook = Enrich("x")
    hook.name = bad_name
    err = build_error([Enrich("ok"), hook])
    assert err.reason == "empty_name"
    assert err.index == 1 and "index 1" in str(err)


def test_a_hook_with_no_name_attribute_at_all_is_rejected():
    class Nameless:
        def before_planning(self, ctx):
            return None

    err = build_error([Nameless()])
    assert err.reason == "empty_name" and err.index == 0


def test_duplicate_names_are_rejected_even_across_stages():
    err = build_error([Enrich("shared"), Rewriter("other"), Rewriter("shared")])
    assert err.reason == "duplicate_name"
    assert err.index == 2 and err.hook == "shared"
    assert "'shared'" in str(err) and "index 2" in str(err)


# --------------------------------------------------------------------------------------------------
# The required marker: one required hook at most; it implements after_planning and no ordinary
# after_planning hook follows it
# --------------------------------------------------------------------------------------------------


def test_required_marker_without_after_planning_is_stage_drift():
    class Drifted(RequiredAfterPlanningHook, PipelineHook):
        name = "drifted"

        def after_planing(self, ctx, plan):  # the misspelt stage method must not downgrade the control
            return plan

    err = build_error([Enrich("first"), Drifted()])
    assert isinstance(err, InvalidRequiredAfterPlanningHookError)
    assert err.reason == "stage_drift"
    assert err.index == 1 and err.hook == "drifted"
    assert "after_planning" in str(err)


def test_required_marker_on_a_hook_of_another_stage_is_stage_drift():
    class WrongStage(RequiredAfterPlanningHook, PipelineHook):
        name = "wrong-stage"

        def after_synthesis(self, ctx, response):
            return response

    err = build_error([WrongStage()])
    assert isinstance(err, InvalidRequiredAfterPlanningHookError)
    assert err.reason == "stage_drift" and err.index == 0


def test_two_required_hooks_are_rejected():
    err = build_error([Governed("gate-a"), Enrich("between"), Governed("gate-b")])
    assert isinstance(err, InvalidRequiredAfterPlanningHookError)
    assert err.reason == "multiple_required"
    assert "gate-a" in str(err) and "gate-b" in str(err)


def test_an_ordinary_after_planning_hook_after_the_required_one_is_rejected():
    err = build_error([Reviewer("early"), Governed(), Reviewer("late")])
    assert isinstance(err, InvalidRequiredAfterPlanningHookError)
    assert err.reason == "required_not_terminal"
    assert err.hook == "governed-plan"
    assert "'late'" in str(err) and "index 2" in str(err)


def test_a_later_hook_implementing_after_planning_among_other_stages_is_also_rejected():
    class Mixed(PipelineHook):
        name = "mixed"

        def before_planning(self, ctx):
            return None

        def after_planning(self, ctx, plan):
            return plan

    err = build_error([Governed(), Mixed()])
    assert err.reason == "required_not_terminal"


def test_hooks_of_other_stages_may_follow_the_required_hook():
    registry = HookRegistry([Reviewer("early"), Governed(), Enrich("bp"), Observer("ae"), Rewriter("as")])
    assert [e.name for e in registry.entries] == ["early", "governed-plan", "bp", "ae", "as"]
    assert [e.required for e in registry.entries] == [False, True, False, False, False]


# --------------------------------------------------------------------------------------------------
# Stage methods and options
# --------------------------------------------------------------------------------------------------


class _NoArgBeforePlanning(PipelineHook):
    name = "bp-no-arg"

    def before_planning(self):
        return None


class _OneArgAfterPlanning(PipelineHook):
    name = "ap-one-arg"

    def after_planning(self, plan):
        return plan


class _ExtraArgSynthesis(PipelineHook):
    name = "as-extra"

    async def after_synthesis(self, ctx, response, tone):
        return response


class _DecisionWithoutGate(PipelineHook):
    name = "decision-no-gate"

    def before_planning_decision(self, ctx):
        return None


class _NotCallable(PipelineHook):
    name = "not-callable"
    after_execution = "observe"


@pytest.mark.parametrize(
    "hook_cls", [_NoArgBeforePlanning, _OneArgAfterPlanning, _ExtraArgSynthesis, _DecisionWithoutGate, _NotCallable]
)
def test_a_stage_method_with_the_wrong_signature_is_rejected(hook_cls):
    err = build_error([Enrich("fine"), hook_cls()])
    assert err.reason == "signature_mismatch"
    assert err.index == 1 and err.hook == hook_cls.name


def test_a_required_hook_with_a_drifted_signature_is_rejected_not_skipped():
    class Governed1(RequiredAfterPlanningHook, PipelineHook):
        name = "governed-one-arg"

        def after_planning(self, plan):
            return plan

    err = build_error([Governed1()])
    assert err.reason in {"signature_mismatch", "stage_drift"}


def test_optional_extra_parameters_and_varargs_are_accepted():
    class Flexible(PipelineHook):
        name = "flexible"

        def after_synthesis(self, ctx, response, tone="plain"):
            return response

        def before_planning(self, *args):
            return None

    entry = HookRegistry([Flexible()]).entries[0]
    assert entry.stages == [Stage.BEFORE_PLANNING, Stage.AFTER_SYNTHESIS]


def test_both_before_planning_contracts_on_one_hook_are_ambiguous():
    class Both(PipelineHook):
        name = "both"

        def before_planning(self, ctx):
            return None

        def before_planning_decision(self, ctx, gate):
            return None

    err = build_error([Both()])
    assert err.reason == "ambiguous_before_planning" and err.hook == "both"


def test_a_hook_implementing_no_stage_is_rejected():
    class Idle(PipelineHook):
        name = "idle"

        def warm_up(self, ctx):  # not a stage method
            return None

    err = build_error([Enrich("fine"), Idle()])
    assert err.reason == "no_stage" and err.index == 1 and err.hook == "idle"
    assert not isinstance(err, InvalidRequiredAfterPlanningHookError)


class _MisspeltBesideValid(PipelineHook):
    name = "misspelt"

    def before_tool(self, ctx, call):
        return None

    def after_synthesys(self, ctx, response):  # never a stage: would silently never run
        return response


class _CamelCased(PipelineHook):
    name = "camel"

    def after_synthesis(self, ctx, response):
        return response

    def beforeTool(self, ctx, call):  # the spelling under test
        return None


@pytest.mark.parametrize(
    "hook_cls, attribute, meant",
    [(_MisspeltBesideValid, "after_synthesys", "after_synthesis"), (_CamelCased, "beforeTool", "before_tool")],
)
def test_a_method_spelt_like_a_stage_but_naming_none_is_refused_with_a_hint(hook_cls, attribute, meant):
    err = build_error([Enrich("fine"), hook_cls()])
    assert err.reason == "unknown_stage_method" and err.index == 1 and err.hook == hook_cls.name
    assert f"{attribute} is not a stage method; did you mean {meant}?" in str(err)


def test_a_hook_with_only_a_misspelt_stage_says_which_stage_it_meant():
    class OnlyMisspelt(PipelineHook):
        name = "only-misspelt"

        def after_planing(self, ctx, plan):
            return plan

    err = build_error([OnlyMisspelt()])
    assert err.reason == "no_stage" and "did you mean after_planning?" in str(err)


def test_helpers_and_the_hook_api_methods_are_not_mistaken_for_stages():
    class Helpful(PipelineHook):
        name = "helpful"

        def after_synthesis(self, ctx, response):
            return self.on_finish_cleanup(response)

        def on_finish_cleanup(self, text):  # a helper, not a near miss of on_finish
            return text

        def run_detached(self, ctx):
            return None

    assert HookRegistry([Helpful()]).entries[0].stages == [Stage.AFTER_SYNTHESIS]


@pytest.mark.parametrize(
    "signature, accepted",
    [
        ("def after_tool(self, ctx, call, outcome): return None", True),
        ("def after_tool(self, ctx, call, outcome=None): return None", True),
        ("def after_tool(self, ctx, *rest): return None", True),
        ("def after_tool(self, ctx, call): return None", False),
        ("def after_tool(self, ctx, call, outcome, *, strict): return None", False),
        ("def after_tool(self, ctx, call, outcome, *, strict=True): return None", True),
        ("def after_tool(self, ctx, call, outcome, extra): return None", False),
    ],
)
def test_stage_methods_are_held_against_the_parameter_kinds_their_stage_passes(signature, accepted):
    namespace: dict = {}
    exec(signature, namespace)  # the signature under test
    hook = type("Shaped", (PipelineHook,), {"name": "shaped", "after_tool": namespace["after_tool"]})()
    if accepted:
        assert HookRegistry([hook]).entries[0].stages == [Stage.AFTER_TOOL]
    else:
        err = build_error([hook])
        assert err.reason == "signature_mismatch" and "(ctx, call, outcome)" in str(err)


@pytest.mark.parametrize(
    "option, value",
    [
        ("timeout_seconds", 0),
        ("timeout_seconds", -1.5),
        ("timeout_seconds", "10"),
        ("timeout_seconds", 10_000),
        ("max_attempts", 0),
        ("max_attempts", -2),
        ("max_attempts", 1.5),
        ("run_mode", "thread"),
        ("run_mode", None),
    ],
)
def test_invalid_run_options_are_rejected(option, value):
    hook = Enrich("opt")
    setattr(hook, option, value)
    err = build_error([hook])
    assert err.reason == "invalid_option"
    assert err.hook == "opt" and err.index == 0
    assert option in str(err)


class GuardShell(PipelineHook):
    name = "guard-shell"

    def before_tool(self, ctx, call):
        return None


@pytest.mark.parametrize(
    "hook, option, problem",
    [
        (GuardShell(), {"matcher": "("}, "not a valid regex"),
        (GuardShell(), {"matcher": ""}, "non-empty regex"),
        (GuardShell(), {"matcher": 3}, "non-empty regex"),
        (GuardShell(), {"subagent_only": "yes"}, "subagent_only must be a bool"),
        (Enrich("enrich"), {"matcher": "^shell/"}, "tool stages only"),
        (Enrich("enrich"), {"subagent_only": True}, "tool stages only"),
    ],
)
def test_tool_filters_are_checked_when_the_pipeline_is_built(hook, option, problem):
    for name, value in option.items():
        setattr(hook, name, value)
    err = build_error([hook])
    assert err.reason == "invalid_option" and err.hook == hook.name and problem in str(err)


def test_tool_filters_reach_the_manifest_and_select_tool_calls():
    hook = GuardShell()
    hook.matcher = "^shell/(exec|run)$"
    [entry] = HookRegistry([hook]).entries
    assert (entry.tool_matcher, entry.subagent_only) == ("^shell/(exec|run)$", False)
    shell = ToolCall(step_id="s", namespace="ns", agent="shell", capability="exec")
    other = ToolCall(step_id="o", namespace="ns", agent="stock-service", capability="stock_quote")
    assert entry.applies_to_tool(shell) and not entry.applies_to_tool(other)
    sub = entry.model_copy(update={"tool_matcher": None, "subagent_only": True})
    assert not sub.applies_to_tool(shell) and sub.applies_to_tool(shell.model_copy(update={"subagent": True}))


def test_manifest_entries_describe_a_valid_pipeline():
    class Cheap(PipelineHook):
        name = "cheap"
        run_mode = "local_activity"
        timeout_seconds = 2
        max_attempts = 1

        def before_planning(self, ctx):
            return None

        def after_synthesis(self, ctx, response):
            return response

    class Bare:  # not a PipelineHook subclass: gets the defaults
        name = "bare"

        async def after_execution(self, ctx, execution):
            return None

    hooks = [Cheap(), Decide("decider"), Reviewer("reviewer"), Governed(), Bare(), Rewriter("rewriter")]
    registry = HookRegistry(hooks, pipeline="p1")
    entries = registry.entries
    assert registry.pipeline == "p1"
    assert [(e.name, e.index) for e in entries] == [
        ("cheap", 0),
        ("decider", 1),
        ("reviewer", 2),
        ("governed-plan", 3),
        ("bare", 4),
        ("rewriter", 5),
    ]
    assert [e.stages for e in entries] == [
        [Stage.BEFORE_PLANNING, Stage.AFTER_SYNTHESIS],
        [Stage.BEFORE_PLANNING],
        [Stage.AFTER_PLANNING],
        [Stage.AFTER_PLANNING],
        [Stage.AFTER_EXECUTION],
        [Stage.AFTER_SYNTHESIS],
    ]
    assert [e.required for e in entries] == [False, False, False, True, False, False]
    assert [e.before_planning_contract for e in entries] == ["legacy", "decision", None, None, None, None]
    cheap, decider = entries[0], entries[1]
    assert (cheap.run_mode, cheap.timeout_seconds, cheap.max_attempts) == (RunMode.LOCAL_ACTIVITY, 2.0, 1)
    assert (decider.run_mode, decider.timeout_seconds, decider.max_attempts) == (
        RunMode.LOCAL_ACTIVITY,
        PipelineHook.timeout_seconds,
        PipelineHook.max_attempts,
    )
    assert (
        entries[4].run_mode is PipelineHook.run_mode is RunMode.LOCAL_ACTIVITY
        and entries[4].max_attempts == PipelineHook.max_attempts
    )
    assert registry.hook("bare") is hooks[4]
    with pytest.raises(LookupError):
        registry.hook("missing")


def test_the_workflow_learns_the_registry_entries_through_the_manifest(tmp_path):
    registry = HookRegistry([Enrich("bp"), Governed(), Rewriter("as")], pipeline="p2")
    activities = LifecycleActivities(
        registry=registry,
        tools=ToolRegistry(demo_tools(tmp_path)),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        store=SQLiteExecutionStore(tmp_path / "x.sqlite3"),
    )
    assert activities.manifest.pipeline == "p2"
    assert activities.manifest.hooks == registry.entries
    assert [h.name for h in activities.manifest.participants(Stage.AFTER_PLANNING)] == ["governed-plan"]
    assert [h.name for h in activities.manifest.participants(Stage.AFTER_EXECUTION)] == []


def test_sync_and_async_stage_methods_are_both_accepted():
    class SyncHook(PipelineHook):
        name = "sync"

        def before_planning(self, ctx):
            return None

        def after_planning(self, ctx, plan):
            return plan

    class AsyncHook(PipelineHook):
        name = "async"

        async def before_planning_decision(self, ctx, gate):
            return None

        async def after_synthesis(self, ctx, response):
            return response

    class AsyncGoverned(RequiredAfterPlanningHook, PipelineHook):
        name = "async-governed"

        async def after_planning(self, ctx, plan):
            return plan

    entries = HookRegistry([SyncHook(), AsyncHook(), AsyncGoverned()]).entries
    assert [e.stages for e in entries] == [
        [Stage.BEFORE_PLANNING, Stage.AFTER_PLANNING],
        [Stage.BEFORE_PLANNING, Stage.AFTER_SYNTHESIS],
        [Stage.AFTER_PLANNING],
    ]
    assert entries[2].required


# --------------------------------------------------------------------------------------------------
# worker.py --check
# --------------------------------------------------------------------------------------------------


def run_check(factory: str, state_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENT_PIPELINE": f"tests.worker_pipelines:{factory}", "AGENT_STATE_DIR": str(state_dir)}
    return subprocess.run(
        [sys.executable, "worker.py", "--check"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "factory, reason, fragments",
    [
        ("none_entry", "nil_hook", ["index 2", "None"]),
        ("stage_drift", "stage_drift", ["'drifted-gate'", "index 1", "after_planning"]),
        ("multiple_required", "multiple_required", ["'gate-a'", "'gate-b'"]),
        ("required_not_terminal", "required_not_terminal", ["'governed-plan'", "'late-reviewer'"]),
        ("duplicate_name", "duplicate_name", ["'same'", "index 1"]),
    ],
)
def test_worker_check_refuses_a_misconfigured_pipeline(factory, reason, fragments, tmp_path):
    proc = run_check(factory, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"pipeline configuration error ({reason})" in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr
    assert "pipeline ok" not in proc.stdout
    assert "Traceback" not in proc.stderr


def test_worker_check_lists_the_hooks_of_a_valid_pipeline(tmp_path):
    proc = run_check("valid", tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("pipeline ") and "(tests.worker_pipelines:" in lines[0]
    assert lines[1:5] == [
        "0: enrich [before_planning]",
        "1: reviewer [after_planning]",
        "2: governed-plan [after_planning] required",
        "3: redact [after_synthesis]",
    ]
    assert "tool: demo-tools/stock-service/stock_quote read_only" in lines
    assert "tool: demo-tools/notify-service/send_message approval_required" in lines
    assert lines[-2].startswith("planner: rule-planner/1; synthesizer: template-synthesizer/1; reviewers: (any")
    assert lines[-1] == "pipeline ok"


def test_worker_check_refuses_tools_with_no_required_gate_unless_the_pipeline_says_so(tmp_path):
    refused = run_check("empty", tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "pipeline error: the pipeline runs tools with no required after-planning gate: add one (e.g. "
        "AllowedOperationsHook, or a RequiredAfterPlanningHook of your own), or say it runs ungated: "
        "build_pipeline(..., ungated=True)"
    ]
    assert "pipeline ok" not in refused.stdout
    proc = run_check("empty_ungated", tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if line[:1].isdigit()]  # no hook
    assert lines[-1] == "pipeline ok"


def test_worker_refuses_a_pipeline_with_no_planner_and_no_model_at_check_and_at_start(tmp_path):
    fix = (
        "pipeline error: the pipeline has no planner and no model: set AGENT_MODEL (with AGENT_MODEL_API_KEY), "
        "or pass planner= to build_pipeline"
    )
    refused = run_check("no_planner", tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [fix], refused.stderr
    env = {**os.environ, "AGENT_PIPELINE": "tests.worker_pipelines:no_planner", "AGENT_STATE_DIR": str(tmp_path)}
    started = subprocess.run(
        [sys.executable, "worker.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 2 and fix in started.stderr.splitlines(), started.stderr
    assert "worker started" not in started.stdout + started.stderr


def test_worker_check_says_where_the_model_calls_go(tmp_path):
    env = {
        **os.environ,
        "AGENT_PIPELINE": "tests.worker_pipelines:no_planner",
        "AGENT_STATE_DIR": str(tmp_path),
        "AGENT_MODEL": "gpt-test",
        "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1",
        "AGENT_MODEL_API_KEY": "k",
    }
    proc = subprocess.run(
        [sys.executable, "worker.py", "--check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "planner model: gpt-test at http://127.0.0.1:9/v1" in lines
    assert "synthesizer model: gpt-test at http://127.0.0.1:9/v1" in lines
    default = subprocess.run(
        [sys.executable, "worker.py", "--check"],
        cwd=REPO_ROOT,
        env={**env, "AGENT_MODEL_BASE_URL": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "planner model: gpt-test at https://api.openai.com/v1 (the OpenAI API: AGENT_MODEL_BASE_URL unset)" in (
        default.stdout.splitlines()
    ), default.stdout + default.stderr


async def test_a_worker_is_not_built_for_a_pipeline_with_ungated_tools(client, tmp_path):
    activities = empty(Settings(state_dir=tmp_path))
    with pytest.raises(PipelineRefused, match="no required after-planning gate"):
        build_worker(client, "never-polled", activities)
    activities.ungated = True
    build_worker(client, "never-polled", activities)  # said so: built (and never started)


def test_worker_check_warns_of_each_hook_that_fails_open_at_a_protective_stage(tmp_path):
    proc = run_check("fail_open_formatter", tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: optional-formatter fails open at after_synthesis: if it fails, the request goes on unguarded by it"
    ]
    assert not [line for line in run_check("valid", tmp_path).stdout.splitlines() if line.startswith("warning:")]
