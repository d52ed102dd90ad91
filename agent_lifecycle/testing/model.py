"""A scripted OpenAI-compatible Chat Completions server for tests: real HTTP on 127.0.0.1 and a free port,
written on asyncio streams so it needs nothing beyond the standard library.

Each test pushes the replies it wants, in order; every ``POST /v1/chat/completions`` takes the next one
and the server keeps what it received (headers and JSON body), so a test asserts what the model was sent.
A request that asks for ``stream`` receives a scripted completion as server-sent events, the way a
provider streams it (``as_stream``: text by word, tool calls in pieces, then usage).
A request with no reply left is answered 400 with a message saying so — a non-retryable error, so a
test that scripted too few replies fails at once and readably instead of retrying.

Every response closes its connection (``Connection: close``): the client never reuses one, so a
delayed reply can tell that its client went away — the read side reaches end of file — and
``disconnected`` records it (how a test proves that cancelling the caller cancelled the HTTP call).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

Usage = tuple[int, int]  # (prompt tokens, completion tokens)


@dataclass
class Reply:
    """One scripted response: a JSON body, or server-sent events (``events``), after ``delay`` seconds."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    events: list[dict[str, Any]] | None = None  # a streamed reply: each one a ``data:`` line, then [DONE]


@dataclass
class Received:
    """A request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", [])

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.body.get("tools", [])]

    def tool(self, name: str) -> dict[str, Any]:
        return next(t["function"] for t in self.body.get("tools", []) if t["function"]["name"] == name)


def _usage(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    prompt, completion = usage
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(
    message: dict[str, Any],
    *,
    finish_reason: str = "stop",
    usage: Usage | None = (10, 5),
    model: str = "test-model",
    response_id: str = "chatcmpl-test",
) -> Reply:
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
    }
    if usage is not None:
        body["usage"] = _usage(usage)
    return Reply(body=body)


def answer(text: str, **kwargs: Any) -> Reply:
    """The model answers in text, calling no tool."""
    return completion({"content": text}, **kwargs)


def tool_calls(
    *calls: tuple[str, dict[str, Any] | str] | tuple[str, dict[str, Any] | str, str], **kwargs: Any
) -> Reply:
    """The model calls tools: ``(name, arguments)`` or ``(name, arguments, call id)``; arguments given as a
    string are sent verbatim (to script malformed JSON)."""
    rendered = []
    for n, call in enumerate(calls):
        name, arguments = call[0], call[1]
        call_id = call[2] if len(call) > 2 else f"call_{n}"
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        rendered.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": text}})
    return completion({"content": None, "tool_calls": rendered}, finish_reason="tool_calls", **kwargs)


def refusal(text: str) -> Reply:
    return completion({"content": None, "refusal": text})


def empty() -> Reply:
    """A completion with neither content nor tool calls."""
    return completion({"content": None}, usage=(10, 0))


def error(
    status: int, message: str, *, headers: dict[str, str] | None = None, kind: str = "invalid_request_error"
) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": kind, "code": None}}, headers=headers or {})


def slow(seconds: float, then: Reply | None = None) -> Reply:
    """``then`` (a plain answer by default) after ``seconds``; a client that leaves earlier is recorded."""
    reply = then or answer("too late")
    return Reply(status=reply.status, body=reply.body, headers=reply.headers, delay=seconds, events=reply.events)


def _chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _head(model: str, response_id: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }


def _events(
    deltas: list[dict[str, Any]],
    finish: str | None,
    usage: dict[str, int] | None,
    model: str,
    response_id: str = "chatcmpl-stream",
) -> list[dict[str, Any]]:
    """A stream's events: a role chunk, one chunk per delta, a finish chunk, then a usage chunk (no choices)."""
    head = _head(model, response_id)
    events = [_chunk(head, {"role": "assistant", "content": ""})]
    events += [_chunk(head, delta) for delta in deltas]
    events.append(_chunk(head, {}, finish))
    if usage is not None:
        events.append(head | {"choices": [], "usage": usage})
    return events


def streamed(chunks: list[str], *, usage: Usage | None = (12, 7), model: str = "test-model") -> Reply:
    """An SSE stream of ``chunks`` of text: a role chunk, one chunk per piece, a finish chunk, then a usage
    chunk (no choices)."""
    return Reply(events=_events([{"content": piece} for piece in chunks], "stop", _usage(usage), model))


def as_stream(reply: Reply) -> Reply:
    """A completion, sent as a provider streams it to a request that asked for ``stream``: its text a
    word at a time, each tool call's id and name first and then its arguments in two pieces, the finish
    reason, and the usage."""
    choice = reply.body["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [
        {"content": word} for word in re.findall(r"\s*\S+\s*", message.get("content") or "")
    ]
    if message.get("refusal"):
        deltas.append({"refusal": message["refusal"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        deltas.append({"tool_calls": [head | {"function": {"name": function["name"], "arguments": ""}}]})
        half = len(function["arguments"]) // 2
        for piece in (function["arguments"][:half], function["arguments"][half:]):
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    body = reply.body
    events = _events(deltas, choice["finish_reason"], body.get("usage"), body["model"], body["id"])
    return Reply(status=reply.status, headers=reply.headers, delay=reply.delay, events=events)


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}


class OpenAIServer:
    """``async with OpenAIServer() as server``: listening on ``server.base_url`` until the block ends."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Received] = []
        self.disconnected = asyncio.Event()  # a client closed its connection before its reply was sent
        self._arrived = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def wait_for_requests(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)

    async def __aenter__(self) -> OpenAIServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            received = await self._read(reader)
            if received is None:
                return
            async with self._arrived:
                self.requests.append(received)
                self._arrived.notify_all()
            reply = (
                self.replies.popleft()
                if self.replies
                else error(400, "the test scripted no reply for this request", kind="test_script_exhausted")
            )
            if isinstance(received.body, dict) and received.body.get("stream") and reply.status == 200:
                reply = reply if reply.events is not None else as_stream(reply)
            if reply.delay and await self._client_left(reader, reply.delay):
                self.disconnected.set()
                return
            await self._write(writer, reply)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected.set()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _client_left(reader: asyncio.StreamReader, delay: float) -> bool:
        """Wait ``delay`` seconds; True as soon as the client closes its side."""
        try:
            data = await asyncio.wait_for(reader.read(1), delay)
        except TimeoutError:
            return False
        except ConnectionError:
            return True
        return data == b""

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Received | None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            raw = b""
            while size := int((await reader.readline()).strip() or b"0", 16):
                raw += await reader.readexactly(size)
                await reader.readline()
            await reader.readline()
        else:
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
        return Received(method, path, headers, json.loads(raw) if raw else None)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, reply: Reply) -> None:
        reason = _REASONS.get(reply.status, "Error")
        headers = {"connection": "close", **{k.lower(): v for k, v in reply.headers.items()}}
        if reply.events is None:
            payload = json.dumps(reply.body).encode()
            headers |= {"content-type": "application/json", "content-length": str(len(payload))}
        else:
            payload = b""
            headers |= {"content-type": "text/event-stream", "cache-control": "no-cache"}
        head = f"HTTP/1.1 {reply.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(head.encode("latin-1") + b"\r\n" + payload)
        await writer.drain()
        for event in reply.events or ():
            # One event per write, with a pause, so the client sees them arrive as separate chunks.
            writer.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await writer.drain()
            await asyncio.sleep(0.005)
        if reply.events is not None:
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
