"""The activities of the ``PolicyReplay`` workflow: list the records of a window, and replay one batch of
them through a candidate pipeline in shadow, writing what it found to the replay's report store.

Both only read the execution store. A candidate is built once per worker process and pipeline (its
factory may open stores and MCP servers), never registered as the worker's own pipeline.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating, report_progress
from storage.executions import ExecutionStore
from storage.replays import ReplayReportStore
from workflows.models import ListRecordsInput, ListRecordsOutput, ReplayBatchInput, ReplayBatchOutput, RequestReplay
from workflows.policy_replay import CANDIDATE_UNAVAILABLE, LIST_RECORDS_ACTIVITY, REPLAY_BATCH_ACTIVITY

from .shadow import ShadowEvaluator

if TYPE_CHECKING:
    from ..lifecycle import LifecycleActivities

# Records of one batch replayed at once: their store reads and hooks' thread hops overlap.
RECORDS_AT_ONCE = 8


class PolicyReplayActivities:
    """The replay's activities.

    Args:
        store: The execution store the records are read from.
        reports: Where each batch's findings are written (the replay's only writes).
        candidates: Builds a candidate pipeline from its ``module:factory``.
    """

    def __init__(
        self,
        store: ExecutionStore,
        reports: ReplayReportStore,
        candidates: Callable[[str], LifecycleActivities],
    ) -> None:
        self.store = store
        self.reports = reports
        self._candidates = candidates
        self._built: dict[str, ShadowEvaluator] = {}
        self._lock = asyncio.Lock()

    def activities(self) -> list[Callable]:
        return [self.list_replay_records, self.replay_policy_batch]

    async def evaluator(self, pipeline: str) -> ShadowEvaluator:
        async with self._lock:
            if pipeline not in self._built:
                try:
                    built = await asyncio.to_thread(self._candidates, pipeline)
                except Exception as err:  # noqa: BLE001 - any reason the factory failed ends the replay
                    raise ApplicationError(
                        f"candidate pipeline {pipeline}: {type(err).__name__}: {err}",
                        type=CANDIDATE_UNAVAILABLE,
                        non_retryable=True,
                    ) from None
                self._built[pipeline] = ShadowEvaluator(built)
            return self._built[pipeline]

    @activity.defn(name=LIST_RECORDS_ACTIVITY)
    async def list_replay_records(self, request: ListRecordsInput) -> ListRecordsOutput:
        """List the window's records, oldest first, into the report store a batch at a time."""
        window = request.window
        keys = await self.store.window(
            window.since, window.until, tenant=window.tenant, agent=window.agent, limit=window.limit
        )
        size = request.batch_size
        batches = [keys[i : i + size] for i in range(0, len(keys), size)]
        await asyncio.to_thread(self.reports.save_keys, request.replay_id, batches)
        return ListRecordsOutput(total=len(keys), batches=len(batches))

    @activity.defn(name=REPLAY_BATCH_ACTIVITY)
    @heartbeating
    async def replay_policy_batch(self, batch: ReplayBatchInput) -> ReplayBatchOutput:
        """Replay each record of the batch in shadow; write the batch's findings; return its counts. A
        record gone meanwhile (expired) is skipped."""
        evaluator = await self.evaluator(batch.pipeline)
        keys = await asyncio.to_thread(self.reports.keys, batch.replay_id, batch.batch)
        slots = asyncio.Semaphore(RECORDS_AT_ONCE)

        async def one(index: int, workflow_id: str, run_id: str) -> RequestReplay | None:
            async with slots:
                report_progress(index)
                record = await self.store.get_run(workflow_id, run_id)
                return None if record is None else await evaluator.evaluate(record)

        found = await asyncio.gather(*(one(i, w, r) for i, (w, r) in enumerate(keys)))
        replayed = [r for r in found if r is not None]
        await asyncio.to_thread(self.reports.save_batch, batch.replay_id, batch.batch, replayed)
        counts: Counter[str] = Counter(f.kind.value for r in replayed for f in r.findings)
        return ReplayBatchOutput(
            batch=batch.batch,
            replayed=len(replayed),
            changed=sum(1 for r in replayed if r.findings),
            counts=dict(counts),
        )
