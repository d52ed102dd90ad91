"""MCP servers in a process: the tools of the servers ``AGENT_MCP_SERVERS`` declares, listed at start-up."""

from __future__ import annotations

from collections.abc import Sequence

from activities.mcp import McpConfigError, McpServerConfig, McpTool, load_mcp_servers, load_mcp_tools

from .declared_hooks import secret_box
from .settings import Settings


def settings_mcp_tools(settings: Settings, extra: Sequence[McpServerConfig] = ()) -> list[McpTool]:
    """The tools of ``extra`` and of the servers in ``AGENT_MCP_SERVERS``, listed now.

    Raises:
        McpStartupError: a bad file (``McpConfigError``, naming the server and field), or a server that is
            not optional and cannot be listed.
    """
    servers = [*extra, *(load_mcp_servers(settings.mcp_servers_file) if settings.mcp_servers_file else [])]
    try:
        secrets = secret_box(settings)
    except ValueError as err:
        raise McpConfigError(f"AGENT_HOOK_SECRET_KEY: {err}") from None
    return load_mcp_tools(servers, secrets=secrets, allow_loopback=settings.mcp_allow_loopback)
