"""The client as a service or a script uses it: connected and closed (``async with``), a process that
exits cleanly, a warning when no worker serves the task queue, one clear line when no server answers,
and a CLI that imports only what it uses."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from client.api import AgentClient, TemporalUnreachable
from client.settings import Settings, SettingsError

from .harness import Harness

ROOT = Path(__file__).resolve().parent.parent


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path, address: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": address,
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_TEMPORAL_WAIT_SECONDS": "0",
        **extra,
    }


# --------------------------------------------------------------------------------------------------
# No server: one line naming the fix
# --------------------------------------------------------------------------------------------------


async def test_connecting_where_no_server_answers_is_a_typed_error_naming_the_fix(tmp_path):
    address = f"127.0.0.1:{_closed_port()}"
    settings = Settings(temporal_address=address, state_dir=tmp_path / "state")
    with pytest.raises(TemporalUnreachable) as caught:
        await AgentClient.connect(settings)
    assert str(caught.value) == (
        f"no Temporal server at {address}; start one with `python worker.py --dev` (or set TEMPORAL_ADDRESS)"
    )
    assert caught.value.address == address and "Connection refused" in caught.value.detail
    with pytest.raises(TemporalUnreachable):
        async with AgentClient.connect(settings):
            pytest.fail("entered without a server")


@pytest.mark.parametrize("command", [["inbox"], ["run", "What is the price of ACME?"], ["result", "r-1"]])
def test_the_cli_says_in_one_line_that_no_server_answers_and_how_to_start_one(tmp_path, command):
    address = f"127.0.0.1:{_closed_port()}"
    run = subprocess.run(
        [sys.executable, "-m", "client.cli", *command],
        cwd=ROOT,
        env=_env(tmp_path, address),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        f"error: no Temporal server at {address}; start one with `python worker.py --dev` (or set TEMPORAL_ADDRESS)"
    ]


async def test_a_misspelt_variable_is_a_typed_error_from_connect(monkeypatch):
    monkeypatch.setenv("AGENT_REVIEWER", "carol")
    with pytest.raises(SettingsError, match="AGENT_REVIEWER: not a setting; did you mean AGENT_REVIEWERS?"):
        await AgentClient.connect()


# --------------------------------------------------------------------------------------------------
# Connected, closed, and a process that exits cleanly
# --------------------------------------------------------------------------------------------------


def _settings_for(client: Client, tmp_path: Path, task_queue: str) -> Settings:
    return Settings(
        temporal_address=client.service_client.config.target_host,
        task_queue=task_queue,
        state_dir=tmp_path / "state",
    )


async def test_the_client_is_a_context_manager_and_closes_once(client, tmp_path):
    settings = _settings_for(client, tmp_path, f"closing-{uuid.uuid4().hex[:8]}")
    async with AgentClient.connect(settings) as agents:
        assert await agents.workers_polling() == 0
    with pytest.raises(AttributeError):
        agents.temporal  # noqa: B018 - closed: the connection is gone
    await agents.close()  # a second close does nothing
    again = await AgentClient.connect(settings)
    await again.close()


_SCRIPT = """
import asyncio, sys
from client.api import AgentClient

async def main():
    async with AgentClient.connect() as agents:
        handle = await agents.start("What is the price of ACME?")
        print((await agents.status(handle.id)).name)
        await agents.cancel(handle.id)

asyncio.run(main())
"""


def test_a_short_client_script_exits_cleanly_every_time(client, tmp_path):
    # The SDK's native threads releasing a connection while the interpreter finalizes abort the
    # process now and then; the client lets go of it before that, run after run.
    env = _env(
        tmp_path,
        client.service_client.config.target_host,
        TEMPORAL_TASK_QUEUE=f"scripts-{uuid.uuid4().hex[:8]}",
    )
    for attempt in range(20):
        run = subprocess.run(
            [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, (attempt, run.stderr)
        assert "Fatal Python error" not in run.stderr and "RUNNING" in run.stdout, (attempt, run.stderr)


# --------------------------------------------------------------------------------------------------
# No worker: a warning
# --------------------------------------------------------------------------------------------------


async def test_starting_a_request_no_worker_serves_logs_a_warning_naming_the_queue(client, tmp_path, caplog):
    queue = f"nobody-{uuid.uuid4().hex[:8]}"
    agents = AgentClient(client, _settings_for(client, tmp_path, queue))
    with caplog.at_level(logging.WARNING, logger="client.api"):
        handle = await agents.start("What is the price of ACME?")
    try:
        [warning] = [r for r in caplog.records if r.name == "client.api"]
        assert f"no worker polls task queue {queue!r}" in warning.getMessage()
        assert handle.id in warning.getMessage()
    finally:
        await handle.terminate("nobody serves this queue")


async def test_starting_a_request_a_worker_serves_warns_of_nothing(client, tmp_path, caplog):
    async with Harness(client, tmp_path) as h:
        await h.run("What is the price of ACME?")  # the worker has polled the queue
        agents = AgentClient(client, _settings_for(client, tmp_path, h.task_queue))
        assert (await agents.workers_polling() or 0) >= 1
        with caplog.at_level(logging.WARNING, logger="client.api"):
            handle = await agents.start("What is the price of ACME?")
        assert [r for r in caplog.records if r.name == "client.api"] == []
        result = await agents.result(handle.id)
        assert "ACME" in result.response
        # A worker seen polling is not asked after again for every request the client starts.
        asked = []

        async def counted() -> int | None:
            asked.append(1)
            return 1

        agents.workers_polling = counted
        again = await agents.start("What is the price of ACME?")
        assert asked == []
        assert "ACME" in (await agents.result(again.id)).response


# --------------------------------------------------------------------------------------------------
# What the CLI imports
# --------------------------------------------------------------------------------------------------


def loaded(imports: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules starting with one of ``prefixes`` that a fresh interpreter holds after ``imports``."""
    probe = (
        f"import json, sys; {imports}; print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))"
    )
    run = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_the_cli_module_imports_no_driver_model_or_server_library():
    optional = ("psycopg", "psycopg_pool", "psycopg_binary", "openai", "mcp", "cryptography", "celpy")
    assert [m for m in loaded("import client.cli, client.settings", optional) if m.split(".")[0] in optional] == []


def test_the_client_loads_no_workflow_code_worker_or_telemetry_sdk():
    """What a CLI request or a service's `AgentClient` loads: the shared models and Temporal's client —
    not the workflows, Temporal's worker or the OpenTelemetry SDK (a CLI that exports nothing starts no
    client span; the worker gives the request its own trace)."""
    imports = "import client.cli, client.settings, client.api; from workflows import WORKFLOW_TYPE"
    assert loaded(imports, ("workflows.lifecycle", "workflows.stages", "temporalio.worker", "opentelemetry.sdk")) == []
