"""Structural plan validation and step references: the part of the gauntlet that needs only the tool catalog.

Argument validation against each tool's parameter model runs beside this in the activities, where the
tools live. Both run after the planner and after every after_planning mutation.

A step may use an earlier step's output in a string argument with the canonical reference
``{{steps.<step_id>.output}}`` or ``{{steps.<step_id>.output.<field>...}}``. A same-phase reference needs
``depends_on``; a prior-phase reference must appear, exactly, in ``implicit_deps``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from .models import Plan, PlanStep, StepResult, StepStatus, ToolSpec

STEP_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
REFERENCE = re.compile(r"\{\{\s*steps\.([A-Za-z0-9][A-Za-z0-9_.\-]{0,63}?)\.output((?:\.[A-Za-z0-9_\-]+)*)\s*\}\}")
MAX_PROBLEMS = 10


class UnresolvedReference(ValueError):
    """A reference names a step output (or field of it) that does not exist."""


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def step_references(step: PlanStep) -> set[str]:
    """Step ids whose output this step's arguments reference."""
    return {m.group(1) for text in _strings(step.arguments) for m in REFERENCE.finditer(text)}


def referencing_fields(step: PlanStep) -> set[str]:
    """Top-level argument names whose value contains a reference (validated only once resolved)."""
    return {name for name, value in step.arguments.items() if any(REFERENCE.search(t) for t in _strings(value))}


def plan_problems(
    plan: Plan,
    tools: Iterable[ToolSpec],
    *,
    max_steps: int,
    phase: int | None = None,
    prior_step_ids: Collection[str] = (),
    available: Collection[str] | None = None,
) -> list[str]:
    """Everything wrong with ``plan``, bounded to the first ``MAX_PROBLEMS`` findings; empty when valid.

    Rules: step ids are well-formed, unique, and not reused from an earlier phase; every step names a
    known tool; ``depends_on`` names only earlier steps of the same plan, each at most once (which also
    rules out cycles); references to same-phase steps are covered by ``depends_on``; references to
    prior-phase steps appear exactly in ``implicit_deps`` (no missing, unreferenced or same-phase
    entries); the plan is not longer than ``max_steps``; its phase is the expected one; with ``available``
    (the tool keys a planning attempt was left), every step calls one of those.
    """
    known = {tool.key for tool in tools}
    prior = set(prior_step_ids)
    in_plan = {step.step_id for step in plan.steps}
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
        if step.step_id in prior:
            problems.append(f"{label}: step_id is already used by an earlier phase")
        if step.tool_key not in known:
            problems.append(f"{label}: unknown tool {step.tool_key}")
        elif available is not None and step.tool_key not in available:
            problems.append(f"{label}: tool {step.tool_key} is not available to this planning attempt")
        if len(set(step.depends_on)) != len(step.depends_on):
            problems.append(f"{label}: depends_on lists a step more than once")
        for dependency in step.depends_on:
            if dependency == step.step_id:
                problems.append(f"{label}: depends on itself (cycle)")
            elif dependency not in seen:
                later = dependency in in_plan
                problems.append(
                    f"{label}: depends_on {dependency!r} names a later step (cycle or forward reference)"
                    if later
                    else f"{label}: depends_on {dependency!r} is not a step of this plan"
                )
        problems.extend(_reference_problems(step, label, in_plan, prior))
        seen.add(step.step_id)
    return problems[:MAX_PROBLEMS]


def _reference_problems(step: PlanStep, label: str, in_plan: set[str], prior: set[str]) -> list[str]:
    problems = []
    references = step_references(step)
    for ref in sorted(references):
        if ref in in_plan:
            if ref not in step.depends_on:
                problems.append(f"{label}: references same-phase step {ref!r} without depends_on")
        elif ref in prior:
            if ref not in step.implicit_deps:
                problems.append(f"{label}: references prior-phase step {ref!r} missing from implicit_deps")
        else:
            problems.append(f"{label}: references unknown step {ref!r}")
    if len(set(step.implicit_deps)) != len(step.implicit_deps):
        problems.append(f"{label}: implicit_deps lists a step more than once")
    for dep in step.implicit_deps:
        if dep in in_plan:
            problems.append(f"{label}: implicit_deps names same-phase step {dep!r}; use depends_on")
        elif dep not in prior:
            problems.append(f"{label}: implicit_deps names {dep!r}, which is not a step of an earlier phase")
        elif dep not in references:
            problems.append(f"{label}: implicit_deps names {dep!r}, which its arguments do not reference")
    return problems


def _lookup(output: Any, path: str, ref: str) -> Any:
    value = output
    for part in [p for p in path.split(".") if p]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise UnresolvedReference(f"{{{{steps.{ref}.output{path}}}}}: no field {part!r}")
    return value


def resolve_references(arguments: dict[str, Any], results: Mapping[str, StepResult]) -> dict[str, Any]:
    """Substitute step outputs into ``arguments``. A string that is exactly one reference becomes the
    referenced JSON value; a reference inside longer text is replaced by its text."""

    def value_of(match: re.Match[str]) -> Any:
        ref, path = match.group(1), match.group(2)
        result = results.get(ref)
        if result is None or result.status is not StepStatus.SUCCEEDED:
            raise UnresolvedReference(f"step {ref!r} has no successful output")
        return _lookup(result.output, path, ref)

    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            whole = REFERENCE.fullmatch(value.strip())
            if whole:
                return value_of(whole)
            return REFERENCE.sub(
                lambda m: v if isinstance(v := value_of(m), str) else json.dumps(v, sort_keys=True), value
            )
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    return {name: resolve(value) for name, value in arguments.items()}
