"""The optional parts (PostgreSQL, MCP, CEL filters, OpenAI models) and their extras.

A process on SQLite with no model, no MCP server and no filters imports none of their packages; a worker
whose settings ask for a part whose package is missing stops at start-up (exit 2) with one line naming
the setting and the ``pip install`` that provides it. A package is made missing the way an interpreter
without it sees it: ``sys.modules[name] = None`` before anything is imported, so ``import name`` raises
``ModuleNotFoundError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVERS = Path(__file__).with_name("mcp_servers.py")
OPTIONAL = ("psycopg", "psycopg_pool", "mcp", "jsonschema", "cel", "openai")

# A pipeline with the example agent's hooks and tools and no planner or synthesizer of its own: with
# AGENT_MODEL set, build_pipeline gives it the model's.
MODEL_PIPELINE = """
from client.pipeline import build_pipeline
from examples.first_agent.hooks import Disclaimer, NoSecrets, OnlyNotesTools
from examples.first_agent.tools import notes_tools


def build(settings):
    return build_pipeline(
        settings, name="modelled", hooks=[NoSecrets(), Disclaimer(), OnlyNotesTools()],
        tools=notes_tools(settings.state_dir),
    )
"""


def python(tmp_path: Path, code: str, *, missing: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter in the repository, with the ``missing`` packages unimportable."""
    prelude = "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in missing)
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "OPENAI_"))},
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "TEMPORAL_ADDRESS": "127.0.0.1:9",  # never reached: --check and imports connect to nothing
        "AGENT_TEMPORAL_WAIT_SECONDS": "0",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


def check(tmp_path: Path, factory: str, *, missing: tuple[str, ...] = (), **env: str):
    code = "import runpy\nsys.argv = ['worker.py', '--check']\nrunpy.run_path('worker.py', run_name='__main__')\n"
    return python(tmp_path, code, missing=missing, AGENT_PIPELINE=factory, **env)


def test_the_core_on_sqlite_imports_no_optional_package(tmp_path):
    code = (
        "import worker, client.api, client.cli, agent_lifecycle, agent_lifecycle.testing\n"
        "from client.settings import Settings\n"
        "from examples.first_agent.pipeline import build\n"
        "build(Settings.from_env())\n"
        f"print(sorted(name for name in {OPTIONAL!r} if name in sys.modules))\n"
    )
    proc = python(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_example_agent_checks_without_any_optional_package(tmp_path):
    proc = check(tmp_path, "examples.first_agent.pipeline:build", missing=OPTIONAL)
    assert proc.returncode == 0, proc.stderr
    assert "pipeline ok" in proc.stdout


def _mcp_servers(tmp_path: Path) -> str:
    path = tmp_path / "mcp.json"
    server = {"name": "inventory", "command": [sys.executable, str(SERVERS), "stdio"], "allow": ["stock_level"]}
    path.write_text(json.dumps({"servers": [server]}))
    return str(path)


def _filtered_hooks(tmp_path: Path) -> str:
    path = tmp_path / "hooks.json"
    hook = {
        "id": "quiet",
        "event": "pre_tool_use",
        "handler_type": "command",
        "if_expr": "tool_name == 'x'",
        "config": {"command": "true"},
    }
    path.write_text(json.dumps({"hooks": [hook]}))
    return str(path)


@pytest.mark.parametrize(
    "missing, extra, setting, env",
    [
        ("psycopg", "postgres", "AGENT_DATABASE_URL", {"AGENT_DATABASE_URL": "postgresql://agent@127.0.0.1:9/agent"}),
        ("psycopg_pool", "postgres", "AGENT_DATABASE_URL", {"AGENT_DATABASE_URL": "postgresql://a@127.0.0.1:9/a"}),
        ("openai", "openai", "AGENT_MODEL", {"AGENT_MODEL": "gpt-test", "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9"}),
        ("mcp", "mcp", "AGENT_MCP_SERVERS", {"AGENT_MCP_SERVERS": _mcp_servers}),
        ("jsonschema", "mcp", "AGENT_MCP_SERVERS", {"AGENT_MCP_SERVERS": _mcp_servers}),
        ("cel", "cel", "if_expr", {"AGENT_HOOKS_FILE": _filtered_hooks}),
    ],
)
def test_a_missing_optional_package_stops_the_worker_at_start_up_naming_the_extra(
    tmp_path, missing, extra, setting, env
):
    (tmp_path / "modelled.py").write_text(MODEL_PIPELINE)
    values = {name: value(tmp_path) if callable(value) else value for name, value in env.items()}
    proc = check(tmp_path, "modelled:build", missing=(missing,), **values)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "pipeline ok" not in proc.stdout
    [line] = proc.stderr.strip().splitlines()
    assert setting in line and f"{missing} is not installed" in line, line
    assert f"pip install 'agent-lifecycle[{extra}]'" in line, line


def test_the_same_settings_pass_with_the_package_installed(tmp_path):
    (tmp_path / "modelled.py").write_text(MODEL_PIPELINE)
    proc = check(
        tmp_path,
        "modelled:build",
        AGENT_MODEL="gpt-test",
        AGENT_MODEL_BASE_URL="http://127.0.0.1:9",
        AGENT_MCP_SERVERS=_mcp_servers(tmp_path),
        AGENT_HOOKS_FILE=_filtered_hooks(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "mcp tool: mcp/inventory/stock_level read_only" in proc.stdout.splitlines()


def test_a_store_on_postgresql_without_the_driver_names_the_extra_from_build_pipeline(tmp_path):
    code = (
        "from client.settings import Settings\n"
        "from examples.first_agent.pipeline import build\n"
        "try:\n"
        "    build(Settings.from_env())\n"
        "except ImportError as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    proc = python(tmp_path, code, missing=("psycopg",), AGENT_DATABASE_URL="postgresql://a@127.0.0.1:9/a")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "MissingExtraError AGENT_DATABASE_URL needs the 'postgres' extra (psycopg is not installed): "
        "pip install 'agent-lifecycle[postgres]'"
    )
