"""MCP servers the tests run as real processes, over stdio or streamable HTTP on 127.0.0.1.

    python tests/mcp_servers.py stdio
    python tests/mcp_servers.py http PORT

The ``inventory`` server counts every tool call it receives in the file named by ``MCP_CALLS_FILE`` (one
line per call: process id, tool, arguments, the idempotency key of the call's ``_meta`` and, over HTTP, the
``authorization`` header), so a test can prove a call never reached it. Which tools it
offers depends on ``MCP_INVENTORY_TOOLS`` (comma-separated; unset: all), so a test can change what a
restarted server offers.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

server = MCPServer("inventory", log_level="WARNING")


def _count(tool: str, arguments: dict, ctx: Context) -> None:
    path = os.environ.get("MCP_CALLS_FILE")
    if path:
        meta = ctx.request_context.meta or {}
        headers = ctx.headers or {}
        call = {
            "pid": os.getpid(),
            "tool": tool,
            "arguments": arguments,
            "idempotency_key": meta.get("agent-lifecycle/idempotency-key"),
            "authorization": headers.get("authorization"),
        }
        with open(path, "a", encoding="utf-8") as calls:
            calls.write(json.dumps(call) + "\n")


def _offered(name: str) -> bool:
    offered = os.environ.get("MCP_INVENTORY_TOOLS")
    return offered is None or name in offered.split(",")


if _offered("stock_level"):

    @server.tool(
        description="How many units of a product are in stock.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def stock_level(sku: str, ctx: Context) -> dict:
        _count("stock_level", {"sku": sku}, ctx)
        return {"sku": sku, "units": len(sku) * 7, "pid": os.getpid()}


if _offered("describe"):

    @server.tool(description="A product's description, as text.", annotations=ToolAnnotations(read_only_hint=True))
    def describe(sku: str, ctx: Context) -> str:
        _count("describe", {"sku": sku}, ctx)
        return f"{sku}: a sturdy widget"


if _offered("discontinue"):

    @server.tool(
        description="Remove a product from the catalogue.",
        annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False),
    )
    def discontinue(sku: str, ctx: Context) -> str:
        _count("discontinue", {"sku": sku}, ctx)
        return f"{sku} discontinued"


if _offered("reorder"):

    @server.tool(description="Order more units of a product.", annotations=ToolAnnotations(destructive_hint=False))
    def reorder(sku: str, units: int, ctx: Context) -> str:
        _count("reorder", {"sku": sku, "units": units}, ctx)
        if units <= 0:
            raise ToolError(f"cannot reorder {units} units")
        return f"ordered {units} of {sku}"


if _offered("crash"):

    @server.tool(description="Exits the server process in the middle of the call.")
    def crash(reason: str, ctx: Context) -> str:
        _count("crash", {"reason": reason}, ctx)
        os._exit(3)


if _offered("flood"):

    @server.tool(description="Returns a very large text.", annotations=ToolAnnotations(read_only_hint=True))
    def flood(size: int, ctx: Context) -> str:
        _count("flood", {"size": size}, ctx)
        return "x" * size


if _offered("wipe_everything"):

    @server.tool(description="Never offered when the configuration denies it.")
    def wipe_everything(ctx: Context) -> str:
        _count("wipe_everything", {}, ctx)
        return "wiped"


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
