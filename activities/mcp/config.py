"""The MCP-servers file: which Model Context Protocol servers a worker takes tools from, validated once at
worker start.

A file is JSON (``.json``) or TOML (``.toml``) holding ``{"servers": [ ... ]}``. Each server is reached
over stdio (``command``: the worker starts it and talks over its stdin/stdout) or streamable HTTP
(``url``, with ``headers``). A server is a tool namespace: its tool ``T`` becomes the tool key
``<namespace>/<name>/T`` and hooks' matchers see it as ``<name>/T``. Credentials (header values whose
names look like credentials, and any ``enc:v1:`` value) are stored encrypted with the declared hooks' key
(``agent-lifecycle hooks encrypt``) and decrypted only when the worker connects.

How a listed tool is governed: ``readOnlyHint`` makes it ``read_only`` (its answers may be cached);
``destructiveHint`` makes every step calling it wait for a reviewer's approval, unless ``approval`` says
otherwise; ``tools`` overrides either per tool; ``allow`` (names or ``fnmatch`` patterns; unset: every
tool) and ``deny`` choose which tools the worker offers at all.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hooks.declarative.config import CommandConfig, HttpConfig

SERVER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
NAMESPACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$"
DEFAULT_NAMESPACE = "mcp"


class McpStartupError(Exception):
    """An MCP server the worker must offer tools from cannot be used: a bad file, or a server that is
    down or refused at start-up. The worker exits non-zero with this message."""


class McpConfigError(McpStartupError):
    """The MCP-servers file is invalid; the message names the file, the server and the field."""


class ToolOverride(BaseModel):
    """What the configuration decides for one tool, over its annotations."""

    model_config = ConfigDict(extra="forbid")

    read_only: bool | None = None
    approval_required: bool | None = None


class McpServerConfig(BaseModel):
    """One MCP server. Exactly one of ``command`` (stdio) and ``url`` (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SERVER_NAME_PATTERN)
    namespace: str = Field(default=DEFAULT_NAMESPACE, pattern=NAMESPACE_PATTERN)
    description: str = ""
    # stdio: the command (a list, or a string split on whitespace), its environment and directory. The
    # server sees only the SDK's minimal environment (PATH, HOME, ...), ``env`` (values may be encrypted)
    # and the worker's variables named in ``allowed_env_vars``.
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    allowed_env_vars: list[str] = Field(default_factory=list)
    cwd: str | None = None
    # streamable HTTP: the endpoint and headers (credentials encrypted).
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    # A server that cannot be reached at start-up: an error that stops the worker, or (optional) a
    # logged absence of its tools.
    optional: bool = False
    startup_timeout_seconds: float = Field(default=20.0, gt=0, le=300)
    allow: list[str] | None = None
    deny: list[str] = Field(default_factory=list)
    # Which tools wait for approval: those annotated destructive (the default), all, or none.
    approval: Literal["destructive", "always", "never"] = "destructive"
    tools: dict[str, ToolOverride] = Field(default_factory=dict)

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: object) -> object:
        return value.split() if isinstance(value, str) else value

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(part for part in value)):
            raise ValueError("command must not be empty")
        return value

    # The same rules as declared hooks' command and HTTP handlers.
    @field_validator("allowed_env_vars")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        return CommandConfig._env_names(value)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return value if value is None else HttpConfig._url(value)

    @field_validator("headers")
    @classmethod
    def _secret_headers_encrypted(cls, value: dict[str, str]) -> dict[str, str]:
        return HttpConfig._secret_headers_encrypted(value)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) and url (streamable HTTP)")
        if self.url is None and self.headers:
            raise ValueError("headers apply to a url server only")
        if self.command is None and (self.env or self.allowed_env_vars or self.cwd):
            raise ValueError("env, allowed_env_vars and cwd apply to a command server only")
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"

    @property
    def target(self) -> str:
        """The server as an operator knows it (a command or a URL; never a header)."""
        return " ".join(self.command) if self.command is not None else str(self.url)

    def offers(self, tool: str) -> bool:
        """Whether the allow- and deny-lists let the worker offer ``tool``."""
        if any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.deny):
            return False
        return self.allow is None or any(fnmatch.fnmatchcase(tool, pattern) for pattern in self.allow)


class McpServersFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servers: list[McpServerConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> McpServersFile:
        seen: set[tuple[str, str]] = set()
        for server in self.servers:
            if (server.namespace, server.name) in seen:
                raise ValueError(f"server {server.namespace}/{server.name} is declared twice")
            seen.add((server.namespace, server.name))
        return self


def load_mcp_servers(path: str | Path) -> list[McpServerConfig]:
    """The servers of an MCP-servers file.

    Raises:
        McpConfigError: the file is missing, not JSON/TOML, or an entry is invalid (named with its field).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise McpConfigError(f"{path}: cannot read the MCP-servers file: {err.strerror or err}") from None
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except ValueError as err:
        raise McpConfigError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {err}") from None
    if not isinstance(raw, dict):
        raise McpConfigError(f'{path}: the file must hold an object {{"servers": [...]}}')
    try:
        return McpServersFile.model_validate(raw).servers
    except ValidationError as err:
        problems = []
        for e in err.errors(include_url=False):
            loc = list(e["loc"])
            where = "servers"
            if loc[:1] == ["servers"] and len(loc) > 1 and isinstance(loc[1], int):
                entries = raw.get("servers") or []
                entry = entries[loc[1]] if loc[1] < len(entries) else None
                name = entry.get("name") if isinstance(entry, dict) else None
                where = f"server {name!r}" if name else f"server #{loc[1] + 1}"
                loc = loc[2:]
            field = ".".join(str(p) for p in loc)
            problems.append(f"{where}{': ' + field if field else ''}: {e['msg']}")
        raise McpConfigError(f"{path}: " + "; ".join(problems)) from None
