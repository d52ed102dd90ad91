"""MCP tools as ordinary tools: each tool a server lists at worker start becomes a :class:`McpTool`
subclass with its identity, governance and arguments model, exactly what a hand-written wrapper would
declare. Its steps run as the ordinary ``execute_tool_step`` activity, so every hook, matcher,
checkpoint, idempotency key and size cap applies unchanged.

The tools a worker offers are fixed when it starts: the manifest recorded in each request's history
lists them, so replay never depends on what a server offers later.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import pydantic
from pydantic import BaseModel, ConfigDict, JsonValue, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError, ValidationError
from temporalio.exceptions import ApplicationError

from hooks.declarative.security import SecretBox
from workflows.extras import missing_extra

try:
    import mcp_types
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for
    from mcp.shared.exceptions import MCPError
except ImportError as err:
    raise missing_extra("mcp", "tools from MCP servers (AGENT_MCP_SERVERS)", err) from err

from ..tools import Tool, ToolContext
from .config import McpServerConfig, McpStartupError
from .connection import McpConnection, McpServerUnavailable, error_text

logger = logging.getLogger(__name__)

# The failure types of MCP steps (stable: hooks and operators match on them).
MCP_TOOL_ERROR = "McpToolError"  # the server ran the tool and reported an error (isError), or refused the call
MCP_SERVER_UNAVAILABLE = "McpServerUnavailable"  # retried: the server could not be reached or died mid-call
# Sent in each call's ``_meta``: the same on every retry of a step, so a server can do the work once.
IDEMPOTENCY_KEY_META = "agent-lifecycle/idempotency-key"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_MAX_ERROR_CHARS = 2_000


class McpArguments(BaseModel):
    """Arguments checked against the tool's JSON Schema as the server listed it."""

    model_config = ConfigDict(extra="allow")
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @model_validator(mode="wrap")
    @classmethod
    def _schema(cls, value: Any, handler: Any) -> Any:
        validator = validator_for(cls.input_schema)(cls.input_schema)
        errors = []
        for error in validator.iter_errors(value):
            loc: tuple[str | int, ...] = tuple(error.absolute_path)
            missing = (
                re.match(r"'(.+)' is a required property", error.message) if error.validator == "required" else None
            )
            if missing and not loc:
                loc, kind = (missing.group(1),), PydanticCustomError("missing", "{message}", {"message": error.message})
            else:
                kind = PydanticCustomError("json_schema", "{message}", {"message": error.message})
            errors.append(InitErrorDetails(type=kind, loc=loc, input=error.instance))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return handler(value)

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(cls.input_schema)


class McpTool(Tool):
    """A tool served by an MCP server. Subclasses (one per listed tool) set the identity, ``Arguments``
    and ``tool_name``, the name the server knows it by."""

    tool_name: ClassVar[str]
    server: ClassVar[str]

    def __init__(self, connection: McpConnection) -> None:
        self.connection = connection

    async def run(self, arguments: BaseModel, ctx: ToolContext) -> JsonValue:
        try:
            result = await self.connection.call_tool(
                self.tool_name, arguments.model_dump(mode="json"), meta={IDEMPOTENCY_KEY_META: ctx.idempotency_key}
            )
        except McpServerUnavailable as err:
            raise ApplicationError(str(err), type=MCP_SERVER_UNAVAILABLE) from None
        except (MCPError, pydantic.ValidationError) as err:  # the server refused the call, or answered nonsense
            raise ApplicationError(
                f"{self.server}/{self.tool_name}: {error_text(err)}"[:_MAX_ERROR_CHARS],
                type=MCP_TOOL_ERROR,
                non_retryable=True,
            ) from None
        if result.is_error:
            raise ApplicationError(
                (content_text(result.content) or f"{self.server}/{self.tool_name} reported an error")[
                    :_MAX_ERROR_CHARS
                ],
                type=MCP_TOOL_ERROR,
                non_retryable=True,
            )
        return step_output(result)

    async def aclose(self) -> None:
        await self.connection.aclose()


def content_text(content: Sequence[Any]) -> str:
    """The text blocks of a result, joined by newlines."""
    return "\n".join(block.text for block in content if isinstance(block, mcp_types.TextContent))


def step_output(result: mcp_types.CallToolResult) -> JsonValue:
    """A step's output: the structured content when the server gave it; else its text; else (other
    blocks among them) one entry per block, binary data described rather than copied."""
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(block, mcp_types.TextContent) for block in result.content):
        return content_text(result.content)
    parts: list[JsonValue] = []
    for block in result.content:
        described = block.model_dump(mode="json", exclude_none=True, exclude={"data"})
        resource = described.get("resource")
        if isinstance(resource, dict):
            described["resource"] = {key: value for key, value in resource.items() if key != "blob"}
        parts.append(described)
    return parts


def tool_class(server: McpServerConfig, listed: mcp_types.Tool) -> type[McpTool]:
    """The tool class of one listed tool: its key, description, schema and governance."""
    annotations = listed.annotations or mcp_types.ToolAnnotations()
    override = server.tools.get(listed.name)
    read_only = bool(annotations.read_only_hint)
    approval = {"always": True, "never": False}.get(server.approval, bool(annotations.destructive_hint))
    if override is not None:
        read_only = read_only if override.read_only is None else override.read_only
        approval = approval if override.approval_required is None else override.approval_required
    arguments = type(
        f"{listed.name}Arguments", (McpArguments,), {"input_schema": dict(listed.input_schema or {"type": "object"})}
    )
    return type(
        f"Mcp_{server.name}_{listed.name}",
        (McpTool,),
        {
            "namespace": server.namespace,
            "agent": server.name,
            "capability": listed.name,
            "description": (listed.description or annotations.title or listed.title or "")[:1_000],
            "read_only": read_only,
            "approval_required": approval,
            "Arguments": arguments,
            "tool_name": listed.name,
            "server": server.name,
        },
    )


def server_tools(server: McpServerConfig, listed: Iterable[mcp_types.Tool], connection: McpConnection) -> list[McpTool]:
    """The tools of ``server`` this worker offers: the listed ones its allow- and deny-lists admit."""
    tools: list[McpTool] = []
    for item in listed:
        if not _TOOL_NAME.match(item.name):
            logger.warning("MCP server %s: tool %r skipped: its name is not a tool capability", server.name, item.name)
        elif (problem := _schema_problem(item.input_schema)) is not None:
            logger.warning(
                "MCP server %s: tool %r skipped: its input schema is invalid: %s", server.name, item.name, problem
            )
        elif server.offers(item.name):
            tools.append(tool_class(server, item)(connection))
    for name in server.tools:
        if not any(t.tool_name == name for t in tools):
            logger.warning("MCP server %s: the configuration names tool %r, which it does not offer", server.name, name)
    return tools


def _schema_problem(schema: dict[str, Any]) -> str | None:
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as err:
        return err.message
    return None


def load_mcp_tools(
    servers: Sequence[McpServerConfig], *, secrets: SecretBox | None = None, allow_loopback: bool = False
) -> list[McpTool]:
    """List every server's tools now (concurrently, each on a connection of its own) and return the tools
    the worker offers. Callable from synchronous code, including from inside a running event loop (the
    listing runs on a thread of its own).

    Raises:
        McpStartupError: a server that is not ``optional`` cannot be reached or listed.
    """
    if not servers:
        return []
    connections = [McpConnection(s, secrets=secrets, allow_loopback=allow_loopback) for s in servers]
    listed = _run_on_thread(lambda: asyncio.gather(*(_listing(c) for c in connections)))
    tools: list[McpTool] = []
    problems = []
    for connection, found in zip(connections, listed, strict=True):
        server = connection.server
        if isinstance(found, str):
            if not server.optional:
                problems.append(f"MCP server {server.name!r} ({server.target}) is unavailable: {found}")
                continue
            logger.warning(
                "MCP server %s (%s) is unavailable; it is optional, so the worker offers none of its tools: %s",
                server.name,
                server.target,
                found,
            )
            continue
        offered = server_tools(server, found, connection)
        logger.info(
            "MCP server %s (%s): %d tool(s) offered: %s",
            server.name,
            server.transport,
            len(offered),
            ", ".join(t.tool_name for t in offered) or "(none)",
        )
        tools.extend(offered)
    if problems:
        raise McpStartupError("; ".join(problems))
    return tools


async def _listing(connection: McpConnection) -> list[mcp_types.Tool] | str:
    """The server's tools, or why they cannot be listed."""
    try:
        async with asyncio.timeout(connection.server.startup_timeout_seconds):
            return await connection.list_tools()
    except TimeoutError:
        return f"no answer within {connection.server.startup_timeout_seconds:g} s"
    except Exception as err:  # noqa: BLE001 - every failure to list is the server's absence, reported
        return error_text(err)


def _run_on_thread(make: Any) -> Any:
    """Run the coroutine ``make()`` returns on a new event loop in a thread of its own."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(_awaited(make))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name="mcp-listing", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def _awaited(make: Any) -> Any:
    return await make()
