"""The managed-lease activities: one renewal of a lease (scheduled by its ``LeaseKeeper`` child) and its
release (by the request owner, after the keeper stopped), each through the hook that took the lease."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from hooks.contracts import LeaseContext
from workflows.models import LeaseCall, LeaseObservation, LeaseRenewal

from . import telemetry
from .heartbeat import heartbeating
from .hook_stages import HookStageActivities, call_hook, returned_or_default


class LeaseSteps:
    """The lease activities of a worker, over its hooks (see the module docstring).

    Args:
        hooks: The worker's stage activities, whose ``registry`` holds the hooks (as it is now: the worker
            may give them a new registry before it serves anything).
    """

    def __init__(self, hooks: HookStageActivities) -> None:
        self._hooks = hooks

    def activities(self) -> list[Any]:
        return [self.renew_lease, self.release_lease]

    def _context(self, call: LeaseCall, ordinal: int = 0) -> tuple[Any, LeaseContext]:
        lease = call.lease
        try:
            hook = self._hooks.registry.hook(lease.hook)
        except LookupError as err:
            raise ApplicationError(str(err), type="HookNotRegistered", non_retryable=True) from None
        ctx = LeaseContext(
            lease_id=lease.lease_id,
            payload=copy.deepcopy(lease.payload),
            ttl_seconds=lease.ttl_seconds,
            request_id=call.request_id,
            workflow_id=call.workflow_id,
            ordinal=ordinal,
            attempt=activity.info().attempt,
            exit=call.exit,
        )
        return hook, ctx

    @staticmethod
    def _span(method: str, call: LeaseCall):
        return telemetry.tracer().start_as_current_span(
            f"pipeline.hook.lease.{method}.{call.lease.hook}",
            attributes={
                "pipeline.hook.name": call.lease.hook,
                "pipeline.lease_id": call.lease.lease_id,
                "pipeline.request_id": call.request_id,
            },
        )

    @activity.defn(name="renew_lease")
    @heartbeating
    async def renew_lease(self, call: LeaseCall) -> LeaseRenewal:
        """One renewal of a managed lease through its hook's ``renew_lease``. A provider error, a timeout
        or a result that breaks the contract is returned as the renewal's error — counted by the keeper,
        which goes on renewing — never raised."""
        lease = call.lease
        hook, ctx = self._context(call, ordinal=call.ordinal)
        try:
            with self._span("renew_lease", call):
                value = await asyncio.wait_for(
                    call_hook(hook.renew_lease, ctx), timeout=max(1.0, min(30.0, lease.renew_interval_seconds))
                )
            observed = returned_or_default(value, LeaseObservation, "renew_lease")
        except (Exception, asyncio.TimeoutError) as err:  # noqa: BLE001 - a provider error: counted
            message = getattr(err, "message", None) or str(err) or type(err).__name__
            return LeaseRenewal(error=f"renew_lease of {lease.hook!r}: {message}"[:500])
        return LeaseRenewal(expires_at=observed.expires_at)

    @activity.defn(name="release_lease")
    @heartbeating
    async def release_lease(self, call: LeaseCall) -> LeaseObservation:
        """Release a managed lease through its hook's ``release_lease`` (after its keeper has stopped)."""
        hook, ctx = self._context(call)
        with self._span("release_lease", call):
            try:
                value = await call_hook(hook.release_lease, ctx)
            except Exception as err:  # noqa: BLE001 - a provider error the owner counts (after retries)
                raise ApplicationError(
                    f"release_lease of {call.lease.hook!r}: {err}",
                    {"exception_type": type(err).__name__},
                    type="LeaseProviderError",
                ) from None
        return returned_or_default(value, LeaseObservation, "release_lease")
