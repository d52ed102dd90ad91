"""The main job: run the demo against the embedded Temporal dev server.

    python -m demo           # start the dev server + a worker, run three requests, print what happened
    python -m demo --hold    # ... then keep the server, UI and worker up until Ctrl-C

1. an allowed quote request is planned, executed and answered (cache reads bypassed, so it is fresh);
2. a trade request is refused by the required ``allowed-operations`` hook (``RequiredAfterPlanningError``);
3. the first request, repeated, is served from the response cache.

Exits non-zero if any of the three does not behave that way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import WorkflowFailureError

from client import Settings, connect
from client.cli import describe_failure, format_record, start_request
from client.devserver import start_dev_server
from workflows.models import ExecutionRecord
from worker import build_worker, load_activities

QUOTE = "What is the price of ACME?"
TRADE = "Buy 10 ACME"


async def _request(client, settings, spans, text: str, metadata: dict | None = None):
    handle = await start_request(client, settings, text, metadata=metadata)
    try:
        result, failure = await handle.result(), None
    except WorkflowFailureError as err:
        result, failure = None, describe_failure(err)
    record = await handle.query("execution_record", result_type=ExecutionRecord)
    hook_spans = [s.name for s in spans.get_finished_spans() if s.name.startswith("pipeline.hook.")
                  and s.attributes.get("pipeline.request_id") == record.request_id]
    return handle.id, result, failure, record, hook_spans


def _show(title: str, settings: Settings, workflow_id: str, result, failure, record, hook_spans) -> None:
    print(f"\n=== {title}")
    if failure:
        print(f"failed with {failure['type']}: {failure['message']}")
    else:
        print(f"response: {result.response}")
        print(f"confidence {result.confidence}; short_circuit {result.short_circuit.model_dump() if result.short_circuit else None}")
    print(format_record(record))
    print(f"spans: {', '.join(hook_spans) or '(none)'}")
    print(f"UI: {settings.ui_url}/workflows/{workflow_id}")


async def main(hold: bool) -> int:
    settings = Settings.from_env()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)

    activities = load_activities(settings)
    print(f"starting the embedded Temporal dev server on {settings.temporal_address} (UI port {settings.ui_port}) ...")
    env = await start_dev_server(settings)
    try:
        client = await connect(settings)
        async with build_worker(client, settings.task_queue, activities):
            quote = await _request(client, settings, spans, QUOTE, {"cache": "bypass"})
            _show("1. allowed quote request (cache reads bypassed)", settings, *quote)
            trade = await _request(client, settings, spans, TRADE)
            _show("2. trade request (execute_trade is not on the allow-list)", settings, *trade)
            repeat = await _request(client, settings, spans, QUOTE)
            _show("3. the quote request again", settings, *repeat)

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
            }
            print("\n=== summary")
            for name, ok in checks.items():
                print(f"[{'ok' if ok else 'FAILED'}] {name}")
            print(f"\nTemporal UI: {settings.ui_url}/workflows  (workflow type {'RequestLifecycle'})")
            print("Each hook invocation is an activity labelled '<stage> · <hook>' in the event history.")
            print(f"Stored records: agent-lifecycle record <request id>  (store: {settings.execution_store_path})")
            if hold:
                print("holding: the server, UI and worker stay up until Ctrl-C")
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    pass
            else:
                print("The dev server's database persists in the state directory: `python worker.py --dev` "
                      "brings these executions back in the UI.")
            return 0 if all(checks.values()) else 1
    finally:
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", action="store_true", help="keep the server, UI and worker running afterwards")
    try:
        sys.exit(asyncio.run(main(parser.parse_args().hold)))
    except KeyboardInterrupt:
        sys.exit(130)
