"""``activity-announcement`` and ``activity-cleanup``: agents tell each other what they are working on.

Each request announces a signal — this agent, what it is doing, the entities involved — to a shared
:class:`~hooks.memory.ActivityCoordinator` with a TTL, and reads what *other* agents are doing right now
into ``activity_coordination`` (rendered inside ``<agent_coordination>``), so the planner can avoid
duplicate or conflicting work.

**Managed requests** (the default). The request owner is the workflow: the announcement hands the signal
to it as a lease (``ctx.manage_lease``). While the request runs, the workflow renews the signal before its
TTL runs out (``renew_lease``); on every exit — success, failure, a required rejection, a checkpoint
rejection or expiry, cancellation, a stop — it stops and joins the renewal loop, then removes the signal
(``release_lease``). Cleanup therefore never depends on the request reaching synthesis, and
``activity-cleanup`` is a pass-through.

**Direct use** (``managed=False``): nothing renews the signal (it lapses after its TTL), and
``activity-cleanup`` removes it after synthesis — only on requests that get that far.

Effects: ``activity_signal`` (the submitted signal and TTL), ``activity_context`` (discovered and selected
signals; the injected text is carried once by ``planning_enrichment:activity_coordination``), and for
managed requests ``activity_signal_renewal`` and ``activity_signal_cleanup`` — pending when the
announcement returns, terminal with submission/error counts once the workflow has joined the renewal loop
and cleaned up. Counters describe submissions and errors, not the coordinator's health.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from datetime import datetime

from workflows.models import ENRICHMENT_ACTIVITY_COORDINATION

from ..contracts import LeaseContext, LeaseObservation, PipelineContext, PipelineHook
from ..memory import ActivityCoordinator, ActivitySignal
from .memory_model import extract_entities, report_call

RENEWAL_EFFECT_ID = "activity_signal_renewal"
CLEANUP_EFFECT_ID = "activity_signal_cleanup"


def activity_signal_id(agent: str, request_id: str) -> str:
    """The signal a request of ``agent`` announces: stable, so any worker can renew or remove it."""
    return f"{agent}:{request_id}"


@dataclass(eq=False)
class ActivityAnnouncementHook(PipelineHook):
    """before_planning: announce this request's activity and inject other agents' concurrent activities.

    Fails open: if the coordinator cannot be read or written, the request plans without coordination (the
    effects say what the provider reported). In managed mode the lease is declared only after a successful
    announcement, so there is never a renewal loop for a signal that was not submitted.

    Args:
        coordinator: The shared signal registry.
        agent: This agent's name, as other agents will see it.
        ttl_seconds: How long a signal stays visible without renewal.
        renew_interval_seconds: How often the request owner renews it (default: a third of the TTL).
        managed: Hand the signal to the request owner (renewal + cleanup on every exit); ``False`` for
            direct use with :class:`ActivityCleanupHook` removing it after synthesis.
        max_signals: At most this many concurrent activities are injected (entity overlap first).
        entity_extractor: Finds the entities of a request.
    """

    coordinator: ActivityCoordinator
    _: KW_ONLY
    agent: str
    ttl_seconds: float = 120.0
    renew_interval_seconds: float | None = None
    managed: bool = True
    max_signals: int = 5
    entity_extractor: Callable[[str], list[str]] = extract_entities
    name: str = "activity-announcement"
    timeout_seconds = 10.0

    async def before_planning(self, ctx: PipelineContext) -> None:
        if ctx.shadow:
            return  # announcing would write to the shared coordinator; it decides nothing
        entities = self.entity_extractor(ctx.request)
        signal = ActivitySignal(
            signal_id=activity_signal_id(self.agent, ctx.request_id),
            agent=self.agent,
            activity=" ".join(ctx.request.split())[:200],
            entities=entities,
            request_id=ctx.request_id,
        )
        announced = await self.coordinator.announce(signal, ttl_seconds=self.ttl_seconds)
        report_call(
            ctx,
            "activity_signal",
            announced,
            name="Activity signal",
            data={
                "signal_id": signal.signal_id,
                "agent": self.agent,
                "activity": signal.activity,
                "entities": entities,
                "ttl_seconds": self.ttl_seconds,
                "managed": self.managed,
                "provider_call_status": announced.provider_call_status,
                **announced.detail,
            },
            summary="signal submitted" if announced.ok else "signal submission failed",
        )
        if announced.ok and self.managed:
            # Before returning: the owner renews it while the request runs and removes it on every exit.
            ctx.manage_lease(
                signal.signal_id,
                ttl_seconds=self.ttl_seconds,
                renew_interval_seconds=self.renew_interval_seconds,
                payload={"signal_id": signal.signal_id, "agent": self.agent},
                renewal_effect_id=RENEWAL_EFFECT_ID,
                renewal_name="Activity signal renewal",
                cleanup_effect_id=CLEANUP_EFFECT_ID,
                cleanup_name="Activity signal cleanup",
            )

        active = await self.coordinator.active()
        others = [s for s in active.items if s.agent != self.agent]
        wanted = {e.lower() for e in entities}
        # Signals about the same entities first, then the most recently announced.
        others.sort(
            key=lambda s: (
                -len(wanted & {e.lower() for e in s.entities}),
                -(s.announced_at or datetime.min).timestamp(),
            )
        )
        selected = others[: self.max_signals]
        report_call(
            ctx,
            "activity_context",
            active,
            name="Concurrent activities",
            data={
                "read_status": active.status,
                "discovered": len(others),
                "selected": [{"signal_id": s.signal_id, "agent": s.agent, "entities": s.entities} for s in selected],
            },
            summary=f"{len(selected)} concurrent activit{'y' if len(selected) == 1 else 'ies'} selected",
        )
        if selected:
            lines = [
                f"- {s.agent} is working on: {s.activity}"
                + (f" [entities: {', '.join(s.entities)}]" if s.entities else "")
                for s in selected
            ]
            ctx.enrichments[ENRICHMENT_ACTIVITY_COORDINATION] = (
                "Other agents are working on these right now; avoid duplicating or contradicting them:\n"
                + "\n".join(lines)
            )

    async def renew_lease(self, lease: LeaseContext) -> LeaseObservation:
        """Scheduled by the request owner every renew interval: push the signal's expiry."""
        renewed = await self.coordinator.renew(lease.lease_id, ttl_seconds=lease.ttl_seconds)
        if not renewed.ok:
            raise RuntimeError(f"coordinator renewal failed: {renewed.error}")
        expires = renewed.detail.get("expires_at")
        return LeaseObservation(
            data={"provider_call_status": renewed.provider_call_status, **renewed.detail},
            expires_at=datetime.fromisoformat(expires) if isinstance(expires, str) else None,
            summary="signal renewed" if renewed.detail.get("found") else "signal absent; not recreated",
        )

    async def release_lease(self, lease: LeaseContext) -> LeaseObservation:
        """Called by the request owner once, on every exit, after the renewal loop was joined."""
        removed = await self.coordinator.remove(lease.lease_id)
        if not removed.ok:
            raise RuntimeError(f"coordinator removal failed: {removed.error}")
        return LeaseObservation(
            data={"provider_call_status": removed.provider_call_status, **removed.detail},
            summary="signal removed" if removed.detail.get("removed") else "signal was already absent",
        )


@dataclass(eq=False)
class ActivityCleanupHook(PipelineHook):
    """after_synthesis: remove this request's signal — only when no request owner holds it.

    In a managed request (the announcement declared a lease) this is a pass-through: the owner has already
    scheduled cleanup for every exit, and reporting here would pre-empt its effect. Used directly, it
    submits the removal and reports ``activity_signal_cleanup``. Either way the response is returned
    unchanged; a coordinator error fails open.

    Args:
        coordinator: The shared signal registry (the announcement hook's).
        agent: The agent name the announcement hook uses.
    """

    coordinator: ActivityCoordinator
    _: KW_ONLY
    agent: str
    name: str = "activity-cleanup"
    timeout_seconds = 10.0

    async def after_synthesis(self, ctx: PipelineContext, response: str) -> str:
        signal_id = activity_signal_id(self.agent, ctx.request_id)
        if signal_id in ctx.managed_leases:
            return response
        removed = await self.coordinator.remove(signal_id)
        report_call(
            ctx,
            CLEANUP_EFFECT_ID,
            removed,
            name="Activity signal cleanup",
            data={
                "signal_id": signal_id,
                "mode": "direct",
                "submitted": 1,
                "errors": int(not removed.ok),
                "provider_call_status": removed.provider_call_status,
                **removed.detail,
            },
            summary="direct removal submitted" if removed.ok else "direct removal failed",
        )
        return response
