"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, JsonValue

    from . import decisions
    from .models import (
        ENRICHMENT_CONVERSATION_HISTORY,
        ENRICHMENT_RAG_CONTEXT,
        MAX_RECORDED_PROMPT_CHARS,
        METADATA_CONVERSATION_TURNS,
        AcceptedPlan,
        AfterPlanningCall,
        AfterPlanningOutcome,
        AfterExecutionCall,
        AfterSynthesisCall,
        AfterSynthesisOutcome,
        BeforePlanningCall,
        BeforePlanningOutcome,
        DecisionAction,
        EffectStatus,
        EnrichmentChange,
        EnrichmentOperation,
        ExecutionRecord,
        ExecutionResult,
        GateState,
        HookDecision,
        HookEntry,
        HookInvocation,
        HookRequestView,
        InvocationOutcome,
        ObserveOutcome,
        PersistRecordInput,
        PersistRecordOutput,
        PipelineHookEffect,
        PipelineManifest,
        Plan,
        PlanInput,
        PlanOutput,
        PlanStep,
        RequestError,
        RequestInput,
        RequestResult,
        RequestStatus,
        ResolvePipelineInput,
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

WORKFLOW_TYPE = "RequestLifecycle"
MAX_CONVERSATION_TURNS = 20
HOOK_RETRY_INITIAL_INTERVAL = timedelta(milliseconds=200)
# Hook failures that retrying cannot change.
NON_RETRYABLE_HOOK_FAILURES = [
    decisions.HOOK_CONTRACT_ERROR,
    decisions.INVALID_HOOK_RESULT,
    decisions.INVALID_PLAN,
]
_HOOK_ACTIVITIES = {
    Stage.BEFORE_PLANNING: "before_planning_hook",
    Stage.AFTER_PLANNING: "after_planning_hook",
    Stage.AFTER_EXECUTION: "after_execution_hook",
    Stage.AFTER_SYNTHESIS: "after_synthesis_hook",
}

OutcomeT = TypeVar("OutcomeT", bound=BaseModel)


class HookFailure(BaseModel):
    """Why a hook invocation did not produce an outcome."""

    category: str
    message: str
    exception_type: str | None = None

    @classmethod
    def from_activity_error(cls, err: FailureError, hook: HookEntry) -> HookFailure:
        # A regular activity's failure arrives wrapped in ActivityError; a local activity's arrives bare.
        cause = err.cause if isinstance(err, ActivityError) else err
        if isinstance(cause, TimeoutError):
            return cls(
                category=decisions.HOOK_TIMEOUT,
                message=f"hook did not finish within {hook.timeout_seconds:g}s ({cause.type.name.lower()})",
            )
        if isinstance(cause, ApplicationError):
            details = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
            known = {decisions.HOOK_ERROR, *NON_RETRYABLE_HOOK_FAILURES}
            return cls(
                category=cause.type if cause.type in known else decisions.HOOK_ERROR,
                message=cause.message,
                exception_type=details.get("exception_type"),
            )
        return cls(category=decisions.HOOK_ERROR, message=str(cause or err))


def idempotency_key(workflow_id: str, step_id: str) -> str:
    """The key a tool receives for a step: stable across activity retries and worker restarts."""
    digest = hashlib.sha256(f"{workflow_id}\x00{step_id}".encode()).hexdigest()[:32]
    return f"{step_id}-{digest}"


def promote_metadata(metadata: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """Seed 000 §5.4: lift ``rag_context`` and conversation history out of request metadata."""
    promoted: dict[str, JsonValue] = {}
    rag = metadata.get(ENRICHMENT_RAG_CONTEXT)
    if isinstance(rag, str) and rag.strip():
        promoted[ENRICHMENT_RAG_CONTEXT] = rag
    history = metadata.get(ENRICHMENT_CONVERSATION_HISTORY)
    turns = metadata.get(METADATA_CONVERSATION_TURNS)
    if isinstance(history, str) and history.strip():
        promoted[ENRICHMENT_CONVERSATION_HISTORY] = history
    elif isinstance(turns, list) and turns:
        lines = []
        for turn in turns[-MAX_CONVERSATION_TURNS:]:
            if isinstance(turn, dict) and isinstance(turn.get("content"), str):
                lines.append(f"{turn.get('role', 'user')}: {turn['content']}")
        if lines:
            promoted[ENRICHMENT_CONVERSATION_HISTORY] = "\n".join(lines)
    return promoted


@workflow.defn(name=WORKFLOW_TYPE)
class RequestLifecycleWorkflow:
    """One agent request: before_planning → plan → after_planning → execute → after_execution →
    synthesize → after_synthesis, each hook invocation its own activity."""

    @workflow.init
    def __init__(self, input: RequestInput) -> None:
        info = workflow.info()
        self._input = input
        self._request_id = input.request_id or info.workflow_id
        self._manifest = PipelineManifest(pipeline="unresolved")
        self._enrichments: dict[str, JsonValue] = {}
        self._gate = GateState()
        self._record = ExecutionRecord(
            request_id=self._request_id,
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            request=input.request,
            metadata=input.metadata,
            started_at=workflow.now(),
        )

    @workflow.query(name="execution_record")
    def execution_record(self) -> ExecutionRecord:
        """The execution record as it stands: every invocation, decision and effect so far."""
        return self._record

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

    # ------------------------------------------------------------------------------------------------
    # The lifecycle
    # ------------------------------------------------------------------------------------------------

    async def _lifecycle(self) -> RequestResult:
        await self._resolve_pipeline()
        self._enrichments = promote_metadata(self._input.metadata)
        self._record.promoted_enrichments = sorted(self._enrichments)
        self._record.enrichments = dict(self._enrichments)

        short_circuit = await self._before_planning()
        if short_circuit is not None:
            return short_circuit

        plan = await self._plan(phase=1)
        plan = await self._after_planning(plan)
        execution = await self._execute(plan)
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
            raise _stage_failure(decisions.PIPELINE_UNAVAILABLE, "could not resolve the hook pipeline", err)
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
            self._record.effects.extend(outcome.effects)
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
                ),
                result_type=PlanOutput,
                start_to_close_timeout=timedelta(seconds=settings.plan_timeout_seconds),
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[decisions.INVALID_PLAN]),
                summary=f"plan · phase {phase}",
            )
        except ActivityError as err:
            raise _stage_failure(decisions.PLANNING_FAILED, "planning failed", err)
        self._record.planning_prompt = output.prompt[:MAX_RECORDED_PROMPT_CHARS]
        self._record.planner = output.planner
        return output.plan

    async def _after_planning(self, plan: Plan) -> Plan:
        """Chain copy-on-write mutations; the required hook's failure ends the request (seed 000 §4.2)."""
        stage = Stage.AFTER_PLANNING
        self._set_stage(stage)
        current = plan
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = AfterPlanningCall(hook=hook, view=self._view(plan_phase=plan.phase), plan=current)
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

    async def _execute(self, plan: Plan) -> ExecutionResult:
        """One activity per step; a step starts when everything it depends on has succeeded."""
        self._set_stage("executing")
        results: dict[str, StepResult] = {}
        waiting = list(plan.steps)
        running: dict[asyncio.Task[StepResult], str] = {}
        while waiting or running:
            for step in list(waiting):
                deps = [results.get(d) for d in step.depends_on]
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
            output = await workflow.execute_activity(
                "execute_tool_step",
                ToolStepInput(step=step, request_id=self._request_id, idempotency_key=key),
                result_type=ToolStepOutput,
                start_to_close_timeout=timedelta(seconds=settings.tool_timeout_seconds),
                retry_policy=RetryPolicy(
                    maximum_attempts=settings.tool_max_attempts, non_retryable_error_types=["InvalidArguments"]
                ),
                summary=f"execute · {step.tool} ({step.step_id})",
            )
        except ActivityError as err:
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
            raise _stage_failure(decisions.SYNTHESIS_FAILED, "synthesis failed", err)
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
    # Hook invocation and the record
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
        """Run one hook invocation as an activity and record it, whatever its outcome."""
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
            failure = HookFailure.from_activity_error(err, hook)
            invocation.duration_ms = _elapsed_ms(started)
            invocation.outcome = (
                InvocationOutcome.TIMED_OUT if failure.category == decisions.HOOK_TIMEOUT else InvocationOutcome.FAILED
            )
            invocation.error = failure.message
            invocation.error_type = failure.category
            invocation.exception_type = failure.exception_type
            invocation.decision = decisions.failure_decision(hook, stage, failure.category)
            self._record.pipeline_hooks.append(invocation)
            return None, failure
        invocation.duration_ms = _elapsed_ms(started)
        invocation.decision = outcome.decision
        self._record.pipeline_hooks.append(invocation)
        if stage is not Stage.BEFORE_PLANNING:
            self._record.effects.extend(outcome.effects)
        return outcome, None

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

    def _set_stage(self, stage: str) -> None:
        self._record.lifecycle_stage = str(stage)
        workflow.set_current_details(f"**stage:** {stage}")

    async def _finish(self, status: RequestStatus, error: RequestError | None = None) -> None:
        self._record.status = status
        self._record.error = error
        self._record.lifecycle_stage = "completed" if status is RequestStatus.SUCCEEDED else str(status)
        self._record.completed_at = workflow.now()
        await self._persist()

    async def _persist(self) -> None:
        """Persist the full snapshot with a higher ``record_revision``; never masks the request outcome."""
        self._record.record_revision += 1
        try:
            await workflow.execute_activity(
                "persist_execution_record",
                PersistRecordInput(record=self._record),
                result_type=PersistRecordOutput,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary=f"persist record · revision {self._record.record_revision}",
            )
        except ActivityError as err:
            workflow.logger.warning("execution record revision %s was not persisted: %s", self._record.record_revision, err.cause)


def _elapsed_ms(started: datetime) -> float:
    return (workflow.now() - started).total_seconds() * 1000.0


def _stage_failure(error_type: str, message: str, err: ActivityError) -> ApplicationError:
    cause = err.cause
    cause_message = getattr(cause, "message", None) or str(cause or err)
    return ApplicationError(
        f"{message}: {cause_message}",
        {"cause": cause_message, "cause_type": getattr(cause, "type", None) or type(cause).__name__},
        type=error_type,
        non_retryable=True,
    )
