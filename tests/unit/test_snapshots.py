"""The snapshots an activity writes with the hooks it ran and the workflow rebuilds: built on a copy of the
write's record unless told to build on the record itself, and rebuilt by the workflow once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from workflows.models import (
    CacheVerdict,
    DecisionAction,
    ExecutionRecord,
    FailurePolicy,
    HookBatchEntry,
    HookDecision,
    HookOutcome,
    RequestStatus,
    SnapshotAttempt,
    Stage,
    TerminalEnd,
    TerminalPart,
    TerminalWrite,
)
from workflows.snapshots import EndAttempt, terminal_snapshot

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


def _write() -> TerminalWrite:
    record = ExecutionRecord(
        request_id="r1", workflow_id="request-r1", run_id="run", request="price of ACME?", started_at=NOW
    )
    return TerminalWrite(
        record=record,
        started=NOW + timedelta(milliseconds=40),
        parts=[TerminalPart(stage=Stage.AFTER_SYNTHESIS, first_sequence=1)],
        end=TerminalEnd(final_response="ACME is up.", cache=CacheVerdict(cacheable=False, reasons=["no steps"])),
    )


def _entries() -> list[list[HookBatchEntry]]:
    decision = HookDecision(failure_policy=FailurePolicy.FAIL_OPEN, action=DecisionAction.CONTINUE, reason="ok")
    outcome = HookOutcome(decision=decision).model_dump(mode="json")
    return [[HookBatchEntry(hook="audit", outcome=outcome, duration_ms=2.5)]]


def test_a_snapshot_is_built_on_a_copy_unless_built_in_place():
    write = _write()
    copied = terminal_snapshot(write, _entries())
    assert write.record.status is not RequestStatus.SUCCEEDED and write.record.pipeline_hooks == []
    assert copied.status is RequestStatus.SUCCEEDED and [i.hook for i in copied.pipeline_hooks] == ["audit"]
    assert copied.completed_at == write.started + timedelta(milliseconds=2.5)

    in_place = terminal_snapshot(write, _entries(), in_place=True)
    assert in_place is write.record and in_place == copied


def test_the_workflow_rebuilds_the_written_end_once():
    entries = _entries()
    expected = terminal_snapshot(_write(), entries)
    handed: list[TerminalWrite] = []

    def write() -> TerminalWrite:
        handed.append(_write())
        return handed[-1]

    ended = EndAttempt(write, entries, SnapshotAttempt(revision=1, written=True))
    first = ended.written()
    assert first == expected and ended.written() is first  # asked again: the same snapshot, not built twice
    assert len(handed) == 1 and [i.hook for i in first.pipeline_hooks] == ["audit"]

    not_written = EndAttempt(write, entries, SnapshotAttempt(revision=1, written=False))
    assert not_written.written() is None and len(handed) == 1  # nothing written: nothing to build
