"""Connections to MCP servers: a short-lived one to list a server's tools at worker start, and one per
server per worker process for the calls, opened by the first call and reused by every later one.

A stdio server is a child process of the worker: started by the first call, shared by concurrent calls,
and started again by the next call after it dies. A call that the connection breaks under (the process
exits, the HTTP server goes away) fails with :class:`McpServerUnavailable` after dropping the
connection, so the step's retry starts a fresh one; nothing from a dead connection is reused.

An HTTP server's address passes the same SSRF check as HTTP hooks every time a connection opens: the host
is resolved, every address checked (loopback only when the process allows it), and the connection is
pinned to the checked address while the Host header and TLS server name stay the URL's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from workflows.extras import missing_extra

try:
    import anyio
    import httpx2
    import mcp_types
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as err:
    raise missing_extra("mcp", "tools from MCP servers (AGENT_MCP_SERVERS)", err) from err

from hooks.declarative.security import BlockedAddress, ResolvedTarget, SecretBox, decrypted_values, resolve_target

from .config import McpServerConfig

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="agent-lifecycle", version="0.1.0")
MAX_LISTED_PAGES = 100
_CLOSE_TIMEOUT_SECONDS = 10.0
# What a broken transport raises, besides the SDK's own "connection closed".
_TRANSPORT_ERRORS = (OSError, httpx2.HTTPError, anyio.BrokenResourceError, anyio.ClosedResourceError, EOFError)
_CONNECTION_LOST = (mcp_types.CONNECTION_CLOSED,)


class McpServerUnavailable(Exception):
    """The server could not be reached, refused the connection, or went away during the call."""


class McpCredentialError(Exception):
    """An encrypted configuration value cannot be decrypted (no key, or another key)."""


class _PinnedTransport(httpx2.AsyncHTTPTransport):
    """Sends every request to the checked address of the server's host (and nowhere else)."""

    def __init__(self, target: ResolvedTarget) -> None:
        super().__init__(trust_env=False)
        self._target = target

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.host != self._target.host:
            raise httpx2.ConnectError(f"refusing to send to {request.url.host}: not the MCP server's host")
        if request.url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": self._target.host}
        request.url = request.url.copy_with(host=self._target.address)
        return await super().handle_async_request(request)


def decrypted(values: dict[str, str], secrets: SecretBox | None, what: str) -> dict[str, str]:
    """Configuration values as used: encrypted ones (``enc:v1:...``) decrypted now, never stored so."""
    try:
        return decrypted_values(values, secrets, what)
    except ValueError as err:
        raise McpCredentialError(str(err)) from None


class McpConnection:
    """One server's connection in this worker process (see the module docstring for its life).

    Args:
        server: The server's configuration.
        secrets: Decrypts encrypted headers and environment values.
        allow_loopback: Let an HTTP server be on a loopback address (tests; never in production).
    """

    def __init__(self, server: McpServerConfig, *, secrets: SecretBox | None, allow_loopback: bool) -> None:
        self.server = server
        self._secrets = secrets
        self._allow_loopback = allow_loopback
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self.starts = 0  # how many connections this worker opened for calls

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Client]:
        """A new connection (a new process for a stdio server), closed on exit."""
        server = self.server
        async with contextlib.AsyncExitStack() as stack:
            if server.command is not None:
                env = {name: os.environ[name] for name in server.allowed_env_vars if name in os.environ}
                env.update(decrypted(server.env, self._secrets, "environment variable"))
                params = StdioServerParameters(
                    command=server.command[0], args=server.command[1:], env=env, cwd=server.cwd
                )
                transport: Any = stdio_client(params)
            else:
                assert server.url is not None
                url = httpx2.URL(server.url)
                port = url.port or (443 if url.scheme == "https" else 80)
                try:
                    target = await resolve_target(url.host, port, allow_loopback=self._allow_loopback)
                except BlockedAddress as err:
                    raise McpServerUnavailable(f"SSRF protection refused {server.url}: {err}") from None
                http = httpx2.AsyncClient(
                    headers=decrypted(server.headers, self._secrets, "header"),
                    transport=_PinnedTransport(target),
                    trust_env=False,
                    follow_redirects=False,
                    timeout=httpx2.Timeout(30.0, read=300.0),
                )
                await stack.enter_async_context(http)
                transport = streamable_http_client(server.url, http_client=http)
            client = Client(transport, client_info=CLIENT_INFO, cache=None)
            await stack.enter_async_context(client)
            yield client

    async def list_tools(self) -> list[mcp_types.Tool]:
        """Every tool the server lists now, on a connection of its own."""
        async with self.open() as client:
            tools: list[mcp_types.Tool] = []
            cursor: str | None = None
            for _ in range(MAX_LISTED_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None = None
    ) -> mcp_types.CallToolResult:
        """Call ``name`` on this worker's connection (opening it first if there is none or it died).

        Raises:
            McpServerUnavailable: the server cannot be reached or went away during the call (the
                connection is dropped; the next call opens a new one).
            MCPError: the server answered the call with a protocol error.
        """
        client = await self._connected()
        try:
            return await client.call_tool(name, arguments, meta=meta)  # pyright: ignore[reportArgumentType]
        except MCPError as err:
            if err.code not in _CONNECTION_LOST:
                raise
            await self._drop(client)
            raise McpServerUnavailable(f"{self.server.name}: the connection ended during the call ({err})") from None
        except _TRANSPORT_ERRORS as err:
            await self._drop(client)
            raise McpServerUnavailable(
                f"{self.server.name}: the connection failed during the call ({type(err).__name__}: {err})"
            ) from None

    async def _connected(self) -> Client:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is not None and self._owner is not None and not self._owner.done():
                if still_reading(self._client):
                    return self._client
                logger.info("MCP server %s: the connection ended while idle; reconnecting", self.server.name)
            await self._drop(self._client)
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            stop = asyncio.Event()
            ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read here, or by the waiter
            owner = asyncio.create_task(self._own(ready, stop), name=f"mcp-server {self.server.name}")
            try:
                async with asyncio.timeout(self.server.startup_timeout_seconds):
                    client = await asyncio.shield(ready)
            except TimeoutError:
                stop.set()
                owner.cancel()
                raise McpServerUnavailable(
                    f"{self.server.name}: {self.server.target} did not answer within "
                    f"{self.server.startup_timeout_seconds:g} s"
                ) from None
            except BaseException as err:
                stop.set()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(owner, _CLOSE_TIMEOUT_SECONDS)
                if isinstance(err, asyncio.CancelledError):
                    raise
                raise McpServerUnavailable(
                    f"{self.server.name}: cannot connect to {self.server.target}: {error_text(err)}"
                ) from None
            self._client, self._owner, self._stop = client, owner, stop
            self.starts += 1
            return client

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Hold a connection open until ``stop`` (in one task, as the SDK's task groups require)."""
        try:
            async with self.open() as client:
                ready.set_result(client)
                await stop.wait()
        except Exception as err:  # noqa: BLE001 - the caller learns it from ``ready``, or the next call reconnects
            if not ready.done():
                ready.set_exception(err)
            else:
                logger.info("MCP server %s: connection ended: %s", self.server.name, error_text(err))

    async def _drop(self, client: Client | None) -> None:
        """Close the connection ``client`` belongs to, if it is still the current one."""
        if client is None or client is not self._client:
            return
        owner, stop = self._owner, self._stop
        self._client = self._owner = self._stop = None
        if stop is not None:
            stop.set()
        if owner is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(owner, _CLOSE_TIMEOUT_SECONDS)

    async def aclose(self) -> None:
        """Close this worker's connection (a stdio server's process ends)."""
        await self._drop(self._client)


def still_reading(client: Client) -> bool:
    """Whether ``client``'s connection still reads from the server (a stdio server that exited, or an
    HTTP session that ended, closes it). The SDK offers no public flag: its dispatcher's ``_closed``, set
    when the server's stream ends, is read defensively. Without it every connection counts as open, and a
    dead one is found by the call instead, which fails its attempt; the step's retry reconnects."""
    dispatcher = getattr(getattr(client, "_session", None), "_dispatcher", None)
    return not getattr(dispatcher, "_closed", False)


def error_text(err: BaseException) -> str:
    """The innermost useful message of a (possibly grouped) connection error."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    text = str(err) or type(err).__name__
    return text if isinstance(err, McpServerUnavailable | McpCredentialError) else f"{type(err).__name__}: {text}"
