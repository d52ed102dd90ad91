"""What the Temporal UI's Timeline shows of a request's hooks, read from the history it draws: each
in-process hook's row labelled by its stage and name (the UI labels a local activity by its type alone),
and a hook that refuses — denies a call, stops the run, ends the request — marked at its own row by a
timer whose summary gives the decision and the reason on its first line; and a request waiting for a
reviewer saying, in its current details and its expiry timer's summary, what waits, why, for whom and how
to decide it. (The browser's view of the same is tests/test_ui_browser.py.)"""

from __future__ import annotations

import json
import re

from temporalio.api.enums.v1 import EventType

from hooks import HookRejection, RequiredAfterPlanningHook, RunMode, ToolCall, ToolDecision
from workflows import data_converter
from workflows.models import ReviewAck, ReviewSettings

from .doubles import FixedPlanner
from .harness import Harness, Outcome
from .test_after_planning import two_quotes
from .test_checkpoints import CountingPlanHook, message
from .test_tool_hooks import BeforeTool, Echo, step
from .test_ui_story import SECRET, current_details


def timeline(out: Outcome) -> list[str]:
    """The rows the Timeline labels, in history order: each local activity by its type, each activity and
    each timer by its summary."""
    converter = data_converter.payload_converter
    rows = []
    for e in out.history.events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            details = e.marker_recorded_event_attributes.details
            if "data" in details:
                rows.append(converter.from_payloads(details["data"].payloads)[0]["activity_type"])
        elif e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            rows.append(converter.from_payload(e.user_metadata.summary, str))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and e.user_metadata.HasField("summary"):
            rows.append(converter.from_payload(e.user_metadata.summary, str))
    return rows


async def test_each_in_process_hook_is_named_and_a_denial_is_marked_with_its_reason(client, tmp_path):
    def deny(call: ToolCall):
        return ToolDecision.deny("Sending is disabled here.", reason="kill-switch") if call.step_id == "b" else None

    hooks = [BeforeTool("first"), BeforeTool("denier", deny), BeforeTool("later")]
    planner = FixedPlanner(step("a", Echo, text="hi"), step("b", Echo, text="secret"))
    async with Harness(client, tmp_path, hooks=hooks, tools=[Echo()], planner=planner) as h:
        out = await h.run("say two things")

    assert out.failure is None, out.failure
    rows = timeline(out)
    # Each call runs with its hooks in one activity whose row names the tool, the stage and each hook.
    assert "execute · echo/say (a) with before_tool:first + denier + later" in rows
    mark = "✗ denied — before_tool · denier · b: kill-switch — Sending is disabled here."
    # Step b's hooks stop at the denial; the mark follows its row, and nothing else is marked.
    assert rows[rows.index(mark) - 1] == "execute · echo/say (b) with before_tool:first + denier + later"
    assert [r for r in rows if r.startswith("✗")] == [mark]


async def test_a_required_hook_that_rejects_the_plan_is_marked_where_it_ended_the_request(client, tmp_path):
    class LocalGate(RequiredAfterPlanningHook):
        name = "local-gate"
        run_mode = RunMode.LOCAL_ACTIVITY

        async def after_planning(self, ctx, plan):
            raise HookRejection("step quote-acme uses an operation not allowed by this application")

    async with Harness(client, tmp_path, hooks=[LocalGate()], planner=two_quotes()) as h:
        out = await h.run("quotes please")

    assert out.failure is not None and out.failure.type == "RequiredAfterPlanningError"
    rows = timeline(out)
    at = rows.index("plan · phase 1 with after_planning:local-gate")  # the planning ran the gate on its plan
    assert rows[at + 1] == (
        "✗ ended the request — after_planning · local-gate: required after_planning hook 'local-gate' rejected "
        "the plan: step quote-acme uses an operation not allowed by this application"
    )


class Sign:
    """before_tool: rewrites a message's text (a modify verdict), with a token the details must mask."""

    name = "sign"

    def before_tool(self, ctx, call):
        return ToolDecision.modify({**call.arguments, "text": f"{call.arguments['text']} (sent with {SECRET})"})


async def test_a_waiting_request_says_what_waits_why_for_whom_and_how_to_decide(client, tmp_path):
    gate = CountingPlanHook("reviewer-gate", mark={"notify": "messages to bob are reviewed"})
    review = ReviewSettings(reviewers=["alice", "bob"])
    planner = FixedPlanner(message("notify", "bob", "hi"))
    async with Harness(client, tmp_path, hooks=[gate, Sign()], planner=planner, review=review) as h:
        handle = await h.start("tell bob hi", {"cache": "bypass"})
        checkpoint = await h.wait_for_checkpoint(handle)
        waiting = await current_details(handle)
        update = re.search(r"--name review --input '([^']+)'", waiting)
        assert update, waiting
        ack = await handle.execute_update(
            "review", json.loads(update.group(1).replace("REVIEWER", "alice")), result_type=ReviewAck
        )
        out = await h.finish(handle)
        ended = await current_details(handle)

    cp = checkpoint.checkpoint_id
    assert f"**stage:** awaiting_review — checkpoint {cp}" in waiting
    # The call as it will run: after the rewrite, its token masked.
    tool = checkpoint.calls[0].tool
    assert f'**awaiting approval:** `{tool} {{"text": "hi (sent with [REDACTED])", "to": "bob"}}` (notify)' in waiting
    assert SECRET not in waiting
    assert f"{tool}: tool requires approval (required by the tool's policy)" in waiting
    assert f"{tool}: messages to bob are reviewed (required by hook reviewer-gate)" in waiting
    assert "**reviewers:** alice, bob" in waiting
    assert f'`agent-lifecycle approve {handle.id} --reviewer alice --checkpoint {cp} --comment "ok"`' in waiting
    assert f'`agent-lifecycle reject {handle.id} --reviewer alice --checkpoint {cp} --comment "why"`' in waiting
    assert (ack.checkpoint_id, ack.reviewer) == (checkpoint.checkpoint_id, "alice") and out.result is not None
    assert "**outcome:** succeeded" in ended
    assert ended.endswith(f"**checkpoint** {cp} approved by alice")  # the finished request keeps its review

    # The expiry timer, the waiting request's last row on its Timeline, says the same in one line.
    [expiry] = [row for row in timeline(out) if row.startswith("awaiting review")]
    assert expiry.startswith(f"awaiting review · {cp} until expiry: approve {tool} {{")
    assert "(required by hook reviewer-gate)" in expiry and expiry.endswith("reviewers: alice, bob")
    assert SECRET not in expiry
