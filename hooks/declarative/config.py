"""The declared-hooks file: pydantic models, validated once at worker start.

A file is JSON (``.json``) or TOML (``.toml``) holding ``{"hooks": [ ... ]}``. Each entry names an event,
a handler type with its typed config, a scope, a priority, optional filters (``matcher``: a regex on the
tool name; ``if_expr``: a CEL expression over ``tool_name``, ``tool_input`` and ``depth``) and its
safeguards. Regexes and CEL are compiled here, so a bad expression stops the worker instead of failing
every request. A bad entry raises :class:`DeclaredHookConfigError`, naming the entry and the field.
"""

from __future__ import annotations

import json
import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from workflows.extras import missing_extra

from ..registry import InvalidPipelineConfigError
from .trust import untrusted


def _cel() -> Any:
    """The CEL library, loaded for the first ``if_expr`` (a hooks file without filters never needs it)."""
    try:
        import cel
    except ImportError as err:
        raise missing_extra("cel", "a declared hook's if_expr (a CEL filter)", err) from err
    return cel


DEFAULT_TIMEOUT_MS = 5_000
MAX_TIMEOUT_MS = 10_000
# The time the declared hooks of one event share at each occurrence (configurable, never above this).
MAX_CHAIN_BUDGET_SECONDS = 10.0
DEFAULT_CHAIN_BUDGET_SECONDS = MAX_CHAIN_BUDGET_SECONDS
# Editions and the handler types each allows: a standard deployment runs no local commands.
Edition = Literal["lite", "standard"]
EDITION_HANDLERS: dict[str, frozenset[str]] = {
    "lite": frozenset({"command", "http", "prompt"}),
    "standard": frozenset({"http", "prompt"}),
}
DEFAULT_EDITION: Edition = "lite"
HOOK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,63}$"
# Header names whose values are credentials: they must be stored encrypted (``enc:v1:...``).
_SECRET_HEADER = re.compile(r"(authorization|cookie|token|secret|api[-_]?key|password)", re.IGNORECASE)
ENCRYPTED_PREFIX = "enc:v1:"


class HookEvent(StrEnum):
    """The seven gateway events a declared hook can subscribe to, and whether each one blocks."""

    SESSION_START = "session_start"
    USER_PROMPT_SUBMIT = "user_prompt_submit"
    PRE_TOOL_USE = "pre_tool_use"
    POST_TOOL_USE = "post_tool_use"
    STOP = "stop"
    SUBAGENT_START = "subagent_start"
    SUBAGENT_STOP = "subagent_stop"

    @property
    def blocking(self) -> bool:
        return self in BLOCKING_EVENTS

    @property
    def tool_event(self) -> bool:
        return self in TOOL_EVENTS


BLOCKING_EVENTS = frozenset({HookEvent.USER_PROMPT_SUBMIT, HookEvent.PRE_TOOL_USE, HookEvent.SUBAGENT_START})
TOOL_EVENTS = frozenset(
    {HookEvent.PRE_TOOL_USE, HookEvent.POST_TOOL_USE, HookEvent.SUBAGENT_START, HookEvent.SUBAGENT_STOP}
)


class CommandConfig(BaseModel):
    """Run a local command with the event JSON on stdin. ``command`` is split like a shell would (no shell
    runs it); only ``allowed_env_vars`` pass through from the worker's environment."""

    model_config = ConfigDict(extra="forbid")

    command: str | list[str]
    allowed_env_vars: list[str] = Field(default_factory=list)
    cwd: str | None = None

    @field_validator("command")
    @classmethod
    def _command_not_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str) and not value.strip() or isinstance(value, list) and not value:
            raise ValueError("command must not be empty")
        return value

    @field_validator("allowed_env_vars")
    @classmethod
    def _env_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value


class HttpConfig(BaseModel):
    """POST the event JSON to ``url``. Credential headers are stored encrypted (``enc:v1:...``, made with
    ``agent-lifecycle hooks encrypt``) and decrypted only when the request is sent."""

    model_config = ConfigDict(extra="forbid")

    url: str
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an absolute http(s) URL with a host")
        if parts.username or parts.password:
            raise ValueError("url must not carry credentials; use an encrypted header")
        return value

    @field_validator("headers")
    @classmethod
    def _secret_headers_encrypted(cls, value: dict[str, str]) -> dict[str, str]:
        for name, header in value.items():
            if _SECRET_HEADER.search(name) and not header.startswith(ENCRYPTED_PREFIX):
                raise ValueError(
                    f"header {name!r} carries a credential and must be stored encrypted ({ENCRYPTED_PREFIX}...); "
                    "use `agent-lifecycle hooks encrypt`"
                )
        return value


class PromptConfig(BaseModel):
    """An LLM evaluator behind an OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    model_config = ConfigDict(extra="forbid")

    prompt_template: str = Field(min_length=1, max_length=8_000)
    model: str = Field(min_length=1)
    endpoint: str  # base URL up to and including /v1
    api_key: str | None = None  # enc:v1:... (decrypted at dispatch)
    max_invocations_per_turn: int = Field(default=5, ge=1, le=100)
    max_tokens: int = Field(default=256, ge=16, le=4_096)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return HttpConfig._url(value)

    @field_validator("api_key")
    @classmethod
    def _api_key_encrypted(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(ENCRYPTED_PREFIX):
            raise ValueError(
                f"api_key must be stored encrypted ({ENCRYPTED_PREFIX}...); use `agent-lifecycle hooks encrypt`"
            )
        return value


class _HookBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=HOOK_ID_PATTERN)
    event: HookEvent
    scope: Literal["global", "tenant", "agent"] = "global"
    tenant_id: str | None = None
    agent_id: str | None = None
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    matcher: str | None = None
    if_expr: str | None = None
    timeout_ms: int = Field(default=DEFAULT_TIMEOUT_MS, ge=1, le=MAX_TIMEOUT_MS)
    on_timeout: Literal["block", "allow"] | None = None  # default: block for blocking events, else allow
    enabled: bool = True
    version: int = Field(default=1, ge=1)
    # The handler may run in a policy replay: it reads only and spends nothing (a prompt hook replays its
    # cached decisions whatever this says, and never asks its model).
    shadow_safe: bool = False

    _matcher: re.Pattern[str] | None = PrivateAttr(default=None)
    _program: Any = PrivateAttr(default=None)

    @field_validator("matcher")
    @classmethod
    def _matcher_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"matcher is not a valid regular expression: {err}") from None
        return value

    @field_validator("if_expr")
    @classmethod
    def _cel_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            cel = _cel()
            try:
                cel.compile(value)
            except Exception as err:  # noqa: BLE001 - the CEL library's parse errors have no common type
                raise ValueError(f"if_expr is not a valid CEL expression: {err}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> _HookBase:
        if self.scope == "global" and (self.tenant_id or self.agent_id):
            raise ValueError("scope: a global hook takes no tenant_id or agent_id")
        if self.scope == "tenant" and (not self.tenant_id or self.agent_id):
            raise ValueError("tenant_id: a tenant hook needs tenant_id (and no agent_id)")
        if self.scope == "agent" and not (self.tenant_id and self.agent_id):
            raise ValueError("agent_id: an agent hook needs tenant_id and agent_id")
        if self.matcher is not None and not self.event.tool_event:
            raise ValueError(f"matcher: applies to tool names; event {self.event.value} has no tool")
        self._matcher = re.compile(self.matcher) if self.matcher is not None else None
        self._program = _cel().compile(self.if_expr) if self.if_expr is not None else None
        return self

    @property
    def timeout_decision(self) -> Literal["block", "allow"]:
        if self.on_timeout is not None:
            return self.on_timeout
        return "block" if self.event.blocking else "allow"

    @property
    def compiled_matcher(self) -> re.Pattern[str] | None:
        return self._matcher

    @property
    def program(self) -> Any:
        return self._program


class CommandHook(_HookBase):
    handler_type: Literal["command"]
    config: CommandConfig


class HttpHook(_HookBase):
    handler_type: Literal["http"]
    config: HttpConfig


class PromptHook(_HookBase):
    handler_type: Literal["prompt"]
    config: PromptConfig

    @model_validator(mode="after")
    def _guarded(self) -> PromptHook:
        if self.matcher is None and self.if_expr is None:
            raise ValueError("matcher: a prompt hook needs a matcher or an if_expr (runaway-cost guard)")
        if not self.event.tool_event:
            raise ValueError("event: a prompt hook evaluates tool input only; use a tool event")
        return self


DeclaredHookSpec = Annotated[CommandHook | HttpHook | PromptHook, Field(discriminator="handler_type")]


class DeclaredHooksFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hooks: list[DeclaredHookSpec] = Field(default_factory=list)


REASON_INVALID = "invalid_declared_hook"
# A hooks file, command or script that others could change: the worker would run what they wrote.
REASON_UNTRUSTED = "untrusted_hook_file"


class DeclaredHookConfigError(InvalidPipelineConfigError):
    """A declared-hooks file cannot be used; ``index`` is the entry, ``field`` the offending field;
    ``reason`` is ``invalid_declared_hook``, or ``untrusted_hook_file`` for a file others could change."""

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        hook: str | None = None,
        field: str | None = None,
        reason: str = REASON_INVALID,
    ) -> None:
        super().__init__(message, reason=reason, index=index, hook=hook)
        self.field = field


def parse_hooks(data: Any, *, source: str = "declared hooks") -> list[CommandHook | HttpHook | PromptHook]:
    """Validate a parsed file; the first problem raises, naming the entry (index and id) and the field."""
    if not isinstance(data, dict):
        raise DeclaredHookConfigError(f"{source}: the file must hold an object with a 'hooks' list")
    try:
        parsed = DeclaredHooksFile.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = list(first["loc"])
        index = loc[1] if len(loc) > 1 and loc[0] == "hooks" and isinstance(loc[1], int) else None
        rest = [str(p) for p in loc[2:]] if index is not None else [str(p) for p in loc]
        if rest and rest[0] in ("command", "http", "prompt"):
            rest = rest[1:]  # the discriminated union's tag in the location says nothing to a reader
        field, message = ".".join(rest), first["msg"]
        if first["type"] == "union_tag_invalid":
            field = "handler_type"
        named = re.match(r"Value error, (\w+): (.*)", message, re.DOTALL)
        if not field and named:
            field, message = named.group(1), named.group(2)
        field = field or "(entry)"
        listed = data.get("hooks")
        entries = listed if isinstance(listed, list) else []
        raw = entries[index] if index is not None and index < len(entries) else None
        hook_id = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else None
        who = f"entry {index}" + (f" ({hook_id!r})" if hook_id else "") if index is not None else "file"
        raise DeclaredHookConfigError(
            f"{source}: {who}: field {field}: {message}", index=index, hook=hook_id, field=field
        ) from None
    seen: dict[str, int] = {}
    for index, hook in enumerate(parsed.hooks):
        if hook.id in seen:
            raise DeclaredHookConfigError(
                f"{source}: entry {index} ({hook.id!r}): field id: already used by entry {seen[hook.id]}",
                index=index,
                hook=hook.id,
                field="id",
            )
        seen[hook.id] = index
    return list(parsed.hooks)


def edition_problem(handler_type: str, edition: str) -> str | None:
    """Why ``edition`` refuses a ``handler_type`` hook (None when it allows it)."""
    if handler_type in EDITION_HANDLERS[edition]:
        return None
    allowed = ", ".join(sorted(EDITION_HANDLERS[edition]))
    return f"{handler_type} handlers are not available in the {edition} edition (it allows {allowed})"


def check_edition(
    hooks: list[CommandHook | HttpHook | PromptHook], edition: str, *, source: str = "declared hooks"
) -> None:
    """Refuse, naming the entry, the hook and the edition, the first hook whose handler ``edition`` does
    not allow (disabled ones too: enabling one later must not bring a refused handler back)."""
    if edition not in EDITION_HANDLERS:
        raise DeclaredHookConfigError(f"{source}: unknown edition {edition!r} (one of {', '.join(EDITION_HANDLERS)})")
    for index, hook in enumerate(hooks):
        problem = edition_problem(hook.handler_type, edition)
        if problem is not None:
            raise DeclaredHookConfigError(
                f"{source}: entry {index} ({hook.id!r}): field handler_type: {problem}; use an http or prompt "
                "handler, or the lite edition (AGENT_HOOK_EDITION=lite)",
                index=index,
                hook=hook.id,
                field="handler_type",
            )


def load_hooks_file(path: str | Path) -> list[CommandHook | HttpHook | PromptHook]:
    """Read and validate a declared-hooks file (``.json`` or ``.toml``), which must be one only the
    worker's user or root can change (:func:`~hooks.declarative.trust.untrusted`)."""
    path = Path(path)
    problem = untrusted(path, "declared hooks file")
    if problem is not None:
        raise DeclaredHookConfigError(problem, reason=REASON_UNTRUSTED)
    try:
        text = path.read_text()
    except OSError as err:
        raise DeclaredHookConfigError(f"declared hooks file {path}: {err.strerror or err}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as err:
        raise DeclaredHookConfigError(
            f"declared hooks file {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {err}"
        ) from None
    return parse_hooks(data, source=str(path))
