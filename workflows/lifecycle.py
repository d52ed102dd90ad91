"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models. The workflow is
composed of parts over one run state (``workflows.run_state``):

- ``invocation.HookRunner`` runs any stage's hooks (each stage is declared in ``workflows.stages``);
- ``steps.StepExecutor`` executes a plan's steps through the tool-call stages;
- ``reviews.Reviews`` opens and decides checkpoints; ``records.RecordKeeper`` writes the record;
- ``model_steps.ModelSteps`` plans and synthesizes; ``ending.RunEnding`` ends the request on every exit;
- ``listing.StageListing`` shows the stage (its names of the stages besides the hook stages are there);
- ``scheduling.Scheduler`` schedules the framework's activities.

Changes to the commands the workflow sends after a release are guarded as ``docs/deployment.md``
says (upgrading workers while requests run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue, RetryPolicy
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():
    from . import decisions, snapshots, stages, story
    from . import search_attributes as sa
    from .callers import caller_identity
    from .detached import EFFECT_UPDATE_SIGNAL, accept_effect_update
    from .dispatch import LOST_ATTEMPT_SIGNAL
    from .ending import RunEnding, step_summaries
    from .invocation import Ahead, HookRunner, RunStopped, StageRun, error_text, raise_if_cancelled
    from .leases import ManagedLeases
    from .listing import LIST_STAGE_SIGNAL, RECALLING, REMEMBERING, RESOLVING_PIPELINE, StageListing
    from .model_steps import ModelSteps, PlannedPhase
    from .models import (
        ANSWER_TOPIC,
        ENRICHMENT_CONVERSATION_HISTORY,
        MAX_INBOUND_PAYLOAD_BYTES,
        AcceptedPlan,
        AnswerChunk,
        AnswerView,
        ApproveSignal,
        Checkpoint,
        Diagnostic,
        EffectStatus,
        EffectUpdateSignal,
        ExecutionRecord,
        ExecutionResult,
        HookDecision,
        HookEntry,
        LifecycleBoundary,
        LostAttempt,
        MemoryCandidate,
        MemoryOutcome,
        ModelDraft,
        PipelineHookEffect,
        PipelineManifest,
        Plan,
        RecalledMemory,
        RecallInput,
        RecallOutcome,
        RecallView,
        RejectSignal,
        RememberInput,
        RequestError,
        RequestInput,
        RequestResult,
        RequestStatus,
        ResolvePipelineInput,
        ReviewAck,
        ReviewRequest,
        ShortCircuitInfo,
        ShortCircuitProposal,
        StepResult,
        StepSummary,
        TerminalEnd,
        bounded_value,
        conversation_id_problem,
        subagent_depth,
    )
    from .records import RecordKeeper
    from .reviews import INVALID_REVIEW, ReviewMessage, Reviews
    from .run_state import RunState
    from .scheduling import Scheduler
    from .stages import STAGES, Fold, Stage
    from .steps import StepExecutor
    from .support import (
        APPROVAL_METADATA_KEY,
        activity_error_details,
        approval_reasons,
        cache_verdict,
        decode_payload,
        model_calls_in,
        promote_metadata,
        stage_failure,
    )
    from .turns import WAITING_FOR_TURN, ConversationTurn, started_by_conversation

WORKFLOW_TYPE = "RequestLifecycle"
INVALID_QUERY = "InvalidQuery"
SignalT = TypeVar("SignalT", ApproveSignal, RejectSignal, EffectUpdateSignal, LostAttempt)


@workflow.defn(name=WORKFLOW_TYPE)
class RequestLifecycleWorkflow:
    """One agent request: before_run → before_planning → (plan → after_planning → [checkpoint] → execute)
    per phase → after_execution → synthesize → after_synthesis → after_answer → before_remember, each hook
    invocation its own activity; on_error and on_finish on every exit."""

    # Every entry point takes its arguments untyped and decodes them itself: no payload, several
    # payloads, another encoding or the wrong fields end in a typed failure (the input, an update, a
    # query) or an ignore kept in the record (a signal), never in a workflow task that fails forever.

    @workflow.init
    def __init__(self, *args: Any) -> None:
        info = workflow.info()
        input, self._input_problem = decode_payload(RequestInput, args)
        input = input or RequestInput.model_construct(request="", metadata={}, request_id=None, requested_by=None)
        request_id = input.request_id or info.workflow_id
        record = ExecutionRecord(
            request_id=request_id,
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            request=input.request,
            metadata=input.metadata,
            requested_by=input.requested_by,
            started_at=workflow.now(),
        )
        self._state = state = RunState(
            input=input,
            request_id=request_id,
            record=record,
            leases=ManagedLeases(request_id, info.workflow_id),
            ask=input.request,
        )
        self._listing = StageListing(state)
        self._scheduler = Scheduler(state, self._listing)
        self._hooks = HookRunner(state, self._scheduler, self._listing)
        self._records = RecordKeeper(state, self._scheduler)
        self._reviews = Reviews(state, self._listing, self._records)
        self._steps = StepExecutor(
            state, self._hooks, self._scheduler, self._listing, self._reviews, workflow_type=WORKFLOW_TYPE
        )
        self._models = ModelSteps(state, self._scheduler, self._listing, self._hooks)
        self._ending = RunEnding(state, self._hooks, self._scheduler, self._listing, self._records)
        self._turn = ConversationTurn(state, self._scheduler)
        # A request that asked to stream its answer has a durable stream (its handlers are registered
        # here, before the first activation's signals and updates): the answer's chunks, then its final text.
        self._stream = WorkflowStream() if input.stream_answer else None

    # ------------------------------------------------------------------------------------------------
    # Queries, signals, updates
    # ------------------------------------------------------------------------------------------------

    @workflow.query(name="execution_record")
    def execution_record(self, *args: Any) -> ExecutionRecord:
        """The execution record as it stands: every invocation, decision and effect so far."""
        _no_arguments("execution_record", args)
        return self._state.record

    @workflow.query(name="pending_checkpoint")
    def pending_checkpoint(self, *args: Any) -> Checkpoint | None:
        """The checkpoint waiting for a reviewer (the oldest, when several steps wait), or null."""
        _no_arguments("pending_checkpoint", args)
        return next(iter(self._reviews.pending()), None)

    @workflow.query(name="pending_checkpoints")
    def pending_checkpoints(self, *args: Any) -> list[Checkpoint]:
        """Every checkpoint waiting for a reviewer, oldest first."""
        _no_arguments("pending_checkpoints", args)
        return self._reviews.pending()

    @workflow.signal(name="approve")
    def approve(self, *args: Any) -> None:
        """Approve the open checkpoint: ``{"checkpoint_id", "reviewer", "comment", "declined", "proof"}``."""
        signal = self._inbound("approve", ApproveSignal, args)
        if signal is not None:
            self._reviews.decide(
                ReviewMessage(
                    "approve",
                    "approve",
                    signal.checkpoint_id,
                    signal.reviewer,
                    signal.comment,
                    tuple(signal.declined),
                    signal.proof,
                    caller_identity(),
                )
            )

    @workflow.signal(name="reject")
    def reject(self, *args: Any) -> None:
        """Reject the open checkpoint: ``{"checkpoint_id", "reviewer", "reason", "proof"}``."""
        signal = self._inbound("reject", RejectSignal, args)
        if signal is not None:
            self._reviews.decide(
                ReviewMessage(
                    "reject",
                    "reject",
                    signal.checkpoint_id,
                    signal.reviewer,
                    signal.reason,
                    proof=signal.proof,
                    caller=caller_identity(),
                )
            )

    @workflow.signal(name="granted")
    def granted(self, *args: Any) -> None:
        """The conversation granted this request its turn (a request started directly in a conversation)."""
        self._turn.grant()

    @workflow.signal(name=LIST_STAGE_SIGNAL)
    def list_stage(self, *args: Any) -> None:
        """An activity the request has waited on for the listing delay asks it to list its stage."""
        self._listing.list_asked()

    def listing_header(self) -> Payload | None:
        """The ask to list the stage an activity scheduled now carries, if any (read by
        ``activities.listing_watch`` as the activity is scheduled)."""
        return self._listing.activity_header()

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """A signal this workflow does not define: kept as ignored, so the sender can see it arrived."""
        self._reviews.ignore(name, "", "", f"no signal named {name!r} ({len(args)} payload(s))")

    def _inbound(self, via: str, model: type[SignalT], args: Sequence[Any]) -> SignalT | None:
        """A signal's payload as ``model``, or None after recording it as ignored (never dropped silently)."""
        signal, problem = decode_payload(model, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
        if problem is not None:
            fields = args[0] if len(args) == 1 and isinstance(args[0], dict) else {}
            self._reviews.ignore(
                via,
                str(fields.get("checkpoint_id", ""))[:200],
                str(fields.get("reviewer", ""))[:200],
                f"malformed {via} signal: {problem}",
            )
        return signal

    @workflow.update(name="review")
    def review(self, *args: Any) -> ReviewAck:
        """Approve or reject with an acknowledgement; refused before it is accepted if invalid."""
        request = _review_request(args)
        reviewer = self._reviews.decide(_review_message(request))
        return ReviewAck(
            checkpoint_id=request.checkpoint_id,
            decision=request.decision,
            reviewer=reviewer.principal if reviewer is not None else request.reviewer,
            accepted_at=workflow.now(),
            declined=request.declined,
            verified_by=reviewer.verified_by if reviewer is not None else None,
        )

    @review.validator
    def _validate_review(self, *args: Any) -> None:
        request = _review_request(args)
        reviewer = self._reviews.check(_review_message(request))
        if isinstance(reviewer, str):
            # Refused before it is accepted, so nothing of it enters the history: the worker's log keeps it.
            workflow.logger.warning(
                "review refused: checkpoint %r, reviewer %r, sent as %r: %s",
                request.checkpoint_id,
                request.reviewer,
                caller_identity(),
                reviewer,
            )
            raise ApplicationError(reviewer, type=INVALID_REVIEW, non_retryable=True)

    @workflow.signal(name=EFFECT_UPDATE_SIGNAL)
    def effect_update(self, *args: Any) -> None:
        """A detached effect reached its terminal state (sent by its ``DetachedEffect`` child)."""
        update = self._inbound(EFFECT_UPDATE_SIGNAL, EffectUpdateSignal, args)
        if update is None:
            return
        problem = accept_effect_update(self._state.record, self._state.detached_tokens, update)
        if problem is not None:
            self._reviews.ignore(EFFECT_UPDATE_SIGNAL, update.effect.effect_id, "", problem)

    @workflow.signal(name=LOST_ATTEMPT_SIGNAL)
    def attempt_lost(self, *args: Any) -> None:
        """An activity's attempt found that the one before it lost its worker (``activities.heartbeat``):
        kept in the record's worker losses, and the attempt given back should its activity's run out."""
        lost = self._inbound(LOST_ATTEMPT_SIGNAL, LostAttempt, args)
        if lost is not None:
            self._scheduler.note_attempt_lost(lost)

    # ------------------------------------------------------------------------------------------------
    # The lifecycle
    # ------------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, *args: Any) -> RequestResult:
        state = self._state
        if self._input_problem is not None:
            # Refused before anything runs or is stored: the record (by query) says why.
            state.record.status = RequestStatus.FAILED
            state.record.error = RequestError(type=decisions.INVALID_REQUEST, message=self._input_problem)
            state.record.lifecycle_stage = str(RequestStatus.FAILED)
            headline = story.failure_headline(decisions.INVALID_REQUEST, self._input_problem)
            workflow.set_current_details(
                story.current_details("(no valid request)", stage=str(RequestStatus.FAILED), outcome=headline)
            )
            raise ApplicationError(self._input_problem, type=decisions.INVALID_REQUEST, non_retryable=True)
        self._listing.started()
        try:
            return await self._run_to_end()
        finally:
            await self._turn.release()  # after the finalizers: the next turn's hooks never overlap them

    async def _run_to_end(self) -> RequestResult:
        state, ending = self._state, self._ending
        cancelled = RequestError(type="Cancelled", message="the request was cancelled")
        try:
            result = await self._lifecycle()
        except RunStopped as stop:
            result = ending.stopped(stop)
            self._publish_final_answer(stop.text)
            await ending.finish(RequestStatus.STOPPED, "stopped", response=stop.text)
            result.diagnostics = list(state.record.diagnostics)
            return result
        except ApplicationError as err:
            details = err.details[0] if err.details and isinstance(err.details[0], dict) else {}
            error = RequestError(type=err.type or "ApplicationError", message=err.message, details=details)
            await ending.finish(RequestStatus.FAILED, "error", error=error)
            raise
        except asyncio.CancelledError:
            await ending.finish(RequestStatus.CANCELLED, "cancelled", error=cancelled)
            raise
        except FailureError as err:  # any other Temporal failure still ends the request: clean up first
            if isinstance(err, CancelledError):
                await ending.finish(RequestStatus.CANCELLED, "cancelled", error=cancelled)
            else:
                error = RequestError(type=type(err).__name__, message=str(err))
                await ending.finish(RequestStatus.FAILED, "error", error=error)
            raise
        self._publish_final_answer(result.response)
        await ending.finish(RequestStatus.SUCCEEDED, "completed", response=result.response)
        result.diagnostics = list(state.record.diagnostics)
        return result

    def _retract_streamed(self) -> None:
        """Withdraw the text a client has read so far: it is not the answer."""
        if self._stream is not None:
            self._stream.topic(ANSWER_TOPIC, type=AnswerChunk).publish(AnswerChunk(text="", retracted=True))

    def _publish_final_answer(self, text: str) -> None:
        """The answer a client receives, last on the answer stream of a request that asked to stream."""
        if self._stream is not None:
            self._stream.topic(ANSWER_TOPIC, type=AnswerChunk).publish(AnswerChunk(text=text, final=True))

    async def _lifecycle(self) -> RequestResult:
        state = self._state
        await self._resolve_pipeline()
        await self._take_turn()
        await self._before_run(self._planning_ahead())
        state.enrichments = promote_metadata(state.input.metadata)
        state.record.promoted_enrichments = sorted(state.enrichments)
        await self._recall()
        state.record.enrichments = dict(state.enrichments)

        result = await self._before_planning()
        if result is None:
            plan = await self._run_phases()
            execution = ExecutionResult(steps=list(state.record.steps))
            await self._after_execution(execution, self._draft_stages(plan))
            synthesis = await self._models.synthesize(plan, execution)
            response = await self._after_synthesis(synthesis.response, synthesis.confidence)
            state.synthesized = response
            state.record.confidence = synthesis.confidence
            result = RequestResult(
                request_id=state.request_id,
                workflow_id=state.record.workflow_id,
                response=response,
                confidence=synthesis.confidence,
                metadata={"pipeline": state.manifest.pipeline, "planner": state.record.planner},
                steps=step_summaries(state),
            )
        handled_by = "short_circuit" if result.short_circuit else "pipeline"
        if result.response.strip():  # after_answer runs once a non-empty answer exists
            result.response = await self._after_answer(result.response, handled_by, result.steps)
        state.record.final_response = result.response
        await self._remember(result.response)
        return result

    async def _resolve_pipeline(self) -> None:
        state = self._state
        self._listing.enter(RESOLVING_PIPELINE)
        try:
            state.manifest = await self._scheduler.bookkeeping(
                "resolve_pipeline",
                ResolvePipelineInput(request_id=state.request_id, metadata=state.input.metadata),
                result_type=PipelineManifest,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=5),
                summary="resolve_pipeline",
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            raise stage_failure(decisions.PIPELINE_UNAVAILABLE, "could not resolve the hook pipeline", err) from None
        state.record.pipeline = state.manifest.pipeline
        state.record.trace_id = state.manifest.trace_id
        # The run starts with the pipeline's instructions, then the request's; before_run may rewrite them.
        given = (state.manifest.instructions, state.input.instructions or "")
        state.instructions = state.record.instructions = "\n\n".join(text for text in given if text.strip())
        state.leases.keeper_search_attributes = self._listing.child_kind(sa.KIND_LEASE_KEEPER)
        state.gate = decisions.gate_for_request(
            state.input.metadata, state.manifest.cache_variation, state.manifest.reserved_metadata_dimensions
        )

    async def _take_turn(self) -> None:
        """A request of a conversation that its conversation did not start waits for its turn there. A
        sub-agent runs within the turn of the request that delegated to it: it never claims one."""
        state = self._state
        conversation = state.conversation_id
        if not conversation or conversation_id_problem(conversation):
            return
        if subagent_depth(state.input.metadata) > 0:
            return
        if started_by_conversation(conversation):
            return
        self._listing.enter(WAITING_FOR_TURN, conversation)
        await self._turn.claim(conversation)

    async def _stage(self, stage: Stage, subject: Any = None, on_outcome: Any = None, **options: Any) -> Any:
        """Enter ``stage`` and run its hooks on ``subject``: what they made of it."""
        self._listing.enter(stage)
        return (await self._hooks.run(STAGES[stage], subject, on_outcome, **options)).subject

    async def _before_run(self, ahead: list[Ahead]) -> None:
        """Rewrite the ask, instructions or facts (facts merge, later values win), or stop the run."""

        def on_outcome(hook: HookEntry, outcome: stages.run.BeforeRunOutcome, before: Any, folded: Fold) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, Stage.BEFORE_RUN.value, outcome.stop.reason, outcome.stop.text)
            if outcome.patch is not None:
                self._state.apply_run(folded.subject)

        await self._stage(Stage.BEFORE_RUN, self._state.run_view(), on_outcome, ahead=ahead)

    def _planning_ahead(self) -> list[Ahead]:
        """before_planning, on the enrichments the request's metadata promotes, where no memory is
        recalled after before_run: nothing else comes between the two stages. (Where memory is recalled,
        after_recall runs on into before_planning instead.)"""
        if self._recalls() is not None:
            return []
        return [Ahead(Stage.BEFORE_PLANNING, promote_metadata(self._state.input.metadata))]

    def _recalls(self) -> str | None:
        """The conversation whose memory this run loads before planning, if it loads one."""
        state = self._state
        conversation = state.conversation_id
        if state.manifest.memory and conversation:
            return conversation
        return None

    async def _recall(self) -> None:
        """Load the conversation's memory, let after_recall hooks change the view of it this run plans with,
        and put that view ahead of the conversation history the planner reads. Loading that fails is a
        ``memory`` error the run recovers from: it plans without the memory."""
        state = self._state
        conversation = self._recalls()
        if conversation is None:
            return
        self._listing.enter(RECALLING)
        outcome = RecallOutcome(conversation_id=conversation)
        state.record.recall = outcome
        try:
            memory = await self._scheduler.bookkeeping(
                "recall_memory",
                RecallInput(request_id=state.request_id, conversation_id=conversation),
                result_type=RecalledMemory,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"recall · {conversation}",
            )
        except (ActivityError, ApplicationError) as err:
            raise_if_cancelled(err)
            outcome.error = error_text(err)
            state.recover("memory", "MemoryError", outcome.error, {"conversation_id": conversation})
            return
        outcome.exchanges, outcome.summary_chars = len(memory.exchanges), len(memory.summary)

        def on_outcome(hook: HookEntry, result: Any, before: RecallView, folded: Fold) -> None:
            if folded.subject != before:
                outcome.changed_by.append(hook.name)

        view = await self._stage(
            Stage.AFTER_RECALL,
            RecallView(conversation_id=conversation, memory=memory),
            on_outcome,
            ahead=[Ahead(Stage.BEFORE_PLANNING, with_recalled_memory(state.enrichments, memory))],
        )
        state.enrichments = with_recalled_memory(state.enrichments, view.memory)

    async def _before_planning(self) -> RequestResult | None:
        """Enrich, and stop at the first accepted short-circuit."""
        state = self._state
        served: list[RequestResult] = []

        def on_outcome(
            hook: HookEntry, outcome: stages.planning.BeforePlanningOutcome, before: Any, folded: Fold
        ) -> None:
            state.enrichments = folded.subject
            record_enrichment_changes(state.record, hook, outcome, state.enrichments)
            if folded.ends and outcome.short_circuit is not None:
                served.append(self._short_circuit_result(outcome.short_circuit, outcome.decision))

        await self._stage(Stage.BEFORE_PLANNING, state.enrichments, on_outcome)
        return served[0] if served else None

    def _short_circuit_result(self, proposal: ShortCircuitProposal, decision: HookDecision) -> RequestResult:
        state = self._state
        info = ShortCircuitInfo(source=proposal.source, kind=proposal.kind, reason=decision.reason)
        state.record.short_circuit = info
        state.record.final_response = proposal.response
        state.record.confidence = 1.0
        return RequestResult(
            request_id=state.request_id,
            workflow_id=state.record.workflow_id,
            response=proposal.response,
            confidence=1.0,
            short_circuit=info,
            metadata={**proposal.metadata, **state.enrichments},
        )

    async def _run_phases(self) -> Plan:
        """Plan, govern, (review,) execute — once per phase until the planner stops or the cap is hit."""
        state = self._state
        phase = 1
        while True:
            state.phase = phase
            planned = await self._models.plan(phase)
            # A plan without steps runs nothing: the next write (the terminal one) records it.
            ahead = self._after_plan_accepted(planned.plan)
            accepted = await self._after_planning(
                planned, ahead, write=bool(planned.plan.steps), end=self._end_after(planned.plan) if ahead else None
            )
            plan = accepted.subject
            if self._models.streamed_answer(planned.plan) and self._models.text_answer(plan) is None:
                self._retract_streamed()  # after_planning made the streamed text answer a plan to run
            if plan.steps:
                await self._records.persist(LifecycleBoundary.ACCEPTED_PLAN, accepted.snapshot)
            reasons = approval_reasons(plan, state.manifest.tools)
            if reasons:
                await self._steps.review_ready_calls(plan, reasons)
            await self._steps.execute(plan)
            if not plan.continue_after:
                return plan
            if phase >= state.manifest.settings.max_planning_phases:
                state.record.phase_cap_reached = True
                return plan
            phase += 1

    # -- the stages that follow one another with nothing between (see ``HookRunner.run``'s ``ahead``) --

    def _after_plan_accepted(self, plan: Plan) -> list[Ahead]:
        """After a plan that is the planner's text answer, if its after_planning hooks leave it as it is:
        after_execution (on the steps so far), then the draft's stages — no tool, checkpoint, record write
        or model call comes between them. None for any other plan."""
        if plan.continue_after or self._models.text_answer(plan) is None:
            return []
        return [Ahead(Stage.AFTER_EXECUTION, _observed(self._state.record.steps)), *self._draft_stages(plan)]

    def _end_after(self, plan: Plan) -> TerminalEnd | None:
        """How the run ends after ``plan`` if it is the planner's text answer (see :meth:`_end`)."""
        text = self._models.text_answer(plan)
        if text is None:
            return None
        steps = list(self._state.record.steps)
        return self._end(text, self._models.draft_of(plan, text), ExecutionResult(steps=steps).confidence)

    def _end(self, answer: str, draft: ModelDraft | None, confidence: float | None) -> TerminalEnd | None:
        """How the run ends with ``answer`` if the hooks about to run and those of the stages after them leave
        it as it is, where nothing else comes between them and the end: no conversation memory to save, no
        lease to release, no error the run recovered from for on_error, no on_finish hook. None otherwise
        (the terminal snapshot is then the workflow's own write)."""
        state = self._state
        if state.manifest.memory or state.leases or state.recovered or state.manifest.participants(Stage.ON_FINISH):
            return None
        verdict = cache_verdict(state.record, state.manifest.tools, "completed", answer)
        return TerminalEnd(
            final_response=answer,
            model_draft=draft,
            confidence=confidence,
            cache=verdict.model_copy(update={"response": None}),
        )

    def _draft_stages(self, plan: Plan) -> list[Ahead]:
        """After after_execution, when the last plan's text answer is the draft (no synthesis call):
        after_synthesis on it, then after_answer."""
        text = self._models.text_answer(plan)
        return [] if text is None else [Ahead(Stage.AFTER_SYNTHESIS, text), *self._answer_stage(text)]

    def _answer_stage(self, response: str) -> list[Ahead]:
        """after_answer on ``response``, where after_synthesis leaves it as it is (none for an empty answer:
        after_answer runs only once there is one)."""
        if not response.strip():
            return []
        return [Ahead(Stage.AFTER_ANSWER, self._answer_view(response, "pipeline", step_summaries(self._state)))]

    async def _after_planning(
        self, planned: PlannedPhase, ahead: list[Ahead], *, write: bool, end: TerminalEnd | None = None
    ) -> StageRun:
        """Chain copy-on-write mutations, each validated against the tools the planning attempt had; the
        required hook's failure ends the request before any checkpoint or tool; a stop ends the run. The
        plan, accepted, is the run's subject; ``write``: its snapshot is written next; ``end``: how the
        run ends if the hooks leave it as it is (the hooks' local activity may write either, see
        ``HookRunner.run``)."""
        record = self._state.record
        plan = planned.plan
        prior = [s.step_id for s in record.steps]
        first_entry = len(record.pipeline_hooks)

        def on_outcome(
            hook: HookEntry, outcome: stages.planning.AfterPlanningOutcome, before: Any, folded: Fold
        ) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, Stage.AFTER_PLANNING.value, outcome.stop.reason, outcome.stop.text)
            marked_before = {s.step_id for s in before.steps if s.metadata.get(APPROVAL_METADATA_KEY)}
            for step in folded.subject.steps:
                if step.metadata.get(APPROVAL_METADATA_KEY) and step.step_id not in marked_before:
                    self._state.approval_required_by.setdefault(step.step_id, hook.name)

        self._listing.enter(Stage.AFTER_PLANNING)
        accepted = await self._hooks.run(
            STAGES[Stage.AFTER_PLANNING],
            plan,
            on_outcome,
            plan_phase=plan.phase,
            prior_step_ids=prior,
            available_tools=planned.available,
            attempt=planned.attempt,
            tools=planned.tools,
            steps=self._state.steps_so_far(),
            ahead=ahead,
            write_accepted_plan=write,
            end=end,
        )
        plan = accepted.subject
        at = snapshots.ended_at(record.pipeline_hooks[first_entry:], workflow.now())
        record.plans.append(AcceptedPlan(phase=plan.phase, plan=plan, accepted_at=at))
        return accepted

    async def _after_execution(self, execution: ExecutionResult, ahead: list[Ahead]) -> None:
        """Observers of every step's outcome: its status, result text (capped) and error, not each raw
        output, so what every after_execution hook receives stays small however much the tools returned
        (the record keeps the raw outputs)."""
        await self._stage(Stage.AFTER_EXECUTION, _observed(execution.steps), ahead=ahead)

    async def _after_synthesis(self, response: str, confidence: float | None) -> str:
        """Rewrite the answer, chained; a hook that fails closed (redaction) ends the request rather than
        let its unguarded input out. Its hooks and after_answer's may be the run's last (:meth:`_end`)."""
        end = self._end(response, self._state.record.model_draft, confidence)
        return await self._stage(Stage.AFTER_SYNTHESIS, response, ahead=self._answer_stage(response), end=end)

    async def _after_answer(
        self, text: str, handled_by: Literal["pipeline", "short_circuit"], steps: list[StepSummary]
    ) -> str:
        """Rewrite the final answer (chained) or stop."""

        def on_outcome(hook: HookEntry, outcome: stages.answer.AfterAnswerOutcome, before: Any, folded: Fold) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, Stage.AFTER_ANSWER.value, outcome.stop.reason, outcome.stop.text)

        return (await self._stage(Stage.AFTER_ANSWER, self._answer_view(text, handled_by, steps), on_outcome)).text

    def _answer_view(
        self, text: str, handled_by: Literal["pipeline", "short_circuit"], steps: list[StepSummary]
    ) -> AnswerView:
        record = self._state.record
        return AnswerView(
            text=text,
            handled_by=handled_by,
            steps=steps,
            answered_by=record.handled_by,
            best_effort=record.phase_cap_reached,
        )

    async def _remember(self, answer: str) -> None:
        """Offer the exchange to before_remember hooks, then save it to conversation memory. A failed
        save keeps the completed answer and is recorded as a diagnostic; a best-effort answer (the run hit
        its phase cap) is not remembered."""
        state = self._state
        if not state.manifest.memory:
            return
        conversation = state.conversation_id or state.request_id
        if state.record.phase_cap_reached:  # a best-effort answer is never remembered
            state.record.memory = MemoryOutcome(
                action="skipped", conversation_id=conversation, reason="a best-effort answer (the phase cap was hit)"
            )
            return
        self._listing.enter(REMEMBERING)
        candidate = MemoryCandidate(
            conversation_id=conversation,
            request=state.ask,
            answer=answer,
            facts=state.facts,
        )
        replaced_by: list[str] = []

        def on_outcome(
            hook: HookEntry, outcome: stages.answer.BeforeRememberOutcome, before: MemoryCandidate, folded: Fold
        ) -> None:
            if outcome.skip is not None:
                state.record.memory = MemoryOutcome(
                    action="skipped", conversation_id=before.conversation_id, by=hook.name, reason=outcome.skip.reason
                )
            elif folded.subject != before:
                replaced_by.append(hook.name)

        stage = await self._hooks.run(STAGES[Stage.BEFORE_REMEMBER], candidate, on_outcome)
        if stage.ended:
            return
        candidate = stage.subject
        try:
            saved = await self._scheduler.activity(
                "remember",
                RememberInput(
                    request_id=state.request_id,
                    workflow_id=state.record.workflow_id,
                    candidate=candidate,
                    handled_by="fallback" if state.route == "fallback" else "primary",
                    model_tokens_left=state.model_tokens_left(),
                ),
                result_type=MemoryOutcome,
                timeout=30,
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"remember · {candidate.conversation_id}",
            )
        except (ActivityError, ApplicationError) as err:
            raise_if_cancelled(err)
            if isinstance(err, ActivityError):  # the summarizer's calls, made before the memory failed
                state.record.model_calls.extend(model_calls_in(activity_error_details(err).get("model_calls")))
            state.record.diagnostics.append(
                Diagnostic(extension="(memory)", phase="remember", error=error_text(err), error_type="MemoryError")
            )
            state.recover("memory", "MemoryError", error_text(err), {"conversation_id": candidate.conversation_id})
            return
        state.record.model_calls.extend(saved.model_calls)
        state.record.memory = saved.model_copy(
            update={"by": replaced_by[-1] if replaced_by else None, "model_calls": []}
        )


def record_enrichment_changes(
    record: ExecutionRecord,
    hook: HookEntry,
    outcome: stages.planning.BeforePlanningOutcome,
    enrichments: dict[str, Any],
) -> None:
    """Record each of a hook's enrichment changes as the effect ``planning_enrichment:<key>``."""
    now = workflow.now()
    for change in outcome.enrichment_changes:
        record.effects.append(
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
    record.enrichments = dict(enrichments)


def _observed(steps: Sequence[StepResult]) -> ExecutionResult:
    """What after_execution hooks observe of the steps: each one's status, result text (capped) and error."""
    return ExecutionResult(steps=[s.observer_view() for s in steps])


def with_recalled_memory(enrichments: dict[str, Any], memory: RecalledMemory) -> dict[str, Any]:
    """``enrichments`` with the recalled memory ahead of any conversation history already there: the
    summary of older exchanges first, then the latest exchanges, oldest first."""
    if memory.empty:
        return enrichments
    lines = [f"(earlier in this conversation) {memory.summary}"] if memory.summary else []
    lines += [f"user: {e.request}\nassistant: {e.answer}" for e in memory.exchanges]
    existing = enrichments.get(ENRICHMENT_CONVERSATION_HISTORY)
    if isinstance(existing, str) and existing:
        lines.append(existing)
    return {**enrichments, ENRICHMENT_CONVERSATION_HISTORY: "\n".join(lines)}


def _review_request(args: Sequence[Any]) -> ReviewRequest:
    request, problem = decode_payload(ReviewRequest, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
    if request is None:
        raise ApplicationError(f"malformed review: {problem}", type=INVALID_REVIEW, non_retryable=True)
    return request


def _review_message(request: ReviewRequest) -> ReviewMessage:
    return ReviewMessage(
        "review",
        request.decision,
        request.checkpoint_id,
        request.reviewer,
        request.comment,
        tuple(request.declined),
        request.proof,
        caller_identity(),
    )


def _no_arguments(query: str, args: Sequence[Any]) -> None:
    if args:
        raise ApplicationError(
            f"query {query} takes no arguments, got {len(args)}", type=INVALID_QUERY, non_retryable=True
        )
