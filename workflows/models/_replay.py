"""Policy replay: what a candidate pipeline's decision stages would have decided on recorded requests, and
the messages of the ``PolicyReplay`` workflow that runs it over a window of records."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field, JsonValue

from ._pipeline import Stage

__all__ = [
    "DECISION_CHANGES",
    "FindingKind",
    "ListRecordsInput",
    "ListRecordsOutput",
    "PolicyReplayInput",
    "PolicyReplayResult",
    "ReplayBatchInput",
    "ReplayBatchOutput",
    "ReplayFinding",
    "ReplayProgress",
    "ReplayWindow",
    "RequestReplay",
]


class FindingKind(StrEnum):
    """How the candidate's decision differs from the recorded one (or why it cannot be compared)."""

    NEWLY_BLOCKED = "newly_blocked"  # a call or run the recorded pipeline let through is denied or stopped
    NEWLY_ALLOWED = "newly_allowed"  # a call the recorded pipeline denied would run
    ARGUMENTS_CHANGED = "arguments_changed"  # a call would run with other arguments
    NEWLY_NEEDS_APPROVAL = "newly_needs_approval"  # a call would wait for a reviewer
    NO_LONGER_NEEDS_APPROVAL = "no_longer_needs_approval"
    REQUIRED_GATE_NOW_REJECTS = "required_gate_now_rejects"  # the required after_planning hook refuses the plan
    SHORT_CIRCUIT_CHANGED = "short_circuit_changed"  # answered before planning, or no longer
    HOOK_FAILED = "hook_failed"  # a candidate hook raised or returned what its stage refuses
    NOT_REPLAYED = "not_replayed"  # a hook that calls out and is not shadow-safe, or that opted out
    DEPENDS_ON_UNRECORDED = "depends_on_unrecorded"  # the decision rests on state the record does not hold


# What a reviewer acts on first; the others explain.
DECISION_CHANGES = (
    FindingKind.NEWLY_BLOCKED,
    FindingKind.NEWLY_ALLOWED,
    FindingKind.ARGUMENTS_CHANGED,
    FindingKind.NEWLY_NEEDS_APPROVAL,
    FindingKind.NO_LONGER_NEEDS_APPROVAL,
    FindingKind.REQUIRED_GATE_NOW_REJECTS,
    FindingKind.SHORT_CIRCUIT_CHANGED,
)


class ReplayFinding(BaseModel):
    """One difference between the recorded decision and the candidate's, at one stage (and call)."""

    kind: FindingKind
    stage: Stage | None = None
    hook: str | None = None  # the candidate hook that decided (or failed, or was not replayed)
    tool: str | None = None  # agent/capability, for a call
    step_id: str | None = None
    phase: int | None = None
    recorded: str = ""  # the recorded decision, in words
    candidate: str = ""  # the candidate's decision, in words
    detail: str = ""
    recorded_arguments: dict[str, JsonValue] | None = None
    candidate_arguments: dict[str, JsonValue] | None = None


class RequestReplay(BaseModel):
    """One recorded request replayed: who it was for and every finding (none: the candidate agrees)."""

    request_id: str
    workflow_id: str
    run_id: str
    tenant: str | None = None
    agent: str | None = None
    started_at: datetime
    status: str  # the recorded request's status
    calls: int = 0  # recorded calls whose before_tool chain was replayed
    findings: list[ReplayFinding] = Field(default_factory=list)

    def kinds(self) -> set[FindingKind]:
        return {f.kind for f in self.findings}


class ReplayWindow(BaseModel):
    """Which records a replay reads: started in [since, until), of a tenant and an agent, at most ``limit``."""

    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    agent: str | None = None
    limit: int | None = Field(default=None, ge=1)


class ListRecordsInput(BaseModel):
    """List the window's records into the report store, ``batch_size`` keys a batch."""

    replay_id: str
    window: ReplayWindow
    batch_size: int


class ListRecordsOutput(BaseModel):
    total: int
    batches: int


class PolicyReplayInput(BaseModel):
    """Workflow ``PolicyReplay``: replay ``pipeline`` (``module:factory``) over the records of ``window``.
    ``replay_id`` names the report's rows. ``listed`` and the counts carry a continued run's place: the
    record keys themselves stay in the report store, never in history."""

    replay_id: str
    pipeline: str
    window: ReplayWindow = Field(default_factory=ReplayWindow)
    batch_size: int = Field(default=100, ge=1, le=1000)
    parallel_batches: int = Field(default=4, ge=1, le=64)
    listed: ListRecordsOutput | None = None
    next_batch: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    replayed: int = 0
    changed: int = 0


class ReplayBatchInput(BaseModel):
    replay_id: str
    pipeline: str
    batch: int


class ReplayBatchOutput(BaseModel):
    """A batch's totals; its requests are in the report store under (replay id, batch)."""

    batch: int
    replayed: int
    changed: int  # requests with at least one finding
    counts: dict[str, int] = Field(default_factory=dict)  # findings by kind


class ReplayProgress(BaseModel):
    """Query ``progress``."""

    replay_id: str
    total: int | None = None  # None until the records are listed
    replayed: int = 0
    changed: int = 0
    batches_done: int = 0
    batches: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    done: bool = False


class PolicyReplayResult(BaseModel):
    replay_id: str
    pipeline: str
    total: int
    replayed: int
    changed: int
    counts: dict[str, int] = Field(default_factory=dict)
