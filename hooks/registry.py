"""The hook registry: validated once, at worker start-up.

Registration order is execution order. A misconfigured pipeline raises here, so the worker refuses to
start rather than serve requests with a silently weakened control.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Sequence
from typing import Any

from workflows.models import FailurePolicy, HookChain, HookEntry, RunMode, Stage
from workflows.stages import OWN_POLICY_STAGES, STAGE_METHODS, STAGE_PROTOCOLS, TOOL_STAGES

from .contracts import hook_option

MAX_HOOK_TIMEOUT_SECONDS = 600.0


class InvalidPipelineConfigError(ValueError):
    """The hook list cannot be used. ``reason`` is a stable code; ``index`` the zero-based entry."""

    def __init__(self, message: str, *, reason: str, index: int | None = None, hook: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.index = index
        self.hook = hook


class InvalidRequiredAfterPlanningHookError(InvalidPipelineConfigError):
    """The required after-planning marker is misused: ``stage_drift``, ``multiple_required``,
    ``required_not_terminal`` or ``required_not_universal``."""


def _hook_error(name: str, index: int, problem: str, reason: str = "invalid_option") -> InvalidPipelineConfigError:
    """The error refusing the hook ``name`` at ``index`` for ``problem``."""
    return InvalidPipelineConfigError(
        f"hook {name!r} (index {index}): {problem}", reason=reason, index=index, hook=name
    )


# The options that would let the required gate skip some requests: a mandatory control applies to every
# request, so each is a construction error on the required hook (with its value), never a narrowed gate.
_NARROWING_OPTIONS = {
    "scope": lambda value: value != "global",
    "tenant_id": lambda value: value is not None,
    "agent_id": lambda value: value is not None,
    "matcher": lambda value: value is not None,
    "subagent_only": lambda value: value is not False,
}


def _check_universal(hook: Any, index: int, name: str) -> None:
    """The required hook runs for every request: refuse any option that would make it skip some."""
    for option, narrows in _NARROWING_OPTIONS.items():
        value = hook_option(hook, option)
        if narrows(value):
            raise InvalidRequiredAfterPlanningHookError(
                f"required after-planning hook {name!r} (index {index}) sets {option}={value!r}, which would "
                "skip it for some requests; a required hook governs every request — remove the option, or "
                "let the hook itself decide per request",
                reason="required_not_universal",
                index=index,
                hook=name,
            )


def is_required(hook: Any) -> bool:
    return getattr(hook, "required_after_planning", False) is True


def _stage_methods(hook: Any, index: int, name: str) -> list[str]:
    """The stage methods ``hook`` implements, each held against its stage's Protocol: callable, and able
    to take the positional arguments the stage passes (``ctx`` and the stage's values) with no required
    keyword-only parameter. A method that looks like a stage method but names none is refused too."""
    methods = []
    for method, protocol in STAGE_PROTOCOLS.items():
        fn = getattr(hook, method, None)
        if fn is None:
            continue
        problem = "is not callable" if not callable(fn) else _signature_problem(fn, getattr(protocol, method))
        if problem:
            raise _hook_error(name, index, f"{method} {problem}", "signature_mismatch")
        methods.append(method)
    return methods


def _positional(params: Sequence[inspect.Parameter]) -> list[inspect.Parameter]:
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]


def _signature_problem(fn: Any, declared: Any) -> str | None:
    """Why ``fn`` cannot be called as the Protocol method ``declared`` is (None when it can)."""
    expected = _positional(list(inspect.signature(declared).parameters.values()))
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or an extension type: nothing to read, the call will tell
    params = list(signature.parameters.values())
    positional = _positional(params)
    required = [p for p in positional if p.default is p.empty]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    wanted = f"({', '.join(p.name for p in expected)})"
    if keyword_only:
        return f"{signature} requires keyword-only {', '.join(keyword_only)}; the stage passes {wanted} by position"
    if len(required) > len(expected) or (len(positional) < len(expected) and not variadic):
        return f"{signature} must take {len(expected)} positional argument(s) {wanted}"
    return None


# Methods of the hook API that are not stages (work a hook hands over, leases it keeps).
_NOT_STAGES = frozenset({"run_detached", "renew_lease", "release_lease"})
_STAGE_PREFIXES = ("before_", "after_", "on_")


def _snake(method: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", method).lower()


def _near_miss(hook: Any) -> tuple[str, str] | None:
    """A public method spelt like a stage method but naming none (``after_synthesys``, ``beforeTool``),
    which would never run, and the stage method it most likely meant."""
    for attribute in dir(hook):
        if attribute.startswith("_") or attribute in STAGE_PROTOCOLS or attribute in _NOT_STAGES:
            continue
        snake = _snake(attribute)
        if not snake.startswith(_STAGE_PREFIXES) or not callable(getattr(hook, attribute, None)):
            continue
        if snake in STAGE_PROTOCOLS:
            return attribute, snake
        meant = difflib.get_close_matches(snake, STAGE_PROTOCOLS, n=1, cutoff=0.8)
        if meant:
            return attribute, meant[0]
    return None


def _refuse_near_misses(hook: Any, index: int, name: str) -> None:
    miss = _near_miss(hook)
    if miss is not None:
        raise _hook_error(
            name,
            index,
            f"{miss[0]} is not a stage method; did you mean {miss[1]}? "
            f"(the stage methods: {', '.join(STAGE_PROTOCOLS)})",
            "unknown_stage_method",
        )


SCOPES = ("global", "tenant", "agent")


def _check_scope(hook: Any, index: int, name: str) -> None:
    scope = hook_option(hook, "scope")
    tenant, agent = hook_option(hook, "tenant_id"), hook_option(hook, "agent_id")
    problem = None
    if scope not in SCOPES:
        problem = f"scope {scope!r} is not one of {list(SCOPES)}"
    elif scope == "tenant" and not tenant:
        problem = "a tenant-scoped hook needs tenant_id"
    elif scope == "agent" and not (tenant and agent):
        problem = "an agent-scoped hook needs tenant_id and agent_id"
    if problem:
        raise _hook_error(name, index, problem)


def _tool_filter(hook: Any, index: int, name: str, stages: list[Stage]) -> tuple[str | None, bool]:
    """A hook's ``matcher`` and ``subagent_only``: checked here, applied by the workflow at tool stages."""
    matcher, subagent_only = hook_option(hook, "matcher"), hook_option(hook, "subagent_only")
    problem = None
    if matcher is not None and not (isinstance(matcher, str) and matcher):
        problem = "matcher must be a non-empty regex string or None"
    elif matcher is not None:
        try:
            re.compile(matcher)
        except re.error as err:
            problem = f"matcher {matcher!r} is not a valid regex: {err}"
    if problem is None and not isinstance(subagent_only, bool):
        problem = "subagent_only must be a bool"
    if problem is None and (matcher is not None or subagent_only) and not set(stages) & TOOL_STAGES:
        problem = "matcher and subagent_only apply to tool stages only (before_tool, on_tool_error, after_tool)"
    if problem:
        raise _hook_error(name, index, problem)
    return matcher, subagent_only


def _failure_policy(hook: Any, index: int, name: str, stages: list[Stage]) -> FailurePolicy | None:
    """A hook's own ``failure_policy``: checked here, applied by the workflow's decisions."""
    value = hook_option(hook, "failure_policy")
    if value is None:
        return None
    try:
        policy = FailurePolicy(value)
    except ValueError:
        problem = f"failure_policy {value!r} is not one of {[p.value for p in FailurePolicy]}"
    else:
        if set(stages) & OWN_POLICY_STAGES:
            return policy
        problem = "failure_policy does not apply to after_planning (use the required marker) or observers"
    raise _hook_error(name, index, problem)


def visible_to(hook: Any, tenant_id: str | None, agent_id: str | None) -> bool:
    """Tenant isolation: a request sees global hooks, its own tenant's, and its own agent's."""
    scope = hook_option(hook, "scope")
    if scope == "global":
        return True
    if tenant_id is None or hook_option(hook, "tenant_id") != tenant_id:
        return False
    return scope == "tenant" or (agent_id is not None and hook_option(hook, "agent_id") == agent_id)


class HookRegistry:
    """An ordered, validated list of hooks and the manifest entries the workflow runs from."""

    def __init__(self, hooks: Sequence[Any] | None, *, pipeline: str = "default") -> None:
        hooks = list(hooks or [])
        entries: list[HookEntry] = []
        names: set[str] = set()
        for index, hook in enumerate(hooks):
            if hook is None:
                raise InvalidPipelineConfigError(
                    f"invalid orchestrator config: pipeline hook at index {index} is None; remove the entry "
                    "or supply an initialized hook",
                    reason="nil_hook",
                    index=index,
                )
            name = getattr(hook, "name", None)
            if not isinstance(name, str) or not name.strip():
                raise InvalidPipelineConfigError(
                    f"pipeline hook at index {index} ({type(hook).__name__}) has no name; names must be non-empty",
                    reason="empty_name",
                    index=index,
                )
            if name in names:
                raise InvalidPipelineConfigError(
                    f"pipeline hook at index {index}: name {name!r} is already registered; names must be unique",
                    reason="duplicate_name",
                    index=index,
                    hook=name,
                )
            names.add(name)
            methods = _stage_methods(hook, index, name)
            required = is_required(hook)
            if "before_planning" in methods and "before_planning_decision" in methods:
                raise InvalidPipelineConfigError(
                    f"hook {name!r} (index {index}) implements both before_planning and before_planning_decision; "
                    "implement one before_planning contract",
                    reason="ambiguous_before_planning",
                    index=index,
                    hook=name,
                )
            if required and "after_planning" not in methods:
                miss = _near_miss(hook)
                hint = f" ({miss[0]} is not a stage method; did you mean {miss[1]}?)" if miss else ""
                raise InvalidRequiredAfterPlanningHookError(
                    f"hook {name!r} (index {index}) is marked required after-planning but does not implement "
                    f"after_planning(ctx, plan){hint}",
                    reason="stage_drift",
                    index=index,
                    hook=name,
                )
            if required:
                _check_universal(hook, index, name)
            if not methods:
                miss = _near_miss(hook)
                hint = f" ({miss[0]} is not a stage method; did you mean {miss[1]}?)" if miss else ""
                raise InvalidPipelineConfigError(
                    f"hook {name!r} (index {index}) implements no stage; define one of {', '.join(STAGE_METHODS)}"
                    + hint,
                    reason="no_stage",
                    index=index,
                    hook=name,
                )
            _refuse_near_misses(hook, index, name)
            entries.append(self._entry(hook, index, name, methods, required))
            _check_scope(hook, index, name)
        # One ordering rule for Python and declared hooks: priority highest first, then
        # registration order. Validation below runs on the order the hooks will execute in.
        priorities = [hook_option(hook, "priority") for hook in hooks]
        entries.sort(key=lambda e: (-priorities[e.index], e.index))
        self._validate_required(entries)
        self.pipeline = pipeline
        self.hooks = hooks
        self.entries = entries
        self._by_name = {entry.name: hooks[entry.index] for entry in entries}

    @staticmethod
    def _entry(hook: Any, index: int, name: str, methods: list[str], required: bool) -> HookEntry:
        run_mode = hook_option(hook, "run_mode")
        timeout = hook_option(hook, "timeout_seconds")
        attempts = hook_option(hook, "max_attempts")
        priority = hook_option(hook, "priority")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise _hook_error(name, index, "priority must be an integer")
        try:
            run_mode = RunMode(run_mode)
        except ValueError:
            raise _hook_error(
                name, index, f"run_mode {run_mode!r} is not one of {[m.value for m in RunMode]}"
            ) from None
        if not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_HOOK_TIMEOUT_SECONDS:
            raise _hook_error(name, index, f"timeout_seconds must be in (0, {MAX_HOOK_TIMEOUT_SECONDS:g}]")
        if not isinstance(attempts, int) or attempts < 1:
            raise _hook_error(name, index, "max_attempts must be an integer >= 1")
        stages = list(dict.fromkeys(STAGE_METHODS[m] for m in methods))
        contract = None
        if "before_planning_decision" in methods:
            contract = "decision"
        elif "before_planning" in methods:
            contract = "legacy"
        matcher, subagent_only = _tool_filter(hook, index, name, stages)
        policy = _failure_policy(hook, index, name, stages)
        chain = hook_option(hook, "chain")
        if chain is not None and not isinstance(chain, HookChain):
            raise _hook_error(name, index, f"chain must be a HookChain or None, got {type(chain).__name__}")
        return HookEntry(
            name=name,
            index=index,
            stages=stages,
            required=required,
            before_planning_contract=contract,
            run_mode=run_mode,
            timeout_seconds=float(timeout),
            max_attempts=attempts,
            tool_matcher=matcher,
            subagent_only=subagent_only,
            failure_policy=policy,
            chain=chain,
        )

    @staticmethod
    def _validate_required(entries: list[HookEntry]) -> None:
        required = [e for e in entries if e.required]
        if len(required) > 1:
            names = ", ".join(f"{e.name!r} (index {e.index})" for e in required)
            raise InvalidRequiredAfterPlanningHookError(
                f"only one required after-planning hook may be registered; found {names}. Compose mandatory "
                "checks inside one terminal required hook",
                reason="multiple_required",
                index=required[1].index,
                hook=required[1].name,
            )
        if required:
            last = [e for e in entries if e.implements(Stage.AFTER_PLANNING)][-1]
            if last.name != required[0].name:
                raise InvalidRequiredAfterPlanningHookError(
                    f"required after-planning hook {required[0].name!r} (index {required[0].index}) must be the "
                    f"last after_planning participant, but {last.name!r} (index {last.index}) follows it",
                    reason="required_not_terminal",
                    index=last.index,
                    hook=required[0].name,
                )

    def visible_entries(self, tenant_id: str | None, agent_id: str | None) -> list[HookEntry]:
        """The entries a request of this tenant and agent runs: global hooks, its tenant's and its agent's."""
        return [e for e in self.entries if visible_to(self._by_name[e.name], tenant_id, agent_id)]

    def hook(self, name: str) -> Any:
        """The hook object registered under ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise LookupError(f"no hook named {name!r} in pipeline {self.pipeline!r}") from None

    def __len__(self) -> int:
        return len(self.hooks)
