"""``knowledge-context``: before_planning retrieval from a small local knowledge file into ``rag_context``.

The smallest realistic enrichment hook: read, score, write the well-known key so the
default prompt builder renders it inside ``<agent_memory>``. It appends to any ``rag_context`` already
there (from request metadata or an earlier hook) instead of replacing it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, Field

from workflows.models import ENRICHMENT_RAG_CONTEXT

from ..contracts import PipelineContext, PipelineHook


class KnowledgeEntry(BaseModel):
    id: str
    keywords: list[str] = Field(min_length=1)
    text: str = Field(min_length=1)


def _tokens(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class KnowledgeContextHook(PipelineHook):
    """Inject the best-matching entries of a JSON knowledge file.

    Args:
        path: A JSON list of ``{"id", "keywords", "text"}`` entries; validated when the hook is built.
        max_entries: At most this many entries are injected.
    """

    name = "knowledge-context"
    timeout_seconds = 5.0

    def __init__(self, path: str | Path, *, max_entries: int = 3) -> None:
        self.path = Path(path)
        self.max_entries = max_entries
        self.entries = [KnowledgeEntry.model_validate(e) for e in json.loads(self.path.read_text(encoding="utf-8"))]

    def before_planning(self, ctx: PipelineContext) -> None:
        words = _tokens(ctx.request)
        scored = []
        for entry in self.entries:
            score = len(words & {k.lower() for k in entry.keywords})
            if score:
                scored.append((score, entry))
        scored.sort(key=lambda pair: -pair[0])
        chosen = [entry for _, entry in scored[: self.max_entries]]
        ctx.report_effect(
            "knowledge_retrieval",
            name="Knowledge retrieval",
            data={"candidates": len(self.entries), "matched": [e.id for e in chosen]},
            summary=f"{len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'} injected",
        )
        if not chosen:
            return None
        text = "\n".join(f"- {entry.text}" for entry in chosen)
        existing = ctx.enrichments.get(ENRICHMENT_RAG_CONTEXT)
        ctx.enrichments[ENRICHMENT_RAG_CONTEXT] = (
            f"{existing}\n{text}" if isinstance(existing, str) and existing else text
        )
        return None
