"""Messages and records shared by the workflow, its activities, the hooks and the client.

Everything here is a pydantic model that crosses a Temporal boundary (workflow input/result, activity
inputs/results, queries) or is stored in the execution record. The module imports nothing heavier than
pydantic so the workflow sandbox can load it.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

MAX_REQUEST_CHARS = 8_000
MAX_METADATA_BYTES = 64 * 1024
MAX_ENRICHMENT_BYTES = 256 * 1024
MAX_TOOL_OUTPUT_BYTES = 32 * 1024
# Effect values and the recorded prompt above these sizes are kept by reference (digest, size, preview)
# so a record stays well under Temporal's 2 MB payload limit.
MAX_EFFECT_VALUE_BYTES = 32 * 1024
MAX_RECORDED_PROMPT_CHARS = 64 * 1024
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"

# Well-known enrichment keys (seed 000 §5.3).
ENRICHMENT_RAG_CONTEXT = "rag_context"
ENRICHMENT_CONVERSATION_HISTORY = "conversation_history"
ENRICHMENT_ACTIVITY_COORDINATION = "activity_coordination"
ENRICHMENT_USER_PROFILE = "user_profile"
# Request metadata carrying raw conversation turns (seed 000 §5.4).
METADATA_CONVERSATION_TURNS = "conversation_turns"
# Request metadata switch: {"cache": "bypass"} disables response-cache reads.
METADATA_CACHE = "cache"


def json_size(value: Any) -> int:
    """Bytes of the compact JSON encoding of ``value`` (the size it has in a payload)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def bounded_value(value: Any) -> Any:
    """``value`` itself if its JSON is small, else a reference: sha256 of the canonical JSON, size, preview."""
    size = json_size(value)
    if size <= MAX_EFFECT_VALUE_BYTES:
        return value
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return {
        "$truncated": True,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "bytes": size,
        "preview": text[:512],
    }


class Stage(StrEnum):
    """The stages a hook can implement: the four pipeline stages (seed 000 §4), the tool-call stages
    (seeds 001, 003) and the run-level extension stages (seed 003), in one registry."""

    BEFORE_RUN = "before_run"
    BEFORE_PLANNING = "before_planning"
    AFTER_PLANNING = "after_planning"
    BEFORE_TOOL = "before_tool"
    ON_TOOL_ERROR = "on_tool_error"
    AFTER_TOOL = "after_tool"
    AFTER_EXECUTION = "after_execution"
    AFTER_SYNTHESIS = "after_synthesis"
    AFTER_ANSWER = "after_answer"
    BEFORE_REMEMBER = "before_remember"
    ON_ERROR = "on_error"
    ON_FINISH = "on_finish"


# Stages whose hook decides or transforms: a failure ends the run with ExtensionError (seed 003).
DECISION_STAGES = frozenset(
    {Stage.BEFORE_RUN, Stage.BEFORE_TOOL, Stage.AFTER_TOOL, Stage.ON_TOOL_ERROR, Stage.AFTER_ANSWER, Stage.BEFORE_REMEMBER}
)
# Stages whose hooks only observe; a failure is a diagnostic and never replaces the outcome.
OBSERVER_STAGES = frozenset({Stage.ON_ERROR, Stage.ON_FINISH})
# Stages where a hook's own ``failure_policy`` replaces the stage default. after_planning has its own
# fail-closed mechanism (the one required hook); observers never change the outcome.
POLICY_OVERRIDE_STAGES = frozenset(set(Stage) - {Stage.AFTER_PLANNING} - OBSERVER_STAGES)


class FailurePolicy(StrEnum):
    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"


class RunMode(StrEnum):
    """How a hook invocation is scheduled by the workflow.

    ``activity`` (the default) is a regular activity: its own task, visible in the UI with its summary,
    retried and timed out by the server. ``local_activity`` runs in the workflow's worker without a
    round trip to the server: cheaper, for hooks that are fast and pure in-process work.
    """

    ACTIVITY = "activity"
    LOCAL_ACTIVITY = "local_activity"


# --------------------------------------------------------------------------------------------------
# Request input and result
# --------------------------------------------------------------------------------------------------


class RequestInput(BaseModel):
    """The input of one ``RequestLifecycle`` execution."""

    model_config = ConfigDict(extra="forbid")
    invalid_payload_type: ClassVar[str] = "InvalidRequest"

    request: str = Field(min_length=1, max_length=MAX_REQUEST_CHARS)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    request_id: str | None = Field(default=None, pattern=REQUEST_ID_PATTERN)

    @field_validator("request")
    @classmethod
    def _request_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("request must contain non-whitespace text")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_is_bounded(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        size = json_size(value)
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"metadata is {size} bytes of JSON; the limit is {MAX_METADATA_BYTES}")
        return value


class ShortCircuitInfo(BaseModel):
    """What answered a short-circuited request."""

    source: str
    kind: str
    reason: str


class StopInfo(BaseModel):
    """Why a run was stopped by an extension: which one, at which stage, and its reason."""

    extension: str
    phase: str
    reason: str


class Diagnostic(BaseModel):
    """A secondary failure that did not change the outcome (an observer hook failing)."""

    extension: str
    phase: str
    error: str
    error_type: str


class RequestResult(BaseModel):
    """The result of a completed (or stopped) ``RequestLifecycle`` execution."""

    request_id: str
    workflow_id: str
    response: str
    confidence: float
    short_circuit: ShortCircuitInfo | None = None
    stopped: StopInfo | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    steps: list[StepSummary] = Field(default_factory=list)
    diagnostics: list[Diagnostic] = Field(default_factory=list)


class StepSummary(BaseModel):
    step_id: str
    tool: str
    status: str


# --------------------------------------------------------------------------------------------------
# Tools and plans
# --------------------------------------------------------------------------------------------------


class ToolSpec(BaseModel):
    """A tool the planner may choose, as the workflow and validators see it."""

    namespace: str
    agent: str
    capability: str
    description: str = ""
    parameters: dict[str, JsonValue] = Field(default_factory=dict)  # JSON schema of the arguments
    read_only: bool = False
    approval_required: bool = False  # every step calling it waits for a reviewer's approval
    kind: Literal["tool", "subagent"] = "tool"  # a subagent step runs a child RequestLifecycle (seed 004)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.agent}/{self.capability}"


class PlanStep(BaseModel):
    """One tool call of a plan."""

    step_id: str
    namespace: str
    agent: str
    capability: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    # Prior-phase step ids this step's arguments reference ({{steps.<id>.output...}}), exactly.
    implicit_deps: list[str] = Field(default_factory=list)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @property
    def tool_key(self) -> str:
        return f"{self.namespace}/{self.agent}/{self.capability}"

    @property
    def tool(self) -> str:
        return f"{self.agent}/{self.capability}"


class Plan(BaseModel):
    """A routing plan: the steps to run for one planning phase.

    ``continue_after`` asks for another planning phase once this one's steps have run; the planner then
    sees their results. The pipeline's phase cap bounds the loop.
    """

    phase: int = 1
    steps: list[PlanStep] = Field(default_factory=list)
    rationale: str = ""
    continue_after: bool = False


class StepStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


class StepResult(BaseModel):
    """The outcome of one executed (or skipped) plan step.

    ``output`` is the tool's raw output (kept for references and the record); ``result`` is the text a
    planner or synthesizer reads: the output rendered, rewritten by after_tool hooks, capped.
    """

    step_id: str
    tool: str
    status: StepStatus
    output: JsonValue = None
    result: str | None = None
    arguments: dict[str, JsonValue] | None = None  # as executed, after references and before_tool rewrites
    error: str | None = None
    error_type: str | None = None
    error_handled_by: str | None = None  # the on_tool_error hook that substituted the result
    skip_reason: str | None = None  # policy | missing
    skip_detail: str | None = None
    skipped_by: str | None = None  # the extension that denied the call
    modified_by: list[str] = Field(default_factory=list)
    idempotency_key: str | None = None
    started_at: datetime | None = None
    duration_ms: float | None = None

    def model_view(self) -> StepResult:
        """What a planner or synthesizer sees: the result text (which after_tool hooks such as ``redact``
        have processed), not the raw output or the raw error."""
        return self.model_copy(update={"output": None, "error": None})


class ExecutionResult(BaseModel):
    """All step outcomes of a request, in plan order; what after_execution hooks observe."""

    steps: list[StepResult] = Field(default_factory=list)

    @property
    def succeeded(self) -> list[StepResult]:
        return [s for s in self.steps if s.status is StepStatus.SUCCEEDED]


# --------------------------------------------------------------------------------------------------
# The pipeline manifest (what resolve_pipeline returns)
# --------------------------------------------------------------------------------------------------


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
    # The hook's own failure policy where it may differ from the stage's (see POLICY_OVERRIDE_STAGES):
    # a protective hook (redaction, policy) fails closed at a stage that fails open by default.
    failure_policy: FailurePolicy | None = None

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
    max_tool_result_chars: int = 600  # the result text a model reads, after after_tool hooks (seed 003)
    # A worker that stops heartbeating for this long is lost: its activity is dispatched again without
    # spending the activity's own attempts (a crash is an infrastructure event, never an outcome).
    heartbeat_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    # Dispatches of one activity that may end in a lost worker before the request fails with the
    # infrastructure error ``WorkerLost`` (a hook that kills every worker it runs on must not loop forever).
    max_worker_losses: int = Field(default=5, ge=1)


# The longest a checkpoint may wait. A waiting request adds no history while it waits (the timer and
# the lease keeper are one event each), so the bound is the lease keeper's own start-to-close timeout.
MAX_CHECKPOINT_EXPIRY_SECONDS = 365 * 24 * 3600.0


class ReviewSettings(BaseModel):
    """Human-in-the-loop checkpoints: who may decide, and how long a checkpoint waits."""

    reviewers: list[str] = Field(default_factory=list)  # empty: any named reviewer may decide
    checkpoint_expiry_seconds: float = Field(default=24 * 3600.0, gt=0, le=MAX_CHECKPOINT_EXPIRY_SECONDS)


class PipelineManifest(BaseModel):
    """The pipeline a request runs with: hook order and stages, tools, cache variation, limits."""

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

    def participants(self, stage: Stage) -> list[HookEntry]:
        return [h for h in self.hooks if h.implements(stage)]

    def tool_participants(self, stage: Stage, call: ToolCall) -> list[HookEntry]:
        """The hooks a tool stage invokes for ``call``: those whose matcher and sub-agent filter admit it."""
        return [h for h in self.participants(stage) if h.applies_to_tool(call)]


class ResolvePipelineInput(BaseModel):
    request_id: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# Decisions, invocations and effects (seed 000 §9)
# --------------------------------------------------------------------------------------------------


class DecisionAction(StrEnum):
    CONTINUE = "continue"
    TERMINATE = "terminate"
    SHORT_CIRCUIT = "short_circuit"
    DENY = "deny"
    STOP = "stop"
    SKIP = "skip"


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
    """An activity dispatch that ended because its worker stopped heartbeating (crashed, was killed,
    lost its connection). The activity was dispatched again; its own attempts were not spent."""

    activity: str
    summary: str
    at: datetime
    dispatch: int  # 1 for the first lost dispatch of this call, 2 for the next, ...


class EffectStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class PipelineHookEffect(BaseModel):
    """A versioned record of work a hook attempted and what it observed (seed 000 §7.5, §9)."""

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


# --------------------------------------------------------------------------------------------------
# Short-circuit proposals and the cache gate (seed 000 §6)
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Activity inputs and outputs
# --------------------------------------------------------------------------------------------------


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


class HookOutcome(BaseModel):
    """What every successful invocation returns besides its stage's own result."""

    decision: HookDecision
    effects: list[PipelineHookEffect] = Field(default_factory=list)
    detached: list[DetachedWork] = Field(default_factory=list)
    state: dict[str, JsonValue] | None = None  # the hook's private state after the invocation
    leases: list[ManagedLease] = Field(default_factory=list)  # handed to the request owner (issue 6)


class BeforePlanningCall(BaseModel):
    hook: HookEntry
    view: HookRequestView


class BeforePlanningOutcome(HookOutcome):
    enrichment_changes: list[EnrichmentChange] = Field(default_factory=list)
    short_circuit: ShortCircuitProposal | None = None


class AfterPlanningCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    plan: Plan
    prior_step_ids: list[str] = Field(default_factory=list)  # steps of earlier phases, for implicit_deps


class AfterPlanningOutcome(HookOutcome):
    plan: Plan
    changed: bool


class AfterExecutionCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    execution: ExecutionResult


class AfterSynthesisCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    response: str


class AfterSynthesisOutcome(HookOutcome):
    response: str


class ObserveOutcome(HookOutcome):
    """The outcome of an observe-only (after_execution) invocation."""


# --------------------------------------------------------------------------------------------------
# Tool-call stages (seeds 001, 003)
# --------------------------------------------------------------------------------------------------


class ToolCall(BaseModel):
    """A tool call a hook may inspect or alter: the step, its tool, its (resolved) arguments."""

    step_id: str
    namespace: str
    agent: str
    capability: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    plan_phase: int = 1
    subagent: bool = False  # the step starts a sub-agent (a child RequestLifecycle)

    @property
    def tool(self) -> str:
        return f"{self.agent}/{self.capability}"

    @property
    def tool_key(self) -> str:
        return f"{self.namespace}/{self.agent}/{self.capability}"


class ToolDecision(BaseModel):
    """A before_tool verdict. The zero value allows: a hook that returns nothing, or one written before
    a field existed, must never block every tool by accident."""

    action: Literal["allow", "modify", "deny", "stop"] = "allow"
    arguments: dict[str, JsonValue] | None = None  # the new arguments, for modify
    message: str = ""  # for deny: what the model reads instead of a result; for stop: the run's answer
    reason: str = ""

    @classmethod
    def allow(cls) -> ToolDecision:
        return cls()

    @classmethod
    def modify(cls, arguments: dict[str, JsonValue], reason: str = "") -> ToolDecision:
        return cls(action="modify", arguments=arguments, reason=reason)

    @classmethod
    def deny(cls, message: str, reason: str = "") -> ToolDecision:
        return cls(action="deny", message=message, reason=reason)

    @classmethod
    def stop(cls, text: str, reason: str = "") -> ToolDecision:
        return cls(action="stop", message=text, reason=reason)


class ToolOutcomeView(BaseModel):
    """What an after_tool hook sees: ``executed`` (with the raw output), ``skipped`` (reason policy or
    missing, and the extension that denied) or ``failed`` (the error); ``result`` is the current text."""

    status: Literal["executed", "skipped", "failed"]
    output: JsonValue = None
    reason: str | None = None
    extension: str | None = None
    error: str | None = None
    result: str = ""


class ToolErrorResolution(BaseModel):
    """An on_tool_error answer: ``handled`` substitutes ``result`` for the error."""

    handled: bool = False
    result: str = ""


class BeforeToolCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    call: ToolCall


class BeforeToolOutcome(HookOutcome):
    verdict: ToolDecision


class AfterToolCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    call: ToolCall
    outcome: ToolOutcomeView


class AfterToolOutcome(HookOutcome):
    result: str


class ToolErrorCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    call: ToolCall
    outcome: ToolOutcomeView


class ToolErrorOutcome(HookOutcome):
    resolution: ToolErrorResolution


class ToolMetrics(BaseModel):
    """Per-tool counts and durations of one request (calls are executions, not skipped steps)."""

    calls: int = 0
    failures: int = 0
    skipped: int = 0
    total_duration_ms: float = 0.0
    max_duration_ms: float = 0.0


# --------------------------------------------------------------------------------------------------
# Run-level extension stages (seed 003)
# --------------------------------------------------------------------------------------------------


class RunView(BaseModel):
    """What before_run sees and may rewrite: the ask, extra instructions, facts."""

    ask: str
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)


class RunPatch(BaseModel):
    """A before_run rewrite: fields left ``None`` are kept; ``facts`` merge, later values winning."""

    ask: str | None = None
    instructions: str | None = None
    facts: dict[str, JsonValue] | None = None


class Stop(BaseModel):
    """End the run now with ``text`` as its answer (before_run, before_tool via ToolDecision, after_answer).
    Answer transforms and memory are bypassed; only finalizers run."""

    text: str
    reason: str = ""


class AnswerView(BaseModel):
    text: str
    handled_by: Literal["pipeline", "short_circuit"]
    steps: list[StepSummary] = Field(default_factory=list)


class MemoryCandidate(BaseModel):
    """What a completed run would remember for its conversation."""

    conversation_id: str
    request: str
    answer: str
    facts: dict[str, JsonValue] = Field(default_factory=dict)


class SkipMemory(BaseModel):
    """before_remember: do not save; later hooks cannot reverse it."""

    reason: str = ""


class RunErrorView(BaseModel):
    """What on_error sees: the original error and where it came from."""

    origin: str  # extension, planner, synthesizer, hook, confirmation, config, cancelled, harness
    type: str
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)
    steps: list[StepSummary] = Field(default_factory=list)


class CacheVerdict(BaseModel):
    """Whether a response cache may store this run's answer, decided by the workflow from what the run
    did. Only a completed run whose executed steps all called ``read_only`` tools and succeeded — no
    checkpoint, no denied, failed or skipped step, no stop, no failed or timed-out hook invocation, not
    itself a short-circuit — is cacheable: a cached answer must never stand in for a side effect or
    for a protection that did not run."""

    cacheable: bool = False
    reasons: list[str] = Field(default_factory=list)  # why not, when not
    response: str | None = None  # the text to store: after after_synthesis, before after_answer


class RunOutcomeView(BaseModel):
    """What on_finish sees, once per extension, for every outcome."""

    status: Literal["completed", "stopped", "error", "cancelled"]
    response: str | None = None
    stopped: StopInfo | None = None
    error: RunErrorView | None = None
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    cache: CacheVerdict = Field(default_factory=CacheVerdict)


class BeforeRunCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    run: RunView


class BeforeRunOutcome(HookOutcome):
    patch: RunPatch | None = None
    stop: Stop | None = None


class AfterAnswerCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    answer: AnswerView


class AfterAnswerOutcome(HookOutcome):
    text: str
    stop: Stop | None = None


class BeforeRememberCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    candidate: MemoryCandidate


class BeforeRememberOutcome(HookOutcome):
    candidate: MemoryCandidate
    skip: SkipMemory | None = None


class OnErrorCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    error: RunErrorView


class OnFinishCall(BaseModel):
    hook: HookEntry
    view: HookRequestView
    outcome: RunOutcomeView


class RememberInput(BaseModel):
    request_id: str
    workflow_id: str
    candidate: MemoryCandidate


class MemoryOutcome(BaseModel):
    """What happened to the run's memory candidate."""

    action: Literal["saved", "skipped"]
    conversation_id: str
    by: str | None = None  # the before_remember hook that skipped or replaced it
    reason: str = ""


class PlanInput(BaseModel):
    request: str
    request_id: str
    workflow_id: str
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    phase: int = 1
    prior_results: list[StepResult] = Field(default_factory=list)  # every step of earlier phases
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)


class PlanOutput(BaseModel):
    plan: Plan
    prompt: str
    planner: str


class ToolStepInput(BaseModel):
    step: PlanStep
    request_id: str
    idempotency_key: str


class ToolStepOutput(BaseModel):
    output: JsonValue = None


class SynthesizeInput(BaseModel):
    request: str
    request_id: str
    plan: Plan
    execution: ExecutionResult  # step results as a model reads them: result text, no raw output
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)


class ModelDraft(BaseModel):
    """The synthesizer's answer before after_synthesis hooks, as the record keeps it: by digest, size and
    a short preview with common secret patterns masked, never whole — guarding the answer is what
    after_synthesis hooks are for, so the draft is not safe to show or store."""

    sha256: str
    chars: int
    preview: str = ""

    @classmethod
    def of(cls, text: str, preview: str = "") -> ModelDraft:
        return cls(sha256=hashlib.sha256(text.encode()).hexdigest(), chars=len(text), preview=preview)

    def matches(self, text: str) -> bool:
        return self.sha256 == hashlib.sha256(text.encode()).hexdigest()


class SynthesizeOutput(BaseModel):
    response: str
    confidence: float = Field(ge=0.0, le=1.0)
    draft: ModelDraft | None = None  # set by the synthesize activity: what the record keeps of ``response``


class DetachedEffectInput(BaseModel):
    """The input of a ``DetachedEffect`` child workflow."""

    parent_workflow_id: str
    parent_run_id: str
    request_id: str
    work: DetachedWork
    effect: PipelineHookEffect  # as announced (pending)
    timeout_seconds: float = 300.0
    max_attempts: int = 5
    # Issued by the request for this effect and sent back with the update, so only this child's update
    # is taken as the effect's outcome (anyone may send a signal; only the request knows this value).
    update_token: str = ""
    heartbeat_timeout_seconds: float = 5.0
    max_worker_losses: int = 5


class DetachedWorkResult(BaseModel):
    """What a hook's detached work reports back: the effect's new data and summary."""

    data: JsonValue = None
    summary: str = ""


class EffectUpdateInput(BaseModel):
    workflow_id: str
    run_id: str
    effect: PipelineHookEffect


class EffectUpdateSignal(BaseModel):
    """Signal ``effect_update``: a ``DetachedEffect`` child reporting its effect's terminal state."""

    model_config = ConfigDict(extra="forbid")
    effect: PipelineHookEffect
    token: str = Field(max_length=64)


# --------------------------------------------------------------------------------------------------
# Managed leases: work a hook hands to the request owner — the workflow — to keep alive while the
# request runs and to release on every exit.
# --------------------------------------------------------------------------------------------------


class ManagedLease(BaseModel):
    """A lease a hook declared with ``ctx.manage_lease``: the workflow keeps it alive with one
    long-running ``keep_lease`` activity, which renews it every ``renew_interval_seconds`` (before
    ``ttl_seconds`` runs out) through the hook's ``renew_lease`` and heartbeats in between; on every exit
    the workflow cancels that activity and waits for it to stop, then releases the lease through the
    hook's ``release_lease``. Both effects named here are announced pending by the declaring invocation
    and brought to a terminal state by the workflow, with submission and error counts."""

    lease_id: str = Field(min_length=1, max_length=256)
    hook: str
    stage: Stage
    ttl_seconds: float = Field(gt=0)
    renew_interval_seconds: float = Field(gt=0)
    renewal_effect_id: str
    cleanup_effect_id: str
    payload: JsonValue = None  # what renew_lease / release_lease need; copied, small


class LeaseCall(BaseModel):
    """The input of the ``keep_lease`` and ``release_lease`` activities."""

    lease: ManagedLease
    request_id: str
    workflow_id: str
    ordinal: int = 0  # renewals already submitted for this lease (the keeper continues the count)
    exit: str | None = None  # for the release: how the request ended (completed, stopped, error, cancelled)


class LeaseKeeperReport(BaseModel):
    """What a ``keep_lease`` activity did until it was stopped: renewals submitted, returned, failed.
    Also its heartbeat details, so a keeper resumed on another worker continues the counts."""

    submitted: int = 0
    renewed: int = 0
    errors: int = 0
    last_error: str | None = None
    expires_at: datetime | None = None


class LeaseObservation(BaseModel):
    """What a hook's ``renew_lease`` / ``release_lease`` observed from its provider (not proof of
    durability). Raise from those methods to report a provider error instead."""

    data: JsonValue = None
    summary: str = ""
    expires_at: datetime | None = None  # for a renewal: the expiry the provider reported


# --------------------------------------------------------------------------------------------------
# Human-in-the-loop checkpoints
# --------------------------------------------------------------------------------------------------


class CheckpointStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


class ApprovalReason(BaseModel):
    step_id: str
    tool: str
    reason: str


class Checkpoint(BaseModel):
    """A plan waiting for a reviewer. Approval runs exactly this plan; after_planning does not run again."""

    checkpoint_id: str
    phase: int
    plan: Plan
    reasons: list[ApprovalReason]
    requested_at: datetime
    expires_at: datetime
    status: CheckpointStatus = CheckpointStatus.PENDING
    reviewer: str | None = None
    comment: str | None = None  # the approval comment or the rejection reason
    decided_at: datetime | None = None


# Bounds on what a review brings into the record from outside.
MAX_REVIEW_ID_CHARS = 128  # checkpoint ids and reviewer names
MAX_REVIEW_COMMENT_CHARS = 2_000
MAX_INBOUND_PAYLOAD_BYTES = 16 * 1024  # a larger signal or update payload is refused before decoding
MAX_IGNORED_FIELD_CHARS = 200  # each text of an ignored message, as the record keeps it
MAX_IGNORED_MESSAGES = 50  # ignored messages (and lost workers) the record lists; the rest are counted


class ApproveSignal(BaseModel):
    """Signal ``approve``. The workflow validates it itself, so a malformed review is recorded as ignored,
    not dropped."""

    model_config = ConfigDict(extra="ignore")
    checkpoint_id: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    reviewer: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    comment: str = Field(default="", max_length=MAX_REVIEW_COMMENT_CHARS)


class RejectSignal(BaseModel):
    """Signal ``reject``."""

    model_config = ConfigDict(extra="ignore")
    checkpoint_id: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    reviewer: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    reason: str = Field(default="", max_length=MAX_REVIEW_COMMENT_CHARS)


class ReviewRequest(BaseModel):
    """Update ``review``: the validated, acknowledged twin of the two signals."""

    model_config = ConfigDict(extra="forbid")
    checkpoint_id: str = Field(max_length=MAX_REVIEW_ID_CHARS)
    reviewer: str = Field(max_length=MAX_REVIEW_ID_CHARS)
    decision: Literal["approve", "reject"]
    comment: str = Field(default="", max_length=MAX_REVIEW_COMMENT_CHARS)  # approval comment, or rejection reason


class ReviewAck(BaseModel):
    checkpoint_id: str
    decision: Literal["approve", "reject"]
    reviewer: str
    accepted_at: datetime


class IgnoredReview(BaseModel):
    """A message from outside that changed nothing — a review for an unknown or decided checkpoint, a
    malformed signal, an effect update the request did not ask for — kept in the record with the reason.
    Every text is clipped, and the record keeps a bounded number of them."""

    received_at: datetime
    via: str  # the signal or update name: approve, reject, review, effect_update, or an unknown one
    checkpoint_id: str  # or the effect id, for effect updates
    reviewer: str
    reason: str

    @classmethod
    def clipped(cls, received_at: datetime, via: str, checkpoint_id: str, reviewer: str, reason: str) -> IgnoredReview:
        def clip(text: str) -> str:
            return text if len(text) <= MAX_IGNORED_FIELD_CHARS else text[: MAX_IGNORED_FIELD_CHARS - 1] + "…"

        return cls(received_at=received_at, via=clip(via), checkpoint_id=clip(checkpoint_id), reviewer=clip(reviewer), reason=clip(reason))


# --------------------------------------------------------------------------------------------------
# The execution record (StoredExecution)
# --------------------------------------------------------------------------------------------------


class RequestStatus(StrEnum):
    RUNNING = "running"
    SUSPENDED = "suspended"  # waiting at a checkpoint
    SUCCEEDED = "succeeded"
    STOPPED = "stopped"  # an extension ended the run with its own answer
    FAILED = "failed"
    CANCELLED = "cancelled"


class RequestError(BaseModel):
    type: str
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


class LifecycleBoundary(StrEnum):
    ACCEPTED_PLAN = "accepted_plan"
    CHECKPOINT_OPENED = "checkpoint_opened"
    TERMINAL = "terminal"


class RecordLifecycle(BaseModel):
    """Lifecycle evidence: which boundary the snapshot was taken at and whether the request completed.
    Records written without it (older writers) read as completion ``unknown``."""

    boundary: LifecycleBoundary
    completion: Literal["pending", "completed", "stopped", "failed", "cancelled"]
    snapshot_revision: int


class AcceptedPlan(BaseModel):
    phase: int
    plan: Plan
    accepted_at: datetime


class ExecutionRecord(BaseModel):
    """Everything a request did: the authoritative source for troubleshooting which hooks ran."""

    request_id: str
    workflow_id: str
    run_id: str
    pipeline: str | None = None
    request: str
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    status: RequestStatus = RequestStatus.RUNNING
    lifecycle_stage: str = "accepted"
    record_revision: int = 0
    started_at: datetime
    completed_at: datetime | None = None
    promoted_enrichments: list[str] = Field(default_factory=list)
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    planning_prompt: str | None = None
    planner: str | None = None
    plans: list[AcceptedPlan] = Field(default_factory=list)
    steps: list[StepResult] = Field(default_factory=list)
    model_draft: ModelDraft | None = None  # the synthesizer's answer before after_synthesis, by digest
    final_response: str | None = None  # what the client received
    confidence: float | None = None
    short_circuit: ShortCircuitInfo | None = None
    pipeline_hooks: list[HookInvocation] = Field(default_factory=list)
    effects: list[PipelineHookEffect] = Field(default_factory=list)
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    ignored_reviews: list[IgnoredReview] = Field(default_factory=list)  # bounded: see MAX_IGNORED_MESSAGES
    ignored_dropped: int = 0  # ignored messages beyond the bound, counted only
    worker_losses: list[WorkerLoss] = Field(default_factory=list)  # bounded like ignored_reviews
    cache: CacheVerdict | None = None  # whether the answer was cacheable (without the text)
    phase_cap_reached: bool = False
    ask: str | None = None  # the ask served, when a before_run hook rewrote the request
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)
    stopped: StopInfo | None = None
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    tool_metrics: dict[str, ToolMetrics] = Field(default_factory=dict)
    memory: MemoryOutcome | None = None
    error: RequestError | None = None
    lifecycle: RecordLifecycle | None = None

    @property
    def request_completion(self) -> str:
        """completed / failed / cancelled / pending, or ``unknown`` for a record without lifecycle evidence."""
        return self.lifecycle.completion if self.lifecycle is not None else "unknown"

    def invocations(self, stage: Stage | None = None, hook: str | None = None) -> list[HookInvocation]:
        return [
            i
            for i in self.pipeline_hooks
            if (stage is None or i.stage == stage) and (hook is None or i.hook == hook)
        ]

    def effect(self, effect_id: str) -> PipelineHookEffect | None:
        return next((e for e in self.effects if e.effect_id == effect_id), None)


class PersistRecordInput(BaseModel):
    record: ExecutionRecord


class PersistRecordOutput(BaseModel):
    stored_revision: int
    written: bool


# --------------------------------------------------------------------------------------------------
# Sub-agents (seed 004): a sub-agent tool step runs a child RequestLifecycle, bounded in depth
# --------------------------------------------------------------------------------------------------

# Request metadata: how deep in a sub-agent chain this request is (0 or absent for a root request).
METADATA_SUBAGENT_DEPTH = "subagent_depth"
METADATA_PARENT_WORKFLOW = "parent_workflow_id"
MAX_SUBAGENT_DEPTH = 3
LOOP_DEPTH_EXCEEDED = "LoopDepthExceeded"


def subagent_depth(metadata: dict[str, JsonValue]) -> int:
    """The sub-agent depth a request's metadata declares (0 when absent or malformed)."""
    depth = metadata.get(METADATA_SUBAGENT_DEPTH)
    return depth if isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0 else 0


RequestResult.model_rebuild()
