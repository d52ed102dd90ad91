"""The demo's tools, namespace ``demo-tools``: a read-only quote, a trade that writes to a local ledger,
and a message that writes to a local outbox (the writers are idempotent by the step's key); and a
company profile served by the demo's own MCP server (``demo/mcp_server.py``, started over stdio)."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from activities.mcp import McpServerConfig
from activities.tools import Tool, ToolContext
from storage.sqlite import private_directory, private_opener

NAMESPACE = "demo-tools"


class QuoteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    symbol: str = Field(pattern=r"^[A-Z]{1,5}$", description="Ticker symbol, upper case")


class TradeArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    symbol: str = Field(pattern=r"^[A-Z]{1,5}$")
    side: Literal["buy", "sell"]
    quantity: int = Field(gt=0, le=1_000_000)


class MessageArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str = Field(min_length=1, max_length=128)
    text: str = Field(min_length=1, max_length=2_000)


def quote_price(symbol: str) -> float:
    """A deterministic price per symbol, so runs and tests are repeatable."""
    digest = int(hashlib.sha256(symbol.encode()).hexdigest()[:8], 16)
    return round(10 + (digest % 49_000) / 100, 2)


class StockQuote(Tool):
    namespace = NAMESPACE
    agent = "stock-service"
    capability = "stock_quote"
    description = "Current price of a stock (read-only)"
    read_only = True
    Arguments = QuoteArguments

    async def run(self, arguments: QuoteArguments, ctx: ToolContext) -> JsonValue:
        return {"symbol": arguments.symbol, "price": quote_price(arguments.symbol), "currency": "USD"}


class _JsonlJournal:
    """An append-only JSON-lines file whose entries are unique by idempotency key, safe across
    processes (an exclusive file lock around read-check-append)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _append_once(self, key: str, entry: dict) -> dict:
        private_directory(self.path.parent)
        with open(self.path, "a+", encoding="utf-8", opener=private_opener) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                for line in f:
                    existing = json.loads(line)
                    if existing.get("idempotency_key") == key:
                        return {**existing, "replayed": True}
                record = {"idempotency_key": key, **entry, "recorded_at": time.time()}
                f.write(json.dumps(record) + "\n")
                f.flush()
                return {**record, "replayed": False}
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    async def append_once(self, key: str, entry: dict) -> dict:
        return await asyncio.to_thread(self._append_once, key, entry)

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]


class ExecuteTrade(Tool):
    namespace = NAMESPACE
    agent = "stock-service"
    capability = "execute_trade"
    description = "Buy or sell shares (writes to the ledger)"
    Arguments = TradeArguments

    def __init__(self, ledger_path: str | Path) -> None:
        self.ledger = _JsonlJournal(Path(ledger_path))

    async def run(self, arguments: TradeArguments, ctx: ToolContext) -> JsonValue:
        entry = await self.ledger.append_once(
            ctx.idempotency_key,
            {
                "order_id": f"ord-{ctx.idempotency_key[-12:]}",
                "symbol": arguments.symbol,
                "side": arguments.side,
                "quantity": arguments.quantity,
                "price": quote_price(arguments.symbol),
                "request_id": ctx.request_id,
            },
        )
        return {k: entry[k] for k in ("order_id", "symbol", "side", "quantity", "price", "replayed")}


class SendMessage(Tool):
    namespace = NAMESPACE
    agent = "notify-service"
    capability = "send_message"
    description = "Send a message to a person (writes to the outbox)"
    approval_required = True  # a reviewer approves every message before it is sent
    Arguments = MessageArguments

    def __init__(self, outbox_path: str | Path) -> None:
        self.outbox = _JsonlJournal(Path(outbox_path))

    async def run(self, arguments: MessageArguments, ctx: ToolContext) -> JsonValue:
        entry = await self.outbox.append_once(
            ctx.idempotency_key, {"to": arguments.to, "text": arguments.text, "request_id": ctx.request_id}
        )
        return {"to": entry["to"], "delivered": True, "replayed": entry["replayed"]}


def demo_tools(state_dir: str | Path) -> list[Tool]:
    state = Path(state_dir)
    return [StockQuote(), ExecuteTrade(state / "ledger.jsonl"), SendMessage(state / "outbox.jsonl")]


def demo_mcp_servers() -> list[McpServerConfig]:
    """The demo's MCP server: ``research-service`` (its ``company_profile`` is read-only), a child process
    of the worker speaking over stdio."""
    return [
        McpServerConfig(
            name="research-service",
            namespace=NAMESPACE,
            description="company research",
            command=[sys.executable, str(Path(__file__).with_name("mcp_server.py"))],
        )
    ]
