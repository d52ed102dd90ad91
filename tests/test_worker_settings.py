"""Every documented worker setting applies to every pipeline, or stops the worker at start-up.

``worker.py`` with ``AGENT_PIPELINE`` naming a pipeline built by hand (``tests.worker_pipelines``), with
none of the settings wired in: the worker applies declared hooks, MCP servers, reviewers, the checkpoint
expiry and the reviewers' webhook around it, and refuses (exit 2, the variable named, no traceback) what
it cannot apply. The required after-planning gate can never be narrowed. (The settings at work in a real
request, and the approval they govern: ``tests/test_approval_integrity.py``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.reviewer_keys import generate_key, trust_reviewer_key
from hooks import HookRegistry, InvalidRequiredAfterPlanningHookError, PipelineHook, RequiredAfterPlanningHook

ROOT = Path(__file__).resolve().parent.parent
SERVERS = Path(__file__).with_name("mcp_servers.py")


def worker(tmp_path: Path, factory: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``worker.py`` (``--check`` unless other arguments are given) with ``AGENT_PIPELINE=tests.worker_pipelines:<factory>``."""
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "OPENAI_"))},
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_PIPELINE": f"tests.worker_pipelines:{factory}" if ":" not in factory else factory,
        "TEMPORAL_ADDRESS": "127.0.0.1:9",  # never reached: the pipeline is refused before any connection
        "AGENT_TEMPORAL_WAIT_SECONDS": "0",
        **env,
    }
    return subprocess.run(
        [sys.executable, "worker.py", *(args or ("--check",))],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "pipeline ok" not in proc.stdout
    [line] = [line for line in proc.stderr.splitlines() if "error" in line]
    for fragment in fragments:
        assert fragment in line, line


# --------------------------------------------------------------------------------------------------
# The required gate is never narrowed
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value",
    [("scope", "tenant"), ("tenant_id", "acme"), ("agent_id", "bot"), ("matcher", "send"), ("subagent_only", True)],
)
def test_a_required_hook_that_would_skip_some_requests_is_a_construction_error(option, value):
    class Gate(RequiredAfterPlanningHook, PipelineHook):
        name = "gate"

        def after_planning(self, ctx, plan):
            return plan

    gate = Gate()
    setattr(gate, option, value)
    if option == "scope":
        gate.tenant_id = "acme"  # a valid tenant scope: still not every request
    with pytest.raises(InvalidRequiredAfterPlanningHookError) as caught:
        HookRegistry([gate])
    assert caught.value.reason == "required_not_universal" and caught.value.hook == "gate"
    assert option in str(caught.value) and "every request" in str(caught.value)


@pytest.mark.parametrize("args", [(), ("--dev",)], ids=["check", "serve"])
def test_the_worker_refuses_a_narrowed_required_hook_at_start_up(tmp_path, args):
    proc = worker(tmp_path, "narrowed_required", *args, AGENT_TEST_GATE_OPTION='scope="tenant"')
    refused(proc, "pipeline configuration error (required_not_universal)", "'narrowed-gate'", "scope='tenant'")


def test_a_tenant_only_required_hook_is_refused_by_the_worker(tmp_path):
    proc = worker(tmp_path, "narrowed_required", AGENT_TEST_GATE_OPTION='tenant_id="acme"')
    refused(proc, "(required_not_universal)", "tenant_id='acme'")


# --------------------------------------------------------------------------------------------------
# Settings applied around a pipeline of one's own
# --------------------------------------------------------------------------------------------------


def test_review_settings_and_declared_hooks_apply_to_a_hand_built_pipeline(tmp_path):
    hooks = tmp_path / "hooks.json"
    hooks.write_text(
        json.dumps(
            {
                "hooks": [
                    {"id": "guard", "event": "pre_tool_use", "handler_type": "command", "config": {"command": "true"}}
                ]
            }
        )
    )
    bare = worker(tmp_path, "hand_built")
    assert bare.returncode == 0, bare.stderr
    assert (
        "reviewers: (any named reviewer) (UNVERIFIED: anyone who can reach the namespace can use any name); "
        "checkpoint expiry: 86400 s; reviewers' webhook: no"
    ) in bare.stdout
    assert "guard" not in bare.stdout

    trust = tmp_path / "reviewers.json"
    for name in ("alice", "carol"):
        trust_reviewer_key(trust, name, generate_key(tmp_path / f"{name}.key"))
    applied = worker(
        tmp_path,
        "hand_built",
        AGENT_REVIEWERS="alice,carol",
        AGENT_REVIEWER_KEYS=str(trust),
        AGENT_CHECKPOINT_EXPIRY_SECONDS="900",
        AGENT_HOOKS_FILE=str(hooks),
        AGENT_REVIEW_WEBHOOK="https://reviews.example.com/hook",
    )
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert lines[:3] == [
        "pipeline hand-built (tests.worker_pipelines:hand_built)",
        "0: sign-messages [before_tool]",
        "1: guard [before_tool]",
    ]
    assert (
        "planner: scripted-planner; synthesizer: readable; reviewers: alice, carol (signed decisions: 2 key(s)); "
        "checkpoint expiry: 900 s; "
    ) in applied.stdout
    assert "reviewers' webhook: yes" in applied.stdout


def test_mcp_servers_apply_to_a_hand_built_pipeline(tmp_path):
    servers = tmp_path / "mcp.json"
    servers.write_text(
        json.dumps(
            {
                "servers": [
                    {"name": "inventory", "command": [sys.executable, str(SERVERS), "stdio"], "allow": ["stock_level"]}
                ]
            }
        )
    )
    proc = worker(tmp_path, "hand_built", AGENT_MCP_SERVERS=str(servers))
    assert proc.returncode == 0, proc.stderr
    assert "mcp tool: mcp/inventory/stock_level read_only" in proc.stdout.splitlines()


@pytest.mark.parametrize(
    "factory, env, fragments",
    [
        (
            "hand_built",
            {"AGENT_MODEL": "gpt-test", "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1"},
            ["configuration error: AGENT_MODEL:", "planner is 'scripted-planner', which calls no model"],
        ),
        (
            "hand_built",
            {"AGENT_SYNTHESIZER_MODEL": "gpt-test", "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1"},
            ["configuration error: AGENT_SYNTHESIZER_MODEL:", "synthesizer is 'readable'"],
        ),
        (
            "own_reviewers",
            {"AGENT_REVIEWERS": "alice", "AGENT_REVIEW_VERIFICATION": "none"},
            ["configuration error: AGENT_REVIEWERS:", "its own reviewers ['bob']"],
        ),
        (
            "hand_built",
            {"AGENT_REVIEWERS": "alice"},
            ["configuration error: AGENT_REVIEWERS:", "nothing verifies who is speaking", "AGENT_REVIEWER_KEYS"],
        ),
        (
            "hand_built",
            {"AGENT_REVIEWER_KEYS": "/nonexistent/reviewers.json"},
            ["configuration error: AGENT_REVIEWER_KEYS:", "reviewer keys /nonexistent/reviewers.json"],
        ),
        (
            "hand_built",
            {"AGENT_DATABASE_URL": "postgresql://agent@127.0.0.1:9/agent"},
            ["configuration error: AGENT_DATABASE_URL:", "SQLiteExecutionStore"],
        ),
        (
            "own_store",
            {"AGENT_EXECUTION_STORE": "/tmp/elsewhere.sqlite3"},
            ["configuration error: AGENT_EXECUTION_STORE:", "elsewhere"],
        ),
    ],
    ids=[
        "model-for-a-rule-planner",
        "model-for-a-template-synthesizer",
        "two-reviewer-lists",
        "unverified-reviewers",
        "missing-reviewer-keys",
        "database",
        "store",
    ],
)
def test_a_setting_the_worker_cannot_apply_stops_it_naming_the_variable(tmp_path, factory, env, fragments):
    refused(worker(tmp_path, factory, **env), *fragments)


def test_a_model_reaches_a_pipeline_built_with_the_builder(tmp_path):
    proc = worker(
        tmp_path, "demo.pipeline:build_activities", AGENT_MODEL="gpt-test", AGENT_MODEL_BASE_URL="http://127.0.0.1:9/v1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "planner: openai:gpt-test; synthesizer: openai:gpt-test; " in proc.stdout


@pytest.mark.parametrize(
    "pipeline, fragment",
    [
        ("nowhere.pipeline:build", "cannot import 'nowhere.pipeline'"),
        ("tests.worker_pipelines:no_such_factory", "has no function 'no_such_factory'"),
        ("tests.worker_pipelines:ScriptedPlanner", "raised TypeError: ScriptedPlanner() takes no arguments"),
        ("tests.worker_pipelines:not_a_pipeline", "returned str, not LifecycleActivities"),
    ],
)
def test_a_bad_pipeline_factory_is_a_one_line_error(tmp_path, pipeline, fragment):
    refused(worker(tmp_path, pipeline), "pipeline error: AGENT_PIPELINE=", fragment)


def test_a_worker_without_a_pipeline_says_how_to_name_one(tmp_path):
    """The framework has no default pipeline (the demo's is the demo's): an unset ``AGENT_PIPELINE`` is a
    one-line error naming the variable, never a demo served by accident."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "OPENAI_"))}
    proc = subprocess.run(
        [sys.executable, "worker.py", "--check"],
        cwd=ROOT,
        env={**environment, "AGENT_STATE_DIR": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    refused(proc, "AGENT_PIPELINE is not set", "module:function")


# --------------------------------------------------------------------------------------------------
# The one settings model, as the worker and the CLI read it
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, fragments",
    [
        (
            {"AGENT_MODEL_TIMEOUT_SECONDS": "soon", "AGENT_WORKER_THREADS": "0"},
            [
                "AGENT_WORKER_THREADS: Input should be greater than or equal to 1 (got '0')",
                "AGENT_MODEL_TIMEOUT_SECONDS",
            ],
        ),
        ({"AGENT_MEMORY_ACTIVITY_TTL_SECONDS": "-3"}, ["AGENT_MEMORY_ACTIVITY_TTL_SECONDS: Input should be greater"]),
        ({"AGENT_PROMETHEUS_BIND": "9464"}, ["AGENT_PROMETHEUS_BIND: not host:port"]),
        ({"AGENT_DATABASE_URL": "mysql://agent:hunter2@db/a"}, ["AGENT_DATABASE_URL: must be a postgresql:// URL"]),
    ],
    ids=["model-and-worker", "memory", "telemetry", "secret"],
)
def test_a_bad_setting_of_any_section_stops_the_worker_and_the_cli_on_one_line(tmp_path, env, fragments):
    proc = worker(tmp_path, "hand_built", **env)
    refused(proc, "configuration error: ", *fragments)
    assert "hunter2" not in proc.stderr
    cli_env = {**{k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}, **env}
    cli = subprocess.run(
        [sys.executable, "-m", "client.cli", "list"], cwd=ROOT, env=cli_env, capture_output=True, text=True, timeout=60
    )
    refused(cli, "configuration error: ", *fragments)


def test_check_names_every_tool_by_its_full_key(tmp_path):
    """Docs, errors and ``--check`` name a tool ``namespace/agent/capability``: its identity."""
    proc = worker(tmp_path, "hand_built")
    assert proc.returncode == 0, proc.stderr
    tools = [line for line in proc.stdout.splitlines() if line.startswith(("tool:", "mcp tool:", "subagent:"))]
    assert tools and all(line.split(": ", 1)[1].split()[0].count("/") == 2 for line in tools), tools
    assert "tool: demo-tools/stock-service/stock_quote read_only" in tools
