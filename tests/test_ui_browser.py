"""The Temporal Web UI, read by headless Chromium the way an operator reads it: which executions are
requests and which are their children, the stage each is at, what each request asked (masked), how it
ended, and a refused request's failure type on its first line with no stack trace. The dev server, the
worker and the requests are real; the requests are started by the project's client and run on the demo
pipeline (demo/screenshots.py, which also writes the README's screenshot). The Timeline names every
in-process hook by its stage and name and marks a refusal at its own row with its reason; a waiting
request's details say what waits, why, for whom and how to decide it; a finished one's keep its outcome
and its review; and the UI, configured with ``agent-lifecycle codec-server``, shows the plan the worker
stored by reference, decoded."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from client import Settings
from demo.screenshots import (
    APPROVED,
    QUOTE,
    REVIEWER,
    SECRET,
    TRADE,
    WAITING,
    Browser,
    Requests,
    demo_ui,
    free_port,
    take_screenshots,
)
from workflows import search_attributes as sa

pytestmark = pytest.mark.timeout(120)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def ui(tmp_path_factory) -> AsyncIterator[tuple[Browser, Requests]]:
    """A dev server of its own with its UI on a free loopback port (the session's server has none), a
    demo worker, the demo requests, and Chromium on the UI."""
    state = tmp_path_factory.mktemp("ui-state")
    settings = Settings(
        temporal_address=f"127.0.0.1:{free_port()}", ui_port=free_port(), state_dir=state, task_queue="ui-test"
    )
    async with demo_ui(settings) as (chromium, requests):
        yield chromium, requests


def rows(text: str) -> dict[str, list[str]]:
    """The workflow list's rows, by workflow id: the cells after the id (kind, stage, type, ...)."""
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("\t") if c.strip()]
        if len(cells) >= 2 and cells[0].startswith("request-"):
            found[cells[0]] = cells[1:]
    return found


async def test_the_list_tells_requests_from_children_and_shows_each_stage(ui):
    chromium, requests = ui
    await chromium.show_columns(
        "default", ["Status", "Workflow ID", "AgentWorkflowKind", "AgentLifecycleStage", "Type"]
    )
    listed = rows(await chromium.open("/workflows", wait_for="detached_effect"))
    children = {wid: cells for wid, cells in listed.items() if "/effect/" in wid}
    assert children and all(cells[:1] == ["detached_effect"] for cells in children.values()), children
    assert listed[requests.quote][:3] == ["request", "completed", "RequestLifecycle"]
    assert listed[requests.trade][:3] == ["request", "failed", "RequestLifecycle"]
    assert listed[requests.waiting][:3] == ["request", "awaiting_review", "RequestLifecycle"]

    # The documented filter lists the requests alone.
    only = rows(await chromium.list_workflows(sa.REQUESTS_QUERY, wait_for=requests.trade))
    assert set(only) == {requests.quote, requests.trade, requests.approved, requests.waiting, requests.denied}


async def test_a_request_page_says_what_was_asked_masked_where_it_is_and_how_it_ended(ui):
    chromium, requests = ui
    waiting = await chromium.workflow(requests.waiting, "user-metadata", wait_for="awaiting_review")
    assert f"request: {WAITING}" in waiting  # the summary
    assert f"asked: {WAITING}" in waiting  # the current details, from the workflow itself
    assert re.search(r"stage: awaiting_review — checkpoint cp-\d-\w+", waiting)

    done = await chromium.workflow(requests.quote, "user-metadata", wait_for="outcome:")
    masked = QUOTE.replace(SECRET, "[REDACTED]")
    assert f"request: {masked}" in done and f"asked: {masked}" in done
    assert "stage: completed" in done and "outcome: succeeded — answer: ACME is trading at" in done
    # The summary and the details never show the secret (nor does the input, decoded by the codec server).
    assert SECRET not in done


async def test_a_refused_request_shows_its_failure_type_first_and_no_stack_trace(ui, tmp_path):
    chromium, requests = ui
    await chromium.workflow(requests.trade, wait_for="RequiredAfterPlanningError")
    page = await chromium.wait_for_text(f"request: {TRADE}")  # payloads render once the codec decoded them
    result = page.split("Result", 1)[1].split("Event History", 1)[0]
    first = next(line.strip() for line in result.splitlines() if '"message"' in line)
    assert first.startswith('"message": "RequiredAfterPlanningError: required after_planning hook')
    assert "stackTrace" not in result and ".py" not in result
    assert "Failure Message" in page and f"request: {TRADE}" in page  # the failed event; the started summary
    await chromium.screenshot(tmp_path / "refused.png")
    assert (tmp_path / "refused.png").stat().st_size > 10_000


# What the UI 2.54 labels an in-process hook's local activity by, with no name of its own: never shown.
NAMELESS = {"before_planning_hook", "after_planning_hook", "before_tool_hook", "after_tool_hook", "run_hook_batch"}


def hook_row(rows: list[str], stage: str, hook: str) -> int:
    """The index of the Timeline row of ``hook`` at ``stage``: labelled by its type (``stage:hook``), by
    its summary (``stage · hook``), or — a tool call's hooks, run with their tool, and a phase's
    after_planning hooks, run with its planning — by the activity's summary (``execute_tool_step • execute ·
    <tool> (<step>) with stage:hook + hook · stage:hook``, ``plan • plan · phase 1 with stage:hook``)."""

    def names(row: str) -> bool:
        if row.startswith(f"{stage} · {hook}"):
            return True
        head = (row.splitlines()[0] if row else "").split(" • ", 1)[-1]  # "<type> • <summary>"
        with_hooks = head.startswith(("execute · ", "plan · ")) and " with " in head
        groups = head.split(" with ", 1)[1].split(" · ") if with_hooks else [head]
        return any(g.startswith(f"{stage}:") and hook in g.removeprefix(f"{stage}:").split(" + ") for g in groups)

    return next(i for i, row in enumerate(rows) if names(row))


async def test_the_timeline_names_each_hook_and_marks_a_denied_call_with_its_reason(ui):
    chromium, requests = ui
    rows = await chromium.timeline(requests.denied, wait_for="✗ denied")
    assert not NAMELESS & set(rows), rows
    assert any("response-cache" in row and "knowledge-context" in row for row in rows), rows  # a batch, named
    # Newest first: the denial's mark sits right above the hook that denied, its reason on its first line.
    denier = hook_row(rows, "before_tool", "allow-list")
    assert rows[denier - 1].splitlines()[0] == (
        "✗ denied — before_tool · allow-list · profile-acme: not on the allow-list — The tool "
        "demo-tools/research-service/company_profile is not available in this deployment."
    )
    assert not any(row.startswith("✗") for row in rows[: denier - 1] + rows[denier:]), rows
    # Bookkeeping says so; nothing reads as a wait but the request's own.
    assert "list the stage it waits in" not in rows
    assert all(row.startswith("bookkeeping") for row in rows if "list the stage" in row)

    refused = await chromium.timeline(requests.trade, wait_for="✗ ended the request")
    gate = hook_row(refused, "after_planning", "allowed-operations")
    assert refused[gate - 1].startswith(
        "✗ ended the request — after_planning · allowed-operations: required after_planning hook "
        "'allowed-operations' rejected the plan: step trade-acme uses operation "
    )


async def test_a_waiting_request_says_what_waits_why_for_whom_and_how_to_decide(ui):
    chromium, requests = ui
    waiting = await chromium.workflow(requests.waiting, "user-metadata", wait_for="awaiting approval:")
    cp = re.search(r"checkpoint (cp-\d-\w+)", waiting)
    assert cp, waiting
    assert re.search(
        r'awaiting approval: notify-service/send_message \{"text": "Prices: GBX [\d.]+ USD", "to": "bob"\}', waiting
    )
    assert "why: notify-service/send_message: tool requires approval (required by the tool’s policy)" in waiting
    assert "reviewers: any reviewer · expires: " in waiting
    wid, checkpoint = requests.waiting, cp.group(1)
    assert f"agent-lifecycle approve {wid} --reviewer <reviewer> --checkpoint {checkpoint}" in waiting
    assert f"agent-lifecycle reject {wid} --reviewer <reviewer> --checkpoint {checkpoint}" in waiting
    assert f"temporal workflow update execute --workflow-id {wid} --name review" in waiting
    # The expiry timer, the row its Timeline ends with (beside a lease's renewal), says it too.
    rows = await chromium.timeline(requests.waiting, wait_for="awaiting review")
    [expiry] = [row for row in rows if row.startswith("awaiting review")]
    assert rows.index(expiry) < 2, rows
    assert expiry.startswith(f"awaiting review · {checkpoint} until expiry: approve notify-service/send_message")
    assert expiry.endswith("(required by the tool's policy) · reviewers: any reviewer")


async def test_a_finished_request_keeps_its_outcome_and_its_review(ui):
    chromium, requests = ui
    done = await chromium.workflow(requests.approved, "user-metadata", wait_for="outcome:")
    assert f"asked: {APPROVED}" in done and "stage: completed" in done
    assert "outcome: succeeded — answer: ACME is trading at" in done and "Message sent to alice" in done
    assert re.search(rf"checkpoint cp-\d-\w+ approved by {REVIEWER}: checked", done)
    assert "awaiting approval:" not in done


async def test_the_plan_stored_by_reference_reads_decoded_through_the_codec_server(ui):
    chromium, requests = ui
    page = await chromium.workflow(requests.quote, wait_for='{"plan":{"steps":[{"step_id":"quote-acme"')
    assert "External Payloads" in page
    assert "payload stored externally" not in page.lower()
    # Decoded, and masked as the summaries are: once the codec has answered, the request's key shows
    # nowhere, its input included.
    page = await chromium.wait_for_text(f'"request": "{QUOTE.replace(SECRET, "[REDACTED]")}"')
    page = await chromium.wait_for_text("Workflow Execution Started")
    assert SECRET not in page


async def test_the_screenshot_module_photographs_each_view(ui, tmp_path):
    chromium, requests = ui
    shots = await take_screenshots(chromium, requests, tmp_path)
    assert [p.name for p in shots] == [
        "workflows.png",
        "requests.png",
        "awaiting-review.png",
        "refused.png",
        "completed.png",
        "timeline.png",
        "decoded-plan.png",
    ]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in shots)
