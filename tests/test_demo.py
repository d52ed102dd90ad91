"""The quick start's demo, run as a user runs it (``python -m demo``), on free ports: every check it prints
passes, its reviewer finds the waiting request in the inbox (``AgentAwaitingReview = true``), and what it
prints never contains the secret its redaction hook masks."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from asyncio.subprocess import PIPE, STDOUT
from pathlib import Path

from activities.models import function_name
from agent_lifecycle.testing import model as ai
from demo.tools import quote_price

from .test_entrypoints import _free_port

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_passes_its_checks_and_its_reviewer_finds_the_request_in_the_inbox(tmp_path):
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{_free_port()}",
        "TEMPORAL_UI_PORT": str(_free_port()),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "[FAILED]" not in output
    assert "[ok] the waiting message request was in the reviewers' inbox (AgentAwaitingReview = true)" in output
    assert "[ok] an unsigned approval was refused; the one signed with the reviewer's key ran the message" in output
    assert "sk-demo-" not in output  # the knowledge base's key: redacted in answers, never printed as a draft


async def test_the_demo_runs_its_requests_against_a_configured_model_and_passes_the_same_checks(tmp_path):
    """``AGENT_MODEL=… bash scripts/demo`` with a model on an OpenAI-compatible endpoint (here a scripted one
    on 127.0.0.1, answering as a model with tool calling would): the model plans and answers, and the
    demo's hooks govern it exactly as they govern the rule planner."""
    quote, trade, message, profile = (
        function_name(f"demo-tools/{tool}")
        for tool in (
            "stock-service/stock_quote",
            "stock-service/execute_trade",
            "notify-service/send_message",
            "research-service/company_profile",  # served by the demo's MCP server
        )
    )
    leaked = "sk-demo-" + "7" * 24  # a key the model repeats from its context: after_synthesis masks it
    async with ai.OpenAIServer() as server:
        server.push(
            # 1. the quote: a tool call, then the model's answer from its result (no synthesis call)
            ai.tool_calls((quote, {"symbol": "ACME"})),
            ai.answer(f"ACME trades at {quote_price('ACME')} USD (the knowledge base's key is {leaked})."),
            # 2. the trade: refused by the required hook before any tool runs
            ai.tool_calls((trade, {"symbol": "ACME", "side": "buy", "quantity": 10})),
            # 3. the quote again: answered from the response cache, no model call
            # 4. the message: the quote, then the message quoting its price, then the answer
            ai.tool_calls((quote, {"symbol": "ACME"})),
            ai.tool_calls((message, {"to": "alice", "text": "ACME is at {{steps.stock_quote-1.output.price}} USD"})),
            ai.answer("I sent alice the price of ACME."),
            # 5. the company profile: the MCP server's tool, offered to the model like the others
            ai.tool_calls((profile, {"symbol": "ACME"})),
            ai.answer("Acme Corporation (ACME) is a company in the demo's research catalogue."),
        )
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": f"127.0.0.1:{_free_port()}",
            "TEMPORAL_UI_PORT": str(_free_port()),
            "AGENT_STATE_DIR": str(tmp_path / "state"),
            "PYTHONUNBUFFERED": "1",
            "AGENT_MODEL": "demo-model",
            "AGENT_MODEL_BASE_URL": server.base_url,
            "AGENT_MODEL_API_KEY": "sk-test-model-key",
        }
        demo = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "demo", cwd=ROOT, env=env, stdout=PIPE, stderr=STDOUT
        )
        stdout, _ = await asyncio.wait_for(demo.communicate(), 120)
        output = stdout.decode()

    assert demo.returncode == 0, output
    assert "[FAILED]" not in output
    assert "planner openai:demo-model" in output
    assert leaked not in output and "sk-test-model-key" not in output
    assert len(server.requests) == 8  # every scripted reply was asked for: none left, none missing
    assert all(r.headers["authorization"] == "Bearer sk-test-model-key" for r in server.requests)
    assert [r.body["model"] for r in server.requests] == ["demo-model"] * 8
    offered = [t["function"]["name"] for t in server.requests[0].body["tools"]]
    assert {quote, trade, message, profile} <= set(offered)


def test_sigterm_stops_a_holding_demo_and_its_dev_server(tmp_path):
    port = _free_port()
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "TEMPORAL_UI_PORT": str(_free_port()),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "demo.log"
    with open(log, "w") as out:
        demo = subprocess.Popen([sys.executable, "-m", "demo", "--hold"], cwd=ROOT, env=env, stdout=out, stderr=out)
        deadline = time.monotonic() + 120
        while "holding:" not in log.read_text():
            assert demo.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert _listening(port)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=60) == 0, log.read_text()[-3000:]
    deadline = time.monotonic() + 10
    while _listening(port) and time.monotonic() < deadline:  # the server's process exits with the demo
        time.sleep(0.2)
    assert not _listening(port), "the demo's dev server outlived it"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0
