"""Tools from Model Context Protocol servers: the servers' configuration, the worker's connections to
them, and the tools each listed tool becomes (ordinary tools: every hook applies to their calls)."""

from .config import McpConfigError, McpServerConfig, McpStartupError, ToolOverride, load_mcp_servers
from .connection import McpConnection, McpServerUnavailable
from .tools import MCP_SERVER_UNAVAILABLE, MCP_TOOL_ERROR, McpTool, load_mcp_tools

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
    "load_mcp_servers",
    "load_mcp_tools",
]
