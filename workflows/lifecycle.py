"""``RequestLifecycle``: one request's plan → execute → synthesize loop, with its hooks, as one workflow.

Deterministic orchestration only. Hooks, the planner, tools, the synthesizer and the execution store
run in activities that this module names by string; it imports only the shared models. The workflow is
composed of parts over one run state (``workflows.run_state``):

- ``invocation.HookRunner`` runs any stage's hooks (each stage is declared in ``workflows.stages``);
- ``steps.StepExecutor`` executes a plan's steps through the tool-call stages;
- ``reviews.Reviews`` opens and decides checkpoints; ``records.RecordKeeper`` writes the record;
- ``model_steps.ModelSteps`` plans and synthesizes; ``answer_stages.AnswerStages`` runs the stages from
  the last plan to the answer; ``memory_stages.MemoryStages`` recalls and remembers the conversation;
- ``ending.RunEnding`` ends the request on every exit;
- ``listing.StageListing`` shows the stage (its names of the stages besides the hook stages are there);
- ``scheduling.Scheduler`` schedules the framework's activities.

Changes to the commands the workflow sends after a release are guarded as ``docs/deployment.md``
says (upgrading workers while requests run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue, RetryPolicy
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, FailureError

with workflow.unsafe.imports_passed_through():
    from . import decisions, snapshots, stages, story
    from . import search_attributes as sa
    from .answer_stages import AnswerStages
    from .callers import caller_identity
    from .detached import EFFECT_UPDATE_SIGNAL, accept_effect_update
    from .dispatch import LOST_ATTEMPT_SIGNAL
    from .ending import RunEnding, request_result
    from .invocation import Ahead, HookRunner, RunStopped, StageRun, raise_if_cancelled
    from .leases import ManagedLeases
    from .listing import LIST_STAGE_SIGNAL, RESOLVING_PIPELINE, StageListing
    from .memory_stages import MemoryStages
    from .model_steps import ModelSteps, PlannedPhase
    from .models import (
        ANSWER_TOPIC,
        MAX_INBOUND_PAYLOAD_BYTES,
        AcceptedPlan,
        AnswerChunk,
        ApproveSignal,
        Checkpoint,
        EffectUpdateSignal,
        ExecutionRecord,
        ExecutionResult,
        HookDecision,
        HookEntry,
        LifecycleBoundary,
        LostAttempt,
        PipelineManifest,
        Plan,
        RejectSignal,
        RequestError,
        RequestInput,
        RequestResult,
        RequestStatus,
        ResolvePipelineInput,
        ReviewAck,
        ReviewRequest,
        ShortCircuitInfo,
        ShortCircuitProposal,
        TerminalEnd,
        conversation_id_problem,
        subagent_depth,
    )
    from .names import WORKFLOW_TYPE
    from .records import RecordKeeper
    from .reviews import INVALID_REVIEW, ReviewMessage, Reviews
    from .run_state import RunState
    from .scheduling import Scheduler
    from .stages import STAGES, Fold, Stage
    from .steps import StepExecutor
    from .support import APPROVAL_METADATA_KEY, approval_reasons, decode_payload, promote_metadata, stage_failure
    from .turns import WAITING_FOR_TURN, ConversationTurn, started_by_conversation

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
        self._memory = MemoryStages(state, self._scheduler, self._listing, self._hooks)
        self._answers = AnswerStages(state, self._hooks, self._models)
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
            self._reviews.decide(_review_message(signal))

    @workflow.signal(name="reject")
    def reject(self, *args: Any) -> None:
        """Reject the open checkpoint: ``{"checkpoint_id", "reviewer", "reason", "proof"}``."""
        signal = self._inbound("reject", RejectSignal, args)
        if signal is not None:
            self._reviews.decide(_review_message(signal))

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
        await self._memory.recall()
        state.record.enrichments = dict(state.enrichments)

        result = await self._before_planning()
        if result is None:
            plan = await self._run_phases()
            execution = ExecutionResult(steps=list(state.record.steps))
            await self._answers.after_execution(execution, plan)
            synthesis = await self._models.synthesize(plan, execution)
            response = await self._answers.after_synthesis(synthesis.response, synthesis.confidence)
            state.synthesized = response
            state.record.confidence = synthesis.confidence
            result = request_result(
                state,
                response,
                synthesis.confidence,
                {"pipeline": state.manifest.pipeline, "planner": state.record.planner},
            )
        handled_by = "short_circuit" if result.short_circuit else "pipeline"
        if result.response.strip():  # after_answer runs once a non-empty answer exists
            result.response = await self._answers.after_answer(result.response, handled_by, result.steps)
        state.record.final_response = result.response
        await self._memory.remember(result.response)
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

    async def _before_run(self, ahead: list[Ahead]) -> None:
        """Rewrite the ask, instructions or facts (facts merge, later values win), or stop the run."""

        def on_outcome(hook: HookEntry, outcome: stages.run.BeforeRunOutcome, before: Any, folded: Fold) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, Stage.BEFORE_RUN.value, outcome.stop.reason, outcome.stop.text)
            if outcome.patch is not None:
                self._state.apply_run(folded.subject)

        await self._hooks.stage(Stage.BEFORE_RUN, self._state.run_view(), on_outcome, ahead=ahead)

    def _planning_ahead(self) -> list[Ahead]:
        """before_planning, on the enrichments the request's metadata promotes, where no memory is
        recalled after before_run: nothing else comes between the two stages. (Where memory is recalled,
        after_recall runs on into before_planning instead.)"""
        if self._memory.recalls() is not None:
            return []
        return [Ahead(Stage.BEFORE_PLANNING, promote_metadata(self._state.input.metadata))]

    async def _before_planning(self) -> RequestResult | None:
        """Enrich, and stop at the first accepted short-circuit. Where it can, the request's first planning
        activity runs the stage's hooks before it plans (``ModelSteps.plan_ahead``)."""
        state = self._state
        served: list[RequestResult] = []

        def on_outcome(
            hook: HookEntry, outcome: stages.planning.BeforePlanningOutcome, before: Any, folded: Fold
        ) -> None:
            state.enrichments = folded.subject
            # recorded as the invocation ended (its entry: this hook's last at the stage, which runs once)
            invocations = state.record.pipeline_hooks
            invocation = next(
                i for i in reversed(invocations) if (i.hook, i.stage) == (hook.name, Stage.BEFORE_PLANNING)
            )
            at = snapshots.ended_at([invocation], invocation.started_at)
            snapshots.record_enrichment_changes(
                state.record, hook.name, outcome.enrichment_changes, state.enrichments, at
            )
            if folded.ends and outcome.short_circuit is not None:
                served.append(self._short_circuit_result(outcome.short_circuit, outcome.decision))

        ran = await self._models.plan_ahead(self._answers.after_text_answer)
        await self._hooks.stage(Stage.BEFORE_PLANNING, state.enrichments, on_outcome, prerun=ran)
        return served[0] if served else None

    def _short_circuit_result(self, proposal: ShortCircuitProposal, decision: HookDecision) -> RequestResult:
        state = self._state
        info = ShortCircuitInfo(source=proposal.source, kind=proposal.kind, reason=decision.reason)
        state.record.short_circuit = info
        state.record.final_response = proposal.response
        state.record.confidence = 1.0
        return request_result(
            state, proposal.response, 1.0, {**proposal.metadata, **state.enrichments}, short_circuit=info
        )

    async def _run_phases(self) -> Plan:
        """Plan, govern, (review,) execute — once per phase until the planner stops or the cap is hit."""
        state = self._state
        phase = 1
        while True:
            state.phase = phase
            planned = await self._models.plan(phase, self._answers.after_text_answer)
            # A plan without steps runs nothing: the next write (the terminal one) records it. Where the
            # planning activity ran the phase's hooks, nothing runs on from them.
            ahead = [] if planned.prerun is not None else self._answers.after_plan_accepted(planned.plan)
            accepted = await self._after_planning(
                planned,
                ahead,
                write=bool(planned.plan.steps),
                end=self._answers.end_after(planned.plan) if ahead else None,
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

    async def _after_planning(
        self, planned: PlannedPhase, ahead: list[Ahead], *, write: bool, end: TerminalEnd | None = None
    ) -> StageRun:
        """Chain copy-on-write mutations, each validated against the tools the planning attempt had; the
        required hook's failure ends the request before any checkpoint or tool; a stop ends the run. The
        plan, accepted, is the run's subject; ``write``: its snapshot is written next; ``end``: how the
        run ends if the hooks leave it as it is (the hooks' local activity may write either, see
        ``HookRunner.run``). Hooks the planning activity already ran on the plan are recorded as theirs
        (``planned.prerun``)."""
        record = self._state.record
        plan = planned.plan
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
            ahead=ahead,
            write_accepted_plan=write,
            end=end,
            prerun=planned.prerun,
            **planned.after_planning(self._state),
        )
        plan = accepted.subject
        at = snapshots.ended_at(record.pipeline_hooks[first_entry:], workflow.now())
        record.plans.append(AcceptedPlan(phase=plan.phase, plan=plan, accepted_at=at))
        return accepted


def _review_request(args: Sequence[Any]) -> ReviewRequest:
    request, problem = decode_payload(ReviewRequest, args, max_bytes=MAX_INBOUND_PAYLOAD_BYTES)
    if request is None:
        raise ApplicationError(f"malformed review: {problem}", type=INVALID_REVIEW, non_retryable=True)
    return request


def _review_message(sent: ApproveSignal | RejectSignal | ReviewRequest) -> ReviewMessage:
    """A review decision as it arrived, whichever message brought it (the ``approve`` or ``reject`` signal,
    the ``review`` update), with the identity the server received it with."""
    if isinstance(sent, ReviewRequest):
        via, decision, comment, declined = "review", sent.decision, sent.comment, sent.declined
    elif isinstance(sent, ApproveSignal):
        via, decision, comment, declined = "approve", "approve", sent.comment, sent.declined
    else:
        via, decision, comment, declined = "reject", "reject", sent.reason, []
    return ReviewMessage(
        via, decision, sent.checkpoint_id, sent.reviewer, comment, tuple(declined), sent.proof, caller_identity()
    )


def _no_arguments(query: str, args: Sequence[Any]) -> None:
    if args:
        raise ApplicationError(
            f"query {query} takes no arguments, got {len(args)}", type=INVALID_QUERY, non_retryable=True
        )
