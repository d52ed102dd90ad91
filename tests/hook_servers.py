"""Local HTTP servers for declared-hook tests, on loopback in the test process: a webhook that answers
as each test scripts it, and an OpenAI-compatible chat-completions endpoint whose evaluator "model"
answers with a scripted ``decide`` tool call (or free text)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list → JSON; str/bytes sent as is
    delay: float = 0.0
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class _Server:
    """A threaded HTTP server; ``respond(received) -> Reply`` decides each answer."""

    respond: Callable[[Received], Reply]
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                owner.received.append(received)
                reply = owner.respond(received)
                if reply.delay:
                    time.sleep(reply.delay)
                data = reply.body
                if isinstance(data, (dict, list)):
                    data = json.dumps(data).encode()
                elif isinstance(data, str):
                    data = data.encode()
                elif data is None:
                    data = b""
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", reply.content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the hook gave up (timeout): nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Receiver(_Server):
    """A server answering each request with ``respond(received)`` (a test decides as the requests come)."""


class Webhook(_Server):
    """A webhook answering from ``replies`` in order (the last one repeats)."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies) or [Reply(body={"decision": "allow"})]
        self.calls = 0
        super().__init__(respond=self._next)

    def _next(self, received: Received) -> Reply:
        self.calls += 1
        return self.replies[min(self.calls - 1, len(self.replies) - 1)]


def decide_reply(
    decision: str = "allow",
    reason: str = "ok",
    *,
    injection: bool = False,
    updated_input: dict | None = None,
    tokens: int = 50,
) -> Reply:
    """A chat-completions answer that calls ``decide``."""
    arguments = {"decision": decision, "reason": reason, "injection_detected": injection}
    if updated_input is not None:
        arguments["updated_input"] = updated_input
    return Reply(
        body={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "decide", "arguments": json.dumps(arguments)},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": tokens - 10, "completion_tokens": 10, "total_tokens": tokens},
        }
    )


def free_text_reply(text: str = "Looks fine to me, allow it.", tokens: int = 30) -> Reply:
    return Reply(
        body={
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": tokens - 5, "completion_tokens": 5, "total_tokens": tokens},
        }
    )


class ChatCompletions(_Server):
    """``POST /v1/chat/completions``: ``evaluate(request_body) -> Reply`` plays the evaluator model."""

    def __init__(self, evaluate: Callable[[dict], Reply] | None = None) -> None:
        self.evaluate = evaluate or (lambda body: decide_reply())
        super().__init__(respond=self._answer)

    def _answer(self, received: Received) -> Reply:
        if received.path != "/v1/chat/completions":
            return Reply(status=404, body={"error": "not found"})
        return self.evaluate(received.body)

    @property
    def endpoint(self) -> str:
        return self.url + "/v1"

    @property
    def requests(self) -> list[dict]:
        return [r.body for r in self.received if r.path == "/v1/chat/completions"]
