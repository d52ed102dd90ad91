"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models.
"""

from __future__ import annotations

import asyncio
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
        AfterPlanningCall,
        AfterPlanningOutcome,
        AfterSynthesisCall,
        AfterSynthesisOutcome,
        ApprovalReason,
        ApproveSignal,
        BeforePlanningCall,
        BeforePlanningOutcome,
        Checkpoint,
        CheckpointStatus,
        DecisionAction,
        DetachedEffectInput,
        DetachedWork,
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
        LifecycleBoundary,
        ObserveOutcome,
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
        RequestError,
        RequestInput,
        RequestResult,
        RequestStatus,
        ResolvePipelineInput,
        ReviewAck,
        ReviewRequest,
        RunMode,
        ShortCircuitInfo,
        ShortCircuitProposal,
        Stage,
        StepResult,
        StepStatus,
        StepSummary,
        SynthesizeInput,
        SynthesizeOutput,
        ToolStepInput,
        ToolStepOutput,
        bounded_value,
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
_HOOK_ACTIVITIES = {
    Stage.BEFORE_PLANNING: "before_planning_hook",
    Stage.AFTER_PLANNING: "after_planning_hook",
    Stage.AFTER_EXECUTION: "after_execution_hook",
    Stage.AFTER_SYNTHESIS: "after_synthesis_hook",
}

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
        except ApplicationError as err:
            details = err.details[0] if err.details and isinstance(err.details[0], dict) else {}
            await self._finish(
                RequestStatus.FAILED, RequestError(type=err.type or "ApplicationError", message=err.message, details=details)
            )
            raise
        except asyncio.CancelledError:
            await self._finish(
                RequestStatus.CANCELLED, RequestError(type="Cancelled", message="the request was cancelled")
            )
            raise
        await self._finish(RequestStatus.SUCCEEDED)
        return result

    async def _lifecycle(self) -> RequestResult:
        await self._resolve_pipeline()
        self._enrichments = promote_metadata(self._input.metadata)
        self._record.promoted_enrichments = sorted(self._enrichments)
        self._record.enrichments = dict(self._enrichments)

        short_circuit = await self._before_planning()
        if short_circuit is not None:
            return short_circuit

        plan = await self._run_phases()
        execution = ExecutionResult(steps=list(self._record.steps))
        await self._after_execution(execution)
        synthesis = await self._synthesize(plan, execution)
        response = await self._after_synthesis(synthesis.response)

        self._record.final_response = response
        self._record.confidence = synthesis.confidence
        return RequestResult(
            request_id=self._request_id,
            workflow_id=self._record.workflow_id,
            response=response,
            confidence=synthesis.confidence,
            metadata={"pipeline": self._manifest.pipeline, "planner": self._record.planner},
            steps=[StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in execution.steps],
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
            call = BeforePlanningCall(hook=hook, view=self._view())
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
                    request=self._input.request,
                    request_id=self._request_id,
                    workflow_id=self._record.workflow_id,
                    enrichments=self._enrichments,
                    phase=phase,
                    prior_results=self._record.steps,
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
                hook=hook, view=self._view(plan_phase=plan.phase), plan=current, prior_step_ids=prior_step_ids
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
        phase, ``implicit_deps`` in earlier ones) has succeeded."""
        self._set_stage("executing")
        results = self._results
        waiting = list(plan.steps)
        running: dict[asyncio.Task[StepResult], str] = {}
        while waiting or running:
            for step in list(waiting):
                deps = [results.get(d) for d in [*step.depends_on, *step.implicit_deps]]
                if any(d is None for d in deps):
                    continue
                waiting.remove(step)
                blocked = [d.step_id for d in deps if d.status is not StepStatus.SUCCEEDED]
                if blocked:
                    results[step.step_id] = StepResult(
                        step_id=step.step_id,
                        tool=step.tool,
                        status=StepStatus.SKIPPED,
                        skip_reason=f"dependency_not_succeeded: {', '.join(blocked)}",
                    )
                    continue
                running[asyncio.ensure_future(self._run_step(step))] = step.step_id
            if not running:
                # Only reachable with a plan that bypassed validation: never wait on what cannot finish.
                for step in waiting:
                    results[step.step_id] = StepResult(
                        step_id=step.step_id, tool=step.tool, status=StepStatus.SKIPPED, skip_reason="unresolvable_dependency"
                    )
                waiting.clear()
                continue
            done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                running.pop(task)
                result = task.result()
                results[result.step_id] = result
        execution = ExecutionResult(steps=[results[s.step_id] for s in plan.steps])
        self._record.steps.extend(execution.steps)
        return execution

    async def _run_step(self, step: PlanStep) -> StepResult:
        settings = self._manifest.settings
        key = idempotency_key(self._record.workflow_id, step.step_id)
        started = workflow.now()
        base = {"step_id": step.step_id, "tool": step.tool, "idempotency_key": key, "started_at": started}
        try:
            arguments = resolve_references(step.arguments, self._results)
        except UnresolvedReference as err:
            return StepResult(**base, status=StepStatus.FAILED, error=str(err), error_type="UnresolvedReference", duration_ms=0.0)
        try:
            output = await workflow.execute_activity(
                "execute_tool_step",
                ToolStepInput(
                    step=step.model_copy(update={"arguments": arguments}), request_id=self._request_id, idempotency_key=key
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
            return StepResult(
                **base,
                status=StepStatus.FAILED,
                error=getattr(cause, "message", None) or str(cause or err),
                error_type=getattr(cause, "type", None) or type(cause).__name__,
                duration_ms=_elapsed_ms(started),
            )
        return StepResult(**base, status=StepStatus.SUCCEEDED, output=output.output, duration_ms=_elapsed_ms(started))

    async def _after_execution(self, execution: ExecutionResult) -> None:
        stage = Stage.AFTER_EXECUTION
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = AfterExecutionCall(hook=hook, view=self._view(), execution=execution)
            await self._invoke(hook, stage, sequence, call, ObserveOutcome)

    async def _synthesize(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput:
        self._set_stage("synthesizing")
        try:
            output = await workflow.execute_activity(
                "synthesize",
                SynthesizeInput(
                    request=self._input.request,
                    request_id=self._request_id,
                    plan=plan,
                    execution=execution,
                    enrichments=self._enrichments,
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
            call = AfterSynthesisCall(hook=hook, view=self._view(), response=current)
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
            "summary": f"{stage.value} · {hook.name}",
        }
        activity = _HOOK_ACTIVITIES[stage]
        invocation = HookInvocation(
            hook=hook.name,
            stage=stage,
            sequence=sequence,
            plan_phase=plan_phase,
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
        self._record_effects(outcome.effects)
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

    def _view(self, plan_phase: int | None = None) -> HookRequestView:
        return HookRequestView(
            request=self._input.request,
            metadata=self._input.metadata,
            request_id=self._request_id,
            workflow_id=self._record.workflow_id,
            enrichments=self._enrichments,
            gate=self._gate,
            plan_phase=plan_phase,
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
        """Persist the full snapshot with a higher revision; never masks the request outcome."""
        self._record.record_revision += 1
        completion = {
            RequestStatus.SUCCEEDED: "completed",
            RequestStatus.FAILED: "failed",
            RequestStatus.CANCELLED: "cancelled",
        }.get(self._record.status, "pending")
        self._record.lifecycle = RecordLifecycle(
            boundary=boundary, completion=completion, snapshot_revision=self._record.record_revision
        )
        try:
            await workflow.execute_activity(
                "persist_execution_record",
                PersistRecordInput(record=self._record),
                result_type=PersistRecordOutput,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary=f"persist record · {boundary.value} · revision {self._record.record_revision}",
            )
        except ActivityError as err:
            workflow.logger.warning("execution record revision %s was not persisted: %s", self._record.record_revision, err.cause)


def _raise_if_cancelled(err: BaseException) -> None:
    """An activity cancelled because the request was cancelled ends the request as cancelled, not as a
    hook error or a failed stage."""
    if isinstance(err, CancelledError) or isinstance(getattr(err, "cause", None), CancelledError):
        raise asyncio.CancelledError() from err


def _elapsed_ms(started: datetime) -> float:
    return (workflow.now() - started).total_seconds() * 1000.0
