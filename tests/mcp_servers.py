"""MCP servers the tests run as real processes, over stdio or streamable HTTP on 127.0.0.1.

    python tests/mcp_servers.py stdio
    python tests/mcp_servers.py http PORT

The ``inventory`` server counts every tool call it receives in the file named by ``MCP_CALLS_FILE`` (one
line per call: process id, tool, arguments), so a test can prove a call never reached it. Which tools it
offers depends on ``MCP_INVENTORY_TOOLS`` (comma-separated; unset: all), so a test can change what a
restarted server offers.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("inventory")


def _count(tool: str, arguments: dict) -> None:
    path = os.environ.get("MCP_CALLS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as calls:
            calls.write(json.dumps({"pid": os.getpid(), "tool": tool, "arguments": arguments}) + "\n")


def _offered(name: str) -> bool:
    offered = os.environ.get("MCP_INVENTORY_TOOLS")
    return offered is None or name in offered.split(",")


if _offered("stock_level"):

    @server.tool(
        description="How many units of a product are in stock.",
        annotations=ToolAnnotations(read_only_hint=True),
    )
    def stock_level(sku: str) -> dict:
        _count("stock_level", {"sku": sku})
        return {"sku": sku, "units": len(sku) * 7, "pid": os.getpid()}


if _offered("describe"):

    @server.tool(description="A product's description, as text.", annotations=ToolAnnotations(read_only_hint=True))
    def describe(sku: str) -> str:
        _count("describe", {"sku": sku})
        return f"{sku}: a sturdy widget"


if _offered("discontinue"):

    @server.tool(
        description="Remove a product from the catalogue.",
        annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False),
    )
    def discontinue(sku: str) -> str:
        _count("discontinue", {"sku": sku})
        return f"{sku} discontinued"


if _offered("reorder"):

    @server.tool(description="Order more units of a product.", annotations=ToolAnnotations(destructive_hint=False))
    def reorder(sku: str, units: int) -> str:
        _count("reorder", {"sku": sku, "units": units})
        if units <= 0:
            raise ValueError(f"cannot reorder {units} units")
        return f"ordered {units} of {sku}"


if _offered("crash"):

    @server.tool(description="Exits the server process in the middle of the call.")
    def crash(reason: str) -> str:
        _count("crash", {"reason": reason})
        os._exit(3)


if _offered("flood"):

    @server.tool(description="Returns a very large text.", annotations=ToolAnnotations(read_only_hint=True))
    def flood(size: int) -> str:
        _count("flood", {"size": size})
        return "x" * size


if _offered("wipe_everything"):

    @server.tool(description="Never offered when the configuration denies it.")
    def wipe_everything() -> str:
        _count("wipe_everything", {})
        return "wiped"


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
