"""The main job: run the demo against the embedded Temporal dev server.

    python -m demo           # start the dev server + a worker, run three requests, print what happened
    python -m demo --hold    # ... then keep the server, UI and worker up until Ctrl-C

1. an allowed quote request is planned, executed and answered (cache reads bypassed, so it is fresh);
2. a trade request is refused by the required ``allowed-operations`` hook (``RequiredAfterPlanningError``);
3. the first request, repeated, is served from the response cache;
4. a message with a price is planned in two phases (quote, then ``send_message`` referencing the quote),
   waits at a human-in-the-loop checkpoint because ``send_message`` needs approval, and is approved by the
   demo reviewer through the ``review`` update; its audit record is written by a detached child workflow;
5. a company profile is answered by ``company_profile``, a tool of the demo's MCP server
   (``demo/mcp_server.py``, which the worker started over stdio), under the same tool hooks.

The pipeline has shared memory (``build_memory_hooks``): request 1's quote is recorded as an episodic
event, and request 2 — the second request about ACME — is planned with that outcome in its
``<agent_memory>`` context. Every executed request announces its activity; the workflow owns the signal
and removes it on every exit (request 2 fails, and its signal is still cleaned up).

Exits non-zero if any of them does not behave that way.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from activities.mcp import McpStartupError
from client import Settings, connect, exit_process
from client.api import describe_failure, pending_checkpoint, review, start_request
from client.cli import format_checkpoint, format_record
from client.devserver import start_dev_server
from client.reviewer_keys import load_signing_key
from client.settings import SettingsError
from client.telemetry import TelemetryConfigError, configure_telemetry, shutdown_telemetry
from demo.pipeline import DEMO_PIPELINE, DEMO_REVIEWER, demo_settings
from worker import build_worker, load_activities, prepare
from workflows import search_attributes
from workflows.models import ExecutionRecord, Stage

QUOTE = "What is the price of ACME?"
TRADE = "Buy 10 ACME"
MESSAGE = "Send a message to alice with the price of ACME"
PROFILE = "Show the company profile of ACME"


async def _approve_when_asked(client, settings, workflow_id: str) -> tuple[bool, str | None]:
    """Play the reviewer: find the request in the reviewers' inbox (the ``AgentAwaitingReview = true``
    listing), show its checkpoint, try an unsigned approval (refused), then approve it through the update,
    signed with the demo reviewer's key. Returns whether the inbox listed it, and why the unsigned
    approval was refused (None if it was accepted)."""
    key = load_signing_key(settings.reviewer_key) if settings.reviewer_key else None
    listed = False
    for _ in range(300):
        if not listed:
            listed = any(
                [e.id == workflow_id async for e in client.list_workflows(search_attributes.AWAITING_REVIEW_QUERY)]
            )
        checkpoint = await pending_checkpoint(client, workflow_id)
        if checkpoint is not None and listed:
            print("\n=== 4a. a checkpoint is waiting for a reviewer (listed by `agent-lifecycle inbox`)")
            print(format_checkpoint(workflow_id, checkpoint))
            try:
                await review(client, workflow_id, "approve", DEMO_REVIEWER, "typed name only", checkpoint.checkpoint_id)
                refused = None
            except WorkflowUpdateFailedError as err:
                refused = str(getattr(err.cause, "message", err.cause))
                print(f"an unsigned approval naming {DEMO_REVIEWER} was refused: {refused}")
            ack = await review(
                client,
                workflow_id,
                "approve",
                DEMO_REVIEWER,
                "recipient and text checked",
                checkpoint.checkpoint_id,
                signing_key=key,
                calls_digest=checkpoint.calls_digest,
            )
            print(f"approved by {ack.reviewer} ({ack.verified_by}) at {ack.accepted_at:%H:%M:%S}")
            return True, refused
        await asyncio.sleep(0.1)
    if checkpoint is not None:  # never listed: approve anyway so the demo ends, and report the failed check
        await review(
            client,
            workflow_id,
            "approve",
            DEMO_REVIEWER,
            "approved although the inbox missed it",
            checkpoint.checkpoint_id,
            signing_key=key,
        )
        return False, None
    raise TimeoutError("no checkpoint opened")


async def _request(client, settings, spans, text: str, metadata: dict | None = None, *, reviewer: bool = False):
    handle = await start_request(client, settings, text, metadata=metadata)
    reviewed = await _approve_when_asked(client, settings, handle.id) if reviewer else None
    try:
        result, failure = await handle.result(), None
    except WorkflowFailureError as err:
        result, failure = None, describe_failure(err)
    record = await handle.query("execution_record", result_type=ExecutionRecord)
    hook_spans = [
        s.name
        for s in spans.get_finished_spans()
        if s.name.startswith("pipeline.hook.") and s.attributes.get("pipeline.request_id") == record.request_id
    ]
    return handle.id, result, failure, record, hook_spans, reviewed


async def _settled_effect(store, workflow_id: str, effect_id: str) -> str | None:
    """The effect's status in the stored record once the detached child has reported (or after 30 s)."""
    status = None
    for _ in range(300):
        record = await store.get(workflow_id)
        effect = record.effect(effect_id) if record else None
        status = effect.status.value if effect else None
        if status not in (None, "pending"):
            break
        await asyncio.sleep(0.1)
    return status


def _memory_context(record: ExecutionRecord) -> str:
    """The shared-memory part of the ``<agent_memory>`` section of the request's planning prompt."""
    prompt = record.planning_prompt or ""
    if "<agent_memory>" not in prompt:
        return ""
    section = prompt.split("<agent_memory>\n", 1)[1].split("\n</agent_memory>", 1)[0]
    start = section.find("Shared memory of agent domain")
    return section[start:] if start >= 0 else ""


def _show(title: str, settings: Settings, workflow_id: str, result, failure, record, hook_spans, reviewed=None) -> None:
    print(f"\n=== {title}")
    if failure:
        print(f"failed with {failure['type']}: {failure['message']}")
    else:
        print(f"response: {result.response}")
        print(
            f"confidence {result.confidence}; short_circuit {result.short_circuit.model_dump() if result.short_circuit else None}"
        )
    print(format_record(record))
    print(f"spans: {', '.join(hook_spans) or '(none)'}")
    print(f"UI: {settings.ui_url}/workflows/{workflow_id}")


def _shown_path(path: Path) -> Path:
    """``path`` as a command typed here would name it: relative to the working directory when inside it."""
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


async def main(hold: bool) -> int:
    # SIGTERM and SIGINT end the demo the same way: its dev server, worker and clients are shut down.
    running = asyncio.current_task()
    assert running is not None
    for stop in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(stop, running.cancel)
    settings = demo_settings()
    spans = InMemorySpanExporter()  # the demo prints each request's hook spans; OTEL_* may export them too
    configure_telemetry(
        "agent-lifecycle-demo", settings.telemetry, span_processors=[SimpleSpanProcessor(spans)], temporal_metrics=True
    )

    activities = load_activities(settings)
    print(f"starting the embedded Temporal dev server on {settings.temporal_address} (UI port {settings.ui_port}) ...")
    env = await start_dev_server(settings)
    try:
        client = await connect(settings)
        await prepare(client, settings, activities)
        async with build_worker(client, settings.task_queue, activities):
            quote = await _request(client, settings, spans, QUOTE, {"cache": "bypass"})
            _show("1. allowed quote request (cache reads bypassed)", settings, *quote)
            trade = await _request(client, settings, spans, TRADE)
            _show("2. trade request (execute_trade is not on the allow-list)", settings, *trade)
            repeat = await _request(client, settings, spans, QUOTE)
            _show("3. the quote request again", settings, *repeat)
            message = await _request(client, settings, spans, MESSAGE, {"cache": "bypass"}, reviewer=True)
            _show("4b. the message request, approved and finished", settings, *message)
            audit = await _settled_effect(activities.store, message[0], "audit-write")
            print(f"audit-write effect in the store after the detached child finished: {audit}")
            profile = await _request(client, settings, spans, PROFILE, {"cache": "bypass"})
            _show("5. a company profile from the demo's MCP server (stdio)", settings, *profile)
            profile_steps = {s.step_id for s in profile[3].steps if s.tool == "research-service/company_profile"}
            profile_guards = sorted(
                {i.hook for i in profile[3].invocations(Stage.BEFORE_TOOL) if i.step_id in profile_steps}
            )
            print(f"before_tool hooks that governed the MCP call: {', '.join(profile_guards) or '(none)'}")

            # request 1's quote step, whatever the planner named it
            first_events = [f"{quote[0]}:{step.step_id}" for step in quote[3].steps]
            remembered = _memory_context(trade[3])
            read = trade[3].effect("memory_episodic_read")
            print(
                "\n=== memory: request 2 (the second request about ACME) was planned with this <agent_memory> context"
            )
            print(remembered or "(none)")
            print(f"memory_episodic_read: {read.data if read else None}")
            cleanups = {
                name: (
                    r[3].effect("activity_signal_cleanup").status.value
                    if r[3].effect("activity_signal_cleanup")
                    else None
                )
                for name, r in (("1 (completed)", quote), ("2 (required rejection)", trade), ("4 (completed)", message))
            }
            print(f"activity_signal_cleanup by request: {cleanups}")

            listed, unsigned_refused = message[5] or (False, None)
            signed_by = (
                f"key {load_signing_key(settings.reviewer_key).kid} of {DEMO_REVIEWER}"
                if settings.reviewer_key
                else None
            )
            checks = {
                "quote answered after planning and execution": quote[1] is not None
                and quote[1].short_circuit is None
                and any(s.status == "succeeded" for s in quote[1].steps),
                "trade refused with RequiredAfterPlanningError, no tool run": trade[2] is not None
                and trade[2]["type"] == "RequiredAfterPlanningError"
                and not trade[3].steps,
                "repeat served from the response cache": repeat[1] is not None
                and repeat[1].short_circuit is not None
                and repeat[1].short_circuit.reason == "cache_match",
                "message sent after approval, in two phases": message[1] is not None
                and [s.status for s in message[1].steps] == ["succeeded", "succeeded"]
                and [c.status for c in message[3].checkpoints] == ["approved"]
                # (a model planner asks once more after the message and plans nothing: a third, empty phase)
                and [p.phase for p in message[3].plans if p.plan.steps] == [1, 2],
                "the waiting message request was in the reviewers' inbox (AgentAwaitingReview = true)": listed,
                "an unsigned approval was refused; the one signed with the reviewer's key ran the message": (
                    "must be signed" in (unsigned_refused or "")
                    and [(c.reviewer, c.verified_by) for c in message[3].checkpoints] == [(DEMO_REVIEWER, signed_by)]
                ),
                "audit write detached and completed": audit == "succeeded",
                "request 2 planned with request 1's outcome in <agent_memory>": read is not None
                and any(event in read.data["event_ids"] for event in first_events)
                and "stock-service/stock_quote succeeded [ACME]" in remembered,
                "activity signals cleaned up by the request owner on success and on rejection": all(
                    status == "succeeded" for status in cleanups.values()
                ),
                "company profile from the MCP server, under the allow-list tool hook": profile[1] is not None
                and [(s.tool, s.status) for s in profile[1].steps]
                == [("research-service/company_profile", "succeeded")]
                and "Acme Corporation" in profile[1].response
                and "allow-list" in profile_guards,
            }
            print("\n=== summary")
            for name, ok in checks.items():
                print(f"[{'ok' if ok else 'FAILED'}] {name}")
            print(f"\nTemporal UI: {settings.ui_url}/workflows  (workflow type {'RequestLifecycle'})")
            print("Each hook invocation is an activity labelled '<stage> · <hook>' in the event history.")
            state = _shown_path(settings.state_dir)
            print(f"Stored records: AGENT_STATE_DIR={state} agent-lifecycle record <request id>  (or list)")
            if hold:
                print("holding: the server, UI and worker stay up until Ctrl-C or SIGTERM", flush=True)
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    pass
            else:
                print(
                    f"The dev server's database persists in the state directory ({state}): "
                    f"`AGENT_STATE_DIR={state} AGENT_PIPELINE={DEMO_PIPELINE} "
                    f"AGENT_REVIEWER_KEYS={state}/reviewers.json .venv/bin/python worker.py --dev` "
                    "brings these executions back in the UI."
                )
            return 0 if all(checks.values()) else 1
    finally:
        await activities.aclose()  # the demo's MCP server process and model clients end here
        await env.shutdown()
        shutdown_telemetry()  # exported spans and metrics reach the collector before the process ends


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", action="store_true", help="keep the server, UI and worker running afterwards")
    try:
        exit_process(asyncio.run(main(parser.parse_args().hold)))
    except SettingsError as err:
        print(f"configuration error: {err}", file=sys.stderr)
        exit_process(2)
    except TelemetryConfigError as err:
        print(f"telemetry configuration error: {err}", file=sys.stderr)
        exit_process(2)
    except McpStartupError as err:  # the demo's MCP server (or one of AGENT_MCP_SERVERS) cannot be listed
        print(f"MCP server error: {err}", file=sys.stderr)
        exit_process(2)
    except (KeyboardInterrupt, asyncio.CancelledError):  # stopped by a signal, after its shutdown ran
        print("demo stopped; the dev server is shut down", flush=True)
        exit_process(130)
