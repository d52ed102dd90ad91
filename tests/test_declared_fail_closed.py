"""Declared hooks fail closed on blocking events whatever the handler does, through real requests: a
command hook guarding a tool answers with an oversized block reason, cut-off JSON, garbage, floods of
stdout or stderr, or leaves processes behind — the tool never runs, the audit row says block with the
reason, the worker reads no more than the cap, and every process the hook started is dead afterwards.
(The http and prompt handlers' answers: ``test_declared_hooks``; files others could change, refused at
start-up: ``test_declared_config``.)"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hooks.declarative.handlers import MAX_RESPONSE_BYTES
from workflows.models import EffectStatus, StepStatus

from .doubles import effect_child, stored_effects
from .test_declared_hooks import (
    REPO_ROOT,
    Echo,
    Shell,
    cmd_hook,
    declare,
    harness,
    rows,
    runtime_for,
    script,
    shell,
    steps,
)

MiB = 1024 * 1024

# Each hostile hook guards the step whose command is its name; what the audit row must say.
HOSTILE = {
    "oversized-block-reason": (
        'printf \'{"decision": "block", "reason": "\'\nhead -c 1100000 /dev/zero | tr \'\\0\' x\nprintf \'"}\\n\'\n',
        "output_over_cap",
    ),
    "truncated-json": ('printf \'{"decision": "block", "rea\'\n', "unparseable_output"),
    "garbage": ("echo 'LGTM, go ahead'\n", "unparseable_output"),
    "not-utf8": ("printf '\\377\\376{}'\n", "unparseable_output"),
    "json-not-an-object": ("echo '\"allow\"'\n", "invalid_output"),
    "continue-not-a-bool": ('echo \'{"continue": "false"}\'\n', "invalid_output"),
    "unknown-decision": ('echo \'{"decision": "yes"}\'\n', "invalid_output"),
    "stdout-flood": ("head -c 400000000 /dev/zero\n", "output_over_cap"),
    "stdout-flood-forever": (f"exec {sys.executable} -c 'while True: print(\"x\" * 65536)'\n", "output_over_cap"),
    "stderr-flood": ("yes no >&2\n", "output_over_cap"),
}
FLOODS = ("stdout-flood", "stdout-flood-forever", "stderr-flood")


def dead(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie: killed, not yet reaped by its parent)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def zombie_children() -> list[int]:
    """Processes the test process (which runs the worker) has not reaped."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry.name))
    return found


def decided(rt, hook: str):
    """The hook's one audit row that decided (its CEL filter skipped it for the other steps)."""
    [row] = [r for r in rows(rt, hook) if r.decision != "skip"]
    return row


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def test_hostile_answers_block_the_guarded_call_with_their_reason(client, tmp_path):
    """One request, one step per hostile hook (each guards the step named after it), plus two steps whose
    hooks behave (empty stdout, and an allowing answer), a post_tool_use observer that answers garbage,
    and a script made writable by others after start-up. Only the well-guarded steps run."""
    ran = tmp_path / "ran"
    hooks = [
        cmd_hook(name, script(tmp_path, f"{name}.sh", f"cat >/dev/null\n{body}"), if_expr=f'tool_input.cmd == "{name}"')
        for name, (body, _) in HOSTILE.items()
    ]
    hooks += [
        cmd_hook("silent", script(tmp_path, "silent.sh", "cat >/dev/null\nexit 0\n"), if_expr='tool_input.cmd == "ok"'),
        cmd_hook(
            "answers",
            script(tmp_path, "answers.sh", 'cat >/dev/null\necho \'{"decision": "allow"}\'\n'),
            if_expr='tool_input.cmd == "also-ok"',
        ),
        cmd_hook(
            "tampered",
            script(tmp_path, "tampered.sh", f'echo ran >> "{ran}"\nexit 0\n'),
            if_expr='tool_input.cmd == "tampered"',
        ),
        cmd_hook(
            "observer",
            script(tmp_path, "observer.sh", "cat >/dev/null\necho 'not json at all'\n"),
            event="post_tool_use",
            if_expr='tool_input.cmd == "ok"',
        ),
    ]
    rt = runtime_for(tmp_path / "hooks.sqlite3")
    declared = declare(rt, *hooks)
    # Writable by others after the worker started: checked again before it runs, and never run.
    (tmp_path / "tampered.sh").chmod(0o666)
    tool = Shell()
    plan = [shell(name, name) for name in [*HOSTILE, "ok", "also-ok", "tampered"]]
    async with harness(client, tmp_path, declared, *plan, tools=[tool, Echo()]) as h:
        before = peak_rss_mib()
        out = await h.run("trade")
        grown = peak_rss_mib() - before
        await effect_child(h, client, out, "hook.observer.post_tool_use.ok")
        stored = await stored_effects(out, "hook.observer.post_tool_use.ok")

    assert out.failure is None, out.failure
    # Only the steps whose hooks behaved ran: in history, and by the tool's own account.
    assert sorted(tool.ran) == ["also-ok", "ok"]
    assert sorted(a.summary for a in out.tool_activities) == [
        "execute · shell/exec (also-ok)",
        "execute · shell/exec (ok)",
    ]
    for name, (_, reason) in HOSTILE.items():
        step = steps(out)[name]
        assert (step.status, step.skipped_by, step.skip_detail) == (StepStatus.SKIPPED, name, reason), name
        assert step.result == f"blocked by hook {name}: {reason}"
        row = decided(rt, name)
        assert (row.decision, row.status, row.reason) == ("block", "error", reason), name
    # Floods were stopped at the cap: only about the cap was read, and the worker did not hold the rest.
    for name in FLOODS:
        row = decided(rt, name)
        stream = "stderr_len" if name.startswith("stderr") else "stdout_len"
        assert MAX_RESPONSE_BYTES < row.metadata[stream] <= MAX_RESPONSE_BYTES + 2 * MiB, (name, row.metadata)
        assert "more than 1048576 bytes" in row.error
    assert grown < 150, f"the worker's peak memory grew by {grown:.0f} MiB"
    tampered = decided(rt, "tampered")
    assert (tampered.decision, tampered.status, tampered.reason) == ("block", "error", "untrusted_command")
    assert "chmod go-w" in tampered.error and not ran.exists()
    # An observer's garbage is recorded as its problem, and changes nothing.
    observed = decided(rt, "observer")
    assert (observed.decision, observed.status, observed.reason) == ("allow", "error", "unparseable_output")
    effect = stored.effect("hook.observer.post_tool_use.ok")
    assert effect.status is EffectStatus.FAILED and "unparseable_output" in effect.error
    assert steps(out)["ok"].result == "ran ok"
    assert zombie_children() == []


@pytest.mark.parametrize(
    "escape",
    [
        'setsid sleep 300 &\necho $! > "$PID_FILE"',
        'setsid env -i sleep 300 &\necho $! > "$PID_FILE"',
        '( setsid sleep 300 & echo $! > "$PID_FILE" )',
    ],
    ids=["new-session", "new-session-clean-environment", "orphaned-in-a-new-session"],
)
async def test_a_hanging_hook_is_killed_with_every_process_it_started_at_its_timeout(client, tmp_path, escape):
    """A hook that starts a process outside its group and session — one that also drops its environment
    (found through its living parent), or one orphaned at once (found by its mark) — then hangs: its own
    timeout (1 s) ends it, not the chain's, and kills the whole tree; its audit row says timeout, the
    call is blocked, and the escaped process is dead."""
    pid_file = tmp_path / "escaped.pid"
    body = f'cat >/dev/null\nPID_FILE="{pid_file}"\n{escape}\nsleep 300\n'
    rt = runtime_for(tmp_path / "hooks.sqlite3")
    hooks = declare(rt, cmd_hook("hangs", script(tmp_path, "hangs.sh", body), timeout_ms=1000))
    tool = Shell()
    async with harness(client, tmp_path, hooks, shell("s1", "buy 100"), tools=[tool, Echo()]) as h:
        out = await h.run("trade")

    assert out.failure is None, out.failure
    assert tool.ran == [] and out.tool_activities == []
    assert steps(out)["s1"].skip_detail == "timeout"
    [row] = rows(rt, "hangs")
    assert (row.decision, row.status, row.reason) == ("block", "timeout", "timeout")
    assert "did not answer within 1000 ms" in row.error
    # bash, its sleep, and the escaped one.
    assert row.metadata["killed_processes"] >= 3, row.metadata
    assert dead(int(pid_file.read_text()))
    assert zombie_children() == []


@pytest.mark.parametrize(
    "answer, decision",
    [('{"decision": "block", "reason": "no trades today"}', "block"), ('{"decision": "allow"}', "allow")],
    ids=["block", "allow"],
)
async def test_a_hook_that_exits_leaving_a_child_on_its_stdout_is_decided_and_the_child_killed(
    client, tmp_path, answer, decision
):
    """The hook answers and exits, but a child it left in a new session still holds its stdout, so the
    output never ends. Its answer is taken after a short grace — not at its timeout (5 s), nor at the
    chain's — the child is killed, and the audit row says it left a process behind."""
    pid_file = tmp_path / "child.pid"
    body = f"cat >/dev/null\nsetsid sleep 300 &\necho $! > \"{pid_file}\"\necho '{answer}'\nexit 0\n"
    rt = runtime_for(tmp_path / "hooks.sqlite3")
    hooks = declare(rt, cmd_hook("leaves-a-child", script(tmp_path, "leaves.sh", body)))
    tool = Shell()
    async with harness(client, tmp_path, hooks, shell("s1", "buy 100"), tools=[tool, Echo()]) as h:
        out = await h.run("trade")

    assert out.failure is None, out.failure
    [row] = rows(rt, "leaves-a-child")
    assert (row.decision, row.status) == (decision, "completed")
    assert row.metadata["left_processes"] == 1 and row.metadata["pipes_left_open"] is True
    if decision == "block":
        assert tool.ran == [] and out.tool_activities == []
        assert steps(out)["s1"].skip_detail == "no trades today"
    else:
        assert tool.ran == ["buy 100"]
    assert dead(int(pid_file.read_text()))
    assert zombie_children() == []


AS_A_SUBREAPER = """
import asyncio, ctypes, json, os, sys
from pathlib import Path

from hooks.declarative import DeclaredHookRuntime, HookStore, dry_run, parse_hooks

def zombies():
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry.name))
    return found

async def main():
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    specs = parse_hooks(json.loads(sys.argv[1]))
    runtime = DeclaredHookRuntime(store=HookStore(sys.argv[2]))
    results = [await dry_run(spec, runtime, {"tool_name": "shell/exec", "tool_input": {}}) for spec in specs]
    await asyncio.sleep(0.5)  # anything not reaped by now is left for good
    print(json.dumps({"results": [[r.status, r.metadata] for r in results], "zombies": zombies()}))

asyncio.run(main())
"""


def test_a_worker_that_inherits_orphans_reaps_every_process_of_a_hooks_tree(tmp_path):
    """A worker running as PID 1 (the image's) or a subreaper inherits the processes a hook orphans: the
    ones it kills — also those whose parent it killed with them — are reaped, not left as zombies. A
    process marked as a subreaper plays the worker: a hook that hangs after orphaning children, one that
    exits leaving them."""
    hangs = "cat >/dev/null\n( setsid sleep 300 & )\n( sleep 0.05 & )\nsetsid sleep 300 &\nsleep 300\n"
    leaves = "cat >/dev/null\n( setsid sleep 300 & )\n( sleep 0.05 & )\nsetsid sleep 300 &\necho '{}'\n"
    hooks = {
        "hooks": [
            cmd_hook("hangs", script(tmp_path, "hangs.sh", hangs), timeout_ms=1000),
            cmd_hook("leaves", script(tmp_path, "leaves.sh", leaves)),
        ]
    }
    run = subprocess.run(
        [sys.executable, "-c", AS_A_SUBREAPER, json.dumps(hooks), str(tmp_path / "hooks.sqlite3")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    [(hang_status, hang), (leave_status, left)] = shown["results"]
    assert hang_status == "timeout" and hang["killed_processes"] >= 4, hang
    assert leave_status == "completed" and left["left_processes"] >= 2, left
    assert shown["zombies"] == []
