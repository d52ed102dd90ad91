"""``OpenAISynthesizer``: a :class:`~activities.planning.Synthesizer` on any OpenAI-compatible Chat
Completions endpoint, whole or streamed.

What the model is sent: a system message saying how to answer, followed by the run's instructions (the
pipeline's and the request's, as before_run left them), then one user message built by
:func:`build_synthesis_prompt` from the ``SynthesizeInput`` without them — the facts, the well-known
enrichments in the same tagged sections as the planning prompt, every step's result text (what a model
may read: after_tool hooks have rewritten and capped it; never the raw output), then the request. No
tools are offered: the answer is text.

Confidence is derived, not asked of the model: the share of the request's steps that succeeded, and
0.5 when no step ran (the answer then rests on the model and the context alone).

The answer's model calls travel with it: ``SynthesizeOutput.model_calls`` when that field exists, and
always in the ``calls`` log a caller passes; a failure carries them in its error details.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any

from workflows.extras import missing_extra

try:
    from openai import AsyncOpenAI
except ImportError as err:
    raise missing_extra("openai", "a model (AGENT_MODEL)", err) from err

from workflows.models import SynthesizeInput, SynthesizeOutput
from workflows.models._model_calls import ModelCall, ModelUsage

from ..planning import context_sections, system_message
from .calls import ChatModel, ChatStream, ModelCallLog, RoutedChat, TextChunks, TokenCounter
from .settings import ModelSettings

SYNTHESIZER_SYSTEM_PROMPT = """\
You write an agent's answer to the user's request, from the results of the tools the agent ran and the \
context given with the request.
Say only what the results and the context support. When a tool failed or was skipped, say what could not \
be done. Answer directly and briefly, in the language of the request; do not mention step ids."""


def build_synthesis_prompt(input: SynthesizeInput) -> str:
    """Instructions, facts, the well-known enrichments (tagged as in the planning prompt), the step
    results, then the request."""
    sections = context_sections(input.instructions, input.facts, input.enrichments)
    lines = [
        f"- {step.step_id} ({step.tool}, {step.status.value}): {step.result or ''}".rstrip()
        for step in input.execution.steps
    ]
    sections.append("<tool_results>\n" + ("\n".join(lines) if lines else "(no tool ran)") + "\n</tool_results>")
    sections.append(f"User request:\n{input.request}")
    return "\n\n".join(sections)


def confidence(input: SynthesizeInput) -> float:
    """The share of steps that succeeded; ``NO_STEP_CONFIDENCE`` when none ran."""
    return input.execution.confidence


def _output(response: str, input: SynthesizeInput, log: ModelCallLog) -> SynthesizeOutput:
    # Validated from a mapping so the calls ride along wherever SynthesizeOutput declares model_calls.
    return SynthesizeOutput.model_validate(
        {
            "response": response,
            "confidence": confidence(input),
            "model_calls": [call.model_dump(mode="json") for call in log.calls],
        }
    )


def _input_log(input: SynthesizeInput) -> ModelCallLog:
    """This attempt's log, with the budget the input carries (none when it carries none)."""
    remaining = getattr(input, "max_tokens_remaining", None)
    return ModelCallLog.resumed(remaining if isinstance(remaining, int) else None)


class OpenAISynthesizer(RoutedChat):
    """Writes the answer with a Chat Completions model.

    Args:
        settings: The endpoint and call options.
        model: The model; by default ``settings.role_model("synthesizer")``.
        client: An ``AsyncOpenAI`` client to share; by default one from ``settings`` (no client retries).
        system_prompt: How to answer.
        prompt_builder: The user message from the input; :func:`build_synthesis_prompt` by default.
        fallback: The fallback model's settings (an input whose route is ``fallback`` is answered by it); by
            default ``settings.fallback()``.
        token_counter: Counts a prompt's tokens for the prompt budget; by default a conservative estimate.
    """

    def __init__(
        self,
        settings: ModelSettings,
        *,
        model: str | None = None,
        client: AsyncOpenAI | None = None,
        system_prompt: str = SYNTHESIZER_SYSTEM_PROMPT,
        prompt_builder: Callable[[SynthesizeInput], str] = build_synthesis_prompt,
        fallback: ModelSettings | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        super().__init__(
            settings,
            "synthesizer",
            "synthesis",
            model=model,
            client=client,
            fallback=fallback,
            token_counter=token_counter,
        )
        self.system_prompt = system_prompt
        self.prompt_builder = prompt_builder

    def _chat(self, input: SynthesizeInput) -> ChatModel:
        return self._routed(getattr(input, "route", "primary"))

    def messages(self, input: SynthesizeInput) -> list[dict[str, Any]]:
        """The system message with the run's instructions, then the prompt (which the model then reads
        without them: once is enough)."""
        return [
            {"role": "system", "content": system_message(self.system_prompt, input.instructions)},
            {"role": "user", "content": self.prompt_builder(input.model_copy(update={"instructions": ""}))},
        ]

    async def synthesize(self, input: SynthesizeInput, *, calls: ModelCallLog | None = None) -> SynthesizeOutput:
        """The answer. The call is appended to ``calls`` (a fresh log with the input's budget by default)."""
        log = calls if calls is not None else _input_log(input)
        turn = await self._chat(input).complete(log, self.messages(input))
        return _output(turn.message.content or "", input, log)

    def synthesize_stream(self, input: SynthesizeInput, *, calls: ModelCallLog | None = None) -> SynthesisStream:
        """The answer as it is written: iterate for text chunks; then ``output`` holds the whole answer."""
        log = calls if calls is not None else _input_log(input)
        return SynthesisStream(self._chat(input).stream(log, self.messages(input)), input, log)


class SynthesisStream(TextChunks):
    """An async iterator of an answer's text chunks (``async for chunk in stream``). Once exhausted:
    ``text`` is the whole answer, ``call`` the model call (with its usage), ``usage`` the invocation's
    sum and ``output`` the :class:`SynthesizeOutput`. Errors are raised from the iteration, as the
    activity errors of :mod:`.calls`. ``aclose()`` abandons the answer and closes the HTTP response."""

    def __init__(self, chat: ChatStream, input: SynthesizeInput, log: ModelCallLog) -> None:
        self._chat, self._input, self.log = chat, input, log
        self.output: SynthesizeOutput | None = None
        self.chunks = self._run()

    async def aclose(self) -> None:
        await super().aclose()
        await self._chat.aclose()

    async def _run(self) -> AsyncGenerator[str, None]:
        async for chunk in self._chat:
            yield chunk
        self.output = _output(self._chat.text, self._input, self.log)

    @property
    def text(self) -> str:
        return self._chat.text

    @property
    def call(self) -> ModelCall | None:
        return self._chat.call

    @property
    def usage(self) -> ModelUsage:
        return self.log.usage()
