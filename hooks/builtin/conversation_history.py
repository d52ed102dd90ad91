"""``conversation-history``: remembered exchanges of this conversation into ``conversation_history``
(rendered inside ``<conversation_history>`` in the default planning prompt).

Constructed directly and added to the pipeline yourself — the memory builders do not wire it. It reads
what the ``remember`` stage saved for ``metadata["conversation_id"]``. For turns the caller already
holds, prefer request metadata (``conversation_turns``), which is promoted into ``conversation_history`` before any hook runs.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from workflows.models import ENRICHMENT_CONVERSATION_HISTORY, EffectStatus

from ..contracts import PipelineContext, PipelineHook
from ..memory import ConversationHistorySource


@dataclass(eq=False)
class ConversationHistoryHook(PipelineHook):
    """before_planning: the last ``max_turns`` remembered exchanges, oldest first, ahead of any history
    promoted from request metadata. No-op without ``metadata["conversation_id"]``. Fails open: the hook's
    error is recorded and the request plans without the stored history.

    Args:
        source: The conversation memory the ``remember`` stage writes (e.g. ``MemoryStore``).
        max_turns: Exchanges to read.
        max_chars: Each side of an exchange is cut to this many characters.
    """

    source: ConversationHistorySource
    _: KW_ONLY
    max_turns: int = 10
    max_chars: int = 1000
    name: str = "conversation-history"
    timeout_seconds = 10.0

    async def before_planning(self, ctx: PipelineContext) -> None:
        conversation_id = ctx.metadata.get("conversation_id")
        if not isinstance(conversation_id, str) or not conversation_id:
            return
        exchanges = await self.source.recent(conversation_id, self.max_turns)
        ctx.report_effect(
            "conversation_history_read",
            name="Conversation history read",
            status=EffectStatus.SUCCEEDED,
            data={"status": "read_succeeded", "conversation_id": conversation_id, "returned_exchanges": len(exchanges)},
        )
        if not exchanges:
            return
        text = "\n".join(
            f"user: {e.request[: self.max_chars]}\nassistant: {e.answer[: self.max_chars]}" for e in exchanges
        )
        existing = ctx.enrichments.get(ENRICHMENT_CONVERSATION_HISTORY)
        ctx.enrichments[ENRICHMENT_CONVERSATION_HISTORY] = (
            f"{text}\n{existing}" if isinstance(existing, str) and existing else text
        )
