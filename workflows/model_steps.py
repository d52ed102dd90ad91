"""The request's planner and synthesizer steps: each one activity, its model calls and token spend kept in
the record, its failure the request's typed failure (``PlanningFailed``, ``SynthesisFailed``, or the
model's own error).

Planning a phase is a series of attempts: before each, before_plan hooks may narrow the tools and add
context; a planner that can correct a malformed plan gets one more attempt with what was wrong. When no
tool remains, the phase is answered without a planner call.

When the primary model is unavailable after its retries and the stage has a fallback model, the run is
handed over: before_fallback hooks see (and may replace, or stop) what the fallback will be asked, and the
fallback answers this call and every later one of the run. Hook errors never hand a run over. Workflow
code only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import decisions, snapshots, stages
    from .converter import Shown
    from .hook_dispatch import Segments, hooks_budget
    from .invocation import Ahead, HookRunner, PreRun, RunStopped, error_text, raise_if_cancelled
    from .listing import PLANNING, SYNTHESIZING, StageListing
    from .models import (
        AcceptedPlanWrite,
        ExecutionRecord,
        ExecutionResult,
        FallbackRequest,
        HookBatchSegment,
        HookCall,
        HookEntry,
        ModelDraft,
        ModelUsage,
        Plan,
        PlanEnding,
        PlanHooks,
        PlanInput,
        PlanOutput,
        PlanRepair,
        PriorTurn,
        Stage,
        StepSummary,
        SynthesizeInput,
        SynthesizeOutput,
        TerminalEnd,
        TerminalWrite,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .snapshots import BeforePlanningRan, EndAttempt, spent, took_plan
    from .stages import Fold
    from .support import activity_error_details, model_calls_in, stage_failure


OutputT = TypeVar("OutputT", PlanOutput, SynthesizeOutput)
# What follows a planning attempt whose plan turns out to be the planner's text answer, built before it
# exists on a stand-in answer (``stages.STAND_IN_ANSWER``): the stages with nothing between them, and how
# the run ends (see ``answer_stages.AnswerStages.after_text_answer``).
Ending = Callable[[], tuple[list[Ahead], TerminalEnd] | None]
ModelStage = Literal["planning", "synthesis"]
Route = Literal["primary", "fallback"]

# The phase's answer when before_plan hooks left no tool: nothing to plan, so no planner call.
NO_TOOLS_RATIONALE = "no tool is available to this planning attempt"
# The largest record the planning activity is handed to write the accepted plan's snapshot with the
# phase's after_planning hooks (by reference, through the payload store); a larger one, or any without a
# payload store (it would enter the history), the workflow writes itself after them.
MAX_RECORD_WITH_PLAN_BYTES = 256 * 1024
# In a planning activity's summary, before the hooks it runs should its plan be the planner's text answer.
ANSWERS = "· if it answers:"


@dataclass
class PlannedPhase:
    """A phase's plan, the tool keys its last planning attempt had (None: every tool), that attempt (0: the
    phase's first) and its tools as planning hooks see them; ``prerun``: the after_planning hooks the
    planning activity ran on the plan."""

    plan: Plan
    available: list[str] | None = None
    attempt: int = 0
    tools: list[stages.ToolDescriptor] = field(default_factory=list)
    prerun: PreRun | None = None

    def after_planning(self, state: RunState) -> dict[str, Any]:
        """What after_planning hooks receive besides the plan and the request."""
        return {
            "prior_step_ids": [s.step_id for s in state.record.steps],
            "available_tools": self.available,
            "attempt": self.attempt,
            "tools": self.tools,
            "steps": state.steps_so_far(),
        }


@dataclass
class FusedPlanning:
    """A planning activity handed the planning hooks that run in it: the after_planning hooks, their calls as
    built before the plan existed, and when the activity was scheduled; the before_planning hooks and their
    calls, where it runs those first; the hooks of the stages after a text answer and their calls, built
    on a stand-in answer, where it runs on into those (``ending``)."""

    entries: list[HookEntry]
    hooks: PlanHooks
    started: datetime
    before: list[HookEntry] = field(default_factory=list)
    before_calls: list[HookCall] = field(default_factory=list)
    ending: Segments = field(default_factory=list)
    sent: str = ""  # with ``ending``: the record as the activity receives it (JSON)

    def before_prerun(self, output: PlanOutput) -> PreRun | None:
        """The before_planning hooks the activity ran: on the calls this workflow built for them (so taken
        as they are), from when it was scheduled."""
        if not output.before:
            return None
        return PreRun(list(self.before_calls), output.before, self.started, trusted=True)

    def prerun(self, output: PlanOutput, enrichments: dict[str, Any]) -> PreRun | None:
        """The after_planning hooks the activity ran on its plan, on the calls it ran them with (the workflow
        builds the same on reaching the stage, or runs them again)."""
        if output.plan is None or not output.after:
            return None
        spent = ModelUsage.of(output.model_calls).total_tokens
        calls: list[HookCall] = [
            stages.planning.AFTER_PLANNING.on_plan(built, output.plan, spent, enrichments)
            for built in self.hooks.after[: len(output.after)]
        ]
        started = self.started + timedelta(milliseconds=output.hooks_after_ms)
        return PreRun(calls, output.after, started, snapshot=output.snapshot)

    def end_attempt(self, output: PlanOutput, route: Literal["primary", "fallback"]) -> EndAttempt | None:
        """What became of the terminal snapshot the activity wrote after the text answer's hooks, and how this
        workflow builds the write it made again (``snapshots.answered_end`` on the record it sent)."""
        ending, write, sent = self.hooks.ending, self.hooks.write, self.sent
        if output.end is None or ending is None or write is None:
            return None
        later = [spec.stage for spec, _, _ in self.ending]
        before = self._before_ran(output)

        def handed() -> TerminalWrite:
            record = ExecutionRecord.model_validate_json(sent)
            sent_write = write.model_copy(update={"record": record})
            return snapshots.answered_end(sent_write, output, ending.end, later, route, before)

        return EndAttempt(handed, [output.after, *output.ahead], output.end)

    def _before_ran(self, output: PlanOutput) -> BeforePlanningRan | None:
        """The before_planning hooks the activity ran, each call as its hook received it (the outcome of the
        one before passed on, ``stages.next_call``) with its outcome."""
        if not output.before:
            return None
        spec = stages.STAGES[Stage.BEFORE_PLANNING]
        ran: list[tuple[HookCall, Any]] = []
        received = self.before_calls[0]
        for offset, entry in enumerate(output.before):
            outcome = spec.outcome_of(received, entry.outcome or {})
            ran.append((received, outcome))
            if offset + 1 < len(self.before_calls):
                received = stages.next_call(spec, received, outcome, self.before_calls[offset + 1]) or received
        return BeforePlanningRan(ran, output.before)

    def ran_on(
        self, output: PlanOutput, answered_by: Literal["primary", "fallback"], enrichments: dict[str, Any]
    ) -> list[tuple[Stage, PreRun]]:
        """The hooks of each stage after the text answer that the activity ran on into (``ending``, in
        order), on the calls it ran them with: built on the stand-in, completed with the plan's text as the
        activity completed them (the workflow builds the same on reaching the stage, or runs them again)."""
        if output.plan is None or not output.ahead:
            return []
        answer = output.plan.answer or ""
        tokens = ModelUsage.of(output.model_calls).total_tokens
        clock = self.started + timedelta(milliseconds=output.hooks_after_ms) + spent(output.after)
        ran: list[tuple[Stage, PreRun]] = []
        for (spec, _, calls), entries in zip(self.ending, output.ahead, strict=False):
            filled = [stages.answered(call, answer, answered_by, tokens, enrichments) for call in calls[: len(entries)]]
            ran.append((spec.stage, PreRun(filled, entries, clock)))
            clock += spent(entries)
        return ran


@dataclass
class PlannedAhead:
    """The request's first planning attempt, scheduled with its before_planning hooks (see
    :meth:`ModelSteps.plan_ahead`): the phase as planned, the hooks the activity ran, what it answered."""

    planned: PlannedPhase
    fused: FusedPlanning
    output: PlanOutput


class ModelSteps:
    """Plans and synthesizes for one request (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing, runner: HookRunner) -> None:
        self._state = state
        self._scheduler = scheduler
        self._listing = listing
        self._runner = runner
        self._ahead: PlannedAhead | None = None

    # -- planning --------------------------------------------------------------------------------------

    async def plan(self, phase: int, ending: Ending | None = None) -> PlannedPhase:
        """The phase's plan: its attempts, each after before_plan; a malformed one the planner can correct
        is retried with what was wrong (``InvalidPlan`` once no attempt is left, from the activity).
        ``ending``: what follows should the plan be the planner's text answer, for the planning activity
        to run on into (see :meth:`_fused`)."""
        state = self._state
        attempt, repair = 0, None
        while True:
            ahead, self._ahead = self._ahead, None
            if ahead is not None and ahead.output.planned:
                planned, fused, output = ahead.planned, ahead.fused, ahead.output
            else:
                view = await self._before_plan(phase, attempt)
                narrowed = len(view.tools) < len(state.manifest.tools)
                available = view.tool_keys if narrowed else None
                if not view.tools:
                    return PlannedPhase(Plan(phase=phase, rationale=NO_TOOLS_RATIONALE), available, attempt)
                planned = PlannedPhase(Plan(phase=phase), available, attempt, view.tools)
                output, fused = await self._plan_activity(
                    phase,
                    attempt,
                    available,
                    view.context_text,
                    repair,
                    partial(self._fused, phase, planned, ending=ending),
                )
            state.planner_draft = output.draft
            if output.plan is not None:
                if output.model_turn is not None:
                    step_ids = {
                        str(call_id): step.step_id
                        for step in output.plan.steps
                        if (call_id := step.metadata.get("model_tool_call_id"))
                    }
                    state.model_turns.append(PriorTurn(turn=output.model_turn, step_ids=step_ids))
                planned.plan = output.plan
                if fused is not None:
                    route = state.record.handled_by or "primary"
                    planned.prerun = fused.prerun(output, state.enrichments)
                    self._runner.dispatcher.ran_ahead.update(fused.ran_on(output, route, state.enrichments))
                    state.end_attempt = fused.end_attempt(output, route) or state.end_attempt
                return planned
            attempt, repair = attempt + 1, output.repair

    async def _before_plan(self, phase: int, attempt: int) -> stages.PlanAttempt:
        """The attempt as before_plan hooks left it: the tools the planner may use, its context text."""
        state = self._state
        view = stages.PlanAttempt(
            phase=phase,
            attempt=attempt,
            ask=state.ask,
            tools=[stages.ToolDescriptor(key=t.key, writes=not t.read_only) for t in state.manifest.tools],
            steps=[StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in state.record.steps],
        )
        if not state.manifest.participants(Stage.BEFORE_PLAN):
            return view
        self._listing.enter(Stage.BEFORE_PLAN)
        return (await self._runner.run(stages.STAGES[Stage.BEFORE_PLAN], view, plan_phase=phase)).subject

    async def plan_ahead(self, ending: Ending | None = None) -> PreRun | None:
        """Schedule the request's first planning attempt with its before_planning hooks, where each runs
        in-process (a batch's hooks), nothing ran them ahead already and nothing comes between them and the
        planner (no before_plan hook): the activity runs them, then asks the planner on the enrichments
        they left — unless they stop there (a short-circuit, a failure, anything the workflow must act on
        first), when it answers their entries alone. The hooks cost no local activity, marker or round
        trip of their own, each still recorded, spanned and named as its own invocation. Returns what they
        ran, for the before_planning stage to take (None: nothing was scheduled; the stage runs them).
        The attempt's plan is taken by :meth:`plan` (none when the hooks stopped it: planned there);
        ``ending``: as for :meth:`plan`."""
        state = self._state
        hooks = state.manifest.participants(Stage.BEFORE_PLANNING)
        dispatcher = self._runner.dispatcher
        if (
            not hooks
            or not dispatcher.local(hooks)
            or Stage.BEFORE_PLANNING in dispatcher.ran_ahead
            or state.manifest.participants(Stage.BEFORE_PLAN)
            or not state.manifest.tools
        ):
            return None
        phase = 1
        view = await self._before_plan(phase, 0)  # no before_plan hook: the attempt as it stands
        planned = PlannedPhase(Plan(phase=phase), None, 0, view.tools)
        spec = stages.STAGES[Stage.BEFORE_PLANNING]
        calls = [spec.build(hook, state.view(hook), state.enrichments) for hook in hooks]
        output, fused = await self._plan_activity(
            phase, 0, None, view.context_text, None, partial(self._fused, phase, planned, (hooks, calls), ending=ending)
        )
        assert fused is not None
        self._ahead = PlannedAhead(planned, fused, output)
        return fused.before_prerun(output)

    def _fused(
        self,
        phase: int,
        planned: PlannedPhase,
        before: tuple[list[HookEntry], list[HookCall]] | None = None,
        *,
        ending: Ending | None = None,
    ) -> FusedPlanning | None:
        """The phase's after_planning hooks for its planning activity to run on the plan it produces, where
        every one runs in-process (a batch's hooks), with the accepted plan's snapshot to write after them
        where the record can be handed over by reference (:data:`MAX_RECORD_WITH_PLAN_BYTES`); ``before``:
        the before_planning hooks (and their calls) it runs first. With that snapshot, ``ending``: should the
        plan be the planner's text answer, the hooks of the stages that follow, where every one runs
        in-process, and the terminal snapshot to write after them. The hooks cost no local activity, marker
        or round trip of their own, each still recorded, spanned and named as its own invocation."""
        state = self._state
        hooks = state.manifest.participants(Stage.AFTER_PLANNING)
        if not hooks or not self._runner.dispatcher.local(hooks):
            hooks = []
        if not hooks and before is None:
            return None
        before_hooks, before_calls = before or ([], [])
        spec, extras = stages.STAGES[Stage.AFTER_PLANNING], planned.after_planning(state)
        calls = [spec.build(hook, state.view(hook, phase), planned.plan, **extras) for hook in hooks]
        started = workflow.now()
        write, sent = None, ""
        if hooks and state.manifest.payload_store:
            sent = state.record.model_dump_json()
            if len(sent.encode()) <= MAX_RECORD_WITH_PLAN_BYTES:
                write = AcceptedPlanWrite(record=state.record, started=started, plan_phase=phase)
        follows = self._ending(ending) if write is not None else None
        segments, plan_ending = follows or ([], None)
        plan_hooks = PlanHooks(before=_dumped(before_calls), after=_dumped(calls), write=write, ending=plan_ending)
        return FusedPlanning(hooks, plan_hooks, started, before_hooks, before_calls, segments, sent if follows else "")

    def _ending(self, ending: Ending | None) -> tuple[Segments, PlanEnding] | None:
        """What a planning activity runs on into after a text answer (see :meth:`_fused`): each stage's
        hooks and calls, where there is any and every one runs in-process, and how the run then ends."""
        follows = ending() if ending is not None else None
        if follows is None:
            return None
        ahead, end = follows
        dispatcher = self._runner.dispatcher
        segments = dispatcher.segments(ahead)
        if not segments or not dispatcher.covers(ahead, segments):
            return None
        parts = [HookBatchSegment(stage=spec.stage, calls=_dumped(calls)) for spec, _, calls in segments]
        return segments, PlanEnding(segments=parts, end=end)

    async def _plan_activity(
        self,
        phase: int,
        attempt: int,
        available: list[str] | None,
        context_text: str,
        repair: PlanRepair | None,
        fuse: Callable[[], FusedPlanning | None] = lambda: None,
    ) -> tuple[PlanOutput, FusedPlanning | None]:
        """One planning attempt's activity, and the hooks it was handed to run (``fuse``: built for it, see
        :meth:`_fused`). An attempt handed to the fallback model gets them built again, on the run as it
        stands after the primary's failure (its failed calls in the record): the hooks' calls and the record
        it writes are then what this workflow builds on reaching their stage."""
        state = self._state
        record = state.record
        self._listing.enter(PLANNING)
        settings = state.manifest.settings
        summary = f"plan · phase {phase}" + (f" · attempt {attempt + 1}" if attempt else "")
        timeout, hooks_shown = settings.plan_timeout_seconds, ""
        fused, tried = fuse(), False
        if fused is not None:
            parts = [(Stage.BEFORE_PLANNING, fused.before), (Stage.AFTER_PLANNING, fused.entries)]
            hooks_shown = " with " + _named(parts)
            if fused.ending:
                hooks_shown += f" {ANSWERS} " + _named([(spec.stage, hooks) for spec, hooks, _ in fused.ending])
            ending_hooks = [hook for _, hooks, _ in fused.ending for hook in hooks]
            timeout += hooks_budget([*fused.before, *fused.entries, *ending_hooks])

        def arg(route: Route, asked: FallbackRequest | None) -> PlanInput:
            nonlocal fused, tried
            if tried and fused is not None:
                fused = fuse()
            tried = True
            return PlanInput(
                request=asked.ask if asked else state.ask,
                request_id=state.request_id,
                workflow_id=record.workflow_id,
                enrichments=state.enrichments,
                phase=phase,
                prior_results=[s.model_view() for s in record.steps],
                instructions=asked.instructions if asked else state.instructions,
                facts=asked.facts if asked else state.facts,
                max_tokens_remaining=self._tokens_left(),
                attempt=attempt,
                tools=available,
                context_text=context_text,
                repair=repair,
                prior_turns=list(state.model_turns),
                route=route,
                stream=self._streams_planning(),
                hooks=fused.hooks if fused is not None else None,
            )

        output = await self._model_activity(
            "planning",
            phase,
            "plan",
            arg,
            result_type=PlanOutput,
            timeout=timeout,
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[decisions.INVALID_PLAN]),
            summary=Shown(summary),
            failure=(decisions.PLANNING_FAILED, "planning failed"),
            hooks_shown=hooks_shown,
        )
        if output.planned:
            took_plan(record, output)
        else:  # nothing planned (the before_planning hooks stopped it, or the planner failed after them)
            record.model_calls.extend(output.model_calls)
        return output, fused

    def streamed_answer(self, plan: Plan) -> bool:
        """Whether ``plan``'s planning turn streamed its text answer to the request's answer stream."""
        return self._streams_planning() and bool(plan.answer) and not plan.steps

    def _streams_planning(self) -> bool:
        """Whether planning turns stream their text to the answer stream: where the request asked to
        stream, the pipeline allows it, and a planning turn's text answer is the answer's draft."""
        state = self._state
        settings = state.manifest.settings
        return state.input.stream_answer and settings.answer_streaming and not settings.dedicated_synthesis

    # -- synthesis -------------------------------------------------------------------------------------

    async def synthesize(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput:
        """The answer's draft: the planner's own text answer where it gave one, else the synthesizer's."""
        drafted = self._planner_answer(plan, execution)
        return drafted if drafted is not None else await self._synthesize(plan, execution)

    def text_answer(self, plan: Plan) -> str | None:
        """The planner's text answer that ``plan``, accepted as it is, ends the run with as the draft."""
        state = self._state
        if state.manifest.settings.dedicated_synthesis or plan.steps or state.planner_draft is None:
            return None
        return plan.answer or None

    def _planner_answer(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput | None:
        """The last planning turn's text answer as the draft, when it is one: the accepted plan of the last
        phase has no step (so its phase was not cut by the cap), the planner answered in text, and the
        pipeline does not ask for a dedicated synthesis call. No model call is made for it."""
        state = self._state
        text = self.text_answer(plan)
        if state.planner_draft is None or text is None:
            return None
        state.record.model_draft = self.draft_of(plan, text)
        return SynthesizeOutput(response=text, confidence=execution.confidence)

    def draft_of(self, plan: Plan, text: str) -> ModelDraft | None:
        """The record's draft of ``text``, the answer ``plan`` ends the run with: the planner's turn as the
        record keeps it, or, where an after_planning hook rewrote the answer, what the hook wrote."""
        draft = self._state.planner_draft
        if draft is not None and not draft.matches(text):
            draft = ModelDraft.of(text).model_copy(update={"stage": "planning", "phase": plan.phase})
        return draft

    async def _synthesize(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput:
        state = self._state
        self._listing.enter(SYNTHESIZING)

        def arg(route: Route, asked: FallbackRequest | None) -> SynthesizeInput:
            return SynthesizeInput(
                request=asked.ask if asked else state.ask,
                request_id=state.request_id,
                plan=plan,
                execution=ExecutionResult(steps=[s.model_view() for s in execution.steps]),
                enrichments=state.enrichments,
                instructions=asked.instructions if asked else state.instructions,
                facts=asked.facts if asked else state.facts,
                max_tokens_remaining=self._tokens_left(),
                stream=state.input.stream_answer and state.manifest.settings.answer_streaming,
                route=route,
            )

        output = await self._model_activity(
            "synthesis",
            None,
            "synthesize",
            arg,
            result_type=SynthesizeOutput,
            timeout=state.manifest.settings.synthesize_timeout_seconds,
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary=Shown("synthesize"),
            failure=(decisions.SYNTHESIS_FAILED, "synthesis failed"),
        )
        state.record.model_calls.extend(output.model_calls)
        # The draft is not yet guarded: the record keeps it by digest and a masked preview only.
        state.record.model_draft = output.draft or ModelDraft.of(output.response)
        return output

    # -- one model step, and the handoff to the fallback ------------------------------------------------

    async def _model_activity(
        self,
        stage: ModelStage,
        phase: int | None,
        activity: str,
        arg: Callable[[Route, FallbackRequest | None], Any],
        *,
        result_type: type[OutputT],
        timeout: float,
        retry_policy: RetryPolicy,
        summary: str,
        failure: tuple[str, str],
        hooks_shown: str = "",
    ) -> OutputT:
        """Run the planner's or the synthesizer's activity on the run's route. Its failure is the request's
        ``failure`` (type, message), the model calls made before it failed kept in the record — unless the
        primary model was unavailable and the stage has a fallback: then the run is handed over. The UI
        summary is ``summary``, `` · fallback`` on the fallback's route, then ``hooks_shown`` (the hooks the
        activity runs). ``arg`` is called for each route's attempt, on the run as it stands then."""
        state = self._state

        async def attempt(route: Route) -> OutputT:
            output = await self._scheduler.activity(
                activity,
                arg(route, state.fallback_request),
                result_type=result_type,
                timeout=timeout,
                retry_policy=retry_policy,
                summary=Shown(summary + ("" if route == "primary" else " · fallback") + hooks_shown),
            )
            state.record.handled_by = route
            return output

        try:
            return await attempt("fallback" if state.route == "fallback" else "primary")
        except ActivityError as err:
            raise_if_cancelled(err)
            self._record_failed_model_calls(err)
            if state.route == "fallback":
                raise _fallback_failure(err) from None
            if not self._hands_over(stage, err):
                raise stage_failure(*failure, err) from None
            reason = error_text(err)
        await self._hand_over(stage, phase, reason)
        try:
            return await attempt("fallback")
        except ActivityError as err:
            raise_if_cancelled(err)
            self._record_failed_model_calls(err)
            raise _fallback_failure(err) from None

    def _hands_over(self, stage: ModelStage, err: ActivityError) -> bool:
        """Whether this failure hands the run to the fallback: the primary model unavailable after its
        retries, in a stage that has a fallback model."""
        cause = err.cause
        unavailable = isinstance(cause, ApplicationError) and cause.type == decisions.MODEL_UNAVAILABLE
        return unavailable and stage in self._state.manifest.fallback

    async def _hand_over(self, stage: ModelStage, phase: int | None, reason: str) -> None:
        """Run before_fallback on a copy of what the fallback will be asked; a stop ends the run."""
        state = self._state
        view = FallbackRequest(
            stage=stage,
            phase=phase,
            ask=state.ask,
            instructions=state.instructions,
            facts=dict(state.facts),
            reason=reason,
            fallback_model=state.manifest.fallback.get(stage),
        )

        def on_outcome(
            hook: HookEntry, outcome: stages.run.BeforeFallbackOutcome, before: FallbackRequest, folded: Fold
        ) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, Stage.BEFORE_FALLBACK.value, outcome.stop.reason, outcome.stop.text)

        if state.manifest.participants(Stage.BEFORE_FALLBACK):
            self._listing.enter(Stage.BEFORE_FALLBACK)
            view = (await self._runner.run(stages.STAGES[Stage.BEFORE_FALLBACK], view, on_outcome)).subject
        state.route, state.fallback_request = "fallback", view

    def _tokens_left(self) -> int | None:
        """The request's model token budget left (``RunState.model_tokens_left``; None: no budget)."""
        return self._state.model_tokens_left()

    def _record_failed_model_calls(self, err: ActivityError) -> None:
        """Keep the model calls a failed planning or synthesis activity reported in its error details."""
        self._state.record.model_calls.extend(model_calls_in(activity_error_details(err).get("model_calls")))


def _fallback_failure(err: ActivityError) -> ApplicationError:
    """The request's failure when the fallback model failed too: ``FallbackFailed``, with the cause."""
    cause = err.cause
    message = getattr(cause, "message", None) or str(cause or err)
    details = {"cause": message, "cause_type": getattr(cause, "type", None) or type(cause).__name__}
    return ApplicationError(
        f"the fallback model failed after the primary had: {message}",
        details,
        type=decisions.FALLBACK_FAILED,
        non_retryable=True,
    )


def _dumped(calls: list[HookCall]) -> list[dict[str, Any]]:
    """Calls as an activity is handed them: JSON without the fields that hold their default."""
    return [call.model_dump(mode="json", exclude_defaults=True) for call in calls]


def _named(parts: list[tuple[Stage, list[HookEntry]]]) -> str:
    """``stage:hook + hook · stage:hook`` for the stages of ``parts`` that have hooks, as a summary names them."""
    return " · ".join(
        f"{stage.value}:" + " + ".join(dict.fromkeys(hook.name for hook in hooks)) for stage, hooks in parts if hooks
    )
