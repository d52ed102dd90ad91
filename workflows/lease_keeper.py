"""``LeaseKeeper``: the child workflow that keeps one managed lease alive while its request runs on.

A request hands each lease it holds to this child (``<request workflow id>/lease/<lease id>``) the
moment it starts to wait — a checkpoint opens, or it waits for its conversation turn — or after
``StageSettings.lease_renewals_in_request`` renewals of its own (``workflows.leases``), so the request's
history stays flat however long it waits: a loop of durable timers and one short ``renew_lease`` activity
per renewal, holding no worker slot between renewals. Its first renewal falls when the request's own
next one would have (``first_renewal_after_seconds``). The child continues as new every
``renewals_per_run`` renewals (500 by default) or when the server suggests it, so its own history stays
bounded too, and carries its counts across.

The request stops it on every exit with the signal ``stop_keeping`` and waits for its result: a renewal in
flight finishes first, so the release never races a renewal. A declaration of the same lease id again
reaches it as ``replace_lease``: later renewals carry the newest payload. If the request itself is
terminated, the child is terminated with it (the lease then lapses after its TTL); a keeper that ends
while its request runs on is replaced by the request.

Workflow code only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import dispatch
    from .converter import Shown
    from .models import LeaseKeeperInput, LeaseKeeperReport, LeaseRenewal, ManagedLease
    from .names import LEASE_KEEPER_WORKFLOW_TYPE

STOP_KEEPING_SIGNAL = "stop_keeping"
REPLACE_LEASE_SIGNAL = "replace_lease"


def lease_keeper_id(request_workflow_id: str, lease_id: str) -> str:
    return f"{request_workflow_id}/lease/{lease_id}"


@workflow.defn(name=LEASE_KEEPER_WORKFLOW_TYPE)
class LeaseKeeperWorkflow:
    """Renew one lease every renew interval until the request that owns it says stop."""

    @workflow.init
    def __init__(self, input: LeaseKeeperInput) -> None:
        self._lease = input.call.lease
        self._stop = False

    @workflow.signal(name=STOP_KEEPING_SIGNAL)
    def stop_keeping(self) -> None:
        """The request is exiting: finish the renewal in flight, if any, and report."""
        self._stop = True

    @workflow.signal(name=REPLACE_LEASE_SIGNAL)
    def replace_lease(self, lease: ManagedLease) -> None:
        """The request's hook declared the lease again: renew the newest declaration from now on."""
        if lease.lease_id == self._lease.lease_id:
            self._lease = lease

    @workflow.run
    async def run(self, input: LeaseKeeperInput) -> LeaseKeeperReport:
        report = input.report.model_copy()
        first, renewals = input.first_renewal_after_seconds, 0
        try:
            while True:
                delay = self._lease.renew_interval_seconds if first is None else first
                first = None
                if delay > 0:
                    try:
                        await workflow.wait_condition(
                            lambda: self._stop,
                            timeout=timedelta(seconds=delay),
                            timeout_summary=Shown("next renewal"),
                        )
                    except asyncio.TimeoutError:
                        pass  # the next renewal is due
                    else:
                        return report  # stopped while waiting: nothing in flight
                if self._stop:
                    return report
                report = await self._renew(input, report)
                renewals += 1
                if self._stop:
                    return report
                if renewals >= input.renewals_per_run or workflow.info().is_continue_as_new_suggested():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    call = input.call.model_copy(update={"lease": self._lease})
                    workflow.continue_as_new(
                        input.model_copy(update={"call": call, "report": report, "first_renewal_after_seconds": None})
                    )
        except asyncio.CancelledError:
            report.last_error = report.last_error or "keeper cancelled with the request"
            return report

    async def _renew(self, input: LeaseKeeperInput, report: LeaseKeeperReport) -> LeaseKeeperReport:
        """One renewal through the hook's ``renew_lease``; a provider error is counted, never raised."""
        lease = self._lease
        report = report.model_copy(update={"submitted": report.submitted + 1})
        call = input.call.model_copy(update={"lease": lease, "ordinal": input.call.ordinal + report.submitted})
        summary = f"renew lease · {lease.hook} · {lease.lease_id}"
        try:
            renewal = await dispatch.execute(
                "renew_lease",
                call,
                result_type=LeaseRenewal,
                start_to_close_timeout=timedelta(seconds=max(2.0, min(30.0, lease.renew_interval_seconds))),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
                summary=Shown(summary),
                heartbeat_ceiling=timedelta(seconds=input.heartbeat_timeout_seconds),
                max_worker_losses=input.max_worker_losses,
            )
        except (ActivityError, ApplicationError) as err:
            cause = getattr(err, "cause", None)
            message = str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)
            renewal = LeaseRenewal(error=f"renew_lease of {lease.hook!r}: {message}"[:500])
        return report.counted(renewal)
