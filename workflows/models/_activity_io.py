"""Inputs and results of the framework's own activities: planning, tool steps, synthesis, memory,
detached effects and managed leases."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from ._common import ByReference
from ._hook_calls import MemoryCandidate
from ._model_calls import ModelCall
from ._pipeline import (
    DetachedWork,
    HookBatchEntry,
    HookBatchFailure,
    HookBatchSegment,
    HookCall,
    ManagedLease,
    PipelineHookEffect,
    SnapshotAttempt,
)
from ._plans import ExecutionResult, ModelTurn, Plan, PlanRepair, PlanStep, PriorTurn, StepResult
from ._record import AcceptedPlanWrite, Checkpoint, ModelDraft, TerminalEnd

__all__ = [
    "DetachedEffectInput",
    "DetachedWorkResult",
    "EffectUpdateInput",
    "EffectUpdateSignal",
    "LeaseCall",
    "LeaseKeeperInput",
    "LeaseKeeperReport",
    "LeaseObservation",
    "LeaseRenewal",
    "PlanEnding",
    "PlanHooks",
    "PlanInput",
    "PlanOutput",
    "RecallInput",
    "RememberInput",
    "ReviewNotificationInput",
    "ReviewNotificationResult",
    "SynthesizeInput",
    "SynthesizeOutput",
    "ToolStepHooks",
    "ToolStepInput",
    "ToolStepOutput",
]


class RecallInput(ByReference):
    request_id: str
    conversation_id: str


class RememberInput(ByReference):
    request_id: str
    workflow_id: str
    candidate: MemoryCandidate
    # Who answered: ``fallback`` after a handoff from a failing primary model, whose memory is then kept
    # without asking a model to fold older exchanges into the summary.
    handled_by: Literal["primary", "fallback"] = "primary"
    # The request's model token budget left (None: no budget): what the summarizer's call may spend.
    model_tokens_left: int | None = None


class PlanEnding(BaseModel):
    """What follows a phase's after_planning hooks when its plan is the planner's text answer and they
    leave it as it is, where nothing but in-process hooks comes between it and the request's end: each
    later stage's calls as the workflow built them on a stand-in answer, as JSON without the fields that
    hold their default (the activity puts in the plan's text, ``workflows.stages.answered``), and how the
    request ends (``end``: its answer and draft put in likewise)."""

    segments: list[HookBatchSegment]
    end: TerminalEnd


class PlanHooks(BaseModel):
    """A phase's in-process planning hooks, for the planning activity to run around the planner, each as a
    local batch runs it: ``before``, the before_planning calls as the workflow built them (the first attempt
    of the request's first phase only; the planner is asked only if they let the enrichments through
    to it, ``workflows.stages.let_through``); ``after``, the after_planning calls as the workflow built them
    before the plan existed (the activity puts in the plan, the token budget the planner's calls left and the
    enrichments the before_planning hooks left); each as JSON without the fields that hold their default.
    ``write``: the accepted plan's snapshot to write after them, built on the record as it stood when planning
    started (``AcceptedPlanWrite``: ``started`` is when planning was scheduled; the activity moves it on by
    the time the planner took). ``ending``: with ``write``, the stages the activity runs on into after a
    text answer, and the request's terminal snapshot it then writes with them."""

    before: list[dict[str, JsonValue]] = Field(default_factory=list)
    after: list[dict[str, JsonValue]] = Field(default_factory=list)
    write: AcceptedPlanWrite | None = None
    ending: PlanEnding | None = None


class PlanInput(ByReference):
    defaults_omitted = True

    request: str
    request_id: str
    workflow_id: str
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    phase: int = 1
    prior_results: list[StepResult] = Field(default_factory=list)  # every step of earlier phases
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)
    max_tokens_remaining: int | None = None  # the request's model token budget left (None: no budget)
    # Each planning attempt is its own activity: a planner that can correct a malformed plan returns it
    # with what was wrong (``PlanOutput.repair``) instead of correcting it within this activity.
    attempt: int = 0  # the phase's planning attempt: 0, then one more for each malformed plan retried
    tools: list[str] | None = None  # the tool keys this attempt may use (None: every tool)
    context_text: str = ""  # added to the planner's instructions for this attempt only
    repair: PlanRepair | None = None  # the previous attempt's malformed turn, for the model to correct
    prior_turns: list[PriorTurn] = Field(default_factory=list)  # the model's own turns of earlier phases
    route: Literal["primary", "fallback"] = "primary"  # which model plans
    # Write the model's text to the request's answer stream as it arrives (a planner that can stream).
    stream: bool = False
    # With hooks, the activity runs the before_planning ones before it asks the planner and the
    # after_planning ones on the plan it produced, each as a local batch runs it. A hook's failure is
    # answered in the output, never raised: the planner is not asked again for it.
    hooks: PlanHooks | None = None


class PlanOutput(ByReference):
    """A valid plan; or, when the planner can correct itself, no plan and what the next attempt sends
    back (``repair``, with ``problems``)."""

    defaults_omitted = True

    plan: Plan | None = None
    prompt: str
    planner: str
    model_calls: list[ModelCall] = Field(default_factory=list)  # every model call the planner made
    model_turn: ModelTurn | None = None  # the model's own turn that produced the plan
    # The plan's text answer (``Plan.answer``) as the record keeps a draft: by digest and masked preview.
    draft: ModelDraft | None = None
    problems: list[str] = Field(default_factory=list)
    repair: PlanRepair | None = None
    # With ``PlanInput.hooks``: each before_planning and after_planning hook's entry as a local batch
    # records it (a stage cut short hands the rest back to the workflow), how long after the activity
    # started the first after_planning hook began (the planner's time), and what became of the accepted
    # plan's snapshot it was handed. ``planned`` False: the before_planning hooks did not let the
    # enrichments through to the planner (or the planner failed after them), so it holds only their entries
    # and the model calls made; the workflow plans the attempt itself.
    before: list[HookBatchEntry] = Field(default_factory=list)
    planned: bool = True
    after: list[HookBatchEntry] = Field(default_factory=list)
    hooks_after_ms: float = 0.0
    snapshot: SnapshotAttempt | None = None
    # With ``PlanHooks.ending``, after a text answer its hooks left as it was: the entries of each stage
    # the activity ran on into, in order, and what became of the terminal snapshot (None: not tried).
    ahead: list[list[HookBatchEntry]] = Field(default_factory=list)
    end: SnapshotAttempt | None = None


class ToolStepHooks(BaseModel):
    """A step's in-process tool hooks, for its activity to run around the tool: the before_tool calls and
    the after_tool calls (as the workflow built them before the tool ran: the activity puts in the call as
    it ran and its outcome), as JSON without the fields that hold their default. The fields every call
    of the step holds alike (the request's view, the call as planned) travel once, in ``shared``."""

    shared: dict[str, JsonValue] = Field(default_factory=dict)
    before: list[dict[str, JsonValue]] = Field(default_factory=list)
    after: list[dict[str, JsonValue]] = Field(default_factory=list)
    first_run_id: str  # with the workflow id, what the call's idempotency key is scoped to

    @classmethod
    def of(cls, before: Sequence[HookCall], after: Sequence[HookCall], first_run_id: str) -> ToolStepHooks:
        dumped = [[call.model_dump(mode="json", exclude_defaults=True) for call in calls] for calls in (before, after)]
        every = [*dumped[0], *dumped[1]]
        first, rest = (every[0], every[1:]) if every else ({}, [])
        shared = {key: value for key, value in first.items() if all(c.get(key) == value for c in rest)}
        own = [[{k: v for k, v in call.items() if k not in shared} for call in calls] for calls in dumped]
        return cls(shared=shared, before=own[0], after=own[1], first_run_id=first_run_id)

    def before_calls(self) -> list[dict[str, JsonValue]]:
        return [{**self.shared, **call} for call in self.before]

    def after_calls(self) -> list[dict[str, JsonValue]]:
        return [{**self.shared, **call} for call in self.after]


class ToolStepInput(ByReference):
    defaults_omitted = True

    step: PlanStep
    request_id: str
    idempotency_key: str
    # What the tool receives besides its arguments: the application's context (the request's metadata)
    # and the conversation the request belongs to.
    context: dict[str, JsonValue] = Field(default_factory=dict)
    conversation_id: str | None = None
    # With hooks, the activity validates the resolved arguments, runs the before_tool hooks, the tool on
    # the call they let through and the after_tool hooks on its outcome, and answers the tool's failure
    # instead of raising it (one attempt: the workflow retries the tool alone).
    hooks: ToolStepHooks | None = None


class ToolStepOutput(ByReference):
    defaults_omitted = True

    output: JsonValue = None
    # The result text the tool formatted from its output (None: the workflow renders the output as JSON),
    # and why formatting failed when it did (the output is kept; the text says the tool completed).
    text: str | None = None
    format_error: str | None = None
    # With ``ToolStepInput.hooks``: each hook's entry as a local batch records it (a stage cut short hands
    # the rest back to the workflow); whether the tool was withheld (invalid arguments, or before_tool hooks
    # that handed the call back), on which arguments it ran, in how long; why the resolved arguments were
    # invalid; and the tool's failure, answered rather than raised.
    before: list[HookBatchEntry] = Field(default_factory=list)
    after: list[HookBatchEntry] = Field(default_factory=list)
    withheld: bool = False
    arguments: dict[str, JsonValue] | None = None
    duration_ms: float = 0.0
    problems: list[str] = Field(default_factory=list)
    error: HookBatchFailure | None = None
    error_retryable: bool = False


class SynthesizeInput(ByReference):
    defaults_omitted = True

    request: str
    request_id: str
    plan: Plan
    execution: ExecutionResult  # step results as a model reads them: result text, no raw output
    enrichments: dict[str, JsonValue] = Field(default_factory=dict)
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)
    max_tokens_remaining: int | None = None  # the request's model token budget left (None: no budget)
    stream: bool = False  # publish the answer to the request's answer stream while it is written
    route: Literal["primary", "fallback"] = "primary"  # which model writes the answer


class SynthesizeOutput(ByReference):
    defaults_omitted = True

    response: str
    confidence: float = Field(ge=0.0, le=1.0)
    draft: ModelDraft | None = None  # set by the synthesize activity: what the record keeps of ``response``
    model_calls: list[ModelCall] = Field(default_factory=list)  # every model call the synthesizer made


class DetachedEffectInput(ByReference):
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
    ui_shows_text: bool = True  # the request's ``PipelineManifest.ui_shows_text``: its outcome in the details


class ReviewNotificationInput(ByReference):
    """The input of a ``ReviewNotification`` child workflow: a checkpoint that opened, announced to the
    reviewers' webhook. ``request`` is the start of what was asked (the activity masks and bounds it)."""

    parent_workflow_id: str
    parent_run_id: str
    request_id: str
    request: str
    checkpoint: Checkpoint
    reviewers: list[str] = Field(default_factory=list)
    effect: PipelineHookEffect  # as announced (pending)
    update_token: str = ""  # as for DetachedEffectInput: only this child's update is taken as the outcome
    timeout_seconds: float = 30.0  # one delivery attempt
    max_attempts: int = 8  # retried 1 s, 2 s, 4 s … apart (at most a minute)
    heartbeat_timeout_seconds: float = 5.0
    max_worker_losses: int = 5


class ReviewNotificationResult(ByReference):
    """What the reviewers' webhook answered."""

    http_status: int
    attempt: int


class DetachedWorkResult(ByReference):
    """What a hook's detached work reports back: the effect's new data and summary."""

    data: JsonValue = None
    summary: str = ""


class EffectUpdateInput(ByReference):
    workflow_id: str
    run_id: str
    effect: PipelineHookEffect


class EffectUpdateSignal(BaseModel):
    """Signal ``effect_update``: a ``DetachedEffect`` child reporting its effect's terminal state."""

    model_config = ConfigDict(extra="forbid")
    effect: PipelineHookEffect
    token: str = Field(max_length=64)


class LeaseCall(ByReference):
    """The input of the ``renew_lease`` and ``release_lease`` activities."""

    lease: ManagedLease
    request_id: str
    workflow_id: str
    ordinal: int = 0  # renewals already submitted for this lease (the keeper continues the count)
    exit: str | None = None  # for the release: how the request ended (completed, stopped, error, cancelled)


class LeaseKeeperReport(ByReference):
    """What a lease's keeper did until it was stopped: renewals submitted, returned, failed."""

    submitted: int = 0
    renewed: int = 0
    errors: int = 0
    last_error: str | None = None
    expires_at: datetime | None = None

    def counted(self, renewal: LeaseRenewal) -> LeaseKeeperReport:
        """These counts with one more renewal's outcome (its submission already counted)."""
        if renewal.error is not None:
            return self.model_copy(update={"errors": self.errors + 1, "last_error": renewal.error})
        return self.model_copy(
            update={"renewed": self.renewed + 1, "expires_at": renewal.expires_at or self.expires_at}
        )


class LeaseKeeperInput(ByReference):
    """The input of a ``LeaseKeeper`` child: the lease to keep (with the request it belongs to), the counts
    so far (carried across its continue-as-new), when its first renewal falls due, and the dispatch
    bounds of its renewal activities."""

    call: LeaseCall
    report: LeaseKeeperReport = Field(default_factory=LeaseKeeperReport)
    # Seconds until the first renewal: 0 at once, what is left of the interval the request was timing when
    # it handed the lease over; None a whole renew interval (after a continue-as-new).
    first_renewal_after_seconds: float | None = Field(default=0.0, ge=0)
    heartbeat_timeout_seconds: float = 5.0
    max_worker_losses: int = 5
    renewals_per_run: int = Field(default=500, ge=1)  # then the keeper continues as new (about 4,500 events)


class LeaseRenewal(ByReference):
    """One renewal (``renew_lease``): the expiry the provider reported, or the error it raised."""

    expires_at: datetime | None = None
    error: str | None = None


class LeaseObservation(ByReference):
    """What a hook's ``renew_lease`` / ``release_lease`` observed from its provider (not proof of
    durability). Raise from those methods to report a provider error instead."""

    data: JsonValue = None
    summary: str = ""
    expires_at: datetime | None = None  # for a renewal: the expiry the provider reported
