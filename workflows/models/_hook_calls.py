"""The values particular to each stage that hooks see and return (views, verdicts, patches), in lifecycle
order; each stage's call and outcome envelopes are declared with the stage (``workflows.stages``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from ._request import Diagnostic, StepSummary, StopInfo

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


class ToolOutcomeView(BaseModel):
    """What an after_tool hook sees: ``executed`` (with the raw output), ``skipped`` (reason policy or
    missing, and the hook that denied) or ``failed`` (the error); ``result`` is the current text. A tool
    error an on_tool_error hook handled is ``executed`` with the substitute as its output, and
    ``recovered_from`` says what failed."""

    status: Literal["executed", "skipped", "failed"]
    output: JsonValue = None
    reason: str | None = None
    extension: str | None = None
    error: str | None = None
    result: str = ""
    recovered_from: str | None = None


class ToolErrorResolution(BaseModel):
    """An on_tool_error answer: ``handled`` substitutes ``result`` for the error."""

    handled: bool = False
    result: str = ""


# --------------------------------------------------------------------------------------------------
# after_answer: rewrite the final answer, or stop
# --------------------------------------------------------------------------------------------------


class AnswerView(BaseModel):
    text: str
    handled_by: Literal["pipeline", "short_circuit"]
    steps: list[StepSummary] = Field(default_factory=list)


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


class RunErrorView(BaseModel):
    """What on_error sees: the original error and where it came from."""

    origin: str  # extension, planner, synthesizer, hook, confirmation, config, infrastructure, cancelled, harness
    type: str
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)
    steps: list[StepSummary] = Field(default_factory=list)


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
