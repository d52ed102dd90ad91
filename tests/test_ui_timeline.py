"""What the Temporal UI's Timeline shows of a request's hooks, read from the history it draws: each
in-process hook's row labelled by its stage and name (the UI labels a local activity by its type alone),
and a hook that refuses — denies a call, stops the run, ends the request — marked at its own row by a
timer whose summary gives the decision and the reason on its first line. (The browser's view of the same
is tests/test_ui_browser.py.)"""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType

from hooks import HookRejection, RequiredAfterPlanningHook, RunMode, ToolCall, ToolDecision
from workflows import data_converter

from .doubles import FixedPlanner
from .harness import Harness, Outcome
from .test_after_planning import two_quotes
from .test_tool_hooks import BeforeTool, Echo, step


def timeline(out: Outcome) -> list[str]:
    """The rows the Timeline labels, in history order: each local activity by its type, each timer by its
    summary."""
    converter = data_converter.payload_converter
    rows = []
    for e in out.history.events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            details = e.marker_recorded_event_attributes.details
            if "data" in details:
                rows.append(converter.from_payloads(details["data"].payloads)[0]["activity_type"])
        elif e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
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
    assert "before_tool:first + denier + later" in rows  # step a: one batch, each hook named
    mark = "✗ denied — before_tool · denier · b: kill-switch — Sending is disabled here."
    # Step b's batch stops at the denial; the mark follows the batch's row, and nothing else is marked.
    assert rows[rows.index(mark) - 1] == "before_tool:first + denier + later"
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
    at = rows.index("after_planning:local-gate")
    assert rows[at + 1] == (
        "✗ ended the request — after_planning · local-gate: required after_planning hook 'local-gate' rejected "
        "the plan: step quote-acme uses an operation not allowed by this application"
    )
