"""``agent-lifecycle``: start requests, await results or typed failures, and read execution records.

    agent-lifecycle run "What is the price of ACME?"          # start, wait, print the result
    agent-lifecycle run "Buy 10 ACME" --metadata '{"user_id": "u1"}'
    agent-lifecycle start "What is the price of ACME?"        # start only; prints the workflow id
    agent-lifecycle result request-1a2b3c                     # await an existing request
    agent-lifecycle record request-1a2b3c [--live] [--json]   # stored record, or --live via query
    agent-lifecycle list                                      # recent stored records
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError

from activities.store import SQLiteExecutionStore
from workflows import WORKFLOW_TYPE
from workflows.models import ExecutionRecord, RequestInput, RequestResult

from . import Settings, connect


def workflow_id_for(request_id: str) -> str:
    return f"request-{request_id}"


async def start_request(
    client: Client, settings: Settings, text: str, *, metadata: dict | None = None, request_id: str | None = None
):
    """Start a ``RequestLifecycle``; returns its handle. The workflow id is ``request-<request_id>``."""
    request_id = request_id or uuid.uuid4().hex[:12]
    request = RequestInput(request=text, metadata=metadata or {}, request_id=request_id)
    return await client.start_workflow(
        WORKFLOW_TYPE,
        request,
        id=workflow_id_for(request_id),
        task_queue=settings.task_queue,
        result_type=RequestResult,
        static_summary=f"request: {text[:120]}",
    )


def describe_failure(err: WorkflowFailureError) -> dict[str, Any]:
    """The typed failure of a request as a dict: type, message, details."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        details = cause.details[0] if cause.details else None
        return {"type": cause.type, "message": cause.message, "details": details}
    if isinstance(cause, CancelledError):
        return {"type": "Cancelled", "message": str(cause), "details": None}
    return {"type": type(cause).__name__, "message": str(cause), "details": None}


def format_record(record: ExecutionRecord) -> str:
    """A reading of the record for a terminal: outcome, hook invocations with decisions, effects, steps."""
    lines = [
        f"request {record.request_id}  workflow {record.workflow_id}  run {record.run_id}",
        f"status {record.status.value}  stage {record.lifecycle_stage}  revision {record.record_revision}"
        f"  pipeline {record.pipeline}",
    ]
    if record.error:
        lines.append(f"error {record.error.type}: {record.error.message}")
    if record.short_circuit:
        sc = record.short_circuit
        lines.append(f"short-circuit {sc.kind} from {sc.source} ({sc.reason})")
    lines.append("hook invocations:")
    for inv in record.pipeline_hooks:
        decision = (
            f"{inv.decision.failure_policy.value}/{inv.decision.action.value}/{inv.decision.reason}"
            if inv.decision
            else "no decision recorded"
        )
        error = f"  error={inv.error_type}: {inv.error}" if inv.error else ""
        lines.append(
            f"  {inv.stage.value:<16} #{inv.sequence} {inv.hook:<22} {inv.outcome.value:<9} {decision}"
            f"  {inv.duration_ms:.0f} ms{error}"
        )
    if not record.pipeline_hooks:
        lines.append("  (none)")
    if record.effects:
        lines.append("effects:")
        for effect in record.effects:
            lines.append(f"  {effect.effect_id:<34} {effect.status.value:<9} {effect.hook or ''}  {effect.summary}")
    if record.plans:
        lines.append("accepted plans:")
        for accepted in record.plans:
            tools = ", ".join(f"{s.step_id}={s.tool}" for s in accepted.plan.steps) or "(no steps)"
            lines.append(f"  phase {accepted.phase}: {tools}")
    if record.steps:
        lines.append("steps:")
        for step in record.steps:
            detail = step.error or step.skip_reason or json.dumps(step.output)[:100]
            lines.append(f"  {step.step_id:<14} {step.tool:<28} {step.status.value:<9} {detail}")
    if record.model_response is not None and record.model_response != record.final_response:
        lines.append(f"model response (before after_synthesis): {record.model_response!r}")
    if record.final_response is not None:
        lines.append(f"final response: {record.final_response!r}")
    return "\n".join(lines)


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command in ("record", "list") and not getattr(args, "live", False):
        store = SQLiteExecutionStore(settings.execution_store_path)
        records = [await store.get(args.key)] if args.command == "record" else await store.recent(args.limit)
        records = [r for r in records if r is not None]
        if not records:
            print(f"no stored record for {args.key!r} in {settings.execution_store_path}", file=sys.stderr)
            return 1
        for record in records:
            print(record.model_dump_json(indent=2) if args.json else format_record(record) + "\n")
        return 0

    client = await connect(settings)
    if args.command == "record":
        handle = client.get_workflow_handle(args.key)
        record = await handle.query("execution_record", result_type=ExecutionRecord)
        print(record.model_dump_json(indent=2) if args.json else format_record(record))
        return 0
    if args.command in ("run", "start"):
        metadata = json.loads(args.metadata) if args.metadata else {}
        handle = await start_request(client, settings, args.text, metadata=metadata, request_id=args.request_id)
        print(f"started {handle.id}  ({settings.ui_url}/workflows/{handle.id})", file=sys.stderr)
        if args.command == "start":
            print(handle.id)
            return 0
    else:
        handle = client.get_workflow_handle(args.workflow_id, result_type=RequestResult)
    try:
        result = await handle.result()
    except WorkflowFailureError as err:
        print(json.dumps({"failed": describe_failure(err)}, indent=2, default=str))
        return 1
    print(result.model_dump_json(indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-lifecycle", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "start a request and wait for its result"), ("start", "start a request")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("text")
        sub.add_argument("--metadata", help="request metadata as a JSON object")
        sub.add_argument("--request-id")
    sub = commands.add_parser("result", help="wait for an existing request's result")
    sub.add_argument("workflow_id")
    sub = commands.add_parser("record", help="print an execution record")
    sub.add_argument("key", help="request id or workflow id")
    sub.add_argument("--live", action="store_true", help="query the running workflow instead of the store")
    sub.add_argument("--json", action="store_true")
    sub = commands.add_parser("list", help="recent stored execution records")
    sub.add_argument("--limit", type=int, default=10)
    sub.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args, Settings.from_env()))
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
