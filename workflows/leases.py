"""Managed leases: the request workflow owns the leases its hooks hand it (``ctx.manage_lease``).

For each lease the workflow runs one long-running ``keep_lease`` activity. It renews the lease through
the hook's ``renew_lease`` every renew interval and heartbeats in between, so keeping a lease alive costs
the history of one activity, however long the request runs — a request waiting a day at a checkpoint
adds no events for its leases. A worker that dies under the keeper stops heartbeating; the server
retries the keeper on another worker, which continues from the counts in the last heartbeat.

On every exit of the request — success, failure, required rejection, checkpoint rejection or expiry,
cancellation, stop, short-circuit — the workflow cancels each keeper and waits for it to stop (an
in-flight renewal finishes first), then runs ``release_lease`` through the hook: cleanup never races a
renewal and never depends on the request reaching a later stage. A hook that declares the same lease
id again replaces the lease the keeper renews (the keeper is restarted with the latest one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType, ActivityHandle

with workflow.unsafe.imports_passed_through():
    from . import dispatch
    from .effects import elapsed_ms
    from .models import (
        MAX_CHECKPOINT_EXPIRY_SECONDS,
        EffectStatus,
        LeaseCall,
        LeaseKeeperReport,
        LeaseObservation,
        ManagedLease,
        PipelineHookEffect,
        StageSettings,
        bounded_value,
    )

# Longer than any request may wait (a checkpoint is bounded by MAX_CHECKPOINT_EXPIRY_SECONDS): a keeper
# that reaches it anyway is simply started again.
KEEPER_TIMEOUT = timedelta(seconds=MAX_CHECKPOINT_EXPIRY_SECONDS + 7 * 24 * 3600)
# Retried without limit: a keeper fails only when its worker is lost or shut down.
KEEPER_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))


class _Lease:
    """The request's ownership of one lease: the latest declaration, its keeper and the counts so far."""

    def __init__(self, lease: ManagedLease) -> None:
        self.lease = lease
        self.task: asyncio.Task[None] | None = None
        self.handle: ActivityHandle[LeaseKeeperReport] | None = None
        self.stopping = False
        self.replaced = False
        self.report = LeaseKeeperReport()
        self.keepers = 0

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

    async def _keep(self, owned: _Lease, settings: StageSettings) -> None:
        while not owned.stopping:
            owned.replaced = False
            owned.keepers += 1
            lease = owned.lease
            handle = workflow.start_activity(
                "keep_lease",
                LeaseCall(
                    lease=lease,
                    request_id=self._request_id,
                    workflow_id=self._workflow_id,
                    ordinal=owned.report.submitted,
                ),
                result_type=LeaseKeeperReport,
                start_to_close_timeout=KEEPER_TIMEOUT,
                heartbeat_timeout=dispatch.heartbeat_timeout(
                    KEEPER_TIMEOUT, timedelta(seconds=settings.heartbeat_timeout_seconds)
                ),
                retry_policy=KEEPER_RETRY,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"keep lease · {lease.hook} · {lease.lease_id}",
            )
            owned.handle = handle
            await workflow.wait_condition(lambda handle=handle: owned.stopping or owned.replaced or handle.done())
            if not handle.done():
                handle.cancel()
            try:
                owned.add(await handle)
            except ActivityError as err:
                if isinstance(err.cause, CancelledError):  # cancelled before a worker started it
                    continue
                # Only a non-retryable failure ends a keeper (its hook is gone): another would fail alike.
                owned.report.errors += 1
                owned.report.last_error = _message(err)
                return
            except asyncio.CancelledError:
                owned.report.last_error = owned.report.last_error or "keeper cancelled with the request"
                return

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
            if owned.task is not None:
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
                summary=summary,
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
        summary=summary,
        error=error,
        hook=lease.hook,
        stage=lease.stage,
    )


def _message(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)
