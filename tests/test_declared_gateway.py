"""The gateway contracts of declared hooks through real requests: the time budget the declared hooks of one
blocking event share (enforced by the workflow: a hook is given at most what its chain has left, and none
starts once it is spent), non-blocking events observed in detached effects the request never waits for
and whose answers are never applied, and editions (``standard`` refuses command handlers at dispatch
too). Handlers are real: command scripts and HTTP servers on loopback.

The chain scenarios run at 40 % of the real scale by default (a 4 s budget, hooks of 2.4 s);
``AGENT_TEST_FULL_SCALE=1`` runs them as reported: a 10 s budget and three hooks of 6 s each.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

from hooks import Stage
from workflows import data_converter
from workflows.models import DecisionAction, EffectStatus, InvocationOutcome, RequestStatus, StepStatus

from .doubles import effect_child, started_attempts, stored_effects
from .harness import Outcome
from .hook_servers import Received, Receiver, Reply, Webhook
from .test_declared_hooks import (
    Echo,
    Shell,
    cmd_hook,
    declare,
    harness,
    http_hook,
    rows,
    runtime_for,
    script,
    shell,
    steps,
)

FULL_SCALE = os.environ.get("AGENT_TEST_FULL_SCALE") == "1"
BUDGET = 10.0 if FULL_SCALE else 4.0
HOLD = 0.6 * BUDGET  # each hook of a chain takes 6 s of a 10 s budget
# Each hook's own timeout is longer than what its chain can leave it: the chain, not the hook, stops it.
OWN_TIMEOUT_MS = int(HOLD * 1000 * 1.5)


def scheduled_hooks(out: Outcome, stage: Stage) -> list[str]:
    return [a.summary.split(" · ")[1] for a in out.scheduled if a.summary and a.activity_type == f"{stage.value}_hook"]


def schedule_to_close(out: Outcome) -> dict[str, list[float]]:
    """The schedule-to-close timeout (seconds) of each hook activity, by hook, in history order: what the
    workflow gave each invocation (0: none)."""
    found: dict[str, list[float]] = {}
    for event in out.history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and event.HasField("user_metadata"):
            summary = data_converter.payload_converter.from_payload(event.user_metadata.summary, str)
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name.endswith("_hook"):
                seconds = attrs.schedule_to_close_timeout.ToTimedelta().total_seconds()
                found.setdefault(summary.split(" · ")[1], []).append(seconds)
    return found


def hold_script(tmp_path: Path, name: str, ran: Path) -> str:
    return script(tmp_path, name, f'cat >/dev/null\necho ran >> "{ran}"\nsleep {HOLD}\nexit 0\n')


# --------------------------------------------------------------------------------------------------
# The chain budget
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("second_on_timeout", ["block", "allow"])
async def test_three_slow_pre_tool_use_hooks_share_one_budget_and_the_call_is_blocked(
    client, tmp_path, second_on_timeout
):
    """Three hooks of 6 s each on one call used to hold the step for 18 s, and the tool then ran. Their
    chain now stops at its budget: the second hook is cut off at what the first left it
    (``chain_budget_exhausted``), the third never starts — no activity, no audit row, its server never
    called — and the call is blocked: by the second hook's timeout decision, or, where that allows, by the
    workflow itself, which decides the third hook (whose timeout blocks) without running it."""
    first = Webhook(Reply(body={"decision": "allow"}, delay=HOLD))
    third = Webhook(Reply(body={"decision": "allow"}))
    ran = tmp_path / "second.ran"
    try:
        rt = runtime_for(tmp_path / "hooks.sqlite3", chain_budget_seconds=BUDGET)
        hooks = declare(
            rt,
            http_hook("first", first.url, timeout_ms=OWN_TIMEOUT_MS, priority=3),
            cmd_hook(
                "second",
                hold_script(tmp_path, "second.sh", ran),
                timeout_ms=OWN_TIMEOUT_MS,
                on_timeout=second_on_timeout,
                priority=2,
            ),
            http_hook("third", third.url, timeout_ms=OWN_TIMEOUT_MS, priority=1),
        )
        tool = Shell()
        async with harness(client, tmp_path, hooks, shell("s1", "ls"), tools=[tool, Echo()]) as h:
            out = await h.run("list files")
    finally:
        first.close()
        third.close()

    assert out.failure is None, out.failure
    # The call is blocked: the tool never ran, and no execution was scheduled.
    blocker = "second" if second_on_timeout == "block" else "third"
    s1 = steps(out)["s1"]
    assert (s1.status, s1.skipped_by, s1.skip_detail) == (StepStatus.SKIPPED, blocker, "chain_budget_exhausted")
    assert s1.result == f"blocked by hook {blocker}: chain_budget_exhausted"
    assert tool.ran == [] and "execute_tool_step" not in out.activity_types()
    # The third hook never started.
    assert scheduled_hooks(out, Stage.BEFORE_TOOL) == ["first", "second"]
    assert third.received == [] and rows(rt, "third") == []
    # The second hook ran, and was cut off by its chain, not by its own (longer) timeout.
    assert ran.read_text().splitlines() == ["ran"]
    [r1] = rows(rt, "first")
    [r2] = rows(rt, "second")
    assert (r1.decision, r1.status) == ("allow", "completed")
    assert (r2.decision, r2.status, r2.reason) == (second_on_timeout, "timeout", "chain_budget_exhausted")
    assert r2.metadata["chain_time_left_ms"] < OWN_TIMEOUT_MS and "chain's time budget ran out" in r2.error
    # What the workflow gave each invocation (its schedule-to-close timeout, spanning every retry): the
    # first the whole budget, the second only what the first left.
    given = schedule_to_close(out)
    assert given["first"] == [BUDGET] and given["second"][0] <= BUDGET - HOLD
    # The record: each invocation, and the workflow's own decision for the hook it did not start.
    invocations = {i.hook: i for i in out.record.invocations(Stage.BEFORE_TOOL)}
    assert invocations["first"].outcome is InvocationOutcome.SUCCEEDED
    assert invocations["second"].outcome is InvocationOutcome.SUCCEEDED
    if second_on_timeout == "block":
        assert "third" not in invocations
        assert invocations["second"].decision.action is DecisionAction.DENY
    else:
        assert invocations["second"].decision.action is DecisionAction.CONTINUE
        skipped = invocations["third"]
        assert (skipped.outcome, skipped.error_type, skipped.duration_ms) == (
            InvocationOutcome.NOT_STARTED,
            "ChainBudgetExhausted",
            0.0,
        )
        assert "pre_tool_use chain spent its" in skipped.error and "not started" in skipped.error
        assert (skipped.decision.action, skipped.decision.reason) == (DecisionAction.DENY, "chain_budget_exhausted")


async def test_a_spent_user_prompt_submit_chain_stops_the_run_without_starting_the_rest(client, tmp_path):
    """The workflow refuses a user_prompt_submit hook its chain has no time left for: the run stops, as
    that hook's timeout (block) would have stopped it, and planning never starts."""
    slow = Webhook(Reply(body={"decision": "allow"}, delay=HOLD))
    lenient = Webhook(Reply(body={"decision": "allow"}, delay=HOLD))
    last = Webhook(Reply(body={"decision": "allow"}))
    try:
        rt = runtime_for(tmp_path / "hooks.sqlite3", chain_budget_seconds=BUDGET)
        event = "user_prompt_submit"
        hooks = declare(
            rt,
            http_hook("slow", slow.url, event=event, timeout_ms=OWN_TIMEOUT_MS, priority=3),
            http_hook("lenient", lenient.url, event=event, timeout_ms=OWN_TIMEOUT_MS, on_timeout="allow", priority=2),
            http_hook("last", last.url, event=event, timeout_ms=OWN_TIMEOUT_MS, priority=1),
        )
        async with harness(client, tmp_path, hooks, shell("s1", "ls")) as h:
            out = await h.run("list files")
    finally:
        for server in (slow, lenient, last):
            server.close()

    assert out.failure is None, out.failure
    assert out.record.status is RequestStatus.STOPPED and "plan" not in out.activity_types()
    stopped = out.result.stopped
    assert (stopped.extension, stopped.phase, stopped.reason) == ("last", "before_run", "chain_budget_exhausted")
    assert out.result.response == "blocked by hook last: chain_budget_exhausted"
    assert scheduled_hooks(out, Stage.BEFORE_RUN) == ["slow", "lenient"] and last.received == []
    [cut] = rows(rt, "lenient")
    assert (cut.decision, cut.status, cut.reason) == ("allow", "timeout", "chain_budget_exhausted")
    assert rows(rt, "last") == []
    [refused] = out.record.invocations(Stage.BEFORE_RUN, "last")
    assert (refused.outcome, refused.decision.action, refused.decision.reason) == (
        InvocationOutcome.NOT_STARTED,
        DecisionAction.STOP,
        "chain_budget_exhausted",
    )


async def test_each_call_has_its_own_chain_and_a_quick_chain_runs_every_hook(client, tmp_path):
    """The budget is per occurrence: two calls each run their whole (quick) chain, and every invocation is
    given the whole budget, since nothing of it was spent before."""
    rt = runtime_for(tmp_path / "hooks.sqlite3", chain_budget_seconds=BUDGET)
    hooks = declare(rt, cmd_hook("a", "true", priority=2), cmd_hook("b", "true", priority=1))
    tool = Shell()
    async with harness(client, tmp_path, hooks, shell("s1", "ls"), shell("s2", "pwd"), tools=[tool, Echo()]) as h:
        out = await h.run("two commands")
    assert out.failure is None, out.failure
    assert sorted(tool.ran) == ["ls", "pwd"]
    assert sorted(scheduled_hooks(out, Stage.BEFORE_TOOL)) == ["a", "a", "b", "b"]
    assert {r.decision for r in rows(rt)} == {"allow"} and len(rows(rt)) == 4
    # Each call's first hook is given the whole budget; its second what the first left of it.
    given = schedule_to_close(out)
    assert given["a"] == [BUDGET, BUDGET] and all(0 < left < BUDGET for left in given["b"])


async def test_a_worker_lost_mid_chain_does_not_reset_its_budget(client, tmp_path):
    """The worker running a chain's hook goes away midway through it; the retry runs on another worker
    with what the chain had left when the first attempt started, less the time lost — not a fresh budget
    (the deadline is the activity's schedule-to-close timeout, which spans its retries) — so a hook that
    would have fitted a fresh budget is cut off, and the call is blocked."""
    arrived = threading.Event()

    def answer_slowly(received: Received) -> Reply:
        arrived.set()
        time.sleep(HOLD)
        return Reply(body={"decision": "allow"})

    server = Receiver(answer_slowly)
    try:
        rt = runtime_for(tmp_path / "hooks.sqlite3", chain_budget_seconds=BUDGET)
        hooks = declare(rt, http_hook("slow-gate", server.url, timeout_ms=OWN_TIMEOUT_MS))
        tool = Shell()
        lost = harness(client, tmp_path / "lost", hooks, shell("s1", "ls"), tools=[tool, Echo()])
        async with lost:
            handle = await lost.start("list files")
            assert await asyncio.to_thread(arrived.wait, 30)
            await asyncio.sleep(0.6 * HOLD)  # the worker goes while the hook is more than halfway through
        replacement = harness(
            client, tmp_path / "next", hooks, shell("s1", "ls"), tools=[tool, Echo()], task_queue=lost.task_queue
        )
        async with replacement:
            out = await replacement.finish(handle)
    finally:
        server.close()

    assert out.failure is None, out.failure
    assert len(server.received) == 2 and started_attempts(out, "before_tool_hook") == [2]
    s1 = steps(out)["s1"]
    assert (s1.skipped_by, s1.skip_detail) == ("slow-gate", "chain_budget_exhausted") and tool.ran == []
    [row] = rows(rt, "slow-gate")
    assert (row.decision, row.status, row.reason) == ("block", "timeout", "chain_budget_exhausted")
    assert row.metadata["chain_time_left_ms"] < HOLD * 1000


# --------------------------------------------------------------------------------------------------
# Non-blocking events: detached observers
# --------------------------------------------------------------------------------------------------


async def test_non_blocking_hooks_observe_in_detached_effects_and_nothing_they_answer_is_applied(client, tmp_path):
    """session_start, post_tool_use and stop hooks that answer with context, rewritten input and a block:
    the instructions, the tool result and the answer stay as they were, each answer is recorded as
    ignored (audit row and effect), and each hook ran in its own detached effect."""
    session = Webhook(Reply(body={"decision": "block", "additionalContext": "The user prefers French."}))
    post = Webhook(
        Reply(body={"decision": "allow", "additionalContext": "note: listing is safe", "updatedInput": {"cmd": "rm"}})
    )
    stop = Webhook(Reply(body={"additionalContext": "goodbye"}))
    ids = {
        "session": "hook.session.session_start",
        "annotate": "hook.annotate.post_tool_use.s1",
        "on-stop": "hook.on-stop.stop",
    }
    try:
        rt = runtime_for(tmp_path / "hooks.sqlite3")
        hooks = declare(
            rt,
            http_hook("session", session.url, event="session_start"),
            http_hook("annotate", post.url, event="post_tool_use"),
            http_hook("on-stop", stop.url, event="stop"),
        )
        tool = Shell()
        async with harness(client, tmp_path, hooks, shell("s1", "ls"), tools=[tool, Echo()]) as h:
            out = await h.run("list files")
            for effect_id in ids.values():
                await effect_child(h, client, out, effect_id)
            stored = await stored_effects(out, *ids.values())
    finally:
        for server in (session, post, stop):
            server.close()

    assert out.failure is None, out.failure
    # Nothing they answered was applied.
    assert tool.ran == ["ls"] and steps(out)["s1"].status is StepStatus.SUCCEEDED
    assert steps(out)["s1"].result == "ran ls"
    assert out.record.instructions == "" and "French" not in out.result.response
    assert "note:" not in out.result.response and "goodbye" not in out.result.response
    # Each handler saw its event.
    assert session.received[0].body["prompt"] == "list files"
    assert post.received[0].body["tool_result"] == "ran ls" and post.received[0].body["step_id"] == "s1"
    assert stop.received[0].body["status"] == "completed"
    # Each hook's activity only handed its event to a detached effect, which ran the handler.
    for hook, effect_id in ids.items():
        effect = stored.effect(effect_id)
        assert effect is not None and effect.status is EffectStatus.SUCCEEDED, (hook, effect)
        assert effect.hook == hook
        [row] = rows(rt, hook)
        assert row.workflow_id == out.workflow_id and row.status == "completed"
        assert row.metadata["ignored"] == list(effect.data["ignored"])
    annotate = stored.effect(ids["annotate"]).data
    assert annotate["ignored"] == {"additionalContext": "note: listing is safe", "updatedInput": {"cmd": "rm"}}
    assert annotate["decision"] == "allow" and annotate["event"] == "post_tool_use"
    assert stored.effect(ids["annotate"]).summary == "allow; ignored: additionalContext, updatedInput"
    session_start = stored.effect(ids["session"])
    assert session_start.data["ignored"] == {"decision": "block", "additionalContext": "The user prefers French."}
    assert session_start.summary == "block; ignored: decision, additionalContext"
    assert stored.effect(ids["on-stop"]).data["ignored"] == {"additionalContext": "goodbye"}


def completed_at(history: WorkflowHistory):
    [done] = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED]
    return done.event_time.ToDatetime()


def first_event_time(history: WorkflowHistory, event_type: int):
    return next(e for e in history.events if e.event_type == event_type).event_time.ToDatetime()


async def test_a_slow_non_blocking_hook_never_delays_the_request(client, tmp_path):
    """A post_tool_use hook that does not answer until the request has finished: the request completes
    while the hook is still running, and the hook's effect still reaches its terminal state afterwards."""
    finished = threading.Event()

    def answer_late(received: Received) -> Reply:
        finished.wait(timeout=8)  # the request must finish without this answer
        return Reply(body={"additionalContext": "late"})

    server = Receiver(answer_late)
    try:
        rt = runtime_for(tmp_path / "hooks.sqlite3")
        hooks = declare(rt, http_hook("slow-audit", server.url, event="post_tool_use", timeout_ms=9000))
        tool = Shell()
        async with harness(client, tmp_path, hooks, shell("s1", "ls"), tools=[tool, Echo()]) as h:
            out = await h.run("list files")
            finished.set()
            child = await effect_child(h, client, out, "hook.slow-audit.post_tool_use.s1")
            stored = await stored_effects(out, "hook.slow-audit.post_tool_use.s1")
    finally:
        finished.set()
        server.close()

    assert out.failure is None, out.failure
    # In history: the hook's activity started before the request completed, and finished after it.
    started = first_event_time(child, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED)
    ended = first_event_time(child, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    assert started < completed_at(out.history) < ended
    assert steps(out)["s1"].result == "ran ls"
    effect = stored.effect("hook.slow-audit.post_tool_use.s1")
    assert effect.status is EffectStatus.SUCCEEDED and effect.data["ignored"] == {"additionalContext": "late"}
    [row] = rows(rt, "slow-audit")
    assert (row.decision, row.status, row.metadata["ignored"]) == ("allow", "completed", ["additionalContext"])


async def test_failing_non_blocking_hooks_never_fail_the_request(client, tmp_path):
    """A session_start command that crashes, a post_tool_use endpoint that keeps failing and a stop hook
    that times out: the request completes as if they were not there; each effect is failed with the
    cause, and each audit row says error or timeout (decided allow: nothing blocks)."""
    failing = Webhook(Reply(status=500), Reply(status=502))
    slow = Webhook(Reply(body={}, delay=2.0))
    ids = {
        "crash": "hook.crash.session_start",
        "broken": "hook.broken.post_tool_use.s1",
        "late": "hook.late.stop",
    }
    try:
        rt = runtime_for(tmp_path / "hooks.sqlite3")
        hooks = declare(
            rt,
            cmd_hook(
                "crash", script(tmp_path, "crash.sh", "cat >/dev/null\necho boom >&2\nexit 1\n"), event="session_start"
            ),
            http_hook("broken", failing.url, event="post_tool_use"),
            http_hook("late", slow.url, event="stop", timeout_ms=300),
        )
        tool = Shell()
        async with harness(client, tmp_path, hooks, shell("s1", "ls"), tools=[tool, Echo()]) as h:
            out = await h.run("list files")
            for effect_id in ids.values():
                await effect_child(h, client, out, effect_id)
            stored = await stored_effects(out, *ids.values())
    finally:
        failing.close()
        slow.close()

    assert out.failure is None, out.failure
    assert out.record.status is RequestStatus.SUCCEEDED and tool.ran == ["ls"]
    assert steps(out)["s1"].result == "ran ls"
    for hook, status in (("crash", "error"), ("broken", "error"), ("late", "timeout")):
        effect = stored.effect(ids[hook])
        assert effect.status is EffectStatus.FAILED and effect.error.startswith(status), (hook, effect.error)
        [row] = rows(rt, hook)
        assert (row.decision, row.status) == ("allow", status), hook
    assert "boom" in stored.effect(ids["crash"]).error
    # Not retried: the audit row already holds the hook's verdict (the endpoint saw its one retry on 5xx).
    assert failing.calls == 2


# --------------------------------------------------------------------------------------------------
# Editions: a command hook that reaches dispatch under standard never runs
# --------------------------------------------------------------------------------------------------


async def test_the_standard_edition_blocks_a_command_hook_at_dispatch(client, tmp_path):
    """Hooks built under lite, dispatched by a worker whose runtime is standard (a definition that got
    past loading): the command never runs; the blocking one blocks the call with a clear reason, the
    observing one's effect fails, and each leaves its audit row without moving the breaker."""
    ran = tmp_path / "ran"
    rt = runtime_for(tmp_path / "hooks.sqlite3")
    hooks = declare(
        rt,
        cmd_hook("local-guard", script(tmp_path, "guard.sh", f'echo ran >> "{ran}"\nexit 0\n')),
        cmd_hook("local-audit", script(tmp_path, "audit.sh", f'echo ran >> "{ran}"\nexit 0\n'), event="post_tool_use"),
    )
    rt.edition = "standard"
    tool = Shell()
    async with harness(client, tmp_path, hooks, shell("s1", "ls"), tools=[tool, Echo()]) as h:
        out = await h.run("list files")
        await effect_child(h, client, out, "hook.local-audit.post_tool_use.s1")
        stored = await stored_effects(out, "hook.local-audit.post_tool_use.s1")

    assert out.failure is None, out.failure
    assert not ran.exists() and tool.ran == []
    s1 = steps(out)["s1"]
    assert (s1.skipped_by, s1.skip_detail) == ("local-guard", "edition_not_allowed")
    [guard] = rows(rt, "local-guard")
    assert (guard.decision, guard.status, guard.reason) == ("block", "error", "edition_not_allowed")
    assert "command handlers are not available in the standard edition" in guard.error
    assert guard.metadata["edition"] == "standard"
    assert rt.store.state("local-guard").consecutive_blocks == 0
    [audit] = rows(rt, "local-audit")
    assert (audit.decision, audit.reason) == ("skip", "edition_not_allowed")
    effect = stored.effect("hook.local-audit.post_tool_use.s1")
    assert effect.status is EffectStatus.FAILED and "standard edition" in effect.error
