"""Human review of a request: its checkpoints, what a reviewer's decision must satisfy, and the wait.

A checkpoint lists the calls it approves exactly as they will run, and their digest. It is decided by the
``review`` update (validated before it is accepted) or the ``approve`` / ``reject`` signals; a message that
cannot decide it is kept in the record as ignored, never dropped. Who decided is established as the
pipeline's ``ReviewSettings.verification`` says (``workflows.review_proof``): a signed decision bound to the
checkpoint's calls, the identity the server received the message with, or a typed name. The requester may
not approve a request of their own unless the pipeline allows it. Expiry ends the request before any of
the checkpoint's calls runs; so does a rejection, unless the pipeline tells the model instead
(``ReviewSettings.on_reject``): then none of its calls runs, each is skipped with the rejection as its
result, and the request goes on. Workflow code only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import review_proof, story
    from . import search_attributes as sa
    from .listing import AWAITING_REVIEW, EXECUTING, StageListing
    from .models import (
        MAX_IGNORED_MESSAGES,
        ApprovalCall,
        ApprovalReason,
        Checkpoint,
        CheckpointStatus,
        IgnoredReview,
        LifecycleBoundary,
        Plan,
        RequestStatus,
    )
    from .notification import start_review_notification
    from .records import RecordKeeper
    from .run_state import RunState

# Stable error types of a review.
CHECKPOINT_REJECTED = "CheckpointRejected"
CHECKPOINT_EXPIRED = "CheckpointExpired"
INVALID_REVIEW = "InvalidReview"


@dataclass(frozen=True)
class ReviewMessage:
    """A decision as it arrived: through which message, what it decides, who it says decided, its proof,
    and the identity the server received it with (``workflows.callers``)."""

    via: str
    decision: Literal["approve", "reject"]
    checkpoint_id: str
    reviewer: str
    comment: str = ""
    declined: tuple[str, ...] = ()
    proof: str = ""
    caller: str | None = None


@dataclass(frozen=True)
class Reviewer:
    """Who may decide a checkpoint, and what proved it."""

    principal: str
    verified_by: str


class Reviews:
    """The checkpoints of one request (see the module docstring)."""

    def __init__(self, state: RunState, listing: StageListing, records: RecordKeeper) -> None:
        self._state = state
        self._listing = listing
        self._records = records

    def pending(self) -> list[Checkpoint]:
        """Every checkpoint waiting for a reviewer, oldest first."""
        return [c for c in self._state.record.checkpoints if c.status is CheckpointStatus.PENDING]

    def new(
        self,
        plan: Plan,
        reasons: list[ApprovalReason],
        *,
        calls: list[ApprovalCall] | None = None,
        step_id: str | None = None,
    ) -> Checkpoint:
        now = workflow.now()
        return Checkpoint(
            checkpoint_id=f"cp-{plan.phase}-{str(workflow.uuid4())[:8]}",
            phase=plan.phase,
            plan=plan,
            reasons=reasons,
            calls=calls or [],
            step_id=step_id,
            requested_at=now,
            expires_at=now + timedelta(seconds=self._state.manifest.review.checkpoint_expiry_seconds),
            calls_digest=review_proof.calls_digest(calls or [], plan),
        )

    async def wait(self, checkpoint: Checkpoint) -> None:
        """Open ``checkpoint`` and wait for its reviewer. Expiry fails the request before any of its calls
        runs; so does rejection, unless the pipeline tells the model (its calls are then skipped). Several step checkpoints of one phase may be open at once: the request is
        suspended until the last of them is decided."""
        state, listing = self._state, self._listing
        record = state.record
        now = checkpoint.requested_at
        record.checkpoints.append(checkpoint)
        record.status = RequestStatus.SUSPENDED
        self._enter_waiting(checkpoint)
        # Waiting costs the request nothing: its leases are renewed by their keepers from now on.
        with state.leases.waiting():
            listing.publish()
            if state.manifest.review.notify:  # without a reviewers' webhook a checkpoint adds no command
                await start_review_notification(
                    record,
                    state.detached_tokens,
                    state.manifest,
                    checkpoint,
                    state.input.request,
                    search_attributes=listing.child_kind(sa.KIND_REVIEW_NOTIFICATION),
                )
            await self._records.persist(LifecycleBoundary.CHECKPOINT_OPENED)
            try:
                await workflow.wait_condition(
                    lambda: checkpoint.status is not CheckpointStatus.PENDING,
                    timeout=checkpoint.expires_at - now,
                    timeout_summary=story.checkpoint_timer_summary(
                        checkpoint,
                        state.manifest.review.reviewers,
                        state.approval_required_by,
                        with_text=state.manifest.ui_shows_text,
                    ),
                )
            except asyncio.TimeoutError:
                checkpoint.status = CheckpointStatus.EXPIRED
                checkpoint.decided_at = workflow.now()
        still_open = self.pending()
        if still_open:
            self._enter_waiting(still_open[0])
        else:
            record.status = RequestStatus.RUNNING
            if checkpoint.step_id is not None:
                listing.enter(EXECUTING)
        details = {
            "checkpoint_id": checkpoint.checkpoint_id,
            "phase": checkpoint.phase,
            "reviewer": checkpoint.reviewer,
            "reason": checkpoint.comment,
        }
        if checkpoint.status is CheckpointStatus.REJECTED and state.manifest.review.on_reject != "tell_model":
            raise ApplicationError(
                f"checkpoint {checkpoint.checkpoint_id} rejected by {checkpoint.reviewer}: {checkpoint.comment}",
                details,
                type=CHECKPOINT_REJECTED,
                non_retryable=True,
            )
        if checkpoint.status is CheckpointStatus.EXPIRED:
            raise ApplicationError(
                f"checkpoint {checkpoint.checkpoint_id} expired at {checkpoint.expires_at.isoformat()} without a decision",
                {**details, "expires_at": checkpoint.expires_at.isoformat()},
                type=CHECKPOINT_EXPIRED,
                non_retryable=True,
            )

    def _enter_waiting(self, checkpoint: Checkpoint) -> None:
        """The request waits for ``checkpoint``'s reviewer: its current details say for what, why, for
        whom and how to decide it."""
        state = self._state
        self._listing.enter(
            AWAITING_REVIEW,
            detail=f"checkpoint {checkpoint.checkpoint_id}",
            more=story.checkpoint_lines(
                checkpoint,
                workflow.info().workflow_id,
                state.manifest.review.reviewers,
                state.approval_required_by,
                with_text=state.manifest.ui_shows_text,
            ),
        )

    def check(self, message: ReviewMessage) -> Reviewer | str:
        """Who decides ``message``'s checkpoint, or why the message cannot decide it now (one line)."""
        checkpoint_id, decision, declined = message.checkpoint_id, message.decision, message.declined
        if not checkpoint_id:
            return "checkpoint_id is required"
        checkpoint = next((c for c in self._state.record.checkpoints if c.checkpoint_id == checkpoint_id), None)
        if checkpoint is None:
            return f"unknown checkpoint {checkpoint_id!r}"
        if checkpoint.status is not CheckpointStatus.PENDING:
            return f"checkpoint {checkpoint_id!r} is already {checkpoint.status.value}"
        if workflow.now() >= checkpoint.expires_at:
            return f"checkpoint {checkpoint_id!r} has expired"
        if declined:
            if decision != "approve":
                return "only an approval may decline calls (a rejection refuses them all)"
            calls = [c.step_id for c in checkpoint.calls] or [r.step_id for r in checkpoint.reasons]
            unknown = [step for step in declined if step not in calls]
            if unknown:
                return f"checkpoint {checkpoint_id!r} has no call {unknown[0]!r} to decline (its calls: {', '.join(calls)})"
        reviewer = self._reviewer(message, checkpoint)
        if isinstance(reviewer, str):
            return reviewer
        review = self._state.manifest.review
        if review.reviewers and reviewer.principal not in review.reviewers:
            return f"reviewer {reviewer.principal!r} may not review this pipeline's checkpoints"
        if decision == "approve" and not review.allow_self_approval and reviewer.principal in self._requesters():
            return f"{reviewer.principal!r} requested this request and may not approve it (a second person must)"
        return reviewer

    def _reviewer(self, message: ReviewMessage, checkpoint: Checkpoint) -> Reviewer | str:
        """The reviewer the message proves, as the pipeline verifies reviewers."""
        review = self._state.manifest.review
        named = message.reviewer.strip()
        if review.verification == "server_identity":
            caller = (message.caller or "").strip()
            if not caller:
                return (
                    "this pipeline takes the reviewer from the server's identity, and the message arrived without one"
                )
            if named and named != caller:
                return f"the message names reviewer {named!r} but was sent as {caller!r}"
            return Reviewer(caller, "server identity")
        if review.verification == "signed":
            if not message.proof:
                return (
                    "this pipeline verifies reviewers: a decision must be signed "
                    "(agent-lifecycle approve/reject with AGENT_REVIEWER_KEY, or a token from a trusted issuer)"
                )
            expected = review_proof.decision_claims(
                workflow_id=workflow.info().workflow_id,
                checkpoint_id=checkpoint.checkpoint_id,
                calls=checkpoint.calls_digest or review_proof.calls_digest(checkpoint.calls, checkpoint.plan),
                decision=message.decision,
                declined=message.declined,
                comment=message.comment,
            )
            # The crypto library imports parts of itself as it first uses them: not workflow code, so not
            # re-imported in the sandbox.
            with workflow.unsafe.imports_passed_through():
                verified = review_proof.verify_decision(message.proof, review.keys, expected, workflow.now())
            if isinstance(verified, str):
                return verified
            if named and named != verified.principal:
                return f"the message names reviewer {named!r} but its proof is {verified.principal!r}'s"
            return Reviewer(verified.principal, verified.verified_by)
        if not named:
            return "reviewer is required"
        return Reviewer(named, "unverified name")

    def _requesters(self) -> set[str]:
        """The principals the request was made for: ``requested_by``, and its metadata's ``user_id``."""
        input = self._state.input
        user = input.metadata.get("user_id")
        return {p for p in (input.requested_by, user if isinstance(user, str) else None) if p}

    def decide(self, message: ReviewMessage) -> Reviewer | None:
        """Decide a checkpoint (an approval may decline some of its calls), or keep why the message could
        not as ignored. Returns who decided (None when the message was ignored)."""
        reviewer = self.check(message)
        if isinstance(reviewer, str):
            self.ignore(message.via, message.checkpoint_id, message.reviewer, reviewer, message.caller)
            return None
        checkpoint = next(c for c in self._state.record.checkpoints if c.checkpoint_id == message.checkpoint_id)
        approved = message.decision == "approve"
        checkpoint.status = CheckpointStatus.APPROVED if approved else CheckpointStatus.REJECTED
        checkpoint.reviewer = reviewer.principal
        checkpoint.verified_by = reviewer.verified_by
        checkpoint.comment = message.comment
        checkpoint.declined = list(dict.fromkeys(message.declined))
        checkpoint.decided_at = workflow.now()
        return reviewer

    def ignore(self, via: str, checkpoint_id: str, reviewer: str, reason: str, sent_as: str | None = None) -> None:
        """A message that changes nothing is kept so an operator can see what was tried: clipped, and up
        to a bound, beyond which it is only counted (the record must always fit in one payload)."""
        record = self._state.record
        if len(record.ignored_reviews) < MAX_IGNORED_MESSAGES:
            record.ignored_reviews.append(
                IgnoredReview.clipped(workflow.now(), via, checkpoint_id, reviewer, reason, sent_as)
            )
        else:
            record.ignored_dropped += 1
