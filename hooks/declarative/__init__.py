"""Declared hooks: hooks written in a configuration file — command, http and prompt handlers
with scopes, matchers, CEL filters, fail-closed blocking events, a circuit breaker and an audit table —
registered in the same :class:`~hooks.registry.HookRegistry` as Python hooks."""

from .config import (
    BLOCKING_EVENTS,
    DEFAULT_CHAIN_BUDGET_SECONDS,
    EDITION_HANDLERS,
    MAX_CHAIN_BUDGET_SECONDS,
    CommandConfig,
    CommandHook,
    DeclaredHookConfigError,
    HookEvent,
    HttpConfig,
    HttpHook,
    PromptConfig,
    PromptHook,
    check_edition,
    load_hooks_file,
    parse_hooks,
)
from .dispatch import (
    DeclaredHook,
    DeclaredHookRuntime,
    DispatchResult,
    InvocationIdentity,
    declared_hook,
    declared_hooks,
    dispatch,
    dry_run,
    ignored_answers,
    load_declared_hooks,
)
from .handlers import HandlerError, HandlerResult, prompt_cache_key
from .security import BlockedAddress, SecretBox, address_problem, resolve_target
from .store import ExecutionRow, HookStore

__all__ = [
    "BLOCKING_EVENTS",
    "BlockedAddress",
    "DEFAULT_CHAIN_BUDGET_SECONDS",
    "EDITION_HANDLERS",
    "MAX_CHAIN_BUDGET_SECONDS",
    "CommandConfig",
    "CommandHook",
    "DeclaredHook",
    "DeclaredHookConfigError",
    "DeclaredHookRuntime",
    "DispatchResult",
    "ExecutionRow",
    "HandlerError",
    "HandlerResult",
    "HookEvent",
    "HookStore",
    "HttpConfig",
    "HttpHook",
    "InvocationIdentity",
    "PromptConfig",
    "PromptHook",
    "SecretBox",
    "address_problem",
    "check_edition",
    "declared_hook",
    "declared_hooks",
    "dispatch",
    "dry_run",
    "ignored_answers",
    "load_declared_hooks",
    "load_hooks_file",
    "parse_hooks",
    "prompt_cache_key",
    "resolve_target",
]
