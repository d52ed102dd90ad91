"""``DetachedEffect``: the child workflow that carries one detached hook effect to its terminal state.

Started by ``RequestLifecycle`` with id ``<request workflow id>/effect/<effect id>`` and
``ParentClosePolicy.ABANDON``, so it outlives the request. It runs the hook's detached work as an
activity, then reports the same effect id as ``succeeded`` or ``failed``: to the request while it still
runs (signal ``effect_update``, carrying the token the request issued for this effect, so no other sender
can pass for it) and to the execution store either way — one effect that changes status, never a second
one. Its activities heartbeat; a lost worker dispatches them again without spending their attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from . import dispatch, story
    from .converter import Shown
    from .effects import elapsed_ms, record_effects
    from .models import (
        DetachedEffectInput,
        DetachedWorkResult,
        EffectStatus,
        EffectUpdateInput,
        EffectUpdateSignal,
        ExecutionRecord,
        PersistRecordOutput,
        PipelineHookEffect,
        bounded_value,
    )
    from .names import DETACHED_WORKFLOW_TYPE

EFFECT_UPDATE_SIGNAL = "effect_update"


def detached_workflow_id(request_workflow_id: str, effect_id: str) -> str:
    return f"{request_workflow_id}/effect/{effect_id}"


async def start_effect_child(
    record: ExecutionRecord,
    tokens: dict[str, str],
    effect: PipelineHookEffect,
    child_input: Callable[[str], Any],
    *,
    workflow_type: str,
    id: str,
    what: str,
    **options: Any,
) -> None:
    """Start the child that carries ``effect`` (announced pending in ``record``) to its terminal state:
    abandoned by the request, so it outlives it. ``child_input(token)`` is the child's input; the token is
    registered in ``tokens`` (effect id → token) before the start, since the child may report within the
    same workflow task. A child that cannot start — ``what`` names it — leaves the effect failed."""
    token = workflow.uuid4().hex
    tokens[effect.effect_id] = token
    try:
        await workflow.start_child_workflow(
            workflow_type,
            child_input(token),
            id=id,
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            **options,
        )
    except FailureError as err:  # e.g. an effect id this request already used
        failed = {
            "status": EffectStatus.FAILED,
            "error": f"could not start {what}: {err}",
            "summary": "submission failed",
        }
        record_effects(record, [effect.model_copy(update=failed)])
        del tokens[effect.effect_id]


def accept_effect_update(record: ExecutionRecord, tokens: dict[str, str], update: EffectUpdateSignal) -> str | None:
    """Take a detached effect's terminal state, as its ``DetachedEffect`` child reports it, into ``record``.
    Only the child the request started for that effect knows its token: any other update changes nothing,
    and the problem is returned for the request to keep as ignored. The child reports what its work
    observed; which hook and stage the effect belongs to stays as announced."""
    effect = update.effect
    expected = tokens.get(effect.effect_id)
    announced = record.effect(effect.effect_id)
    if expected is None or announced is None:
        return "this request handed no detached work to that effect"
    if update.token != expected:
        return "the update does not come from the effect's own DetachedEffect child"
    if effect.status is EffectStatus.PENDING:
        return "an effect update must bring the effect to a terminal state"
    if announced.status is EffectStatus.PENDING:
        fields = {"hook": announced.hook, "stage": announced.stage, "data": bounded_value(effect.data)}
        record_effects(record, [effect.model_copy(update=fields)])
    return None


@workflow.defn(name=DETACHED_WORKFLOW_TYPE)
class DetachedEffectWorkflow:
    @workflow.run
    async def run(self, input: DetachedEffectInput) -> PipelineHookEffect:
        work = input.work
        effect = input.effect.model_copy(deep=True)
        ceiling = timedelta(seconds=input.heartbeat_timeout_seconds)
        about = f"**detached effect:** {story.excerpt(work.hook, 200)} · {story.excerpt(work.effect_id, 200)}"
        workflow.set_current_details(f"{about}\n\n**stage:** running the detached work")
        try:
            result = await dispatch.execute(
                "run_detached_work",
                input,
                result_type=DetachedWorkResult,
                start_to_close_timeout=timedelta(seconds=input.timeout_seconds),
                retry_policy=RetryPolicy(maximum_attempts=input.max_attempts),
                summary=Shown(f"detached · {work.hook} · {work.effect_id}"),
                heartbeat_ceiling=ceiling,
                max_worker_losses=input.max_worker_losses,
            )
        except (ActivityError, ApplicationError) as err:
            effect.status = EffectStatus.FAILED
            cause = getattr(err, "cause", None)
            effect.error = getattr(cause, "message", None) or getattr(err, "message", None) or str(cause or err)
            effect.summary = "detached work failed"
        else:
            effect.status = EffectStatus.SUCCEEDED
            if result.data is not None:
                effect.data = result.data
            effect.summary = result.summary or "detached work completed"
        if effect.started_at is not None:
            effect.duration_ms = elapsed_ms(effect.started_at)
        outcome = effect.status.value + (f": {effect.error}" if effect.error else "")
        if not input.ui_shows_text:  # the error a detached work failed with may quote what it was given
            outcome = effect.status.value
        workflow.set_current_details(f"{about}\n\n**stage:** reporting\n\n**outcome:** {story.excerpt(outcome)}")

        await report_effect(input, effect)
        return effect


class ReportsToParent(Protocol):
    """What a child that reports an effect knows of its request: who it is, the token its updates carry,
    and the heartbeat and worker-loss limits of its activities."""

    parent_workflow_id: str
    parent_run_id: str
    update_token: str
    heartbeat_timeout_seconds: float
    max_worker_losses: int


async def report_effect(input: ReportsToParent, effect: PipelineHookEffect) -> None:
    """Bring a terminal effect to its request: by signal while the request runs, and into the stored
    record either way (a request that has finished no longer takes signals)."""
    parent_workflow_id, parent_run_id = input.parent_workflow_id, input.parent_run_id
    parent = workflow.get_external_workflow_handle(parent_workflow_id, run_id=parent_run_id)
    try:
        await parent.signal(EFFECT_UPDATE_SIGNAL, EffectUpdateSignal(effect=effect, token=input.update_token))
    except FailureError:
        pass  # the request has finished; the store below is where its record lives now
    await dispatch.execute(
        "merge_effect_update",
        EffectUpdateInput(workflow_id=parent_workflow_id, run_id=parent_run_id, effect=effect),
        result_type=PersistRecordOutput,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=10),
        summary=Shown(f"merge effect · {effect.effect_id}"),
        heartbeat_ceiling=timedelta(seconds=input.heartbeat_timeout_seconds),
        max_worker_losses=input.max_worker_losses,
    )
