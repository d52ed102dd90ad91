"""The front door: ``agent_lifecycle`` exports every name a first agent needs, each from one place, and
importing it loads none of the optional parts."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import agent_lifecycle

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("psycopg", "psycopg_pool", "mcp", "jsonschema", "cel", "openai")
FIRST_AGENT = (
    "Tool",
    "ToolContext",
    "PipelineHook",
    "RequiredAfterPlanningHook",
    "HookRejection",
    "PipelineContext",
    "ToolCall",
    "ToolDecision",
    "Plan",
    "FailurePolicy",
    "build_pipeline",
    "Settings",
    "AgentClient",
    "RequestFailed",
    "ReviewRefused",
    "AgentPlugin",
)


def test_every_exported_name_resolves_to_the_object_its_module_defines():
    assert sorted(agent_lifecycle.__all__) == agent_lifecycle.__all__ == sorted(agent_lifecycle._WHERE)
    for name in agent_lifecycle.__all__:
        value = getattr(agent_lifecycle, name)
        assert value is getattr(importlib.import_module(agent_lifecycle._WHERE[name]), name), name
    assert set(FIRST_AGENT) <= set(agent_lifecycle.__all__)


def test_an_unknown_name_is_an_attribute_error():
    try:
        agent_lifecycle.NoSuchThing  # noqa: B018
    except AttributeError as err:
        assert "NoSuchThing" in str(err)
    else:
        raise AssertionError("an unknown name resolved")


def test_hook_authors_find_the_failure_policy_beside_the_hooks():
    import hooks

    assert hooks.FailurePolicy is agent_lifecycle.FailurePolicy
    assert "FailurePolicy" in hooks.__all__


def test_plan_and_the_sqlite_store_have_one_home_each():
    import activities
    import hooks

    assert "Plan" not in hooks.__all__ and not hasattr(hooks, "Plan")
    assert "SQLiteExecutionStore" not in activities.__all__
    assert not hasattr(activities, "SQLiteExecutionStore")


def test_the_readme_and_the_examples_import_the_front_door_names_only_from_it():
    """Where the user-facing code imports a front-door name, it imports it from the front door."""
    names = set(agent_lifecycle.__all__)
    readme = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    examples = sorted((ROOT / "examples" / "first_agent").glob("*.py")) + sorted(
        (ROOT / "examples" / "expenses").glob("*.py")
    )
    sources = [("README.md", code) for code in readme] + [(path.name, path.read_text()) for path in examples]
    checked = 0
    for where, code in sources:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("agent_lifecycle"):
                elsewhere = {alias.name for alias in node.names} & names
                assert not elsewhere, f"{where}: {sorted(elsewhere)} imported from {node.module}, not agent_lifecycle"
            checked += isinstance(node, ast.ImportFrom) and node.module == "agent_lifecycle"
    assert checked >= 8  # the README's snippets and both examples import from the front door


def test_importing_the_front_door_loads_no_optional_package():
    code = (
        "import sys, agent_lifecycle\n"
        "agent_lifecycle.Tool, agent_lifecycle.PipelineHook, agent_lifecycle.build_pipeline\n"
        "agent_lifecycle.AgentClient, agent_lifecycle.AgentPlugin, agent_lifecycle.Plan\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
