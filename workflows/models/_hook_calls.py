"""The values particular to each stage that hooks see and return (views, verdicts, patches), in lifecycle
order; each stage's call and outcome envelopes are declared with the stage (``workflows.stages``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from ._request import Diagnostic, StepSummary, StopInfo

__all__ = [
    "AnswerView",
    "CacheVerdict",
    "ErrorOrigin",
    "FallbackRequest",
    "MemoryCandidate",
    "MemoryExchange",
    "RecalledMemory",
    "RecallPatch",
    "RecallView",
    "RunErrorView",
    "RunOutcomeView",
    "RunPatch",
    "RunView",
    "SkipMemory",
    "SkipReason",
    "Stop",
    "ToolDecision",
    "ToolErrorResolution",
    "ToolOutcomeView",
]

# --------------------------------------------------------------------------------------------------
# before_run: rewrite the ask, instructions or facts, or stop the run
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


# --------------------------------------------------------------------------------------------------
# after_recall: a transient view of the conversation's memory for this run
# --------------------------------------------------------------------------------------------------


class MemoryExchange(BaseModel):
    """One remembered exchange of a conversation: what was asked and what was answered."""

    request: str
    answer: str


class RecalledMemory(BaseModel):
    """A conversation's memory as a run loads it: the summary of its older exchanges and its latest
    exchanges, oldest first."""

    summary: str = ""
    exchanges: list[MemoryExchange] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.summary and not self.exchanges


class RecallView(BaseModel):
    """What after_recall sees: the conversation and its memory as loaded (or as earlier hooks left it)."""

    conversation_id: str
    memory: RecalledMemory


class RecallPatch(BaseModel):
    """An after_recall rewrite: the memory this run plans with instead. It is a transient view — what the
    run saves afterwards starts from the memory as loaded, never from this."""

    memory: RecalledMemory


# --------------------------------------------------------------------------------------------------
# before_fallback: what the fallback model is asked, when the primary model failed
# --------------------------------------------------------------------------------------------------


class FallbackRequest(BaseModel):
    """What before_fallback sees: a copy of what the fallback model will be asked. Return a changed copy
    (redact the ask, drop facts) to replace what the fallback receives — the record, the steps and what
    the run remembers keep the original — or ``Stop``. ``stage``, ``phase``, ``reason`` and the models
    describe the handoff and cannot be replaced."""

    stage: Literal["planning", "synthesis"]
    phase: int | None = None
    ask: str
    instructions: str = ""
    facts: dict[str, JsonValue] = Field(default_factory=dict)
    reason: str  # why the primary model failed (its error), preserved whatever a hook returns
    primary_model: str | None = None
    fallback_model: str | None = None


# --------------------------------------------------------------------------------------------------
# Tool-call stages: before_tool (allow / modify / deny / stop), on_tool_error, after_tool
# --------------------------------------------------------------------------------------------------


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


# Why a step was skipped: a hook denied it (``policy``, with the hook as ``extension``), a reviewer declined
# it (``confirmation``), an input it needed was missing (``missing``), or it repeats a write the request
# already made (``duplicate``).
SkipReason = Literal["policy", "confirmation", "missing", "duplicate"]


class ToolOutcomeView(BaseModel):
    """What an after_tool hook sees, one of:

    - ``executed``: the tool ran; ``output`` is its raw output (seen only here, by hooks).
    - ``cached``: the same read-only call with the same arguments already succeeded in this request;
      ``from_step`` is that step, whose result this one reuses. No raw output exists.
    - ``skipped``: not run; ``reason`` says why (``SkipReason``), ``extension`` names a denying hook.
    - ``failed``: the tool raised; ``error`` says what, and the planner may plan around it.

    ``result`` is the current text (what the model reads). A tool error an on_tool_error hook handled is
    ``executed`` with the substitute as its output, and ``recovered_from`` says what failed."""

    status: Literal["executed", "cached", "skipped", "failed"]
    output: JsonValue = None
    reason: SkipReason | None = None
    extension: str | None = None
    error: str | None = None
    result: str = ""
    recovered_from: str | None = None
    from_step: str | None = None


class ToolErrorResolution(BaseModel):
    """An on_tool_error answer: ``handled`` substitutes ``result`` for the error."""

    handled: bool = False
    result: str = ""


# --------------------------------------------------------------------------------------------------
# after_answer: rewrite the final answer, or stop
# --------------------------------------------------------------------------------------------------


class AnswerView(BaseModel):
    """What after_answer sees: the answer (never empty: after_answer runs once there is one), how it was
    reached (the pipeline, or a short-circuit), the model that answered (``answered_by``: the primary, or
    the fallback after a handoff; None when no model step ran), whether it is a best-effort answer (the run
    hit its phase cap before the planner was done: it is not remembered) and the steps."""

    text: str
    handled_by: Literal["pipeline", "short_circuit"]
    steps: list[StepSummary] = Field(default_factory=list)
    answered_by: Literal["primary", "fallback"] | None = None
    best_effort: bool = False


# --------------------------------------------------------------------------------------------------
# before_remember: replace what the run remembers, or skip it
# --------------------------------------------------------------------------------------------------


class MemoryCandidate(BaseModel):
    """What a completed run would remember for its conversation."""

    conversation_id: str
    request: str
    answer: str
    facts: dict[str, JsonValue] = Field(default_factory=dict)


class SkipMemory(BaseModel):
    """before_remember: do not save; later hooks cannot reverse it."""

    reason: str = ""


# --------------------------------------------------------------------------------------------------
# on_error: observe the failure
# --------------------------------------------------------------------------------------------------


ErrorOrigin = Literal[
    "extension",  # a hook failed where failing ends the run, or broke its stage's contract
    "model",  # the planner or synthesizer (its model) failed
    "memory",  # loading or saving the conversation's memory failed
    "confirmation",  # a reviewer rejected a checkpoint, or it expired
    "fallback",  # the fallback model failed after the primary had
    "formatter",  # a tool's result could not be formatted (its output is kept)
    "event",  # a declared hook of a gateway event failed
    "config",  # the pipeline or a setting could not be used
    "budget",  # a token or prompt budget would be exceeded
    "tool",  # a tool failed and no on_tool_error hook handled it
    "harness",  # the framework or its infrastructure (a lost worker, an oversized payload, ...)
    "cancelled",  # the run was cancelled
]


class RunErrorView(BaseModel):
    """What on_error sees: the original error and where it came from (``origin``). The error that ends a
    run is observed once, before on_finish; an error the run recovered from (``recovered``: a failed
    memory save, a tool failure the planner saw, a formatter or event failure) is observed too, and the run
    goes on to complete."""

    origin: ErrorOrigin
    type: str
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)
    steps: list[StepSummary] = Field(default_factory=list)
    recovered: bool = False


# --------------------------------------------------------------------------------------------------
# on_finish: observe the outcome (and whether its answer may be cached)
# --------------------------------------------------------------------------------------------------


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
    """What on_finish sees, once per hook, for every outcome."""

    status: Literal["completed", "stopped", "error", "cancelled"]
    response: str | None = None
    stopped: StopInfo | None = None
    error: RunErrorView | None = None
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    cache: CacheVerdict = Field(default_factory=CacheVerdict)
