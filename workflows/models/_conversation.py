"""What a conversation and its turns exchange: the turn a client submits, the queue the conversation
keeps, a directly started request's claim of a turn and its release."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

__all__ = [
    "CONVERSATION_PREFIX",
    "DONE_TURNS_KEPT",
    "INVALID_TURN",
    "MAX_TURN_MESSAGE_CHARS",
    "ClaimTurnInput",
    "ConversationInput",
    "ConversationResult",
    "ConversationTurns",
    "TurnAccepted",
    "TurnClaim",
    "TurnEntry",
    "TurnOpenInput",
    "TurnRelease",
    "TurnRequest",
    "TurnStatus",
    "conversation_id_problem",
    "conversation_workflow_id",
    "turn_workflow_id",
]

CONVERSATION_PREFIX = "conversation-"
MAX_TURN_MESSAGE_CHARS = 16_000
MAX_CONVERSATION_ID_CHARS = 200
# The latest finished turns the ``turns`` query lists (older ones are in the turns' own histories).
DONE_TURNS_KEPT = 20
INVALID_TURN = "InvalidTurn"

TurnStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "stopped", "gone"]


def conversation_workflow_id(conversation_id: str) -> str:
    """The workflow id of the conversation ``conversation_id`` (``conversation-<id>``)."""
    return f"{CONVERSATION_PREFIX}{conversation_id}"


def turn_workflow_id(conversation_id: str, turn: int) -> str:
    """The workflow id of a submitted turn: ``conversation-<id>/turn-<n>``."""
    return f"{conversation_workflow_id(conversation_id)}/turn-{turn}"


def conversation_id_problem(conversation_id: object) -> str | None:
    """Why ``conversation_id`` cannot name a conversation, or None."""
    if not isinstance(conversation_id, str) or not conversation_id.strip():
        return "a conversation id is a non-empty string"
    if len(conversation_id) > MAX_CONVERSATION_ID_CHARS:
        return f"a conversation id has at most {MAX_CONVERSATION_ID_CHARS} characters"
    if "/" in conversation_id or any(c.isspace() for c in conversation_id):
        return "a conversation id has no '/' and no whitespace"
    return None


class TurnRequest(BaseModel):
    """A turn a client submits (the ``submit_turn`` update): the user's message and the request's
    metadata (its ``conversation_id`` is the conversation's, whatever is given)."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(min_length=1, max_length=MAX_TURN_MESSAGE_CHARS)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    stream_answer: bool = False


class TurnAccepted(BaseModel):
    """The conversation accepted a turn: it runs as the request ``workflow_id`` when its turn comes."""

    conversation_id: str
    turn: int
    workflow_id: str
    queued_behind: int = 0  # turns ahead of it (running or queued) when it was accepted


class TurnEntry(BaseModel):
    """One turn as the conversation keeps it. ``claimed`` turns are requests started directly that run
    themselves once granted (``turn`` 0: the numbers name the conversation's own child requests); the
    others the conversation starts as its child requests."""

    turn: int
    workflow_id: str
    run_id: str | None = None
    claimed: bool = False
    status: TurnStatus = "queued"
    message: str = ""  # kept only while queued: a started turn's ask is in its own history
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    stream_answer: bool = False
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.workflow_id}@{self.run_id or ''}"


class ConversationTurns(BaseModel):
    """The ``turns`` query: the latest finished turns, the running one and those queued, in order."""

    conversation_id: str
    done: list[TurnEntry] = Field(default_factory=list)
    running: TurnEntry | None = None
    queued: list[TurnEntry] = Field(default_factory=list)
    turns_submitted: int = 0
    runs: int = 1  # runs of the conversation's chain (continue-as-new)


class ConversationInput(BaseModel):
    """How a conversation starts, or continues as new: what it carries across is its queue (in order),
    its turn counter, its latest finished turns and where its memory lives."""

    conversation_id: str
    next_turn: int = 1
    queue: list[TurnEntry] = Field(default_factory=list)
    done: list[TurnEntry] = Field(default_factory=list)
    # The key of the conversation's memory in the memory store (its saved summary and exchanges).
    memory_key: str | None = None
    idle_seconds: float = Field(default=900.0, gt=0)
    turns_per_run: int = Field(default=100, ge=1)
    # How often a granted claim whose request has not released it is checked for a request that ended
    # without saying so (terminated, reset).
    claim_check_seconds: float = Field(default=60.0, gt=0)
    runs: int = 1
    # Whether the turn counter is known (a continuation carries it; a new chain asks for it first).
    resumed: bool = False


class ConversationResult(BaseModel):
    """How a conversation's chain ended: idle, with what it ran."""

    conversation_id: str
    turns_submitted: int
    ended: Literal["idle"] = "idle"


class TurnClaim(BaseModel):
    """A request started directly with ``metadata.conversation_id`` asks for its turn (signal ``claim``)."""

    workflow_id: str
    run_id: str


class TurnRelease(BaseModel):
    """A request gives its turn back (signal ``release``), with how it ended."""

    workflow_id: str
    run_id: str
    status: TurnStatus = "succeeded"


class ClaimTurnInput(BaseModel):
    """The activity that delivers a claim, starting the conversation if it is not running."""

    conversation_id: str
    workflow_id: str
    run_id: str
    task_queue: str
    search_attributes: bool = True


class TurnOpenInput(BaseModel):
    workflow_id: str
    run_id: str
