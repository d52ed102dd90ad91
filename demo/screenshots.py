"""Screenshots of what an operator sees in the Temporal Web UI, taken with headless Chromium.

    python -m demo.screenshots                  # into ./screenshots
    python -m demo.screenshots --out DIR        # ... or DIR

Starts its own dev server (with its UI) on free loopback ports and a throwaway state directory, runs the
demo pipeline on five requests — a quote that carries a secret, a trade the required hook refuses, a
message approved at its checkpoint (its audit write a detached child), a message left waiting for a
reviewer, and a company profile whose call the tool allow-list denies — then writes ``workflows.png`` (every execution, requests and children told apart by
``AgentWorkflowKind``, each at its ``AgentLifecycleStage``), ``requests.png`` (the requests-only filter),
``awaiting-review.png`` and ``completed.png`` (a request's user metadata and current details),
``refused.png`` (the refused request's failure), ``timeline.png`` (a request's Timeline: each hook named,
the call the allow-list denied marked with its reason) and ``decoded-plan.png`` (the plan the worker
stored by reference, decoded by ``agent-lifecycle codec-server``, which the dev server's UI is configured
with; the browser sends it a bearer token, as a UI with sign-in passes its user's). Needs Chromium (``CHROMIUM`` or /usr/bin/chromium) and
the ``playwright`` package (the dev extra); Playwright never downloads a browser here, and the browser
reaches nothing but loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from client import Settings, connect, exit_process, process_data_converter
from client.api import pending_checkpoint, review, start_request
from client.codec import Access, Codec, serve
from client.codec_auth import BearerAuth
from client.devserver import start_dev_server
from client.reviewer_keys import load_signing_key
from demo.pipeline import DEMO_REVIEWER, demo_settings
from worker import build_worker, load_activities, prepare
from workflows import search_attributes

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SECRET = "sk-" + "demo" * 6  # looks like an API key: the UI must show it masked
QUOTE = f"What is the price of ACME? My key is {SECRET}"
TRADE = "Buy 10 ACME"
APPROVED = "Send a message to alice with the price of ACME"
WAITING = "Send a message to bob with the price of GBX"
DENIED = "Show the profile of ACME"  # the allow-list plugin denies company_profile here (see demo_ui)
# The demo's tool allow-list without company_profile: the screenshots' pipeline denies that call.
SCREENSHOT_TOOL_ALLOW_LIST = ["stock-service/stock_quote", "stock-service/execute_trade", "notify-service/send_message"]
REVIEWER = DEMO_REVIEWER


def chromium_path() -> str:
    """The system Chromium (``CHROMIUM`` overrides); never one Playwright downloads."""
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        raise FileNotFoundError(f"Chromium not found at {path}: apt-get install chromium, or set CHROMIUM")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless Chromium on a fresh profile, one page at a time, for the UI at ``base`` (a namespace URL)."""

    def __init__(self, page: Any, base: str) -> None:
        self.page, self.base = page, base

    async def open(self, path: str, *, wait_for: str | None = None, timeout: float = 20.0) -> str:
        """Load ``base + path`` and return the page's visible text once ``wait_for`` appears in it."""
        await self.page.goto(self.base + path, wait_until="domcontentloaded")
        return await self.wait_for_text(wait_for, timeout=timeout) if wait_for else await self.text()

    async def text(self) -> str:
        """The visible text of the page and of its frames (the UI renders markdown in frames)."""
        texts = []
        for frame in self.page.frames:
            with contextlib.suppress(Exception):  # a frame that navigated or went away meanwhile
                texts.append(await frame.inner_text("body", timeout=2_000))
        return "\n".join(texts)

    async def wait_for_text(self, wanted: str, *, timeout: float = 20.0) -> str:
        """The page's text once it contains ``wanted`` (the UI renders after its API calls return)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            text = await self.text()
            if wanted in text:
                return text
            if loop.time() > deadline:
                raise AssertionError(f"{wanted!r} not shown at {self.page.url}; the page says:\n{text[:3000]}")
            await asyncio.sleep(0.25)

    async def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        await self.page.screenshot(path=str(path), full_page=full_page)
        return path

    async def list_workflows(self, query: str, *, wait_for: str) -> str:
        """The workflow list filtered by a visibility query, once ``wait_for`` is listed."""
        return await self.open(f"/workflows?query={quote(query)}", wait_for=wait_for)

    async def show_columns(self, namespace: str, labels: list[str]) -> None:
        """Choose the workflow list's columns (what an operator does once with "Configure columns"): the
        UI keeps the choice in the browser's local storage, set here before any page loads."""
        columns = {namespace: [{"label": label, "pinned": label in ("Status", "Workflow ID")} for label in labels]}
        await self.page.add_init_script(
            f"window.localStorage.setItem('namespace-workflow-table-columns', {json.dumps(json.dumps(columns))});"
        )

    async def workflow(self, workflow_id: str, tab: str = "history", *, wait_for: str) -> str:
        """A tab of a workflow's page (its latest run): ``history``, ``user-metadata``, ``search-attributes``."""
        run_id = await self._latest_run(workflow_id)
        return await self.open(f"/workflows/{quote(workflow_id, safe='')}/{run_id}/{tab}", wait_for=wait_for)

    async def timeline(self, workflow_id: str, *, wait_for: str, timeout: float = 20.0) -> list[str]:
        """The rows of a workflow's Timeline, top to bottom (newest first), as their labels read, once a
        row says ``wait_for``: the UI draws only the rows in view, so the page is scrolled through them."""
        await self.workflow(workflow_id, "timeline", wait_for="Timeline")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            rows = await self._timeline_rows()
            if any(wait_for in row for row in rows):
                return rows
            if loop.time() > deadline:
                raise AssertionError(f"no Timeline row says {wait_for!r} at {self.page.url}; the rows:\n{rows}")
            await asyncio.sleep(0.5)

    async def show_row(self, text: str) -> None:
        """Scroll the Timeline (already read by :meth:`timeline`) until the row that says ``text`` is in
        the middle of the view."""
        height = (self.page.viewport_size or {"height": 800})["height"]
        for _ in range(200):
            row = self.page.locator("#event-history-timeline-graph li", has_text=text)
            if await row.count():
                try:  # the UI redraws the rows in view as the page scrolls: one may go while it is found
                    await row.first.evaluate("row => row.scrollIntoView({block: 'center'})", timeout=2_000)
                    await asyncio.sleep(0.5)
                    box = await row.first.bounding_box(timeout=2_000)
                except Exception:  # noqa: BLE001 - gone meanwhile: look again
                    continue
                if box is not None and 0 <= box["y"] <= height - box["height"]:
                    return
            # Not drawn yet, or drawn where scrolling it into view does not reach: scroll the page on.
            await self.page.evaluate(_SCROLL_DOWN)
            await asyncio.sleep(0.1)
        raise AssertionError(f"no Timeline row says {text!r}")

    async def _timeline_rows(self) -> list[str]:
        await self.page.wait_for_selector("#event-history-timeline-graph li", state="attached")
        rows: dict[float, str] = {}
        last = -1.0
        while True:
            seen = await self.page.evaluate(_TIMELINE_ROWS)
            rows.update({float(y): text for y, text in seen})
            top = await self.page.evaluate(_SCROLL_DOWN)
            if top == last:
                break
            last = top
            await asyncio.sleep(0.2)
        await self.page.evaluate("document.querySelector('#content-wrapper').scrollTop = 0")
        return [rows[y] for y in sorted(rows)]

    async def _latest_run(self, workflow_id: str) -> str:
        response = await self.page.request.get(
            self.base.replace("/namespaces/", "/api/v1/namespaces/") + f"/workflows/{quote(workflow_id, safe='')}"
        )
        return (await response.json())["workflowExecutionInfo"]["execution"]["runId"]


# Each Timeline row drawn: (its offset, its label's text).
_TIMELINE_ROWS = """() => Array.from(document.querySelectorAll('#event-history-timeline-graph li')).map(li => [
    parseFloat((li.style.transform.match(/translateY\\(([-\\d.]+)px\\)/) || [0, 0])[1]),
    li.innerText.trim(),
]).filter(([, text]) => text)"""
# Scroll the page down by most of a screen; returns where it got to.
_SCROLL_DOWN = """() => { const page = document.querySelector('#content-wrapper');
    page.scrollTop += Math.max(200, page.clientHeight * 0.8); return page.scrollTop; }"""


def _loopback_only(authorized: dict[str, str]) -> Any:
    """Let the UI reach its own server; anything else it would load (news, fonts, telemetry) is refused.
    A request to a base URL of ``authorized`` carries its ``Authorization`` header."""

    async def route_request(route: Any) -> None:
        url = route.request.url
        if not (url.startswith(("data:", "blob:")) or urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")):
            await route.abort()
            return
        for base, authorization in authorized.items():
            if url.startswith(base) and route.request.method != "OPTIONS":
                await route.continue_(headers={**route.request.headers, "authorization": authorization})
                return
        await route.continue_()

    return route_request


@contextlib.asynccontextmanager
async def browser(
    base: str, *, width: int = 1600, height: int = 800, authorized: dict[str, str] | None = None
) -> AsyncIterator[Browser]:
    """Headless Chromium (the system's) driven by Playwright, with a fresh profile directory;
    ``authorized``: the ``Authorization`` header its requests to a base URL carry (the codec server's)."""
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.async_api import async_playwright

    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile,
                executable_path=chromium_path(),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": width, "height": height},
            )
            try:
                await context.route("**/*", _loopback_only(authorized or {}))
                page = context.pages[0] if context.pages else await context.new_page()
                page.set_default_timeout(20_000)
                yield Browser(page, base)
            finally:
                await context.close()


@dataclass
class Requests:
    """The workflow ids of the requests the scenario ran."""

    quote: str
    trade: str
    approved: str
    waiting: str
    waiting_handle: WorkflowHandle
    denied: str


async def _settle(handle: WorkflowHandle) -> None:
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


async def _approve(client: Client, settings: Settings, workflow_id: str) -> None:
    """Approve the request's checkpoint as the demo's reviewer, signed with its key."""
    key = load_signing_key(settings.reviewer_key) if settings.reviewer_key else None
    for _ in range(300):
        checkpoint = await pending_checkpoint(client, workflow_id)
        if checkpoint is not None:
            await review(
                client,
                workflow_id,
                "approve",
                REVIEWER,
                "checked",
                checkpoint.checkpoint_id,
                signing_key=key,
                calls_digest=checkpoint.calls_digest,
            )
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{workflow_id} opened no checkpoint")


async def run_requests(client: Client, settings: Settings) -> Requests:
    """The four requests, started by the project's client (so with their summaries); the last one is
    left waiting at its checkpoint."""
    quote_handle = await start_request(client, settings, QUOTE, metadata={"cache": "bypass"})
    trade_handle = await start_request(client, settings, TRADE, metadata={"cache": "bypass"})
    approved_handle = await start_request(client, settings, APPROVED, metadata={"cache": "bypass"})
    waiting_handle = await start_request(client, settings, WAITING, metadata={"cache": "bypass"})
    denied_handle = await start_request(client, settings, DENIED, metadata={"cache": "bypass"})
    await _approve(client, settings, approved_handle.id)
    for handle in (quote_handle, trade_handle, approved_handle, denied_handle):
        await _settle(handle)
    for _ in range(300):  # the waiting request is listed as awaiting review
        listed = [e.id async for e in client.list_workflows(search_attributes.AWAITING_REVIEW_QUERY)]
        if waiting_handle.id in listed:
            break
        await asyncio.sleep(0.1)
    return Requests(
        quote_handle.id, trade_handle.id, approved_handle.id, waiting_handle.id, waiting_handle, denied_handle.id
    )


# The list's columns an operator picks with "Configure columns": what each execution is and its stage.
COLUMNS = ["Status", "Workflow ID", "AgentWorkflowKind", "AgentLifecycleStage", "Type", "End"]


async def take_screenshots(ui: Browser, requests: Requests, out: Path, namespace: str = "default") -> list[Path]:
    """The pictures an operator would take: every execution (requests and their children, told apart by
    kind, each at its stage), the requests alone, a waiting request's story, a refusal, an answer."""
    await ui.show_columns(namespace, COLUMNS)
    shots = []
    await ui.open("/workflows", wait_for="detached_effect")
    await ui.wait_for_text("awaiting_review")
    shots.append(await ui.screenshot(out / "workflows.png"))
    await ui.list_workflows(search_attributes.REQUESTS_QUERY, wait_for=requests.trade)
    shots.append(await ui.screenshot(out / "requests.png"))
    await ui.workflow(requests.waiting, "user-metadata", wait_for="awaiting_review")
    shots.append(await ui.screenshot(out / "awaiting-review.png"))
    await ui.workflow(requests.trade, wait_for='"RequiredAfterPlanningError: required after_planning hook')
    shots.append(await ui.screenshot(out / "refused.png"))
    await ui.workflow(requests.quote, "user-metadata", wait_for="outcome:")
    shots.append(await ui.screenshot(out / "completed.png"))
    await ui.timeline(requests.denied, wait_for="✗ denied")
    await ui.show_row("✗ denied")
    shots.append(await ui.screenshot(out / "timeline.png"))
    await ui.workflow(requests.quote, wait_for='{"plan":{"steps":')
    await ui.page.get_by_text('{"plan":{"steps":').first.scroll_into_view_if_needed()
    shots.append(await ui.screenshot(out / "decoded-plan.png"))
    return shots


@contextlib.asynccontextmanager
async def demo_ui(settings: Settings) -> AsyncIterator[tuple[Browser, Requests]]:
    """A dev server with its UI (``settings``: free loopback ports, a throwaway state directory), a demo
    worker, the demo requests run on it, and Chromium on the UI; the request left waiting for a reviewer
    is terminated at the end."""
    settings = demo_settings(settings).model_copy(update={"tool_allow_list": SCREENSHOT_TOOL_ALLOW_LIST})
    activities = load_activities(settings)
    codec_port = free_port()
    codec_base = f"http://127.0.0.1:{codec_port}"
    token = secrets.token_urlsafe(32)
    access = Access(BearerAuth(token=token), origins=frozenset({f"http://127.0.0.1:{settings.ui_port}"}))
    codec = asyncio.create_task(serve(Codec.of(process_data_converter(settings)), "127.0.0.1", codec_port, access))
    env = await start_dev_server(settings, codec_endpoint=codec_base)
    try:
        client = await connect(settings, tracing=False)
        await prepare(client, settings, activities)
        async with build_worker(client, settings.task_queue, activities):
            requests = await run_requests(client, settings)
            try:
                async with browser(settings.ui_url, authorized={codec_base: f"Bearer {token}"}) as ui:
                    yield ui, requests
            finally:
                await requests.waiting_handle.terminate("screenshots taken")
    finally:
        await env.shutdown()
        codec.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await codec


async def main(out: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="agent-screenshots-") as state:
        settings = Settings.from_env(
            {},
            temporal_address=f"127.0.0.1:{free_port()}",
            ui_port=free_port(),
            state_dir=Path(state),
            task_queue="screenshots",
        )
        async with demo_ui(settings) as (ui, requests):
            shots = await take_screenshots(ui, requests, out)
    for shot in shots:
        print(shot)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("screenshots"), help="directory for the PNG files")
    exit_process(asyncio.run(main(parser.parse_args().out)))
