"""Deterministic helpers of ``RequestLifecycle``: decoding what arrives from outside, hook-failure
classification, idempotency keys, metadata promotion, approval reasons. Pure functions over the shared
models, importable anywhere."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from pydantic import BaseModel, JsonValue, ValidationError
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TimeoutError

from . import decisions
from .models import (
    ENRICHMENT_CONVERSATION_HISTORY,
    ENRICHMENT_RAG_CONTEXT,
    METADATA_CONVERSATION_TURNS,
    ApprovalReason,
    CacheVerdict,
    ExecutionRecord,
    HookBatchFailure,
    HookDecision,
    HookEntry,
    InvocationOutcome,
    ModelCall,
    PipelineHookEffect,
    Plan,
    StepStatus,
    ToolSpec,
    json_size,
)

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_CONVERSATION_TURNS = 20
# Hook failures that retrying cannot change.
NON_RETRYABLE_HOOK_FAILURES = [
    decisions.HOOK_CONTRACT_ERROR,
    decisions.HOOK_PANIC,
    decisions.INVALID_HOOK_RESULT,
    decisions.INVALID_PLAN,
]
# A hook's attempts are spaced by this, doubling each time (Temporal's default backoff).
HOOK_RETRY_INITIAL_INTERVAL = timedelta(milliseconds=200)
HOOK_RETRY_BACKOFF = 2.0
# A batch's failure reason for a hook that ran out of time.
BATCH_TIMEOUT = "timeout"
# Failures that are not the hook's doing: recorded on the invocation, then they end the request as they are.
INFRASTRUCTURE_FAILURES = (decisions.WORKER_LOST, decisions.PAYLOAD_TOO_LARGE)
# A step's metadata key by which an after_planning hook asks for a reviewer: True or the reason text.
APPROVAL_METADATA_KEY = "approval_required"
# The reason of a step whose tool is approval-required (its own policy, not a hook's mark).
TOOL_POLICY_REASON = "tool requires approval"


class InvocationFailure(BaseModel):
    """Why a hook invocation did not produce an outcome, and the effects it had announced."""

    category: str
    message: str
    exception_type: str | None = None
    effects: list[PipelineHookEffect] = []
    model_calls: list[ModelCall] = []  # the model calls it made before it failed (they count all the same)
    decision: HookDecision | None = None  # what the stage's failure policy made of it

    @classmethod
    def from_error(cls, err: FailureError, hook: HookEntry) -> InvocationFailure:
        # A regular activity's failure arrives wrapped in ActivityError; a local activity's arrives bare.
        cause = err.cause if isinstance(err, ActivityError) else err
        if isinstance(cause, TimeoutError):
            kind = cause.type.name.lower() if cause.type is not None else "timeout"
            return cls(
                category=decisions.HOOK_TIMEOUT,
                message=f"hook did not finish within {hook.timeout_seconds:g}s ({kind})",
            )
        if isinstance(cause, ApplicationError):
            details = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
            return cls._raised(cause.type, cause.message, details)
        return cls(category=decisions.HOOK_ERROR, message=str(cause or err))

    @classmethod
    def from_batch(cls, failure: HookBatchFailure, hook: HookEntry) -> InvocationFailure:
        """The same failure, for a hook that ran in a batch (see ``HookBatchFailure``)."""
        if failure.type == BATCH_TIMEOUT:
            return cls(
                category=decisions.HOOK_TIMEOUT,
                message=f"hook did not finish within {hook.timeout_seconds:g}s (start_to_close)",
            )
        return cls._raised(failure.type, failure.message, failure.details)

    @classmethod
    def _raised(cls, error_type: str | None, message: str, details: Mapping[str, Any]) -> InvocationFailure:
        known = {decisions.HOOK_ERROR, *INFRASTRUCTURE_FAILURES, *NON_RETRYABLE_HOOK_FAILURES}
        effects = details.get("effects") or []
        calls = details.get("model_calls") or []
        return cls(
            category=error_type if error_type in known else decisions.HOOK_ERROR,
            message=message,
            exception_type=details.get("exception_type"),
            effects=[PipelineHookEffect.model_validate(e) for e in effects] if isinstance(effects, list) else [],
            model_calls=model_calls_in(calls),
        )


def model_calls_in(reported: Any) -> list[ModelCall]:
    """The model calls an activity reported in its error details (a list of dumped ``ModelCall``s);
    anything else in it is not a call this framework wrote, and is left out."""
    calls = []
    for call in reported if isinstance(reported, list) else []:
        try:
            calls.append(ModelCall.model_validate(call))
        except ValidationError:
            pass
    return calls


def hook_retry_delay(attempt: int) -> float:
    """Seconds before a hook's attempt ``attempt + 1``."""
    return HOOK_RETRY_INITIAL_INTERVAL.total_seconds() * HOOK_RETRY_BACKOFF ** (attempt - 1)


def stage_failure(error_type: str, message: str, err: ActivityError) -> ApplicationError:
    """The request-ending error for a failed framework activity (planning, synthesis, ...)."""
    cause = err.cause
    cause_message = getattr(cause, "message", None) or str(cause or err)
    cause_type = getattr(cause, "type", None) or type(cause).__name__
    details: dict[str, Any] = {"cause": cause_message, "cause_type": cause_type}
    if cause_type in decisions.MODEL_FAILURES:
        # A model's failure names the request's: ModelRequestError with the provider's status and message.
        error_type = cause_type
        reported = activity_error_details(err)
        details |= {key: reported[key] for key in ("status", "message", "model") if key in reported}
    return ApplicationError(f"{message}: {cause_message}", details, type=error_type, non_retryable=True)


def activity_error_details(err: ActivityError) -> dict[str, Any]:
    """The first details value of the application error an activity failed with, when it is a dict."""
    return error_details(err.cause)


def error_details(err: BaseException | None) -> dict[str, Any]:
    """The first details value of an application error, when it is a dict."""
    details = err.details if isinstance(err, ApplicationError) else ()
    return details[0] if details and isinstance(details[0], dict) else {}


def idempotency_key(workflow_id: str, run_id: str, step_id: str, arguments: Mapping[str, JsonValue]) -> str:
    """The key a tool receives for a step: the same for every retry of the call and after any worker
    restart, different for anything else — another run under the same workflow id (``run_id`` is the
    first run of the chain, stable across continue-as-new) or the same step with other arguments."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    digest = hashlib.sha256("\x00".join((workflow_id, run_id, step_id, canonical)).encode()).hexdigest()[:32]
    return f"{step_id}-{digest}"


def payload_bytes(value: Any) -> int:
    """Bytes of ``value`` as the data converter sends it (compact JSON; pydantic models as they dump)."""
    if isinstance(value, BaseModel):
        return len(value.model_dump_json().encode())
    return json_size(value)


def single_payload(args: Sequence[Any], *, max_bytes: int | None = None) -> tuple[Any, str | None]:
    """The one JSON value a signal, update or workflow input carried, or why it is unusable: none or
    several payloads, another encoding than JSON, more than ``max_bytes`` of JSON."""
    if len(args) != 1:
        return None, f"expected one JSON payload, got {len(args)}"
    value = args[0]
    if isinstance(value, RawValue):
        encoding = value.payload.metadata.get("encoding", b"").decode(errors="replace") or "(none)"
        if encoding == "json/plain":
            return None, "payload is not valid JSON"
        return None, f"payload encoding {encoding!r} is not JSON"
    if isinstance(value, (bytes, bytearray)):
        return None, "payload is binary data, not JSON"
    if max_bytes is not None:
        size = json_size(value)
        if size > max_bytes:
            return None, f"payload is {size} bytes of JSON; the limit is {max_bytes}"
    return value, None


def decode_payload(
    model: type[ModelT], args: Sequence[Any], *, max_bytes: int | None = None
) -> tuple[ModelT | None, str | None]:
    """``args`` as one ``model``, or why not (never raises: what arrives from outside cannot fail a
    workflow task)."""
    value, problem = single_payload(args, max_bytes=max_bytes)
    if problem is not None:
        return None, problem
    try:
        return model.model_validate(value), None
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in err.errors(include_url=False)[:3]
        )
        return None, f"invalid {model.__name__}: {problems}"


def promote_metadata(metadata: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Lift ``rag_context`` and conversation history (a string, or ``conversation_turns``) out of request
    metadata into enrichments, before any hook runs: context the caller already holds needs no hook."""
    promoted: dict[str, JsonValue] = {}
    rag = metadata.get(ENRICHMENT_RAG_CONTEXT)
    if isinstance(rag, str) and rag.strip():
        promoted[ENRICHMENT_RAG_CONTEXT] = rag
    history = metadata.get(ENRICHMENT_CONVERSATION_HISTORY)
    turns = metadata.get(METADATA_CONVERSATION_TURNS)
    if isinstance(history, str) and history.strip():
        promoted[ENRICHMENT_CONVERSATION_HISTORY] = history
    elif isinstance(turns, list) and turns:
        lines = []
        for turn in turns[-MAX_CONVERSATION_TURNS:]:
            if isinstance(turn, dict) and isinstance(turn.get("content"), str):
                role = turn.get("role")
                lines.append(f"{role if isinstance(role, str) and role.strip() else 'user'}: {turn['content']}")
        if lines:
            promoted[ENRICHMENT_CONVERSATION_HISTORY] = "\n".join(lines)
    return promoted


def approval_reasons(plan: Plan, tools: list[ToolSpec]) -> list[ApprovalReason]:
    """Why each step of ``plan`` needs a reviewer: its tool is approval-required, or a hook marked it."""
    catalog = {tool.key: tool for tool in tools}
    reasons = []
    for step in plan.steps:
        tool = catalog.get(step.tool_key)
        if tool is not None and tool.approval_required:
            reasons.append(ApprovalReason(step_id=step.step_id, tool=step.tool, reason=TOOL_POLICY_REASON))
        marked = step.metadata.get(APPROVAL_METADATA_KEY)
        if marked:
            reason = marked if isinstance(marked, str) else "marked for approval by an after_planning hook"
            reasons.append(ApprovalReason(step_id=step.step_id, tool=step.tool, reason=reason))
    return reasons


def cache_verdict(
    record: ExecutionRecord, tools: list[ToolSpec], outcome: str, synthesized: str | None
) -> CacheVerdict:
    """Whether a response cache may store a run's answer (``synthesized``: after after_synthesis). Only a
    completed run that did nothing but read — its executed steps all succeeded and call ``read_only``
    tools — with no checkpoint, no stop, no phase cap and every hook invocation succeeded, not itself a
    short-circuit: a cached answer never stands in for a side effect or for a protection that did not run."""
    reasons = []
    if outcome != "completed":
        reasons.append(f"the run {'was ' if outcome in ('stopped', 'cancelled') else 'ended in '}{outcome}")
    if record.short_circuit is not None:
        reasons.append(f"answered by a short-circuit ({record.short_circuit.reason})")
    if record.checkpoints:
        reasons.append("a checkpoint was opened")
    if record.phase_cap_reached:
        reasons.append("the planning phase cap was reached")
    read_only = {f"{t.agent}/{t.capability}": t.read_only for t in tools}
    keys = {f"{t.agent}/{t.capability}": t.key for t in tools}  # a reader meets a tool by its full key
    for step in record.steps:
        if step.status is not StepStatus.SUCCEEDED:
            reasons.append(f"step {step.step_id} {step.status.value}")
        elif step.recovered_from is not None:
            reasons.append(f"step {step.step_id} recovered from an error ({step.recovered_from.handled_by})")
        elif not read_only.get(step.tool, False):
            reasons.append(f"step {step.step_id} calls {keys.get(step.tool, step.tool)}, which is not read_only")
    for invocation in record.pipeline_hooks:
        if invocation.outcome is not InvocationOutcome.SUCCEEDED:
            reasons.append(f"hook {invocation.hook} {invocation.outcome.value} at {invocation.stage.value}")
    if synthesized is None:
        reasons.append("no synthesized answer")
    if reasons:
        return CacheVerdict(cacheable=False, reasons=reasons[:10])
    return CacheVerdict(cacheable=True, response=synthesized)
