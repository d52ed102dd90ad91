"""The memory contracts the built-in memory and coordination hooks are written against.

A backend implements any of four facets — episodic events, per-user facts, knowledge fragments, the
activity coordinator's signal registry — and the builders wire the hooks for the facets configured. The
embedded default, :class:`activities.memory.MemoryStore`, implements all four (and conversation memory)
in one SQLite file.

Backends **fail open**: an internal failure is logged and returned as a neutral result —
``ReadResult(status="read_failed")`` or ``WriteResult(provider_call_status="error")`` — never raised into
the request. Results say what the provider call returned, not that a write is durably committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field, JsonValue

from workflows.models import MemoryCandidate

T = TypeVar("T")

__all__ = [
    "ActivityCoordinator",
    "ActivitySignal",
    "ConversationHistorySource",
    "EpisodicEvent",
    "EpisodicMemory",
    "KnowledgeFragment",
    "KnowledgeStore",
    "MemoryBackends",
    "MemoryModel",
    "ReadResult",
    "UserFact",
    "UserMemory",
    "WriteResult",
]


class EpisodicEvent(BaseModel):
    """One thing an agent did, shared across requests of its domain. ``occurred_at`` is when it happened
    (the step's start); ``recorded_at`` is when the backend stored it (assigned by the backend)."""

    event_id: str
    agent_domain: str
    request_id: str
    step_id: str | None = None
    tool: str | None = None
    entities: list[str] = Field(default_factory=list)
    outcome: str  # succeeded, failed, skipped
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    summary: str
    occurred_at: datetime
    recorded_at: datetime | None = None


class UserFact(BaseModel):
    """A durable fact about one user (``key`` is e.g. ``name``, ``home_city``, ``preference``)."""

    user_id: str
    key: str
    value: str
    source_request_id: str | None = None
    recorded_at: datetime | None = None


class KnowledgeFragment(BaseModel):
    """A reusable piece of knowledge extracted from a request and its answer."""

    fragment_id: str
    agent_domain: str
    title: str
    text: str
    entities: list[str] = Field(default_factory=list)
    source_request_id: str | None = None
    recorded_at: datetime | None = None


class ActivitySignal(BaseModel):
    """What an agent is working on right now, visible to other agents until ``expires_at``."""

    signal_id: str
    agent: str
    activity: str
    entities: list[str] = Field(default_factory=list)
    request_id: str
    announced_at: datetime | None = None
    expires_at: datetime | None = None
    renewals: int = 0


@dataclass
class ReadResult(Generic[T]):
    """A read as the provider reported it: ``read_succeeded`` with items, or ``read_failed`` with the error
    (and no items) — the caller carries on either way."""

    status: Literal["read_succeeded", "read_failed"]
    items: list[T] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "read_succeeded"


@dataclass
class WriteResult:
    """A submitted write as the provider reported it: the call ``returned`` or ended in an ``error``.
    ``detail`` carries what it observed (assigned ids, an expiry, whether a row existed)."""

    provider_call_status: Literal["returned", "error"]
    error: str | None = None
    detail: dict[str, JsonValue] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.provider_call_status == "returned"


class EpisodicMemory(Protocol):
    async def record_events(self, events: Sequence[EpisodicEvent]) -> WriteResult:
        """Submit events; an event id already stored is kept as it is (retries never duplicate)."""
        ...

    async def recent_events(
        self, agent_domain: str, *, entities: Sequence[str], since: datetime, limit: int
    ) -> ReadResult[EpisodicEvent]:
        """Events of the domain that occurred since ``since``: those sharing an entity first, then the most
        recent, at most ``limit``."""
        ...


class UserMemory(Protocol):
    async def remember_facts(self, facts: Sequence[UserFact]) -> WriteResult:
        """Store facts; a later value of the same (user, key) replaces the earlier one."""
        ...

    async def user_facts(self, user_id: str, *, limit: int) -> ReadResult[UserFact]: ...


class KnowledgeStore(Protocol):
    async def store_fragment(self, fragment: KnowledgeFragment) -> WriteResult: ...

    async def related_fragments(
        self, agent_domain: str, *, entities: Sequence[str], limit: int
    ) -> ReadResult[KnowledgeFragment]: ...


class ActivityCoordinator(Protocol):
    """A shared registry of signals with a TTL: who is working on what, right now."""

    async def announce(self, signal: ActivitySignal, *, ttl_seconds: float) -> WriteResult:
        """Create or replace the signal; ``detail["expires_at"]`` is the expiry the registry set."""
        ...

    async def renew(self, signal_id: str, *, ttl_seconds: float) -> WriteResult:
        """Push the expiry of an existing signal; never recreates a removed one (``detail["found"]``)."""
        ...

    async def remove(self, signal_id: str) -> WriteResult:
        """Remove the signal (``detail["removed"]`` says whether one existed)."""
        ...

    async def active(self) -> ReadResult[ActivitySignal]:
        """Every signal that has not expired."""
        ...


class ConversationHistorySource(Protocol):
    """Where remembered exchanges are read from (the ``remember`` stage writes them)."""

    async def recent(self, conversation_id: str, limit: int = 10) -> list[MemoryCandidate]: ...


class MemoryModel(Protocol):
    """The language model the memory hooks ask for summaries and extractions. ``complete`` takes a prompt
    and returns the model's text; the hooks parse it and fall back to heuristics when it is unusable."""

    async def complete(self, prompt: str) -> str: ...


@dataclass
class MemoryBackends:
    """The configured memory facets; the builders wire hooks only for the ones that are set."""

    episodic: EpisodicMemory | None = None
    users: UserMemory | None = None
    knowledge: KnowledgeStore | None = None
    coordinator: ActivityCoordinator | None = None

    @classmethod
    def all(cls, backend: Any) -> MemoryBackends:
        """One backend that implements every facet (such as ``MemoryStore``)."""
        return cls(episodic=backend, users=backend, knowledge=backend, coordinator=backend)
