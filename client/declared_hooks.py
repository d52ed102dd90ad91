"""Declared hooks in a process: the runtime built from settings, and the operator commands
(``agent-lifecycle hooks dry-run | enable | encrypt | keygen | executions | budget``)."""

from __future__ import annotations

import argparse
import json
import sys

from hooks.declarative import (
    DeclaredHook,
    DeclaredHookConfigError,
    DeclaredHookRuntime,
    HookStore,
    SecretBox,
    dry_run,
    load_declared_hooks,
    load_hooks_file,
)

from . import database
from .settings import Settings


def secret_box(settings: Settings) -> SecretBox | None:
    key = settings.hook_secret_key
    return SecretBox.from_base64(key.get_secret_value()) if key is not None else None


def hook_runtime(settings: Settings) -> DeclaredHookRuntime:
    secrets = secret_box(settings)
    return DeclaredHookRuntime(
        store=HookStore(database(settings) or settings.hook_store_path, secrets=secrets),
        secrets=secrets,
        allow_loopback=settings.hook_allow_loopback,
        edition=settings.hook_edition,
        chain_budget_seconds=settings.hook_chain_budget_seconds,
    )


def settings_declared_hooks(settings: Settings) -> list[DeclaredHook]:
    """The declared hooks of ``AGENT_HOOKS_FILE`` (none when unset): what both the worker's start and
    ``worker.py --check`` load. A bad file — an invalid entry, a missing command, or a hooks file, command
    or script others could change — raises ``DeclaredHookConfigError`` (the worker exits 2 naming the
    entry and field, or the file and the fix)."""
    if settings.hooks_file is None:
        return []
    try:
        runtime = hook_runtime(settings)
    except ValueError as err:
        raise DeclaredHookConfigError(f"AGENT_HOOK_SECRET_KEY: {err}") from None
    return load_declared_hooks(settings.hooks_file, runtime)


async def run(args: argparse.Namespace, settings: Settings) -> int:
    command = args.hooks_command
    if command == "keygen":
        print(SecretBox.generate_key())
        return 0
    if command == "encrypt":
        box = secret_box(settings)
        if box is None:
            print(
                "error: AGENT_HOOK_SECRET_KEY is not set (make one with `agent-lifecycle hooks keygen`)",
                file=sys.stderr,
            )
            return 2
        value = args.value if args.value is not None else sys.stdin.read().rstrip("\n")
        print(box.encrypt_value(value))
        return 0
    runtime = hook_runtime(settings)
    if command == "enable":
        if not runtime.store.enable(args.hook_id, actor=args.actor):
            where = runtime.store.database.location if runtime.store.database else runtime.store.path
            print(f"no hook {args.hook_id!r} in {where}", file=sys.stderr)
            return 1
        print(f"hook {args.hook_id} enabled; breaker reset")
        return 0
    if command == "budget":
        if args.total is not None:
            runtime.store.set_budget(args.tenant, args.total)
        remaining, total = runtime.store.budget_remaining(args.tenant)
        print(json.dumps({"tenant": args.tenant, "remaining": remaining, "total": total}))
        return 0
    if command == "executions":
        for row in runtime.store.executions(hook_label=args.hook, workflow_id=args.workflow_id, limit=args.limit):
            line = {
                "id": row.id,
                "hook_id": row.hook_id,
                "hook": row.hook_label,
                "version": row.hook_version,
                "event": row.event,
                "handler": row.handler_type,
                "decision": row.decision,
                "reason": row.reason,
                "status": row.status,
                "duration_ms": round(row.duration_ms, 1),
                "workflow_id": row.workflow_id,
                "error": row.error,
                "metadata": row.metadata,
            }
            if args.show_errors and row.error_detail is not None:
                line["error_detail"] = runtime.store.open_error(row)
            print(json.dumps(line, default=str))
        return 0
    # dry-run
    path = args.file or settings.hooks_file
    if path is None:
        print("error: give --file or set AGENT_HOOKS_FILE", file=sys.stderr)
        return 2
    try:
        specs = load_hooks_file(path)
    except DeclaredHookConfigError as err:
        print(f"error ({err.reason}): {err}", file=sys.stderr)
        return 2
    spec = next((h for h in specs if h.id == args.hook), None)
    if spec is None:
        print(f"error: no hook {args.hook!r} in {path}", file=sys.stderr)
        return 2
    try:
        sample = json.loads(args.event_json)
    except ValueError as err:
        print(f"error: --event-json is not JSON: {err}", file=sys.stderr)
        return 2
    if not isinstance(sample, dict):
        print("error: --event-json must be a JSON object", file=sys.stderr)
        return 2
    result = await dry_run(spec, runtime, sample)
    print(
        json.dumps(
            {
                "hook": spec.id,
                "event": spec.event.value,
                "handler_type": spec.handler_type,
                "decision": result.decision,
                "reason": result.reason,
                "status": result.status,
                "duration_ms": round(result.duration_ms, 1),
                "output": result.output,
                "updatedInput": result.updated_input,
                "additionalContext": result.additional_context,
                "error": result.error,
            },
            indent=2,
            default=str,
        )
    )
    return 0
