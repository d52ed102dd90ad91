"""``agent-lifecycle``: start requests, await results or typed failures, and read execution records.

    agent-lifecycle run "What is the price of ACME?"          # start, wait, print the result
    agent-lifecycle run "Buy 10 ACME" --metadata '{"user_id": "u1"}'
    agent-lifecycle run "What is the price of ACME?" --stream # print the answer while it is written
    agent-lifecycle start "What is the price of ACME?"        # start only; prints the workflow id
    agent-lifecycle answer request-1a2b3c                     # follow a request started with --stream
    agent-lifecycle result request-1a2b3c                     # await an existing request
    agent-lifecycle record 1a2b3c [--live] [--json]           # stored record, or --live via query (request or workflow id)
    agent-lifecycle list                                      # recent stored records

A reviewer's inbox:

    agent-lifecycle inbox                                     # requests awaiting review
    agent-lifecycle show request-1a2b3c                       # the pending checkpoint: plan and reasons
    agent-lifecycle approve request-1a2b3c --reviewer alice --comment "ok"
    agent-lifecycle reject request-1a2b3c --reviewer alice --reason "wrong recipient"

Declared hooks (AGENT_HOOKS_FILE):

    agent-lifecycle hooks dry-run --hook block-rm --event-json '{"tool_name": "shell/exec", "tool_input": {"cmd": "rm -rf /"}}'
    agent-lifecycle hooks enable block-rm                    # re-enable after the circuit breaker tripped
    agent-lifecycle hooks encrypt 'Bearer s3cret'             # a header value for the file (AGENT_HOOK_SECRET_KEY)
    agent-lifecycle hooks executions --hook block-rm          # the audit rows
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.exceptions import ApplicationError, CancelledError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from workflows import WORKFLOW_TYPE, data_converter, search_attributes, story
from workflows.decisions import REQUEST_ID_CONFLICT
from workflows.models import (
    ANSWER_TOPIC,
    AnswerChunk,
    Checkpoint,
    ExecutionRecord,
    RequestInput,
    RequestResult,
    ReviewAck,
    ReviewRequest,
)

from . import Settings, connect, declared_hooks, execution_store, exit_process
from .telemetry import TelemetryConfigError, configure_telemetry, shutdown_telemetry


def workflow_id_for(request_id: str) -> str:
    return f"request-{request_id}"


class RequestIdConflict(ApplicationError):
    """A request id already names a request with another input: refused, never deduplicated."""

    def __init__(self, request_id: str, workflow_id: str, detail: str) -> None:
        super().__init__(
            f"request id {request_id!r} already names a different request ({workflow_id}): {detail}",
            {"request_id": request_id, "workflow_id": workflow_id, "detail": detail},
            type=REQUEST_ID_CONFLICT,
            non_retryable=True,
        )


async def start_request(
    client: Client,
    settings: Settings,
    text: str,
    *,
    metadata: dict | None = None,
    request_id: str | None = None,
    stream_answer: bool = False,
) -> WorkflowHandle[Any, RequestResult]:
    """Start a ``RequestLifecycle`` (workflow id ``request-<request_id>``) and return its handle.
    With ``stream_answer`` the answer is also published while it is written (read it with
    :func:`answer_chunks`).

    A request id names one request. Starting an id that is running or has finished with the same input
    attaches to that execution — its handle is returned and its result is the one a caller gets, so a
    retried call never runs the request twice. Starting it with a different input raises
    :class:`RequestIdConflict`.
    """
    request_id = request_id or uuid.uuid4().hex[:12]
    request = RequestInput(request=text, metadata=metadata or {}, request_id=request_id, stream_answer=stream_answer)
    workflow_id = workflow_id_for(request_id)
    try:
        return await client.start_workflow(
            WORKFLOW_TYPE,
            request,
            id=workflow_id,
            task_queue=settings.task_queue,
            result_type=RequestResult,
            static_summary=story.request_summary(text),
            static_details=story.request_details(text, request_id),
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        pass
    handle = client.get_workflow_handle(workflow_id, result_type=RequestResult)
    existing = await started_input(handle)
    if existing is None:
        raise RequestIdConflict(request_id, workflow_id, "its input is not a request")
    if existing.model_dump(mode="json") != request.model_dump(mode="json"):
        raise RequestIdConflict(request_id, workflow_id, "its request or metadata differ")
    return handle


async def started_input(handle: WorkflowHandle) -> RequestInput | None:
    """The input an existing execution was started with (from its first history event), if it is one."""
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            [value] = await data_converter.decode(payloads)
            return RequestInput.model_validate(value)
        except (ValueError, TypeError, ApplicationError):
            return None
    return None


async def live_record(client: Client, key: str) -> ExecutionRecord | None:
    """The record of a request as it stands, by query: ``key`` is its workflow id or its request id."""
    for workflow_id in dict.fromkeys((key, workflow_id_for(key))):
        try:
            return await client.get_workflow_handle(workflow_id).query("execution_record", result_type=ExecutionRecord)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
    return None


async def answer_chunks(client: Client, workflow_id: str, *, from_offset: int = 0) -> AsyncIterator[AnswerChunk]:
    """The answer of a request started with ``stream_answer``, as it is written: the model's text chunks,
    then one ``final`` chunk with the answer after the after_synthesis hooks. Ends when the request
    ends (a request that failed or stopped before synthesis yields nothing). Chunks of a retried
    synthesis carry a higher ``attempt``: drop what the earlier attempt sent."""
    stream = WorkflowStreamClient.create(client, workflow_id)
    async for item in stream.subscribe(ANSWER_TOPIC, from_offset, result_type=AnswerChunk):
        yield item.data


async def _print_answer(client: Client, workflow_id: str) -> None:
    """Print a streamed answer to stdout as it arrives; say so when a retry restarted it or the final
    answer differs from what was streamed (after_synthesis rewrote it)."""
    attempt, streamed = 0, ""
    async for chunk in answer_chunks(client, workflow_id):
        if chunk.final:
            if streamed and chunk.text != streamed:
                print(f"\n[after_synthesis rewrote the answer; the stored answer is:]\n{chunk.text}", flush=True)
            elif not streamed:
                print(chunk.text, end="", flush=True)
            break
        if attempt and chunk.attempt != attempt:
            print(f"\n[synthesis retried (attempt {chunk.attempt}): the answer again]", flush=True)
            streamed = ""
        attempt = chunk.attempt
        streamed += chunk.text
        print(chunk.text, end="", flush=True)
    print(flush=True)


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
        f"  completion {record.request_completion}  pipeline {record.pipeline}",
    ]
    if record.error:
        lines.append(f"error {record.error.type}: {record.error.message}")
    if record.short_circuit:
        sc = record.short_circuit
        lines.append(f"short-circuit {sc.kind} from {sc.source} ({sc.reason})")
    if record.stopped:
        lines.append(f"stopped by {record.stopped.extension} at {record.stopped.phase}: {record.stopped.reason}")
    if record.ask:
        lines.append(f"ask (rewritten by before_run): {record.ask!r}")
    lines.append("hook invocations:")
    for inv in record.pipeline_hooks:
        decision = (
            f"{inv.decision.failure_policy.value}/{inv.decision.action.value}/{inv.decision.reason}"
            if inv.decision
            else "no decision recorded"
        )
        error = f"  error={inv.error_type}: {inv.error}" if inv.error else ""
        phase = f" (phase {inv.plan_phase})" if inv.plan_phase else ""
        phase += f" [{inv.step_id}]" if inv.step_id else ""
        lines.append(
            f"  {inv.stage.value:<16} #{inv.sequence} {inv.hook + phase:<30} {inv.outcome.value:<9} {decision}"
            f"  {inv.duration_ms:.0f} ms{error}"
        )
    if not record.pipeline_hooks:
        lines.append("  (none)")
    if record.effects:
        lines.append("effects:")
        for effect in record.effects:
            lines.append(f"  {effect.effect_id:<34} {effect.status.value:<9} {effect.hook or ''}  {effect.summary}")
    for checkpoint in record.checkpoints:
        decided = f" by {checkpoint.reviewer}: {checkpoint.comment!r}" if checkpoint.reviewer else ""
        lines.append(
            f"checkpoint {checkpoint.checkpoint_id} (phase {checkpoint.phase}) {checkpoint.status.value}{decided}"
        )
    for ignored in record.ignored_reviews:
        lines.append(f"ignored {ignored.via} from {ignored.reviewer!r} for {ignored.checkpoint_id!r}: {ignored.reason}")
    if record.ignored_dropped:
        lines.append(f"ignored {record.ignored_dropped} more message(s) beyond the record's bound")
    for loss in record.worker_losses:
        lines.append(
            f"worker lost under {loss.summary} at {loss.at:%H:%M:%S} (dispatch {loss.dispatch}); dispatched again"
        )
    if record.cache is not None and record.status.value == "succeeded":
        lines.append(
            "cacheable: yes" if record.cache.cacheable else f"cacheable: no ({'; '.join(record.cache.reasons[:3])})"
        )
    if record.trace_id:
        lines.append(f"trace {record.trace_id}")
    if record.planner:
        lines.append(f"planner {record.planner}")
    if record.model_calls:
        usage = record.model_usage
        lines.append(
            f"model calls: {usage.calls} ({usage.failed_calls} failed), tokens {usage.prompt_tokens} in"
            f" + {usage.completion_tokens} out"
        )
        for call in record.model_calls:
            where = f"{call.stage} phase {call.phase}" if call.phase is not None else call.stage
            outcome = call.error_type or call.finish_reason or "?"
            lines.append(
                f"  {where:<18} turn {call.turn}  {call.model:<20} {outcome:<18} {call.tokens:>6} tokens"
                f"  {call.latency_ms:.0f} ms" + ("  streamed" if call.streamed else "")
            )
    if record.plans:
        lines.append("accepted plans:")
        for accepted in record.plans:
            tools = ", ".join(f"{s.step_id}={s.tool}" for s in accepted.plan.steps) or "(no steps)"
            lines.append(f"  phase {accepted.phase}: {tools}")
    if record.steps:
        lines.append("steps:")
        for step in record.steps:
            detail = step.result if step.result is not None else step.error or step.skip_reason or ""
            by = (
                f" (denied by {step.skipped_by})"
                if step.skipped_by
                else f" (handled by {step.error_handled_by})"
                if step.error_handled_by
                else ""
            )
            lines.append(f"  {step.step_id:<14} {step.tool:<28} {step.status.value:<9} {detail[:100]}{by}")
    if record.tool_metrics:
        lines.append("tool metrics:")
        for tool, m in sorted(record.tool_metrics.items()):
            lines.append(
                f"  {tool:<28} calls {m.calls}  failures {m.failures}  skipped {m.skipped}  "
                f"total {m.total_duration_ms:.0f} ms  max {m.max_duration_ms:.0f} ms"
            )
    if record.memory:
        lines.append(
            f"memory: {record.memory.action} for {record.memory.conversation_id}"
            + (f" by {record.memory.by}" if record.memory.by else "")
        )
    for diagnostic in record.diagnostics:
        lines.append(
            f"diagnostic: {diagnostic.extension} at {diagnostic.phase}: {diagnostic.error_type}: {diagnostic.error}"
        )
    draft = record.model_draft
    if draft is not None and (record.final_response is None or not draft.matches(record.final_response)):
        # Never the draft itself: it is what after_synthesis hooks (redaction) had not yet guarded.
        lines.append(
            f"model draft (before after_synthesis, not shown): {draft.chars} chars, sha256 {draft.sha256[:16]}…, "
            f"preview with common secrets masked: {draft.preview[:80]!r}"
        )
    if record.final_response is not None:
        lines.append(f"final response: {record.final_response!r}")
    return "\n".join(lines)


def format_checkpoint(workflow_id: str, checkpoint: Checkpoint) -> str:
    """A checkpoint as a reviewer reads it: the calls approval runs, exactly as they will run (after every
    rewrite), why each needs approval, and the rest of the plan for context."""
    scope = f"  step {checkpoint.step_id}" if checkpoint.step_id else ""
    lines = [
        f"{workflow_id}  checkpoint {checkpoint.checkpoint_id}  phase {checkpoint.phase}{scope}  "
        f"requested {checkpoint.requested_at:%Y-%m-%d %H:%M:%S}  expires {checkpoint.expires_at:%Y-%m-%d %H:%M:%S} UTC",
        "  needs approval:",
        *(f"    {r.step_id} ({r.tool}): {r.reason}" for r in checkpoint.reasons),
    ]
    if checkpoint.calls:
        lines.append("  approving runs exactly:")
        for call in checkpoint.calls:
            lines.append(f"    {call.step_id}: {call.tool} {json.dumps(call.arguments, ensure_ascii=False)}")
            if call.planned_arguments is not None:
                by = f" (rewritten by {', '.join(call.modified_by)})" if call.modified_by else ""
                lines.append(f"      planned as {json.dumps(call.planned_arguments, ensure_ascii=False)}{by}")
    lines.append("  plan:")
    for step in checkpoint.plan.steps:
        deps = step.depends_on + step.implicit_deps
        lines.append(
            f"    {step.step_id}: {step.tool} {json.dumps(step.arguments, ensure_ascii=False)}"
            + (f" after {', '.join(deps)}" if deps else "")
        )
    return "\n".join(lines)


_OPTIONAL_CHECKPOINT: Any = Checkpoint | None  # a query result that may be null


async def pending_checkpoint(client: Client, workflow_id: str) -> Checkpoint | None:
    handle = client.get_workflow_handle(workflow_id)
    return await handle.query("pending_checkpoint", result_type=_OPTIONAL_CHECKPOINT)


async def review(
    client: Client,
    workflow_id: str,
    decision: Literal["approve", "reject"],
    reviewer: str,
    comment: str,
    checkpoint_id: str | None,
) -> ReviewAck:
    """Decide a checkpoint through the ``review`` update (validated, acknowledged)."""
    if checkpoint_id is None:
        checkpoint = await pending_checkpoint(client, workflow_id)
        if checkpoint is None:
            raise ValueError(f"{workflow_id} has no pending checkpoint")
        checkpoint_id = checkpoint.checkpoint_id
    handle = client.get_workflow_handle(workflow_id)
    return await handle.execute_update(
        "review",
        ReviewRequest(checkpoint_id=checkpoint_id, reviewer=reviewer, decision=decision, comment=comment),
        result_type=ReviewAck,
    )


async def _inbox(client: Client) -> int:
    found = 0
    async for execution in client.list_workflows(search_attributes.AWAITING_REVIEW_QUERY):
        checkpoint = await pending_checkpoint(client, execution.id)
        if checkpoint is not None:
            found += 1
            print(format_checkpoint(execution.id, checkpoint))
    if not found:
        print("no requests awaiting review")
    return 0


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "hooks":
        return await declared_hooks.run(args, settings)
    if args.command in ("record", "list") and not getattr(args, "live", False):
        store = execution_store(settings)
        records = [await store.get(args.key)] if args.command == "record" else await store.recent(args.limit)
        records = [r for r in records if r is not None]
        if not records:
            where = "the database" if settings.database_url else settings.execution_store_path
            what = f"no stored record for {args.key!r}" if args.command == "record" else "no stored records"
            print(f"{what} in {where}", file=sys.stderr)
            return 1
        for record in records:
            print(record.model_dump_json(indent=2) if args.json else format_record(record) + "\n")
        return 0

    client = await connect(settings)
    if args.command == "inbox":
        return await _inbox(client)
    if args.command == "answer":
        await _print_answer(client, args.workflow_id)
        return 0
    if args.command == "show":
        checkpoint = await pending_checkpoint(client, args.workflow_id)
        print(
            format_checkpoint(args.workflow_id, checkpoint)
            if checkpoint
            else f"{args.workflow_id} has no pending checkpoint"
        )
        return 0 if checkpoint else 1
    if args.command in ("approve", "reject"):
        text = args.comment if args.command == "approve" else args.reason
        try:
            ack = await review(client, args.workflow_id, args.command, args.reviewer, text, args.checkpoint)
        except WorkflowUpdateFailedError as err:
            print(f"refused: {getattr(err.cause, 'message', err.cause)}", file=sys.stderr)
            return 1
        print(ack.model_dump_json(indent=2))
        return 0
    if args.command == "record":
        record = await live_record(client, args.key)
        if record is None:
            print(f"no request {args.key!r}: neither a workflow id nor a request id", file=sys.stderr)
            return 1
        print(record.model_dump_json(indent=2) if args.json else format_record(record))
        return 0
    if args.command in ("run", "start"):
        metadata = json.loads(args.metadata) if args.metadata else {}
        try:
            handle = await start_request(
                client,
                settings,
                args.text,
                metadata=metadata,
                request_id=args.request_id,
                stream_answer=getattr(args, "stream", False),
            )
        except RequestIdConflict as err:
            print(
                json.dumps({"failed": {"type": err.type, "message": err.message, "details": err.details[0]}}, indent=2)
            )
            return 1
        print(f"started {handle.id}  ({settings.ui_url}/workflows/{handle.id})", file=sys.stderr)
        if args.command == "start":
            print(handle.id)
            return 0
        if args.stream:
            await _print_answer(client, handle.id)
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
    parser = argparse.ArgumentParser(
        prog="agent-lifecycle", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "start a request and wait for its result"), ("start", "start a request")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("text")
        sub.add_argument("--metadata", help="request metadata as a JSON object")
        sub.add_argument("--request-id")
        sub.add_argument(
            "--stream",
            action="store_true",
            help="publish the answer while the model writes it"
            + (" and print it as it arrives" if name == "run" else " (follow it with `answer`)"),
        )
    sub = commands.add_parser("answer", help="print a streamed answer as it is written, until the request ends")
    sub.add_argument("workflow_id")
    sub = commands.add_parser("result", help="wait for an existing request's result")
    sub.add_argument("workflow_id")
    sub = commands.add_parser("record", help="print an execution record")
    sub.add_argument("key", help="request id or workflow id")
    sub.add_argument(
        "--live", action="store_true", help="query the workflow (by workflow id or request id) instead of the store"
    )
    sub.add_argument("--json", action="store_true")
    commands.add_parser("inbox", help="requests awaiting review")
    sub = commands.add_parser("show", help="the pending checkpoint of a request: plan and reasons")
    sub.add_argument("workflow_id")
    for name, text_flag in (("approve", "--comment"), ("reject", "--reason")):
        sub = commands.add_parser(name, help=f"{name} a request's pending checkpoint")
        sub.add_argument("workflow_id")
        sub.add_argument("--reviewer", required=True)
        sub.add_argument(text_flag, default="")
        sub.add_argument("--checkpoint", help="checkpoint id (default: the pending one)")
    declared_hooks.add_parser(commands)
    sub = commands.add_parser("list", help="recent stored execution records")
    sub.add_argument("--limit", type=int, default=10)
    sub.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        configure_telemetry("agent-lifecycle-cli")
    except TelemetryConfigError as err:
        print(f"telemetry configuration error: {err}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, Settings.from_env()))
    except (ValueError, RuntimeError, RPCError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        shutdown_telemetry()  # the request's client spans reach the collector before the process ends


def entry() -> None:
    """Console-script entry."""
    exit_process(main())


if __name__ == "__main__":
    entry()
