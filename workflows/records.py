"""The execution record's snapshots: each written, with a higher revision, by the execution store's
activity at the lifecycle's boundaries (an accepted plan, a checkpoint, the end) — or, for an accepted plan
its after_planning hooks left as it was and for the end of a request its last hooks left as it was, by the
local activity that ran them (``workflows.snapshots``).

No request goes on past a boundary, or ends, without its snapshot in the store: a write the store refuses,
or that fails on every attempt (``StageSettings.record_write_attempts``), fails the request with the
non-retryable ``RecordNotStored`` — the boundary, the revision and the store's error in its details — in
place of whatever else it would have ended with. Workflow code only."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from .converter import Shown
    from .decisions import RECORD_NOT_STORED
    from .invocation import error_text, raise_if_cancelled
    from .models import (
        ExecutionRecord,
        LifecycleBoundary,
        PersistRecordInput,
        PersistRecordOutput,
        RequestError,
        RequestStatus,
        SnapshotAttempt,
    )
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

        ``tried``: the activity of the hooks just before tried to write this snapshot itself, built
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
        attempts = self._state.manifest.settings.record_write_attempts
        for attempt in (1, 2):
            try:
                await self._scheduler.bookkeeping(
                    "persist_execution_record",
                    PersistRecordInput(record=record, final_attempt=attempts),
                    result_type=PersistRecordOutput,
                    timeout=30,
                    retry_policy=RetryPolicy(maximum_attempts=attempts),
                    summary=Shown(
                        f"bookkeeping · persist record · {boundary.value} · revision {record.record_revision}"
                    ),
                )
                return
            except (ActivityError, ApplicationError) as err:
                refused = _refusal(err)
                if refused is not None:
                    raise self._not_stored(boundary, refused) from err
                # A failure without the store's verdict: a cancelled write, or a history recorded before
                # the write gave one (which replays as it ran).
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

    def _not_stored(self, boundary: LifecycleBoundary, refused: ApplicationError) -> ApplicationError:
        """The request's failure for a snapshot the store did not take; at the end, the record as the
        query reads it says so too (nothing more is written)."""
        record = self._state.record
        found = refused.details[0] if refused.details and isinstance(refused.details[0], dict) else {}
        store_error = str(found.get("store_error") or refused.message)
        details: dict[str, Any] = {
            "boundary": boundary.value,
            "revision": record.record_revision,
            "store_error": store_error,
            "attempts": found.get("attempts"),
        }
        if record.error is not None:  # the request was ending with another error: it is kept beside
            details["request_error"] = {"type": record.error.type, "message": record.error.message}
        message = f"the execution record was not stored at {boundary.value} (revision {record.record_revision}): {store_error}"
        if boundary is LifecycleBoundary.TERMINAL:
            record.status = RequestStatus.FAILED
            record.error = RequestError(type=RECORD_NOT_STORED, message=message, details=details)
            if record.lifecycle is not None:
                record.lifecycle = record.lifecycle.model_copy(update={"completion": "failed"})
        return ApplicationError(message, details, type=RECORD_NOT_STORED, non_retryable=True)


def _refusal(err: BaseException) -> ApplicationError | None:
    """The write activity's ``RecordNotStored``, if that is how the write failed."""
    for found in (err, getattr(err, "cause", None)):
        if isinstance(found, ApplicationError) and found.type == RECORD_NOT_STORED:
            return found
    return None
