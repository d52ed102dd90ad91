"""The execution record's snapshots: each written, with a higher revision, by the execution store's
activity at the lifecycle's boundaries (an accepted plan, a checkpoint, the end). Workflow code only."""

from __future__ import annotations

from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from .invocation import error_text, raise_if_cancelled
    from .models import LifecycleBoundary, PersistRecordInput, PersistRecordOutput, RecordLifecycle, RequestStatus
    from .run_state import RunState
    from .scheduling import Scheduler

COMPLETION: dict[RequestStatus, Literal["completed", "stopped", "failed", "cancelled"]] = {
    RequestStatus.SUCCEEDED: "completed",
    RequestStatus.STOPPED: "stopped",
    RequestStatus.FAILED: "failed",
    RequestStatus.CANCELLED: "cancelled",
}


class RecordKeeper:
    """Writes the request's execution record (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    async def persist(self, boundary: LifecycleBoundary) -> None:
        """Persist the full snapshot with a higher revision; never masks the request outcome. A cancel
        arriving meanwhile cancels the request, except at the terminal boundary, where the snapshot is
        written again so the record still says how the request ended."""
        record = self._state.record
        record.record_revision += 1
        completion = COMPLETION[record.status] if record.status in COMPLETION else "pending"
        record.lifecycle = RecordLifecycle(
            boundary=boundary, completion=completion, snapshot_revision=record.record_revision
        )
        for attempt in (1, 2):
            try:
                await self._scheduler.bookkeeping(
                    "persist_execution_record",
                    PersistRecordInput(record=record),
                    result_type=PersistRecordOutput,
                    timeout=30,
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=f"bookkeeping · persist record · {boundary.value} · revision {record.record_revision}",
                )
                return
            except (ActivityError, ApplicationError) as err:
                if boundary is not LifecycleBoundary.TERMINAL:
                    raise_if_cancelled(err)
                    if isinstance(err, ApplicationError):
                        raise
                elif attempt == 1 and isinstance(err, ActivityError) and isinstance(err.cause, CancelledError):
                    continue
                workflow.logger.warning(
                    "execution record revision %s was not persisted: %s", record.record_revision, error_text(err)
                )
                return
