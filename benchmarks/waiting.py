"""What waiting costs a request: the events its own history gains while it waits at a checkpoint, with and
without a managed lease, on the time-skipping test server (and, with ``--real``, on the dev server).

    python -m benchmarks.waiting                # an hour and a day of waiting per kind (2-3 minutes)
    python -m benchmarks.waiting --real 180     # also 180 s of real waiting on the dev server
    python -m benchmarks.waiting --kinds "demo lease"

Every kind runs the demo's pipeline (``demo.pipeline:build_activities``, its shared-memory hooks included)
on the demo's message request, which stops at a checkpoint for its ``send_message`` call:

- ``no lease``: the activity signal announced unmanaged (``MemoryOptions.managed_activity`` off);
- ``demo lease``: the demo's activity signal, a managed lease (120 s TTL, renewed every 40 s);
- ``demo lease + webhook``: the same, and a reviewers' webhook (a local HTTP server answering 200) told of
  the checkpoint by a ``ReviewNotification`` child;
- ``lease every second``: the signal renewed every second (3 s TTL), for 3 minutes and an hour (a day
  would be 86,400 renewals: half an hour of real time).

The wait is counted from the checkpoint's expiry timer (the last command of the checkpoint's opening) up to
the reviewer's decision: the events the request's history gains after it by each point of the wait, and
the most in any 3 minutes. A rejection ends each request; the lease's renewals (``submitted`` in its
renewal effect; ``renewals_in_request`` of them the request's own) and its release are read from the
record, and the registry must hold no signal afterwards (an unmanaged signal stays until its TTL). Prints
one JSON document to stdout, a table to stderr.

On the dev server (``--real``) the worker is set up as ``worker.py`` sets one up: search attributes
registered and a 2 s stage listing delay.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.memory import MemoryStore
from client import Settings
from client.devserver import temporal_cli_path, time_skipping_server_path
from client.search import ensure_search_attributes
from demo.pipeline import DEMO_PIPELINE
from hooks.builtin.memory import MemoryOptions
from worker import build_worker, load_activities
from workflows import data_converter
from workflows import search_attributes as sa
from workflows.models import Checkpoint, ExecutionRecord, RejectSignal, RequestInput, RequestResult

MESSAGE_REQUEST = "Send a message to bob saying the release is ready"
WINDOW, HOUR, DAY = 180.0, 3600.0, 86400.0  # the unit: events per 3 minutes of waiting
STEP = 60.0  # simulated seconds per sleep of the time-skipping server: one long sleep is one call, which
# times out while the worker renews
MINUTES_3, HOUR_AND_DAY = [("first_3_min", WINDOW), ("first_hour", HOUR)], [("first_hour", HOUR), ("day", DAY)]
RENEWAL_EFFECT, CLEANUP_EFFECT = "activity_signal_renewal", "activity_signal_cleanup"


@dataclass(frozen=True)
class Kind:
    memory: dict[str, Any]  # MemoryOptions: the activity signal's lease
    waits: list[tuple[str, float]]  # on the time-skipping server: (label, seconds waited by then)
    webhook: bool = False  # a reviewers' webhook is told of the checkpoint (a ReviewNotification child)


KINDS: dict[str, Kind] = {
    "no lease": Kind({"managed_activity": False}, HOUR_AND_DAY),
    "demo lease": Kind({}, HOUR_AND_DAY),
    "demo lease + webhook": Kind({}, HOUR_AND_DAY, webhook=True),
    "lease every second": Kind({"activity_ttl_seconds": 3.0, "activity_renew_interval_seconds": 1.0}, MINUTES_3),
}


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextmanager
def webhook_receiver() -> Iterator[str]:
    """A reviewers' webhook on 127.0.0.1 that answers every POST with 200; yields its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/review"
    finally:
        server.shutdown()


def wait_started_at(events: list[Any]) -> int | None:
    """Index of the checkpoint's expiry timer (its summary opens with ``awaiting review``)."""
    converter = data_converter.payload_converter
    for i, event in enumerate(events):
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED and event.user_metadata.HasField("summary"):
            if converter.from_payload(event.user_metadata.summary, str).startswith("awaiting review"):
                return i
    return None


def most_in_window(events: list[Any], since: datetime, until: datetime) -> int:
    """The most of ``events`` that fall in any ``WINDOW`` seconds between ``since`` and ``until``."""
    times = sorted(t for e in events if since <= (t := e.event_time.ToDatetime()) < until)
    most, first = 0, 0
    for last, at in enumerate(times):
        while (at - times[first]).total_seconds() >= WINDOW:
            first += 1
        most = max(most, last - first + 1)
    return most


async def wait_for_checkpoint(handle: WorkflowHandle) -> int:
    """Poll until the request waits at its checkpoint: the index of its expiry timer in the history."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pending = await handle.query("pending_checkpoint", result_type=Checkpoint | None)  # type: ignore[arg-type]
        if pending is not None:
            at = wait_started_at(list((await handle.fetch_history()).events))
            if at is not None:
                return at
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{handle.id} never opened a checkpoint")


async def settled(handle: WorkflowHandle, quiet: float = 1.0) -> list[Any]:
    """The request's history once it has stopped growing for ``quiet`` seconds of real time."""
    events = list((await handle.fetch_history()).events)
    while True:
        await asyncio.sleep(quiet)
        now = list((await handle.fetch_history()).events)
        if len(now) == len(events):
            return now
        events = now


async def reject(handle: WorkflowHandle) -> tuple[ExecutionRecord, str]:
    checkpoint = await handle.query("pending_checkpoint", result_type=Checkpoint | None)  # type: ignore[arg-type]
    assert checkpoint is not None
    await handle.signal("reject", RejectSignal(checkpoint_id=checkpoint.checkpoint_id, reviewer="ops", reason="bench"))
    try:
        await handle.result()
        outcome = "completed"
    except WorkflowFailureError as err:
        outcome = getattr(err.cause, "type", None) or type(err.cause).__name__
    return await handle.query("execution_record", result_type=ExecutionRecord), outcome


async def run_kind(
    client: Client,
    home: Path,
    kind: Kind,
    waits: list[tuple[str, float]],
    advance: Callable[[float], Awaitable[None]],
    *,
    listed: bool,
) -> dict[str, Any]:
    """One request of ``kind``, waited ``waits`` (labels and seconds waited by then) by ``advance``."""
    home.mkdir()
    with webhook_receiver() as url:
        settings = Settings(
            pipeline_factory=DEMO_PIPELINE,
            state_dir=home,
            review_verification="none",
            checkpoint_expiry_seconds=2 * DAY,
            memory=MemoryOptions(**kind.memory),
            **({"review_webhook": url, "hook_allow_loopback": True} if kind.webhook else {}),
        )
        activities = load_activities(settings)
        activities.manifest.search_attributes = listed
        if listed:
            activities.manifest.stage_listing_delay_seconds = settings.stage_listing_delay_seconds
        task_queue = f"waiting-{uuid.uuid4().hex[:8]}"
        registry = MemoryStore(home / "memory.sqlite3")
        async with build_worker(client, task_queue, activities):
            handle = await client.start_workflow(
                "RequestLifecycle",
                RequestInput(request=MESSAGE_REQUEST),
                id=f"waiting-{uuid.uuid4().hex[:8]}",
                task_queue=task_queue,
                result_type=RequestResult,
            )
            at = await wait_for_checkpoint(handle)
            events = await settled(handle)
            opened = events[at].event_time.ToDatetime()
            figures: dict[str, Any] = {"at_once": len(events) - at - 1}
            waited = 0.0
            for label, seconds in waits:
                await advance(seconds - waited)
                waited = seconds
                events = await settled(handle)
                figures[label] = len(events) - at - 1
            figures["most_in_3_min"] = most_in_window(events[at + 1 :], opened, opened + timedelta(seconds=waited))
            figures["signal_live_while_waiting"] = len((await registry.active()).items) == 1
            record, outcome = await reject(handle)
            after = list((await handle.fetch_history()).events)
    figures["outcome"] = outcome
    figures["request_history_events"] = len(after)
    renewal, cleanup = record.effect(RENEWAL_EFFECT), record.effect(CLEANUP_EFFECT)
    if renewal is not None and cleanup is not None:
        renewed = renewal.data if isinstance(renewal.data, dict) else {}
        released = cleanup.data if isinstance(cleanup.data, dict) else {}
        figures["renewals"] = renewed.get("submitted")
        figures["renewal_errors"] = renewed.get("errors")
        figures["renewals_in_request"] = sum(
            1
            for e in after
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and b"renew_lease" in e.marker_recorded_event_attributes.details["data"].payloads[0].data
        )
        figures["keepers"] = renewed.get("keepers")
        figures["released"] = released.get("provider_call_status") == "returned"
    figures["signals_left"] = len((await registry.active()).items)
    return figures


async def time_skipping(kinds: list[str]) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=time_skipping_server_path(), data_converter=data_converter
    )

    async def advance(seconds: float) -> None:
        while seconds > 0:
            await env.sleep(min(seconds, STEP))
            seconds -= STEP

    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="waiting-") as tmp:
            for n, name in enumerate(kinds):
                kind = KINDS[name]
                log(f"time-skipping server: {name}: {', '.join(label for label, _ in kind.waits)}")
                started = time.monotonic()
                results[name] = await run_kind(env.client, Path(tmp) / str(n), kind, kind.waits, advance, listed=False)
                results[name]["real_seconds"] = round(time.monotonic() - started, 1)
    finally:
        await env.shutdown()
    return results


async def dev_server(kinds: list[str], seconds: float) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        data_converter=data_converter,
        search_attributes=sa.ALL,
        dev_server_log_level="error",
    )
    results: dict[str, Any] = {}
    try:
        listed = await ensure_search_attributes(env.client, env.client.namespace, wait_seconds=10)
        with tempfile.TemporaryDirectory(prefix="waiting-real-") as tmp:
            for n, name in enumerate(kinds):
                log(f"dev server: {name}: {seconds:g} s of real waiting")
                results[name] = await run_kind(
                    env.client,
                    Path(tmp) / str(n),
                    KINDS[name],
                    [(f"{seconds:g}_s", seconds)],
                    asyncio.sleep,
                    listed=listed,
                )
    finally:
        await env.shutdown()
    return results


def table(results: dict[str, Any]) -> None:
    for where, kinds in results.items():
        log(f"\n{where}: events the request's history gained while it waited")
        for name, figures in kinds.items():
            log(f"  {name:20} " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What waiting at a checkpoint adds to a request's history.")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default: all)")
    parser.add_argument("--real", type=float, default=0.0, help="also wait this many real seconds on the dev server")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown} (known: {', '.join(KINDS)})")
    results: dict[str, Any] = {"time-skipping server": asyncio.run(time_skipping(kinds))}
    if args.real:
        real = [k for k in kinds if k != "lease every second"] or kinds
        results[f"dev server, {args.real:g} s"] = asyncio.run(dev_server(real, args.real))
    table(results)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
