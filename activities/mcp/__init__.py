"""Tools from Model Context Protocol servers: the servers' configuration, the worker's connections to
them, and the tools each listed tool becomes (ordinary tools: every hook applies to their calls).

The configuration loads without the ``mcp`` package; the connections and tools load on first use and
need the ``mcp`` extra (``pip install 'agent-lifecycle[mcp]'``), which their import names when missing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hooks._lazy import lazy_getattr

from .config import McpConfigError, McpServerConfig, McpStartupError, ToolOverride, load_mcp_servers

if TYPE_CHECKING:
    from .connection import McpConnection, McpServerUnavailable
    from .tools import MCP_SERVER_UNAVAILABLE, MCP_TOOL_ERROR, McpTool, load_mcp_tools

_WHERE = {
    "McpConnection": ".connection",
    "McpServerUnavailable": ".connection",
    "MCP_SERVER_UNAVAILABLE": ".tools",
    "MCP_TOOL_ERROR": ".tools",
    "McpTool": ".tools",
    "load_mcp_tools": ".tools",
}

__all__ = [
    "MCP_SERVER_UNAVAILABLE",
    "MCP_TOOL_ERROR",
    "McpConfigError",
    "McpConnection",
    "McpServerConfig",
    "McpServerUnavailable",
    "McpStartupError",
    "McpTool",
    "ToolOverride",
    "is_mcp_tool",
    "load_mcp_servers",
    "load_mcp_tools",
]


def is_mcp_tool(tool: object) -> bool:
    """Whether ``tool`` came from an MCP server (False in a process that never loaded an MCP tool)."""
    tools = sys.modules.get(f"{__name__}.tools")
    return tools is not None and isinstance(tool, tools.McpTool)


__getattr__ = lazy_getattr(globals(), _WHERE)
