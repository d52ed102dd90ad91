"""A :class:`~hooks.memory.MemoryModel` on an OpenAI-compatible Chat Completions endpoint: the memory
summarizer a worker folds conversation memory with (``LifecycleActivities.memory_summarizer``), and the
model of the memory hooks (``build_memory_hooks(model=...)``, ``build_user_memory_hooks``).

Each call is made the way the planner's are (``ChatModel``: its span and metrics, typed provider errors)
and is one of the request's model calls: metered against its model token budget (``hooks.model_budget``)
— a call the budget cannot hold is refused before it is sent with the planner's error,
``TokenBudgetExceeded``, and whoever asked falls back to its heuristic — and kept in its record's
``model_calls`` (stage ``memory``, with the hook that asked). Outside a request's activity (a detached
knowledge extraction) a call is made unmetered.
"""

from __future__ import annotations

from workflows.extras import missing_extra

try:
    from openai import AsyncOpenAI
except ImportError as err:
    raise missing_extra("openai", "a model (AGENT_MODEL)", err) from err

from hooks.model_budget import current

from .calls import ChatModel, ModelCallLog
from .settings import ModelSettings


class OpenAIMemoryModel:
    """``complete(prompt)``: one Chat Completions call with the prompt as the user message; the answer's
    text.

    Args:
        settings: The endpoint, key and call options (``settings.model``).
        model: The model (by default the settings' ``AGENT_MODEL``).
        client: An ``AsyncOpenAI`` client to share (by default one of its own, closed by :meth:`aclose`).
    """

    def __init__(self, settings: ModelSettings, *, model: str | None = None, client: AsyncOpenAI | None = None) -> None:
        model = model or settings.model
        if not model:
            raise ValueError("the memory model needs a model: pass model= or set AGENT_MODEL")
        self.name = f"openai:{model}"
        self.chat = ChatModel(settings, model, "memory", client)

    async def complete(self, prompt: str) -> str:
        messages = [{"role": "user", "content": prompt}]
        budget = current()
        log = ModelCallLog()
        if budget is not None:
            log.max_tokens_remaining = budget.admit(
                "memory", self.chat.model, messages, self.chat.settings.max_output_tokens
            )
        try:
            turn = await self.chat.complete(log, messages)
        finally:
            if budget is not None:
                budget.spend(*log.calls)
        return turn.message.content or ""

    async def aclose(self) -> None:
        """Close the HTTP client this model made for itself."""
        await self.chat.aclose()
