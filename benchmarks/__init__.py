"""Benchmarks of ``RequestLifecycle`` against the bare Temporal floor.

This module holds the floor: a tiny workflow (``BenchFloor``) that runs empty activities in a given
shape, registered on the same worker as the lifecycle so both pay the same server, worker and data
converter costs. It imports only temporalio and pydantic, so the workflow sandbox loads it cheaply.
The runner is :mod:`benchmarks.lifecycle_bench` (``python -m benchmarks.lifecycle_bench``).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

FLOOR_WORKFLOW_TYPE = "BenchFloor"
FLOOR_ACTIVITY = "bench_floor_noop"

__all__ = ["FLOOR_ACTIVITY", "FLOOR_WORKFLOW_TYPE", "FloorBatch", "FloorInput", "FloorWorkflow", "floor_noop"]


class FloorBatch(BaseModel):
    """``count`` empty activities started together (``count > 1`` runs them in parallel)."""

    count: int = Field(default=1, ge=1)
    local: bool = False


class FloorInput(BaseModel):
    """The batches to run, one after another."""

    batches: list[FloorBatch] = Field(default_factory=list)

    @property
    def activity_count(self) -> int:
        return sum(b.count for b in self.batches)


@activity.defn(name=FLOOR_ACTIVITY)
async def floor_noop(index: int) -> int:
    """The empty activity: the cheapest thing a worker can run."""
    return index


@workflow.defn(name=FLOOR_WORKFLOW_TYPE)
class FloorWorkflow:
    """Runs empty activities in the given shape and nothing else: the bare Temporal cost."""

    @workflow.run
    async def run(self, input: FloorInput) -> int:
        done = 0
        for batch in input.batches:
            calls = []
            for _ in range(batch.count):
                done += 1
                if batch.local:
                    calls.append(
                        workflow.execute_local_activity(
                            FLOOR_ACTIVITY,
                            done,
                            result_type=int,
                            start_to_close_timeout=timedelta(seconds=10),
                            retry_policy=RetryPolicy(maximum_attempts=3),
                        )
                    )
                else:
                    calls.append(
                        workflow.execute_activity(
                            FLOOR_ACTIVITY,
                            done,
                            result_type=int,
                            start_to_close_timeout=timedelta(seconds=10),
                            retry_policy=RetryPolicy(maximum_attempts=3),
                        )
                    )
            if len(calls) == 1:
                await calls[0]
            else:
                await asyncio.gather(*calls)
        return done
