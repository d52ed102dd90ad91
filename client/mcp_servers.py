"""MCP servers in a process: the tools of the servers ``AGENT_MCP_SERVERS`` declares, listed at start-up."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from activities.mcp import McpConfigError, McpServerConfig, load_mcp_servers

from .declared_hooks import secret_box
from .settings import Settings

if TYPE_CHECKING:
    from activities.mcp import McpTool


def settings_mcp_tools(settings: Settings, extra: Sequence[McpServerConfig] = ()) -> list[McpTool]:
    """The tools of ``extra`` and of the servers in ``AGENT_MCP_SERVERS``, listed now (none without a
    server: the ``mcp`` package is loaded only for one).

    Raises:
        McpStartupError: a bad file (``McpConfigError``, naming the server and field), or a server that is
            not optional and cannot be listed.
        MissingExtraError: servers are declared but the ``mcp`` extra is not installed.
    """
    servers = [*extra, *(load_mcp_servers(settings.mcp_servers_file) if settings.mcp_servers_file else [])]
    if not servers:
        return []
    from activities.mcp import load_mcp_tools

    try:
        secrets = secret_box(settings)
    except ValueError as err:
        raise McpConfigError(f"AGENT_HOOK_SECRET_KEY: {err}") from None
    return load_mcp_tools(servers, secrets=secrets, allow_loopback=settings.mcp_allow_loopback)
