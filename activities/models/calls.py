"""One model call, made the way every planner and synthesizer call is made.

Before the call the token budget is checked (``TokenBudgetExceeded`` when it is spent — no request is
sent), and, when the model's context window is known (``AGENT_MODEL_CONTEXT_WINDOW``), the prompt: the
rendered messages and tool schemas, counted by the pipeline's counter or a conservative estimate, may take
at most 70 % of the window and must leave the call's output cap free (``PromptBudgetExceeded`` otherwise —
not retried, recorded, and no request is sent). Around it: a span ``chat <model>`` and the metrics ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration``, in the OpenTelemetry GenAI semantic conventions. After it, whatever
the outcome, a :class:`ModelCall` in the invocation's :class:`ModelCallLog`.

Provider failures become the activity errors Temporal acts on — the client's own retries are off
(``max_retries=0``), so the activity retry policy is the only one:

| provider outcome | activity error | retried |
| --- | --- | --- |
| 429, 408, 409, 5xx, timeout, connection error | ``ModelUnavailable`` (``next_retry_delay`` from ``Retry-After``) | yes |
| 400, 401, 403, 404, 422 and any other status | ``ModelRequestError`` (details: ``status``, ``message``) | no |
| ``message.refusal``, or finish reason ``content_filter`` | ``ModelRefusal`` | no |
| neither content nor tool calls | ``EmptyCompletion`` | no |

Every error's details (one dict) carry ``model_calls``: the calls of the invocation so far, the failed one
included. Cancelling the caller cancels the HTTP request in flight (the connection is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Self

from workflows.extras import missing_extra

try:
    import openai
    from openai import AsyncOpenAI
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionMessage,
        ChatCompletionMessageFunctionToolCall,
        ChatCompletionMessageToolCallUnion,
    )
    from openai.types.chat.chat_completion_chunk import ChoiceDelta
    from openai.types.chat.chat_completion_message_function_tool_call import Function
except ImportError as err:
    raise missing_extra("openai", "a model (AGENT_MODEL)", err) from err
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from temporalio.exceptions import ApplicationError

from hooks.builtin.secret_redaction import masked_preview
from workflows.decisions import (
    EMPTY_COMPLETION,
    MODEL_REFUSAL,
    MODEL_REQUEST_ERROR,
    MODEL_UNAVAILABLE,
    PROMPT_BUDGET_EXCEEDED,
)
from workflows.models import estimate_tokens
from workflows.models._model_calls import MAX_MODEL_PREVIEW_CHARS, ModelCall, ModelText

from .. import telemetry
from .call_log import ModelCallLog, Stage
from .settings import ModelSettings

CANCELLED = "Cancelled"

# Statuses worth another attempt (the openai client's own retry rule): overload, lock timeouts, outages.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
# A provider's Retry-After is obeyed up to this bound: a wrong header must not park a request for hours.
MAX_RETRY_DELAY = timedelta(minutes=10)

# Chat Completions, sent as the client's ``post``: the request is JSON this module built, so the client's
# walk of its request types (a copy of every message, about a quarter of a call's own CPU) has nothing to
# convert. Its headers, retries, auth and response parsing are the client's, as ``create`` has them.
COMPLETIONS_PATH = "/chat/completions"
_SEND_OPTIONS: openai.RequestOptions = {"security": {"bearer_auth": True}}

TOKEN_USAGE_METRIC = "gen_ai.client.token.usage"
OPERATION_DURATION_METRIC = "gen_ai.client.operation.duration"
# The bucket boundaries the semantic conventions advise for each histogram.
_TOKEN_BUCKETS = [4.0**n for n in range(14)]
_DURATION_BUCKETS = [0.01 * 2**n for n in range(14)]

Route = Literal["primary", "fallback"]
# Counts the tokens of a request's messages and tools (a pipeline's own tokenizer); the default estimates.
TokenCounter = Callable[[Sequence[dict[str, Any]], Sequence[dict[str, Any]]], int]
# The share of the context window a prompt may take, the rest kept for the answer and provider headroom.
PROMPT_SHARE_OF_WINDOW = 0.7
_instruments: tuple[metrics.Histogram, metrics.Histogram] | None = None


def _histograms() -> tuple[metrics.Histogram, metrics.Histogram]:
    global _instruments
    if _instruments is None:
        meter = metrics.get_meter(telemetry.INSTRUMENTATION)
        _instruments = (
            meter.create_histogram(
                TOKEN_USAGE_METRIC,
                unit="{token}",
                description="Number of input and output tokens used",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            ),
            meter.create_histogram(
                OPERATION_DURATION_METRIC,
                unit="s",
                description="GenAI operation duration",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            ),
        )
    return _instruments


def estimate_prompt_tokens(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()) -> int:
    """An upper estimate of a request's prompt tokens: its messages and tool schemas as rendered JSON."""
    rendered = json.dumps(list(messages), ensure_ascii=False) + json.dumps(list(tools), ensure_ascii=False)
    return estimate_tokens(rendered)


def prompt_text(messages: Sequence[dict[str, Any]]) -> ModelText:
    """The messages sent, by digest; the preview is the last message (what is new in this turn)."""
    exact = json.dumps(list(messages), ensure_ascii=False, sort_keys=True)
    last = messages[-1].get("content") if messages else None
    return ModelText.of(exact, masked_preview(last if isinstance(last, str) else exact, MAX_MODEL_PREVIEW_CHARS))


def response_text(content: str | None, tool_calls: Sequence[tuple[str, str]] = ()) -> ModelText:
    """The answer, by digest: its text, then each tool call as ``name arguments``."""
    exact = "\n".join([content or "", *(f"{name} {arguments}" for name, arguments in tool_calls)]).strip()
    return ModelText.of(exact, masked_preview(exact, MAX_MODEL_PREVIEW_CHARS))


def _provider_message(err: openai.APIError) -> str:
    body = err.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return err.message


def retry_after(headers: Any) -> timedelta | None:
    """The delay a provider asked for (``retry-after-ms``, or ``Retry-After`` in seconds or as a date),
    bounded by ``MAX_RETRY_DELAY``; ``None`` when it asked none."""
    if headers is None:
        return None
    seconds: float | None = None
    if value := headers.get("retry-after-ms"):
        try:
            seconds = float(value) / 1000
        except ValueError:
            pass
    if seconds is None and (value := headers.get("retry-after")):
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = (email.utils.parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                return None
    if seconds is None:
        return None
    return min(timedelta(seconds=max(0.0, seconds)), MAX_RETRY_DELAY)


def classify(err: openai.APIError) -> tuple[str, bool, int | None, str, timedelta | None]:
    """(error type, retryable, HTTP status, provider message, retry delay) of a provider error."""
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        message = _provider_message(err)
        if status in RETRYABLE_STATUSES or status >= 500:
            return MODEL_UNAVAILABLE, True, status, message, retry_after(err.response.headers)
        return MODEL_REQUEST_ERROR, False, status, message, None
    if isinstance(err, openai.APIConnectionError):  # timeouts included
        return MODEL_UNAVAILABLE, True, None, err.message, None
    return MODEL_REQUEST_ERROR, False, None, _provider_message(err), None  # e.g. a response that did not parse


@dataclass
class Turn:
    """A completed call: the model's message, why it stopped, and the record of the call."""

    message: ChatCompletionMessage
    finish_reason: str | None
    call: ModelCall


class ChatModel:
    """One model on one endpoint, called for one stage (planning or synthesis)."""

    def __init__(
        self,
        settings: ModelSettings,
        model: str,
        stage: Stage,
        client: AsyncOpenAI | None = None,
        *,
        route: Route = "primary",
        token_counter: TokenCounter | None = None,
    ) -> None:
        self.settings = settings
        self.model = model
        self.stage: Stage = stage
        self.route: Route = route
        self.token_counter = token_counter
        self.client = client or settings.client()
        self._owns_client = client is None  # a shared client is closed by whoever made it
        url = self.client.base_url
        self._server = {
            "server.address": url.host or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
        }

    async def aclose(self) -> None:
        """Close the HTTP client this model made for itself (its connections end with the worker)."""
        if self._owns_client:
            await self.client.close()

    # -- the parts both kinds of call share ---------------------------------------------------------

    def _request(
        self, messages: Sequence[dict[str, Any]], remaining: int | None, tools: Sequence[dict[str, Any]]
    ) -> dict[str, Any]:
        limit = (
            self.settings.max_output_tokens if remaining is None else min(self.settings.max_output_tokens, remaining)
        )
        request: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            self.settings.token_limit_parameter: limit,
        }
        if tools:
            request["tools"] = list(tools)
        if self.settings.temperature is not None:
            request["temperature"] = self.settings.temperature
        return request

    def _record(self, messages: Sequence[dict[str, Any]], phase: int | None, turn: int, **fields: Any) -> ModelCall:
        """The record of a call of this model with ``messages``, started now; ``fields`` the rest."""
        return ModelCall(
            stage=self.stage,
            phase=phase,
            turn=turn,
            model=self.model,
            provider=self.settings.provider,
            route=self.route,
            started_at=datetime.now(UTC),
            prompt=prompt_text(messages),
            **fields,
        )

    def _start(
        self, request: dict[str, Any], phase: int | None, turn: int, streamed: bool
    ) -> tuple[ModelCall, Span, float]:
        call = self._record(request["messages"], phase, turn, streamed=streamed)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": self.settings.provider,
            "gen_ai.provider.name": self.settings.provider,
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": request[self.settings.token_limit_parameter],
            "pipeline.model.stage": self.stage,
            "pipeline.model.turn": turn,
            **self._server,
        }
        if self.settings.temperature is not None:
            attributes["gen_ai.request.temperature"] = self.settings.temperature
        span = telemetry.tracer().start_span(f"chat {self.model}", kind=SpanKind.CLIENT, attributes=attributes)
        return call, span, time.monotonic()

    def _finish(
        self, log: ModelCallLog, call: ModelCall, span: Span, started: float, error: ApplicationError | None = None
    ) -> None:
        """Record the call (span attributes, metrics, the log) and end its span."""
        call.latency_ms = round((time.monotonic() - started) * 1000.0, 3)
        labels: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.settings.provider,
            "gen_ai.request.model": self.model,
            **self._server,
        }
        if call.response_model:
            labels["gen_ai.response.model"] = call.response_model
            span.set_attribute("gen_ai.response.model", call.response_model)
        if call.response_id:
            span.set_attribute("gen_ai.response.id", call.response_id)
        if call.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [call.finish_reason])
        tokens, duration = _histograms()
        for kind, count in (("input", call.prompt_tokens), ("output", call.completion_tokens)):
            if count is not None:
                span.set_attribute(f"gen_ai.usage.{kind}_tokens", count)
                tokens.record(count, {**labels, "gen_ai.token.type": kind})
        if call.error_type is not None:
            labels["error.type"] = call.error_type
            span.set_attribute("error.type", call.error_type)
            if call.status is not None:
                span.set_attribute("http.response.status_code", call.status)
            span.set_status(Status(StatusCode.ERROR, call.error_message or call.error_type))
        duration.record(call.latency_ms / 1000.0, labels)
        span.end()
        log.add(call)

    def _provider_error(
        self, log: ModelCallLog, call: ModelCall, span: Span, started: float, err: openai.APIError
    ) -> ApplicationError:
        kind, retryable, status, message, delay = classify(err)
        call.error_type, call.status, call.error_message = kind, status, ModelCall.clip_error(message)
        self._finish(log, call, span, started)
        verb = "is unavailable" if retryable else "refused the request"
        return log.error(
            f"model {self.model} {verb}" + (f" (HTTP {status})" if status else "") + f": {message}",
            kind,
            non_retryable=not retryable,
            next_retry_delay=delay,
            status=status,
            message=message,
            model=self.model,
            **({"retry_after_seconds": delay.total_seconds()} if delay is not None else {}),
        )

    def _abandoned(
        self, log: ModelCallLog, call: ModelCall, span: Span, started: float, err: BaseException | None
    ) -> None:
        """Record a call that ended without an answer or a provider error: cancelled, closed early, or a
        client-side failure (re-raised by the caller as it is)."""
        if any(recorded is call for recorded in log.calls):
            return
        if err is None or isinstance(err, asyncio.CancelledError | GeneratorExit):
            call.error_type, call.error_message = CANCELLED, "abandoned by the caller before the answer was complete"
        else:
            call.error_type, call.error_message = type(err).__name__, ModelCall.clip_error(str(err))
        self._finish(log, call, span, started)

    def _verdict(self, call: ModelCall, refusal: str | None, has_answer: bool) -> tuple[str, str] | None:
        """(error type, text) when the answer is no answer — a refusal or nothing at all; ``None`` otherwise."""
        if refusal or call.finish_reason == "content_filter":
            return MODEL_REFUSAL, f"model {self.model} refused: {refusal or 'content filtered'}"
        if not has_answer:
            return EMPTY_COMPLETION, (
                f"model {self.model} returned neither content nor tool calls (finish reason {call.finish_reason})"
            )
        return None

    def _rejected(
        self,
        log: ModelCallLog,
        call: ModelCall,
        span: Span,
        started: float,
        verdict: tuple[str, str],
        refusal: str | None,
    ) -> ApplicationError:
        kind, text = verdict
        call.error_type, call.error_message = kind, ModelCall.clip_error(text)
        self._finish(log, call, span, started)
        return log.error(text, kind, model=self.model, refusal=refusal, finish_reason=call.finish_reason)

    def _check_prompt(self, log: ModelCallLog, request: dict[str, Any], phase: int | None, turn: int) -> None:
        """Refuse a prompt that would not fit the model's window (see the module docstring): recorded as a
        call that was never sent, and ``PromptBudgetExceeded``."""
        window = self.settings.context_window
        if window is None:
            return
        messages, tools = request["messages"], request.get("tools", ())
        counted = self.token_counter(messages, tools) if self.token_counter else estimate_prompt_tokens(messages, tools)
        cap = min(int(window * PROMPT_SHARE_OF_WINDOW), window - request[self.settings.token_limit_parameter])
        if counted <= cap:
            return
        text = (
            f"the {self.stage} prompt for {self.model} takes about {counted} tokens; at most {cap} of its "
            f"{window}-token window may be prompt"
        )
        log.add(
            self._record(
                messages, phase, turn, error_type=PROMPT_BUDGET_EXCEEDED, error_message=ModelCall.clip_error(text)
            )
        )
        raise log.error(
            text, PROMPT_BUDGET_EXCEEDED, prompt_tokens=counted, prompt_cap=cap, context_window=window, model=self.model
        )

    # -- the two kinds of call ----------------------------------------------------------------------

    def _begin(
        self,
        log: ModelCallLog,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        phase: int | None,
        turn: int,
        *,
        streamed: bool,
    ) -> tuple[dict[str, Any], ModelCall, Span, float]:
        """The call's request once the budget and the prompt's size allow it, its record and its span."""
        request = self._request(messages, log.check_budget(self.stage), tools)
        self._check_prompt(log, request, phase, turn)
        return request, *self._start(request, phase, turn, streamed=streamed)

    async def complete(
        self,
        log: ModelCallLog,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] = (),
        phase: int | None = None,
        turn: int = 1,
    ) -> Turn:
        """One Chat Completions call; its message when it is an answer (text or tool calls)."""
        request, call, span, started = self._begin(log, messages, tools, phase, turn, streamed=False)
        try:
            with trace.use_span(span, end_on_exit=False):
                completion = await self.client.post(
                    COMPLETIONS_PATH, body=request, cast_to=ChatCompletion, options=_SEND_OPTIONS
                )
        except openai.APIError as err:
            raise self._provider_error(log, call, span, started, err) from None
        except BaseException as err:  # cancelled, or a client bug: recorded, then as it was
            self._abandoned(log, call, span, started, err)
            raise
        call.response_id, call.response_model = completion.id or None, completion.model or None
        if completion.usage is not None:
            call.prompt_tokens = completion.usage.prompt_tokens
            call.completion_tokens = completion.usage.completion_tokens
            call.total_tokens = completion.usage.total_tokens
        if not completion.choices:
            raise self._rejected(
                log, call, span, started, (EMPTY_COMPLETION, f"model {self.model} returned no choices"), None
            )
        choice = completion.choices[0]
        message = choice.message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or () if c.type == "function"]
        call.finish_reason, call.tool_calls = choice.finish_reason, len(message.tool_calls or ())
        call.response = response_text(message.content, calls)
        if verdict := self._verdict(call, message.refusal, bool(message.content or message.tool_calls)):
            raise self._rejected(log, call, span, started, verdict, message.refusal)
        self._finish(log, call, span, started)
        return Turn(message, choice.finish_reason, call)

    def stream(self, log: ModelCallLog, messages: Sequence[dict[str, Any]], *, phase: int | None = None) -> ChatStream:
        """A streamed call (``stream=True``, usage requested): an async iterator of text chunks."""
        answer = ChatStream()
        answer.chunks = self._stream(log, messages, phase, answer)
        return answer

    async def _stream(
        self, log: ModelCallLog, messages: Sequence[dict[str, Any]], phase: int | None, answer: ChatStream
    ) -> AsyncGenerator[str, None]:
        request, call, span, started = self._begin(log, messages, (), phase, 1, streamed=True)
        gathered = _Gathered()
        async with contextlib.aclosing(self._deltas(log, request, call, span, started)) as deltas:
            async for delta in deltas:
                if text := gathered.take(delta):
                    yield text
        answer.text = gathered.text
        call.response = response_text(answer.text)
        refusal = gathered.refusal
        if verdict := self._verdict(call, refusal, bool(answer.text)):
            raise self._rejected(log, call, span, started, verdict, refusal)
        self._finish(log, call, span, started)
        answer.call = call

    async def complete_streamed(
        self,
        log: ModelCallLog,
        messages: Sequence[dict[str, Any]],
        on_text: Callable[[str], None],
        *,
        tools: Sequence[dict[str, Any]] = (),
        phase: int | None = None,
        turn: int = 1,
    ) -> Turn:
        """:meth:`complete`, streamed: each piece of the answer's text goes to ``on_text`` as it arrives;
        the tool calls are gathered from their deltas, and the turn is returned whole once the model has
        finished, checked and recorded as :meth:`complete` does (``streamed`` in the record)."""
        request, call, span, started = self._begin(log, messages, tools, phase, turn, streamed=True)
        gathered = _Gathered()
        async with contextlib.aclosing(self._deltas(log, request, call, span, started)) as deltas:
            async for delta in deltas:
                if text := gathered.take(delta):
                    on_text(text)
        content, refusal, functions = gathered.text or None, gathered.refusal, gathered.function_calls()
        tool_calls: list[ChatCompletionMessageToolCallUnion] = list(functions)
        message = ChatCompletionMessage(
            role="assistant", content=content, refusal=refusal, tool_calls=tool_calls or None
        )
        call.tool_calls = len(functions)
        call.response = response_text(content, [(c.function.name, c.function.arguments) for c in functions])
        if verdict := self._verdict(call, refusal, bool(content or tool_calls)):
            raise self._rejected(log, call, span, started, verdict, refusal)
        self._finish(log, call, span, started)
        return Turn(message, call.finish_reason, call)

    async def _deltas(
        self, log: ModelCallLog, request: dict[str, Any], call: ModelCall, span: Span, started: float
    ) -> AsyncGenerator[ChoiceDelta, None]:
        """The deltas of a streamed call's answer as they arrive; the response's id, model, usage and
        finish reason go to ``call`` on the way. A provider error is recorded and raised as its activity
        error; a stream closed early, cancelled or broken is recorded as abandoned."""
        try:
            with trace.use_span(span, end_on_exit=False):
                stream = await self.client.post(
                    COMPLETIONS_PATH,
                    body={**request, "stream": True, "stream_options": {"include_usage": True}},
                    cast_to=ChatCompletion,
                    options=_SEND_OPTIONS,
                    stream=True,
                    stream_cls=openai.AsyncStream[ChatCompletionChunk],
                )
            try:
                async for chunk in stream:
                    call.response_id = call.response_id or chunk.id or None
                    call.response_model = call.response_model or chunk.model or None
                    if chunk.usage is not None:
                        call.prompt_tokens = chunk.usage.prompt_tokens
                        call.completion_tokens = chunk.usage.completion_tokens
                        call.total_tokens = chunk.usage.total_tokens
                    for choice in chunk.choices[:1]:
                        call.finish_reason = choice.finish_reason or call.finish_reason
                        yield choice.delta
            finally:
                await stream.close()
        except openai.APIError as err:
            raise self._provider_error(log, call, span, started, err) from None
        except BaseException as err:  # closed early (GeneratorExit), cancelled, or a client bug
            self._abandoned(log, call, span, started, err)
            raise


class RoutedChat:
    """A role's model and, when a fallback model is set, the fallback: the models a planner or a
    synthesizer calls, chosen by the request's route.

    Args:
        settings: The endpoint and call options.
        role: Whose model: by default ``settings.role_model(role)``.
        stage: The stage its calls are recorded for.
        model: The model, instead of the role's.
        client: An ``AsyncOpenAI`` client to share; by default one from ``settings``.
        fallback: The fallback model's settings; by default ``settings.fallback()``.
        token_counter: Counts a prompt's tokens for the prompt budget; by default a conservative estimate.
    """

    def __init__(
        self,
        settings: ModelSettings,
        role: Literal["planner", "synthesizer"],
        stage: Stage,
        *,
        model: str | None,
        client: AsyncOpenAI | None,
        fallback: ModelSettings | None,
        token_counter: TokenCounter | None,
    ) -> None:
        model = model or settings.role_model(role)
        self._role = role
        self.name = f"openai:{model}"
        self.chat = ChatModel(settings, model, stage, client, token_counter=token_counter)
        fallback = fallback or settings.fallback()
        self.fallback: ChatModel | None = None
        if fallback is not None and fallback.model:
            self.fallback = ChatModel(fallback, fallback.model, stage, route="fallback", token_counter=token_counter)

    @property
    def fallback_model(self) -> str | None:
        """The fallback model's name, when there is one."""
        return f"openai:{self.fallback.model}" if self.fallback is not None else None

    async def aclose(self) -> None:
        """Close the models' HTTP clients, if this object made them."""
        await self.chat.aclose()
        if self.fallback is not None:
            await self.fallback.aclose()

    def _routed(self, route: str) -> ChatModel:
        """The fallback model for the ``fallback`` route, else the role's model."""
        if route != "fallback":
            return self.chat
        if self.fallback is None:
            raise ValueError(f"this {self._role} has no fallback model (AGENT_FALLBACK_MODEL)")
        return self.fallback


class _Gathered:
    """A streamed answer put together from its deltas: its text, its refusal, its tool calls."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._refusals: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}  # by the call's index in the answer: id, name, arguments

    def take(self, delta: ChoiceDelta) -> str:
        """Add ``delta``; the text it brings ("" for none)."""
        if delta.refusal:
            self._refusals.append(delta.refusal)
        for piece in delta.tool_calls or ():
            into = self._calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            into["id"] = piece.id or into["id"]
            if piece.function is not None:
                into["name"] += piece.function.name or ""
                into["arguments"] += piece.function.arguments or ""
        if delta.content:
            self._parts.append(delta.content)
        return delta.content or ""

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def refusal(self) -> str | None:
        return "".join(self._refusals) or None

    def function_calls(self) -> list[ChatCompletionMessageFunctionToolCall]:
        return [
            ChatCompletionMessageFunctionToolCall(
                id=found["id"], type="function", function=Function(name=found["name"], arguments=found["arguments"])
            )
            for _, found in sorted(self._calls.items())
        ]


class TextChunks:
    """An async iterator of text chunks (``async for chunk in stream``) drawn from the generator
    ``chunks``; ``aclose()`` closes that generator."""

    chunks: AsyncGenerator[str, None]

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> str:
        return await self.chunks.__anext__()

    async def aclose(self) -> None:
        await self.chunks.aclose()


class ChatStream(TextChunks):
    """The text chunks of one streamed answer, as they arrive; once exhausted, ``text`` is the whole
    answer and ``call`` its record (usage from the stream's last chunk). Closing it early (``aclose``, or
    cancelling the consumer) closes the HTTP response; the call is recorded as cancelled."""

    def __init__(self) -> None:
        self.text = ""
        self.call: ModelCall | None = None
