"""The execution record's snapshots as pure functions of the record, shared by the workflow and the local
activity that runs a phase's after_planning hooks: a snapshot stamped for its boundary, a hook
invocation's record entry, and the accepted plan's snapshot as the workflow builds it from those hooks'
outcomes. With them that activity writes the accepted plan's snapshot itself, right after the hooks, when
they left the plan and the run as they found them: one local activity where there were two."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from .effects import record_effects
from .models import (
    AcceptedPlan,
    AcceptedPlanWrite,
    ExecutionRecord,
    HookBatchEntry,
    HookCall,
    HookInvocation,
    HookOutcome,
    InvocationOutcome,
    LifecycleBoundary,
    RecordLifecycle,
    RequestStatus,
    Stage,
)
from .stages import STAGES

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


def accepted_at(invocations: Sequence[HookInvocation], otherwise: datetime) -> datetime:
    """When a plan was accepted: as the last of its after_planning ``invocations`` ended, or ``otherwise``
    (the workflow's time then) where none ran."""
    if not invocations:
        return otherwise
    last = invocations[-1]
    return last.started_at + timedelta(milliseconds=last.duration_ms)


def accepted_plan_snapshot(
    write: AcceptedPlanWrite, ran: Sequence[tuple[HookCall, HookOutcome]], entries: Sequence[HookBatchEntry]
) -> ExecutionRecord:
    """The accepted plan's snapshot after every after_planning hook of the phase ran (``ran``: each call as
    its hook received it and its outcome; ``entries``: their batch entries, for the time each took) and left
    the plan as it was: each invocation recorded one after another from ``write.started`` with its decision
    and effects, the plan accepted as the last ended, the snapshot stamped — the steps the workflow takes
    for the same outcomes."""
    record = write.record.model_copy(deep=True)
    clock = write.started
    invocations: list[HookInvocation] = []
    for offset, ((call, outcome), entry) in enumerate(zip(ran, entries, strict=True)):
        invocation = invocation_entry(
            call.hook.name,
            Stage.AFTER_PLANNING,
            write.first_sequence + offset,
            write.plan_phase,
            None,
            clock,
            entry.duration_ms,
        )
        clock += timedelta(milliseconds=entry.duration_ms)
        invocation.decision = outcome.decision
        invocations.append(invocation)
        record.pipeline_hooks.append(invocation)
        record_effects(record, outcome.effects)
    plan = STAGES[Stage.AFTER_PLANNING].subject(ran[0][0])
    record.plans.append(AcceptedPlan(phase=plan.phase, plan=plan, accepted_at=accepted_at(invocations, clock)))
    stamp(record, LifecycleBoundary.ACCEPTED_PLAN)
    return record
