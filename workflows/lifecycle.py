"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError, TimeoutError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, JsonValue, ValidationError

    from . import decisions
    from . import search_attributes as sa
    from .detached import DETACHED_WORKFLOW_TYPE, EFFECT_UPDATE_SIGNAL, detached_workflow_id
    from .models import (
        MAX_RECORDED_PROMPT_CHARS,
        AcceptedPlan,
        AfterExecutionCall,
        AfterAnswerCall,
        AfterAnswerOutcome,
        AfterPlanningCall,
        AfterPlanningOutcome,
        AfterSynthesisCall,
        AfterSynthesisOutcome,
        AfterToolCall,
        AfterToolOutcome,
        AnswerView,
        ApprovalReason,
        ApproveSignal,
        BeforePlanningCall,
        BeforePlanningOutcome,
        BeforeRememberCall,
        BeforeRememberOutcome,
        BeforeRunCall,
        BeforeRunOutcome,
        BeforeToolCall,
        BeforeToolOutcome,
        Checkpoint,
        CheckpointStatus,
        DecisionAction,
        DetachedEffectInput,
        DetachedWork,
        Diagnostic,
        EffectStatus,
        EnrichmentChange,
        EnrichmentOperation,
        ExecutionRecord,
        ExecutionResult,
        GateState,
        HookDecision,
        HookEntry,
        HookInvocation,
        HookOutcome,
        HookRequestView,
        IgnoredReview,
        InvocationOutcome,
        LeaseCall,
        LeaseObservation,
        LifecycleBoundary,
        ManagedLease,
        MemoryCandidate,
        MemoryOutcome,
        ObserveOutcome,
        OnErrorCall,
        OnFinishCall,
        PersistRecordInput,
        PersistRecordOutput,
        PipelineHookEffect,
        PipelineManifest,
        Plan,
        PlanInput,
        PlanOutput,
        PlanStep,
        RecordLifecycle,
        RejectSignal,
        RememberInput,
        RequestError,
        LOOP_DEPTH_EXCEEDED,
        MAX_SUBAGENT_DEPTH,
        METADATA_PARENT_WORKFLOW,
        METADATA_SUBAGENT_DEPTH,
        RequestInput,
        RequestResult,
        RequestStatus,
        ResolvePipelineInput,
        ReviewAck,
        ReviewRequest,
        RunErrorView,
        RunMode,
        RunOutcomeView,
        RunView,
        ShortCircuitInfo,
        ShortCircuitProposal,
        Stage,
        StepResult,
        StepStatus,
        StepSummary,
        StopInfo,
        SynthesizeInput,
        SynthesizeOutput,
        ToolCall,
        ToolErrorCall,
        ToolErrorOutcome,
        ToolMetrics,
        ToolOutcomeView,
        ToolStepInput,
        ToolStepOutput,
        bounded_value,
        subagent_depth,
    )
    from .plan_validation import UnresolvedReference, resolve_references
    from .support import (
        NON_RETRYABLE_HOOK_FAILURES,
        HookFailure,
        approval_reasons,
        idempotency_key,
        promote_metadata,
        stage_failure,
    )

WORKFLOW_TYPE = "RequestLifecycle"
CHECKPOINT_REJECTED = "CheckpointRejected"
CHECKPOINT_EXPIRED = "CheckpointExpired"
INVALID_REVIEW = "InvalidReview"
MAX_IGNORED_REVIEWS = 50
HOOK_RETRY_INITIAL_INTERVAL = timedelta(milliseconds=200)
_HOOK_ACTIVITIES = {stage: f"{stage.value}_hook" for stage in Stage}

OutcomeT = TypeVar("OutcomeT", bound=HookOutcome)
SignalT = TypeVar("SignalT", ApproveSignal, RejectSignal)


@workflow.defn(name=WORKFLOW_TYPE)
class RequestLifecycleWorkflow:
    """One agent request: before_planning → (plan → after_planning → [checkpoint] → execute) per phase →
    after_execution → synthesize → after_synthesis, each hook invocation its own activity."""

    @workflow.init
    def __init__(self, input: RequestInput) -> None:
        info = workflow.info()
        self._input = input
        self._request_id = input.request_id or info.workflow_id
        self._manifest = PipelineManifest(pipeline="unresolved")
        self._enrichments: dict[str, JsonValue] = {}
        self._gate = GateState()
        self._results: dict[str, StepResult] = {}
        self._phase = 1
        self._ask = input.request
        self._instructions = ""
        self._facts: dict[str, JsonValue] = {}
        self._hook_state: dict[str, dict[str, JsonValue]] = {}
        self._leases: dict[str, _LeaseOwner] = {}  # managed leases this request owns, by lease id
        self._record = ExecutionRecord(
            request_id=self._request_id,
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            request=input.request,
            metadata=input.metadata,
            started_at=workflow.now(),
        )

    # ------------------------------------------------------------------------------------------------
    # Queries, signals, updates
    # ------------------------------------------------------------------------------------------------

    @workflow.query(name="execution_record")
    def execution_record(self) -> ExecutionRecord:
        """The execution record as it stands: every invocation, decision and effect so far."""
        return self._record

    @workflow.query(name="pending_checkpoint")
    def pending_checkpoint(self) -> Checkpoint | None:
        """The checkpoint waiting for a reviewer, or null."""
        return next((c for c in self._record.checkpoints if c.status is CheckpointStatus.PENDING), None)

    @workflow.signal(name="approve")
    def approve(self, payload: JsonValue) -> None:
        """Approve the open checkpoint: ``{"checkpoint_id", "reviewer", "comment"}``."""
        signal = self._review_signal("approve", ApproveSignal, payload)
        if signal is not None:
            self._decide("approve", "approve", signal.checkpoint_id, signal.reviewer, signal.comment)

    @workflow.signal(name="reject")
    def reject(self, payload: JsonValue) -> None:
        """Reject the open checkpoint: ``{"checkpoint_id", "reviewer", "reason"}``."""
        signal = self._review_signal("reject", RejectSignal, payload)
        if signal is not None:
            self._decide("reject", "reject", signal.checkpoint_id, signal.reviewer, signal.reason)

    def _review_signal(self, via: Literal["approve", "reject"], model: type[SignalT], payload: JsonValue) -> SignalT | None:
        """The signal's fields, or None after recording a malformed one as ignored (never dropped silently)."""
        try:
            return model.model_validate(payload)
        except ValidationError as err:
            fields = payload if isinstance(payload, dict) else {}
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in err.errors(include_url=False)[:3])
            self._ignore(via, str(fields.get("checkpoint_id", "")), str(fields.get("reviewer", "")), f"malformed {via} signal: {problems}")
            return None

    @workflow.update(name="review")
    def review(self, request: ReviewRequest) -> ReviewAck:
        """Approve or reject with an acknowledgement; refused before it is accepted if invalid."""
        self._decide("review", request.decision, request.checkpoint_id, request.reviewer, request.comment)
        return ReviewAck(
            checkpoint_id=request.checkpoint_id,
            decision=request.decision,
            reviewer=request.reviewer,
            accepted_at=workflow.now(),
        )

    @review.validator
    def _validate_review(self, request: ReviewRequest) -> None:
        problem = self._review_problem(request.checkpoint_id, request.reviewer)
        if problem:
            raise ApplicationError(problem, type=INVALID_REVIEW, non_retryable=True)

    @workflow.signal(name=EFFECT_UPDATE_SIGNAL)
    def effect_update(self, effect: PipelineHookEffect) -> None:
        """A detached effect reached its terminal state (sent by its ``DetachedEffect`` child)."""
        if effect.status is EffectStatus.PENDING:
            return
        for index, existing in enumerate(self._record.effects):
            if existing.effect_id == effect.effect_id:
                if existing.status is EffectStatus.PENDING:
                    self._record.effects[index] = effect
                return
        self._record.effects.append(effect)

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

    def _ignore(self, via: Literal["approve", "reject", "review"], checkpoint_id: str, reviewer: str, reason: str) -> None:
        """A review that changes nothing is kept (bounded) so an operator can see what was tried."""
        if len(self._record.ignored_reviews) < MAX_IGNORED_REVIEWS:
            self._record.ignored_reviews.append(
                IgnoredReview(received_at=workflow.now(), via=via, checkpoint_id=checkpoint_id, reviewer=reviewer, reason=reason)
            )

    def _decide(
        self,
        via: Literal["approve", "reject", "review"],
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
    async def run(self, input: RequestInput) -> RequestResult:
        try:
            result = await self._lifecycle()
        except _RunStopped as stop:
            result = self._stopped_result(stop)
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
        await self._finalize_and_finish(RequestStatus.SUCCEEDED, "completed", response=result.response)
        result.diagnostics = list(self._record.diagnostics)
        return result

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
            await self._finalize(outcome, response=response, error=self._error_view(error) if error else None)
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
        """Rewrite the ask, instructions or facts, or stop the run (seed 003 ``beforeRun``)."""
        stage = Stage.BEFORE_RUN
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            run = RunView(ask=self._ask, instructions=self._instructions, facts=self._facts)
            outcome, failure = await self._invoke(hook, stage, sequence, BeforeRunCall(hook=hook, view=self._view(hook), run=run), BeforeRunOutcome)
            if outcome is None:
                raise _extension_error(hook, stage, failure)
            if outcome.stop is not None:
                raise _RunStopped(hook.name, stage.value, outcome.stop.reason, outcome.stop.text)
            if outcome.patch is not None:
                self._ask = outcome.patch.ask if outcome.patch.ask is not None else self._ask
                if outcome.patch.instructions is not None:
                    self._instructions = outcome.patch.instructions
                self._facts = {**self._facts, **(outcome.patch.facts or {})}
                self._record.ask = self._ask if self._ask != self._input.request else None
                self._record.instructions = self._instructions
                self._record.facts = dict(self._facts)

    async def _after_answer(self, text: str, handled_by: Literal["pipeline", "short_circuit"], steps: list[StepSummary]) -> str:
        """Rewrite the final answer or stop; chained in order (seed 003 ``afterAnswer``)."""
        stage = Stage.AFTER_ANSWER
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            answer = AnswerView(text=text, handled_by=handled_by, steps=steps)
            outcome, failure = await self._invoke(hook, stage, sequence, AfterAnswerCall(hook=hook, view=self._view(hook), answer=answer), AfterAnswerOutcome)
            if outcome is None:
                raise _extension_error(hook, stage, failure)
            if outcome.stop is not None:
                raise _RunStopped(hook.name, stage.value, outcome.stop.reason, outcome.stop.text)
            text = outcome.text
        return text

    async def _remember(self, answer: str) -> None:
        """Offer the exchange to before_remember hooks, then save it to conversation memory. A failed
        save keeps the completed answer and is recorded as a diagnostic (seed 003)."""
        if not self._manifest.memory:
            return
        stage = Stage.BEFORE_REMEMBER
        self._set_stage("remembering")
        conversation = self._input.metadata.get("conversation_id")
        candidate = MemoryCandidate(
            conversation_id=conversation if isinstance(conversation, str) and conversation else self._request_id,
            request=self._ask,
            answer=answer,
            facts=self._facts,
        )
        replaced_by = None
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = BeforeRememberCall(hook=hook, view=self._view(hook), candidate=candidate)
            outcome, failure = await self._invoke(hook, stage, sequence, call, BeforeRememberOutcome)
            if outcome is None:
                raise _extension_error(hook, stage, failure)
            if outcome.skip is not None:
                self._record.memory = MemoryOutcome(
                    action="skipped", conversation_id=candidate.conversation_id, by=hook.name, reason=outcome.skip.reason
                )
                return
            if outcome.candidate != candidate:
                candidate, replaced_by = outcome.candidate, hook.name
        try:
            saved = await workflow.execute_activity(
                "remember",
                RememberInput(request_id=self._request_id, workflow_id=self._record.workflow_id, candidate=candidate),
                result_type=MemoryOutcome,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"remember · {candidate.conversation_id}",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            self._record.diagnostics.append(
                Diagnostic(extension="(memory)", phase="remember", error=str(getattr(err.cause, "message", err.cause)), error_type="MemoryError")
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
    ) -> None:
        """on_error (for errors and cancellation), then on_finish: once per hook, whatever happened, also
        for hooks whose other stages were never reached. Observer failures are diagnostics only."""
        if error is not None:
            await self._observe(Stage.ON_ERROR, lambda hook: OnErrorCall(hook=hook, view=self._view(hook), error=error))
        await self._observe(
            Stage.ON_FINISH,
            lambda hook: OnFinishCall(
                hook=hook,
                view=self._view(hook),
                outcome=RunOutcomeView(
                    status=status,
                    response=response,
                    stopped=self._record.stopped,
                    error=error,
                    diagnostics=list(self._record.diagnostics),
                ),
            ),
        )

    async def _observe(self, stage: Stage, make_call: Callable[[HookEntry], BaseModel]) -> None:
        """Run observers; one failing — or cancelled with the request — never stops the next."""
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            try:
                _, failure = await self._invoke(hook, stage, sequence, make_call(hook), ObserveOutcome)
            except asyncio.CancelledError:
                failure = HookFailure(category="Cancelled", message="cancelled with the request")
            if failure is not None:
                self._record.diagnostics.append(
                    Diagnostic(extension=hook.name, phase=stage.value, error=failure.message, error_type=failure.category)
                )

    def _error_view(self, error: RequestError) -> RunErrorView:
        return RunErrorView(
            origin=_ERROR_ORIGINS.get(error.type, "harness"),
            type=error.type,
            message=error.message,
            details=error.details,
            steps=[StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in self._record.steps],
        )

    def _stopped_result(self, stop: _RunStopped) -> RequestResult:
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
            self._manifest = await workflow.execute_activity(
                "resolve_pipeline",
                ResolvePipelineInput(request_id=self._request_id, metadata=self._input.metadata),
                result_type=PipelineManifest,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary="resolve_pipeline",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            raise stage_failure(decisions.PIPELINE_UNAVAILABLE, "could not resolve the hook pipeline", err)
        self._record.pipeline = self._manifest.pipeline
        self._gate = decisions.gate_for_request(
            self._input.metadata, self._manifest.cache_variation, self._manifest.reserved_metadata_dimensions
        )

    async def _before_planning(self) -> RequestResult | None:
        """Enrich, and stop at the first accepted short-circuit (seed 000 §4.1, §6)."""
        stage = Stage.BEFORE_PLANNING
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = BeforePlanningCall(hook=hook, view=self._view(hook))
            outcome, failure = await self._invoke(hook, stage, sequence, call, BeforePlanningOutcome)
            if outcome is None:
                if failure.category == decisions.HOOK_CONTRACT_ERROR:
                    raise ApplicationError(
                        f"before_planning hook {hook.name!r} broke the short-circuit contract: {failure.message}",
                        {"hook": hook.name, "stage": stage.value, "cause": failure.message},
                        type=decisions.HOOK_CONTRACT_ERROR,
                        non_retryable=True,
                    )
                continue
            self._apply_enrichment_changes(hook, outcome.enrichment_changes)
            proposal = outcome.short_circuit
            if proposal is not None and outcome.decision.action is DecisionAction.SHORT_CIRCUIT:
                return self._short_circuit_result(proposal, outcome.decision)
        return None

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
            if reasons:
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
            output = await workflow.execute_activity(
                "plan",
                PlanInput(
                    request=self._ask,
                    request_id=self._request_id,
                    workflow_id=self._record.workflow_id,
                    enrichments=self._enrichments,
                    phase=phase,
                    prior_results=self._record.steps,
                    instructions=self._instructions,
                    facts=self._facts,
                ),
                result_type=PlanOutput,
                start_to_close_timeout=timedelta(seconds=settings.plan_timeout_seconds),
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[decisions.INVALID_PLAN]),
                summary=f"plan · phase {phase}",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            raise stage_failure(decisions.PLANNING_FAILED, "planning failed", err)
        self._record.planning_prompt = output.prompt[:MAX_RECORDED_PROMPT_CHARS]
        self._record.planner = output.planner
        return output.plan

    async def _after_planning(self, plan: Plan) -> Plan:
        """Chain copy-on-write mutations; the required hook's failure ends the request (seed 000 §4.2)."""
        stage = Stage.AFTER_PLANNING
        self._set_stage(stage)
        prior_step_ids = [s.step_id for s in self._record.steps]
        current = plan
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = AfterPlanningCall(
                hook=hook, view=self._view(hook, plan_phase=plan.phase), plan=current, prior_step_ids=prior_step_ids
            )
            outcome, failure = await self._invoke(hook, stage, sequence, call, AfterPlanningOutcome, plan.phase)
            if outcome is not None:
                current = outcome.plan
                continue
            if hook.required:
                raise ApplicationError(
                    f"required after_planning hook {hook.name!r} rejected the plan: {failure.message}",
                    {
                        "hook": hook.name,
                        "cause": failure.message,
                        "cause_type": failure.category,
                        "exception_type": failure.exception_type,
                        "plan_phase": plan.phase,
                    },
                    type=decisions.REQUIRED_AFTER_PLANNING_ERROR,
                    non_retryable=True,
                )
        self._record.plans.append(AcceptedPlan(phase=current.phase, plan=current, accepted_at=workflow.now()))
        return current

    async def _checkpoint(self, plan: Plan, reasons: list[ApprovalReason]) -> Plan:
        """Wait for a reviewer. Approval runs this plan as it is (after_planning does not run again);
        rejection or expiry fails the request before any of its tools runs (seed 000 §4.2)."""
        now = workflow.now()
        checkpoint = Checkpoint(
            checkpoint_id=f"cp-{plan.phase}-{str(workflow.uuid4())[:8]}",
            phase=plan.phase,
            plan=plan,
            reasons=reasons,
            requested_at=now,
            expires_at=now + timedelta(seconds=self._manifest.review.checkpoint_expiry_seconds),
        )
        self._record.checkpoints.append(checkpoint)
        self._record.status = RequestStatus.SUSPENDED
        self._set_stage("awaiting_review", detail=f"checkpoint {checkpoint.checkpoint_id}: {len(reasons)} reason(s)")
        self._upsert_search_attributes("awaiting_review", awaiting_review=True)
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
        self._record.status = RequestStatus.RUNNING
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
        return checkpoint.plan

    async def _execute(self, plan: Plan) -> ExecutionResult:
        """One activity per step; a step starts when everything it depends on (``depends_on`` in this
        phase, ``implicit_deps`` in earlier ones) has succeeded. If a step ends the run (a stop, an
        extension error, cancellation) the steps still running are cancelled, and every step that
        finished is kept in the record."""
        self._set_stage("executing")
        results = self._results
        waiting = list(plan.steps)
        running: dict[asyncio.Task[StepResult], str] = {}
        try:
            while waiting or running:
                for step in list(waiting):
                    deps = [results.get(d) for d in [*step.depends_on, *step.implicit_deps]]
                    if any(d is None for d in deps):
                        continue
                    waiting.remove(step)
                    blocked = [d.step_id for d in deps if d.status is not StepStatus.SUCCEEDED]
                    missing = f"dependency_not_succeeded: {', '.join(blocked)}" if blocked else None
                    running[asyncio.ensure_future(self._run_step(step, missing=missing))] = step.step_id
                if not running:
                    # Only reachable with a plan that bypassed validation: never wait on what cannot finish.
                    for step in waiting:
                        running[asyncio.ensure_future(self._run_step(step, missing="unresolvable_dependency"))] = step.step_id
                    waiting.clear()
                done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    result = task.result()
                    results[result.step_id] = result
                    self._count_tool_metrics(result)
        except BaseException:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            self._record.steps.extend(results[s.step_id] for s in plan.steps if s.step_id in results)
            raise
        execution = ExecutionResult(steps=[results[s.step_id] for s in plan.steps])
        self._record.steps.extend(execution.steps)
        return execution

    async def _run_step(self, step: PlanStep, *, missing: str | None = None) -> StepResult:
        """One step through its tool-call stages: before_tool (allow / modify / deny / stop), the tool,
        on_tool_error when it failed, after_tool on every outcome, then the result cap."""
        key = idempotency_key(self._record.workflow_id, step.step_id)
        started = workflow.now()
        result = StepResult(
            step_id=step.step_id, tool=step.tool, status=StepStatus.SKIPPED, idempotency_key=key, started_at=started
        )
        call = ToolCall(
            step_id=step.step_id,
            namespace=step.namespace,
            agent=step.agent,
            capability=step.capability,
            plan_phase=self._phase,
            subagent=self._is_subagent(step),
        )
        if missing is None:
            try:
                call.arguments = resolve_references(step.arguments, self._results)
            except UnresolvedReference as err:
                missing = str(err)
        if missing is not None:
            result.skip_reason, result.skip_detail, result.result = "missing", missing, missing
        else:
            result.arguments = call.arguments
            problems = await self._resolved_argument_problems(step, call)
            if problems:
                # before_tool sees only validated arguments; these fail like a call the tool refused.
                result.status, result.error_type = StepStatus.FAILED, "InvalidArguments"
                result.error = result.result = "invalid arguments: " + "; ".join(problems)
                await self._on_tool_error(step, call, result)
            elif not await self._before_tool(step, call, result):
                await self._call_tool(step, call, result)
        await self._after_tool(step, call, result)
        limit = self._manifest.settings.max_tool_result_chars
        if result.result is not None and len(result.result) > limit:
            result.result = result.result[: max(0, limit - 1)] + "…"
        return result

    async def _resolved_argument_problems(self, step: PlanStep, call: ToolCall) -> list[str]:
        """Arguments with references were validated at planning only for presence; check their resolved
        values before any before_tool hook sees them (a local activity, where the tools live)."""
        if call.arguments == step.arguments or not self._manifest.tool_participants(Stage.BEFORE_TOOL, call):
            return []
        return await workflow.execute_local_activity(
            "validate_tool_arguments",
            step.model_copy(update={"arguments": call.arguments}),
            result_type=list[str],
            start_to_close_timeout=timedelta(seconds=10),
            summary=f"validate arguments · {step.step_id}",
        )

    async def _before_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> bool:
        """Run the before_tool chain; returns whether the call was denied. A stop ends the run."""
        stage = Stage.BEFORE_TOOL
        for sequence, hook in enumerate(self._manifest.tool_participants(stage, call), start=1):
            outcome, failure = await self._invoke(
                hook, stage, sequence, BeforeToolCall(hook=hook, view=self._view(hook), call=call), BeforeToolOutcome, step=step
            )
            if outcome is None:
                raise _extension_error(hook, stage, failure)
            verdict = outcome.verdict
            if verdict.action == "modify":
                call.arguments = dict(verdict.arguments or {})
                result.arguments = call.arguments
                result.modified_by.append(hook.name)
            elif verdict.action == "deny":
                result.skip_reason, result.skipped_by = "policy", hook.name
                result.skip_detail = verdict.reason or None
                result.result = verdict.message or f"{step.tool} was not run: denied by {hook.name}"
                return True
            elif verdict.action == "stop":
                raise _RunStopped(hook.name, stage.value, verdict.reason, verdict.message)
        return False

    def _is_subagent(self, step: PlanStep) -> bool:
        return any(t.key == step.tool_key and t.kind == "subagent" for t in self._manifest.tools)

    async def _call_subagent(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Run a sub-agent step as a child ``RequestLifecycle`` one level deeper (seed 004); beyond
        ``MAX_SUBAGENT_DEPTH`` the step fails with ``LoopDepthExceeded`` and no child starts."""
        info = workflow.info()
        depth = subagent_depth(self._input.metadata) + 1
        started = workflow.now()
        result.status = StepStatus.FAILED
        if depth > MAX_SUBAGENT_DEPTH:
            workflow.logger.warning("security.hook.loop_depth_exceeded step=%s depth=%s", step.step_id, depth)
            result.error_type = LOOP_DEPTH_EXCEEDED
            result.error = f"sub-agent depth {depth} exceeds the limit of {MAX_SUBAGENT_DEPTH}"
        else:
            child = RequestInput(
                request=str(call.arguments.get("request") or self._ask),
                metadata={
                    **self._input.metadata,
                    METADATA_SUBAGENT_DEPTH: depth,
                    METADATA_PARENT_WORKFLOW: info.workflow_id,
                },
            )
            try:
                answer = await workflow.execute_child_workflow(
                    WORKFLOW_TYPE,
                    child,
                    id=f"{info.workflow_id}/subagent/{step.step_id}",
                    task_queue=info.task_queue,
                    result_type=RequestResult,
                    static_summary=f"sub-agent · {step.tool} ({step.step_id}) · depth {depth}",
                )
            except FailureError as err:
                _raise_if_cancelled(err)
                cause = getattr(err, "cause", None) or err
                result.error_type = getattr(cause, "type", None) or type(cause).__name__
                result.error = getattr(cause, "message", None) or str(cause)
            else:
                result.status = StepStatus.SUCCEEDED
                result.output = {"response": answer.response, "workflow_id": answer.workflow_id, "depth": depth}
                result.result = answer.response
        result.duration_ms = _elapsed_ms(started)
        if result.status is StepStatus.FAILED:
            result.result = f"error: {result.error}"
            await self._on_tool_error(step, call, result)

    async def _call_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Execute the tool; if it fails after its retries, offer the error to on_tool_error hooks."""
        if call.subagent:
            await self._call_subagent(step, call, result)
            return
        settings = self._manifest.settings
        started = workflow.now()
        try:
            output = await workflow.execute_activity(
                "execute_tool_step",
                ToolStepInput(
                    step=step.model_copy(update={"arguments": call.arguments}),
                    request_id=self._request_id,
                    idempotency_key=result.idempotency_key,
                ),
                result_type=ToolStepOutput,
                start_to_close_timeout=timedelta(seconds=settings.tool_timeout_seconds),
                retry_policy=RetryPolicy(
                    maximum_attempts=settings.tool_max_attempts, non_retryable_error_types=["InvalidArguments"]
                ),
                summary=f"execute · {step.tool} ({step.step_id})",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            cause = err.cause
            result.duration_ms = _elapsed_ms(started)
            result.status = StepStatus.FAILED
            result.error = getattr(cause, "message", None) or str(cause or err)
            result.error_type = getattr(cause, "type", None) or type(cause).__name__
            result.result = f"error: {result.error}"
            await self._on_tool_error(step, call, result)
            return
        result.duration_ms = _elapsed_ms(started)
        result.status = StepStatus.SUCCEEDED
        result.output = output.output
        result.result = output.output if isinstance(output.output, str) else json.dumps(output.output, ensure_ascii=False, sort_keys=True)

    async def _on_tool_error(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        stage = Stage.ON_TOOL_ERROR
        failed = ToolOutcomeView(status="failed", error=result.error, result=result.result or "")
        for sequence, hook in enumerate(self._manifest.tool_participants(stage, call), start=1):
            outcome, failure = await self._invoke(
                hook, stage, sequence, ToolErrorCall(hook=hook, view=self._view(hook), call=call, outcome=failed), ToolErrorOutcome, step=step
            )
            if outcome is None:
                raise _extension_error(hook, stage, failure)
            if outcome.resolution.handled:
                result.error_handled_by = hook.name
                result.result = outcome.resolution.result
                return

    async def _after_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Chain result rewrites over every outcome; the execution status never changes here."""
        stage = Stage.AFTER_TOOL
        status = {StepStatus.SUCCEEDED: "executed", StepStatus.FAILED: "failed", StepStatus.SKIPPED: "skipped"}[result.status]
        for sequence, hook in enumerate(self._manifest.tool_participants(stage, call), start=1):
            view = ToolOutcomeView(
                status=status,
                output=result.output if result.status is StepStatus.SUCCEEDED else None,
                reason=result.skip_reason,
                extension=result.skipped_by,
                error=result.error,
                result=result.result or "",
            )
            outcome, failure = await self._invoke(
                hook, stage, sequence, AfterToolCall(hook=hook, view=self._view(hook), call=call, outcome=view), AfterToolOutcome, step=step
            )
            if outcome is None:
                raise _extension_error(hook, stage, failure)
            result.result = outcome.result

    def _count_tool_metrics(self, result: StepResult) -> None:
        metrics = self._record.tool_metrics.setdefault(result.tool, ToolMetrics())
        if result.status is StepStatus.SKIPPED:
            metrics.skipped += 1
            return
        metrics.calls += 1
        metrics.failures += result.status is StepStatus.FAILED
        duration = result.duration_ms or 0.0
        metrics.total_duration_ms += duration
        metrics.max_duration_ms = max(metrics.max_duration_ms, duration)

    async def _after_execution(self, execution: ExecutionResult) -> None:
        stage = Stage.AFTER_EXECUTION
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = AfterExecutionCall(hook=hook, view=self._view(hook), execution=execution)
            await self._invoke(hook, stage, sequence, call, ObserveOutcome)

    async def _synthesize(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput:
        self._set_stage("synthesizing")
        try:
            output = await workflow.execute_activity(
                "synthesize",
                SynthesizeInput(
                    request=self._ask,
                    request_id=self._request_id,
                    plan=plan,
                    execution=ExecutionResult(steps=[s.model_view() for s in execution.steps]),
                    enrichments=self._enrichments,
                    instructions=self._instructions,
                    facts=self._facts,
                ),
                result_type=SynthesizeOutput,
                start_to_close_timeout=timedelta(seconds=self._manifest.settings.synthesize_timeout_seconds),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="synthesize",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            raise stage_failure(decisions.SYNTHESIS_FAILED, "synthesis failed", err)
        self._record.model_response = output.response
        return output

    async def _after_synthesis(self, response: str) -> str:
        stage = Stage.AFTER_SYNTHESIS
        self._set_stage(stage)
        current = response
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = AfterSynthesisCall(hook=hook, view=self._view(hook), response=current)
            outcome, _ = await self._invoke(hook, stage, sequence, call, AfterSynthesisOutcome)
            if outcome is not None:
                current = outcome.response
        return current

    # ------------------------------------------------------------------------------------------------
    # Hook invocation, detached effects and the record
    # ------------------------------------------------------------------------------------------------

    async def _invoke(
        self,
        hook: HookEntry,
        stage: Stage,
        sequence: int,
        call: BaseModel,
        result_type: type[OutcomeT],
        plan_phase: int | None = None,
        *,
        step: PlanStep | None = None,
    ) -> tuple[OutcomeT, None] | tuple[None, HookFailure]:
        """Run one hook invocation as an activity and record it, its decision and its effects, whatever
        its outcome; start the work it detached once it has succeeded."""
        started = workflow.now()
        options: dict[str, Any] = {
            "result_type": result_type,
            "start_to_close_timeout": timedelta(seconds=hook.timeout_seconds),
            "retry_policy": RetryPolicy(
                initial_interval=HOOK_RETRY_INITIAL_INTERVAL,
                maximum_attempts=hook.max_attempts,
                non_retryable_error_types=NON_RETRYABLE_HOOK_FAILURES,
            ),
            "summary": f"{stage.value} · {hook.name}" + (f" · {step.step_id}" if step else ""),
        }
        activity = _HOOK_ACTIVITIES[stage]
        if step is not None:
            plan_phase = self._phase
        invocation = HookInvocation(
            hook=hook.name,
            stage=stage,
            sequence=sequence,
            plan_phase=plan_phase,
            step_id=step.step_id if step else None,
            started_at=started,
            duration_ms=0.0,
            outcome=InvocationOutcome.SUCCEEDED,
        )
        try:
            if hook.run_mode is RunMode.LOCAL_ACTIVITY:
                outcome = await workflow.execute_local_activity(activity, call, **options)
            else:
                outcome = await workflow.execute_activity(activity, call, **options)
        except (ActivityError, ApplicationError, TimeoutError) as err:
            _raise_if_cancelled(err)
            failure = HookFailure.from_error(err, hook)
            invocation.duration_ms = _elapsed_ms(started)
            invocation.outcome = (
                InvocationOutcome.TIMED_OUT if failure.category == decisions.HOOK_TIMEOUT else InvocationOutcome.FAILED
            )
            invocation.error = failure.message
            invocation.error_type = failure.category
            invocation.exception_type = failure.exception_type
            invocation.decision = decisions.failure_decision(hook, stage, failure.category)
            self._record.pipeline_hooks.append(invocation)
            self._record_effects(failure.effects)
            return None, failure
        invocation.duration_ms = _elapsed_ms(started)
        invocation.decision = outcome.decision
        self._record.pipeline_hooks.append(invocation)
        if outcome.state is not None:
            self._hook_state[hook.name] = outcome.state
        self._record_effects(outcome.effects)
        for lease in outcome.leases:
            self._adopt_lease(lease)
        for work in outcome.detached:
            await self._start_detached(work)
        return outcome, None

    def _record_effects(self, effects: list[PipelineHookEffect]) -> None:
        """Add effects; one with an id already recorded replaces it unless that one is terminal."""
        for effect in effects:
            index = next((i for i, e in enumerate(self._record.effects) if e.effect_id == effect.effect_id), None)
            if index is None:
                self._record.effects.append(effect)
            elif self._record.effects[index].status is EffectStatus.PENDING:
                self._record.effects[index] = effect

    async def _start_detached(self, work: DetachedWork) -> None:
        """Start the child that carries a detached effect to its terminal state; it outlives the request."""
        effect = next((e for e in self._record.effects if e.effect_id == work.effect_id), None)
        if effect is None:
            return
        info = workflow.info()
        try:
            await workflow.start_child_workflow(
                DETACHED_WORKFLOW_TYPE,
                DetachedEffectInput(
                    parent_workflow_id=info.workflow_id,
                    parent_run_id=info.run_id,
                    request_id=self._request_id,
                    work=work,
                    effect=effect,
                ),
                id=detached_workflow_id(info.workflow_id, work.effect_id),
                task_queue=info.task_queue,
                parent_close_policy=ParentClosePolicy.ABANDON,
                static_summary=f"{work.stage.value} · {work.hook} · {work.effect_id}",
            )
        except FailureError as err:  # e.g. an effect id this request already used for detached work
            self._record_effects(
                [
                    effect.model_copy(
                        update={
                            "status": EffectStatus.FAILED,
                            "error": f"could not start detached work: {err}",
                            "summary": "submission failed",
                        }
                    )
                ]
            )

    # ------------------------------------------------------------------------------------------------
    # Managed leases: the request owns them, renews them while it runs and releases them on every exit
    # ------------------------------------------------------------------------------------------------

    def _adopt_lease(self, lease: ManagedLease) -> None:
        """Take ownership of a lease a hook declared; a later declaration of the same id replaces the
        lease the loop renews (the latest signal), without a second loop."""
        owner = self._leases.get(lease.lease_id)
        if owner is not None:
            owner.lease = lease
            return
        owner = _LeaseOwner(lease)
        self._leases[lease.lease_id] = owner
        owner.task = asyncio.create_task(self._renew_lease_loop(owner))

    async def _renew_lease_loop(self, owner: _LeaseOwner) -> None:
        """Renew before the TTL runs out, until told to stop. Provider errors are counted, never raised:
        the loop keeps trying while the request runs."""
        while True:
            try:
                await workflow.wait_condition(
                    lambda: owner.stopping,
                    timeout=timedelta(seconds=owner.lease.renew_interval_seconds),
                    timeout_summary=f"renew lease · {owner.lease.lease_id}",
                )
            except asyncio.TimeoutError:  # noqa: UP041 - TimeoutError here is temporalio's
                pass
            if owner.stopping:
                return
            owner.submitted += 1
            lease = owner.lease
            try:
                observed = await workflow.execute_activity(
                    "renew_lease",
                    LeaseCall(
                        lease=lease, request_id=self._request_id, workflow_id=self._record.workflow_id, ordinal=owner.submitted
                    ),
                    result_type=LeaseObservation,
                    start_to_close_timeout=timedelta(seconds=max(1.0, min(30.0, lease.renew_interval_seconds))),
                    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2),
                    summary=f"renew lease · {lease.hook} · {lease.lease_id}",
                )
            except ActivityError as err:
                owner.errors += 1
                owner.last_error = str(getattr(err.cause, "message", None) or err.cause or err)
                continue
            owner.renewed += 1
            if observed.expires_at is not None:
                owner.expires_at = observed.expires_at

    async def _release_leases(self, exit: str) -> None:
        """Stop every renewal loop and join it, then release each lease: cleanup never races a renewal
        and never depends on the request reaching synthesis. Both effects end terminal, with counts."""
        if not self._leases:
            return
        self._set_stage("releasing_leases")
        owners = list(self._leases.values())
        for owner in owners:
            owner.stopping = True
        for owner in owners:
            if owner.task is not None:
                try:
                    await owner.task
                except asyncio.CancelledError:
                    owner.last_error = owner.last_error or "renewal loop cancelled"
        for owner in owners:
            await self._release_lease(owner, exit)

    async def _release_lease(self, owner: _LeaseOwner, exit: str) -> None:
        lease = owner.lease
        error = None
        observed = LeaseObservation()
        try:
            observed = await workflow.execute_activity(
                "release_lease",
                LeaseCall(lease=lease, request_id=self._request_id, workflow_id=self._record.workflow_id, exit=exit),
                result_type=LeaseObservation,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
                summary=f"release lease · {lease.hook} · {lease.lease_id}",
            )
        except ActivityError as err:
            error = str(getattr(err.cause, "message", None) or err.cause or err)
        except asyncio.CancelledError:
            error = "cancelled with the request"
        common = {"lease_id": lease.lease_id, "ttl_seconds": lease.ttl_seconds, "exit": exit}
        renewal = {
            **common,
            "renew_interval_seconds": lease.renew_interval_seconds,
            "loop": "joined",
            "submitted": owner.submitted,
            "returned": owner.renewed,
            "errors": owner.errors,
            "last_error": owner.last_error,
            "last_expires_at": owner.expires_at.isoformat() if owner.expires_at else None,
        }
        cleanup = {
            **common,
            "renewal_joined_first": True,
            "submitted": 1,
            "errors": int(error is not None),
            "provider_call_status": "error" if error else "returned",
            "observed": observed.data,
        }
        self._record_effects(
            [
                self._terminal_lease_effect(
                    lease.renewal_effect_id, lease, renewal, owner.last_error if owner.errors else None,
                    f"renewal loop joined: {owner.submitted} submitted, {owner.errors} error(s)",
                ),
                self._terminal_lease_effect(
                    lease.cleanup_effect_id, lease, cleanup, error,
                    f"release failed: {error}" if error else (observed.summary or "release call returned"),
                ),
            ]
        )

    def _terminal_lease_effect(
        self, effect_id: str, lease: ManagedLease, data: dict[str, Any], error: str | None, summary: str
    ) -> PipelineHookEffect:
        announced = self._record.effect(effect_id)
        started = announced.started_at if announced is not None else None
        return PipelineHookEffect(
            effect_id=effect_id,
            name=announced.name if announced is not None else effect_id,
            status=EffectStatus.FAILED if error else EffectStatus.SUCCEEDED,
            data=bounded_value(data),
            started_at=started,
            duration_ms=max(0.0, _elapsed_ms(started)) if started is not None else None,
            summary=summary,
            error=error,
            hook=lease.hook,
            stage=lease.stage,
        )

    def _apply_enrichment_changes(self, hook: HookEntry, changes: list[EnrichmentChange]) -> None:
        """Merge a hook's changes and record each as the effect ``planning_enrichment:<key>``."""
        now = workflow.now()
        for change in changes:
            if change.operation is EnrichmentOperation.REMOVED:
                self._enrichments.pop(change.key, None)
            else:
                self._enrichments[change.key] = change.after
            self._record.effects.append(
                PipelineHookEffect(
                    effect_id=f"planning_enrichment:{change.key}",
                    name=f"Planning enrichment {change.key}",
                    status=EffectStatus.SUCCEEDED,
                    data={
                        "key": change.key,
                        "operation": change.operation.value,
                        "before": bounded_value(change.before),
                        "after": bounded_value(change.after),
                    },
                    started_at=now,
                    duration_ms=0.0,
                    summary=f"{change.operation.value} by {hook.name}",
                    hook=hook.name,
                    stage=Stage.BEFORE_PLANNING,
                )
            )
        self._record.enrichments = dict(self._enrichments)

    def _view(self, hook: HookEntry, plan_phase: int | None = None) -> HookRequestView:
        return HookRequestView(
            request=self._ask,
            metadata=self._input.metadata,
            request_id=self._request_id,
            workflow_id=self._record.workflow_id,
            enrichments=self._enrichments,
            gate=self._gate,
            plan_phase=plan_phase,
            instructions=self._instructions,
            facts=self._facts,
            state=self._hook_state.get(hook.name, {}),
            leases=list(self._leases),
        )

    def _set_stage(self, stage: str, detail: str = "") -> None:
        self._record.lifecycle_stage = str(stage)
        workflow.set_current_details(f"**stage:** {stage}" + (f" — {detail}" if detail else ""))

    def _upsert_search_attributes(self, stage: str, *, awaiting_review: bool) -> None:
        if self._manifest.search_attributes:
            workflow.upsert_search_attributes(
                [sa.LIFECYCLE_STAGE.value_set(stage), sa.AWAITING_REVIEW.value_set(awaiting_review)]
            )

    async def _finish(self, status: RequestStatus, error: RequestError | None = None) -> None:
        self._record.status = status
        self._record.error = error
        self._record.lifecycle_stage = "completed" if status is RequestStatus.SUCCEEDED else str(status)
        self._record.completed_at = workflow.now()
        self._upsert_search_attributes(self._record.lifecycle_stage, awaiting_review=False)
        await self._persist(LifecycleBoundary.TERMINAL)

    async def _persist(self, boundary: LifecycleBoundary) -> None:
        """Persist the full snapshot with a higher revision; never masks the request outcome. A cancel
        arriving meanwhile cancels the request, except at the terminal boundary, where the snapshot is
        written again so the record still says how the request ended."""
        self._record.record_revision += 1
        completion = {
            RequestStatus.SUCCEEDED: "completed",
            RequestStatus.STOPPED: "stopped",
            RequestStatus.FAILED: "failed",
            RequestStatus.CANCELLED: "cancelled",
        }.get(self._record.status, "pending")
        self._record.lifecycle = RecordLifecycle(
            boundary=boundary, completion=completion, snapshot_revision=self._record.record_revision
        )
        for attempt in (1, 2):
            try:
                await workflow.execute_activity(
                    "persist_execution_record",
                    PersistRecordInput(record=self._record),
                    result_type=PersistRecordOutput,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(maximum_attempts=5),
                    summary=f"persist record · {boundary.value} · revision {self._record.record_revision}",
                )
                return
            except ActivityError as err:
                if boundary is not LifecycleBoundary.TERMINAL:
                    _raise_if_cancelled(err)
                elif attempt == 1 and isinstance(err.cause, CancelledError):
                    continue
                workflow.logger.warning(
                    "execution record revision %s was not persisted: %s", self._record.record_revision, err.cause
                )
                return


class _LeaseOwner:
    """The request's ownership of one managed lease: the latest declaration, its renewal loop and counts."""

    def __init__(self, lease: ManagedLease) -> None:
        self.lease = lease
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.submitted = 0  # renewal activities scheduled
        self.renewed = 0  # ... whose provider call returned
        self.errors = 0  # ... that ended in an error after their retries
        self.last_error: str | None = None
        self.expires_at: datetime | None = None


class _RunStopped(Exception):
    """An extension stopped the run with its own answer (internal: caught by ``run``)."""

    def __init__(self, extension: str, phase: str, reason: str, text: str) -> None:
        super().__init__(f"{extension} stopped the run at {phase}: {reason}")
        self.extension, self.phase, self.reason, self.text = extension, phase, reason, text


_ERROR_ORIGINS = {
    decisions.EXTENSION_ERROR: "extension",
    decisions.PLANNING_FAILED: "planner",
    decisions.SYNTHESIS_FAILED: "synthesizer",
    decisions.REQUIRED_AFTER_PLANNING_ERROR: "hook",
    decisions.HOOK_CONTRACT_ERROR: "hook",
    decisions.PIPELINE_UNAVAILABLE: "config",
    CHECKPOINT_REJECTED: "confirmation",
    CHECKPOINT_EXPIRED: "confirmation",
    "Cancelled": "cancelled",
}


def _extension_error(hook: HookEntry, stage: Stage, failure: HookFailure) -> ApplicationError:
    """A deciding or transforming hook failed: the run ends (seed 003 ``GoliathExtensionError``)."""
    return ApplicationError(
        f"extension {hook.name!r} failed at {stage.value}: {failure.message}",
        {
            "extension": hook.name,
            "phase": stage.value,
            "cause": failure.message,
            "cause_type": failure.category,
            "exception_type": failure.exception_type,
        },
        type=decisions.EXTENSION_ERROR,
        non_retryable=True,
    )


def _raise_if_cancelled(err: BaseException) -> None:
    """An activity cancelled because the request was cancelled ends the request as cancelled, not as a
    hook error or a failed stage."""
    if isinstance(err, CancelledError) or isinstance(getattr(err, "cause", None), CancelledError):
        raise asyncio.CancelledError() from err


def _elapsed_ms(started: datetime) -> float:
    return (workflow.now() - started).total_seconds() * 1000.0
