"""Identical calls of one request, found before they run, writes included.

A read-only call whose tool and resolved arguments equal an earlier successful step's is answered from
that step (``cached``) once it has passed before_tool unchanged — a rewrite of its arguments makes it a
call of its own; a write that repeats an earlier successful write is not run again (skipped, reason
``duplicate``). A call identical to one that is running (two equal steps of one phase) waits for it and is
then answered the same way, so of identical calls only one runs. Failed and skipped steps are never reused.
Workflow code only.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from .models import Plan, PlanStep, StepResult, StepStatus, ToolCall
    from .run_state import RunState


class IdenticalCalls:
    """What a request's calls repeat (see the module docstring)."""

    def __init__(self, state: RunState) -> None:
        self._state = state
        self._tool_keys: dict[str, str] = {}  # every step of the request so far -> its tool's key
        self._running: dict[tuple[str, str], str] = {}  # (tool key, canonical arguments) -> the last step to run it

    def planned(self, plan: Plan) -> None:
        """Know the tools of a plan's steps (what an earlier step called is compared by its tool's key)."""
        self._tool_keys.update((step.step_id, step.tool_key) for step in plan.steps)

    def read_only(self, step: PlanStep) -> bool:
        return any(t.key == step.tool_key and t.read_only for t in self._state.manifest.tools)

    def earlier_success(self, step: PlanStep, arguments: dict[str, Any], *, cached: bool) -> StepResult | None:
        """An earlier step of the request that succeeded calling ``step``'s tool with these arguments (never a
        failed, skipped or recovered one; ``cached``: also one that was itself answered from another)."""
        wanted = canonical(arguments)
        for earlier in self._state.results.values():
            if (
                earlier.status is StepStatus.SUCCEEDED
                and earlier.recovered_from is None
                and (cached or earlier.cached_from is None)
                and self._tool_keys.get(earlier.step_id) == step.tool_key
                and canonical(earlier.arguments or {}) == wanted
            ):
                return earlier
        return None

    def cached_read(self, step: PlanStep, call: ToolCall) -> StepResult | None:
        """The earlier step a read-only call repeats, if it repeats one."""
        return self.earlier_success(step, call.arguments, cached=True) if self.read_only(step) else None

    def repeats(self, step: PlanStep, call: ToolCall) -> bool:
        """Whether the call repeats a finished step, or one of its twins is running."""
        if self.cached_read(step, call) or self.earlier_success(step, call.arguments, cached=False):
            return True
        return self._running.get(_key(step, call)) not in (None, *self._state.results)

    def start(self, step: PlanStep, call: ToolCall) -> str | None:
        """Claim the call for ``step`` until its result is in (an identical call waits for it): the twin
        still running that it must wait for first, if any."""
        key = _key(step, call)
        twin = self._running.get(key)
        self._running[key] = step.step_id
        return twin if twin is not None and twin not in self._state.results else None

    def answer(self, step: PlanStep, call: ToolCall, result: StepResult, read: StepResult | None) -> bool:
        """Answer a call that repeats an earlier one without running it: a read (``read``: the earlier step
        it repeats, when before_tool left its arguments as they were) from the earlier step's result; a
        write not at all. Whether it was answered (the tool must not run)."""
        if read is not None:
            result.status, result.cached_from = StepStatus.SUCCEEDED, read.cached_from or read.step_id
            result.output, result.result = copy.deepcopy(read.output), read.result
            result.duration_ms = 0.0
            return True
        if self.read_only(step):
            return False
        repeated = self.earlier_success(step, call.arguments, cached=False)
        if repeated is None:
            return False
        result.skip_reason, result.skip_detail = "duplicate", f"same call as {repeated.step_id}"
        result.result = f"{step.tool} was not run again: {repeated.step_id} already made this call"
        return True


def canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _key(step: PlanStep, call: ToolCall) -> tuple[str, str]:
    return step.tool_key, canonical(call.arguments)
