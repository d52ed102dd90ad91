"""Declared hooks as pipeline hooks: the dispatcher (filters, safeguards, audit, span) and the adapters
that map the gateway events onto the pipeline's stages.

| event | blocking | stage | what a decision does |
| --- | --- | --- | --- |
| session_start | no | before_run | nothing: observed in a detached effect |
| user_prompt_submit | yes | before_run | block stops the run with the reason; ``updatedInput.prompt`` rewrites the ask |
| pre_tool_use | yes | before_tool | block denies the call; ``updatedInput`` modifies the arguments (validated again) |
| post_tool_use | no | after_tool | nothing: observed in a detached effect |
| stop | no | on_finish | nothing: observed in a detached effect |
| subagent_start | yes | before_tool of sub-agent steps | as pre_tool_use |
| subagent_stop | no | after_tool of sub-agent steps | as post_tool_use |

A blocking hook runs inside its stage's activity (``<stage>_hook``); the declared hooks of one blocking
event form a chain (``HookChain``) whose time budget the workflow enforces: it starts no hook of a spent
chain, bounds each invocation by what is left (the activity's schedule-to-close timeout), and the handler
here stops early enough to write its audit row. A non-blocking hook's activity only hands the event to
a detached effect (a ``DetachedEffect`` child the request does not wait for), whose activity runs the
handler; what it answers (``additionalContext``, ``updatedInput``, a block) is recorded as ignored.

Every invocation leaves one audit row, keyed by the activity's identity (a detached one by its effect),
so a retry never writes twice. Blocking events fail closed: an error blocks — an answer over the cap,
not JSON or not the contract too (``output_over_cap``, ``unparseable_output``, ``invalid_output``) — a
timeout follows ``on_timeout`` (and kills the command's whole process tree), a spent chain decides as a
timeout would (``chain_budget_exhausted``), and a tripped breaker blocks with ``circuit_open`` until
re-enabled. A handler the worker's edition does not allow (``command`` under ``standard``) never runs,
however the hook reached dispatch; nor does a command that is missing or that others could change,
refused when the hooks are built and checked again before each run (``untrusted_command``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.models import (
    CHAIN_RESERVE_SECONDS,
    METADATA_SUBAGENT_DEPTH,
    DetachedWorkResult,
    FailurePolicy,
    HookChain,
    RunMode,
    RunOutcomeView,
    RunPatch,
    RunView,
    Stop,
    ToolCall,
    ToolDecision,
    ToolOutcomeView,
    subagent_depth,
)

from ..contracts import DetachedContext, NotReplayed, PipelineContext, PipelineHook
from .config import (
    DEFAULT_CHAIN_BUDGET_SECONDS,
    DEFAULT_EDITION,
    EDITION_HANDLERS,
    MAX_CHAIN_BUDGET_SECONDS,
    REASON_INVALID,
    REASON_UNTRUSTED,
    CommandHook,
    DeclaredHookConfigError,
    Edition,
    HookEvent,
    HttpHook,
    PromptHook,
    check_edition,
    edition_problem,
    load_hooks_file,
)
from .handlers import (
    REASON_TOKEN_BUDGET_EXCEEDED,
    REASON_UNTRUSTED_COMMAND,
    DecideArguments,
    HandlerError,
    HandlerResult,
    command_environment,
    decide_result,
    prompt_cache_key,
    run_command,
    run_http,
    run_prompt,
    startable_argv,
)
from .security import SecretBox
from .store import GLOBAL_TENANT, ExecutionRow, HookStore

logger = logging.getLogger(__name__)

DeclaredSpec = CommandHook | HttpHook | PromptHook
PROMPT_CACHE_TTL_SECONDS = 60.0
# Room beyond a hook's own timeout for the breaker check and the audit write inside its activity.
ACTIVITY_MARGIN_SECONDS = 10.0

REASON_CIRCUIT_OPEN = "circuit_open"
REASON_HOOK_ERROR = "hook_error"
REASON_TIMEOUT = "timeout"
REASON_CHAIN_BUDGET_EXHAUSTED = "chain_budget_exhausted"
REASON_EDITION = "edition_not_allowed"
# What a non-blocking hook may answer and is never applied: recorded as ignored.
IGNORED_ANSWERS = ("decision", "additionalContext", "updatedInput")


@dataclass
class DeclaredHookRuntime:
    """What every declared hook of a worker shares: the store, the secret key, the network policy.

    Args:
        store: Audit rows, breaker state, the prompt decision cache and tenant budgets (shared by workers).
        secrets: Decrypts header secrets at dispatch and encrypts audit error details.
        allow_loopback: Let http/prompt hooks reach loopback addresses (tests; never in production).
        environ: Where a command hook's allow-listed variables come from.
        edition: ``lite`` (every handler type) or ``standard`` (no ``command`` handlers: refused when the
            hooks are built and again at dispatch).
        chain_budget_seconds: The time the declared hooks of one event share at each occurrence (at most
            10 s); each hook's own timeout is capped by what its chain has left.
    """

    store: HookStore
    secrets: SecretBox | None = None
    allow_loopback: bool = False
    prompt_cache_ttl_seconds: float = PROMPT_CACHE_TTL_SECONDS
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    edition: Edition = DEFAULT_EDITION
    chain_budget_seconds: float = DEFAULT_CHAIN_BUDGET_SECONDS

    def __post_init__(self) -> None:
        if self.edition not in EDITION_HANDLERS:
            raise ValueError(f"edition must be one of {', '.join(EDITION_HANDLERS)}, got {self.edition!r}")
        if not 0 < self.chain_budget_seconds <= MAX_CHAIN_BUDGET_SECONDS:
            raise ValueError(
                f"chain_budget_seconds must be in (0, {MAX_CHAIN_BUDGET_SECONDS:g}], got {self.chain_budget_seconds:g}"
            )


@dataclass(frozen=True)
class InvocationIdentity:
    """The activity an invocation runs in: what makes its audit row unique across retries."""

    workflow_id: str
    run_id: str
    activity_id: str
    request_id: str | None = None

    def dedup_key(self, hook_id: str) -> str:
        material = "\x00".join([self.workflow_id, self.run_id, self.activity_id, hook_id])
        return hashlib.sha256(material.encode()).hexdigest()


@dataclass
class DispatchResult:
    """What one declared-hook invocation decided, and what it observed."""

    decision: Literal["allow", "block", "skip"]
    reason: str
    status: Literal["completed", "error", "timeout"]
    duration_ms: float
    additional_context: str | None = None
    updated_input: dict[str, Any] | None = None
    output: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    tripped: bool = False


@dataclass
class HookEventData:
    """The event as handlers and filters see it."""

    payload: dict[str, Any]
    tool_name: str = ""
    tool_input: dict[str, Any] = field(default_factory=dict)
    depth: int = 0
    tenant: str | None = None


def event_data(spec: DeclaredSpec, ctx: PipelineContext | None, **fields: Any) -> HookEventData:
    """The JSON a handler receives: the event name, the hook, the request's identity and scope, and the
    event's own fields (``tool_name``/``tool_input``, ``prompt``, ``status``...)."""
    metadata = dict(ctx.metadata) if ctx is not None else {}
    raw_tenant = metadata.get("tenant_id")
    tenant = raw_tenant if isinstance(raw_tenant, str) else None
    agent = metadata.get("agent_id") if isinstance(metadata.get("agent_id"), str) else None
    depth = subagent_depth(metadata)
    payload = {
        "event": spec.event.value,
        "hook_id": spec.id,
        "request_id": ctx.request_id if ctx else None,
        "workflow_id": ctx.workflow_id if ctx else None,
        "tenant_id": tenant,
        "agent_id": agent,
        "depth": depth,
        **fields,
    }
    return HookEventData(
        payload=payload,
        tool_name=str(fields.get("tool_name") or ""),
        tool_input=dict(fields.get("tool_input") or {}),
        depth=depth,
        tenant=tenant,
    )


def _current_identity(ctx: PipelineContext | None) -> InvocationIdentity | None:
    if not activity.in_activity():
        return None
    info = activity.info()
    return InvocationIdentity(
        workflow_id=info.workflow_id or "",
        run_id=info.workflow_run_id or "",
        activity_id=info.activity_id,
        request_id=ctx.request_id if ctx else None,
    )


async def dispatch(
    spec: DeclaredSpec,
    runtime: DeclaredHookRuntime,
    event: HookEventData,
    *,
    state: dict[str, Any],
    identity: InvocationIdentity | None,
    audit: bool = True,
    time_left: float | None = None,
) -> DispatchResult:
    """Run one declared hook for one event: edition, breaker, matcher, CEL, the handler under its timeout
    (capped by ``time_left``, what its chain has left for the handler: a handler stopped by the cap times
    out with ``chain_budget_exhausted``), then the audit row (and breaker move) unless ``audit`` is off
    (dry runs) or there is no identity. What a non-blocking hook answered is listed as ignored
    (``metadata.ignored``): nothing it returns is applied."""
    started = time.monotonic()
    blocking = spec.event.blocking
    metadata: dict[str, Any] = {}
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        metadata["trace_id"] = format(span_context.trace_id, "032x")
    tracer = trace.get_tracer("agent_lifecycle")
    with tracer.start_as_current_span(
        f"hook.{spec.handler_type}.{spec.event.value}",
        attributes={"hook.id": spec.id, "hook.version": spec.version, "hook.event": spec.event.value},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        turn_key = f"{identity.workflow_id}/{identity.run_id}" if identity is not None else None
        result = await _decide(spec, runtime, event, state, metadata, blocking, turn_key, time_left)
        result.duration_ms = (time.monotonic() - started) * 1000.0
        result.metadata = {**metadata, **result.metadata}
        if not blocking and ignored_answers(result):
            result.metadata["ignored"] = list(ignored_answers(result))
        if audit and identity is not None:
            result.tripped = await _audit(spec, runtime, event, identity, result)
        span.set_attributes(
            {
                "status": "error" if result.status != "completed" else "completed",
                "duration_ms": result.duration_ms,
                "decision": result.decision if result.status != "timeout" else "timeout",
                "metadata.decision": result.decision,
                "hook.reason": result.reason,
                "hook.outcome": result.status,
            }
        )
    return result


async def _decide(
    spec: DeclaredSpec,
    runtime: DeclaredHookRuntime,
    event: HookEventData,
    state: dict[str, Any],
    metadata: dict[str, Any],
    blocking: bool,
    turn_key: str | None,
    time_left: float | None,
) -> DispatchResult:
    def failed(
        status: Literal["error", "timeout"],
        message: str,
        extra: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> DispatchResult:
        if status == "timeout":
            decision = spec.timeout_decision
        else:
            decision = "block" if blocking else "allow"
        reason = reason or (REASON_TIMEOUT if status == "timeout" else REASON_HOOK_ERROR)
        return DispatchResult(decision, reason, status, 0.0, metadata=dict(extra or {}), error=message)

    refused = edition_problem(spec.handler_type, runtime.edition)
    if refused is not None:  # a hook the loader would have refused reached dispatch: it never runs
        metadata["edition"] = runtime.edition
        return DispatchResult(
            "block" if blocking else "skip", REASON_EDITION, "error", 0.0, error=f"hook {spec.id!r}: {refused}"
        )
    try:
        hook_state = await asyncio.to_thread(runtime.store.state, spec.id)
    except Exception as err:  # noqa: BLE001 - the store cannot say whether the hook is enabled: fail closed
        logger.warning("security.hook.resolve_error hook=%s: %s", spec.id, err)
        return failed("error", f"hook state unavailable: {err}")
    if not hook_state.enabled:
        return DispatchResult(
            "block" if blocking else "skip", REASON_CIRCUIT_OPEN, "completed", 0.0, metadata={"circuit_open": True}
        )
    if spec.compiled_matcher is not None:
        matched = spec.compiled_matcher.search(event.tool_name) is not None
        metadata["matcher_matched"] = matched
        if not matched:
            return DispatchResult("skip", "matcher_not_matched", "completed", 0.0)
    if spec.program is not None:
        try:
            verdict = spec.program.execute(
                {"tool_name": event.tool_name, "tool_input": event.tool_input, "depth": event.depth}
            )
        except Exception as err:  # noqa: BLE001 - any evaluation error fails closed
            metadata["cel_eval_result"] = "error"
            return failed("error", f"if_expr could not be evaluated: {type(err).__name__}: {err}")
        if not isinstance(verdict, bool):
            metadata["cel_eval_result"] = "error"
            return failed("error", f"if_expr must yield a bool, got {type(verdict).__name__}")
        metadata["cel_eval_result"] = verdict
        if not verdict:
            return DispatchResult("skip", "if_expr_false", "completed", 0.0)
    own = spec.timeout_ms / 1000.0
    capped = time_left is not None and time_left < own
    limit = max(0.0, min(own, time_left)) if time_left is not None else own
    exhausted = f"the {spec.event.value} chain's time budget ran out"
    if capped:
        metadata["chain_time_left_ms"] = round(limit * 1000.0, 1)
    if limit <= 0:
        return failed("timeout", f"{exhausted} before the handler could start", reason=REASON_CHAIN_BUDGET_EXHAUSTED)
    report: dict[str, Any] = {}  # what a command's process did, kept if it is cut off
    try:
        async with asyncio.timeout(limit):
            outcome = await _run_handler(spec, runtime, event, state, turn_key, report)
    except TimeoutError:
        if capped:
            return failed(
                "timeout", f"{exhausted} after {limit * 1000.0:.0f} ms", report, reason=REASON_CHAIN_BUDGET_EXHAUSTED
            )
        return failed("timeout", f"hook did not answer within {spec.timeout_ms} ms", report)
    except HandlerError as err:
        result = failed("error", str(err), err.metadata, reason=err.reason)
        result.output = err.output
        return result
    except Exception as err:  # noqa: BLE001 - any unhandled error: fail closed on blocking events
        return failed("error", f"{type(err).__name__}: {err}")
    return _completed(outcome)


def _completed(outcome: HandlerResult) -> DispatchResult:
    """A handler's answer as a completed invocation (its reason kept only with a block)."""
    return DispatchResult(
        outcome.decision,
        outcome.reason if outcome.decision == "block" else "",
        "completed",
        0.0,
        additional_context=outcome.additional_context,
        updated_input=outcome.updated_input,
        output=outcome.output,
        metadata=outcome.metadata,
    )


async def _run_handler(
    spec: DeclaredSpec,
    runtime: DeclaredHookRuntime,
    event: HookEventData,
    state: dict[str, Any],
    turn_key: str | None,
    report: dict[str, Any],
) -> HandlerResult:
    if isinstance(spec, CommandHook):
        return await run_command(spec.config, event.payload, environ=runtime.environ, report=report)
    if isinstance(spec, HttpHook):
        return await run_http(
            spec.config, event.payload, secrets=runtime.secrets, allow_loopback=runtime.allow_loopback
        )
    return await run_prompt(
        spec,
        event.tool_name,
        event.tool_input,
        store=runtime.store,
        secrets=runtime.secrets,
        allow_loopback=runtime.allow_loopback,
        tenant=event.tenant or GLOBAL_TENANT,
        state=state,
        cache_ttl_seconds=runtime.prompt_cache_ttl_seconds,
        turn_key=turn_key,
    )


async def _audit(
    spec: DeclaredSpec,
    runtime: DeclaredHookRuntime,
    event: HookEventData,
    identity: InvocationIdentity,
    result: DispatchResult,
) -> bool:
    row = ExecutionRow(
        dedup_key=identity.dedup_key(spec.id),
        hook_id=spec.id,
        hook_label=spec.id,
        hook_version=spec.version,
        event=spec.event.value,
        handler_type=spec.handler_type,
        decision=result.decision,
        reason=result.reason,
        status=result.status,
        duration_ms=result.duration_ms,
        tenant_id=event.tenant,
        workflow_id=identity.workflow_id,
        run_id=identity.run_id,
        activity_id=identity.activity_id,
        request_id=identity.request_id,
        error=result.error,
        metadata=result.metadata,
    )
    # A refused edition, or a request whose model token budget cannot hold the call, says nothing about
    # the hook's endpoint: the breaker stays as it is.
    counts = (
        None
        if result.reason in (REASON_EDITION, REASON_TOKEN_BUDGET_EXCEEDED)
        else result.decision == "block" or result.status == "timeout"
    )
    try:
        return await asyncio.to_thread(runtime.store.record_execution, row, counts_as_block=counts)
    except Exception as err:
        # The activity fails and is retried; the dedup key keeps the retry from writing a second row.
        logger.warning("security.hook.audit_write_failed hook=%s: %s", spec.id, err)
        raise


def ignored_answers(result: DispatchResult) -> dict[str, Any]:
    """What a hook answered that would change the request, for an event whose answers are never applied."""
    ignored: dict[str, Any] = {}
    if result.decision == "block" and result.status == "completed":
        ignored["decision"] = "block"
    if result.additional_context:
        ignored["additionalContext"] = result.additional_context
    if result.updated_input is not None:
        ignored["updatedInput"] = result.updated_input
    return ignored


def _chain_time_left() -> float | None:
    """What this activity's chain has left for a handler: its deadline (the schedule-to-close timeout the
    workflow gave it, which spans every retry) less the time kept back for the audit row. None outside an
    activity, or for one the workflow gave no deadline (an execution recorded before chain budgets)."""
    if not activity.in_activity():
        return None
    info = activity.info()
    if not info.schedule_to_close_timeout:
        return None
    deadline = info.scheduled_time + info.schedule_to_close_timeout
    return (deadline - datetime.now(UTC)).total_seconds() - CHAIN_RESERVE_SECONDS


# --------------------------------------------------------------------------------------------------
# Adapters: a declared hook as a PipelineHook of the stage its event maps onto
# --------------------------------------------------------------------------------------------------


class DeclaredHook(PipelineHook):
    """A declared hook in the registry. ``name`` is its id; priority and scope come from the file. A hook
    of a blocking event belongs to its event's chain: the workflow gives the chain its time budget."""

    def __init__(self, spec: DeclaredSpec, runtime: DeclaredHookRuntime) -> None:
        self.spec = spec
        self.runtime = runtime
        self.name = spec.id
        self.priority = spec.priority
        self.scope = spec.scope
        self.tenant_id = spec.tenant_id
        self.agent_id = spec.agent_id
        # The workflow applies these before scheduling a tool-stage invocation, so a step the hook does
        # not apply to costs no activity and writes no audit row (CEL is evaluated in the activity).
        self.matcher = spec.matcher if spec.event.tool_event else None
        self.subagent_only = spec.event in (HookEvent.SUBAGENT_START, HookEvent.SUBAGENT_STOP)
        self.timeout_seconds = spec.timeout_ms / 1000.0 + ACTIVITY_MARGIN_SECONDS
        self.max_attempts = 3
        # A subprocess, an HTTP call or a model: its own heartbeated task, not the workflow's.
        self.run_mode = RunMode.ACTIVITY
        self.calls_service = True
        self.shadow_safe = spec.shadow_safe or isinstance(spec, PromptHook)
        self.chain = (
            HookChain(
                event=spec.event.value,
                budget_seconds=runtime.chain_budget_seconds,
                on_exhausted=spec.timeout_decision,
            )
            if spec.event.blocking
            else None
        )

    async def fire(self, ctx: PipelineContext, **fields: Any) -> DispatchResult:
        if ctx.shadow:
            return await self._shadow_fire(ctx, fields)
        return await dispatch(
            self.spec,
            self.runtime,
            event_data(self.spec, ctx, **fields),
            state=ctx.state,
            identity=_current_identity(ctx),
            time_left=_chain_time_left(),
        )

    async def _shadow_fire(self, ctx: PipelineContext, fields: dict[str, Any]) -> DispatchResult:
        """The hook in a policy replay: no audit row, no breaker move, no turn counted, no budget spent. A
        prompt hook answers only from its cached decisions; any other handler runs only if the file marks
        it ``shadow_safe``."""
        event = event_data(self.spec, ctx, **fields)
        if isinstance(self.spec, PromptHook):
            if self.spec.program is not None:
                try:
                    applies = self.spec.program.execute(
                        {"tool_name": event.tool_name, "tool_input": event.tool_input, "depth": event.depth}
                    )
                except Exception as err:  # noqa: BLE001 - as at dispatch: an evaluation error fails closed
                    applies = f"if_expr could not be evaluated: {err}"
                if applies is False:
                    return DispatchResult("skip", "if_expr_false", "completed", 0.0)
                if applies is not True:
                    return DispatchResult("block", REASON_HOOK_ERROR, "error", 0.0, error=str(applies))
            key = prompt_cache_key(self.spec.id, self.spec.version, event.tool_name, event.tool_input)
            cached = await asyncio.to_thread(self.runtime.store.cached_decision, key)
            if cached is None:
                raise NotReplayed("prompt hook with no cached decision for this call (a replay never asks its model)")
            outcome = decide_result(DecideArguments.model_validate(cached), metadata={"cache_hit": True})
            return _completed(outcome)
        if not self.spec.shadow_safe:
            raise NotReplayed(f"{self.spec.handler_type} hook not marked shadow_safe")
        return await dispatch(self.spec, self.runtime, event, state=dict(ctx.state), identity=None, audit=False)

    def block_message(self, result: DispatchResult) -> str:
        return f"blocked by hook {self.spec.id}: {result.reason or 'blocked'}"


class _PromptSubmit(DeclaredHook):
    """user_prompt_submit: may block (stop the run) or rewrite the ask."""

    async def before_run(self, ctx: PipelineContext, run: RunView) -> RunPatch | Stop | None:
        result = await self.fire(ctx, prompt=run.ask)
        if result.decision == "block":
            return Stop(text=self.block_message(result), reason=result.reason or "blocked")
        updated = (result.updated_input or {}).get("prompt")
        if isinstance(updated, str) and updated.strip():
            return RunPatch(ask=updated)
        return None


class _BeforeTool(DeclaredHook):
    """pre_tool_use (every step) and subagent_start (sub-agent steps only)."""

    async def before_tool(self, ctx: PipelineContext, call: ToolCall) -> ToolDecision | None:
        if self.spec.event is HookEvent.SUBAGENT_START and not call.subagent:
            return None
        result = await self.fire(
            ctx, tool_name=call.tool, tool_input=call.arguments, step_id=call.step_id, subagent=call.subagent
        )
        if result.decision == "block":
            return ToolDecision.deny(self.block_message(result), reason=result.reason or "blocked")
        if result.updated_input is not None:
            return ToolDecision.modify(result.updated_input, reason=f"updatedInput from {self.spec.id}")
        return None


class _Observer(DeclaredHook):
    """A hook of a non-blocking event: its stage's activity hands the event to a detached effect and
    returns at once, changing nothing; the effect's child runs the handler while the request goes on.
    Nothing about it may fail the request: it fails open (on_finish, a finalizer, never fails one)."""

    def observe(self, ctx: PipelineContext, **fields: Any) -> None:
        event = event_data(self.spec, ctx, **fields)
        # One effect per hook and occurrence: once per run, or once per step for a tool event.
        step_id = fields.get("step_id")
        effect_id = f"hook.{self.spec.id}.{self.spec.event.value}" + (f".{step_id}" if step_id else "")
        ctx.detach(
            effect_id,
            name=f"{self.spec.event.value} · {self.spec.id}",
            payload=event.payload,
            data={"event": self.spec.event.value, "handler_type": self.spec.handler_type},
            summary="observing",
        )

    async def run_detached(self, work: DetachedContext) -> DetachedWorkResult:
        """Run the handler for the event handed off, and report what it decided (and what was ignored).
        A handler that failed or timed out fails the effect (not retried: the audit row has its verdict)."""
        payload = dict(work.payload) if isinstance(work.payload, dict) else {}
        tenant = payload.get("tenant_id")
        event = HookEventData(
            payload=payload,
            tool_name=str(payload.get("tool_name") or ""),
            tool_input=dict(payload.get("tool_input") or {}),
            depth=int(payload.get("depth") or 0),
            tenant=tenant if isinstance(tenant, str) else None,
        )
        identity = InvocationIdentity(
            workflow_id=work.workflow_id,
            run_id=work.run_id,
            activity_id=f"effect/{work.effect_id}",
            request_id=work.request_id,
        )
        result = await dispatch(
            self.spec,
            self.runtime,
            event,
            state={},
            identity=identity,
            time_left=self.runtime.chain_budget_seconds,
        )
        if result.status != "completed":
            raise ApplicationError(
                f"{result.status} ({result.reason}): {result.error or 'no detail'}",
                {"decision": result.decision, "reason": result.reason, "status": result.status},
                type="DeclaredHookFailed",
                non_retryable=True,
            )
        data = {
            "event": self.spec.event.value,
            "handler_type": self.spec.handler_type,
            "decision": result.decision,
            "reason": result.reason,
            "status": result.status,
            "duration_ms": round(result.duration_ms, 1),
            "ignored": ignored_answers(result),
        }
        ignored = ", ".join(data["ignored"]) or "nothing"
        return DetachedWorkResult(data=data, summary=f"{result.decision}; ignored: {ignored}")


class _SessionStart(_Observer):
    """session_start: observe the run's start (its ask)."""

    failure_policy = FailurePolicy.FAIL_OPEN

    async def before_run(self, ctx: PipelineContext, run: RunView) -> None:
        self.observe(ctx, prompt=run.ask)


class _AfterTool(_Observer):
    """post_tool_use (every step) and subagent_stop (sub-agent steps only): observe the outcome."""

    failure_policy = FailurePolicy.FAIL_OPEN

    async def after_tool(self, ctx: PipelineContext, call: ToolCall, outcome: ToolOutcomeView) -> None:
        if self.spec.event is HookEvent.SUBAGENT_STOP and not call.subagent:
            return
        self.observe(
            ctx,
            step_id=call.step_id,
            tool_name=call.tool,
            tool_input=call.arguments,
            subagent=call.subagent,
            status=outcome.status,
            tool_result=outcome.result,
        )


class _OnFinish(_Observer):
    """stop: observe how the run ended."""

    async def on_finish(self, ctx: PipelineContext, outcome: RunOutcomeView) -> None:
        self.observe(ctx, status=outcome.status, response=outcome.response)


_ADAPTERS: dict[HookEvent, type[DeclaredHook]] = {
    HookEvent.SESSION_START: _SessionStart,
    HookEvent.USER_PROMPT_SUBMIT: _PromptSubmit,
    HookEvent.PRE_TOOL_USE: _BeforeTool,
    HookEvent.SUBAGENT_START: _BeforeTool,
    HookEvent.POST_TOOL_USE: _AfterTool,
    HookEvent.SUBAGENT_STOP: _AfterTool,
    HookEvent.STOP: _OnFinish,
}


def check_command(spec: DeclaredSpec, runtime: DeclaredHookRuntime, *, who: str, index: int | None = None) -> None:
    """Refuse a command hook whose command cannot start (a missing executable, script or cwd:
    ``invalid_declared_hook``) or is a file others could change (``untrusted_hook_file``, with the fix),
    before it is ever run — the check each run repeats (``startable_argv``)."""
    if not isinstance(spec, CommandHook):
        return
    try:
        startable_argv(spec.config, command_environment(spec.config, runtime.environ))
    except HandlerError as err:
        untrusted = err.reason == REASON_UNTRUSTED_COMMAND
        raise DeclaredHookConfigError(
            f"{who}: field config.command: {err}",
            index=index,
            hook=spec.id,
            field="config.command",
            reason=REASON_UNTRUSTED if untrusted else REASON_INVALID,
        ) from None


def declared_hook(spec: DeclaredSpec, runtime: DeclaredHookRuntime) -> DeclaredHook:
    """The pipeline hook for one declared hook (its stage is fixed by its event); a handler the runtime's
    edition does not allow, or a command that cannot start or others could change, raises
    ``DeclaredHookConfigError``."""
    check_edition([spec], runtime.edition, source=f"declared hook {spec.id!r}")
    check_command(spec, runtime, who=f"declared hook {spec.id!r}")
    return _ADAPTERS[spec.event](spec, runtime)


def declared_hooks(
    specs: list[DeclaredSpec], runtime: DeclaredHookRuntime, *, source: str = "declared hooks"
) -> list[DeclaredHook]:
    """Pipeline hooks for the enabled specs, each registered in the store (new ones start enabled; a
    tripped one stays tripped until an operator re-enables it). A handler the runtime's edition does not
    allow — enabled or not — raises ``DeclaredHookConfigError`` naming the entry, the hook and the edition;
    so does an enabled command hook whose command cannot start or is a file others could change."""
    check_edition(specs, runtime.edition, source=source)
    enabled = [(index, spec) for index, spec in enumerate(specs) if spec.enabled]
    for index, spec in enabled:
        check_command(spec, runtime, who=f"{source}: entry {index} ({spec.id!r})", index=index)
    hooks = []
    for _, spec in enabled:
        runtime.store.register(spec)
        hooks.append(_ADAPTERS[spec.event](spec, runtime))
    return hooks


def load_declared_hooks(path: str | Path, runtime: DeclaredHookRuntime) -> list[DeclaredHook]:
    """Read, validate and register a declared-hooks file; raises ``DeclaredHookConfigError``."""
    return declared_hooks(load_hooks_file(path), runtime, source=str(path))


async def dry_run(spec: DeclaredSpec, runtime: DeclaredHookRuntime, sample: Mapping[str, Any]) -> DispatchResult:
    """Fire one hook with a sample event and write no audit row (what an operator runs to test a hook)."""
    fields = {k: v for k, v in sample.items() if k not in ("event", "hook_id", "metadata")}
    given = sample.get("metadata")
    metadata: dict[str, Any] = dict(given) if isinstance(given, dict) else {}
    for key in ("tenant_id", "agent_id"):
        if key in sample and key not in metadata:
            metadata = {**metadata, key: sample[key]}
    if "depth" in sample and METADATA_SUBAGENT_DEPTH not in metadata:
        metadata = {**metadata, METADATA_SUBAGENT_DEPTH: sample["depth"]}
    fields.pop("tenant_id", None)
    fields.pop("agent_id", None)
    fields.pop("depth", None)
    event = event_data(spec, None, **fields)
    tenant = metadata.get("tenant_id")
    event.tenant = tenant if isinstance(tenant, str) else None
    event.depth = subagent_depth(metadata)
    event.payload.update(tenant_id=event.tenant, agent_id=metadata.get("agent_id"), depth=event.depth)
    return await dispatch(spec, runtime, event, state={}, identity=None, audit=False)
