"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():
    from pydantic import JsonValue

    from . import decisions, patches, story
    from . import search_attributes as sa
    from .detached import EFFECT_UPDATE_SIGNAL
    from .effects import record_effects
    from .invocation import AWAITING_REVIEW_STAGE, RunStopped, error_text, raise_if_cancelled
    from .leases import ManagedLeases
    from .models import (
        ANSWER_TOPIC,
        MAX_IGNORED_MESSAGES,
        MAX_INBOUND_PAYLOAD_BYTES,
        MAX_RECORDED_PROMPT_CHARS,
        METADATA_MAX_MODEL_TOKENS,
        AcceptedPlan,
        AfterAnswerCall,
        AfterAnswerOutcome,
        AfterExecutionCall,
        AfterPlanningCall,
        AfterPlanningOutcome,
        AfterSynthesisCall,
        AfterSynthesisOutcome,
        AnswerChunk,
        AnswerView,
        ApprovalCall,
        ApprovalReason,
        ApproveSignal,
        BeforePlanningCall,
        BeforePlanningOutcome,
        BeforeRememberCall,
        BeforeRememberOutcome,
        BeforeRunCall,
        BeforeRunOutcome,
        CacheVerdict,
        Checkpoint,
        CheckpointStatus,
        DecisionAction,
        Diagnostic,
        EffectStatus,
        EffectUpdateSignal,
        ExecutionRecord,
        ExecutionResult,
        GateState,
        HookDecision,
        HookEntry,
        IgnoredReview,
        LifecycleBoundary,
        MemoryCandidate,
        MemoryOutcome,
        ModelCall,
        ModelDraft,
        OnErrorCall,
        OnFinishCall,
        PersistRecordInput,
        PersistRecordOutput,
        PipelineManifest,
        Plan,
        PlanInput,
        PlanOutput,
        RecordLifecycle,
        RejectSignal,
        RememberInput,
        RequestError,
        RequestInput,
        RequestResult,
        RequestStatus,
        ResolvePipelineInput,
        ReviewAck,
        ReviewRequest,
        RunErrorView,
        RunOutcomeView,
        RunView,
        ShortCircuitInfo,
        ShortCircuitProposal,
        Stage,
        StepResult,
        StepSummary,
        StopInfo,
        SynthesizeInput,
        SynthesizeOutput,
        bounded_value,
    )
    from .notification import start_review_notification
    from .steps import WORKFLOW_TYPE, StepExecution
    from .support import (
        activity_error_details,
        approval_reasons,
        cache_verdict,
        decode_payload,
        promote_metadata,
        stage_failure,
    )

CHECKPOINT_REJECTED = "CheckpointRejected"
CHECKPOINT_EXPIRED = "CheckpointExpired"
INVALID_REVIEW = "InvalidReview"
INVALID_QUERY = "InvalidQuery"
SignalT = TypeVar("SignalT", ApproveSignal, RejectSignal, EffectUpdateSignal)


@workflow.defn(name=WORKFLOW_TYPE)
class RequestLifecycleWorkflow(StepExecution):
    """One agent request: before_planning → (plan → after_planning → [checkpoint] → execute) per phase →
    after_execution → synthesize → after_synthesis, each hook invocation its own activity."""

    # Every entry point takes its arguments untyped and decodes them itself: no payload, several
    # payloads, another encoding or the wrong fields end in a typed failure (the input, an update, a
    # query) or an ignore kept in the record (a signal), never in a workflow task that fails forever.

    @workflow.init
    def __init__(self, *args: Any) -> None:
        info = workflow.info()
        input, self._input_problem = decode_payload(RequestInput, args)
        self._input = input or RequestInput.model_construct(request="", metadata={}, request_id=None)
        self._request_id = self._input.request_id or info.workflow_id
        self._manifest = PipelineManifest(pipeline="unresolved")
        self._enrichments: dict[str, JsonValue] = {}
        self._gate = GateState()
        self._results: dict[str, StepResult] = {}
        self._needs_approval, self._prepared, self._approved = {}, {}, {}
        self._executing = Plan()
        self._behaviour = patches.Behaviour()
        self._phase = 1
        self._ask = self._input.request
        self._instructions = ""
        self._facts: dict[str, JsonValue] = {}
        self._hook_state: dict[str, dict[str, JsonValue]] = {}
        self._leases = ManagedLeases(self._request_id, info.workflow_id)
        self._detached_tokens: dict[str, str] = {}  # effect id -> the token its DetachedEffect child sends back
        self._synthesized: str | None = None  # the answer after after_synthesis (what a cache may store)
        # A request that asked to stream its answer has a durable stream (its handlers are registered
        # here, before the first activation's signals and updates): the answer's chunks, then its final text.
        self._stream = WorkflowStream() if self._input.stream_answer else None
        self._record = ExecutionRecord(
            request_id=self._request_id,
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            request=self._input.request,
            metadata=self._input.metadata,
            started_at=workflow.now(),
        )

    # ------------------------------------------------------------------------------------------------
    # Queries, signals, updates
    # ------------------------------------------------------------------------------------------------

    @workflow.query(name="execution_record")
    def execution_record(self, *args: Any) -> ExecutionRecord:
        """The execution record as it stands: every invocation, decision and effect so far."""
        _no_arguments("execution_record", args)
        return self._record

    @workflow.query(name="pending_checkpoint")
    def pending_checkpoint(self, *args: Any) -> Checkpoint | None:
        """The checkpoint waiting for a reviewer (the oldest, when several steps wait), or null."""
        _no_arguments("pending_checkpoint", args)
        return next((c for c in self._record.checkpoints if c.status is CheckpointStatus.PENDING), None)

    @workflow.query(name="pending_checkpoints")
    def pending_checkpoints(self, *args: Any) -> list[Checkpoint]:
        """Every checkpoint waiting for a reviewer, oldest first."""
        _no_arguments("pending_checkpoints", args)
        return [c for c in self._record.checkpoints if c.status is CheckpointStatus.PENDING]

    @workflow.signal(name="approve")
    def approve(self, *args: Any) -> None:
        """Approve the open checkpoint: ``{"checkpoint_id", "reviewer", "comment"}``."""
        signal = self._inbound("approve", ApproveSignal, args)
        if signal is not None:
            self._decide("approve", "approve", signal.checkpoint_id, signal.reviewer, signal.comment)

    @workflow.signal(name="reject")
    def reject(self, *args: Any) -> None:
        """Reject the open checkpoint: ``{"checkpoint_id", "reviewer", "reason"}``."""
        signal = self._inbound("reject", RejectSignal, args)
        if signal is not None:
            self._decide("reject", "reject", signal.checkpoint_id, signal.reviewer, signal.reason)

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal this workflow does not define: kept as ignored, so the sender can see it arrived."""
        self._ignore(name, "", "", f"no signal named {name!r} ({len(args)} payload(s))")

    def _inbound(self, via: str, model: type[SignalT], args: Sequence[Any]) -> SignalT | None:
        """A signal's payload as ``model``, or None after recording it as ignored (never dropped silently)."""
        signal, problem = decode_payload(model, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
        if problem is not None:
            fields = args[0] if len(args) == 1 and isinstance(args[0], dict) else {}
            self._ignore(
                via,
                str(fields.get("checkpoint_id", ""))[:200],
                str(fields.get("reviewer", ""))[:200],
                f"malformed {via} signal: {problem}",
            )
        return signal

    @workflow.update(name="review")
    def review(self, *args: Any) -> ReviewAck:
        """Approve or reject with an acknowledgement; refused before it is accepted if invalid."""
        request = self._review_request(args)
        self._decide("review", request.decision, request.checkpoint_id, request.reviewer, request.comment)
        return ReviewAck(
            checkpoint_id=request.checkpoint_id,
            decision=request.decision,
            reviewer=request.reviewer,
            accepted_at=workflow.now(),
        )

    @review.validator
    def _validate_review(self, *args: Any) -> None:
        request = self._review_request(args)
        problem = self._review_problem(request.checkpoint_id, request.reviewer)
        if problem:
            raise ApplicationError(problem, type=INVALID_REVIEW, non_retryable=True)

    @staticmethod
    def _review_request(args: Sequence[Any]) -> ReviewRequest:
        request, problem = decode_payload(ReviewRequest, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
        if request is None:
            raise ApplicationError(f"malformed review: {problem}", type=INVALID_REVIEW, non_retryable=True)
        return request

    @workflow.signal(name=EFFECT_UPDATE_SIGNAL)
    def effect_update(self, *args: Any) -> None:
        """A detached effect reached its terminal state (sent by its ``DetachedEffect`` child). Only the
        child this request started for that effect knows its token: any other update is ignored."""
        update = self._inbound(EFFECT_UPDATE_SIGNAL, EffectUpdateSignal, args)
        if update is None:
            return
        effect = update.effect
        expected = self._detached_tokens.get(effect.effect_id)
        announced = self._record.effect(effect.effect_id)
        problem = None
        if expected is None or announced is None:
            problem = "this request handed no detached work to that effect"
        elif update.token != expected:
            problem = "the update does not come from the effect's own DetachedEffect child"
        elif effect.status is EffectStatus.PENDING:
            problem = "an effect update must bring the effect to a terminal state"
        if problem is not None:
            self._ignore(EFFECT_UPDATE_SIGNAL, effect.effect_id, "", problem)
            return
        if announced is not None and announced.status is EffectStatus.PENDING:
            # The child reports what its work observed; which hook and stage it belongs to stays as announced.
            update = {"hook": announced.hook, "stage": announced.stage, "data": bounded_value(effect.data)}
            record_effects(self._record, [effect.model_copy(update=update)])

    def _review_problem(self, checkpoint_id: str, reviewer: str) -> str | None:
        if not checkpoint_id:
            return "checkpoint_id is required"
        if not reviewer.strip():
            return "reviewer is required"
        checkpoint = next((c for c in self._record.checkpoints if c.checkpoint_id == checkpoint_id), None)
        if checkpoint is None:
            return f"unknown checkpoint {checkpoint_id!r}"
        if checkpoint.status is not CheckpointStatus.PENDING:
            return f"checkpoint {checkpoint_id!r} is already {checkpoint.status.value}"
        allowed = self._manifest.review.reviewers
        if allowed and reviewer not in allowed:
            return f"reviewer {reviewer!r} may not review this pipeline's checkpoints"
        if workflow.now() >= checkpoint.expires_at:
            return f"checkpoint {checkpoint_id!r} has expired"
        return None

    def _ignore(self, via: str, checkpoint_id: str, reviewer: str, reason: str) -> None:
        """A message that changes nothing is kept so an operator can see what was tried: clipped, and up
        to a bound, beyond which it is only counted (the record must always fit in one payload)."""
        if len(self._record.ignored_reviews) < MAX_IGNORED_MESSAGES:
            self._record.ignored_reviews.append(
                IgnoredReview.clipped(workflow.now(), via, checkpoint_id, reviewer, reason)
            )
        else:
            self._record.ignored_dropped += 1

    def _decide(
        self,
        via: str,
        decision: Literal["approve", "reject"],
        checkpoint_id: str,
        reviewer: str,
        comment: str,
    ) -> None:
        problem = self._review_problem(checkpoint_id, reviewer)
        if problem:
            self._ignore(via, checkpoint_id, reviewer, problem)
            return
        checkpoint = next(c for c in self._record.checkpoints if c.checkpoint_id == checkpoint_id)
        checkpoint.status = CheckpointStatus.APPROVED if decision == "approve" else CheckpointStatus.REJECTED
        checkpoint.reviewer = reviewer
        checkpoint.comment = comment
        checkpoint.decided_at = workflow.now()

    # ------------------------------------------------------------------------------------------------
    # The lifecycle
    # ------------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> RequestResult:
        if self._input_problem is not None:
            # Refused before anything runs or is stored: the record (by query) says why.
            self._record.status = RequestStatus.FAILED
            self._record.error = RequestError(type=decisions.INVALID_REQUEST, message=self._input_problem)
            self._record.lifecycle_stage = str(RequestStatus.FAILED)
            headline = story.failure_headline(decisions.INVALID_REQUEST, self._input_problem)
            workflow.set_current_details(
                story.current_details("(no valid request)", stage=str(RequestStatus.FAILED), outcome=headline)
            )
            raise ApplicationError(self._input_problem, type=decisions.INVALID_REQUEST, non_retryable=True)
        self._behaviour = behaviour = patches.detect()
        self._local_bookkeeping, self._hook_batches = behaviour.local_bookkeeping, behaviour.hook_batches
        self._stage_upserts = behaviour.stage_upserts
        self._leases.by_timer = behaviour.lease_renewal_by_timer
        try:
            result = await self._lifecycle()
        except RunStopped as stop:
            result = self._stopped_result(stop)
            self._publish_final_answer(stop.text)
            await self._finalize_and_finish(RequestStatus.STOPPED, "stopped", response=stop.text)
            result.diagnostics = list(self._record.diagnostics)
            return result
        except ApplicationError as err:
            details = err.details[0] if err.details and isinstance(err.details[0], dict) else {}
            error = RequestError(type=err.type or "ApplicationError", message=err.message, details=details)
            await self._finalize_and_finish(RequestStatus.FAILED, "error", error=error)
            raise
        except asyncio.CancelledError:
            error = RequestError(type="Cancelled", message="the request was cancelled")
            await self._finalize_and_finish(RequestStatus.CANCELLED, "cancelled", error=error)
            raise
        except FailureError as err:  # any other Temporal failure still ends the request: clean up first
            if isinstance(err, CancelledError):
                error = RequestError(type="Cancelled", message="the request was cancelled")
                await self._finalize_and_finish(RequestStatus.CANCELLED, "cancelled", error=error)
            else:
                error = RequestError(type=type(err).__name__, message=str(err))
                await self._finalize_and_finish(RequestStatus.FAILED, "error", error=error)
            raise
        self._publish_final_answer(result.response)
        await self._finalize_and_finish(RequestStatus.SUCCEEDED, "completed", response=result.response)
        result.diagnostics = list(self._record.diagnostics)
        return result

    def _publish_final_answer(self, text: str) -> None:
        """The answer a client receives, last on the answer stream of a request that asked to stream."""
        if self._stream is not None:
            self._stream.topic(ANSWER_TOPIC, type=AnswerChunk).publish(AnswerChunk(text=text, final=True))

    async def _finalize_and_finish(
        self,
        status: RequestStatus,
        outcome: Literal["completed", "stopped", "error", "cancelled"],
        *,
        response: str | None = None,
        error: RequestError | None = None,
    ) -> None:
        """Managed-lease cleanup (renewal joined first), finalizers, then the terminal record — which is
        written whatever happens to the cleanup and the finalizers."""
        try:
            await self._release_leases(outcome)
            cache = cache_verdict(self._record, self._manifest.tools, outcome, self._synthesized)
            self._record.cache = cache.model_copy(update={"response": None})
            await self._finalize(
                outcome, response=response, error=self._error_view(error) if error else None, cache=cache
            )
        finally:
            await self._finish(status, error)

    async def _lifecycle(self) -> RequestResult:
        await self._resolve_pipeline()
        await self._before_run()
        self._enrichments = promote_metadata(self._input.metadata)
        self._record.promoted_enrichments = sorted(self._enrichments)
        self._record.enrichments = dict(self._enrichments)

        result = await self._before_planning()
        if result is None:
            plan = await self._run_phases()
            execution = ExecutionResult(steps=list(self._record.steps))
            await self._after_execution(execution)
            synthesis = await self._synthesize(plan, execution)
            response = await self._after_synthesis(synthesis.response)
            self._synthesized = response
            self._record.confidence = synthesis.confidence
            result = RequestResult(
                request_id=self._request_id,
                workflow_id=self._record.workflow_id,
                response=response,
                confidence=synthesis.confidence,
                metadata={"pipeline": self._manifest.pipeline, "planner": self._record.planner},
                steps=[StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in execution.steps],
            )
        handled_by = "short_circuit" if result.short_circuit else "pipeline"
        result.response = await self._after_answer(result.response, handled_by, result.steps)
        self._record.final_response = result.response
        await self._remember(result.response)
        return result

    async def _before_run(self) -> None:
        """Rewrite the ask, instructions or facts (facts merge, later values win), or stop the run."""
        stage = Stage.BEFORE_RUN
        self._set_stage(stage)

        def make(hook: HookEntry) -> BeforeRunCall:
            run = RunView(ask=self._ask, instructions=self._instructions, facts=self._facts)
            return BeforeRunCall(hook=hook, view=self._view(hook), run=run)

        def apply(hook: HookEntry, outcome: BeforeRunOutcome) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, stage.value, outcome.stop.reason, outcome.stop.text)
            patch = outcome.patch
            if patch is not None:
                self._ask = patch.ask if patch.ask is not None else self._ask
                if patch.instructions is not None:
                    self._instructions = patch.instructions
                self._facts = {**self._facts, **(patch.facts or {})}
                self._record.ask = self._ask if self._ask != self._input.request else None
                self._record.instructions = self._instructions
                self._record.facts = dict(self._facts)

        await self._run_stage(stage, make, apply)

    async def _after_answer(
        self, text: str, handled_by: Literal["pipeline", "short_circuit"], steps: list[StepSummary]
    ) -> str:
        """Rewrite the final answer (chained) or stop."""
        stage = Stage.AFTER_ANSWER
        self._set_stage(stage)
        current = text

        def make(hook: HookEntry) -> AfterAnswerCall:
            answer = AnswerView(text=current, handled_by=handled_by, steps=steps)
            return AfterAnswerCall(hook=hook, view=self._view(hook), answer=answer)

        def apply(hook: HookEntry, outcome: AfterAnswerOutcome) -> None:
            nonlocal current
            if outcome.stop is not None:
                raise RunStopped(hook.name, stage.value, outcome.stop.reason, outcome.stop.text)
            current = outcome.text

        await self._run_stage(stage, make, apply)
        return current

    async def _remember(self, answer: str) -> None:
        """Offer the exchange to before_remember hooks, then save it to conversation memory. A failed
        save keeps the completed answer and is recorded as a diagnostic."""
        if not self._manifest.memory:
            return
        self._set_stage("remembering")
        conversation = self._input.metadata.get("conversation_id")
        candidate = MemoryCandidate(
            conversation_id=conversation if isinstance(conversation, str) and conversation else self._request_id,
            request=self._ask,
            answer=answer,
            facts=self._facts,
        )
        replaced_by = None

        def make(hook: HookEntry) -> BeforeRememberCall:
            return BeforeRememberCall(hook=hook, view=self._view(hook), candidate=candidate)

        def apply(hook: HookEntry, outcome: BeforeRememberOutcome) -> bool | None:
            nonlocal candidate, replaced_by
            if outcome.skip is not None:
                self._record.memory = MemoryOutcome(
                    action="skipped",
                    conversation_id=candidate.conversation_id,
                    by=hook.name,
                    reason=outcome.skip.reason,
                )
                return True
            if outcome.candidate != candidate:
                candidate, replaced_by = outcome.candidate, hook.name
            return None

        if await self._run_stage(Stage.BEFORE_REMEMBER, make, apply):
            return
        try:
            saved = await self._activity(
                "remember",
                RememberInput(request_id=self._request_id, workflow_id=self._record.workflow_id, candidate=candidate),
                result_type=MemoryOutcome,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"remember · {candidate.conversation_id}",
            )
        except (ActivityError, ApplicationError) as err:
            raise_if_cancelled(err)
            self._record.diagnostics.append(
                Diagnostic(extension="(memory)", phase="remember", error=error_text(err), error_type="MemoryError")
            )
            return
        saved.by = replaced_by
        self._record.memory = saved

    async def _finalize(
        self,
        status: Literal["completed", "stopped", "error", "cancelled"],
        *,
        response: str | None = None,
        error: RunErrorView | None = None,
        cache: CacheVerdict | None = None,
    ) -> None:
        """on_error (for errors and cancellation), then on_finish: once per hook, whatever happened, also
        for hooks whose other stages were never reached. Their failures are diagnostics only."""
        if error is not None:
            self._set_stage(Stage.ON_ERROR)
            await self._run_stage(
                Stage.ON_ERROR, lambda hook: OnErrorCall(hook=hook, view=self._view(hook), error=error)
            )
        self._set_stage(Stage.ON_FINISH)

        def make(hook: HookEntry) -> OnFinishCall:
            # Each observer sees the diagnostics of the ones before it.
            outcome = RunOutcomeView(
                status=status,
                response=response,
                stopped=self._record.stopped,
                error=error,
                diagnostics=list(self._record.diagnostics),
                cache=cache or CacheVerdict(reasons=["not decided"]),
            )
            return OnFinishCall(hook=hook, view=self._view(hook), outcome=outcome)

        await self._run_stage(Stage.ON_FINISH, make)

    def _error_view(self, error: RequestError) -> RunErrorView:
        return RunErrorView(
            origin=_ERROR_ORIGINS.get(error.type, "harness"),
            type=error.type,
            message=error.message,
            details=error.details,
            steps=[StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in self._record.steps],
        )

    def _stopped_result(self, stop: RunStopped) -> RequestResult:
        info = StopInfo(extension=stop.extension, phase=stop.phase, reason=stop.reason)
        self._record.stopped = info
        self._record.final_response = stop.text
        return RequestResult(
            request_id=self._request_id,
            workflow_id=self._record.workflow_id,
            response=stop.text,
            confidence=1.0,
            stopped=info,
            metadata={"pipeline": self._manifest.pipeline},
            steps=[StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in self._record.steps],
        )

    async def _resolve_pipeline(self) -> None:
        self._set_stage("resolve_pipeline")
        try:
            self._manifest = await self._bookkeeping(
                "resolve_pipeline",
                ResolvePipelineInput(request_id=self._request_id, metadata=self._input.metadata),
                result_type=PipelineManifest,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary="resolve_pipeline",
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            raise stage_failure(decisions.PIPELINE_UNAVAILABLE, "could not resolve the hook pipeline", err) from None
        self._record.pipeline = self._manifest.pipeline
        self._record.trace_id = self._manifest.trace_id
        self._leases.keeper_search_attributes = self._child_kind(sa.KIND_LEASE_KEEPER)
        self._gate = decisions.gate_for_request(
            self._input.metadata, self._manifest.cache_variation, self._manifest.reserved_metadata_dimensions
        )

    async def _before_planning(self) -> RequestResult | None:
        """Enrich, and stop at the first accepted short-circuit."""
        stage = Stage.BEFORE_PLANNING
        self._set_stage(stage)

        def apply(hook: HookEntry, outcome: BeforePlanningOutcome) -> RequestResult | None:
            self._apply_enrichment_changes(hook, outcome.enrichment_changes)
            proposal = outcome.short_circuit
            if proposal is not None and outcome.decision.action is DecisionAction.SHORT_CIRCUIT:
                return self._short_circuit_result(proposal, outcome.decision)
            return None

        return await self._run_stage(stage, lambda hook: BeforePlanningCall(hook=hook, view=self._view(hook)), apply)

    def _short_circuit_result(self, proposal: ShortCircuitProposal, decision: HookDecision) -> RequestResult:
        info = ShortCircuitInfo(source=proposal.source, kind=proposal.kind, reason=decision.reason)
        self._record.short_circuit = info
        self._record.final_response = proposal.response
        self._record.confidence = 1.0
        return RequestResult(
            request_id=self._request_id,
            workflow_id=self._record.workflow_id,
            response=proposal.response,
            confidence=1.0,
            short_circuit=info,
            metadata={**proposal.metadata, **self._enrichments},
        )

    async def _run_phases(self) -> Plan:
        """Plan, govern, (review,) execute — once per phase until the planner stops or the cap is hit."""
        phase = 1
        while True:
            self._phase = phase
            plan = await self._plan(phase)
            plan = await self._after_planning(plan)
            await self._persist(LifecycleBoundary.ACCEPTED_PLAN)
            reasons = approval_reasons(plan, self._manifest.tools)
            if reasons and self._behaviour.approval_after_rewrites:
                await self._review_ready_calls(plan, reasons)
            elif reasons:  # executions started before calls were approved as they run
                plan = await self._checkpoint(plan, reasons)
            await self._execute(plan)
            if not plan.continue_after:
                return plan
            if phase >= self._manifest.settings.max_planning_phases:
                self._record.phase_cap_reached = True
                return plan
            phase += 1

    async def _plan(self, phase: int) -> Plan:
        self._set_stage("planning")
        settings = self._manifest.settings
        try:
            output = await self._activity(
                "plan",
                PlanInput(
                    request=self._ask,
                    request_id=self._request_id,
                    workflow_id=self._record.workflow_id,
                    enrichments=self._enrichments,
                    phase=phase,
                    prior_results=[s.model_view() for s in self._record.steps],
                    instructions=self._instructions,
                    facts=self._facts,
                    max_tokens_remaining=self._model_tokens_left(),
                ),
                result_type=PlanOutput,
                timeout=settings.plan_timeout_seconds,
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[decisions.INVALID_PLAN]),
                summary=f"plan · phase {phase}",
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            self._record_failed_model_calls(err)
            raise stage_failure(decisions.PLANNING_FAILED, "planning failed", err) from None
        self._record.model_calls.extend(output.model_calls)
        self._record.planning_prompt = output.prompt[:MAX_RECORDED_PROMPT_CHARS]
        self._record.planner = output.planner
        return output.plan

    def _model_tokens_left(self) -> int | None:
        """The request's model token budget — the pipeline's, or lower where the request's metadata asks —
        less what its recorded model calls spent (None: no budget)."""
        budgets = [
            self._manifest.settings.max_model_tokens_per_request,
            self._input.metadata.get(METADATA_MAX_MODEL_TOKENS),
        ]
        limits = [budget for budget in budgets if type(budget) is int]
        return min(limits) - self._record.model_usage.total_tokens if limits else None

    def _record_failed_model_calls(self, err: ActivityError) -> None:
        """Keep the model calls a failed planning or synthesis activity reported in its error details."""
        calls = activity_error_details(err).get("model_calls")
        for call in calls if isinstance(calls, list) else []:
            try:
                self._record.model_calls.append(ModelCall.model_validate(call))
            except ValueError:
                pass  # not a model call this framework wrote: nothing to record

    async def _after_planning(self, plan: Plan) -> Plan:
        """Chain copy-on-write mutations, each validated; the required hook's failure ends the request
        before any checkpoint or tool."""
        stage = Stage.AFTER_PLANNING
        self._set_stage(stage)
        prior_step_ids = [s.step_id for s in self._record.steps]
        current = plan

        def make(hook: HookEntry) -> AfterPlanningCall:
            view = self._view(hook, plan_phase=plan.phase)
            return AfterPlanningCall(hook=hook, view=view, plan=current, prior_step_ids=prior_step_ids)

        def apply(hook: HookEntry, outcome: AfterPlanningOutcome) -> None:
            nonlocal current
            current = outcome.plan

        await self._run_stage(stage, make, apply, plan_phase=plan.phase)
        self._record.plans.append(AcceptedPlan(phase=current.phase, plan=current, accepted_at=workflow.now()))
        return current

    async def _review_ready_calls(self, plan: Plan, reasons: list[ApprovalReason]) -> None:
        """Approve each call that needs a reviewer exactly as it will run. A call that can run now — all it
        depends on succeeded, so its references resolve — is prepared first: resolved, validated and
        through its before_tool chain, so every rewrite is done and a denial never reaches a reviewer; the
        phase's one checkpoint lists the prepared calls, and approval runs those values. A call that waits
        on steps of its own phase is prepared and approved when it is ready (``_confirm_step``)."""
        self._needs_approval = {}
        for reason in reasons:
            self._needs_approval.setdefault(reason.step_id, []).append(reason)
        self._set_stage(Stage.BEFORE_TOOL)
        calls: list[ApprovalCall] = []
        for step in plan.steps:
            if step.step_id in self._needs_approval and self._can_start(step):
                prepared = await self._prepare_step(step)
                self._prepared[step.step_id] = prepared
                if prepared.ready:
                    calls.append(prepared.approval_call(step))
        if not calls:
            return
        checkpoint = self._new_checkpoint(
            plan, [r for call in calls for r in self._needs_approval[call.step_id]], calls=calls
        )
        await self._await_review(checkpoint)
        for call in calls:
            self._approved[call.step_id] = checkpoint

    async def _checkpoint(self, plan: Plan, reasons: list[ApprovalReason]) -> Plan:
        """Wait for a reviewer on the plan as planned (executions started before calls were approved as
        they run): approval runs this plan, before_tool after the approval."""
        await self._await_review(self._new_checkpoint(plan, reasons))
        return plan

    def _new_checkpoint(
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
            expires_at=now + timedelta(seconds=self._manifest.review.checkpoint_expiry_seconds),
        )

    async def _await_review(self, checkpoint: Checkpoint) -> None:
        """Open ``checkpoint`` and wait for its reviewer. Rejection or expiry fails the request before any
        of its calls runs. Several step checkpoints of one phase may be open at once: the request is
        suspended until the last of them is decided."""
        now = checkpoint.requested_at
        self._record.checkpoints.append(checkpoint)
        self._record.status = RequestStatus.SUSPENDED
        self._set_stage(AWAITING_REVIEW_STAGE, detail=story.checkpoint_detail(checkpoint))
        if not self._stage_upserts:
            self._upsert_search_attributes(AWAITING_REVIEW_STAGE, awaiting_review=True)
        self._publish_stage()
        if self._manifest.review.notify:  # without a reviewers' webhook a checkpoint adds no command
            await start_review_notification(
                self._record,
                self._detached_tokens,
                self._manifest,
                checkpoint,
                self._input.request,
                search_attributes=self._child_kind(sa.KIND_REVIEW_NOTIFICATION),
            )
        await self._persist(LifecycleBoundary.CHECKPOINT_OPENED)
        try:
            await workflow.wait_condition(
                lambda: checkpoint.status is not CheckpointStatus.PENDING,
                timeout=checkpoint.expires_at - now,
                timeout_summary=f"checkpoint {checkpoint.checkpoint_id} expiry",
            )
        except asyncio.TimeoutError:
            checkpoint.status = CheckpointStatus.EXPIRED
            checkpoint.decided_at = workflow.now()
        still_open = [c for c in self._record.checkpoints if c.status is CheckpointStatus.PENDING]
        if still_open:
            self._set_stage(AWAITING_REVIEW_STAGE, detail=story.checkpoint_detail(still_open[0]))
        else:
            self._record.status = RequestStatus.RUNNING
            if checkpoint.step_id is not None:
                self._set_stage("executing")
            if not self._stage_upserts:
                self._upsert_search_attributes("executing", awaiting_review=False)
        details = {
            "checkpoint_id": checkpoint.checkpoint_id,
            "phase": checkpoint.phase,
            "reviewer": checkpoint.reviewer,
            "reason": checkpoint.comment,
        }
        if checkpoint.status is CheckpointStatus.REJECTED:
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

    async def _after_execution(self, execution: ExecutionResult) -> None:
        """Observers of every step's outcome: its status, result text (capped) and error, not each raw
        output, so what every after_execution hook receives stays small however much the tools returned
        (the record keeps the raw outputs)."""
        self._set_stage(Stage.AFTER_EXECUTION)
        execution = ExecutionResult(steps=[s.observer_view() for s in execution.steps])
        await self._run_stage(
            Stage.AFTER_EXECUTION,
            lambda hook: AfterExecutionCall(hook=hook, view=self._view(hook), execution=execution),
        )

    async def _synthesize(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput:
        self._set_stage("synthesizing")
        try:
            output = await self._activity(
                "synthesize",
                SynthesizeInput(
                    request=self._ask,
                    request_id=self._request_id,
                    plan=plan,
                    execution=ExecutionResult(steps=[s.model_view() for s in execution.steps]),
                    enrichments=self._enrichments,
                    instructions=self._instructions,
                    facts=self._facts,
                    max_tokens_remaining=self._model_tokens_left(),
                    stream=self._input.stream_answer and self._manifest.settings.answer_streaming,
                ),
                result_type=SynthesizeOutput,
                timeout=self._manifest.settings.synthesize_timeout_seconds,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="synthesize",
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            self._record_failed_model_calls(err)
            raise stage_failure(decisions.SYNTHESIS_FAILED, "synthesis failed", err) from None
        self._record.model_calls.extend(output.model_calls)
        # The draft is not yet guarded: the record keeps it by digest and a masked preview only.
        self._record.model_draft = output.draft or ModelDraft.of(output.response)
        return output

    async def _after_synthesis(self, response: str) -> str:
        """Rewrite the answer, chained; a hook that fails closed (redaction) ends the request rather than
        let its unguarded input out."""
        stage = Stage.AFTER_SYNTHESIS
        self._set_stage(stage)
        current = response

        def apply(hook: HookEntry, outcome: AfterSynthesisOutcome) -> None:
            nonlocal current
            current = outcome.response

        await self._run_stage(
            stage, lambda hook: AfterSynthesisCall(hook=hook, view=self._view(hook), response=current), apply
        )
        return current

    async def _release_leases(self, exit: str) -> None:
        """Stop and join every lease keeper, then release each lease (see ``workflows.leases``)."""
        if not self._leases:
            return
        self._set_stage("releasing_leases")
        effects = await self._leases.release_all(
            exit, self._manifest.settings, self._record.effect, self._note_worker_lost
        )
        record_effects(self._record, effects)

    def _upsert_search_attributes(self, stage: str, *, awaiting_review: bool) -> None:
        if self._manifest.search_attributes:
            workflow.upsert_search_attributes(
                [sa.LIFECYCLE_STAGE.value_set(stage), sa.AWAITING_REVIEW.value_set(awaiting_review)]
            )

    async def _finish(self, status: RequestStatus, error: RequestError | None = None) -> None:
        self._record.status = status
        self._record.error = error
        terminal = "completed" if status is RequestStatus.SUCCEEDED else str(status)
        self._record.completed_at = workflow.now()
        if self._stage_upserts:
            self._set_stage(terminal, outcome=self._outcome(status, error))
            self._publish_stage()
        else:
            self._record.lifecycle_stage = terminal
            workflow.set_current_details(
                story.current_details(self._input.request, stage=terminal, outcome=self._outcome(status, error))
            )
            self._upsert_search_attributes(terminal, awaiting_review=False)
        await self._persist(LifecycleBoundary.TERMINAL)

    def _outcome(self, status: RequestStatus, error: RequestError | None) -> str:
        """How the request ended, in one line: the failure's type and reason, who stopped it, or the answer."""
        if error is not None:
            return story.failure_headline(error.type, error.message)
        stopped = self._record.stopped
        if stopped is not None:
            return f"stopped by {stopped.extension} at {stopped.phase}: {stopped.reason}"
        answer = self._record.final_response or ""
        served = self._record.short_circuit
        by = f" (short-circuit by {served.source}: {served.reason})" if served is not None else ""
        return f"{status.value}{by} — answer: {answer}"

    async def _persist(self, boundary: LifecycleBoundary) -> None:
        """Persist the full snapshot with a higher revision; never masks the request outcome. A cancel
        arriving meanwhile cancels the request, except at the terminal boundary, where the snapshot is
        written again so the record still says how the request ended."""
        self._record.record_revision += 1
        status = self._record.status
        completion = _COMPLETION[status] if status in _COMPLETION else "pending"
        self._record.lifecycle = RecordLifecycle(
            boundary=boundary, completion=completion, snapshot_revision=self._record.record_revision
        )
        for attempt in (1, 2):
            try:
                await self._bookkeeping(
                    "persist_execution_record",
                    PersistRecordInput(record=self._record),
                    result_type=PersistRecordOutput,
                    timeout=30,
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=f"persist record · {boundary.value} · revision {self._record.record_revision}",
                )
                return
            except (ActivityError, ApplicationError) as err:
                if boundary is not LifecycleBoundary.TERMINAL:
                    raise_if_cancelled(err)
                    if isinstance(err, ApplicationError):
                        raise
                elif attempt == 1 and isinstance(err, ActivityError) and isinstance(err.cause, CancelledError):
                    continue
                workflow.logger.warning(
                    "execution record revision %s was not persisted: %s", self._record.record_revision, error_text(err)
                )
                return


_COMPLETION: dict[RequestStatus, Literal["completed", "stopped", "failed", "cancelled"]] = {
    RequestStatus.SUCCEEDED: "completed",
    RequestStatus.STOPPED: "stopped",
    RequestStatus.FAILED: "failed",
    RequestStatus.CANCELLED: "cancelled",
}
_ERROR_ORIGINS = {
    decisions.EXTENSION_ERROR: "extension",
    decisions.PLANNING_FAILED: "planner",
    decisions.SYNTHESIS_FAILED: "synthesizer",
    decisions.REQUIRED_AFTER_PLANNING_ERROR: "hook",
    decisions.HOOK_CONTRACT_ERROR: "hook",
    decisions.PIPELINE_UNAVAILABLE: "config",
    CHECKPOINT_REJECTED: "confirmation",
    CHECKPOINT_EXPIRED: "confirmation",
    decisions.WORKER_LOST: "infrastructure",
    decisions.PAYLOAD_TOO_LARGE: "infrastructure",
    **dict.fromkeys(decisions.MODEL_FAILURES, "model"),
    "Cancelled": "cancelled",
}


def _no_arguments(query: str, args: Sequence[Any]) -> None:
    if args:
        raise ApplicationError(
            f"query {query} takes no arguments, got {len(args)}", type=INVALID_QUERY, non_retryable=True
        )
