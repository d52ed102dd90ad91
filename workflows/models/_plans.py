"""Tools, plans and what executing a plan's steps produced."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, JsonValue

__all__ = [
    "MAX_PLAN_ATTEMPTS",
    "NO_STEP_CONFIDENCE",
    "ExecutionResult",
    "ModelToolCall",
    "ModelTurn",
    "Plan",
    "PlanRepair",
    "PlanStep",
    "PriorTurn",
    "RecoveredError",
    "StepResult",
    "StepStatus",
    "ToolCall",
    "ToolMetrics",
    "ToolSpec",
]

MAX_OBSERVED_ERROR_CHARS = 2_000  # of a step's error, in what after_execution hooks receive
# Attempts at planning one phase: the first, and one retry of a malformed plan the planner may correct.
MAX_PLAN_ATTEMPTS = 2


class _NamesTool:
    """The names of the tool a model's ``namespace``, ``agent`` and ``capability`` fields address: its full
    key and its name within the namespace."""

    if TYPE_CHECKING:  # the fields of the model it is mixed into
        namespace: str
        agent: str
        capability: str

    @property
    def tool_key(self) -> str:
        return f"{self.namespace}/{self.agent}/{self.capability}"

    @property
    def tool(self) -> str:
        return f"{self.agent}/{self.capability}"


class ToolSpec(_NamesTool, BaseModel):
    """A tool the planner may choose, as the workflow and validators see it."""

    namespace: str
    agent: str
    capability: str
    description: str = ""
    parameters: dict[str, JsonValue] = Field(default_factory=dict)  # JSON schema of the arguments
    read_only: bool = False
    approval_required: bool = False  # every step calling it waits for a reviewer's approval
    kind: Literal["tool", "subagent"] = "tool"  # a subagent step runs a child RequestLifecycle

    @property
    def key(self) -> str:
        return self.tool_key


class PlanStep(_NamesTool, BaseModel):
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


class ModelToolCall(BaseModel):
    """One tool call as a model wrote it: its own id, the function it named, its arguments' raw text."""

    id: str
    name: str
    arguments: str = ""


class ModelTurn(BaseModel):
    """A model's assistant turn as it was: its text and its tool calls with the model's own ids. When
    earlier steps go back to the model, this turn is replayed and each call answered by its id."""

    content: str | None = None
    tool_calls: list[ModelToolCall] = Field(default_factory=list)


class PriorTurn(BaseModel):
    """A model's turn of an earlier planning phase, and the step that ran each of its calls (by call id)."""

    turn: ModelTurn
    step_ids: dict[str, str] = Field(default_factory=dict)


class PlanRepair(BaseModel):
    """A planning attempt's malformed turn, sent back to the model on the next attempt: the turn, and what
    was wrong with each of its calls (in call order) — empty when the call was fine but not run."""

    turn: ModelTurn
    problems: list[list[str]] = Field(default_factory=list)


class Plan(BaseModel):
    """A routing plan: the steps to run for one planning phase.

    ``continue_after`` asks for another planning phase once this one's steps have run; the planner then
    sees their results. The pipeline's phase cap bounds the loop.
    """

    phase: int = 1
    steps: list[PlanStep] = Field(default_factory=list)
    rationale: str = ""
    continue_after: bool = False
    # A plan without steps whose planner answered the request in text instead of calling a tool: that text.
    # The lifecycle takes it as the answer's draft (after_synthesis and the rest run on it as on a
    # synthesizer's) instead of asking a synthesizer, unless the pipeline asks for a dedicated synthesis
    # call (``StageSettings.dedicated_synthesis``). Ignored on a plan with steps.
    answer: str | None = None


class StepStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


class RecoveredError(BaseModel):
    """The tool error an on_tool_error hook handled: the step succeeded with the hook's substitute."""

    error: str | None = None
    error_type: str | None = None
    handled_by: str


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
    # The error a handled step recovered from (the step then succeeded, with the substitute as its output).
    recovered_from: RecoveredError | None = None
    approved_in: str | None = None  # the checkpoint whose approval this call ran under
    skip_reason: str | None = None  # policy | confirmation | missing | duplicate
    cached_from: str | None = None  # the earlier step of the request whose result this identical read reuses
    skip_detail: str | None = None
    skipped_by: str | None = None  # the hook that denied the call
    modified_by: list[str] = Field(default_factory=list)
    idempotency_key: str | None = None
    started_at: datetime | None = None
    duration_ms: float | None = None

    def model_view(self) -> StepResult:
        """What a planner or synthesizer sees: the result text (which after_tool hooks such as ``redact``
        have processed), not the raw output or the raw error."""
        return self.model_copy(update={"output": None, "error": None})

    def observer_view(self) -> StepResult:
        """What an after_execution hook sees: everything but the raw output (the result text stands for it,
        so the view stays small however much the tool returned), and the error clipped."""
        error = (
            self.error
            if self.error is None or len(self.error) <= MAX_OBSERVED_ERROR_CHARS
            else (self.error[:MAX_OBSERVED_ERROR_CHARS] + "…")
        )
        return self.model_copy(update={"output": None, "error": error})


# The confidence of an answer no step contributed to.
NO_STEP_CONFIDENCE = 0.5


class ExecutionResult(BaseModel):
    """All step outcomes of a request, in plan order; what after_execution hooks observe."""

    steps: list[StepResult] = Field(default_factory=list)

    @property
    def succeeded(self) -> list[StepResult]:
        return [s for s in self.steps if s.status is StepStatus.SUCCEEDED]

    @property
    def confidence(self) -> float:
        """The answer's confidence: the share of steps that succeeded; ``NO_STEP_CONFIDENCE`` when none ran."""
        if not self.steps:
            return NO_STEP_CONFIDENCE
        return round(len(self.succeeded) / len(self.steps), 3)


class ToolMetrics(BaseModel):
    """Per-tool counts and durations of one request (calls are executions, not skipped steps)."""

    calls: int = 0
    failures: int = 0
    skipped: int = 0
    cached: int = 0  # identical read-only calls answered from an earlier step
    total_duration_ms: float = 0.0
    max_duration_ms: float = 0.0


class ToolCall(_NamesTool, BaseModel):
    """A tool call a hook may inspect or alter: the step, its tool, its (resolved) arguments."""

    step_id: str
    namespace: str
    agent: str
    capability: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    plan_phase: int = 1
    subagent: bool = False  # the step starts a sub-agent (a child RequestLifecycle)
    # Why the planner made the call: the step's own ``metadata["brief"]``, else its plan's rationale.
    brief: str = ""
