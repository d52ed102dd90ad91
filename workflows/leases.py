"""Managed leases: the request workflow owns the leases its hooks hand it (``ctx.manage_lease``).

A lease is renewed every renew interval with a durable timer and one short renewal through the hook's
``renew_lease``. Nothing holds a worker slot in between, however long the request runs, and a request
that ends before the first renewal falls due never renews (one timer, cancelled as it ends). While the
request works, it makes renewals itself, as local activities (a few events of history each). The moment
it starts to wait — a checkpoint opens, or it waits for its conversation turn — it hands each lease it
holds to a ``LeaseKeeper`` child workflow (``workflows.lease_keeper``): one child start, a few events,
and from then on the renewals land in the keeper's history, so the request's own history stays flat
however long the wait. The keeper keeps the lease until the request exits (taking it back after the wait
would cost the request a signal and the keeper's close, then its own renewals again). A request that
works on for ``StageSettings.lease_renewals_in_request`` renewals without waiting hands its leases over
the same way. A keeper that ends before the request stops it (terminated, failed) is noticed as it ends:
counted as an error in the renewal effect and replaced by a new keeper that renews at once (up to
``MAX_KEEPERS`` keepers per lease; then the lease is left to lapse after its TTL). A declaration of the
same lease id again renews the newest payload from then on.

On every exit of the request — success, failure, required rejection, checkpoint rejection or expiry,
cancellation, stop, short-circuit — the workflow stops renewing and waits for a renewal in flight to
finish (a keeper child is stopped and its result awaited), then runs ``release_lease`` through the hook:
cleanup never races a renewal and never depends on the request reaching a later stage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
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

# Keepers one lease may have: the first, and the ones started after a keeper ended before the request
# stopped it. A keeper that keeps failing is a fault of its own, not something more keepers mend.
MAX_KEEPERS = 4


class _Lease:
    """The request's ownership of one lease: the latest declaration, its keeper and the counts so far."""

    def __init__(self, lease: ManagedLease) -> None:
        self.lease = lease
        self.task: asyncio.Task[None] | None = None
        self.keeper: ChildWorkflowHandle[Any, LeaseKeeperReport] | None = None
        self.sent: ManagedLease | None = None  # the declaration the keeper child renews
        self.renewals_here = 0  # renewals the request made itself
        self.due = workflow.now() + timedelta(seconds=lease.renew_interval_seconds)  # its next renewal
        self.handed_over = False  # a LeaseKeeper child keeps it (or is being started to)
        self.stopping = False
        self.report = LeaseKeeperReport()
        self.keepers = 0

    def keeper_done(self) -> bool:
        """Whether the lease's keeper child has ended (it only does once stopped, or if it failed)."""
        return self.keeper is not None and self.keeper.done()


class ManagedLeases:
    """Every lease one request owns, kept alive until :meth:`release_all`."""

    def __init__(self, request_id: str, workflow_id: str) -> None:
        self._request_id = request_id
        self._workflow_id = workflow_id
        self._leases: dict[str, _Lease] = {}
        self._waits = 0  # waits in progress: open checkpoints, a turn awaited
        self.keeper_search_attributes: TypedSearchAttributes | None = None

    def __bool__(self) -> bool:
        return bool(self._leases)

    @property
    def ids(self) -> list[str]:
        return list(self._leases)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The request waits while the block runs (a checkpoint is open, or its conversation turn is
        awaited): every lease it renews itself goes to its keeper at once, and so does one declared
        meanwhile. They stay there until the request exits."""
        self._waits += 1
        try:
            yield
        finally:
            self._waits -= 1

    def adopt(self, lease: ManagedLease, settings: StageSettings) -> None:
        """Take ownership of a lease a hook declared and start keeping it alive."""
        owned = self._leases.get(lease.lease_id)
        if owned is not None:
            owned.lease = lease
            return
        owned = _Lease(lease)
        self._leases[lease.lease_id] = owned
        owned.task = asyncio.create_task(self._keep(owned, settings))

    def _call(self, lease: ManagedLease, ordinal: int = 0) -> LeaseCall:
        return LeaseCall(lease=lease, request_id=self._request_id, workflow_id=self._workflow_id, ordinal=ordinal)

    async def _keep(self, owned: _Lease, settings: StageSettings) -> None:
        """Renew every renew interval with a durable timer and a local ``renew_lease`` in the request
        itself — a request that ends sooner never renews — until the request waits or has made
        ``lease_renewals_in_request`` renewals; then hand the lease to a ``LeaseKeeper`` child. A stop
        lets a renewal in flight finish and cancels the timer of the next."""
        while owned.renewals_here < settings.lease_renewals_in_request and not self._waits:
            lease = owned.lease
            try:
                await workflow.wait_condition(
                    lambda: owned.stopping or self._waits > 0,
                    timeout=(owned.due - workflow.now()).total_seconds(),
                    timeout_summary=Shown(f"renew lease · {lease.hook} · {lease.lease_id}"),
                )
            except asyncio.TimeoutError:
                pass  # the renewal is due
            else:
                break  # stopping, or the request waits: its keeper renews from now on
            if owned.stopping:
                break
            owned.report = await self._renew_here(owned)
            owned.renewals_here += 1
            owned.due = workflow.now() + timedelta(seconds=owned.lease.renew_interval_seconds)
        if not owned.stopping:
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
        back as its result. Its first renewal falls when the request's own next one would have. A keeper
        that ends on its own is counted as an error and replaced by one that renews at once."""
        owned.handed_over = True
        first = max(0.0, (owned.due - workflow.now()).total_seconds())
        while not owned.stopping:
            if owned.keepers >= MAX_KEEPERS:
                owned.report.last_error = (
                    f"{owned.keepers} lease keepers ended before the request stopped them; "
                    f"the last: {owned.report.last_error}; the lease is left to lapse after its TTL"
                )[:1000]
                return
            try:
                keeper = await self._start_keeper(owned, settings, first)
            except FailureError as err:  # a keeper of that id still running: nothing to join, nothing renews
                owned.report.errors += 1
                owned.report.last_error = f"lease keeper not started: {_message(err)}"[:1000]
                return
            while True:
                await workflow.wait_condition(
                    lambda: owned.stopping or owned.lease is not owned.sent or owned.keeper_done()
                )
                if owned.stopping or owned.keeper_done():
                    break
                owned.sent = owned.lease
                with contextlib.suppress(FailureError):  # a keeper that is gone: its close comes next
                    await keeper.signal(REPLACE_LEASE_SIGNAL, owned.sent)
            ended_on_its_own = owned.keeper_done()
            if not ended_on_its_own:
                try:
                    await keeper.signal(STOP_KEEPING_SIGNAL)
                except FailureError:
                    ended_on_its_own = True  # gone before it was told to stop: its close comes next
            try:
                report = await keeper
            except asyncio.CancelledError:
                owned.report.last_error = owned.report.last_error or "keeper cancelled with the request"
                return
            except FailureError as err:
                owned.report.errors += 1
                owned.report.last_error = f"lease keeper {keeper.id} ended before it was stopped: {_message(err)}"[
                    :1000
                ]
                workflow.logger.warning("lease.keeper_lost lease=%s: %s", owned.lease.lease_id, _message(err))
            else:
                owned.report = report
                if ended_on_its_own and not owned.stopping:  # a keeper only returns once told to stop
                    owned.report.errors += 1
                    owned.report.last_error = f"lease keeper {keeper.id} returned before it was stopped"
            first = 0.0  # the lease may have gone unrenewed for a while: the next keeper renews at once

    async def _start_keeper(
        self, owned: _Lease, settings: StageSettings, first: float
    ) -> ChildWorkflowHandle[Any, LeaseKeeperReport]:
        lease = owned.lease
        owned.keepers += 1
        owned.sent = lease
        owned.keeper = await workflow.start_child_workflow(
            LEASE_KEEPER_WORKFLOW_TYPE,
            LeaseKeeperInput(
                call=self._call(lease, owned.report.submitted),
                report=owned.report,
                first_renewal_after_seconds=first,
                heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
                max_worker_losses=settings.max_worker_losses,
            ),
            id=lease_keeper_id(self._workflow_id, lease.lease_id),
            result_type=LeaseKeeperReport,
            static_summary=story.lease_keeper_summary(lease.hook, lease.lease_id),
            static_details=story.lease_keeper_details(self._workflow_id, self._request_id),
            search_attributes=self.keeper_search_attributes,
        )
        return owned.keeper

    async def release_all(
        self,
        exit: str,
        settings: StageSettings,
        announced: Callable[[str], PipelineHookEffect | None],
        on_worker_lost: Callable[[str, str, int], None],
    ) -> list[PipelineHookEffect]:
        """Stop and join every renewal loop and keeper, then release each lease; returns both effects of
        every lease in their terminal state (``announced`` finds the pending effects the declaring hook
        reported)."""
        owned_leases = list(self._leases.values())
        for owned in owned_leases:
            owned.stopping = True
        for owned in owned_leases:
            if owned.task is None:
                continue
            try:
                await owned.task  # a renewal in flight finishes; a keeper is stopped and its result awaited
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
