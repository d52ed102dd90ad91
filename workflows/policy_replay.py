"""``PolicyReplay``: a candidate pipeline's decision stages replayed over a window of execution records.

One activity lists the window's records into the replay's report store, a batch of keys per row; then
batches fan out to ``replay_policy_batch`` activities on the ordinary workers, ``parallel_batches`` at a
time, each writing its findings to the report store and returning its counts. The record keys never
enter history, and the run continues as new every ``BATCHES_PER_RUN`` batches carrying only its place and
counts, so a replay of any size keeps a bounded history. A worker lost mid-batch costs that batch's
retry (a batch rewritten replaces itself); cancelling the workflow cancels the running batches (they
heartbeat); query ``progress`` says how far it is. Workflow code only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from .converter import Shown
    from .models import (
        ListRecordsInput,
        ListRecordsOutput,
        PolicyReplayInput,
        PolicyReplayResult,
        ReplayBatchInput,
        ReplayBatchOutput,
        ReplayProgress,
    )
    from .names import POLICY_REPLAY_WORKFLOW_TYPE

LIST_RECORDS_ACTIVITY = "list_replay_records"
REPLAY_BATCH_ACTIVITY = "replay_policy_batch"
BATCHES_PER_RUN = 200
# The candidate's factory could not build it: the replay fails with this type.
CANDIDATE_UNAVAILABLE = "CandidatePipelineUnavailable"
BATCH_TIMEOUT = timedelta(minutes=10)
# A batch heartbeats in the background while its records' hooks run: a batch whose worker died is run
# again elsewhere within this long.
BATCH_HEARTBEAT = timedelta(seconds=5)


# Batches run on a task queue of their own beside the workers' (``replay_batch_queue``): each worker serves
# it with a few slots of its own (``AGENT_WORKER_REPLAY_BATCHES``), so a replay's batches spread over the
# workers instead of filling the first one's request slots. Replays recorded before kept every batch on
# the workers' own queue.
BATCH_QUEUE_PATCH = "policy-replay-batch-queue"
BATCH_QUEUE_SUFFIX = "-policy-replay"


def policy_replay_workflow_id(replay_id: str) -> str:
    return f"policy-replay/{replay_id}"


def replay_batch_queue(task_queue: str) -> str:
    """The task queue of the replay batches of the workers polling ``task_queue``."""
    return f"{task_queue}{BATCH_QUEUE_SUFFIX}"


@workflow.defn(name=POLICY_REPLAY_WORKFLOW_TYPE)
class PolicyReplayWorkflow:
    def __init__(self) -> None:
        self._progress: ReplayProgress | None = None
        self._batch_queue: str | None = None  # None: the workflow's own task queue

    @workflow.query(name="progress")
    def progress(self) -> ReplayProgress:
        return self._progress or ReplayProgress(replay_id="")

    @workflow.run
    async def run(self, replay: PolicyReplayInput) -> PolicyReplayResult:
        if workflow.patched(BATCH_QUEUE_PATCH):
            self._batch_queue = replay_batch_queue(workflow.info().task_queue)
        progress = self._progress = ReplayProgress(
            replay_id=replay.replay_id,
            replayed=replay.replayed,
            changed=replay.changed,
            batches_done=replay.next_batch,
            counts=dict(replay.counts),
        )
        listed = replay.listed
        if listed is None:
            listed = await workflow.execute_activity(
                LIST_RECORDS_ACTIVITY,
                ListRecordsInput(replay_id=replay.replay_id, window=replay.window, batch_size=replay.batch_size),
                result_type=ListRecordsOutput,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary=Shown("list the window's records"),
            )
        progress.total, progress.batches = listed.total, listed.batches
        first = replay.next_batch
        while progress.batches_done < listed.batches:
            if progress.batches_done - first >= BATCHES_PER_RUN:
                workflow.continue_as_new(
                    replay.model_copy(
                        update={
                            "listed": listed,
                            "next_batch": progress.batches_done,
                            "counts": progress.counts,
                            "replayed": progress.replayed,
                            "changed": progress.changed,
                        }
                    )
                )
            wave = range(progress.batches_done, min(listed.batches, progress.batches_done + replay.parallel_batches))
            results = await asyncio.gather(*(self._batch(replay, index) for index in wave))
            for result in results:
                progress.replayed += result.replayed
                progress.changed += result.changed
                for kind, count in result.counts.items():
                    progress.counts[kind] = progress.counts.get(kind, 0) + count
            progress.batches_done += len(wave)
        progress.done = True
        return PolicyReplayResult(
            replay_id=replay.replay_id,
            pipeline=replay.pipeline,
            total=listed.total,
            replayed=progress.replayed,
            changed=progress.changed,
            counts=progress.counts,
        )

    async def _batch(self, replay: PolicyReplayInput, index: int) -> ReplayBatchOutput:
        try:
            return await self._replay_batch(replay, index)
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == CANDIDATE_UNAVAILABLE:
                raise ApplicationError(cause.message, type=CANDIDATE_UNAVAILABLE, non_retryable=True) from None
            raise

    async def _replay_batch(self, replay: PolicyReplayInput, index: int) -> ReplayBatchOutput:
        return await workflow.execute_activity(
            REPLAY_BATCH_ACTIVITY,
            ReplayBatchInput(replay_id=replay.replay_id, pipeline=replay.pipeline, batch=index),
            result_type=ReplayBatchOutput,
            task_queue=self._batch_queue,
            start_to_close_timeout=BATCH_TIMEOUT,
            heartbeat_timeout=BATCH_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[CANDIDATE_UNAVAILABLE]),
            summary=Shown(f"replay batch {index}"),
        )
