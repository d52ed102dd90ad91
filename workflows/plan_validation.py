"""Structural plan validation: the part of the gauntlet that needs only the tool catalog.

Argument validation against each tool's parameter model runs beside this in the activities, where the
tools live. Both run after the planner and after every after_planning mutation (seed 000 §4.2).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .models import Plan, ToolSpec

STEP_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
MAX_PROBLEMS = 10


def plan_problems(plan: Plan, tools: Iterable[ToolSpec], *, max_steps: int, phase: int | None = None) -> list[str]:
    """Everything wrong with ``plan``, bounded to the first ``MAX_PROBLEMS`` findings; empty when valid.

    Rules: step ids are well-formed and unique; every step names a known tool; ``depends_on`` names only
    earlier steps of the same plan, each at most once (which also rules out cycles); the plan is not
    longer than ``max_steps``; its phase is the expected one.
    """
    known = {tool.key for tool in tools}
    problems: list[str] = []
    if phase is not None and plan.phase != phase:
        problems.append(f"plan is for phase {plan.phase}, expected phase {phase}")
    if len(plan.steps) > max_steps:
        problems.append(f"plan has {len(plan.steps)} steps; the limit is {max_steps}")
    seen: set[str] = set()
    for position, step in enumerate(plan.steps):
        label = f"step {step.step_id!r}" if step.step_id else f"step #{position}"
        if not STEP_ID_PATTERN.match(step.step_id):
            problems.append(f"{label}: step_id must match {STEP_ID_PATTERN.pattern}")
        if step.step_id in seen:
            problems.append(f"{label}: duplicate step_id")
        if step.tool_key not in known:
            problems.append(f"{label}: unknown tool {step.tool_key}")
        if len(set(step.depends_on)) != len(step.depends_on):
            problems.append(f"{label}: depends_on lists a step more than once")
        for dependency in step.depends_on:
            if dependency == step.step_id:
                problems.append(f"{label}: depends on itself (cycle)")
            elif dependency not in seen:
                later = any(other.step_id == dependency for other in plan.steps[position + 1 :])
                problems.append(
                    f"{label}: depends_on {dependency!r} names a later step (cycle or forward reference)"
                    if later
                    else f"{label}: depends_on {dependency!r} is not a step of this plan"
                )
        seen.add(step.step_id)
    return problems[:MAX_PROBLEMS]
