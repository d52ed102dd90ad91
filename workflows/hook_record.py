"""What a hook invocation leaves in the request: its record entry, its decision, its effects and model
calls, and — for one that succeeded — its private state, the leases it handed over and the detached work it
started. One place, whatever ran the invocation (an activity, a local activity, a batch, a tool step).
Workflow code only.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import decisions, story
    from . import search_attributes as sa
    from .detached import DETACHED_WORKFLOW_TYPE, detached_workflow_id, start_effect_child
    from .effects import record_effects
    from .listing import StageListing
    from .models import (
        DetachedEffectInput,
        DetachedWork,
        HookEntry,
        HookInvocation,
        HookOutcome,
        InvocationOutcome,
        PlanStep,
        Stage,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .snapshots import invocation_entry
    from .stages import StageSpec
    from .support import INFRASTRUCTURE_FAILURES, InvocationFailure

_INVOCATION_OUTCOMES = {
    decisions.HOOK_TIMEOUT: InvocationOutcome.TIMED_OUT,
    decisions.WORKER_LOST: InvocationOutcome.WORKER_LOST,
}


class InvocationRecorder:
    """Records hook invocations in the request's record (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing) -> None:
        self._state = state
        self._scheduler = scheduler
        self._listing = listing

    def entry(
        self, hook: HookEntry, stage: Stage, sequence: int, plan_phase: int | None, step: PlanStep | None
    ) -> HookInvocation:
        """The record entry of one invocation, as it starts."""
        return invocation_entry(
            hook.name,
            stage,
            sequence,
            self._state.phase if step is not None else plan_phase,
            step.step_id if step else None,
            workflow.now(),
        )

    def failed(
        self,
        spec: StageSpec,
        invocation: HookInvocation,
        hook: HookEntry,
        failure: InvocationFailure,
        err: BaseException | None = None,
    ) -> InvocationFailure:
        """Record a failed invocation and its decision; an infrastructure failure ends the request."""
        invocation.outcome = _INVOCATION_OUTCOMES.get(failure.category, InvocationOutcome.FAILED)
        invocation.error = failure.message
        invocation.error_type = failure.category
        invocation.exception_type = failure.exception_type
        invocation.decision = failure.decision = spec.failure(hook, failure.category)
        record = self._state.record
        record.pipeline_hooks.append(invocation)
        record_effects(record, failure.effects)
        record.model_calls.extend(failure.model_calls)
        if failure.category in INFRASTRUCTURE_FAILURES:  # not the hook's verdict: the request ends as it is
            if isinstance(err, ApplicationError) and err.type == failure.category:
                raise err
            raise ApplicationError(
                failure.message,
                {"hook": hook.name, "stage": spec.stage.value},
                type=failure.category,
                non_retryable=True,
            ) from None
        return failure

    async def succeeded(self, invocation: HookInvocation, hook: HookEntry, outcome: HookOutcome) -> HookOutcome:
        """Record a successful invocation; keep the hook's state, adopt its leases, start its detached work."""
        state = self._state
        invocation.decision = outcome.decision
        state.record.pipeline_hooks.append(invocation)
        if outcome.state is not None:
            state.hook_state[hook.name] = outcome.state
        record_effects(state.record, outcome.effects)
        state.record.model_calls.extend(outcome.model_calls)
        for lease in outcome.leases:
            state.leases.adopt(lease, state.manifest.settings)
        for work in outcome.detached:
            await self._start_detached(work)
        return outcome

    async def _start_detached(self, work: DetachedWork) -> None:
        """Start the child that carries a detached effect to its terminal state; it outlives the request."""
        state = self._state
        effect = state.record.effect(work.effect_id)
        if effect is None:
            return
        info = workflow.info()
        self._scheduler.check_payload(f"detached · {work.hook} · {work.effect_id}", work)
        settings = state.manifest.settings
        self._listing.publish(untimed=True)  # the server starts the child at once
        await start_effect_child(
            state.record,
            state.detached_tokens,
            effect,
            lambda token: DetachedEffectInput(
                parent_workflow_id=info.workflow_id,
                parent_run_id=info.run_id,
                request_id=state.request_id,
                work=work,
                effect=effect,
                update_token=token,
                heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
                max_worker_losses=settings.max_worker_losses,
                ui_shows_text=state.manifest.ui_shows_text,
            ),
            workflow_type=DETACHED_WORKFLOW_TYPE,
            id=detached_workflow_id(info.workflow_id, work.effect_id),
            what="detached work",
            static_summary=story.detached_summary(work.stage.value, work.hook, work.effect_id),
            static_details=story.detached_details(info.workflow_id, state.request_id),
            search_attributes=self._listing.child_kind(sa.KIND_DETACHED_EFFECT),
        )
