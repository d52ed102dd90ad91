"""``ReviewNotification``: the child workflow that tells the reviewers' webhook a checkpoint opened.

A request whose pipeline has a reviewers' webhook (``ReviewSettings.notify``) records the notification
as a pending effect ``review_notification:<checkpoint id>`` when a checkpoint opens, and starts this
child with id ``<request workflow id>/review/<checkpoint id>`` and ``ParentClosePolicy.ABANDON``: the
request waits for its reviewer, not for the webhook, and the delivery goes on after the request ended
(approved, rejected, expired or cancelled). The child delivers in the activity ``notify_reviewers``,
retried with backoff; then it reports the effect as ``succeeded`` or ``failed`` the way a detached hook
effect is reported (signal to the request, merge into the stored record), and a failed delivery fails
the child with the delivery's own error type. Without a webhook a checkpoint starts nothing.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import dispatch, story
    from .converter import Shown
    from .detached import report_effect, start_effect_child
    from .effects import elapsed_ms, record_effects
    from .models import (
        Checkpoint,
        EffectStatus,
        ExecutionRecord,
        PipelineHookEffect,
        PipelineManifest,
        ReviewNotificationInput,
        ReviewNotificationResult,
    )
    from .names import REVIEW_NOTIFICATION_WORKFLOW_TYPE

NOTIFY_REVIEWERS_ACTIVITY = "notify_reviewers"
REVIEW_NOTIFICATION_EFFECT = "review_notification"
# What the child passes on of the request: the activity masks secrets and cuts it to a short excerpt.
REQUEST_CHARS_FOR_EXCERPT = 4_000
# Delivery attempts: 1 s, 2 s, 4 s … apart, at most a minute, this many in all.
RETRY_INITIAL_INTERVAL = timedelta(seconds=1)
RETRY_MAXIMUM_INTERVAL = timedelta(seconds=60)


def review_notification_workflow_id(request_workflow_id: str, checkpoint_id: str) -> str:
    return f"{request_workflow_id}/review/{checkpoint_id}"


def review_notification_effect_id(checkpoint_id: str) -> str:
    return f"{REVIEW_NOTIFICATION_EFFECT}:{checkpoint_id}"


async def start_review_notification(
    record: ExecutionRecord,
    tokens: dict[str, str],
    manifest: PipelineManifest,
    checkpoint: Checkpoint,
    request: str,
    *,
    search_attributes: TypedSearchAttributes | None = None,
) -> None:
    """Record the pending notification effect of ``checkpoint`` and start the child that delivers it
    (``tokens`` is the request's effect id → update token map; ``search_attributes`` the child's kind).
    A child that cannot start leaves the effect failed; the checkpoint waits for its reviewer either way."""
    info = workflow.info()
    effect = PipelineHookEffect(
        effect_id=review_notification_effect_id(checkpoint.checkpoint_id),
        name="Reviewer notification",
        status=EffectStatus.PENDING,
        started_at=workflow.now(),
        summary=Shown(f"checkpoint {checkpoint.checkpoint_id} announced to the reviewers' webhook"),
    )
    record_effects(record, [effect])
    settings = manifest.settings
    await start_effect_child(
        record,
        tokens,
        effect,
        lambda token: ReviewNotificationInput(
            parent_workflow_id=info.workflow_id,
            parent_run_id=info.run_id,
            request_id=record.request_id,
            request=request[:REQUEST_CHARS_FOR_EXCERPT],
            checkpoint=checkpoint,
            reviewers=manifest.review.reviewers,
            effect=effect,
            update_token=token,
            heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
            max_worker_losses=settings.max_worker_losses,
        ),
        workflow_type=REVIEW_NOTIFICATION_WORKFLOW_TYPE,
        id=review_notification_workflow_id(info.workflow_id, checkpoint.checkpoint_id),
        what="the notification",
        static_summary=Shown(f"review notification · {checkpoint.checkpoint_id}"),
        static_details=story.review_notification_details(info.workflow_id, record.request_id, checkpoint.checkpoint_id),
        search_attributes=search_attributes,
    )


@workflow.defn(name=REVIEW_NOTIFICATION_WORKFLOW_TYPE)
class ReviewNotificationWorkflow:
    @workflow.run
    async def run(self, input: ReviewNotificationInput) -> PipelineHookEffect:
        effect = input.effect.model_copy(deep=True)
        ceiling = timedelta(seconds=input.heartbeat_timeout_seconds)
        failure: ApplicationError | None = None
        try:
            result = await dispatch.execute(
                NOTIFY_REVIEWERS_ACTIVITY,
                input,
                result_type=ReviewNotificationResult,
                start_to_close_timeout=timedelta(seconds=input.timeout_seconds),
                retry_policy=RetryPolicy(
                    initial_interval=RETRY_INITIAL_INTERVAL,
                    backoff_coefficient=2.0,
                    maximum_interval=RETRY_MAXIMUM_INTERVAL,
                    maximum_attempts=input.max_attempts,
                ),
                summary=Shown(f"notify reviewers · {input.checkpoint.checkpoint_id}"),
                heartbeat_ceiling=ceiling,
                max_worker_losses=input.max_worker_losses,
            )
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) else err
            kind = cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__
            message = getattr(cause, "message", None) or str(cause)
            effect.status = EffectStatus.FAILED
            effect.error = f"{kind}: {message}"
            effect.summary = "the reviewers' webhook was not told"
            failure = ApplicationError(message, {"effect_id": effect.effect_id}, type=kind, non_retryable=True)
        else:
            effect.status = EffectStatus.SUCCEEDED
            effect.data = {"http_status": result.http_status, "attempts": result.attempt}
            effect.summary = f"the reviewers' webhook answered {result.http_status}"
        if effect.started_at is not None:
            effect.duration_ms = elapsed_ms(effect.started_at)
        await report_effect(input, effect)
        if failure is not None:
            raise failure
        return effect
