"""``allowed-operations``: the pipeline's required after-planning hook.

It allows a plan only if every step's (namespace, agent, capability) is on an allow-list taken from
trusted application configuration, never from the prompt or planner output. It is the pipeline's
fail-closed boundary: if it raises, the request fails with ``RequiredAfterPlanningError`` and no tool runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from workflows.models import Plan

from ..contracts import HookRejection, PipelineContext, PipelineHook, RequiredAfterPlanningHook


class Operation(NamedTuple):
    namespace: str
    agent: str
    capability: str

    @classmethod
    def parse(cls, text: str) -> Operation:
        """``"demo-tools/stock-service/stock_quote"`` → Operation."""
        parts = text.strip().split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"operation {text!r} must be namespace/agent/capability")
        return cls(*parts)

    def __str__(self) -> str:
        return "/".join(self)


class AllowedOperationsHook(RequiredAfterPlanningHook, PipelineHook):
    """Deny any plan with a step outside the allow-list.

    Args:
        allowed: Operations as :class:`Operation` or ``"namespace/agent/capability"`` strings.
    """

    name = "allowed-operations"

    def __init__(self, allowed: Iterable[Operation | str]) -> None:
        # Copied once; concurrent invocations only read it.
        self.allowed = frozenset(op if isinstance(op, Operation) else Operation.parse(op) for op in allowed)

    def after_planning(self, ctx: PipelineContext, plan: Plan) -> Plan:
        for step in plan.steps:
            operation = Operation(step.namespace, step.agent, step.capability)
            if operation not in self.allowed:
                raise HookRejection(
                    f"step {step.step_id} uses operation {operation}, which this application does not allow"
                )
        return plan
