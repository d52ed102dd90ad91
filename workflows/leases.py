"""Managed leases: the request workflow owns the leases its hooks hand it (``ctx.manage_lease``).

A lease is renewed every renew interval with a durable timer and one short renewal through the hook's
``renew_lease``. Nothing holds a worker slot in between, however long the request waits, and a request
that ends before the first renewal falls due never renews (one timer in its history, never fired). The
request makes the first ``StageSettings.lease_renewals_in_request`` renewals itself, as local activities
(a few events of history each); a request still running after them — a long wait at a checkpoint — hands
the lease to a ``LeaseKeeper`` child workflow (``workflows.lease_keeper``), so its own history stops
growing with the wait. A declaration of the same lease id again renews the newest payload from then on.

On every exit of the request — success, failure, required rejection, checkpoint rejection or expiry,
cancellation, stop, short-circuit — the workflow stops renewing and waits for a renewal in flight to
finish (a keeper child is stopped and its result awaited), then runs ``release_lease`` through the hook:
cleanup never races a renewal and never depends on the request reaching a later stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.workflow import ChildWorkflowHandle

with workflow.unsafe.imports_passed_through():
    from . import dispatch, story
    from .converter import Shown
    from .effects import elapsed_ms
    from .lease_keeper import LEASE_KEEPER_WORKFLOW_TYPE, REPLACE_LEASE_SIGNAL, STOP_KEEPING_SIGNAL, lease_keeper_id
    from .models import (
        EffectStatus,
        LeaseCall,
        LeaseKeeperInput,
        LeaseKeeperReport,
        LeaseObservation,
        LeaseRenewal,
        ManagedLease,
        PipelineHookEffect,
        StageSettings,
        bounded_value,
    )


class _Lease:
    """The request's ownership of one lease: the latest declaration, its keeper and the counts so far."""

    def __init__(self, lease: ManagedLease) -> None:
        self.lease = lease
        self.task: asyncio.Task[None] | None = None
        self.keeper: ChildWorkflowHandle[Any, LeaseKeeperReport] | None = None
        self.sent: ManagedLease | None = None  # the declaration the keeper child renews
        self.renewals_here = 0  # renewals the request made itself
        self.renewing = False  # a renewal of the request's own is in flight
        self.handed_over = False  # a LeaseKeeper child keeps it (or is being started to)
        self.stopping = False
        self.replaced = False
        self.report = LeaseKeeperReport()
        self.keepers = 0

    def keeper_done(self) -> bool:
        """Whether the lease's keeper child has ended (it only does once stopped, or if it failed)."""
        return self.keeper is not None and self.keeper.done()

    def add(self, report: LeaseKeeperReport) -> None:
        total = self.report
        total.submitted += report.submitted
        total.renewed += report.renewed
        total.errors += report.errors
        total.last_error = report.last_error or total.last_error
        total.expires_at = report.expires_at or total.expires_at


class ManagedLeases:
    """Every lease one request owns, kept alive until :meth:`release_all`."""

    def __init__(self, request_id: str, workflow_id: str) -> None:
        self._request_id = request_id
        self._workflow_id = workflow_id
        self._leases: dict[str, _Lease] = {}
        self.keeper_search_attributes: TypedSearchAttributes | None = None

    def __bool__(self) -> bool:
        return bool(self._leases)

    @property
    def ids(self) -> list[str]:
        return list(self._leases)

    def adopt(self, lease: ManagedLease, settings: StageSettings) -> None:
        """Take ownership of a lease a hook declared and start keeping it alive."""
        owned = self._leases.get(lease.lease_id)
        if owned is not None:
            owned.lease = lease
            owned.replaced = True
            return
        owned = _Lease(lease)
        self._leases[lease.lease_id] = owned
        owned.task = asyncio.create_task(self._keep(owned, settings))

    def _call(self, lease: ManagedLease, ordinal: int = 0) -> LeaseCall:
        return LeaseCall(lease=lease, request_id=self._request_id, workflow_id=self._workflow_id, ordinal=ordinal)

    async def _keep(self, owned: _Lease, settings: StageSettings) -> None:
        """Renew every renew interval with a durable timer and a local ``renew_lease`` in the request
        itself — a request that ends sooner never renews — and after ``lease_renewals_in_request``
        renewals hand the lease to a ``LeaseKeeper`` child, so a long wait cannot grow the request's
        history without bound. A stop lets a renewal in flight finish; a sleeping timer is left as is."""
        while owned.renewals_here < settings.lease_renewals_in_request:
            lease = owned.lease
            await workflow.sleep(
                lease.renew_interval_seconds, summary=Shown(f"renew lease · {lease.hook} · {lease.lease_id}")
            )
            if owned.stopping:
                return
            owned.renewing = True
            try:
                owned.report = await self._renew_here(owned)
            finally:
                owned.renewing = False
            owned.renewals_here += 1
            if owned.stopping:
                return
        await self._keep_by_child(owned, settings)

    async def _renew_here(self, owned: _Lease) -> LeaseKeeperReport:
        """One renewal as a local activity of the request (in-process, no task of its own); a provider error
        is counted, never raised."""
        lease, report = owned.lease, owned.report
        report = report.model_copy(update={"submitted": report.submitted + 1})
        try:
            renewal = await workflow.execute_local_activity(
                "renew_lease",
                self._call(lease, report.submitted),
                result_type=LeaseRenewal,
                start_to_close_timeout=timedelta(seconds=max(2.0, min(30.0, lease.renew_interval_seconds))),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
                summary=Shown(f"renew lease · {lease.hook} · {lease.lease_id}"),
            )
        except (ActivityError, ApplicationError) as err:
            renewal = LeaseRenewal(error=f"renew_lease of {lease.hook!r}: {_message(err)}"[:500])
        return report.counted(renewal)

    async def _keep_by_child(self, owned: _Lease, settings: StageSettings) -> None:
        """Hand the lease to a ``LeaseKeeper`` child until the request stops it; the child's counts come
        back as its result."""
        lease = owned.lease
        owned.handed_over = True
        owned.keepers += 1
        owned.sent = owned.lease
        owned.keeper = await workflow.start_child_workflow(
            LEASE_KEEPER_WORKFLOW_TYPE,
            LeaseKeeperInput(
                call=self._call(owned.sent, owned.report.submitted),
                report=owned.report,
                renew_first=False,
                heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
                max_worker_losses=settings.max_worker_losses,
            ),
            id=lease_keeper_id(self._workflow_id, lease.lease_id),
            result_type=LeaseKeeperReport,
            static_summary=story.lease_keeper_summary(lease.hook, lease.lease_id),
            static_details=story.lease_keeper_details(self._workflow_id, self._request_id),
            search_attributes=self.keeper_search_attributes,
        )
        while True:
            await workflow.wait_condition(
                lambda: owned.stopping or owned.lease is not owned.sent or owned.keeper_done()
            )
            if owned.stopping or owned.keeper_done():
                break
            owned.sent = owned.lease
            await owned.keeper.signal(REPLACE_LEASE_SIGNAL, owned.sent)
        if not owned.keeper_done():
            await owned.keeper.signal(STOP_KEEPING_SIGNAL)
        try:
            owned.report = await owned.keeper
        except asyncio.CancelledError:
            owned.report.last_error = owned.report.last_error or "keeper cancelled with the request"
        except FailureError as err:
            owned.report.errors += 1
            owned.report.last_error = _message(err)

    async def release_all(
        self,
        exit: str,
        settings: StageSettings,
        announced: Callable[[str], PipelineHookEffect | None],
        on_worker_lost: Callable[[str, str, int], None],
    ) -> list[PipelineHookEffect]:
        """Stop and join every keeper, then release each lease; returns both effects of every lease in
        their terminal state (``announced`` finds the pending effects the declaring hook reported)."""
        owned_leases = list(self._leases.values())
        for owned in owned_leases:
            owned.stopping = True
        for owned in owned_leases:
            if not owned.handed_over:
                # Renewed by the request itself: a renewal in flight finishes first; a timer waiting for
                # the next one is left as it is (it never fires in a request that has ended).
                await workflow.wait_condition(lambda owned=owned: not owned.renewing)
            elif owned.task is not None:
                try:
                    await owned.task
                except asyncio.CancelledError:
                    owned.report.last_error = owned.report.last_error or "keeper cancelled"
        effects: list[PipelineHookEffect] = []
        for owned in owned_leases:
            effects.extend(await self._release(owned, exit, settings, announced, on_worker_lost))
        return effects

    async def _release(
        self,
        owned: _Lease,
        exit: str,
        settings: StageSettings,
        announced: Callable[[str], PipelineHookEffect | None],
        on_worker_lost: Callable[[str, str, int], None],
    ) -> list[PipelineHookEffect]:
        lease = owned.lease
        error = None
        observed = LeaseObservation()
        summary = f"release lease · {lease.hook} · {lease.lease_id}"
        try:
            observed = await dispatch.execute(
                "release_lease",
                LeaseCall(lease=lease, request_id=self._request_id, workflow_id=self._workflow_id, exit=exit),
                result_type=LeaseObservation,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
                summary=Shown(summary),
                heartbeat_ceiling=timedelta(seconds=settings.heartbeat_timeout_seconds),
                max_worker_losses=settings.max_worker_losses,
                on_worker_lost=lambda n: on_worker_lost("release_lease", summary, n),
            )
        except (ActivityError, ApplicationError) as err:
            error = _message(err)
        except asyncio.CancelledError:
            error = "cancelled with the request"
        report = owned.report
        common = {"lease_id": lease.lease_id, "ttl_seconds": lease.ttl_seconds, "exit": exit}
        renewal = {
            **common,
            "renew_interval_seconds": lease.renew_interval_seconds,
            "loop": "joined",
            "keepers": owned.keepers,
            "submitted": report.submitted,
            "returned": report.renewed,
            "errors": report.errors,
            "last_error": report.last_error,
            "last_expires_at": report.expires_at.isoformat() if report.expires_at else None,
        }
        cleanup = {
            **common,
            "renewal_joined_first": True,
            "submitted": 1,
            "errors": int(error is not None),
            "provider_call_status": "error" if error else "returned",
            "observed": observed.data,
        }
        return [
            _terminal(
                announced(lease.renewal_effect_id),
                lease.renewal_effect_id,
                lease,
                renewal,
                report.last_error if report.errors else None,
                f"renewal joined: {report.submitted} submitted, {report.errors} error(s)",
            ),
            _terminal(
                announced(lease.cleanup_effect_id),
                lease.cleanup_effect_id,
                lease,
                cleanup,
                error,
                f"release failed: {error}" if error else (observed.summary or "release call returned"),
            ),
        ]


def _terminal(
    announced: PipelineHookEffect | None,
    effect_id: str,
    lease: ManagedLease,
    data: dict[str, Any],
    error: str | None,
    summary: str,
) -> PipelineHookEffect:
    started = announced.started_at if announced is not None else None
    return PipelineHookEffect(
        effect_id=effect_id,
        name=announced.name if announced is not None else effect_id,
        status=EffectStatus.FAILED if error else EffectStatus.SUCCEEDED,
        data=bounded_value(data),
        started_at=started,
        duration_ms=elapsed_ms(started) if started is not None else None,
        summary=Shown(summary),
        error=error,
        hook=lease.hook,
        stage=lease.stage,
    )


def _message(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)
