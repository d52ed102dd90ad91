"""The model both systems call: a local OpenAI-compatible Chat Completions server in a process of its own.

    python -m benchmarks.peer.model_server --port 0     # prints "model server listening on <port>"

It answers from the conversation it is sent, not from a queue of replies, so any number of concurrent
requests of any system get the same script:

- a call that offers a ``…stock_quote`` tool and carries no tool result yet: one assistant turn calling
  the tool three times (AAA, BBB, CCC), ``finish_reason="tool_calls"``;
- any other call (the tool results came back, or no tool is offered, as in a separate synthesis call):
  the answer in text, :func:`expected_answer`, written only if every quote's price is in the messages it
  was sent; otherwise an answer saying which are missing, counted as ``blind_answers``.

It counts calls per model name (each system sends its own): ``GET /stats``. ``POST /latency`` with
``{"ms": 50}`` makes every later reply wait that long first, as a hosted model would. Connections are
kept alive, as an OpenAI client keeps them with a hosted API. It listens on 127.0.0.1 only and serves
no other path. Its CPU is not counted in either system's figures: it stands for the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections import Counter
from typing import Any

from benchmarks.peer import QUOTE_CAPABILITY, SYMBOLS
from benchmarks.peer.loopback import guard
from demo.tools import quote_price

MAX_BODY = 4 * 1024 * 1024


def expected_answer() -> str:
    """What the model answers once it has read every quote; what each system must return."""
    return "Prices: " + ", ".join(f"{symbol} {quote_price(symbol)} USD" for symbol in SYMBOLS) + "."


def _text(messages: list[dict[str, Any]]) -> str:
    """Everything the model was sent to read: each message's text content (strings or text parts)."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


def _completion(model: str, message: dict[str, Any], finish_reason: str, serial: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-bench-{serial}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 24, "total_tokens": 144},
    }


class ScriptedModel:
    """The script and the counters (one per model name)."""

    def __init__(self) -> None:
        self.latency = 0.0
        self.counts: dict[str, Counter[str]] = {}
        self.serial = 0

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        model = str(body.get("model", ""))
        counts = self.counts.setdefault(model, Counter())
        counts["calls"] += 1
        self.serial += 1
        if body.get("stream"):
            counts["bad_requests"] += 1
            return 400, {"error": {"message": "this model server does not stream", "type": "invalid_request_error"}}
        messages = body.get("messages") or []
        tools = [t.get("function", {}).get("name", "") for t in body.get("tools") or []]
        quote = next((name for name in tools if name.endswith(QUOTE_CAPABILITY)), None)
        if quote is not None and not any(m.get("role") == "tool" for m in messages):
            counts["tool_turns"] += 1
            calls = [
                {
                    "id": f"call_{symbol}_{self.serial}",
                    "type": "function",
                    "function": {"name": quote, "arguments": json.dumps({"symbol": symbol})},
                }
                for symbol in SYMBOLS
            ]
            return 200, _completion(model, {"content": None, "tool_calls": calls}, "tool_calls", self.serial)
        counts["answer_turns"] += 1
        seen = _text(messages)
        missing = [s for s in SYMBOLS if not re.search(rf"(?<![\d.]){re.escape(str(quote_price(s)))}(?![\d])", seen)]
        if missing:
            counts["blind_answers"] += 1
            answer = f"I could not read the quotes of {', '.join(missing)}."
        else:
            answer = expected_answer()
        return 200, _completion(model, {"content": answer}, "stop", self.serial)

    def stats(self) -> dict[str, Any]:
        return {"latency_ms": self.latency * 1000.0, "models": {m: dict(c) for m, c in self.counts.items()}}


class ModelServer:
    def __init__(self) -> None:
        self.model = ScriptedModel()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read(reader)
                if request is None:
                    return
                method, path, body, close = request
                status, answer = await self.route(method, path, body)
                payload = json.dumps(answer).encode()
                head = (
                    f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                    f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
                    f"connection: {'close' if close else 'keep-alive'}\r\n\r\n"
                )
                writer.write(head.encode("latin-1") + payload)
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            return
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "POST" and path.rstrip("/").endswith("/chat/completions") and isinstance(body, dict):
            if self.model.latency:
                await asyncio.sleep(self.model.latency)
            return self.model.reply(body)
        if method == "GET" and path == "/stats":
            return 200, self.model.stats()
        if method == "POST" and path == "/latency" and isinstance(body, dict):
            self.model.latency = max(0.0, float(body.get("ms", 0))) / 1000.0
            return 200, self.model.stats()
        return 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}}


async def _read(reader: asyncio.StreamReader) -> tuple[str, str, Any, bool] | None:
    """One request (method, path, JSON body, whether the client asked to close), or None at end of file."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
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
            if len(raw) > MAX_BODY:
                raise ValueError("request body too large")
        await reader.readline()
    else:
        length = int(headers.get("content-length", "0"))
        if length > MAX_BODY:
            raise ValueError("request body too large")
        raw = await reader.readexactly(length)
    close = headers.get("connection", "").lower() == "close"
    return method, path, json.loads(raw) if raw else None, close


async def main_async(port: int) -> None:
    server = ModelServer()
    listener = await asyncio.start_server(server.serve, "127.0.0.1", port, limit=MAX_BODY)
    print(f"model server listening on {listener.sockets[0].getsockname()[1]}", flush=True)
    async with listener:
        await listener.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    args = parser.parse_args(argv)
    guard()
    try:
        asyncio.run(main_async(args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
