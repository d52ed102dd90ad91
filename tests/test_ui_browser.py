"""The Temporal Web UI, read by headless Chromium the way an operator reads it: which executions are
requests and which are their children, the stage each is at, what each request asked (masked), how it
ended, and a refused request's failure type on its first line with no stack trace. The dev server, the
worker and the requests are real; the requests are started by the project's client and run on the demo
pipeline (demo/screenshots.py, which also writes the README's screenshot)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from client import Settings
from demo.screenshots import QUOTE, SECRET, TRADE, WAITING, Browser, Requests, demo_ui, free_port, take_screenshots
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
    assert set(only) == {requests.quote, requests.trade, requests.approved, requests.waiting}


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
    # The summary and the details never show the secret (the raw input, on the history tab, is the
    # request itself: only a payload codec would hide it).
    assert SECRET not in done


async def test_a_refused_request_shows_its_failure_type_first_and_no_stack_trace(ui, tmp_path):
    chromium, requests = ui
    page = await chromium.workflow(requests.trade, wait_for="RequiredAfterPlanningError")
    result = page.split("Result", 1)[1].split("Event History", 1)[0]
    first = next(line.strip() for line in result.splitlines() if '"message"' in line)
    assert first.startswith('"message": "RequiredAfterPlanningError: required after_planning hook')
    assert "stackTrace" not in result and ".py" not in result
    assert "Failure Message" in page and f"request: {TRADE}" in page  # the failed event; the started summary
    await chromium.screenshot(tmp_path / "refused.png")
    assert (tmp_path / "refused.png").stat().st_size > 10_000


async def test_the_screenshot_module_photographs_each_view(ui, tmp_path):
    chromium, requests = ui
    shots = await take_screenshots(chromium, requests, tmp_path)
    assert [p.name for p in shots] == [
        "workflows.png",
        "requests.png",
        "awaiting-review.png",
        "refused.png",
        "completed.png",
    ]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in shots)
