"""The execution record's snapshots as pure functions of the record, shared by the workflow and the local
activities that run in-process hooks: a snapshot stamped for its boundary, a hook invocation's record
entry, the accepted plan's snapshot as the workflow builds it from a phase's after_planning hooks, and the
terminal snapshot of a request that ends right after its last hooks. With them the activity that runs
those hooks writes the snapshot itself, right after them, when they left the run as they found it: one
local activity where there were two."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from .effects import record_effects
from .models import (
    MAX_RECORDED_PROMPT_CHARS,
    AcceptedPlan,
    AcceptedPlanWrite,
    EffectStatus,
    EnrichmentChange,
    ExecutionRecord,
    HookBatchEntry,
    HookCall,
    HookInvocation,
    HookOutcome,
    InvocationOutcome,
    LifecycleBoundary,
    PipelineHookEffect,
    PlanOutput,
    RecordLifecycle,
    RequestStatus,
    SnapshotAttempt,
    Stage,
    TerminalEnd,
    TerminalPart,
    TerminalWrite,
    bounded_value,
)
from .stages import STAGES
from .stages.planning import BeforePlanningOutcome

COMPLETION: dict[RequestStatus, Literal["completed", "stopped", "failed", "cancelled"]] = {
    RequestStatus.SUCCEEDED: "completed",
    RequestStatus.STOPPED: "stopped",
    RequestStatus.FAILED: "failed",
    RequestStatus.CANCELLED: "cancelled",
}


def stamp(record: ExecutionRecord, boundary: LifecycleBoundary) -> None:
    """Make ``record`` the next snapshot: one revision higher, taken at ``boundary``."""
    record.record_revision += 1
    completion = COMPLETION[record.status] if record.status in COMPLETION else "pending"
    record.lifecycle = RecordLifecycle(
        boundary=boundary, completion=completion, snapshot_revision=record.record_revision
    )


def invocation_entry(
    hook: str,
    stage: Stage,
    sequence: int,
    plan_phase: int | None,
    step_id: str | None,
    started_at: datetime,
    duration_ms: float = 0.0,
) -> HookInvocation:
    """The record entry of one hook invocation, as it starts (succeeded until it says otherwise)."""
    return HookInvocation(
        hook=hook,
        stage=stage,
        sequence=sequence,
        plan_phase=plan_phase,
        step_id=step_id,
        started_at=started_at,
        duration_ms=duration_ms,
        outcome=InvocationOutcome.SUCCEEDED,
    )


def ended_at(invocations: Sequence[HookInvocation], otherwise: datetime) -> datetime:
    """When the last of ``invocations`` ended, or ``otherwise`` where none ran: when a plan was accepted
    (its after_planning invocations), when a request ended with its last hooks."""
    if not invocations:
        return otherwise
    last = invocations[-1]
    return last.started_at + timedelta(milliseconds=last.duration_ms)


def _record_ran(
    record: ExecutionRecord,
    stage: Stage,
    first_sequence: int,
    plan_phase: int | None,
    started: datetime,
    ran: Iterable[tuple[str, HookOutcome, float]],
) -> list[HookInvocation]:
    """Record in ``record`` the invocations of ``stage``'s hooks that ran one after another from ``started``
    (``ran``: each hook's name, its outcome and the milliseconds it took), each with its decision, effects
    and model calls; returns their entries."""
    invocations: list[HookInvocation] = []
    at = started
    for offset, (hook, outcome, duration_ms) in enumerate(ran):
        invocation = invocation_entry(hook, stage, first_sequence + offset, plan_phase, None, at, duration_ms)
        at += timedelta(milliseconds=duration_ms)
        invocation.decision = outcome.decision
        invocations.append(invocation)
        record.pipeline_hooks.append(invocation)
        record_effects(record, outcome.effects)
        record.model_calls.extend(outcome.model_calls)
    return invocations


def record_enrichment_changes(
    record: ExecutionRecord,
    hook: str,
    changes: Sequence[EnrichmentChange],
    enrichments: Mapping[str, Any],
    at: datetime,
) -> None:
    """Record each of a before_planning hook's enrichment changes as the effect ``planning_enrichment:<key>``
    (``at``: when its invocation ended), and the enrichments it left."""
    for change in changes:
        record.effects.append(
            PipelineHookEffect(
                effect_id=f"planning_enrichment:{change.key}",
                name=f"Planning enrichment {change.key}",
                status=EffectStatus.SUCCEEDED,
                data={
                    "key": change.key,
                    "operation": change.operation.value,
                    "before": bounded_value(change.before),
                    "after": bounded_value(change.after),
                },
                started_at=at,
                duration_ms=0.0,
                summary=f"{change.operation.value} by {hook}",
                hook=hook,
                stage=Stage.BEFORE_PLANNING,
            )
        )
    record.enrichments = dict(enrichments)


@dataclass(frozen=True)
class BeforePlanningRan:
    """The before_planning hooks a planning activity ran before it asked the planner, and let the
    enrichments through to it: each call as its hook received it with its outcome, and their entries."""

    ran: Sequence[tuple[HookCall, HookOutcome]]
    entries: Sequence[HookBatchEntry]


def record_before_planning(record: ExecutionRecord, before_planning: BeforePlanningRan, started: datetime) -> None:
    """Record the before_planning hooks a planning activity ran before it asked the planner as the workflow
    records them: one after another from ``started``, each with its decision and effects and, as it ended,
    its enrichment changes."""
    spec, at = STAGES[Stage.BEFORE_PLANNING], started
    for sequence, ((call, outcome), entry) in enumerate(
        zip(before_planning.ran, before_planning.entries, strict=True), 1
    ):
        ran_one = [(call.hook.name, outcome, entry.duration_ms)]
        at = ended_at(_record_ran(record, Stage.BEFORE_PLANNING, sequence, None, at, ran_one), at)
        folded = spec.fold(spec.subject(call), outcome).subject
        changes = outcome.enrichment_changes if isinstance(outcome, BeforePlanningOutcome) else []
        record_enrichment_changes(record, call.hook.name, changes, folded, at)


def accepted_plan_snapshot(
    write: AcceptedPlanWrite,
    ran: Sequence[tuple[HookCall, HookOutcome]],
    entries: Sequence[HookBatchEntry],
    *,
    after_ms: float = 0.0,
    before_planning: BeforePlanningRan | None = None,
    in_place: bool = False,
) -> ExecutionRecord:
    """The accepted plan's snapshot after every after_planning hook of the phase ran (``ran``: each call as
    its hook received it and its outcome; ``entries``: their batch entries, for the time each took) and left
    the plan as it was: each invocation recorded one after another from ``write.started`` (moved on by
    ``after_ms``, the time planning took) with its decision and effects, the plan accepted as the last
    ended, the snapshot stamped — the steps the workflow takes for the same outcomes. ``before_planning``: the
    before_planning hooks the same activity ran before planning, recorded first from ``write.started``, each
    with its enrichment changes as it ended. ``in_place``: built on ``write.record`` itself, for a write used
    once (as an activity decoded it), rather than on a copy."""
    record = write.record if in_place else write.record.model_copy(deep=True)
    if before_planning is not None:
        record_before_planning(record, before_planning, write.started)
    invocations = _record_ran(
        record,
        Stage.AFTER_PLANNING,
        write.first_sequence,
        write.plan_phase,
        write.started + timedelta(milliseconds=after_ms),
        [(call.hook.name, outcome, entry.duration_ms) for (call, outcome), entry in zip(ran, entries, strict=True)],
    )
    plan = STAGES[Stage.AFTER_PLANNING].subject(ran[0][0])
    accepted_at = ended_at(invocations, write.started + timedelta(milliseconds=after_ms))
    record.plans.append(AcceptedPlan(phase=plan.phase, plan=plan, accepted_at=accepted_at))
    stamp(record, LifecycleBoundary.ACCEPTED_PLAN)
    return record


def took_plan(record: ExecutionRecord, output: PlanOutput) -> None:
    """What a planning activity's output leaves in the record: its model calls, its prompt (cut to what the
    record keeps) and its planner."""
    record.model_calls.extend(output.model_calls)
    record.planning_prompt = output.prompt[:MAX_RECORDED_PROMPT_CHARS]
    record.planner = output.planner


def spent(entries: Sequence[HookBatchEntry]) -> timedelta:
    """The time a local activity's hooks took, one after another."""
    return timedelta(milliseconds=sum(entry.duration_ms for entry in entries))


def terminal_snapshot(
    write: TerminalWrite, entries: Sequence[Sequence[HookBatchEntry]], *, in_place: bool = False
) -> ExecutionRecord:
    """The terminal snapshot of a request that ends right after the hooks of ``write.parts`` (``entries``:
    each part's batch entries, in order) left the run as it was: each invocation recorded from
    ``write.started`` one after another with its decision and effects (each part from where the one
    before ended, as the workflow times what an activity ran on into), the plan accepted as the last
    after_planning hook ended, the request completed as the last hook ended with ``write.end``'s answer,
    the snapshot stamped — what the workflow's record holds at the end for the same outcomes.
    ``in_place``: built on ``write.record`` itself, for a write used once, rather than on a copy."""
    record = write.record if in_place else write.record.model_copy(deep=True)
    clock = write.started
    ended = clock
    for part, part_entries in zip(write.parts, entries, strict=True):
        invocations = _record_ran(
            record,
            part.stage,
            part.first_sequence,
            part.plan_phase,
            clock,
            # the stage's own fields of an outcome are not needed here
            [(entry.hook, HookOutcome.model_validate(entry.outcome), entry.duration_ms) for entry in part_entries],
        )
        if part.stage is Stage.AFTER_PLANNING and write.plan is not None:
            plan = write.plan
            record.plans.append(AcceptedPlan(phase=plan.phase, plan=plan, accepted_at=ended_at(invocations, clock)))
        ended = ended_at(invocations, ended)
        clock += spent(part_entries)
    end = write.end
    record.model_draft = end.model_draft
    record.confidence = end.confidence
    record.final_response = end.final_response
    record.cache = end.cache
    record.status = RequestStatus.SUCCEEDED
    record.error = None
    record.lifecycle_stage = COMPLETION[RequestStatus.SUCCEEDED]
    record.completed_at = ended
    stamp(record, LifecycleBoundary.TERMINAL)
    return record


def took_planned(record: ExecutionRecord, output: PlanOutput, route: Literal["primary", "fallback"]) -> None:
    """What a planning activity's output leaves in the record before its after_planning hooks' outcomes (see
    :func:`took_plan`), the model that planned (``route``) and the stage entered, as the workflow has them."""
    took_plan(record, output)
    record.handled_by = route
    record.lifecycle_stage = str(Stage.AFTER_PLANNING)


def answered_end(
    write: AcceptedPlanWrite,
    output: PlanOutput,
    end: TerminalEnd,
    later: Sequence[Stage],
    route: Literal["primary", "fallback"],
    before_planning: BeforePlanningRan | None,
) -> TerminalWrite:
    """The terminal snapshot a planning activity writes once its plan, the planner's text answer, and the
    hooks after it (of after_planning, then of each stage of ``later``) left the run as it was: built on
    ``write.record`` itself (the record as planning started) with what the planning left in it and the
    before_planning hooks it ran first, the hooks timed from when the planner was done, the request ending
    with the answer (``end``, built before it existed: the answer and its draft put in)."""
    plan = output.plan
    assert plan is not None and plan.answer is not None
    record = write.record
    took_planned(record, output, route)
    if before_planning is not None:
        record_before_planning(record, before_planning, write.started)
    return TerminalWrite(
        record=record,
        started=write.started + timedelta(milliseconds=output.hooks_after_ms),
        parts=[
            TerminalPart(stage=Stage.AFTER_PLANNING, first_sequence=write.first_sequence, plan_phase=write.plan_phase),
            *(TerminalPart(stage=stage) for stage in later),
        ],
        plan=plan,
        end=end.model_copy(update={"final_response": plan.answer, "model_draft": output.draft}),
    )


@dataclass
class EndAttempt:
    """A terminal snapshot an activity was handed — ``write`` makes it again: the record as the workflow
    sent it (its copy as the hooks started) with what the activity was to add —, what its hooks' ``entries``
    were (per part) and what became of the write."""

    write: Callable[[], TerminalWrite]
    entries: list[list[HookBatchEntry]]
    attempt: SnapshotAttempt
    _built: ExecutionRecord | None = field(default=None, init=False, repr=False)

    def written(self) -> ExecutionRecord | None:
        """The snapshot the activity wrote, rebuilt from what history recorded (once); None if it wrote
        none. Read it, do not change it."""
        if not self.attempt.written:
            return None
        if self._built is None:
            self._built = terminal_snapshot(self.write(), self.entries, in_place=True)
        return self._built


def same_end(record: ExecutionRecord, written: ExecutionRecord) -> bool:
    """Whether ``record``, stamped for the end, is the terminal snapshot ``written`` (when it completed
    aside: the snapshot says it completed as its last hook ended); if so it takes that time."""
    if record.model_copy(update={"completed_at": written.completed_at}) != written:
        return False
    record.completed_at = written.completed_at
    return True
