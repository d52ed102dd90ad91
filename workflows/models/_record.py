"""The execution record (what a request did, for operators) and the checkpoint and review messages it
keeps."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ._common import ByReference, TextDigest
from ._hook_calls import CacheVerdict
from ._model_calls import ModelCall, ModelUsage
from ._pipeline import HookBatchCall, HookInvocation, PipelineHookEffect, Stage, WorkerLoss
from ._plans import Plan, StepResult, ToolMetrics
from ._request import Diagnostic, RequestError, RequestStatus, ShortCircuitInfo, StopInfo

__all__ = [
    "MAX_IGNORED_FIELD_CHARS",
    "MAX_IGNORED_MESSAGES",
    "MAX_INBOUND_PAYLOAD_BYTES",
    "MAX_REVIEW_COMMENT_CHARS",
    "MAX_REVIEW_ID_CHARS",
    "AcceptedPlan",
    "AcceptedPlanWrite",
    "ApprovalCall",
    "ApprovalReason",
    "ApproveSignal",
    "Checkpoint",
    "CheckpointStatus",
    "ExecutionRecord",
    "IgnoredReview",
    "LifecycleBoundary",
    "MemoryOutcome",
    "ModelDraft",
    "PersistRecordInput",
    "PersistRecordOutput",
    "RecallOutcome",
    "RecordLifecycle",
    "RejectSignal",
    "ReviewAck",
    "ReviewRequest",
    "TerminalEnd",
    "TerminalPart",
    "TerminalWrite",
]

# --------------------------------------------------------------------------------------------------
# Human-in-the-loop checkpoints and the reviews they receive
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


class ApprovalCall(BaseModel):
    """One call a checkpoint asks a reviewer to approve, exactly as it will run: its arguments with every
    reference to an earlier step resolved and after every before_tool rewrite. Approval executes a copy
    of these values; no hook runs between the approval and the tool."""

    step_id: str
    tool: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    # The arguments as the plan wrote them, when resolution or a rewrite changed them.
    planned_arguments: dict[str, JsonValue] | None = None
    modified_by: list[str] = Field(default_factory=list)  # the before_tool hooks that rewrote the call


class Checkpoint(BaseModel):
    """Calls waiting for a reviewer. ``calls`` are what approval runs, exactly; after_planning and
    before_tool do not run again for them. A checkpoint of a whole phase lists the calls that were ready
    when its plan was accepted; a call whose arguments existed only once steps of its own phase had run
    has a checkpoint of its own (``step_id``), opened when it is ready. Checkpoints recorded before calls
    were listed have none: approval ran their ``plan`` as planned."""

    checkpoint_id: str
    phase: int
    plan: Plan
    reasons: list[ApprovalReason]
    calls: list[ApprovalCall] = Field(default_factory=list)
    step_id: str | None = None  # the one step a step's own checkpoint approves
    requested_at: datetime
    expires_at: datetime
    status: CheckpointStatus = CheckpointStatus.PENDING
    # The digest of exactly what approving runs (``review_proof.calls_digest``): a signed decision names it,
    # so a decision made for other calls or arguments is refused.
    calls_digest: str | None = None
    reviewer: str | None = None  # who decided: the verified principal where the pipeline verifies reviewers
    verified_by: str | None = None  # what proved it: a key, an issuer, the server's identity, or an unverified name
    comment: str | None = None  # the approval comment or the rejection reason
    decided_at: datetime | None = None
    # The calls (step ids) the reviewer declined while approving the others: each is skipped (reason
    # ``confirmation``) and the planner may plan around it; the request goes on.
    declined: list[str] = Field(default_factory=list)


# Bounds on what a review brings into the record from outside.
MAX_REVIEW_ID_CHARS = 128  # checkpoint ids and reviewer names
MAX_REVIEW_PROOF_CHARS = 8192  # a signed decision (a compact JWS)
MAX_REVIEW_COMMENT_CHARS = 2_000
MAX_INBOUND_PAYLOAD_BYTES = 16 * 1024  # a larger signal or update payload is refused before decoding
MAX_IGNORED_FIELD_CHARS = 200  # each text of an ignored message, as the record keeps it
MAX_IGNORED_MESSAGES = 50  # ignored messages (and lost workers) the record lists; the rest are counted
MAX_DECLINED_CALLS = 64  # calls one review may decline


class ApproveSignal(BaseModel):
    """Signal ``approve``. The workflow validates it itself, so a malformed review is recorded as ignored,
    not dropped."""

    model_config = ConfigDict(extra="ignore")
    checkpoint_id: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    reviewer: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    comment: str = Field(default="", max_length=MAX_REVIEW_COMMENT_CHARS)
    declined: list[str] = Field(default_factory=list, max_length=MAX_DECLINED_CALLS)  # step ids not to run
    proof: str = Field(default="", max_length=MAX_REVIEW_PROOF_CHARS)  # a signed decision, where required


class RejectSignal(BaseModel):
    """Signal ``reject``."""

    model_config = ConfigDict(extra="ignore")
    checkpoint_id: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    reviewer: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    reason: str = Field(default="", max_length=MAX_REVIEW_COMMENT_CHARS)
    proof: str = Field(default="", max_length=MAX_REVIEW_PROOF_CHARS)


class ReviewRequest(BaseModel):
    """Update ``review``: the validated, acknowledged twin of the two signals."""

    model_config = ConfigDict(extra="forbid")
    checkpoint_id: str = Field(max_length=MAX_REVIEW_ID_CHARS)
    # Who decides. With signed decisions it may be left empty (the proof names the reviewer); with the
    # server's identity, empty or that identity.
    reviewer: str = Field(default="", max_length=MAX_REVIEW_ID_CHARS)
    decision: Literal["approve", "reject"]
    comment: str = Field(default="", max_length=MAX_REVIEW_COMMENT_CHARS)  # approval comment, or rejection reason
    # With ``approve``: the calls (step ids of the checkpoint) not to run; they are skipped with reason
    # ``confirmation`` and the request goes on. Rejecting refuses every call and ends the request.
    declined: list[str] = Field(default_factory=list, max_length=MAX_DECLINED_CALLS)
    # A compact JWS over the decision (``workflows.review_proof``), where the pipeline verifies reviewers.
    proof: str = Field(default="", max_length=MAX_REVIEW_PROOF_CHARS)


class ReviewAck(BaseModel):
    checkpoint_id: str
    decision: Literal["approve", "reject"]
    reviewer: str  # the verified principal where the pipeline verifies reviewers
    accepted_at: datetime
    declined: list[str] = Field(default_factory=list)
    verified_by: str | None = None


class IgnoredReview(BaseModel):
    """A message from outside that changed nothing — a review for an unknown or decided checkpoint, a
    malformed signal, an effect update the request did not ask for — kept in the record with the reason.
    Every text is clipped, and the record keeps a bounded number of them."""

    received_at: datetime
    via: str  # the signal or update name: approve, reject, review, effect_update, or an unknown one
    checkpoint_id: str  # or the effect id, for effect updates
    reviewer: str
    reason: str
    sent_as: str | None = None  # the identity the Temporal server received the message with

    @classmethod
    def clipped(
        cls, received_at: datetime, via: str, checkpoint_id: str, reviewer: str, reason: str, sent_as: str | None = None
    ) -> IgnoredReview:
        def clip(text: str) -> str:
            return text if len(text) <= MAX_IGNORED_FIELD_CHARS else text[: MAX_IGNORED_FIELD_CHARS - 1] + "…"

        return cls(
            received_at=received_at,
            via=clip(via),
            checkpoint_id=clip(checkpoint_id),
            reviewer=clip(reviewer),
            reason=clip(reason),
            sent_as=clip(sent_as) if sent_as else None,
        )


# --------------------------------------------------------------------------------------------------
# The execution record
# --------------------------------------------------------------------------------------------------


class ModelDraft(TextDigest):
    """The model's answer before after_synthesis hooks, as the record keeps it: by digest, size and a
    short preview with common secret patterns masked, never whole — guarding the answer is what
    after_synthesis hooks are for, so the draft is not safe to show or store. ``stage`` and ``phase`` say
    which call wrote it: the synthesis call, or the planner's turn of a phase that answered in text."""

    stage: Literal["planning", "synthesis"] = "synthesis"
    phase: int | None = None  # the planning phase whose model turn wrote it


class MemoryOutcome(BaseModel):
    """What happened to the run's memory candidate."""

    action: Literal["saved", "skipped"]
    conversation_id: str
    by: str | None = None  # the before_remember hook that skipped or replaced it
    reason: str = ""
    # Exchanges that left the recent history with this save, and how the summary took them: folded by the
    # ``model`` or the ``heuristic``, or the previous summary ``kept`` (after a fallback handoff).
    evicted: int = 0
    summary: Literal["model", "heuristic", "kept"] | None = None
    summary_tokens: int = 0
    # The summarizer's model calls, as the ``remember`` activity reports them: the workflow moves them to
    # the record's ``model_calls`` (so this stays empty in a record).
    model_calls: list[ModelCall] = Field(default_factory=list, exclude_if=lambda calls: not calls)


class RecallOutcome(BaseModel):
    """What the run recalled of its conversation's memory, and which after_recall hooks changed the view it
    planned with (the memory saved afterwards starts from what was loaded)."""

    conversation_id: str
    exchanges: int = 0  # as loaded
    summary_chars: int = 0  # as loaded
    changed_by: list[str] = Field(default_factory=list)
    error: str | None = None  # loading failed: the run planned without the memory


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
    requested_by: str | None = None  # the principal the request was started for
    status: RequestStatus = RequestStatus.RUNNING
    lifecycle_stage: str = "accepted"
    record_revision: int = 0
    started_at: datetime
    completed_at: datetime | None = None
    promoted_enrichments: list[str] = Field(default_factory=list)
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    planning_prompt: str | None = None
    planner: str | None = None
    trace_id: str | None = None  # the request's OpenTelemetry trace: every hook, tool and model call is in it
    plans: list[AcceptedPlan] = Field(default_factory=list)
    steps: list[StepResult] = Field(default_factory=list)
    # Planning, synthesis, hooks' and memory's model calls, failed and refused ones too.
    model_calls: list[ModelCall] = Field(default_factory=list)
    model_draft: ModelDraft | None = None  # the synthesizer's answer before after_synthesis, by digest
    # Which model answered: the primary, or the fallback once a failing primary handed the run over (None:
    # no model step ran — a short-circuit, or a stop before planning).
    handled_by: Literal["primary", "fallback"] | None = None
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
    recall: RecallOutcome | None = None
    memory: MemoryOutcome | None = None
    error: RequestError | None = None
    lifecycle: RecordLifecycle | None = None

    @property
    def model_usage(self) -> ModelUsage:
        return ModelUsage.of(self.model_calls)

    @property
    def request_completion(self) -> str:
        """completed / failed / cancelled / pending, or ``unknown`` for a record without lifecycle evidence."""
        return self.lifecycle.completion if self.lifecycle is not None else "unknown"

    def invocations(self, stage: Stage | None = None, hook: str | None = None) -> list[HookInvocation]:
        return [
            i for i in self.pipeline_hooks if (stage is None or i.stage == stage) and (hook is None or i.hook == hook)
        ]

    def effect(self, effect_id: str) -> PipelineHookEffect | None:
        return next((e for e in self.effects if e.effect_id == effect_id), None)


class AcceptedPlanWrite(BaseModel):
    """The accepted plan's snapshot, handed to the local activity that runs every after_planning hook of a
    phase: ``record`` as it stands when the hooks start (the stage entered, the plan not yet accepted),
    ``started`` the workflow time the activity was scheduled at (the first hook's start), ``first_sequence``
    the first hook's place among the stage's invocations. The activity adds what the hooks leave in the
    record, the accepted plan and the boundary, as the workflow does (``workflows.snapshots``)."""

    record: ExecutionRecord
    started: datetime
    first_sequence: int = 1
    plan_phase: int | None = None


class TerminalPart(BaseModel):
    """One stage of the local activity that writes the terminal snapshot: its invocations' first place
    among the stage's invocations and their plan phase, as the workflow records them."""

    stage: Stage
    first_sequence: int = 1
    plan_phase: int | None = None


class TerminalEnd(BaseModel):
    """How a request that ends after its last hooks ends, when they leave the run as it was: the answer
    (the draft, as no hook rewrote it), the draft as the record keeps it, confidence and cache verdict
    (without the text), computed by the workflow before the hooks run."""

    final_response: str
    model_draft: ModelDraft | None = None
    confidence: float | None = None
    cache: CacheVerdict


class TerminalWrite(BaseModel):
    """The request's terminal snapshot, handed to the local activity that runs the run's last hooks — of
    after_planning on the planner's text answer, or of after_synthesis, and of every stage after it:
    ``record`` as it stands when the hooks start, ``started`` the workflow time the activity was scheduled
    at, ``parts`` the activity's stages in order (after_planning's hooks accept ``plan``), ``end`` how the
    request ends. The activity adds each invocation, the accepted plan and the end as the workflow does
    (``workflows.snapshots``)."""

    record: ExecutionRecord
    started: datetime
    parts: list[TerminalPart]
    plan: Plan | None = None
    end: TerminalEnd


class PersistRecordInput(ByReference):
    record: ExecutionRecord
    # The attempt the workflow retries the write no more after: when it fails too, the activity ends the
    # write with the typed ``RecordNotStored`` (None: the write's failures are the store's own, retried).
    final_attempt: int | None = None


class PersistRecordOutput(ByReference):
    stored_revision: int
    written: bool


HookBatchCall.model_rebuild(_types_namespace={"AcceptedPlanWrite": AcceptedPlanWrite, "TerminalWrite": TerminalWrite})
