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
import json
import re
import time
from pathlib import Path

from workflows.models import RunOutcomeView

from .. import sqlite
from ..contracts import (
    PipelineContext,
    PipelineGate,
    PipelineHook,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    ShortCircuitKind,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS response_cache (
    key         TEXT PRIMARY KEY,
    response    TEXT NOT NULL,
    variation   TEXT NOT NULL,
    written_at  REAL NOT NULL,
    request_id  TEXT NOT NULL
)
"""


def normalize_request(text: str) -> str:
    """Case, surrounding punctuation and runs of whitespace do not change the cache key."""
    return re.sub(r"\s+", " ", text.strip().lower()).strip(" ?.!")


class ResponseCacheHook(PipelineHook):
    """Serve a repeated request from a local SQLite cache.

    Args:
        path: The cache database file.
        ttl_seconds: How long an entry may be served.
    """

    name = "response-cache"
    timeout_seconds = 5.0

    def __init__(self, path: str | Path, *, ttl_seconds: float = 300.0) -> None:
        self.path = Path(path)
        self.ttl_seconds = ttl_seconds
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with sqlite.connection(self.path) as db:
            db.execute(_SCHEMA)

    @staticmethod
    def _key(request: str) -> str:
        return hashlib.sha256(normalize_request(request).encode()).hexdigest()

    def before_planning_decision(self, ctx: PipelineContext, gate: PipelineGate) -> PipelineShortCircuitDecision | None:
        key = self._key(ctx.request)
        with sqlite.connection(self.path) as db:
            row = db.execute(
                "SELECT response, variation, written_at, request_id FROM response_cache WHERE key = ?", (key,)
            ).fetchone()
        fresh = row is not None and time.time() - row[2] <= self.ttl_seconds
        ctx.report_effect(
            "response_cache_lookup",
            name="Response cache lookup",
            data={"key": key[:16], "found": row is not None, "fresh": fresh},
            summary="hit" if fresh else "stale" if row else "miss",
        )
        if row is None or not fresh:
            return None
        response, variation, written_at, source_request = row
        return PipelineShortCircuitDecision(
            short_circuit=PipelineShortCircuit(
                response=response,
                source=self.name,
                metadata={"cached_at": written_at, "cached_from_request": source_request},
            ),
            kind=ShortCircuitKind.CACHE,
            cached_against=json.loads(variation),
        )

    def on_finish(self, ctx: PipelineContext, outcome: RunOutcomeView) -> None:
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
        with sqlite.connection(self.path) as db:
            db.execute(
                "INSERT OR REPLACE INTO response_cache VALUES (?, ?, ?, ?, ?)",
                (key, cache.response, json.dumps(variation, sort_keys=True), time.time(), ctx.request_id),
            )
        ctx.report_effect(
            "response_cache_write",
            name="Response cache write",
            data={"key": key[:16], "stored": True, "variation": variation},
            summary="stored",
        )
