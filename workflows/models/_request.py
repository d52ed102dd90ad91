"""The input and result of one ``RequestLifecycle`` execution, and how it ended."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from ._common import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_METADATA_BYTES,
    MAX_REQUEST_CHARS,
    METADATA_MAX_MODEL_TOKENS,
    REQUEST_ID_PATTERN,
    json_size,
)

__all__ = [
    "LOOP_DEPTH_EXCEEDED",
    "MAX_SUBAGENT_DEPTH",
    "METADATA_PARENT_WORKFLOW",
    "METADATA_SUBAGENT_DEPTH",
    "Diagnostic",
    "RequestError",
    "RequestInput",
    "RequestResult",
    "RequestStatus",
    "ShortCircuitInfo",
    "StepSummary",
    "StopInfo",
    "subagent_depth",
]


class RequestInput(BaseModel):
    """The input of one ``RequestLifecycle`` execution."""

    model_config = ConfigDict(extra="forbid")
    invalid_payload_type: ClassVar[str] = "InvalidRequest"

    request: str = Field(min_length=1, max_length=MAX_REQUEST_CHARS)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    request_id: str | None = Field(default=None, pattern=REQUEST_ID_PATTERN)
    # The principal the request is made for (as the starting service authenticated them): a reviewer
    # may not approve a request of their own unless the pipeline allows it.
    requested_by: str | None = Field(default=None, min_length=1, max_length=128)
    # Publish the answer to the request's answer stream while the model writes it (when the pipeline
    # allows streaming and its synthesizer can stream); the final answer is published either way.
    stream_answer: bool = False
    # Instructions for this request (a system prompt of its own): they follow the pipeline's, and
    # before_run hooks see both and may rewrite them.
    instructions: str | None = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)

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
        budget = value.get(METADATA_MAX_MODEL_TOKENS)
        if METADATA_MAX_MODEL_TOKENS in value and (type(budget) is not int or budget <= 0):
            raise ValueError(f"metadata.{METADATA_MAX_MODEL_TOKENS} must be a positive integer, not {budget!r}")
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


class RequestStatus(StrEnum):
    RUNNING = "running"
    SUSPENDED = "suspended"  # waiting at a checkpoint
    SUCCEEDED = "succeeded"
    STOPPED = "stopped"  # a hook ended the run with its own answer
    FAILED = "failed"
    CANCELLED = "cancelled"


class RequestError(BaseModel):
    type: str
    message: str
    details: dict[str, JsonValue] = Field(default_factory=dict)


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
