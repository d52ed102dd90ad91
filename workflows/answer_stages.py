"""The stages between a request's last plan and its answer: after_execution, after_synthesis and
after_answer — and, where nothing else comes between them and the end, how the run ends if their hooks
leave the answer as it is (so the hooks' local activity may write the terminal record with them).

Workflow code, over the run state; the answer's text comes from ``model_steps.ModelSteps``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from . import stages
    from .invocation import Ahead, HookRunner, RunStopped
    from .model_steps import ModelSteps
    from .models import (
        AnswerView,
        ExecutionResult,
        HookEntry,
        ModelDraft,
        Plan,
        RunOutcomeView,
        StepResult,
        StepSummary,
        TerminalEnd,
    )
    from .run_state import RunState
    from .stages import STAND_IN_ANSWER, Fold, Stage
    from .support import cache_verdict


class AnswerStages:
    """after_execution → after_synthesis → after_answer for one request (see the module docstring)."""

    def __init__(self, state: RunState, hooks: HookRunner, models: ModelSteps) -> None:
        self._state, self._hooks, self._models = state, hooks, models

    # -- the stages that follow one another with nothing between (see ``HookRunner.run``'s ``ahead``) --

    def after_plan_accepted(self, plan: Plan) -> list[Ahead]:
        """After a plan that is the planner's text answer, if its after_planning hooks leave it as it is:
        after_execution (on the steps so far), then the draft's stages — no tool, checkpoint, record write
        or model call comes between them. None for any other plan."""
        if plan.continue_after or self._models.text_answer(plan) is None:
            return []
        return [Ahead(Stage.AFTER_EXECUTION, observed(self._state.record.steps)), *self.draft_stages(plan)]

    def after_text_answer(self) -> tuple[list[Ahead], TerminalEnd] | None:
        """What follows a planning attempt about to run, should its plan be the planner's text answer
        accepted as it is, built now on a stand-in for that answer (``stages.STAND_IN_ANSWER``, which the
        planning activity replaces, ``stages.answered``): the stages of :meth:`after_plan_accepted` and how
        the run then ends (:meth:`end`). None where the text answer would not be the draft (a dedicated
        synthesis call writes it) or something besides hooks comes before the end."""
        if self._state.manifest.settings.dedicated_synthesis:
            return None
        steps = list(self._state.record.steps)
        end = self.end(STAND_IN_ANSWER, None, ExecutionResult(steps=steps).confidence)
        if end is None:
            return None
        return [Ahead(Stage.AFTER_EXECUTION, observed(steps)), *self._draft_stages(STAND_IN_ANSWER)], end

    def end_after(self, plan: Plan) -> TerminalEnd | None:
        """How the run ends after ``plan`` if it is the planner's text answer (see :meth:`end`)."""
        text = self._models.text_answer(plan)
        if text is None:
            return None
        steps = list(self._state.record.steps)
        return self.end(text, self._models.draft_of(plan, text), ExecutionResult(steps=steps).confidence)

    def _ends_with_hooks(self) -> bool:
        """Whether nothing but hooks comes between the answer's stages and the end: no conversation memory
        to save, no lease to release, no error the run recovered from for on_error."""
        state = self._state
        return not (state.manifest.memory or state.leases or state.recovered)

    def end(self, answer: str, draft: ModelDraft | None, confidence: float | None) -> TerminalEnd | None:
        """How the run ends with ``answer`` if the hooks about to run and those of the stages after them —
        on_finish's included — leave it as it is, where nothing else comes between them and the end
        (:meth:`_ends_with_hooks`). None otherwise (the terminal snapshot is then the workflow's own write)."""
        state = self._state
        if not self._ends_with_hooks():
            return None
        verdict = cache_verdict(state.record, state.manifest.tools, "completed", answer)
        return TerminalEnd(
            final_response=answer,
            model_draft=draft,
            confidence=confidence,
            cache=verdict.model_copy(update={"response": None}),
        )

    def draft_stages(self, plan: Plan) -> list[Ahead]:
        """After after_execution, when the last plan's text answer is the draft (no synthesis call):
        after_synthesis on it, then after_answer."""
        text = self._models.text_answer(plan)
        return [] if text is None else self._draft_stages(text)

    def _draft_stages(self, text: str) -> list[Ahead]:
        return [Ahead(Stage.AFTER_SYNTHESIS, text), *self._answer_stage(text)]

    def _answer_stage(self, response: str) -> list[Ahead]:
        """after_answer on ``response``, where after_synthesis leaves it as it is (none for an empty answer:
        after_answer runs only once there is one)."""
        if not response.strip():
            return []
        view = self._view(response, "pipeline", self._state.step_summaries())
        return [Ahead(Stage.AFTER_ANSWER, view), *self._finish_stage(response)]

    def _finish_stage(self, answer: str) -> list[Ahead]:
        """on_finish on a run that completes with ``answer``, where nothing but hooks comes before the end:
        what each of its hooks sees then (see ``ending.RunEnding.finish``)."""
        if not self._ends_with_hooks():
            return []
        state = self._state
        outcome = RunOutcomeView(
            status="completed",
            response=answer,
            diagnostics=list(state.record.diagnostics),
            cache=cache_verdict(state.record, state.manifest.tools, "completed", answer),
        )
        return [Ahead(Stage.ON_FINISH, outcome)]

    # -- the stages ----------------------------------------------------------------------------------

    async def after_execution(self, execution: ExecutionResult, plan: Plan) -> None:
        """Observers of every step's outcome: its status, result text (capped) and error, not each raw
        output, so what every after_execution hook receives stays small however much the tools returned
        (the record keeps the raw outputs). Where ``plan``, the last, is the planner's text answer, its hooks
        may run on into the draft's stages and the end (:meth:`draft_stages`, :meth:`end_after`)."""
        ahead = self.draft_stages(plan)
        end = self.end_after(plan) if ahead else None
        await self._hooks.stage(Stage.AFTER_EXECUTION, observed(execution.steps), ahead=ahead, end=end)

    async def after_synthesis(self, response: str, confidence: float | None) -> str:
        """Rewrite the answer, chained; a hook that fails closed (redaction) ends the request rather than
        let its unguarded input out. Its hooks and after_answer's may be the run's last (:meth:`end`)."""
        end = self.end(response, self._state.record.model_draft, confidence)
        return await self._hooks.stage(Stage.AFTER_SYNTHESIS, response, ahead=self._answer_stage(response), end=end)

    async def after_answer(
        self, text: str, handled_by: Literal["pipeline", "short_circuit"], steps: list[StepSummary]
    ) -> str:
        """Rewrite the final answer (chained) or stop."""

        def on_outcome(hook: HookEntry, outcome: stages.answer.AfterAnswerOutcome, before: Any, folded: Fold) -> None:
            if outcome.stop is not None:
                raise RunStopped(hook.name, Stage.AFTER_ANSWER.value, outcome.stop.reason, outcome.stop.text)

        return (await self._hooks.stage(Stage.AFTER_ANSWER, self._view(text, handled_by, steps), on_outcome)).text

    def _view(
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


def observed(steps: Sequence[StepResult]) -> ExecutionResult:
    """What after_execution hooks observe of the steps: each one's status, result text (capped) and error."""
    return ExecutionResult(steps=[s.observer_view() for s in steps])
