"""The hook contracts: what a hook sees (``PipelineContext``), may return, and may hand over.

A hook is any object with a non-empty ``name`` and at least one stage method. Subclassing
:class:`PipelineHook` is the easy way to get the run options' defaults; the stage Protocols (declared
with their stages in ``workflows.stages`` and re-exported by ``hooks``) document each contract, let a type
checker hold a hook against it, and give the registry each method's signature. Stage methods may be
``async def`` or plain ``def``; plain ones run in a worker thread so they never block the event loop.

Every invocation is its own recorded, named invocation, run by a Temporal activity: an in-process hook
(``RunMode.LOCAL_ACTIVITY``, the default) in a local activity — consecutive ones of a stage together in
one — and an ``ACTIVITY`` hook in an activity of its own. An object's attributes therefore do not carry
from one invocation to the next (the worker process may differ): a hook keeps per-run state in
``ctx.state``, or anything longer in a store of its own.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import JsonValue

from workflows.models import (
    MAX_EFFECTS_PER_INVOCATION,
    DetachedWork,
    DetachedWorkResult,
    EffectStatus,
    FailurePolicy,
    GateState,
    HookChain,
    HookRequestView,
    LeaseObservation,
    ManagedLease,
    PipelineHookEffect,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    RunMode,
    ShortCircuitKind,
    Stage,
    StepSummary,
    bounded_value,
)

if TYPE_CHECKING:
    from workflows.stages import ToolDescriptor

logger = logging.getLogger(__name__)
# The card that counts the effects an invocation reported beyond ``MAX_EFFECTS_PER_INVOCATION``.
OVERFLOW_EFFECT_ID = "effects-dropped"

__all__ = [
    "DetachedContext",
    "DetachedWorkResult",
    "HookRejection",
    "LeaseContext",
    "LeaseObservation",
    "NotReplayed",
    "PipelineContext",
    "PipelineGate",
    "PipelineHook",
    "PipelineShortCircuit",
    "PipelineShortCircuitDecision",
    "RequiredAfterPlanningHook",
    "ShortCircuitKind",
]


class HookRejection(Exception):
    """Raise from a hook for a deliberate refusal. It is never retried (an ordinary exception is, up
    to the hook's ``max_attempts``), and its text is recorded exactly."""


class NotReplayed(Exception):
    """Raise from a hook when ``ctx.shadow`` is set to opt out of a policy replay: the replay reports the
    invocation ``not_replayed`` with this text as the reason, never as an allow. A hook whose work writes
    somewhere (announces, remembers, spends) raises it rather than act on a recorded request."""


class PipelineGate:
    """What a before_planning decision hook may know about the cache gate of this request."""

    def __init__(self, state: GateState) -> None:
        self._state = state

    def response_cache_read_disabled(self) -> bool:
        """True when the request asked for ``{"cache": "bypass"}``: do not serve cached answers."""
        return not self._state.cache_read_enabled

    def cache_vary(self) -> dict[str, str]:
        """The reserved variation dimensions as they are now. Store this map beside a cache entry when
        you write it, and return that stored map as ``cached_against`` when you read it."""
        return dict(self._state.variation)


@dataclass
class PipelineContext:
    """What every stage method receives.

    ``enrichments`` is written by before_planning hooks, and only their changes reach the planner.
    ``metadata`` is a read-only view of what the caller attached to the request; ``request`` is the ask
    being served (after any before_run rewrite), with its ``instructions`` and ``facts``. ``state`` is
    this hook's private state for this run: a JSON map only this hook sees, carried by the
    workflow from one of its invocations to the next, never shown to other hooks or to prompts.
    ``shadow`` is set when a policy replay runs the hook against a recorded request: nothing it decides
    is applied, and a hook that would write anywhere raises :class:`NotReplayed` instead.
    """

    request: str
    metadata: Mapping[str, JsonValue]
    enrichments: dict[str, JsonValue]
    request_id: str
    workflow_id: str
    stage: Stage
    hook_name: str
    gate: PipelineGate
    plan_phase: int | None = None
    instructions: str = ""
    facts: Mapping[str, JsonValue] = field(default_factory=dict)
    state: dict[str, JsonValue] = field(default_factory=dict)
    _hook: Any = field(default=None, repr=False)
    _effects: dict[str, PipelineHookEffect] = field(default_factory=dict, repr=False)
    _dropped_effects: int = field(default=0, repr=False)
    _detached: dict[str, DetachedWork] = field(default_factory=dict, repr=False)
    _leases: dict[str, ManagedLease] = field(default_factory=dict, repr=False)
    # Ids of the leases the request owner (the workflow) already holds for this request.
    managed_leases: tuple[str, ...] = ()
    shadow: bool = False
    # The conversation the request belongs to (None outside one); where the stage gives them, the request's
    # steps so far (before_tool, after_tool: those finished before this call), the tools and the attempt of
    # the planning attempt (after_planning).
    conversation_id: str | None = None
    steps: tuple[StepSummary, ...] = ()
    tools: tuple[ToolDescriptor, ...] = ()
    attempt: int | None = None
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    def told(
        self, *, steps: Sequence[StepSummary] = (), tools: Sequence[ToolDescriptor] = (), attempt: int | None = None
    ) -> None:
        """Give the context what the stage tells its hooks besides the subject (the worker does, as it
        prepares the call)."""
        self.steps, self.tools, self.attempt = tuple(steps), tuple(tools), attempt

    @property
    def cancelled(self) -> bool:
        """Whether this invocation was cancelled — it timed out, or its request was cancelled — and its
        outcome will not be used. A long synchronous hook should look at it and return early."""
        return self._cancel.is_set()

    @classmethod
    def of_view(
        cls, view: HookRequestView, *, stage: Stage, hook_name: str, hook: Any, shadow: bool = False
    ) -> PipelineContext:
        """The context of one invocation of ``hook`` on ``view``, the request as the workflow showed it to
        the hook with the hook's private state, leases and conversation; ``shadow`` when a policy replay
        runs it. The context holds copies: nothing the hook does to it reaches ``view``."""
        return cls(
            request=view.request,
            metadata=MappingProxyType(copy.deepcopy(view.metadata)),
            enrichments=copy.deepcopy(view.enrichments),
            request_id=view.request_id,
            workflow_id=view.workflow_id,
            stage=stage,
            hook_name=hook_name,
            gate=PipelineGate(view.gate),
            plan_phase=view.plan_phase,
            instructions=view.instructions,
            facts=MappingProxyType(copy.deepcopy(view.facts)),
            state=copy.deepcopy(view.state),
            _hook=hook,
            managed_leases=tuple(view.leases),
            shadow=shadow,
            conversation_id=view.conversation_id,
        )

    def report_effect(
        self,
        effect_id: str,
        *,
        name: str,
        status: EffectStatus | str = EffectStatus.SUCCEEDED,
        data: Any = None,
        summary: str = "",
        error: str | None = None,
        started_at: datetime | None = None,
        duration_ms: float | None = None,
        schema_version: int = 1,
    ) -> PipelineHookEffect:
        """Record work this invocation attempted and what it observed.

        Reporting the same ``effect_id`` again replaces the earlier report: one effect, one card. Every
        field is bounded: data over 32 KiB of JSON is kept by reference (digest, size, preview), texts are
        clipped, and an invocation keeps at most ``MAX_EFFECTS_PER_INVOCATION`` effects (the last card says
        how many more were dropped). A report that cannot be kept (non-JSON data, say) is recorded as a
        failed effect. Reporting never raises into the hook and never changes the request's outcome.
        """
        fields = {
            "effect_id": effect_id,
            "schema_version": schema_version,
            "name": name,
            "status": status,
            "started_at": started_at,
            "duration_ms": duration_ms,
            "summary": summary,
            "error": error,
            "hook": self.hook_name,
            "stage": self.stage,
        }
        try:
            effect = PipelineHookEffect(**fields, data=bounded_value(data))
        except (TypeError, ValueError) as err:
            # Reporting is diagnostic: a report that cannot be kept never changes the hook's outcome.
            logger.warning("hook %s: effect %r could not be recorded: %s", self.hook_name, effect_id, err)
            effect = PipelineHookEffect(
                effect_id=str(effect_id),
                name=str(name),
                status=EffectStatus.FAILED,
                summary="effect report rejected",
                error=f"invalid effect report: {err}"[:2000],
                hook=self.hook_name,
                stage=self.stage,
            )
        if effect_id not in self._effects and len(self._effects) >= MAX_EFFECTS_PER_INVOCATION:
            # Bounded like every effect field: one beyond the limit is counted on one card, never kept.
            self._dropped_effects += 1
            logger.warning("hook %s: effect %r dropped: over %d effects", self.hook_name, effect_id, len(self._effects))
            self._effects[OVERFLOW_EFFECT_ID] = PipelineHookEffect(
                effect_id=OVERFLOW_EFFECT_ID,
                name="effects beyond the limit",
                status=EffectStatus.FAILED,
                summary=f"{self._dropped_effects} effect(s) beyond {MAX_EFFECTS_PER_INVOCATION} were dropped",
                hook=self.hook_name,
                stage=self.stage,
            )
            return effect
        self._effects[effect_id] = effect
        return effect

    def detach(
        self,
        effect_id: str,
        *,
        name: str,
        payload: Any = None,
        data: Any = None,
        summary: str = "submitted",
    ) -> PipelineHookEffect:
        """Hand work off so it outlives this invocation and the request.

        The effect is announced ``pending`` now; once this invocation returns successfully the request
        starts a child workflow ``<workflow id>/effect/<effect_id>`` that runs this hook's
        ``run_detached(work)`` with ``payload`` and brings the same effect to ``succeeded`` or ``failed``.
        If this invocation fails instead, nothing is started and the effect is recorded as failed.
        ``payload`` is copied: the detached work never sees objects this invocation still holds.
        """
        if not callable(getattr(self._hook, "run_detached", None)):
            raise TypeError(f"hook {self.hook_name!r} detaches work but implements no run_detached(work)")
        effect = self.report_effect(
            effect_id, name=name, status=EffectStatus.PENDING, data=data, summary=summary, started_at=_utcnow()
        )
        self._detached[effect_id] = DetachedWork(
            effect_id=effect_id, hook=self.hook_name, stage=self.stage, name=name, payload=copy.deepcopy(payload)
        )
        return effect

    def manage_lease(
        self,
        lease_id: str,
        *,
        ttl_seconds: float,
        renew_interval_seconds: float | None = None,
        payload: Any = None,
        renewal_effect_id: str,
        renewal_name: str,
        cleanup_effect_id: str,
        cleanup_name: str,
        data: Any = None,
    ) -> ManagedLease:
        """Hand a lease (an announcement with a TTL, a claim) to the request owner: the workflow keeps it
        alive and releases it, so cleanup never depends on the request reaching a later stage.

        Both effects are announced ``pending`` now, before the invocation returns. Once it has returned
        successfully the workflow keeps the lease alive: a durable timer and a short renewal that calls this
        hook's ``renew_lease(lease)`` every ``renew_interval_seconds`` (default: a third of the TTL), handed to
        a ``LeaseKeeper`` child from the moment the request waits (a checkpoint, its conversation turn); on every exit — success, failure, rejection,
        checkpoint rejection or expiry, cancellation, stop — it stops renewing and waits for a renewal in
        flight, then calls ``release_lease(lease)``, and brings both effects to a terminal state with
        submission and error counts. Declaring the same ``lease_id`` again (in a
        later invocation) renews the latest payload. If this invocation fails instead, no owner takes the
        lease and both effects are recorded failed.
        """
        hook = self._hook
        for method in ("renew_lease", "release_lease"):
            if not callable(getattr(hook, method, None)):
                raise TypeError(f"hook {self.hook_name!r} manages a lease but implements no {method}(lease)")
        interval = renew_interval_seconds if renew_interval_seconds is not None else ttl_seconds / 3
        if not 0 < interval < ttl_seconds:
            raise ValueError(
                f"renew interval {interval:g} s must be positive and shorter than the TTL {ttl_seconds:g} s"
            )
        lease = ManagedLease(
            lease_id=lease_id,
            hook=self.hook_name,
            stage=self.stage,
            ttl_seconds=ttl_seconds,
            renew_interval_seconds=interval,
            renewal_effect_id=renewal_effect_id,
            cleanup_effect_id=cleanup_effect_id,
            payload=copy.deepcopy(payload),
        )
        started = _utcnow()
        details = {"lease_id": lease_id, "ttl_seconds": ttl_seconds, "renew_interval_seconds": interval}
        if data is not None:
            details["declared"] = data
        for effect_id, name, pending, summary in (
            (renewal_effect_id, renewal_name, "loop", "renewal loop handed to the request owner"),
            (cleanup_effect_id, cleanup_name, "cleanup", "cleanup owned by the request; runs on every exit"),
        ):
            self.report_effect(
                effect_id,
                name=name,
                status=EffectStatus.PENDING,
                data={**details, pending: "pending"},
                summary=summary,
                started_at=started,
            )
        self._leases[lease_id] = lease
        return lease

    @property
    def leases(self) -> list[ManagedLease]:
        return list(self._leases.values())

    @property
    def effects(self) -> list[PipelineHookEffect]:
        return list(self._effects.values())

    @property
    def detached(self) -> list[DetachedWork]:
        return list(self._detached.values())


@dataclass(frozen=True)
class DetachedContext:
    """What a hook's ``run_detached`` receives: the work it handed off, in a later activity that may run
    on another worker, after the request has finished. Raise to report the effect ``failed`` (after the
    child's retries); return a :class:`DetachedWorkResult` (or ``None``) to report it ``succeeded``."""

    effect_id: str
    name: str
    payload: Any  # the JSON value the hook handed off
    request_id: str
    workflow_id: str
    attempt: int
    run_id: str = ""  # the request's run: with workflow_id and effect_id, a key no other run shares


@dataclass(frozen=True)
class LeaseContext:
    """What a hook's ``renew_lease`` / ``release_lease`` receives: the lease it declared with
    ``ctx.manage_lease``, in a later activity scheduled by the request owner (possibly on another worker).
    Return a :class:`LeaseObservation` (or ``None``); raise when the provider reports an error, so the
    owner counts it. ``exit`` says how the request ended (for the release only)."""

    lease_id: str
    payload: Any  # the JSON value the hook declared
    ttl_seconds: float
    request_id: str
    workflow_id: str
    ordinal: int
    attempt: int
    exit: str | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class PipelineHook:
    """Base class with the run options every hook has. Subclasses set ``name`` and implement stages.

    Attributes:
        name: Non-empty and unique in the pipeline; used in the UI, spans and the record.
        run_mode: ``RunMode.LOCAL_ACTIVITY`` (default): the invocation runs in the workflow's worker, in
            the same workflow task as the stage's other hooks, recorded as a marker with its summary —
            for in-process work that takes milliseconds. ``RunMode.ACTIVITY`` for a hook that calls
            something remote or slow (a model, an HTTP service, a subprocess): its own task, retried by
            the server, heartbeated, and visible as an activity.
        timeout_seconds: Per-attempt limit; a hook that exceeds it is recorded as ``timed_out``.
        max_attempts: Attempts for a hook that raises an ordinary exception (``HookRejection`` and
            contract violations are never retried).
        priority: Execution order across Python and declared hooks: highest first, then registration
            order.
        scope: ``global`` (every request), ``tenant`` (requests whose metadata ``tenant_id`` is
            ``tenant_id``) or ``agent`` (also ``agent_id``); filtered per request by ``resolve_pipeline``.
        matcher: A regex searched in the tool name (``agent/capability``). The tool stages
            (before_tool, on_tool_error, after_tool) invoke the hook only for matching tools; the
            workflow decides, so a non-matching step schedules no activity for it. ``None``: every tool.
        subagent_only: The tool stages invoke the hook only for sub-agent steps.
        failure_policy: ``None`` (the stage's own policy) or a ``FailurePolicy`` that replaces it at
            every stage but after_planning and the observers: ``FAIL_CLOSED`` for a hook whose job is
            protection (a redaction at after_synthesis ends the request rather than send an unredacted
            answer), ``FAIL_OPEN`` for an optional one at a stage that fails closed by default.
        chain: ``None``, or a ``HookChain``: the hooks of one chain share its time budget at each run of
            their stage, and a hook whose chain has run out decides as ``on_exhausted`` says without
            running (declared hooks of a blocking event set it).
        calls_service: The hook calls something outside the worker (HTTP, a model, a subprocess) even
            though it runs in-process. A policy replay runs such a hook — and every ``RunMode.ACTIVITY``
            hook — only when it is ``shadow_safe``; otherwise it reports it ``not_replayed``.
        shadow_safe: The hook may run against recorded requests: whatever it calls is read-only and
            spends nothing (it may still check ``ctx.shadow`` and raise :class:`NotReplayed`).
    """

    name: str = ""
    run_mode: RunMode = RunMode.LOCAL_ACTIVITY
    timeout_seconds: float = 10.0
    max_attempts: int = 3
    priority: int = 0
    scope: str = "global"
    matcher: str | None = None
    subagent_only: bool = False
    tenant_id: str | None = None
    agent_id: str | None = None
    failure_policy: FailurePolicy | None = None
    chain: HookChain | None = None
    calls_service: bool = False
    shadow_safe: bool = False


class RequiredAfterPlanningHook:
    """Marker: this hook's after_planning is a fail-closed boundary.

    Its error, wrong return type or invalid plan fails the request with ``RequiredAfterPlanningError``
    before any tool runs. At most one hook may carry it, it must implement ``after_planning``, and it
    must be the last after_planning participant (checked when the pipeline is built).
    """

    required_after_planning: ClassVar[bool] = True


def hook_option(hook: Any, option: str) -> Any:
    """A run option of ``hook``, falling back to :class:`PipelineHook`'s default."""
    return getattr(hook, option, getattr(PipelineHook, option))
