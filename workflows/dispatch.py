"""Scheduling an activity so that a lost worker is an infrastructure event, never an outcome.

Every regular activity the workflows schedule gets a heartbeat timeout, and the activity side keeps a
heartbeat going while it runs (``activities.heartbeat``). A worker that crashes, is killed or loses its
connection stops heartbeating, so its attempt ends within seconds instead of after the activity's full
start-to-close timeout.

When the activity's own retries end that way (the last attempt lost its worker), the call is dispatched
again with fresh attempts. An attempt its retries followed is found by the attempt after it, which asks the
server how the one before it ended and tells the request (``LOST_ATTEMPT_SIGNAL``, recorded by the
request's scheduler); when the activity's attempts then run out on an ordinary failure, the call is
dispatched again with as many attempts as workers took. Either way lost workers never spend the attempts
that decide a hook's verdict, a tool step's failure or a stage's. A call whose dispatches keep losing their
worker — a hook that kills every worker it runs on — ends after ``max_worker_losses`` dispatches in the
infrastructure error ``WorkerLost``, never in a policy verdict. A hook that overruns its own start-to-close
timeout is still a ``HookTimeout``: the two are told apart by the kind of timeout the server reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from .converter import Shown

WORKER_LOST = "WorkerLost"
MIN_HEARTBEAT_TIMEOUT = timedelta(seconds=1)
DEFAULT_HEARTBEAT_CEILING = timedelta(seconds=5)
DEFAULT_MAX_WORKER_LOSSES = 5
# The signal with which an activity's attempt tells its request that the attempt before it lost its worker.
LOST_ATTEMPT_SIGNAL = "attempt_lost"

T = TypeVar("T")


def heartbeat_timeout(start_to_close: timedelta, ceiling: timedelta = DEFAULT_HEARTBEAT_CEILING) -> timedelta | None:
    """Half the start-to-close timeout, at most ``ceiling``; none for activities too short for a heartbeat
    to tell a lost worker from the activity's own timeout (their start-to-close timeout finds both)."""
    timeout = min(ceiling, start_to_close / 2)
    return timeout if timeout >= MIN_HEARTBEAT_TIMEOUT else None


def lost_worker(err: BaseException) -> bool:
    """Whether an activity failure means its worker stopped heartbeating (not that the work failed)."""
    cause = err.cause if isinstance(err, ActivityError) else None
    return isinstance(cause, TimeoutError) and cause.type is TimeoutType.HEARTBEAT


async def execute(
    activity: str,
    arg: Any,
    *,
    result_type: type[T],
    start_to_close_timeout: timedelta,
    retry_policy: RetryPolicy,
    summary: str,
    heartbeat_ceiling: timedelta = DEFAULT_HEARTBEAT_CEILING,
    max_worker_losses: int = DEFAULT_MAX_WORKER_LOSSES,
    on_worker_lost: Callable[[int], None] | None = None,
    lost_attempts: Callable[[str], int] | None = None,
    deadline: datetime | None = None,
    **options: Any,
) -> T:
    """``workflow.execute_activity`` that dispatches the call again when its worker was lost.

    ``on_worker_lost(n)`` is told of the n-th lost dispatch (to record it). ``lost_attempts(activity_id)``
    says how many attempts of a dispatch lost their worker within its retries (as its attempts reported
    them): a dispatch whose attempts ran out with some of them lost is dispatched again with as many. With a
    ``deadline`` (workflow time) every dispatch's schedule-to-close timeout is what is left until it, so
    neither retries nor a dispatch after a lost worker outlast it; a worker lost at the deadline raises its
    timeout. Raises the activity's own failure, or ``ApplicationError(type="WorkerLost")`` once
    ``max_worker_losses`` dispatches were lost.
    """
    lost = 0  # dispatches whose last attempt lost its worker
    again = 0  # dispatches whose attempts ran out with some of them lost
    policy = retry_policy
    why = ""
    while True:
        if deadline is not None:
            options["schedule_to_close_timeout"] = deadline - workflow.now()
        try:
            return await workflow.execute_activity(
                activity,
                arg,
                result_type=result_type,
                start_to_close_timeout=start_to_close_timeout,
                heartbeat_timeout=heartbeat_timeout(start_to_close_timeout, heartbeat_ceiling),
                retry_policy=policy,
                summary=Shown(f"{summary} · dispatch {lost + again + 1} ({why})" if why else summary),
                **options,
            )
        except ActivityError as err:
            if deadline is not None and workflow.now() >= deadline:
                raise
            if lost_worker(err):
                lost += 1
                if on_worker_lost is not None:
                    on_worker_lost(lost)
                policy, why = retry_policy, "worker lost"
            else:
                taken = lost_attempts(err.activity_id) if lost_attempts is not None else 0
                taken = min(taken, policy.maximum_attempts - 1)  # the last attempt failed on its own
                if taken <= 0 or err.retry_state is not RetryState.MAXIMUM_ATTEMPTS_REACHED:
                    raise
                again += 1
                policy = dataclasses.replace(retry_policy, maximum_attempts=taken)
                why = f"{taken} attempt{'s' if taken > 1 else ''} lost"
            if lost + again >= max_worker_losses:
                raise ApplicationError(
                    f"{summary}: the worker was lost on {lost + again} dispatches in a row",
                    {"activity": activity, "summary": summary, "dispatches": lost + again},
                    type=WORKER_LOST,
                    non_retryable=True,
                ) from err
