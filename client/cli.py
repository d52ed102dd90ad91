"""``agent-lifecycle``: start requests, await results or typed failures, and read execution records.

    agent-lifecycle run "What is the price of ACME?"          # start, wait, print the result
    agent-lifecycle run "Buy 10 ACME" --metadata '{"user_id": "u1"}'
    agent-lifecycle run "What is the price of ACME?" --stream # print the answer while it is written
    agent-lifecycle start "What is the price of ACME?"        # start only; prints the workflow id
    agent-lifecycle answer request-1a2b3c                     # follow a request started with --stream
    agent-lifecycle result request-1a2b3c                     # await an existing request
    agent-lifecycle record 1a2b3c [--live] [--json]           # stored record, or --live via query
    agent-lifecycle list                                      # recent stored records, one line each
    agent-lifecycle cancel 1a2b3c                             # cancel a request (its finalizers run)

A reviewer's inbox:

    agent-lifecycle inbox                                     # requests awaiting review
    agent-lifecycle show 1a2b3c                               # the pending checkpoint: plan and reasons
    agent-lifecycle approve 1a2b3c --reviewer alice --comment "ok"
    agent-lifecycle approve 1a2b3c --reviewer alice --decline send_message-2   # run the rest, skip this call
    agent-lifecycle approve 1a2b3c --reviewer alice --calls-digest sha256:...   # only the calls `show` showed
    agent-lifecycle reject 1a2b3c --reviewer alice --comment "wrong recipient"
    agent-lifecycle reviewer-key --reviewer alice --trust-file reviewers.json   # a key to sign decisions with

With AGENT_REVIEWER_KEY set, approve and reject sign the decision with that key (see docs/review.md).

Payloads in the Temporal Web UI (decrypted, stored by reference, secrets masked; see client/codec.py and
docs/data-protection.md):

    AGENT_CODEC_TOKEN=… agent-lifecycle codec-server [--port 8888] [--host 127.0.0.1] [--allow-origin URL]
    agent-lifecycle encryption-key [--id k2]                  # a new line for AGENT_ENCRYPTION_KEYS_FILE

A conversation, interactively (one line a turn; its turns run one at a time; a checkpoint asks y/n):

    agent-lifecycle chat [--conversation ID] [--reviewer alice]

A request is named by its request id or its workflow id (``request-<request id>``) everywhere.

Declared hooks (AGENT_HOOKS_FILE):

    agent-lifecycle hooks dry-run --hook block-rm --event-json '{"tool_name": "shell/exec", "tool_input": {"cmd": "rm -rf /"}}'
    agent-lifecycle hooks enable block-rm                    # re-enable after the circuit breaker tripped
    agent-lifecycle hooks encrypt 'Bearer s3cret'             # a header value for the file (AGENT_HOOK_SECRET_KEY)
    agent-lifecycle hooks executions --hook block-rm          # the audit rows

Try a pipeline change on the past (nothing runs, nothing recorded changes):

    agent-lifecycle replay-policy --pipeline my_app.pipeline:stricter --since 7d --out report.html
    agent-lifecycle replay-policy --pipeline my_app.pipeline:stricter --fail-on newly_blocked   # exit 3 if any
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from . import exit_process

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from workflows.models import Checkpoint, ExecutionRecord, Plan

    from .api import AgentClient
    from .settings import Settings

# What a command imports is imported once its arguments are parsed: ``--help`` and a usage error load
# nothing but argparse, and a command loads only what it uses (no model, store or hook libraries to start
# or follow a request).


def tool_keys(plans: Iterable[Plan]) -> Callable[[str, str], str]:
    """How a record names a step's tool for a reader: ``name(step_id, tool)`` is the tool's full key
    ``namespace/agent/capability`` (its identity, as docs, errors and ``--check`` name it), found in the
    plans, for the ``agent/capability`` name the record keeps (what hook matchers see); ``tool`` itself
    where no plan says (a tool name two namespaces share)."""
    by_step: dict[str, str] = {}
    by_name: dict[str, set[str]] = {}
    for plan in plans:
        for step in plan.steps:
            by_step[step.step_id] = step.tool_key
            by_name.setdefault(step.tool, set()).add(step.tool_key)

    def name(step_id: str, tool: str) -> str:
        key = by_step.get(step_id)
        if key is not None and key.endswith("/" + tool):
            return key
        keys = by_name.get(tool, set())
        return next(iter(keys)) if len(keys) == 1 else tool

    return name


def format_record(record: ExecutionRecord) -> str:
    """A reading of the record for a terminal: outcome, hook invocations with decisions, effects, steps."""
    tool = tool_keys(accepted.plan for accepted in record.plans)
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
        decided += f" ({checkpoint.verified_by})" if checkpoint.verified_by else ""
        lines.append(
            f"checkpoint {checkpoint.checkpoint_id} (phase {checkpoint.phase}) {checkpoint.status.value}{decided}"
        )
    for ignored in record.ignored_reviews:
        lines.append(f"ignored {ignored.via} from {ignored.reviewer!r} for {ignored.checkpoint_id!r}: {ignored.reason}")
    if record.ignored_dropped:
        lines.append(f"ignored {record.ignored_dropped} more message(s) beyond the record's bound")
    for loss in record.worker_losses:
        if loss.attempt is None:
            what = f"(dispatch {loss.dispatch}); dispatched again"
        else:
            what = f"(dispatch {loss.dispatch}, attempt {loss.attempt}); retried"
        lines.append(f"worker lost under {loss.summary} at {loss.at:%H:%M:%S} {what}")
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
            where += f" {call.hook}" if call.hook else ""
            outcome = call.error_type or call.finish_reason or "?"
            lines.append(
                f"  {where:<18} turn {call.turn}  {call.model:<20} {outcome:<18} {call.tokens:>6} tokens"
                f"  {call.latency_ms:.0f} ms" + ("  streamed" if call.streamed else "")
            )
    if record.plans:
        lines.append("accepted plans:")
        for accepted in record.plans:
            tools = ", ".join(f"{s.step_id}={s.tool_key}" for s in accepted.plan.steps) or "(no steps)"
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
            lines.append(
                f"  {step.step_id:<14} {tool(step.step_id, step.tool):<40} {step.status.value:<9} {detail[:100]}{by}"
            )
    if record.tool_metrics:
        lines.append("tool metrics:")
        for name, m in sorted(record.tool_metrics.items()):
            lines.append(
                f"  {tool('', name):<40} calls {m.calls}  failures {m.failures}  skipped {m.skipped}  "
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


def format_summary(record: ExecutionRecord) -> str:
    """One line per request: when, status, request id, pipeline, what was asked, how it ended."""
    ended = record.error.type if record.error else (record.final_response or "").replace("\n", " ")
    asked = record.request.replace("\n", " ")
    return (
        f"{record.started_at:%Y-%m-%d %H:%M:%S}  {record.status.value:<9}  {record.request_id:<14}  "
        f"{record.pipeline:<16}  {asked[:48]:<48}  {ended[:60]}"
    )


def format_checkpoint(workflow_id: str, checkpoint: Checkpoint) -> str:
    """A checkpoint as a reviewer reads it: the calls approval runs, exactly as they will run (after every
    rewrite), why each needs approval, and the rest of the plan for context."""
    scope = f"  step {checkpoint.step_id}" if checkpoint.step_id else ""
    tool = tool_keys([checkpoint.plan])
    lines = [
        f"{workflow_id}  checkpoint {checkpoint.checkpoint_id}  phase {checkpoint.phase}{scope}  "
        f"requested {checkpoint.requested_at:%Y-%m-%d %H:%M:%S}  expires {checkpoint.expires_at:%Y-%m-%d %H:%M:%S} UTC",
        "  needs approval:",
        *(f"    {r.step_id} ({tool(r.step_id, r.tool)}): {r.reason}" for r in checkpoint.reasons),
    ]
    if checkpoint.calls:
        lines.append("  approving runs exactly:")
        for call in checkpoint.calls:
            lines.append(
                f"    {call.step_id}: {tool(call.step_id, call.tool)} {json.dumps(call.arguments, ensure_ascii=False)}"
            )
            if call.planned_arguments is not None:
                by = f" (rewritten by {', '.join(call.modified_by)})" if call.modified_by else ""
                lines.append(f"      planned as {json.dumps(call.planned_arguments, ensure_ascii=False)}{by}")
        if len(checkpoint.calls) > 1:
            lines.append("  (approve --decline <step id> skips that call and runs the others)")
    if checkpoint.calls_digest:
        lines.append(f"  calls digest: {checkpoint.calls_digest}  (approve --calls-digest pins it)")
    lines.append("  plan:")
    for step in checkpoint.plan.steps:
        deps = step.depends_on + step.implicit_deps
        lines.append(
            f"    {step.step_id}: {step.tool_key} {json.dumps(step.arguments, ensure_ascii=False)}"
            + (f" after {', '.join(deps)}" if deps else "")
        )
    return "\n".join(lines)


async def _print_answer(agents: AgentClient, key: str) -> None:
    """Print a streamed answer to stdout as it arrives; say so when the model's text was a preamble to tool
    calls, when another writer or a retry starts the answer over, and when the final answer differs from
    what was streamed (a hook after the model rewrote it)."""
    writer: tuple[str, int] | None = None
    streamed = ""
    async for chunk in agents.stream(key):
        if chunk.final:
            if streamed and chunk.text != streamed:
                print(f"\n[the hooks rewrote the answer; the stored answer is:]\n{chunk.text}", end="", flush=True)
            elif not streamed:
                print(chunk.text, end="", flush=True)
            break
        if chunk.retracted:
            if streamed:
                print("\n[withdrawn: that text was not the answer]", flush=True)
            streamed = ""
            continue
        if writer is not None and (chunk.activity, chunk.attempt) != writer and streamed:
            again = f"retried (attempt {chunk.attempt})" if chunk.activity == writer[0] else "another model call"
            print(f"\n[{again}: the answer again]", flush=True)
            streamed = ""
        writer = (chunk.activity, chunk.attempt)
        streamed += chunk.text
        print(chunk.text, end="", flush=True)
    print(flush=True)


async def _stored(args: argparse.Namespace, settings: Settings) -> int:
    from . import execution_store

    store = execution_store(settings)
    if args.command == "record":
        key = args.request.removeprefix("request-")
        records = [r for r in (await store.get(args.request), await store.get(key)) if r is not None][:1]
    else:
        records = await store.recent(args.limit)
    if not records:
        where = "the database" if settings.database_url else settings.execution_store_path
        what = f"no stored record for {args.request!r}" if args.command == "record" else "no stored records"
        print(f"{what} in {where}", file=sys.stderr)
        return 1
    for record in records:
        if args.json:
            print(record.model_dump_json(indent=2))
        elif args.command == "list" and not args.full:
            print(format_summary(record))
        else:
            print(format_record(record) + "\n")
    return 0


async def _replay_policy(args: argparse.Namespace, settings: Settings) -> int:
    """Start ``PolicyReplay``, show its progress, write its report; 3 when a ``--fail-on`` finding occurs.
    Interrupting it cancels the replay."""
    from pathlib import Path

    from activities.policy_replay.report import matched, parse_kinds, summary_lines, to_html, to_json
    from workflows.models import ReplayWindow

    from . import connect
    from .replay import parse_since, parse_time, progress_line, replay_progress, replay_report, start_policy_replay

    fail_on = parse_kinds(args.fail_on or "")
    if args.since and (args.start or args.end):
        raise ValueError("give --since or --from/--to, not both")
    window = ReplayWindow(
        since=parse_since(args.since) if args.since else parse_time(args.start) if args.start else None,
        until=parse_time(args.end) if args.end else None,
        tenant=args.tenant,
        agent=args.agent,
        limit=args.limit,
    )
    client = await connect(settings, tracing=bool(settings.telemetry.traces_exporter))
    handle = await start_policy_replay(client, settings, args.pipeline, window, batch_size=args.batch_size)
    print(f"replaying {args.pipeline} as {handle.id}", file=sys.stderr)
    waiting = asyncio.ensure_future(handle.result())
    try:
        while not waiting.done():
            await asyncio.wait([waiting], timeout=0.5)
            try:
                line = progress_line(await replay_progress(client, handle.id))
            except Exception:  # noqa: BLE001 - the query races the end of the run: the result says the rest
                continue
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        await handle.cancel()
        print(f"\nreplay cancelled: {handle.id}", file=sys.stderr)
        raise
    result = waiting.result()
    print(file=sys.stderr)
    report = replay_report(settings, result, window)
    for line in summary_lines(report):
        print(line)
    if args.out:
        out = Path(args.out)
        out.write_text(to_html(report) if out.suffix.lower() in (".html", ".htm") else to_json(report))
        print(f"report: {out}")
    elif args.json:
        print(to_json(report), end="")
    found = matched(report, fail_on)
    if found:
        print(f"failing: found {', '.join(found)}", file=sys.stderr)
        return 3
    return 0


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "codec-server":
        from . import process_data_converter
        from .codec import Access, Codec, serve

        access = Access.from_settings(settings.codec_server, args.host, args.allow_origin or ())
        await serve(Codec.of(process_data_converter(settings)), args.host, args.port, access)
        return 0
    if args.command == "replay-policy":
        return await _replay_policy(args, settings)
    if args.command == "reviewer-key":
        return _reviewer_key(args, settings)
    if args.command == "hooks":
        from . import declared_hooks

        return await declared_hooks.run(args, settings)
    if args.command in ("record", "list") and not getattr(args, "live", False):
        return await _stored(args, settings)

    from .api import AgentClient, RequestFailed, RequestIdConflict, RequestNotFound, ReviewRefused

    agents = await AgentClient.connect(settings, tracing=bool(settings.telemetry.traces_exporter))
    try:
        return await _command(agents, args)
    except RequestNotFound as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except ReviewRefused as err:
        print(f"refused: {err}", file=sys.stderr)
        return 1
    except RequestIdConflict as err:
        print(json.dumps({"failed": {"type": err.type, "message": err.message, "details": err.details[0]}}, indent=2))
        return 1
    except RequestFailed as err:
        print(json.dumps({"failed": err.as_dict()}, indent=2, default=str))
        return 1


def _reviewer_key(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from .reviewer_keys import generate_key, trust_reviewer_key

    path = Path(args.key_file) if args.key_file else settings.reviewer_key
    if path is None:
        print("error: where should the key go? --key-file, or AGENT_REVIEWER_KEY", file=sys.stderr)
        return 2
    jwk = generate_key(path)
    print(f"wrote {args.reviewer}'s private key to {path} (mode 0600; AGENT_REVIEWER_KEY={path})", file=sys.stderr)
    if args.trust_file:
        trust_reviewer_key(Path(args.trust_file), args.reviewer, jwk)
        print(f"trusted it in {args.trust_file} (the worker's AGENT_REVIEWER_KEYS)", file=sys.stderr)
    public = {name: value for name, value in jwk.items() if name != "kid"}
    print(json.dumps({"reviewers": {args.reviewer: [public]}}))
    return 0


def _proof(value: str | None) -> str:
    """A ``--proof`` value, read from a file when it starts with ``@``."""
    if not value:
        return ""
    if value.startswith("@"):
        from pathlib import Path

        return Path(value[1:]).read_text(encoding="utf-8").strip()
    return value.strip()


async def _chat(agents: AgentClient, conversation: str | None, reviewer: str) -> int:
    """Read a line, submit it as the next turn, print the answer; when the turn opens a checkpoint, show
    it and read y/n for it. Ends at end of input or ``/quit``."""
    import uuid

    from .api import RequestFailed, TurnRefused

    conversation = conversation or f"chat-{uuid.uuid4().hex[:10]}"
    print(f"conversation {conversation} (end with /quit or end of input)", file=sys.stderr)

    async def line() -> str | None:
        text = await asyncio.to_thread(sys.stdin.readline)
        return text.rstrip("\n") if text else None

    while (text := await line()) is not None:
        if text.strip() in ("/quit", "/exit"):
            break
        if not text.strip():
            continue
        try:
            turn = await agents.submit_turn(conversation, text)
        except TurnRefused as err:
            print(f"refused: {err}", file=sys.stderr)
            continue
        print(f"[turn {turn.turn}: {turn.workflow_id}]", file=sys.stderr)
        answer = asyncio.ensure_future(agents.turn_result(turn))
        decided: set[str] = set()
        while not answer.done():
            await asyncio.wait([answer], timeout=0.3)
            if answer.done():
                break
            try:
                pending = await agents.pending(turn.workflow_id)
            except Exception:  # noqa: BLE001 - not started yet: nothing to review
                continue
            for checkpoint in (c for c in pending if c.checkpoint_id not in decided):
                decided.add(checkpoint.checkpoint_id)
                print(format_checkpoint(turn.workflow_id, checkpoint))
                print("approve? [y/N] ", end="", flush=True)
                reply = (await line() or "").strip().lower()
                decision = "approve" if reply in ("y", "yes") else "reject"
                await agents.review(
                    turn.workflow_id, decision, reviewer=reviewer, checkpoint_id=checkpoint.checkpoint_id
                )
                print(f"{decision}d", file=sys.stderr)
        try:
            print(answer.result().response, flush=True)
        except RequestFailed as err:
            print(f"failed: {err.type}: {err.message}", flush=True)
    return 0


async def _command(agents: AgentClient, args: argparse.Namespace) -> int:
    settings = agents.settings
    if args.command == "chat":
        return await _chat(agents, args.conversation, args.reviewer)
    if args.command == "inbox":
        found = await agents.inbox()
        for pending in found:
            print(format_checkpoint(pending.workflow_id, pending.checkpoint))
        if not found:
            print("no requests awaiting review")
        return 0
    if args.command == "answer":
        await _print_answer(agents, args.request)
        return 0
    if args.command == "show":
        workflow_id = await agents.workflow_id(args.request)
        pending = await agents.pending(workflow_id)
        for checkpoint in pending:
            print(format_checkpoint(workflow_id, checkpoint))
        if not pending:
            print(f"{workflow_id} has no pending checkpoint")
        return 0 if pending else 1
    if args.command in ("approve", "reject"):
        reviewer = args.reviewer or settings.principal
        if not reviewer:
            print("error: name the reviewer: --reviewer, or AGENT_PRINCIPAL", file=sys.stderr)
            return 2
        ack = await agents.review(
            args.request,
            args.command,
            reviewer=reviewer,
            comment=args.comment,
            checkpoint_id=args.checkpoint,
            declined=getattr(args, "decline", None) or (),
            proof=_proof(args.proof),
            calls_digest=args.calls_digest,
        )
        print(ack.model_dump_json(indent=2))
        return 0
    if args.command == "cancel":
        await agents.cancel(args.request)
        print(f"cancel requested for {await agents.workflow_id(args.request)}")
        return 0
    if args.command == "record":
        record = await agents.record(args.request)
        print(record.model_dump_json(indent=2) if args.json else format_record(record))
        return 0
    if args.command in ("run", "start"):
        metadata = json.loads(args.metadata) if args.metadata else {}
        handle = await agents.start(
            args.text,
            metadata=metadata,
            request_id=args.request_id,
            stream=args.stream,
            requested_by=args.requested_by,
            instructions=args.instructions,
        )
        print(f"started {handle.id}  ({settings.ui_url}/workflows/{handle.id})", file=sys.stderr)
        if args.command == "start":
            print(handle.id)
            return 0
        if args.stream:
            await _print_answer(agents, handle.id)
        key = handle.id
    else:
        key = args.request
    result = await agents.result(key)
    print(result.model_dump_json(indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-lifecycle", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "start a request and wait for its result"), ("start", "start a request")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("text")
        sub.add_argument("--metadata", help="request metadata as a JSON object")
        sub.add_argument("--request-id")
        sub.add_argument("--requested-by", help="who the request is for (default: AGENT_PRINCIPAL)")
        sub.add_argument("--instructions", help="this request's instructions to the model (after the pipeline's)")
        sub.add_argument(
            "--stream",
            action="store_true",
            help="publish the answer while the model writes it"
            + (" and print it as it arrives" if name == "run" else " (follow it with `answer`)"),
        )
    request = "request id or workflow id"
    sub = commands.add_parser("answer", help="print a streamed answer as it is written, until the request ends")
    sub.add_argument("request", help=request)
    sub = commands.add_parser("result", help="wait for an existing request's result")
    sub.add_argument("request", help=request)
    sub = commands.add_parser("cancel", help="cancel a request (its finalizers run; its record says cancelled)")
    sub.add_argument("request", help=request)
    sub = commands.add_parser("record", help="print an execution record")
    sub.add_argument("request", help=request)
    sub.add_argument("--live", action="store_true", help="query the workflow instead of the store")
    sub.add_argument("--json", action="store_true")
    sub = commands.add_parser("chat", help="an interactive conversation: a line a turn, checkpoints asked y/n")
    sub.add_argument("--conversation", help="the conversation to continue (a new one when not given)")
    sub.add_argument("--reviewer", default="chat", help="who approves the checkpoints the turns open")
    commands.add_parser("inbox", help="requests awaiting review")
    sub = commands.add_parser("show", help="the pending checkpoints of a request: the calls and reasons")
    sub.add_argument("request", help=request)
    for name in ("approve", "reject"):
        sub = commands.add_parser(name, help=f"{name} a request's pending checkpoint")
        sub.add_argument("request", help=request)
        sub.add_argument("--reviewer", help="who decides (default: AGENT_PRINCIPAL)")
        sub.add_argument("--comment", default="", help="why, as the record keeps it")
        sub.add_argument("--checkpoint", help="checkpoint id (default: the oldest pending one)")
        sub.add_argument(
            "--calls-digest", help="decide only if the checkpoint still runs the calls `show` printed with this digest"
        )
        sub.add_argument(
            "--proof",
            help="a decision token from a trusted issuer (or @FILE to read it), instead of AGENT_REVIEWER_KEY",
        )
        if name == "approve":
            sub.add_argument(
                "--decline",
                action="append",
                metavar="STEP",
                help="a call (step id) of the checkpoint not to run: it is skipped and the others run (repeatable)",
            )
    sub = commands.add_parser("reviewer-key", help="make a reviewer's signing key; print (or trust) its public key")
    sub.add_argument("--reviewer", required=True, help="the reviewer the key speaks for")
    sub.add_argument("--key-file", help="where to write the private key (default: AGENT_REVIEWER_KEY)")
    sub.add_argument("--trust-file", help="add the public key to this worker trust file (AGENT_REVIEWER_KEYS)")
    _add_hooks_parser(commands)
    sub = commands.add_parser(
        "codec-server",
        help="Temporal's remote codec endpoint for the Web UI: payloads decrypted, resolved from the payload "
        "store, secrets masked; callers need a bearer token (AGENT_CODEC_TOKEN or a JWT, see AGENT_CODEC_*)",
    )
    sub.add_argument("--port", type=int, default=8888)
    sub.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: loopback only; any other needs AGENT_CODEC_ALLOWED_HOSTS)",
    )
    sub.add_argument(
        "--allow-origin",
        action="append",
        metavar="ORIGIN",
        help="a Web UI origin a browser may call it from, besides AGENT_CODEC_ALLOWED_ORIGINS (repeatable)",
    )
    sub = commands.add_parser("encryption-key", help="print a new key line for AGENT_ENCRYPTION_KEYS_FILE")
    sub.add_argument("--id", help="the key's id (default: k<today's date>)")
    sub = commands.add_parser("list", help="recent stored execution records, one line each")
    sub.add_argument("--limit", type=int, default=10)
    sub.add_argument("--full", action="store_true", help="each record in full")
    sub.add_argument("--json", action="store_true")
    _add_replay_parser(commands)
    return parser


def _add_replay_parser(commands: Any) -> None:
    p = commands.add_parser(
        "replay-policy", help="what a candidate pipeline would have decided on recorded requests (shadow: runs nothing)"
    )
    p.add_argument("--pipeline", required=True, help="the candidate's factory, module:function")
    p.add_argument("--since", help="records of requests started this long ago or later: 7d, 12h, 30m")
    p.add_argument("--from", dest="start", help="records of requests started at or after this ISO time")
    p.add_argument("--to", dest="end", help="records of requests started before this ISO time")
    p.add_argument("--tenant", help="only this tenant's requests (metadata tenant_id)")
    p.add_argument("--agent", help="only this agent's requests (metadata agent_id)")
    p.add_argument("--limit", type=int, help="at most this many records, oldest first")
    p.add_argument("--batch-size", type=int, default=100, help="records per activity (default 100)")
    p.add_argument("--out", help="write the report: .json for machines, .html for people")
    p.add_argument("--json", action="store_true", help="print the JSON report (without --out)")
    p.add_argument(
        "--fail-on",
        help="exit 3 when the replay finds any of these, comma-separated: newly_blocked, newly_allowed, "
        "arguments_changed, newly_needs_approval, required_gate_now_rejects, hook_failed, not_replayed, ...",
    )


def _add_hooks_parser(commands: Any) -> None:
    hooks = commands.add_parser("hooks", help="declared hooks: dry-run, enable, encrypt, executions, budget")
    sub = hooks.add_subparsers(dest="hooks_command", required=True)
    p = sub.add_parser("dry-run", help="fire one hook with a sample event; writes no audit row")
    p.add_argument("--file", help="declared-hooks file (default: AGENT_HOOKS_FILE)")
    p.add_argument("--hook", required=True, help="the hook id")
    p.add_argument(
        "--event-json", default="{}", help='sample event, e.g. {"tool_name": "shell/exec", "tool_input": {...}}'
    )
    p = sub.add_parser("enable", help="re-enable a hook and reset its circuit breaker")
    p.add_argument("hook_id")
    p.add_argument("--actor", default="operator")
    p = sub.add_parser(
        "encrypt", help="encrypt a header secret for a declared-hooks or MCP-servers file (reads stdin without a value)"
    )
    p.add_argument("value", nargs="?")
    sub.add_parser("keygen", help="print a new AGENT_HOOK_SECRET_KEY")
    p = sub.add_parser("executions", help="audit rows of hook executions")
    p.add_argument("--hook")
    p.add_argument("--workflow-id")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--show-errors", action="store_true", help="decrypt each row's full error")
    p = sub.add_parser("budget", help="show or set a tenant's monthly prompt-token budget")
    p.add_argument("tenant")
    p.add_argument("--total", type=int)


class _OneLine(logging.Formatter):
    """What the library logs, as the CLI says it: ``warning: <message>``."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_OneLine())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    if args.command == "encryption-key":  # needs no settings: a fresh key is the same anywhere
        from .encryption import EncryptionKeyError, new_key_line

        try:
            print(new_key_line(args.id))
        except EncryptionKeyError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    from .settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
    except SettingsError as err:
        print(f"configuration error: {err}", file=sys.stderr)
        return 2
    # A CLI that exports nothing loads no telemetry and starts no client span: the worker gives the request
    # its own trace, where a span no one exports would be its missing root.
    if not settings.telemetry.exports:
        return _run_command(args, settings)
    from .telemetry import TelemetryConfigError, configure_telemetry, shutdown_telemetry

    try:
        configure_telemetry("agent-lifecycle-cli", settings.telemetry)
    except TelemetryConfigError as err:
        print(f"telemetry configuration error: {err}", file=sys.stderr)
        return 2
    try:
        return _run_command(args, settings)
    finally:
        shutdown_telemetry()  # the request's client spans reach the collector before the process ends


def _run_command(args: argparse.Namespace, settings: Settings) -> int:
    from temporalio.service import RPCError

    try:
        return asyncio.run(_run(args, settings))
    except (ValueError, RuntimeError, RPCError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def entry() -> None:
    """Console-script entry."""
    exit_process(main())


if __name__ == "__main__":
    entry()
