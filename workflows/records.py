"""The execution record's snapshots: each written, with a higher revision, by the execution store's
activity at the lifecycle's boundaries (an accepted plan, a checkpoint, the end) — or, for an accepted plan
its after_planning hooks left as it was and for the end of a request its last hooks left as it was, by the
local activity that ran them (``workflows.snapshots``). Workflow code only."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from .converter import Shown
    from .invocation import error_text, raise_if_cancelled
    from .models import ExecutionRecord, LifecycleBoundary, PersistRecordInput, PersistRecordOutput, SnapshotAttempt
    from .run_state import RunState
    from .scheduling import Scheduler
    from .snapshots import same_end, stamp


class RecordKeeper:
    """Writes the request's execution record (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler) -> None:
        self._state = state
        self._scheduler = scheduler

    async def persist(
        self, boundary: LifecycleBoundary, tried: SnapshotAttempt | None = None, *, wrote: ExecutionRecord | None = None
    ) -> None:
        """Persist the full snapshot with a higher revision; never masks the request outcome. A cancel
        arriving meanwhile cancels the request, except at the terminal boundary, where the snapshot is
        written again so the record still says how the request ended.

        ``tried``: the local activity of the hooks just before tried to write this snapshot itself, built
        from their outcomes as this workflow builds it (``workflows.snapshots``). Nothing more is written
        when it did. Otherwise the snapshot is written here with the next revision: the store may hold the
        one tried (a store that failed after taking it, an earlier attempt whose result was lost). The
        choice rests on what history recorded alone: replay takes it again whatever the workflow's clock
        read after a local activity (which can differ by milliseconds between a run and its replay).

        ``wrote`` (at the end): the terminal snapshot ``tried`` wrote, rebuilt from what history recorded of
        the hooks. Nothing more is written only when the record is that snapshot (``snapshots.same_end``):
        anything that came between the hooks and the end (a signal, a change the hooks' outcomes did not
        foretell) makes the workflow write its own. Both are built in this execution from the same
        recorded outcomes and clock, so a replay decides as the run did."""
        record = self._state.record
        stamp(record, boundary)
        if tried is not None:
            if tried == SnapshotAttempt(revision=record.record_revision, written=True) and (
                wrote is None or same_end(record, wrote)
            ):
                return
            stamp(record, boundary)
        for attempt in (1, 2):
            try:
                await self._scheduler.bookkeeping(
                    "persist_execution_record",
                    PersistRecordInput(record=record),
                    result_type=PersistRecordOutput,
                    timeout=30,
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=Shown(
                        f"bookkeeping · persist record · {boundary.value} · revision {record.record_revision}"
                    ),
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
