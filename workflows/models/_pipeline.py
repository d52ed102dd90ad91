"""The pipeline a request runs (the manifest ``resolve_pipeline`` records), and what every hook
invocation receives and returns besides its stage's own values: the request view, decisions, effects,
detached work and managed leases."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationInfo, field_validator, model_validator

from ._common import ByReference, DecisionAction, FailurePolicy, RunMode, Stage, bounded_value
from ._model_calls import ModelCall
from ._plans import ToolCall, ToolSpec

__all__ = [
    "CHAIN_RESERVE_SECONDS",
    "MAX_CHECKPOINT_EXPIRY_SECONDS",
    "MAX_EFFECTS_PER_INVOCATION",
    "MIN_CHAIN_START_SECONDS",
    "DetachedWork",
    "EffectStatus",
    "EnrichmentChange",
    "EnrichmentOperation",
    "GateState",
    "HookBatchCall",
    "HookBatchEntry",
    "HookBatchFailure",
    "HookBatchOutcome",
    "HookBatchSegment",
    "HookCall",
    "HookChain",
    "HookDecision",
    "HookEntry",
    "HookInvocation",
    "HookOutcome",
    "HookRequestView",
    "InvocationOutcome",
    "LostAttempt",
    "ManagedLease",
    "ObserveOutcome",
    "PipelineHookEffect",
    "PipelineManifest",
    "PipelineShortCircuit",
    "PipelineShortCircuitDecision",
    "RecordedOutcome",
    "ResolvePipelineInput",
    "ReviewerKey",
    "ReviewSettings",
    "ShortCircuitKind",
    "ShortCircuitProposal",
    "SnapshotAttempt",
    "StageSettings",
    "WorkerLoss",
]

if TYPE_CHECKING:
    from ._record import AcceptedPlanWrite, TerminalWrite

# Least time a chain must have left for the workflow to start one more of its hooks: an invocation needs
# time beyond its handler's (scheduling, the audit row), and a hook given less could only time out.
MIN_CHAIN_START_SECONDS = 0.5
# Time a chained invocation keeps back from its handler for what follows it in the activity (the audit row).
CHAIN_RESERVE_SECONDS = 0.25


class HookChain(BaseModel):
    """Hooks that share a time budget at each occurrence of their event (the declared hooks of one blocking
    gateway event: one request's user_prompt_submit, one tool call's pre_tool_use). The workflow counts
    the time the chain's invocations take, gives each at most what is left (its activity's
    schedule-to-close timeout), and starts none once less than ``MIN_CHAIN_START_SECONDS`` is left: that
    hook then decides as its timeout would (``on_exhausted``), without running."""

    event: str
    budget_seconds: float = Field(gt=0)
    on_exhausted: Literal["block", "allow"] = "block"


class HookEntry(BaseModel):
    """One registered hook as the workflow knows it: recorded in history by ``resolve_pipeline``."""

    name: str
    index: int
    stages: list[Stage]
    required: bool = False
    before_planning_contract: Literal["legacy", "decision"] | None = None
    run_mode: RunMode = RunMode.ACTIVITY
    timeout_seconds: float = 10.0
    max_attempts: int = 3
    tool_matcher: str | None = None  # tool stages: a regex searched in the tool name (agent/capability)
    subagent_only: bool = False  # tool stages: sub-agent steps only
    # The hook's own failure policy where it may differ from the stage's (see ``StageSpec.own_policy``):
    # a protective hook (redaction, policy) fails closed at a stage that fails open by default.
    failure_policy: FailurePolicy | None = None
    chain: HookChain | None = None  # the chain whose time budget this hook shares (declared blocking hooks)

    def implements(self, stage: Stage) -> bool:
        return stage in self.stages

    def applies_to_tool(self, call: ToolCall) -> bool:
        """Whether a tool stage invokes this hook for ``call`` (decided in the workflow: deterministic)."""
        if self.subagent_only and not call.subagent:
            return False
        return self.tool_matcher is None or re.search(self.tool_matcher, call.tool) is not None


class StageSettings(BaseModel):
    """Timeouts and retries of the framework's own activities."""

    plan_timeout_seconds: float = 60.0
    tool_timeout_seconds: float = 30.0
    tool_max_attempts: int = 3
    synthesize_timeout_seconds: float = 60.0
    max_plan_steps: int = 32
    max_planning_phases: int = 3
    # Tokens one request may spend on model calls (planning and synthesis); None: no budget.
    max_model_tokens_per_request: int | None = Field(default=None, gt=0)
    # Whether a request may ask for its answer to be streamed while the model writes it. Streamed text is
    # the model's draft — after_synthesis cannot take back what a client already read — so a pipeline
    # whose after_synthesis hooks protect the answer turns this off (its clients then get the final answer).
    answer_streaming: bool = True
    # Whether the answer is always written by the synthesizer's own call. Off (the default), a model
    # planner's turn that answers in text instead of calling tools is the answer's draft and no synthesis
    # call is made; a synthesis call still writes the answer after a phase that ran tools as the last one
    # (the phase cap) and for planners that never answer in text (rule planners).
    dedicated_synthesis: bool = False
    max_tool_result_chars: int = 600  # the result text a model reads, after after_tool hooks
    # A worker that stops heartbeating for this long is lost: its activity is dispatched again without
    # spending the activity's own attempts (a crash is an infrastructure event, never an outcome).
    heartbeat_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    # Dispatches of one activity that may end in a lost worker before the request fails with the
    # infrastructure error ``WorkerLost`` (a hook that kills every worker it runs on must not loop forever).
    max_worker_losses: int = Field(default=5, ge=1)
    # Attempts at writing one snapshot of the execution record (spaced 1, 2, 4, ... s) before the request
    # fails with ``RecordNotStored``: a store that is down for a moment is waited for, one that stays down
    # (or refuses the write) ends the request rather than let it go on, or end, unrecorded.
    record_write_attempts: int = Field(default=5, ge=1)
    # Consecutive in-process (local activity) hooks of one stage run in one local activity: one marker
    # in history for the run of them, one record entry and span for each hook.
    batch_local_hooks: bool = True
    # Renewals of a managed lease a request that does not wait makes itself (a timer and a local activity
    # each, a few events of history) before it hands the lease to a LeaseKeeper child, whose history grows
    # instead. A request that starts to wait hands its leases over at once, whatever this says.
    lease_renewals_in_request: int = Field(default=100, ge=0)


# The longest a checkpoint may wait. A waiting request adds no history while it waits (its expiry is one
# timer, and its leases are renewed in their keepers' histories, each continued as new).
MAX_CHECKPOINT_EXPIRY_SECONDS = 365 * 24 * 3600.0


class ReviewerKey(BaseModel):
    """A public key a reviewer's decision may be signed with (a JWK's public members and its id): a
    reviewer's own key, which speaks for that reviewer only, or an issuer's, which speaks for the reviewer
    its token names. Public material only: it is recorded in the manifest, in the history."""

    kid: str = Field(min_length=1, max_length=128)
    kty: Literal["OKP", "EC", "RSA"]
    crv: str | None = None
    x: str | None = None
    y: str | None = None
    n: str | None = None
    e: str | None = None
    principal: str | None = None  # a reviewer's own key
    issuer: str | None = None  # an issuer's key

    @model_validator(mode="after")
    def _one_owner(self) -> ReviewerKey:
        if (self.principal is None) == (self.issuer is None):
            raise ValueError(f"key {self.kid!r} must belong to exactly one reviewer or one issuer")
        return self


class ReviewSettings(BaseModel):
    """Human-in-the-loop checkpoints: who may decide, how the workflow knows who decided, and how long a
    checkpoint waits.

    ``verification``: ``signed`` (a decision carries a token signed with one of ``keys``), ``server_identity``
    (the reviewer is the identity the Temporal server received the decision with), or ``none`` (a typed
    name; anyone who can reach the namespace can type any name). ``workflows.review_proof`` says what each
    proves. The requester of a request (``requested_by``, or its metadata's ``user_id``) may not approve
    its own checkpoints unless ``allow_self_approval``."""

    reviewers: list[str] = Field(default_factory=list)  # empty: any reviewer the verification accepts
    verification: Literal["none", "signed", "server_identity"] = "none"
    keys: list[ReviewerKey] = Field(default_factory=list)
    allow_self_approval: bool = False
    checkpoint_expiry_seconds: float = Field(default=24 * 3600.0, gt=0, le=MAX_CHECKPOINT_EXPIRY_SECONDS)
    # A reviewers' webhook is configured: each checkpoint that opens is announced to it by a
    # ``ReviewNotification`` child. Without one a checkpoint starts nothing.
    notify: bool = False
    # What a rejection does: ``fail`` ends the request (``CheckpointRejected``); ``tell_model`` skips the
    # checkpoint's calls, each with a result saying who rejected it and why, and the request goes on (the
    # planner reads those results and may answer).
    on_reject: Literal["fail", "tell_model"] = "fail"


class PipelineManifest(ByReference):
    """The pipeline a request runs with: hook order and stages, tools, cache variation, limits."""

    defaults_omitted = True

    pipeline: str
    hooks: list[HookEntry] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    cache_variation: dict[str, str] = Field(default_factory=dict)
    reserved_metadata_dimensions: list[str] = Field(default_factory=list)
    settings: StageSettings = Field(default_factory=StageSettings)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    memory: bool = False  # a conversation memory store is configured: completed runs are remembered
    # Whether the lifecycle search attributes are registered on the namespace (checked by the worker).
    search_attributes: bool = False
    # How long a request waits in a stage before the stage is listed (AgentLifecycleStage); its first
    # stage, a checkpoint's opening and closing, and its end are listed at once. 0 lists every stage it
    # waits in at once — what a manifest recorded without this field (an older worker's) replays with.
    stage_listing_delay_seconds: float = Field(default=0.0, ge=0)
    # Whether the worker's data converter sends large activity payloads to the payload store (by reference).
    payload_store: bool = False
    # Whether what the Temporal UI shows without a codec (summaries, details, the current details) may
    # carry excerpts of the request, tool arguments, reasons and the answer: not where payloads are
    # encrypted, unless the deployment allows it. True is what a manifest recorded without it replays with.
    ui_shows_text: bool = True
    # The request's OpenTelemetry trace, as resolve_pipeline ran in it (None without tracing).
    trace_id: str | None = None
    # The fallback model of each model stage that has one (``planning``, ``synthesis``: its name): called
    # when the primary model is unavailable after its retries.
    fallback: dict[str, str] = Field(default_factory=dict)
    # The pipeline's instructions (its system prompt): a request's own follow them, and before_run hooks
    # see both and may rewrite them. Empty is what a manifest recorded without this field replays with.
    instructions: str = ""

    def participants(self, stage: Stage) -> list[HookEntry]:
        return [h for h in self.hooks if h.implements(stage)]

    def tool_participants(self, stage: Stage, call: ToolCall) -> list[HookEntry]:
        """The hooks a tool stage invokes for ``call``: those whose matcher and sub-agent filter admit it."""
        return [h for h in self.participants(stage) if h.applies_to_tool(call)]


class ResolvePipelineInput(ByReference):
    request_id: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


class HookDecision(BaseModel):
    """What the framework did with a hook's outcome, separate from the invocation's own status."""

    failure_policy: FailurePolicy
    action: DecisionAction
    reason: str


class InvocationOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"  # the hook itself overran its timeout
    WORKER_LOST = "worker_lost"  # workers kept dying under it: an infrastructure failure, not the hook's
    NOT_STARTED = "not_started"  # its chain's time budget was spent before its turn: decided without running


class HookInvocation(BaseModel):
    """One hook invocation in the execution record."""

    hook: str
    stage: Stage
    sequence: int  # 1-based position among this stage's invocations (per plan phase, per step)
    plan_phase: int | None = None
    step_id: str | None = None  # for the tool-call stages
    started_at: datetime
    duration_ms: float
    outcome: InvocationOutcome
    error: str | None = None  # the exact failure text
    error_type: str | None = None  # HookError, HookContractError, InvalidHookResult, InvalidPlan, Timeout
    exception_type: str | None = None  # the hook's own exception class, when it raised
    decision: HookDecision | None = None
    worker_losses: int = 0  # dispatches that ended because the worker running it stopped heartbeating


class WorkerLoss(BaseModel):
    """An activity attempt that ended because its worker stopped heartbeating (crashed, was killed, lost
    its connection). Without ``attempt``: the dispatch's last attempt, and the activity was dispatched
    again. With it: an attempt the activity's own retries followed, found by the attempt after it; when
    the activity's attempts ran out all the same, it was dispatched again with as many as workers took,
    so lost workers never spend the attempts that decide an outcome."""

    activity: str
    summary: str
    at: datetime
    dispatch: int  # 1 for the first dispatch of this call (the first lost dispatch), 2 for the next, ...
    attempt: int | None = None  # the attempt within its dispatch, for a loss its retries followed
    activity_id: str | None = None  # as the Temporal UI shows it, for a loss its retries followed


class LostAttempt(BaseModel):
    """Signal ``attempt_lost``: an activity's attempt found that the one before it lost its worker (the
    server timed it out on its heartbeat), and tells the request."""

    activity: str = Field(min_length=1, max_length=200)  # the activity type
    activity_id: str = Field(min_length=1, max_length=200)
    attempt: int = Field(ge=1)  # the lost attempt


class EffectStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# Bounds on an effect's texts (see ``PipelineHookEffect``) and on the effects one invocation reports.
MAX_EFFECT_NAME_CHARS = 200
MAX_EFFECT_SUMMARY_CHARS = 2_000
MAX_EFFECT_ERROR_CHARS = 4_000
MAX_EFFECTS_PER_INVOCATION = 64
# The longest each text of an effect may be, by field.
_EFFECT_TEXT_CHARS = {
    "effect_id": MAX_EFFECT_NAME_CHARS,
    "name": MAX_EFFECT_NAME_CHARS,
    "hook": MAX_EFFECT_NAME_CHARS,
    "summary": MAX_EFFECT_SUMMARY_CHARS,
    "error": MAX_EFFECT_ERROR_CHARS,
}


class PipelineHookEffect(BaseModel):
    """A versioned record of work a hook attempted and what it observed; detached work may later bring
    the same effect from pending to a terminal state.

    Every field is bounded as it is set — texts clipped (with ``…``), ``data`` over 32 KiB of JSON kept by
    reference (``bounded_value``) — so what a hook reports can never grow the record past what Temporal
    carries: reporting an effect never changes the request's outcome."""

    effect_id: str
    schema_version: int = 1
    name: str
    status: EffectStatus
    data: JsonValue = None
    started_at: datetime | None = None
    duration_ms: float | None = None
    summary: str = ""
    error: str | None = None
    hook: str | None = None
    stage: Stage | None = None

    @field_validator(*_EFFECT_TEXT_CHARS, mode="before")
    @classmethod
    def _clipped(cls, value: Any, info: ValidationInfo) -> Any:
        return clipped(value, _EFFECT_TEXT_CHARS[str(info.field_name)])

    @field_validator("data", mode="before")
    @classmethod
    def _data(cls, value: Any) -> Any:
        return bounded_value(value)


def clipped(value: Any, limit: int) -> Any:
    """``value`` cut to ``limit`` characters (its last one ``…``) when it is a longer string."""
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 1] + "…"
    return value


class DetachedWork(BaseModel):
    """Work a hook handed off: run by a child workflow that outlives the request and brings the
    effect ``effect_id`` from pending to its terminal state."""

    effect_id: str
    hook: str
    stage: Stage
    name: str
    payload: JsonValue = None


class EnrichmentOperation(StrEnum):
    ADDED = "added"
    UPDATED = "updated"
    REMOVED = "removed"


class EnrichmentChange(BaseModel):
    key: str
    operation: EnrichmentOperation
    before: JsonValue = None
    after: JsonValue = None


class GateState(BaseModel):
    """The cache gate a request runs under: whether reads are enabled and the reserved dimensions."""

    cache_read_enabled: bool = True
    variation: dict[str, str] = Field(default_factory=dict)
    reserved_dimensions: list[str] = Field(default_factory=list)


class ShortCircuitProposal(BaseModel):
    """A validated short-circuit a before_planning hook returned, before the gate judged it."""

    contract: Literal["legacy", "decision"]
    kind: Literal["authoritative", "cache"]
    response: str
    source: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    cached_against: dict[str, str] = Field(default_factory=dict)


class ManagedLease(BaseModel):
    """A lease a hook declared with ``ctx.manage_lease``: the workflow keeps it alive, renewing it every
    ``renew_interval_seconds`` (before ``ttl_seconds`` runs out) through the hook's ``renew_lease``
    (``workflows.leases``); on every exit it stops renewing, waits for a renewal in flight, then releases
    the lease through the hook's ``release_lease``. Both effects named here are announced pending by the declaring invocation
    and brought to a terminal state by the workflow, with submission and error counts."""

    lease_id: str = Field(min_length=1, max_length=256)
    hook: str
    stage: Stage
    ttl_seconds: float = Field(gt=0)
    renew_interval_seconds: float = Field(gt=0)
    renewal_effect_id: str
    cleanup_effect_id: str
    payload: JsonValue = None  # what renew_lease / release_lease need; copied, small


class HookRequestView(BaseModel):
    """The request as every hook invocation sees it. ``request`` is the ask being served (after any
    before_run rewrite); ``state`` is this hook's private state for this run, and no other hook's."""

    request: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    request_id: str
    workflow_id: str
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    gate: GateState = Field(default_factory=GateState)
    plan_phase: int | None = None
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)
    state: dict[str, JsonValue] = Field(default_factory=dict)
    leases: list[str] = Field(default_factory=list)  # ids of the managed leases the request owner holds
    conversation_id: str | None = None  # the conversation the request belongs to (None outside one)
    # The request's model token budget left when the invocation was scheduled (None: no budget): what the
    # model calls the hook makes may spend (``hooks.model_budget``).
    model_tokens_left: int | None = None


class HookCall(ByReference):
    """What every hook invocation receives: the hook as the workflow knows it and the request view.
    Each stage's ``<Stage>Call`` adds the values of its stage."""

    hook: HookEntry
    view: HookRequestView


class HookOutcome(ByReference):
    """What every successful invocation returns besides its stage's own result."""

    decision: HookDecision
    effects: list[PipelineHookEffect] = Field(default_factory=list)
    detached: list[DetachedWork] = Field(default_factory=list)
    state: dict[str, JsonValue] | None = None  # the hook's private state after the invocation
    leases: list[ManagedLease] = Field(default_factory=list)  # handed to the request owner (the workflow)
    # The model calls the invocation made (they join the record's and count against the request's budget);
    # left out of the recorded outcome when there are none.
    model_calls: list[ModelCall] = Field(default_factory=list, exclude_if=lambda calls: not calls)


class ObserveOutcome(HookOutcome):
    """The outcome of an observe-only (after_execution) invocation."""


class RecordedOutcome(ByReference):
    """A hook's outcome as the local activity that ran it records it: the stage's outcome fields, without
    the subject the hook only hands back unchanged (``StageSpec.entry_outcome``; the workflow puts it
    back with ``StageSpec.outcome_of``)."""

    model_config = ConfigDict(extra="allow")


class HookBatchSegment(BaseModel):
    """The in-process hooks of one later stage in a batch that runs on (``HookBatchCall.ahead``)."""

    stage: Stage
    calls: list[Any]


class HookBatchCall(ByReference):
    """Consecutive in-process hooks of one stage, run in order by one local activity. ``calls`` holds
    each hook's ``<Stage>Call`` as the workflow built it before the batch; the activity passes each hook
    what the hooks before it made of the stage (the plan, the answer, the enrichments, ...), as the
    workflow would have, and stops at the first outcome it cannot carry forward (see
    ``workflows.stages.next_call``)."""

    stage: Stage
    calls: list[Any]  # the stage's call models (dicts once received)
    # The in-process hooks of the stages that follow in the run, each stage's calls built by the workflow
    # on the premise that the stages before leave the run as it is: run on only while they do
    # (``workflows.stages.hands_on``).
    ahead: list[HookBatchSegment] = Field(default_factory=list)
    # The accepted plan's record snapshot, which the activity writes itself once every hook of the stage
    # has left the plan and the run as they were: the write the workflow would otherwise make next.
    write: AcceptedPlanWrite | None = None
    # The request's terminal snapshot, which the activity writes itself once every hook of this stage and
    # of every stage it runs on into has left the run as it was: the write the workflow would otherwise
    # make at the end, when nothing else comes between these hooks and the end.
    end: TerminalWrite | None = None


class HookBatchFailure(BaseModel):
    """Why one hook of a batch produced no outcome after its attempts: the error its invocation raised
    (``type`` ``timeout`` when it ran out of time)."""

    type: str
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


class HookBatchEntry(BaseModel):
    hook: str
    outcome: Any = None  # the stage's outcome model (a dict once received), or None when it failed
    failure: HookBatchFailure | None = None
    attempts: int = 1
    duration_ms: float = 0.0


class SnapshotAttempt(BaseModel):
    """A record snapshot an activity tried to write with the hooks it ran: its revision, and whether the
    store took it — not when the store failed, or already held that revision."""

    revision: int
    written: bool = False


class HookBatchOutcome(ByReference):
    """One entry per hook that ran, in order: all of the batch, or up to the one the batch stopped at.
    ``entries`` is required: a marker that holds another local activity's result (one hook's outcome,
    recorded under the same type) fails to decode as a batch's, loudly, rather than read as a batch in
    which no hook ran."""

    entries: list[HookBatchEntry]
    # Per stage of ``HookBatchCall.ahead`` that the batch ran on into, in order: that stage's entries.
    ahead: list[list[HookBatchEntry]] = Field(default_factory=list)
    # What became of ``HookBatchCall.write``; None when it was not tried (the hooks changed the run).
    snapshot: SnapshotAttempt | None = None
    # What became of ``HookBatchCall.end``; None when it was not tried.
    end: SnapshotAttempt | None = None


class ShortCircuitKind:
    """The provenance kinds a short-circuit decision may declare: ``authoritative`` (a policy answer) or
    ``cache`` (served only if its variation map still matches)."""

    AUTHORITATIVE = "authoritative"  # policy denials, rate limits: valid regardless of cache state
    CACHE = "cache"  # a cache entry: served only if reads are enabled and every reserved dimension matches


class PipelineShortCircuit(BaseModel):
    """A complete answer that ends the request before planning."""

    response: str
    source: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


class PipelineShortCircuitDecision(BaseModel):
    """A provenance-aware short-circuit. ``kind`` is checked at the boundary: an unknown kind or a
    missing ``short_circuit`` fails the request with ``HookContractError``."""

    short_circuit: PipelineShortCircuit | None = None
    kind: str = ShortCircuitKind.AUTHORITATIVE
    cached_against: dict[str, str] = Field(default_factory=dict)
