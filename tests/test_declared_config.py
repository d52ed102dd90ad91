"""Declared hooks without a workflow: the file's validation naming entry and field,
the worker refusing a bad file, the registry's one ordering rule, SSRF ranges and address pinning,
secrets, the audit store's encryption and retention, and the dry run writing no row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from client import Settings
from client.pipeline import PipelineSettingsError, build_pipeline
from client.settings import SettingsError
from demo.agent import RulePlanner
from hooks import HookRegistry, InvalidPipelineConfigError, PipelineHook
from hooks.declarative import (
    BlockedAddress,
    DeclaredHookConfigError,
    DeclaredHookRuntime,
    ExecutionRow,
    HookStore,
    SecretBox,
    address_problem,
    declared_hook,
    declared_hooks,
    dry_run,
    parse_hooks,
    resolve_target,
)
from hooks.declarative.handlers import HandlerError, post_json
from workflows.models import HookChain

from .hook_servers import ChatCompletions, Reply, Webhook, decide_reply

REPO_ROOT = Path(__file__).resolve().parents[1]
KEY = SecretBox.generate_key()


def command(id: str, **fields) -> dict:
    return {"id": id, "event": "pre_tool_use", "handler_type": "command", "config": {"command": "true"}, **fields}


# --------------------------------------------------------------------------------------------------
# Validation: a bad entry names the entry and the field
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entries, index, hook, field, fragment",
    [
        ([command("ok"), command("slow", timeout_ms=20_000)], 1, "slow", "timeout_ms", "less than or equal to 10000"),
        ([command("x", event="tool_call")], 0, "x", "event", "session_start"),
        ([command("x", handler_type="agent")], 0, "x", "handler_type", "command"),
        ([command("x", matcher="(unclosed")], 0, "x", "matcher", "regular expression"),
        ([command("x", if_expr="tool_name ==")], 0, "x", "if_expr", "CEL"),
        ([command("x", scope="tenant")], 0, "x", "tenant_id", "tenant hook"),
        ([command("x", scope="agent", tenant_id="t")], 0, "x", "agent_id", "agent hook"),
        ([command("x", on_timeout="maybe")], 0, "x", "on_timeout", "block"),
        ([command("x"), command("x")], 1, "x", "id", "already used by entry 0"),
        (
            [
                {
                    "id": "p",
                    "event": "pre_tool_use",
                    "handler_type": "prompt",
                    "config": {"prompt_template": "judge", "model": "m", "endpoint": "http://127.0.0.1:1/v1"},
                }
            ],
            0,
            "p",
            "matcher",
            "matcher or an if_expr",
        ),
        (
            [
                {
                    "id": "h",
                    "event": "pre_tool_use",
                    "handler_type": "http",
                    "config": {"url": "https://hooks.example/x", "headers": {"Authorization": "Bearer plain"}},
                }
            ],
            0,
            "h",
            "config.headers",
            "must be stored encrypted",
        ),
        (
            [{"id": "h", "event": "stop", "handler_type": "http", "config": {"url": "ftp://x"}}],
            0,
            "h",
            "config.url",
            "http(s)",
        ),
        ([command("x", config={"command": "true", "shell": True})], 0, "x", "config.shell", "Extra inputs"),
        (
            [{"id": "s", "event": "stop", "handler_type": "command", "config": {"command": "true"}, "matcher": "x"}],
            0,
            "s",
            "matcher",
            "no tool",
        ),
    ],
    ids=[
        "timeout-over-max",
        "unknown-event",
        "unknown-handler",
        "bad-regex",
        "bad-cel",
        "tenant-without-id",
        "agent-without-agent-id",
        "bad-on-timeout",
        "duplicate-id",
        "prompt-unguarded",
        "plaintext-secret-header",
        "bad-url",
        "unknown-config-field",
        "matcher-on-toolless-event",
    ],
)
def test_a_bad_entry_is_refused_naming_the_entry_and_the_field(entries, index, hook, field, fragment):
    with pytest.raises(DeclaredHookConfigError) as caught:
        parse_hooks({"hooks": entries})
    err = caught.value
    assert (err.index, err.hook, err.field, err.reason) == (index, hook, field, "invalid_declared_hook")
    assert f"entry {index} ({hook!r}): field {field}: " in str(err)
    assert fragment in str(err)


def test_defaults_follow_the_seed():
    """An entry that sets nothing else gets a 5 s timeout that blocks on a blocking event and allows on an
    observing one, global scope, priority 0, enabled, version 1."""
    [blocking, observer] = parse_hooks({"hooks": [command("a"), command("b", event="post_tool_use")]})
    assert blocking.timeout_ms == 5000 and blocking.timeout_decision == "block"
    assert observer.timeout_decision == "allow"
    assert blocking.scope == "global" and blocking.priority == 0 and blocking.enabled and blocking.version == 1


def test_the_worker_refuses_to_start_with_a_bad_hooks_file(tmp_path):
    bad = tmp_path / "hooks.json"
    bad.write_text(json.dumps({"hooks": [command("fine"), command("too-slow", timeout_ms=60_000)]}))
    env = {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_HOOKS_FILE": str(bad)}
    run = subprocess.run(
        [sys.executable, "worker.py", "--check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "invalid_declared_hook" in run.stderr
    assert "entry 1 ('too-slow'): field timeout_ms" in run.stderr

    good = tmp_path / "hooks.toml"
    good.write_text(
        '[[hooks]]\nid = "audit-tools"\nevent = "post_tool_use"\nhandler_type = "command"\npriority = 5\n'
        '[hooks.config]\ncommand = "true"\n'
    )
    env["AGENT_HOOKS_FILE"] = str(good)
    run = subprocess.run(
        [sys.executable, "worker.py", "--check"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    # Listed in execution order: priority 5 runs before the demo's priority-0 hooks.
    assert run.stdout.splitlines()[1].endswith(": audit-tools [after_tool] priority 5"), run.stdout


# --------------------------------------------------------------------------------------------------
# One registry, one ordering rule
# --------------------------------------------------------------------------------------------------


class PyTool(PipelineHook):
    def __init__(self, name: str, **options) -> None:
        self.name = name
        for key, value in options.items():
            setattr(self, key, value)

    async def before_tool(self, ctx, call):
        return None


def test_python_and_declared_hooks_order_by_priority_then_registration(tmp_path):
    runtime = DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"))
    declared = declared_hooks(
        parse_hooks({"hooks": [command("d-low", priority=-1), command("d-high", priority=10), command("d-zero")]}),
        runtime,
    )
    registry = HookRegistry([PyTool("py-first"), *declared, PyTool("py-urgent", priority=10)])
    assert [e.name for e in registry.entries] == ["d-high", "py-urgent", "py-first", "d-zero", "d-low"]
    # The zero-based registration index still names each entry.
    assert [e.index for e in registry.entries] == [2, 4, 0, 3, 1]
    assert registry.hook("d-high").spec.id == "d-high"


def test_scope_filtering_keeps_global_tenant_and_agent_hooks_only(tmp_path):
    runtime = DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"))
    declared = declared_hooks(
        parse_hooks(
            {
                "hooks": [
                    command("everyone"),
                    command("tenant-a", scope="tenant", tenant_id="a"),
                    command("tenant-b", scope="tenant", tenant_id="b"),
                    command("agent-a-x", scope="agent", tenant_id="a", agent_id="x"),
                    command("agent-b-x", scope="agent", tenant_id="b", agent_id="x"),
                ]
            }
        ),
        runtime,
    )
    registry = HookRegistry(declared)
    names = lambda t, a: [e.name for e in registry.visible_entries(t, a)]  # noqa: E731
    assert names("a", "x") == ["everyone", "tenant-a", "agent-a-x"]
    assert names("a", None) == ["everyone", "tenant-a"]
    assert names("b", "x") == ["everyone", "tenant-b", "agent-b-x"]
    assert names(None, "x") == ["everyone"]


def test_a_python_hook_with_a_bad_scope_is_refused():
    with pytest.raises(Exception) as caught:
        HookRegistry([PyTool("scoped", scope="tenant")])
    assert "tenant_id" in str(caught.value) and getattr(caught.value, "reason", None) == "invalid_option"


# --------------------------------------------------------------------------------------------------
# SSRF: every range, with a table of addresses, and pinning
# --------------------------------------------------------------------------------------------------

SSRF_TABLE = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("10.0.0.1", "private"),
    ("10.255.255.254", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.254", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("169.254.169.254", "link_local"),
    ("fe80::1", "link_local"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "link_local"),
    ("2002:a00:1::1", "private"),  # 6to4 carrying 10.0.0.1
    ("64:ff9b::a00:1", "reserved"),  # NAT64 carrying 10.0.0.1: the whole well-known prefix is refused
    ("::127.0.0.1", "reserved"),  # deprecated IPv4-compatible form
    ("100.64.0.1", "shared_address_space"),
    ("100.127.255.254", "shared_address_space"),
    ("240.0.0.1", "private"),  # reserved (Python counts it private)
    ("198.18.0.1", "private"),  # benchmarking
    ("8.8.8.8", None),
    ("1.1.1.1", None),
    ("172.32.0.1", None),  # just outside 172.16/12
    ("2606:4700:4700::1111", None),
]


@pytest.mark.parametrize("address, problem", SSRF_TABLE, ids=[a for a, _ in SSRF_TABLE])
def test_ssrf_ranges(address, problem):
    assert address_problem(address) == problem
    loopback = problem == "loopback"
    # Loopback only when explicitly allowed; enabling it opens nothing else.
    assert address_problem(address, allow_loopback=True) == (None if loopback else problem)


async def test_a_host_resolving_to_loopback_is_refused_unless_enabled():
    with pytest.raises(BlockedAddress, match="loopback"):
        await resolve_target("localhost", 80)
    pinned = await resolve_target("localhost", 80, allow_loopback=True)
    assert address_problem(pinned.address, allow_loopback=True) is None and pinned.host == "localhost"
    with pytest.raises(BlockedAddress, match="private"):
        await resolve_target("10.1.2.3", 443)


async def test_the_request_is_pinned_to_the_checked_address_keeping_host_and_server_name(monkeypatch):
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"decision": "allow"})

    async def resolved(host, port, *, allow_loopback=False):
        from hooks.declarative.security import ResolvedTarget

        return ResolvedTarget(host=host, address="93.184.215.14", port=port)

    monkeypatch.setattr("hooks.declarative.handlers.resolve_target", resolved)
    response = await post_json(
        "https://hooks.example.org:8443/check?x=1",
        {"a": 1},
        {"X-Test": "1"},
        allow_loopback=False,
        transport=httpx.MockTransport(handler),
    )
    [request] = seen
    assert response.status == 200 and response.address == "93.184.215.14"
    assert request.url.host == "93.184.215.14" and request.url.port == 8443 and request.url.path == "/check"
    assert request.headers["host"] == "hooks.example.org:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.org"
    assert json.loads(request.content) == {"a": 1}


async def test_a_real_post_reaches_the_pinned_loopback_address_with_the_original_host_header():
    server = Webhook(Reply(body={"decision": "allow"}))
    try:
        port = server.httpd.server_address[1]
        with pytest.raises(HandlerError, match="SSRF protection refused"):
            await post_json(f"http://localhost:{port}/hook", {"x": 1}, {}, allow_loopback=False)
        assert server.received == []
        response = await post_json(f"http://localhost:{port}/hook", {"x": 1}, {}, allow_loopback=True)
        assert response.status == 200
        [received] = server.received
        assert received.headers["host"] == f"localhost:{port}" and received.body == {"x": 1}
    finally:
        server.close()


# --------------------------------------------------------------------------------------------------
# Secrets and the audit store
# --------------------------------------------------------------------------------------------------


def test_header_secrets_round_trip_and_never_decrypt_under_another_key():
    box = SecretBox.from_base64(KEY)
    stored = box.encrypt_value("Bearer s3cret")
    assert stored.startswith("enc:v1:") and "s3cret" not in stored
    assert box.decrypt_value(stored) == "Bearer s3cret"
    assert box.encrypt_value("Bearer s3cret") != stored  # a fresh nonce each time
    with pytest.raises(ValueError):
        SecretBox.from_base64(SecretBox.generate_key()).decrypt_value(stored)
    with pytest.raises(ValueError, match="32 bytes"):
        SecretBox(b"short")


def row(key: str, error: str | None = None, decision: str = "block", hook_id: str = "h") -> ExecutionRow:
    return ExecutionRow(
        dedup_key=key,
        hook_id=hook_id,
        hook_label=hook_id,
        hook_version=1,
        event="pre_tool_use",
        handler_type="command",
        decision=decision,
        reason="x",
        status="error" if error else "completed",
        duration_ms=1.0,
        error=error,
    )


def test_audit_error_is_truncated_and_the_full_error_encrypted(tmp_path):
    box = SecretBox.from_base64(KEY)
    store = HookStore(tmp_path / "h.sqlite3", secrets=box)
    store.register(parse_hooks({"hooks": [command("h")]})[0])
    long_error = "token=abc " + "x" * 600 + " END"
    store.record_execution(row("k1", long_error), counts_as_block=True)
    [written] = store.executions()
    assert len(written.error) == 256 and written.error.startswith("token=abc")
    assert written.error_detail is not None and b"END" not in written.error_detail and len(written.error_nonce) == 12
    assert store.open_error(written) == long_error
    # A key that is not the store's reads nothing.
    other = HookStore(tmp_path / "h.sqlite3", secrets=SecretBox.from_base64(SecretBox.generate_key()))
    with pytest.raises(ValueError):
        other.open_error(other.executions()[0])


def test_the_same_dedup_key_writes_once_and_deleting_a_hook_keeps_its_executions(tmp_path):
    store = HookStore(tmp_path / "h.sqlite3")
    store.register(parse_hooks({"hooks": [command("h")]})[0])
    store.record_execution(row("same"), counts_as_block=True)
    store.record_execution(row("same"), counts_as_block=True)
    assert len(store.executions()) == 1
    assert store.state("h").consecutive_blocks == 1  # the ignored duplicate did not move the breaker
    assert store.delete_hook("h")
    [kept] = store.executions()
    assert kept.hook_id is None and kept.hook_label == "h" and kept.decision == "block"


def test_budget_deduction_warns_at_twenty_percent_left(tmp_path):
    store = HookStore(tmp_path / "h.sqlite3", default_budget=1000)
    assert store.budget_remaining("t") == (1000, 1000)
    assert not store.charge_budget("t", 700).warn
    charge = store.charge_budget("t", 150)
    assert (charge.remaining, charge.warn) == (150, True)
    assert store.charge_budget("t", 500).remaining == 0


# --------------------------------------------------------------------------------------------------
# Dry run: decision, duration and output, no audit row
# --------------------------------------------------------------------------------------------------


def test_the_dry_run_command_prints_the_decision_and_writes_no_row(tmp_path):
    script = tmp_path / "deny.sh"
    script.write_text('read -r event\necho "no rm: $event" >&2\nexit 2\n')
    file = tmp_path / "hooks.json"
    file.write_text(
        json.dumps({"hooks": [command("deny-rm", config={"command": f"bash {script}"}, matcher="^shell/")]})
    )
    env = {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state")}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "client.cli",
            "hooks",
            "dry-run",
            "--file",
            str(file),
            "--hook",
            "deny-rm",
            "--event-json",
            json.dumps({"tool_name": "shell/exec", "tool_input": {"cmd": "rm -rf /"}}),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert shown["decision"] == "block" and shown["status"] == "completed"
    assert shown["output"]["exit_code"] == 2 and "rm -rf" in shown["output"]["stderr"]
    assert shown["duration_ms"] >= 0
    store = HookStore(tmp_path / "state" / "hooks.sqlite3")
    assert store.executions() == []


async def test_dry_run_shows_updated_input_and_leaves_the_store_untouched(tmp_path):
    server = Webhook(Reply(body={"decision": "allow", "updatedInput": {"cmd": "ls"}}))
    try:
        store = HookStore(tmp_path / "h.sqlite3")
        runtime = DeclaredHookRuntime(store=store, allow_loopback=True)
        [spec] = parse_hooks(
            {"hooks": [{"id": "w", "event": "pre_tool_use", "handler_type": "http", "config": {"url": server.url}}]}
        )
        result = await dry_run(
            spec, runtime, {"tool_name": "shell/exec", "tool_input": {"cmd": "rm"}, "tenant_id": "t1"}
        )
        assert (result.decision, result.updated_input, result.output["http_status"]) == ("allow", {"cmd": "ls"}, 200)
        assert server.received[0].body["tenant_id"] == "t1" and server.received[0].body["tool_input"] == {"cmd": "rm"}
        assert store.executions() == []
    finally:
        server.close()


# --------------------------------------------------------------------------------------------------
# Editions and the chain budget: refused at start-up
# --------------------------------------------------------------------------------------------------


def http(id: str, **fields) -> dict:
    return {
        "id": id,
        "event": "pre_tool_use",
        "handler_type": "http",
        "config": {"url": "https://hooks.example/x"},
        **fields,
    }


def test_the_standard_edition_refuses_command_handlers_when_the_hooks_are_built(tmp_path):
    standard = DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"), edition="standard")
    specs = parse_hooks({"hooks": [http("web"), command("local", enabled=False)]})
    with pytest.raises(DeclaredHookConfigError) as caught:
        declared_hooks(specs, standard, source="hooks.json")
    err = caught.value
    assert (err.index, err.hook, err.field) == (1, "local", "handler_type")
    assert (
        "hooks.json: entry 1 ('local'): field handler_type: command handlers are not available in the standard edition"
        in str(err)
    )
    # One hook on its own is held to the edition too; http and prompt handlers are allowed.
    with pytest.raises(DeclaredHookConfigError, match="standard edition"):
        declared_hook(specs[1], standard)
    assert [h.name for h in declared_hooks(specs[:1], standard)] == ["web"]
    # lite (the default) allows every handler type.
    lite = DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"))
    assert lite.edition == "lite" and [
        h.name for h in declared_hooks(specs[:1] + [parse_hooks({"hooks": [command("c")]})[0]], lite)
    ] == ["web", "c"]


def test_a_runtime_refuses_an_unknown_edition_or_a_budget_over_ten_seconds(tmp_path):
    store = HookStore(tmp_path / "h.sqlite3")
    with pytest.raises(ValueError, match="edition must be one of lite, standard"):
        DeclaredHookRuntime(store=store, edition="enterprise")  # type: ignore[arg-type]
    for budget in (10.5, 0.0):
        with pytest.raises(ValueError, match=r"chain_budget_seconds must be in \(0, 10\]"):
            DeclaredHookRuntime(store=store, chain_budget_seconds=budget)


def test_blocking_hooks_join_their_events_chain_and_observers_join_none(tmp_path):
    runtime = DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"), chain_budget_seconds=4)
    hooks = declared_hooks(
        parse_hooks(
            {
                "hooks": [
                    command("strict"),
                    command("lenient", on_timeout="allow"),
                    command("prompt-gate", event="user_prompt_submit"),
                    command("audit", event="post_tool_use"),
                    command("bye", event="stop"),
                ]
            }
        ),
        runtime,
    )
    chains = {e.name: e.chain for e in HookRegistry(hooks).entries}
    assert chains["strict"] == HookChain(event="pre_tool_use", budget_seconds=4, on_exhausted="block")
    assert chains["lenient"] == HookChain(event="pre_tool_use", budget_seconds=4, on_exhausted="allow")
    assert chains["prompt-gate"] == HookChain(event="user_prompt_submit", budget_seconds=4, on_exhausted="block")
    assert chains["audit"] is None and chains["bye"] is None
    with pytest.raises(InvalidPipelineConfigError, match="chain must be a HookChain or None"):
        HookRegistry([PyTool("odd", chain={"event": "x"})])


def worker_check(tmp_path: Path, hooks: list[dict], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    file = tmp_path / "hooks.json"
    file.write_text(json.dumps({"hooks": hooks}))
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AGENT_HOOK")},
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_HOOKS_FILE": str(file),
        "TEMPORAL_ADDRESS": "127.0.0.1:9",  # never reached: the configuration is refused first
        "AGENT_TEMPORAL_WAIT_SECONDS": "0",
        **env,
    }
    return subprocess.run(
        [sys.executable, "worker.py", *args], cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("args", [("--check",), ()], ids=["check", "start"])
def test_a_standard_worker_refuses_a_command_hook_at_start_up(tmp_path, args):
    run = worker_check(tmp_path, [http("web"), command("local-guard")], *args, AGENT_HOOK_EDITION="standard")
    assert run.returncode == 2, run.stdout + run.stderr
    assert (
        "entry 1 ('local-guard'): field handler_type: command handlers are not available in the standard edition"
        in (run.stderr)
    )
    assert "Traceback" not in run.stderr


def test_a_standard_worker_starts_with_http_hooks(tmp_path):
    """(lite, the default, allowing a command hook: ``test_the_worker_refuses_to_start_with_a_bad_hooks_file``.)"""
    standard = worker_check(tmp_path, [http("web")], "--check", AGENT_HOOK_EDITION="standard")
    assert standard.returncode == 0, standard.stderr
    assert "web [before_tool]" in standard.stdout


def test_a_bad_edition_or_chain_budget_is_refused_naming_the_variable(tmp_path):
    run = worker_check(tmp_path, [http("web")], AGENT_HOOK_EDITION="enterprise")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "configuration error: AGENT_HOOK_EDITION: Input should be 'lite' or 'standard'" in run.stderr
    # The worker reports any settings error this way (variable: message); the budget's bounds:
    for value, fragment in (("11", "less than or equal to 10"), ("0", "greater than 0"), ("10", None)):
        try:
            settings = Settings.from_env({"AGENT_HOOK_CHAIN_BUDGET_SECONDS": value})
        except SettingsError as err:
            assert str(err).startswith("AGENT_HOOK_CHAIN_BUDGET_SECONDS: ")
            assert fragment is not None and fragment in str(err)
        else:
            assert fragment is None and settings.hook_chain_budget_seconds == 10.0
    assert Settings.from_env({}).hook_edition == "lite"


def test_the_settings_hold_a_pipelines_own_declared_hooks_to_the_edition_and_budget(tmp_path):
    own = declared_hooks(
        parse_hooks({"hooks": [command("own-guard")]}), DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"))
    )
    settings = Settings.from_env({"AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_HOOK_EDITION": "standard"})
    with pytest.raises(DeclaredHookConfigError, match="'own-guard'.*standard edition"):
        build_pipeline(settings, hooks=own, planner=RulePlanner())
    budget = Settings.from_env({"AGENT_STATE_DIR": str(tmp_path / "state"), "AGENT_HOOK_CHAIN_BUDGET_SECONDS": "5"})
    with pytest.raises(PipelineSettingsError, match="AGENT_HOOK_CHAIN_BUDGET_SECONDS.*own-guard.*10 s"):
        build_pipeline(budget, hooks=own, planner=RulePlanner())
    assert build_pipeline(
        Settings.from_env({"AGENT_STATE_DIR": str(tmp_path / "state")}), hooks=own, planner=RulePlanner()
    )


# --------------------------------------------------------------------------------------------------
# Files others could change, and commands that are not there: refused at start-up
# --------------------------------------------------------------------------------------------------

NOBODY = 65534


def guarded_by(command_line: str) -> list[dict]:
    return [command("guard", config={"command": command_line})]


def hook_script(directory: Path, mode: int = 0o644) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "guard.sh"
    path.write_text("cat >/dev/null\nexit 0\n")
    path.chmod(mode)
    return path


def _world_writable_hooks_file(tmp_path: Path) -> tuple[list[dict], str]:
    (tmp_path / "hooks.json").touch()
    (tmp_path / "hooks.json").chmod(0o666)
    return [command("guard")], f"declared hooks file {tmp_path / 'hooks.json'} is writable by group or others"


def _group_writable_script(tmp_path: Path) -> tuple[list[dict], str]:
    script = hook_script(tmp_path / "bin", 0o664)
    return guarded_by(f"bash {script}"), f"script {script} is writable by group or others (mode 664)"


def _world_writable_executable(tmp_path: Path) -> tuple[list[dict], str]:
    script = hook_script(tmp_path / "bin", 0o777)
    script.write_text("#!/bin/sh\nexit 0\n")
    return guarded_by(str(script)), f"command {script} is writable by group or others"


def _script_of_another_user(tmp_path: Path) -> tuple[list[dict], str]:
    script = hook_script(tmp_path / "bin")
    os.chown(script, NOBODY, NOBODY)
    return guarded_by(f"bash {script}"), f"script {script} is owned by nobody"


def _script_in_a_world_writable_directory(tmp_path: Path) -> tuple[list[dict], str]:
    script = hook_script(tmp_path / "shared")
    (tmp_path / "shared").chmod(0o777)
    return guarded_by(f"bash {script}"), "which others can write without the sticky bit"


def _symlink_in_a_world_writable_directory(tmp_path: Path) -> tuple[list[dict], str]:
    script = hook_script(tmp_path / "bin")
    (tmp_path / "shared").mkdir(mode=0o777)
    (tmp_path / "shared").chmod(0o777)
    (tmp_path / "shared" / "guard.sh").symlink_to(script)
    return guarded_by(f"bash {tmp_path / 'shared' / 'guard.sh'}"), f"is in {tmp_path / 'shared'}"


def _missing_command(tmp_path: Path) -> tuple[list[dict], str]:
    return guarded_by("no-such-hook-binary --check"), "command 'no-such-hook-binary' cannot be started"


def _missing_script(tmp_path: Path) -> tuple[list[dict], str]:
    return guarded_by(f"python3 {tmp_path / 'gone.py'}"), "gone.py does not exist"


REFUSALS = {
    "world-writable-hooks-file": (_world_writable_hooks_file, "untrusted_hook_file", "fix: chmod go-w"),
    "group-writable-script": (_group_writable_script, "untrusted_hook_file", "fix: chmod go-w"),
    "world-writable-executable": (_world_writable_executable, "untrusted_hook_file", "fix: chmod go-w"),
    "script-of-another-user": (_script_of_another_user, "untrusted_hook_file", "fix: chown root"),
    "world-writable-directory": (_script_in_a_world_writable_directory, "untrusted_hook_file", "fix: chmod o-w"),
    "symlink-in-world-writable-directory": (
        _symlink_in_a_world_writable_directory,
        "untrusted_hook_file",
        "fix: chmod o-w",
    ),
    "missing-command": (_missing_command, "invalid_declared_hook", "entry 0 ('guard'): field config.command"),
    "missing-script": (_missing_script, "invalid_declared_hook", "entry 0 ('guard'): field config.command"),
}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize(
    "case, args",
    [*((case, ("--check",)) for case in REFUSALS), ("world-writable-hooks-file", ()), ("group-writable-script", ())],
    ids=[*(f"{case}-check" for case in REFUSALS), "world-writable-hooks-file-start", "group-writable-script-start"],
)
def test_the_worker_refuses_hooks_files_and_commands_others_could_change_or_that_are_missing(tmp_path, case, args):
    """``--check`` and the worker's start both refuse, before anything connects, with one line naming the
    file and the fix, and exit 2: a hooks file, command or interpreter script that is writable by group
    or others, owned by another user, or in a directory others can write without the sticky bit (through
    a symlink too), and a command or script that is not there."""
    make, reason, fix = REFUSALS[case]
    hooks, problem = make(tmp_path)
    run = worker_check(tmp_path, hooks, *args)  # (rewriting the file keeps its mode)
    assert run.returncode == 2, run.stdout + run.stderr
    [line] = [line for line in run.stderr.splitlines() if line.startswith("pipeline configuration error")]
    assert line.startswith(f"pipeline configuration error ({reason}): ") and problem in line and fix in line, line
    assert "Traceback" not in run.stderr and "pipeline ok" not in run.stdout and "worker polling" not in run.stdout


def test_a_command_in_a_sticky_shared_directory_is_trusted_and_a_disabled_hook_is_not_checked(tmp_path):
    """A world-writable directory with the sticky bit (like /tmp) lets no one replace another's file; a
    disabled hook never runs, so its command is not checked."""
    script = hook_script(tmp_path / "shared")
    (tmp_path / "shared").chmod(0o1777)
    hooks = [
        command("guard", config={"command": f"bash {script}"}),
        command("off", enabled=False, config={"command": "no-such-hook-binary"}),
    ]
    run = worker_check(tmp_path, hooks, "--check")
    assert run.returncode == 0, run.stderr
    assert "guard [before_tool]" in run.stdout and "pipeline ok" in run.stdout


def test_building_the_hooks_refuses_what_the_worker_refuses(tmp_path):
    """The same check holds declared hooks a pipeline builds itself (``declared_hooks``): it names the
    entry, the field and the fix."""
    script = hook_script(tmp_path / "bin", 0o646)
    runtime = DeclaredHookRuntime(store=HookStore(tmp_path / "h.sqlite3"))
    with pytest.raises(DeclaredHookConfigError) as caught:
        declared_hooks(
            parse_hooks({"hooks": [command("ok"), command("bad", config={"command": f"bash {script}"})]}), runtime
        )
    err = caught.value
    assert (err.reason, err.index, err.hook, err.field) == ("untrusted_hook_file", 1, "bad", "config.command")
    assert f"fix: chmod go-w {script}" in str(err)
    with pytest.raises(DeclaredHookConfigError, match="cannot be started") as missing:
        declared_hook(parse_hooks({"hooks": [command("gone", config={"command": "no-such-hook-binary"})]})[0], runtime)
    assert missing.value.reason == "invalid_declared_hook"


@pytest.mark.parametrize("tokens", [-1000, float("inf"), "lots", None], ids=["negative", "infinite", "text", "none"])
async def test_an_evaluator_reporting_nonsense_usage_never_refunds_the_budget(tmp_path, tokens):
    """The tokens an evaluator says it used are deducted from the tenant's budget: a negative, infinite
    or non-numeric count deducts nothing — and gives nothing back."""
    reply = decide_reply("allow", "fine")
    reply.body["usage"] = {"total_tokens": tokens}
    llm = ChatCompletions(lambda body: reply)
    try:
        store = HookStore(tmp_path / "h.sqlite3")
        store.set_budget("acme", 200, used=100)
        runtime = DeclaredHookRuntime(store=store, allow_loopback=True)
        [spec] = parse_hooks(
            {
                "hooks": [
                    {
                        "id": "judge",
                        "event": "pre_tool_use",
                        "handler_type": "prompt",
                        "matcher": "^shell/",
                        "config": {"prompt_template": "judge", "model": "m", "endpoint": llm.endpoint},
                    }
                ]
            }
        )
        result = await dry_run(
            spec, runtime, {"tool_name": "shell/exec", "tool_input": {"cmd": "ls"}, "tenant_id": "acme"}
        )
    finally:
        llm.close()
    assert (result.decision, result.status) == ("allow", "completed")
    assert store.budget_remaining("acme") == (100, 200)
