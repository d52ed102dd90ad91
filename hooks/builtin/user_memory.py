"""Per-user memory: ``user-memory-enrichment`` recalls what we know about the user before planning,
``user-memory-extraction`` learns durable facts the user stated after synthesis, and
:func:`build_user_memory_hooks` wires both, enrichment first.

Both need ``metadata["user_id"]``; without it they do nothing at all — no read, no write, no effect.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import KW_ONLY, dataclass, field

from workflows.models import ENRICHMENT_USER_PROFILE, EffectStatus, RunMode

from ..contracts import PipelineContext, PipelineHook
from ..memory import MemoryModel, UserFact, UserMemory
from .memory_model import HeuristicMemoryModel, model_prompt, parse_json_answer, report_call

# Facts that identify the user are always recalled; others only when they share a word with the request.
IDENTITY_KEYS = frozenset({"name", "preferred_name", "home_city", "timezone", "language"})
_WORD = re.compile(r"[a-z0-9]{3,}")


def _user_id(ctx: PipelineContext) -> str | None:
    value = ctx.metadata.get("user_id")
    return value if isinstance(value, str) and value.strip() else None


@dataclass(eq=False)
class UserMemoryEnrichmentHook(PipelineHook):
    """before_planning: the user's identity facts and the facts relevant to this request, as a
    preformatted ``<user_profile>…</user_profile>`` block in ``user_profile`` (which the default prompt
    builder inserts verbatim, untagged — so this hook supplies the tags).

    No-op without ``metadata["user_id"]``. Effect ``user_memory_read``: read status and the fact keys
    recalled. Fails open: a failed read injects nothing.

    Args:
        memory: Where user facts are kept.
        max_facts: At most this many facts are read and injected.
    """

    memory: UserMemory
    _: KW_ONLY
    max_facts: int = 20
    name: str = "user-memory-enrichment"
    timeout_seconds = 10.0

    async def before_planning(self, ctx: PipelineContext) -> None:
        user_id = _user_id(ctx)
        if user_id is None:
            return
        read = await self.memory.user_facts(user_id, limit=self.max_facts)
        words = set(_WORD.findall(ctx.request.lower()))
        recalled = [
            f for f in read.items if f.key in IDENTITY_KEYS or words & set(_WORD.findall(f"{f.key} {f.value}".lower()))
        ]
        report_call(
            ctx,
            "user_memory_read",
            read,
            name="User memory read",
            data={
                "status": read.status,
                "user_id": user_id,
                "returned_facts": len(read.items),
                "recalled_keys": [f.key for f in recalled],
            },
        )
        if recalled:
            lines = "\n".join(f"- {f.key}: {f.value}" for f in recalled)
            ctx.enrichments[ENRICHMENT_USER_PROFILE] = f"<user_profile>\n{lines}\n</user_profile>"


@dataclass(eq=False)
class UserMemoryExtractionHook(PipelineHook):
    """after_synthesis: store durable facts the user stated about themselves; the response is returned
    unchanged, whatever happens.

    No-op without ``metadata["user_id"]``. One bounded model call (``timeout_seconds`` of the call is
    ``extraction_timeout_seconds``) finds the facts; a timeout or an unusable answer stores nothing. The
    write is synchronous (the request waits for it). Effect ``user_memory_extraction``: the submitted
    facts and the provider call's status.

    Args:
        memory: Where user facts are kept.
        model: Finds the facts; defaults to :class:`HeuristicMemoryModel`.
        extraction_timeout_seconds: Bound on the model call.
    """

    memory: UserMemory
    _: KW_ONLY
    model: MemoryModel = field(default_factory=HeuristicMemoryModel)
    extraction_timeout_seconds: float = 30.0
    name: str = "user-memory-extraction"
    run_mode = RunMode.ACTIVITY  # a model call: its own heartbeated task

    def __post_init__(self) -> None:
        self.timeout_seconds = min(600.0, self.extraction_timeout_seconds + 15.0)

    async def after_synthesis(self, ctx: PipelineContext, response: str) -> str:
        user_id = _user_id(ctx)
        if user_id is None:
            return response
        prompt = model_prompt(
            "extract_user_facts",
            'List durable facts the user stated about themselves. Answer {"facts": [{"key", "value"}]}.',
            {"request": ctx.request, "response": response[:4000]},
        )
        error = None
        facts: list[UserFact] = []
        try:
            answer = await asyncio.wait_for(self.model.complete(prompt), timeout=self.extraction_timeout_seconds)
            for item in parse_json_answer(answer).get("facts", []):
                if isinstance(item, dict) and isinstance(item.get("key"), str) and isinstance(item.get("value"), str):
                    key, value = item["key"].strip()[:64], " ".join(item["value"].split())[:300]
                    if key and value:
                        facts.append(UserFact(user_id=user_id, key=key, value=value, source_request_id=ctx.request_id))
        except TimeoutError:
            error = "model call timed out"
        except Exception as err:  # noqa: BLE001 - extraction is optional; the answer stands
            error = f"{type(err).__name__}: {err}"
        written = await self.memory.remember_facts(facts) if facts else None
        ctx.report_effect(
            "user_memory_extraction",
            name="User memory extraction",
            status=EffectStatus.FAILED if error or (written and not written.ok) else EffectStatus.SUCCEEDED,
            data={
                "user_id": user_id,
                "submitted_facts": [{"key": f.key, "value": f.value} for f in facts],
                "provider_call_status": written.provider_call_status if written else "not_called",
            },
            error=error or (written.error if written else None),
        )
        return response


def build_user_memory_hooks(
    memory: UserMemory,
    model: MemoryModel | None = None,
    *,
    max_facts: int = 20,
    extraction_timeout_seconds: float = 30.0,
) -> list[PipelineHook]:
    """The per-user memory hooks, in order: enrichment (before_planning), extraction (after_synthesis)."""
    return [
        UserMemoryEnrichmentHook(memory, max_facts=max_facts),
        UserMemoryExtractionHook(
            memory, model=model or HeuristicMemoryModel(), extraction_timeout_seconds=extraction_timeout_seconds
        ),
    ]
