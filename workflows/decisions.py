"""The names of decisions (error types, failure categories, reasons) and the cache gate, as pure functions.

What a hook outcome means at each stage is decided by the stage (``workflows.stages``: ``StageSpec.success``
and ``StageSpec.failure``), which both the hook activities (for span attributes and metrics) and the
workflow (for the execution record) call, so the trace and the record can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from .models import METADATA_CACHE, DecisionAction, FailurePolicy, GateState, HookDecision, ShortCircuitProposal

# Stable error type names. Anything that ends a request is an ApplicationError with one of these.
INVALID_REQUEST = "InvalidRequest"
REQUIRED_AFTER_PLANNING_ERROR = "RequiredAfterPlanningError"
HOOK_CONTRACT_ERROR = "HookContractError"
PLANNING_FAILED = "PlanningFailed"
SYNTHESIS_FAILED = "SynthesisFailed"
PIPELINE_UNAVAILABLE = "PipelineUnavailable"
EXTENSION_ERROR = "ExtensionError"
WORKER_LOST = "WorkerLost"  # infrastructure: workers kept dying under one activity
PAYLOAD_TOO_LARGE = "PayloadTooLarge"  # a value the request would send exceeds what Temporal (or the store) carries
# Infrastructure: the execution store refused the record's snapshot at a boundary (or stayed unavailable for
# every attempt): the request never goes on, or ends as succeeded, without its record.
RECORD_NOT_STORED = "RecordNotStored"
REQUEST_ID_CONFLICT = "RequestIdConflict"
# A model's failure ends a planning or synthesis request under its own name: the request fails with it.
MODEL_UNAVAILABLE = "ModelUnavailable"  # 429, 408, 409, 5xx, timeouts: retried, then this
MODEL_REQUEST_ERROR = "ModelRequestError"  # 400, 401, 403, 404, 422...: the provider refused the request
MODEL_REFUSAL = "ModelRefusal"  # the model declined to answer (a refusal, a content filter)
EMPTY_COMPLETION = "EmptyCompletion"  # neither content nor tool calls
TOKEN_BUDGET_EXCEEDED = "TokenBudgetExceeded"  # the request's model token budget is spent
PROMPT_BUDGET_EXCEEDED = "PromptBudgetExceeded"  # the prompt would not fit the model's window: never sent
MODEL_FAILURES = frozenset(
    {
        MODEL_UNAVAILABLE,
        MODEL_REQUEST_ERROR,
        MODEL_REFUSAL,
        EMPTY_COMPLETION,
        TOKEN_BUDGET_EXCEEDED,
        PROMPT_BUDGET_EXCEEDED,
    }
)
FALLBACK_FAILED = "FallbackFailed"  # the fallback model failed too, after the primary had

# Failure categories a hook activity reports (ApplicationError.type of the activity failure).
HOOK_ERROR = "HookError"  # the hook raised
HOOK_PANIC = "HookPanic"  # the hook raised what is not an ordinary error (a BaseException): it stops the request
INVALID_HOOK_RESULT = "InvalidHookResult"  # the hook returned the wrong type or an oversized value
INVALID_PLAN = "InvalidPlan"  # an after_planning mutation failed plan validation
HOOK_TIMEOUT = "HookTimeout"  # the invocation did not finish within its timeout
CHAIN_BUDGET_EXHAUSTED = "ChainBudgetExhausted"  # its chain's time budget ran out before or while it ran

# Decision reasons.
REASON_ACCEPTED = "accepted"
REASON_HOOK_ERROR = "hook_error"
REASON_PANIC = "panic"
REASON_HOOK_TIMEOUT = "hook_timeout"
REASON_INVALID_RESULT = "invalid_result"
REASON_INVALID_PLAN = "invalid_plan"
REASON_CONTRACT_ERROR = "contract_error"
REASON_AUTHORITATIVE = "authoritative"
REASON_CACHE_MATCH = "cache_match"
REASON_CACHE_MISMATCH = "cache_dimension_mismatch"
REASON_CACHE_READ_DISABLED = "cache_read_disabled"
REASON_ALLOWED = "allowed"
REASON_MODIFIED = "modified"
REASON_DENIED = "policy"
REASON_STOPPED = "stopped"
REASON_REWRITTEN = "rewritten"
REASON_HANDLED = "handled"
REASON_MEMORY_SKIPPED = "memory_skipped"
REASON_MEMORY_REPLACED = "memory_replaced"
REASON_OBSERVED = "observed"
REASON_WORKER_LOST = "worker_lost"
REASON_PAYLOAD_TOO_LARGE = "payload_too_large"
REASON_CHAIN_BUDGET_EXHAUSTED = "chain_budget_exhausted"

_FAILURE_REASONS = {
    HOOK_ERROR: REASON_HOOK_ERROR,
    HOOK_PANIC: REASON_PANIC,
    HOOK_TIMEOUT: REASON_HOOK_TIMEOUT,
    INVALID_HOOK_RESULT: REASON_INVALID_RESULT,
    INVALID_PLAN: REASON_INVALID_PLAN,
    HOOK_CONTRACT_ERROR: REASON_CONTRACT_ERROR,
    WORKER_LOST: REASON_WORKER_LOST,
    PAYLOAD_TOO_LARGE: REASON_PAYLOAD_TOO_LARGE,
}


def failure_reason(category: str) -> str:
    """The decision reason for a failed invocation of ``category`` (``hook_error`` for any other)."""
    return _FAILURE_REASONS.get(category, REASON_HOOK_ERROR)


def gate_for_request(
    metadata: Mapping[str, JsonValue],
    cache_variation: Mapping[str, str],
    reserved_metadata_dimensions: list[str],
) -> GateState:
    """The gate of one request: pipeline-owned dimensions plus reserved request-metadata dimensions.

    A reserved metadata dimension the request does not carry is absent from the variation map, so a
    cache entry written with a value for it will not match (a value on one side only is a mismatch).
    """
    variation = dict(cache_variation)
    for dimension in reserved_metadata_dimensions:
        value = metadata.get(dimension)
        if value is not None:
            variation[dimension] = value if isinstance(value, str) else str(value)
    reserved = sorted(set(cache_variation) | set(reserved_metadata_dimensions))
    read_enabled = metadata.get(METADATA_CACHE) != "bypass"
    return GateState(cache_read_enabled=read_enabled, variation=variation, reserved_dimensions=reserved)


def variation_mismatches(gate: GateState, cached_against: Mapping[str, str]) -> list[str]:
    """Reserved dimensions whose cached value differs from the current one, symmetrically."""
    mismatched = []
    for dimension in gate.reserved_dimensions:
        in_cache, in_gate = dimension in cached_against, dimension in gate.variation
        if in_cache != in_gate or (in_cache and cached_against[dimension] != gate.variation[dimension]):
            mismatched.append(dimension)
    return mismatched


def short_circuit_decision(proposal: ShortCircuitProposal, gate: GateState) -> HookDecision:
    """Judge a validated short-circuit proposal against the request's cache gate."""
    if proposal.kind == "authoritative":
        return HookDecision(
            failure_policy=FailurePolicy.FAIL_OPEN,
            action=DecisionAction.SHORT_CIRCUIT,
            reason=REASON_AUTHORITATIVE,
        )
    if not gate.cache_read_enabled:
        return HookDecision(
            failure_policy=FailurePolicy.FAIL_CLOSED,
            action=DecisionAction.CONTINUE,
            reason=REASON_CACHE_READ_DISABLED,
        )
    if variation_mismatches(gate, proposal.cached_against):
        return HookDecision(
            failure_policy=FailurePolicy.FAIL_CLOSED,
            action=DecisionAction.CONTINUE,
            reason=REASON_CACHE_MISMATCH,
        )
    return HookDecision(
        failure_policy=FailurePolicy.FAIL_CLOSED, action=DecisionAction.SHORT_CIRCUIT, reason=REASON_CACHE_MATCH
    )
