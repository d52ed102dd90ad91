"""The example agent (``examples/first_agent``) run as its README says: ``worker.py`` loads it from
``AGENT_PIPELINE`` with ``PYTHONPATH`` at the repository, requests go through the service client
(``client.api.AgentClient``), a reviewer approves a write from the inbox, hooks deny and annotate."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from client.api import AgentClient, RequestFailed, RequestNotFound, ReviewRefused
from client.settings import Settings

from .doubles import eventually

ROOT = Path(__file__).resolve().parents[1]


def _env(client, tmp_path: Path) -> dict[str, str]:
    """The README's variables; alice's key made as it says (``agent-lifecycle reviewer-key``)."""
    key, trust = tmp_path / "alice.key", tmp_path / "reviewers.json"
    if not key.exists():
        made = subprocess.run(
            [sys.executable, "-m", "client.cli", "reviewer-key", "--reviewer", "alice"]
            + ["--key-file", str(key), "--trust-file", str(trust)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert made.returncode == 0, made.stderr
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": f"first-agent-{uuid.uuid4().hex[:8]}",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_PIPELINE": "examples.first_agent.pipeline:build",
        "AGENT_HOOKS_FILE": "examples/first_agent/hooks.json",
        "AGENT_REVIEWER_KEYS": str(trust),  # the worker trusts alice's public key
        "AGENT_REVIEWER_KEY": str(key),  # the reviewer's own shell signs with her private key
        "PYTHONUNBUFFERED": "1",
    }


async def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", *args, cwd=ROOT, env=env, stdout=-1, stderr=-1
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def test_the_cli_warns_when_no_worker_polls_the_task_queue(client, tmp_path):
    env = {**_env(client, tmp_path), "TEMPORAL_TASK_QUEUE": f"nobody-{uuid.uuid4().hex[:8]}"}
    started = await _cli(env, "start", "read groceries")
    assert started.returncode == 0, started
    assert "warning: no worker polls task queue" in started.stderr, started.stderr
    await client.get_workflow_handle(started.stdout.strip()).terminate("nobody serves this queue")


def test_the_worker_checks_the_example_pipeline_and_lists_its_parts(client, tmp_path):
    checked = subprocess.run(
        [sys.executable, "worker.py", "--check"], cwd=ROOT, env=_env(client, tmp_path), capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    for part in ("first-agent", "notes/notes-service/find_note", "notes/notes-service/write_note", "no-secrets"):
        assert part in checked.stdout, checked.stdout
    assert "no-empty-notes" in checked.stdout and "reviewers: alice (signed decisions: 1 key(s))" in checked.stdout


async def test_the_example_agent_answers_reviews_and_guards_its_notes(client, tmp_path):
    env = _env(client, tmp_path)
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "worker.py", cwd=ROOT, env=env, stdout=-1, stderr=-2, start_new_session=True
    )
    try:
        assert worker.stdout is not None
        async with asyncio.timeout(60):
            while b"worker polling" not in (line := await worker.stdout.readline()):
                assert line, "the worker exited before it polled"
        agents = await AgentClient.connect(Settings.from_env(env))

        # A write needs a reviewer: it waits in the inbox, exactly as it will run.
        handle = await agents.start("write groceries: milk and eggs", request_id=f"w-{uuid.uuid4().hex[:6]}")

        async def in_inbox():
            return [p for p in await agents.inbox() if p.workflow_id == handle.id]

        [pending] = await eventually(in_inbox, timeout=60, what="the write in the inbox")
        [call] = pending.checkpoint.calls
        assert (call.tool, call.arguments) == (
            "notes-service/write_note",
            {"title": "groceries", "text": "milk and eggs"},
        )
        with pytest.raises(ReviewRefused, match="speaks for 'alice', not 'mallory'"):
            await agents.approve(handle.id, reviewer="mallory")  # alice's key cannot sign for someone else
        request_id = handle.id.removeprefix("request-")
        await agents.approve(request_id, reviewer="alice", comment="fine")  # by request id
        written = await agents.result(request_id)
        assert "notes-service/write_note" in written.response and written.response.endswith("— from the notes service")

        read = await agents.execute("read groceries")
        assert "milk and eggs" in read.response and read.response.endswith("— from the notes service")

        # The Python before_tool hook denies; the call never reaches a reviewer.
        secret = await agents.execute("write secret plans: the launch date")
        assert "was not run (policy)" in secret.response and "off limits" in secret.response

        # The declared command hook (hooks.json) blocks an empty note before any checkpoint.
        empty = await agents.execute("write todo: ...")
        assert "was not run (policy)" in empty.response

        record = await agents.record(handle.id)
        assert record.pipeline == "first-agent" and record.checkpoints[0].reviewer == "alice"
        assert (record.checkpoints[0].verified_by or "").endswith(" of alice")
        assert {i.hook for i in record.pipeline_hooks} >= {
            "no-secrets",
            "no-empty-notes",
            "disclaimer",
            "only-notes-tools",
        }

        # A request that never was, and one cancelled while it waits for a reviewer: typed, never a hang.
        with pytest.raises(RequestNotFound):
            await agents.result("no-such-request")
        waiting = await agents.start("write later: maybe")
        await eventually(lambda: agents.pending(waiting.id), timeout=60, what="the second checkpoint")
        await agents.cancel(waiting.id)
        with pytest.raises(RequestFailed) as failed:
            await agents.result(waiting.id)
        assert failed.value.type == "Cancelled"

        # The CLI on the same requests: one line per stored request, a request named by its request id.
        listed = await _cli(env, "list", "--limit", "20")
        lines = listed.stdout.strip().splitlines()
        assert listed.returncode == 0 and len(lines) >= 5, listed
        assert any(request_id in line and "succeeded" in line for line in lines), lines
        shown = await _cli(env, "record", request_id)
        assert shown.returncode == 0 and "status succeeded" in shown.stdout, shown
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        await worker.wait()
