"""The response cache store's interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CachedResponse:
    """One cached answer: its text, the variation map it was written against, when, and by which request."""

    response: str
    variation: dict[str, str]
    written_at: float
    request_id: str


class ResponseCacheStore(Protocol):
    """Entries by key. A write replaces the key's entry whole; a read sees a whole entry, never half of one."""

    async def get(self, key: str) -> CachedResponse | None: ...

    async def put(self, key: str, entry: CachedResponse) -> None: ...
