"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError, TimeoutError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, JsonValue

    from . import decisions, dispatch
    from . import search_attributes as sa
    from .detached import DETACHED_WORKFLOW_TYPE, EFFECT_UPDATE_SIGNAL, detached_workflow_id
    from .leases import ManagedLeases, elapsed_ms
    from .models import (
        MAX_IGNORED_MESSAGES,
        MAX_INBOUND_PAYLOAD_BYTES,
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
        CacheVerdict,
        Checkpoint,
        CheckpointStatus,
        DecisionAction,
        DetachedEffectInput,
        DetachedWork,
        Diagnostic,
        EffectStatus,
        EffectUpdateSignal,
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
        MemoryCandidate,
        MemoryOutcome,
        ModelDraft,
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
        WorkerLoss,
        bounded_value,
        subagent_depth,
    )
    from .plan_validation import UnresolvedReference, resolve_references
    from .support import (
        NON_RETRYABLE_HOOK_FAILURES,
        HookFailure,
        approval_reasons,
        decode_payload,
        idempotency_key,
        promote_metadata,
        stage_failure,
    )

WORKFLOW_TYPE = "RequestLifecycle"
CHECKPOINT_REJECTED = "CheckpointRejected"
CHECKPOINT_EXPIRED = "CheckpointExpired"
INVALID_REVIEW = "InvalidReview"
INVALID_QUERY = "InvalidQuery"
HOOK_RETRY_INITIAL_INTERVAL = timedelta(milliseconds=200)
_HOOK_ACTIVITIES = {stage: f"{stage.value}_hook" for stage in Stage}

OutcomeT = TypeVar("OutcomeT", bound=HookOutcome)
SignalT = TypeVar("SignalT", ApproveSignal, RejectSignal, EffectUpdateSignal)
ResultT = TypeVar("ResultT")


@workflow.defn(name=WORKFLOW_TYPE)
class RequestLifecycleWorkflow:
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
        self._phase = 1
        self._ask = self._input.request
        self._instructions = ""
        self._facts: dict[str, JsonValue] = {}
        self._hook_state: dict[str, dict[str, JsonValue]] = {}
        self._leases = ManagedLeases(self._request_id, info.workflow_id)
        self._detached_tokens: dict[str, str] = {}  # effect id -> the token its DetachedEffect child sends back
        self._synthesized: str | None = None  # the answer after after_synthesis (what a cache may store)
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
        """The checkpoint waiting for a reviewer, or null."""
        _no_arguments("pending_checkpoint", args)
        return next((c for c in self._record.checkpoints if c.status is CheckpointStatus.PENDING), None)

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
            self._ignore(via, str(fields.get("checkpoint_id", ""))[:200], str(fields.get("reviewer", ""))[:200], f"malformed {via} signal: {problem}")
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
            self._record_effects(
                [effect.model_copy(update={"hook": announced.hook, "stage": announced.stage, "data": bounded_value(effect.data)})]
            )

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
            self._record.ignored_reviews.append(IgnoredReview.clipped(workflow.now(), via, checkpoint_id, reviewer, reason))
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
            raise ApplicationError(self._input_problem, type=decisions.INVALID_REQUEST, non_retryable=True)
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
            cache = self._cache_verdict(outcome)
            self._record.cache = cache.model_copy(update={"response": None})
            await self._finalize(outcome, response=response, error=self._error_view(error) if error else None, cache=cache)
        finally:
            await self._finish(status, error)

    def _cache_verdict(self, outcome: str) -> CacheVerdict:
        """Whether a response cache may store this run's answer: only a completed run that did nothing
        but read — its executed steps all succeeded and call read_only tools — with no checkpoint, no
        stop and every hook invocation succeeded, so a cached answer never stands in for a side effect
        or for a protection that did not run."""
        record = self._record
        reasons = []
        if outcome != "completed":
            reasons.append(f"the run {'was ' if outcome in ('stopped', 'cancelled') else 'ended in '}{outcome}")
        if record.short_circuit is not None:
            reasons.append(f"answered by a short-circuit ({record.short_circuit.reason})")
        if record.checkpoints:
            reasons.append("a checkpoint was opened")
        if record.phase_cap_reached:
            reasons.append("the planning phase cap was reached")
        read_only = {f"{t.agent}/{t.capability}": t.read_only for t in self._manifest.tools}
        for step in record.steps:
            if step.status is not StepStatus.SUCCEEDED:
                reasons.append(f"step {step.step_id} {step.status.value}")
            elif not read_only.get(step.tool, False):
                reasons.append(f"step {step.step_id} calls {step.tool}, which is not read_only")
        for invocation in record.pipeline_hooks:
            if invocation.outcome is not InvocationOutcome.SUCCEEDED:
                reasons.append(f"hook {invocation.hook} {invocation.outcome.value} at {invocation.stage.value}")
        if self._synthesized is None:
            reasons.append("no synthesized answer")
        if reasons:
            return CacheVerdict(cacheable=False, reasons=reasons[:10])
        return CacheVerdict(cacheable=True, response=self._synthesized)

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
        """Rewrite the ask, instructions or facts, or stop the run (seed 003 ``beforeRun``)."""
        stage = Stage.BEFORE_RUN
        self._set_stage(stage)
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            run = RunView(ask=self._ask, instructions=self._instructions, facts=self._facts)
            outcome, failure = await self._invoke(hook, stage, sequence, BeforeRunCall(hook=hook, view=self._view(hook), run=run), BeforeRunOutcome)
            if outcome is None:
                _raise_if_terminal(hook, stage, failure)
                continue
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
                _raise_if_terminal(hook, stage, failure)
                continue
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
                _raise_if_terminal(hook, stage, failure)
                continue
            if outcome.skip is not None:
                self._record.memory = MemoryOutcome(
                    action="skipped", conversation_id=candidate.conversation_id, by=hook.name, reason=outcome.skip.reason
                )
                return
            if outcome.candidate != candidate:
                candidate, replaced_by = outcome.candidate, hook.name
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
            _raise_if_cancelled(err)
            self._record.diagnostics.append(
                Diagnostic(extension="(memory)", phase="remember", error=_error_text(err), error_type="MemoryError")
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
                    cache=cache or CacheVerdict(reasons=["not decided"]),
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
            except ApplicationError as err:  # workers kept dying under it: still only a diagnostic here
                failure = HookFailure(category=err.type or decisions.WORKER_LOST, message=err.message)
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
            self._manifest = await self._activity(
                "resolve_pipeline",
                ResolvePipelineInput(request_id=self._request_id, metadata=self._input.metadata),
                result_type=PipelineManifest,
                timeout=30,
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
                _raise_if_terminal(hook, stage, failure)
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
            output = await self._activity(
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
                timeout=settings.plan_timeout_seconds,
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
        started = workflow.now()
        result = StepResult(step_id=step.step_id, tool=step.tool, status=StepStatus.SKIPPED, started_at=started)
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
                _raise_if_terminal(hook, stage, failure)
                continue
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
        result.duration_ms = elapsed_ms(started)
        if result.status is StepStatus.FAILED:
            result.result = f"error: {result.error}"
            await self._on_tool_error(step, call, result)

    async def _call_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Execute the tool; if it fails after its retries, offer the error to on_tool_error hooks."""
        if call.subagent:
            await self._call_subagent(step, call, result)
            return
        settings = self._manifest.settings
        info = workflow.info()
        # Keyed by run and by the arguments as executed: every retry of this call (and a dispatch after a
        # lost worker) carries the same key; another run or another call never does.
        result.idempotency_key = idempotency_key(info.workflow_id, info.first_execution_run_id, step.step_id, call.arguments)
        started = workflow.now()
        try:
            output = await self._activity(
                "execute_tool_step",
                ToolStepInput(
                    step=step.model_copy(update={"arguments": call.arguments}),
                    request_id=self._request_id,
                    idempotency_key=result.idempotency_key,
                ),
                result_type=ToolStepOutput,
                timeout=settings.tool_timeout_seconds,
                retry_policy=RetryPolicy(
                    maximum_attempts=settings.tool_max_attempts, non_retryable_error_types=["InvalidArguments"]
                ),
                summary=f"execute · {step.tool} ({step.step_id})",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            cause = err.cause
            result.duration_ms = elapsed_ms(started)
            result.status = StepStatus.FAILED
            result.error = getattr(cause, "message", None) or str(cause or err)
            result.error_type = getattr(cause, "type", None) or type(cause).__name__
            result.result = f"error: {result.error}"
            await self._on_tool_error(step, call, result)
            return
        result.duration_ms = elapsed_ms(started)
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
                _raise_if_terminal(hook, stage, failure)
                continue
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
                _raise_if_terminal(hook, stage, failure)
                continue
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
            _, failure = await self._invoke(hook, stage, sequence, call, ObserveOutcome)
            if failure is not None:
                _raise_if_terminal(hook, stage, failure)

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
                ),
                result_type=SynthesizeOutput,
                timeout=self._manifest.settings.synthesize_timeout_seconds,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="synthesize",
            )
        except ActivityError as err:
            _raise_if_cancelled(err)
            raise stage_failure(decisions.SYNTHESIS_FAILED, "synthesis failed", err)
        # The draft is not yet guarded: the record keeps it by digest and a masked preview only.
        self._record.model_draft = output.draft or ModelDraft.of(output.response)
        return output

    async def _after_synthesis(self, response: str) -> str:
        stage = Stage.AFTER_SYNTHESIS
        self._set_stage(stage)
        current = response
        for sequence, hook in enumerate(self._manifest.participants(stage), start=1):
            call = AfterSynthesisCall(hook=hook, view=self._view(hook), response=current)
            outcome, failure = await self._invoke(hook, stage, sequence, call, AfterSynthesisOutcome)
            if outcome is None:
                # A fail-closed hook (redaction, say) ends the request: its unguarded input never goes out.
                _raise_if_terminal(hook, stage, failure)
                continue
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
        its outcome; start the work it detached once it has succeeded. A lost worker dispatches the
        invocation again (its attempts stay the hook's own); workers lost on every dispatch end the
        request with ``WorkerLost``, recorded as such, never as the hook's verdict."""
        started = workflow.now()
        summary = f"{stage.value} · {hook.name}" + (f" · {step.step_id}" if step else "")
        activity = _HOOK_ACTIVITIES[stage]
        retry = RetryPolicy(
            initial_interval=HOOK_RETRY_INITIAL_INTERVAL,
            maximum_attempts=hook.max_attempts,
            non_retryable_error_types=NON_RETRYABLE_HOOK_FAILURES,
        )
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

        def lost(n: int) -> None:
            invocation.worker_losses = n

        try:
            if hook.run_mode is RunMode.LOCAL_ACTIVITY:
                outcome = await workflow.execute_local_activity(
                    activity,
                    call,
                    result_type=result_type,
                    start_to_close_timeout=timedelta(seconds=hook.timeout_seconds),
                    retry_policy=retry,
                    summary=summary,
                )
            else:
                outcome = await self._activity(
                    activity, call, result_type=result_type, timeout=hook.timeout_seconds, retry_policy=retry,
                    summary=summary, on_worker_lost=lost,
                )
        except (ActivityError, ApplicationError, TimeoutError) as err:
            _raise_if_cancelled(err)
            failure = HookFailure.from_error(err, hook)
            invocation.duration_ms = elapsed_ms(started)
            invocation.outcome = _INVOCATION_OUTCOMES.get(failure.category, InvocationOutcome.FAILED)
            invocation.error = failure.message
            invocation.error_type = failure.category
            invocation.exception_type = failure.exception_type
            invocation.decision = failure.decision = decisions.failure_decision(hook, stage, failure.category)
            self._record.pipeline_hooks.append(invocation)
            self._record_effects(failure.effects)
            if failure.category == decisions.WORKER_LOST:
                raise
            return None, failure
        invocation.duration_ms = elapsed_ms(started)
        invocation.decision = outcome.decision
        self._record.pipeline_hooks.append(invocation)
        if outcome.state is not None:
            self._hook_state[hook.name] = outcome.state
        self._record_effects(outcome.effects)
        for lease in outcome.leases:
            self._leases.adopt(lease, self._manifest.settings)
        for work in outcome.detached:
            await self._start_detached(work)
        return outcome, None

    async def _activity(
        self,
        activity: str,
        arg: Any,
        *,
        result_type: type[ResultT],
        timeout: float,
        retry_policy: RetryPolicy,
        summary: str,
        on_worker_lost: Callable[[int], None] | None = None,
    ) -> ResultT:
        """Schedule one of the framework's activities: heartbeated, dispatched again when its worker is
        lost (each loss kept in the record), ``WorkerLost`` after the pipeline's limit of lost dispatches."""
        settings = self._manifest.settings

        def lost(n: int) -> None:
            self._note_worker_lost(activity, summary, n)
            if on_worker_lost is not None:
                on_worker_lost(n)

        return await dispatch.execute(
            activity,
            arg,
            result_type=result_type,
            start_to_close_timeout=timedelta(seconds=timeout),
            retry_policy=retry_policy,
            summary=summary,
            heartbeat_ceiling=timedelta(seconds=settings.heartbeat_timeout_seconds),
            max_worker_losses=settings.max_worker_losses,
            on_worker_lost=lost,
        )

    def _note_worker_lost(self, activity: str, summary: str, dispatch_number: int) -> None:
        workflow.logger.warning("worker lost under %s (dispatch %s); dispatching it again", summary, dispatch_number)
        if len(self._record.worker_losses) < MAX_IGNORED_MESSAGES:
            self._record.worker_losses.append(
                WorkerLoss(activity=activity, summary=summary, at=workflow.now(), dispatch=dispatch_number)
            )

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
        token = workflow.uuid4().hex
        self._detached_tokens[work.effect_id] = token  # before the start: the child may report in the same task
        settings = self._manifest.settings
        try:
            await workflow.start_child_workflow(
                DETACHED_WORKFLOW_TYPE,
                DetachedEffectInput(
                    parent_workflow_id=info.workflow_id,
                    parent_run_id=info.run_id,
                    request_id=self._request_id,
                    work=work,
                    effect=effect,
                    update_token=token,
                    heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
                    max_worker_losses=settings.max_worker_losses,
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
            del self._detached_tokens[work.effect_id]

    async def _release_leases(self, exit: str) -> None:
        """Stop and join every lease keeper, then release each lease (see ``workflows.leases``)."""
        if not self._leases:
            return
        self._set_stage("releasing_leases")
        self._record_effects(
            await self._leases.release_all(exit, self._manifest.settings, self._record.effect, self._note_worker_lost)
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
            leases=self._leases.ids,
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
                await self._activity(
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
                    _raise_if_cancelled(err)
                    if isinstance(err, ApplicationError):
                        raise
                elif attempt == 1 and isinstance(err, ActivityError) and isinstance(err.cause, CancelledError):
                    continue
                workflow.logger.warning(
                    "execution record revision %s was not persisted: %s", self._record.record_revision, _error_text(err)
                )
                return


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
    decisions.WORKER_LOST: "infrastructure",
    "Cancelled": "cancelled",
}
_INVOCATION_OUTCOMES = {
    decisions.HOOK_TIMEOUT: InvocationOutcome.TIMED_OUT,
    decisions.WORKER_LOST: InvocationOutcome.WORKER_LOST,
}


def _extension_error(hook: HookEntry, stage: Stage, failure: HookFailure) -> ApplicationError:
    """A hook that fails closed failed: the run ends, naming the hook, the stage and the cause."""
    return ApplicationError(
        f"extension {hook.name!r} failed at {stage.value}: {failure.message}",
        {
            "extension": hook.name,
            "phase": stage.value,
            "cause": failure.message,
            "cause_type": failure.category,
            "exception_type": failure.exception_type,
            "failure_policy": failure.decision.failure_policy.value if failure.decision else None,
        },
        type=decisions.EXTENSION_ERROR,
        non_retryable=True,
    )


def _raise_if_terminal(hook: HookEntry, stage: Stage, failure: HookFailure) -> None:
    """A failed invocation whose decision is ``terminate`` (the hook or its stage fails closed) ends the
    run with ``ExtensionError``; otherwise the stage goes on without the hook's result."""
    if failure.decision is not None and failure.decision.action is DecisionAction.TERMINATE:
        raise _extension_error(hook, stage, failure)


def _no_arguments(query: str, args: Sequence[Any]) -> None:
    if args:
        raise ApplicationError(f"query {query} takes no arguments, got {len(args)}", type=INVALID_QUERY, non_retryable=True)


def _error_text(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)


def _raise_if_cancelled(err: BaseException) -> None:
    """An activity cancelled because the request was cancelled ends the request as cancelled, not as a
    hook error or a failed stage."""
    if isinstance(err, CancelledError) or isinstance(getattr(err, "cause", None), CancelledError):
        raise asyncio.CancelledError() from err
