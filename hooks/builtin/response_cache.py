"""``response-cache``: a before_planning cache decision, and a write when the run has finished.

The entry stores the variation map as it was when the answer was written (``ctx.gate.cache_vary()`` at
write time). On lookup the hook returns that stored map as ``cached_against``; the framework serves the
answer only if cache reads are enabled for the request and every reserved dimension still matches.
The hook does not second-guess the gate itself: the framework's check is the one that is recorded.

It writes in ``on_finish``, and only what the workflow declared cacheable (``outcome.cache``): a
completed run whose executed steps all succeeded and called ``read_only`` tools, with no checkpoint,
no stop and no failed, timed-out or lost hook invocation. So a cached "Message sent" never stands in
for a message nobody sent, and an answer whose redaction did not run is never served again. The text
stored is the answer after every after_synthesis hook (a served answer skips them), before after_answer
(which runs on a served answer too).
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

from storage.responses import CachedResponse, ResponseCacheStore, SQLiteResponseCacheStore
from workflows.models import RunOutcomeView

from ..contracts import (
    PipelineContext,
    PipelineGate,
    PipelineHook,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    ShortCircuitKind,
)


def normalize_request(text: str) -> str:
    """Case, surrounding punctuation and runs of whitespace do not change the cache key."""
    return re.sub(r"\s+", " ", text.strip().lower()).strip(" ?.!")


class ResponseCacheHook(PipelineHook):
    """Serve a repeated request from the response cache.

    Args:
        store: Where the entries are: a ``ResponseCacheStore`` (PostgreSQL for workers on several
            machines), or the path of a SQLite file.
        ttl_seconds: How long an entry may be served.
    """

    name = "response-cache"
    timeout_seconds = 5.0

    def __init__(self, store: ResponseCacheStore | str | Path, *, ttl_seconds: float = 300.0) -> None:
        self.store = SQLiteResponseCacheStore(store) if isinstance(store, str | Path) else store
        self.ttl_seconds = ttl_seconds

    @staticmethod
    def _key(request: str) -> str:
        return hashlib.sha256(normalize_request(request).encode()).hexdigest()

    async def before_planning_decision(
        self, ctx: PipelineContext, gate: PipelineGate
    ) -> PipelineShortCircuitDecision | None:
        key = self._key(ctx.request)
        entry = await self.store.get(key)
        fresh = entry is not None and time.time() - entry.written_at <= self.ttl_seconds
        ctx.report_effect(
            "response_cache_lookup",
            name="Response cache lookup",
            data={"key": key[:16], "found": entry is not None, "fresh": fresh},
            summary="hit" if fresh else "stale" if entry else "miss",
        )
        if entry is None or not fresh:
            return None
        return PipelineShortCircuitDecision(
            short_circuit=PipelineShortCircuit(
                response=entry.response,
                source=self.name,
                metadata={"cached_at": entry.written_at, "cached_from_request": entry.request_id},
            ),
            kind=ShortCircuitKind.CACHE,
            cached_against=entry.variation,
        )

    async def on_finish(self, ctx: PipelineContext, outcome: RunOutcomeView) -> None:
        cache = outcome.cache
        key = self._key(ctx.request)
        if not cache.cacheable or cache.response is None:
            ctx.report_effect(
                "response_cache_write",
                name="Response cache write",
                data={"key": key[:16], "stored": False, "reasons": cache.reasons[:5]},
                summary="not stored: " + (cache.reasons[0] if cache.reasons else "not cacheable"),
            )
            return
        variation = ctx.gate.cache_vary()
        await self.store.put(key, CachedResponse(cache.response, variation, time.time(), ctx.request_id))
        ctx.report_effect(
            "response_cache_write",
            name="Response cache write",
            data={"key": key[:16], "stored": True, "variation": variation},
            summary="stored",
        )
