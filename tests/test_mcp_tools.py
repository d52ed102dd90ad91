"""Tools from MCP servers: real servers written with the ``mcp`` package (tests/mcp_servers.py), run over
stdio and over streamable HTTP on 127.0.0.1, through real workers. Listing at start-up becomes tool specs
in the manifest each request records; calls run as ``execute_tool_step`` under the same hooks,
checkpoints and idempotency keys as any tool; ``isError`` is a tool failure; a server that dies is
restarted, and a call it died in is retried, then fails with a stable type. The server counts every call
it receives (in a file), so a test can prove a call never reached it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.api.enums.v1 import EventType

from activities.mcp import (
    MCP_SERVER_UNAVAILABLE,
    MCP_TOOL_ERROR,
    McpServerConfig,
    McpStartupError,
    McpTool,
    ToolOverride,
    load_mcp_tools,
)
from activities.models import ModelSettings, OpenAIPlanner, OpenAISynthesizer, function_name
from activities.tools import ToolRegistry
from agent_lifecycle.testing import model as ai
from hooks import PlanStep, ToolDecision
from hooks.declarative import DeclaredHookRuntime, HookStore, SecretBox, declared_hooks, parse_hooks
from workflows import data_converter
from workflows.models import MAX_TOOL_OUTPUT_BYTES, PipelineManifest, StageSettings, StepStatus

from .doubles import FixedPlanner, started_attempts
from .harness import Harness, Outcome
from .test_entrypoints import _cli, _free_port, _running_worker
from .test_tool_hooks import BeforeTool, OnToolError

ROOT = Path(__file__).resolve().parent.parent
SERVERS = Path(__file__).with_name("mcp_servers.py")
FAST = StageSettings(tool_max_attempts=2, tool_timeout_seconds=20)


def stdio_server(calls: Path, *, offered: str | None = None, **options: Any) -> McpServerConfig:
    env = {"MCP_CALLS_FILE": str(calls)} | ({"MCP_INVENTORY_TOOLS": offered} if offered is not None else {})
    return McpServerConfig(name="inventory", command=[sys.executable, str(SERVERS), "stdio"], env=env, **options)


def received(calls: Path) -> list[dict[str, Any]]:
    """Every call the server received, in order."""
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def step(step_id: str, tool: str, server: str = "inventory", namespace: str = "mcp", **arguments: Any) -> PlanStep:
    return PlanStep(step_id=step_id, namespace=namespace, agent=server, capability=tool, arguments=arguments)


def recorded_manifest(out: Outcome) -> PipelineManifest:
    """The manifest ``resolve_pipeline`` returned, as the request's history recorded it."""
    converter = data_converter.payload_converter
    scheduled: dict[int, str] = {}
    for event in out.history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if scheduled.get(attrs.scheduled_event_id) == "resolve_pipeline":
                return converter.from_payloads(attrs.result.payloads, [PipelineManifest])[0]
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity" and "data" in marker.details:
                data = converter.from_payloads(marker.details["data"].payloads)[0]
                if data.get("activity_type") == "resolve_pipeline":
                    return converter.from_payloads(marker.details["result"].payloads, [PipelineManifest])[0]
    raise AssertionError("no resolve_pipeline result in the history")


@contextlib.asynccontextmanager
async def served(tools: list[McpTool]) -> AsyncIterator[list[McpTool]]:
    """The tools, their connections closed afterwards (as the worker closes them when it stops)."""
    try:
        yield tools
    finally:
        await ToolRegistry(tools).aclose()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------------------------------
# stdio
# --------------------------------------------------------------------------------------------------


async def test_a_stdio_servers_tools_run_as_governed_tool_steps(client, tmp_path):
    """Listing: the annotations decide read_only and approval, the lists decide what is offered. Calls:
    text and structured results become outputs, isError a typed failure on_tool_error sees, a before_tool
    deny (matched on ``inventory/reorder``) and a declared command hook's block (matched on
    ``inventory/describe``) never reach the server, every call carries its step's idempotency key, and
    both requests share one server process."""
    calls = tmp_path / "calls.jsonl"
    config = stdio_server(calls, deny=["wipe_*", "crash"], tools={"describe": ToolOverride(approval_required=False)})
    deny_bulk = BeforeTool(
        "no-bulk-orders",
        lambda call: (
            ToolDecision.deny("Bulk orders need a buyer.", reason="bulk") if call.arguments["units"] > 50 else None
        ),
        matcher=r"^inventory/reorder$",
    )
    errors = OnToolError("error-observer")
    box = SecretBox.from_base64(SecretBox.generate_key())
    runtime = DeclaredHookRuntime(store=HookStore(tmp_path / "hooks.sqlite3", secrets=box), secrets=box)
    blocker = tmp_path / "block.sh"
    blocker.write_text('cat >/dev/null\necho "that product is confidential" >&2\nexit 2\n')
    declared = declared_hooks(
        parse_hooks(
            {
                "hooks": [
                    {
                        "id": "confidential-products",
                        "event": "pre_tool_use",
                        "handler_type": "command",
                        "matcher": "^inventory/describe$",
                        "if_expr": 'tool_input.sku == "secret"',
                        "config": {"command": f"bash {blocker}"},
                    }
                ]
            }
        ),
        runtime,
    )
    planner = FixedPlanner(
        step("level", "stock_level", sku="ab"),
        step("text", "describe", sku="ab"),
        step("refused", "reorder", sku="ab", units=0),
        step("bulk", "reorder", sku="ab", units=99),
        step("hidden", "describe", sku="secret"),
        step("huge", "flood", size=MAX_TOOL_OUTPUT_BYTES + 10),
    )
    async with served(load_mcp_tools([config])) as tools:
        specs = {spec.capability: spec for spec in ToolRegistry(tools).specs()}
        assert sorted(specs) == ["describe", "discontinue", "flood", "reorder", "stock_level"]
        assert {name: (s.read_only, s.approval_required) for name, s in specs.items()} == {
            "describe": (True, False),
            "discontinue": (False, True),  # destructiveHint: a reviewer approves every call
            "flood": (True, False),
            "reorder": (False, False),
            "stock_level": (True, False),
        }
        assert specs["reorder"].key == "mcp/inventory/reorder"
        assert specs["reorder"].parameters["required"] == ["sku", "units"]

        hooks = [deny_bulk, errors, *declared]
        async with Harness(client, tmp_path, hooks=hooks, tools=tools, planner=planner) as h:
            out = await h.run("check the inventory")
            again = await h.run("check the inventory again")

    assert out.result is not None, out.failure
    steps = {s.step_id: s for s in out.record.steps}
    assert steps["level"].status is StepStatus.SUCCEEDED
    assert json.loads(steps["level"].output)["units"] == 14  # a dict without an output schema: JSON text
    assert steps["text"].output == {"result": "ab: a sturdy widget"}  # structured content
    assert (steps["refused"].status, steps["refused"].error_type) == (StepStatus.FAILED, MCP_TOOL_ERROR)
    assert steps["refused"].error == "Error executing tool reorder: cannot reorder 0 units"  # the server's text
    assert errors.seen["refused"].error == steps["refused"].error
    assert (steps["bulk"].status, steps["bulk"].skipped_by) == (StepStatus.SKIPPED, "no-bulk-orders")
    assert steps["hidden"].status is StepStatus.SKIPPED
    assert (steps["huge"].status, steps["huge"].error_type) == (StepStatus.FAILED, "ToolOutputTooLarge")
    assert "that product is confidential" in (steps["hidden"].skip_detail or "")
    # The steps run concurrently: compare what ran, not in which order.
    assert sorted(a.summary for a in out.tool_activities) == [
        "execute · inventory/describe (text)",
        "execute · inventory/flood (huge)",
        "execute · inventory/reorder (refused)",
        "execute · inventory/stock_level (level)",
    ]
    got = received(calls)
    keys = {(c["tool"], json.dumps(c["arguments"])): c["idempotency_key"] for c in got[:4] if c["tool"] != "flood"}
    assert keys == {
        ("stock_level", json.dumps({"sku": "ab"})): out.idempotency_key("level", {"sku": "ab"}),
        ("describe", json.dumps({"sku": "ab"})): out.idempotency_key("text", {"sku": "ab"}),
        ("reorder", json.dumps({"sku": "ab", "units": 0})): out.idempotency_key("refused", {"sku": "ab", "units": 0}),
    }
    # The denied and blocked calls never reached the server.
    assert all(c["arguments"] not in ({"sku": "ab", "units": 99}, {"sku": "secret"}) for c in got)
    assert len(got) == 8 and len({c["pid"] for c in got}) == 1  # one process served both requests
    assert again.result is not None
    manifest = recorded_manifest(out)
    assert {t.key for t in manifest.tools} == {f"mcp/inventory/{name}" for name in specs}


async def test_a_destructive_mcp_tool_waits_at_a_checkpoint_before_it_reaches_the_server(client, tmp_path):
    calls = tmp_path / "calls.jsonl"
    planner = FixedPlanner(step("retire", "discontinue", sku="zz"))
    async with (
        served(load_mcp_tools([stdio_server(calls, offered="discontinue")])) as tools,
        Harness(client, tmp_path, tools=tools, planner=planner) as h,
    ):
        handle = await h.start("retire zz")
        checkpoint = await h.wait_for_checkpoint(handle)
        assert [s.step_id for s in checkpoint.plan.steps] == ["retire"]
        await asyncio.sleep(0.5)
        assert received(calls) == []  # waiting: nothing reached the server
        out = await h.finish(handle, approve_as="reviewer")

    assert out.result is not None, out.failure
    assert [c.status for c in out.record.checkpoints] == ["approved"]
    assert [(s.status, s.output) for s in out.record.steps] == [(StepStatus.SUCCEEDED, {"result": "zz discontinued"})]
    assert [c["tool"] for c in received(calls)] == ["discontinue"]


async def test_a_server_that_dies_is_restarted_and_a_call_it_died_in_retried_then_a_typed_failure(client, tmp_path):
    calls = tmp_path / "calls.jsonl"
    planner = FixedPlanner(step("boom", "crash", reason="test"))
    async with served(load_mcp_tools([stdio_server(calls, offered="crash,stock_level")])) as tools:
        async with Harness(client, tmp_path, tools=tools, planner=planner, settings=FAST) as h:
            out = await h.run("crash it")
            planner.steps = (step("level", "stock_level", sku="abc"),)
            after = await h.run("then a plain call")
            idle_pid = json.loads(after.record.steps[0].output)["pid"]
            os.kill(idle_pid, signal.SIGKILL)  # dies between calls
            while alive(idle_pid):
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the worker reads the end of its output
            revived = await h.run("and one after it died idle")

    assert out.result is not None, out.failure
    [crashed] = out.record.steps
    assert (crashed.status, crashed.error_type) == (StepStatus.FAILED, MCP_SERVER_UNAVAILABLE)
    assert started_attempts(out, "execute_tool_step") == [2]  # retried once, then the step failed
    crashes = [c for c in received(calls) if c["tool"] == "crash"]
    assert len(crashes) == 2 and crashes[0]["pid"] != crashes[1]["pid"]  # a new process for the retry
    assert after.record.steps[0].status is StepStatus.SUCCEEDED  # and again for the next call
    assert idle_pid not in {c["pid"] for c in crashes}
    # A server found dead before a call is started again first: the call does not spend an attempt.
    assert revived.record.steps[0].status is StepStatus.SUCCEEDED
    assert started_attempts(revived, "execute_tool_step") == [1]
    assert json.loads(revived.record.steps[0].output)["pid"] != idle_pid


async def test_a_restarted_worker_lists_and_starts_its_servers_anew_and_old_histories_still_replay(client, tmp_path):
    calls = tmp_path / "calls.jsonl"
    planner = FixedPlanner(step("level", "stock_level", sku="abc"))
    async with served(load_mcp_tools([stdio_server(calls)])) as tools:
        async with Harness(client, tmp_path, tools=tools, planner=planner) as first:
            before = await first.run("stock of abc")
    old_pid = json.loads(before.record.steps[0].output)["pid"]
    assert not alive(old_pid)  # the stopped worker's server process ended with it

    # The server now offers less: the new worker's manifest says so; the first history does not change.
    async with served(load_mcp_tools([stdio_server(calls, offered="stock_level")])) as tools:
        async with Harness(client, tmp_path, tools=tools, planner=planner) as second:
            after = await second.run("stock of abc")
            await first.replay()  # the first worker's history, with the server's new offer in place
    assert after.result is not None, after.failure
    assert json.loads(after.record.steps[0].output)["pid"] != old_pid
    assert "mcp/inventory/reorder" in {t.key for t in recorded_manifest(before).tools}
    assert {t.key for t in recorded_manifest(after).tools} == {"mcp/inventory/stock_level"}


async def test_a_server_down_at_start_up_is_an_error_unless_it_is_optional(tmp_path, caplog):
    down = McpServerConfig(name="down", command=[sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(McpStartupError, match=r"MCP server 'down' \(.*\) is unavailable"):
        load_mcp_tools([down])
    calls = tmp_path / "calls.jsonl"
    tools = load_mcp_tools([down.model_copy(update={"optional": True}), stdio_server(calls, offered="describe")])
    async with served(tools):
        assert [t.spec().key for t in tools] == ["mcp/inventory/describe"]
    assert "MCP server down" in caplog.text and "optional" in caplog.text


async def test_the_model_planner_is_offered_mcp_tools_and_its_calls_reach_the_server(client, tmp_path):
    calls = tmp_path / "calls.jsonl"
    level = function_name("mcp/inventory/stock_level")
    async with (
        ai.OpenAIServer() as server,
        served(load_mcp_tools([stdio_server(calls, offered="stock_level,discontinue")])) as tools,
    ):
        server.push(
            ai.tool_calls((level, {"sku": "abc"})),
            ai.answer("There are 21 units of abc."),  # the model's answer after the tool's result
        )
        model = ModelSettings(base_url=server.base_url, api_key=SecretStr("sk-test"), model="test-model")
        registry = ToolRegistry(tools)
        planner, synthesizer = OpenAIPlanner(model, registry), OpenAISynthesizer(model)
        async with Harness(client, tmp_path, tools=tools, planner=planner, synthesizer=synthesizer) as h:
            out = await h.run("How many abc do we have?")

    assert out.result is not None, out.failure
    assert out.result.response == "There are 21 units of abc."
    offered = server.requests[0]
    assert set(offered.tool_names) == {level, function_name("mcp/inventory/discontinue")}
    assert offered.tool(level)["parameters"]["required"] == ["sku"]  # the server's input schema
    assert [(s.tool, s.status) for s in out.record.steps] == [("inventory/stock_level", StepStatus.SUCCEEDED)]
    assert [(c["tool"], c["arguments"]) for c in received(calls)] == [("stock_level", {"sku": "abc"})]


# --------------------------------------------------------------------------------------------------
# streamable HTTP
# --------------------------------------------------------------------------------------------------


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def http_server(calls: Path) -> Iterator[str]:
    """The inventory server over streamable HTTP on 127.0.0.1; yields its URL."""
    port = _free_port()
    env = {**os.environ, "MCP_CALLS_FILE": str(calls)}
    process = subprocess.Popen(
        [sys.executable, str(SERVERS), "http", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not _listening(port):
            assert process.poll() is None and time.monotonic() < deadline, "the HTTP MCP server did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


async def test_an_http_server_is_called_with_its_decrypted_header_behind_the_ssrf_guard(client, tmp_path):
    calls = tmp_path / "calls.jsonl"
    secrets = SecretBox.from_base64(SecretBox.generate_key())
    with http_server(calls) as url:
        config = McpServerConfig(
            name="inventory",
            url=url,
            headers={"Authorization": secrets.encrypt_value("Bearer mcp-token-1")},
            deny=["wipe_*"],
        )
        with pytest.raises(McpStartupError, match="SSRF protection refused .* loopback"):
            load_mcp_tools([config], secrets=secrets)  # loopback only when the process allows it
        with pytest.raises(McpStartupError, match="encrypted but no AGENT_HOOK_SECRET_KEY"):
            load_mcp_tools([config], allow_loopback=True)
        planner = FixedPlanner(step("level", "stock_level", sku="ab"), step("refused", "reorder", sku="ab", units=-1))
        async with served(load_mcp_tools([config], secrets=secrets, allow_loopback=True)) as tools:
            assert "mcp/inventory/wipe_everything" not in {t.spec().key for t in tools}
            async with Harness(client, tmp_path, tools=tools, planner=planner) as h:
                out = await h.run("stock over http")
            planner.steps = (step("boom", "crash", reason="http"),)
            async with Harness(client, tmp_path, tools=tools, planner=planner, settings=FAST) as h:
                crashed = await h.run("crash the http server")

    assert out.result is not None, out.failure
    level, refused = out.record.steps
    assert level.status is StepStatus.SUCCEEDED and json.loads(level.output)["units"] == 14
    assert (refused.error_type, refused.error) == (
        MCP_TOOL_ERROR,
        "Error executing tool reorder: cannot reorder -1 units",
    )
    got = received(calls)
    assert [c["authorization"] for c in got] == ["Bearer mcp-token-1"] * 3
    assert out.idempotency_key("level", {"sku": "ab"}) in {c["idempotency_key"] for c in got}
    # The server process died in the call: the retry finds nothing listening, and the step fails typed.
    [boom] = crashed.record.steps
    assert (boom.status, boom.error_type) == (StepStatus.FAILED, MCP_SERVER_UNAVAILABLE)
    assert started_attempts(crashed, "execute_tool_step") == [2]


# --------------------------------------------------------------------------------------------------
# The worker process
# --------------------------------------------------------------------------------------------------


def _check(tmp_path: Path, servers: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": servers}))
    env = {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_MCP_SERVERS": str(path)}
    return subprocess.run(
        [sys.executable, "worker.py", "--check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_worker_lists_configured_servers_and_exits_non_zero_when_one_is_down(tmp_path):
    calls = str(tmp_path / "calls.jsonl")
    inventory = {
        "name": "inventory",
        "command": [sys.executable, str(SERVERS), "stdio"],
        "env": {"MCP_CALLS_FILE": calls},
        "allow": ["stock_level", "discontinue"],
    }
    ok = _check(tmp_path, [inventory])
    assert ok.returncode == 0, ok.stderr
    assert "mcp tool: mcp/inventory/stock_level read_only\n" in ok.stdout
    assert "mcp tool: mcp/inventory/discontinue approval_required\n" in ok.stdout
    assert "mcp tool: demo-tools/research-service/company_profile read_only\n" in ok.stdout  # the demo's own

    down = {"name": "ledger", "command": [sys.executable, "-c", "raise SystemExit(1)"]}
    failed = _check(tmp_path, [inventory, down])
    assert failed.returncode == 2
    assert "MCP server error: MCP server 'ledger'" in failed.stderr and "is unavailable" in failed.stderr
    # (A bad file stops it the same way, naming the server and the field: see tests/unit/test_mcp_tool_specs.py.)


def _mcp_children(pid: int) -> list[int]:
    """The worker's child processes that run an MCP server script."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return [child for child in children if b"mcp_server" in Path(f"/proc/{child}/cmdline").read_bytes()]


def test_a_worker_starts_its_stdio_server_for_a_call_and_stops_it_when_it_stops(tmp_path):
    with _running_worker(tmp_path) as env:
        worker = int(env["_PID"])
        assert _mcp_children(worker) == []  # listed at start-up on a connection of its own, then closed
        answered = _cli(env, "run", "Show the company profile of ACME")
        assert answered.returncode == 0, answered.stderr
        assert "Acme Corporation" in answered.stdout
        [server] = _mcp_children(worker)
        log = Path(env["_LOG"]).read_text()
        assert "tools: 4 (1 from MCP servers)" in log
    assert not alive(server)  # stopped with the worker
