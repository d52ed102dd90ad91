"""How a request ends, whatever ended it: its managed leases released (renewal stopped first), on_error
and on_finish once per hook, then the terminal record — written whatever happens to the cleanup and the
finalizers. Workflow code only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import JsonValue

    from . import decisions, stages, story
    from .effects import record_effects
    from .invocation import HookRunner, RunStopped
    from .listing import COMPLETED, RELEASING_LEASES, StageListing
    from .models import (
        CacheVerdict,
        ExecutionRecord,
        LifecycleBoundary,
        RequestError,
        RequestResult,
        RequestStatus,
        RunErrorView,
        RunOutcomeView,
        ShortCircuitInfo,
        SnapshotAttempt,
        StopInfo,
    )
    from .records import RecordKeeper
    from .reviews import CHECKPOINT_EXPIRED, CHECKPOINT_REJECTED
    from .run_state import RunState
    from .scheduling import Scheduler
    from .support import cache_verdict

Exit = Literal["completed", "stopped", "error", "cancelled"]

# Where each error that ends a request comes from, as on_error hooks see it (``harness`` otherwise).
ERROR_ORIGINS = {
    decisions.EXTENSION_ERROR: "extension",
    decisions.REQUIRED_AFTER_PLANNING_ERROR: "extension",
    decisions.HOOK_CONTRACT_ERROR: "extension",
    decisions.PLANNING_FAILED: "model",
    decisions.SYNTHESIS_FAILED: "model",
    **dict.fromkeys(decisions.MODEL_FAILURES, "model"),
    decisions.TOKEN_BUDGET_EXCEEDED: "budget",
    decisions.PROMPT_BUDGET_EXCEEDED: "budget",
    decisions.FALLBACK_FAILED: "fallback",
    decisions.PIPELINE_UNAVAILABLE: "config",
    CHECKPOINT_REJECTED: "confirmation",
    CHECKPOINT_EXPIRED: "confirmation",
    decisions.WORKER_LOST: "harness",
    decisions.PAYLOAD_TOO_LARGE: "harness",
    "Cancelled": "cancelled",
}
# A planning or synthesis failure whose cause is a setting, not the model: the pipeline has no planner.
_CONFIG_CAUSES = frozenset({"NoPlanner"})


def request_result(
    state: RunState,
    response: str,
    confidence: float,
    metadata: dict[str, JsonValue],
    *,
    short_circuit: ShortCircuitInfo | None = None,
    stopped: StopInfo | None = None,
) -> RequestResult:
    """The request's result: its answer, with the steps that ran (none, for a short-circuit), and what
    answered it where that was not the pipeline (``short_circuit``, ``stopped``)."""
    return RequestResult(
        request_id=state.request_id,
        workflow_id=state.record.workflow_id,
        response=response,
        confidence=confidence,
        metadata=metadata,
        steps=state.step_summaries(),
        short_circuit=short_circuit,
        stopped=stopped,
    )


@dataclass
class RunEnding:
    """Ends one request (see the module docstring), through the request workflow's own parts: its hook
    runner, scheduler, stage listing and record keeper."""

    state: RunState
    runner: HookRunner
    scheduler: Scheduler
    listing: StageListing
    records: RecordKeeper

    async def finish(
        self, status: RequestStatus, exit: Exit, *, response: str | None = None, error: RequestError | None = None
    ) -> None:
        """Managed-lease cleanup (renewal joined first), finalizers, then the terminal record."""
        state = self.state
        self.runner.unreached()
        try:
            await self._release_leases(exit)
            cache = cache_verdict(state.record, state.manifest.tools, exit, state.synthesized)
            state.record.cache = cache.model_copy(update={"response": None})
            await self._finalize(exit, response=response, error=self.error_view(error) if error else None, cache=cache)
        finally:
            await self._terminal(status, error)

    def stopped(self, stop: RunStopped) -> RequestResult:
        """The result of a run a hook stopped, with the hook's text as its answer."""
        state = self.state
        info = StopInfo(extension=stop.extension, phase=stop.phase, reason=stop.reason)
        state.record.stopped = info
        state.record.final_response = stop.text
        return request_result(state, stop.text, 1.0, {"pipeline": state.manifest.pipeline}, stopped=info)

    def error_view(self, error: RequestError) -> RunErrorView:
        origin = ERROR_ORIGINS.get(error.type, "harness")
        if error.details.get("cause_type") in _CONFIG_CAUSES:
            origin = "config"
        return RunErrorView(
            origin=origin,  # type: ignore[arg-type]
            type=error.type,
            message=error.message,
            details=error.details,
            steps=self.state.step_summaries(),
        )

    async def _release_leases(self, exit: Exit) -> None:
        """Stop and join every lease keeper, then release each lease (see ``workflows.leases``)."""
        state = self.state
        if not state.leases:
            return
        self.listing.enter(RELEASING_LEASES)
        effects = await state.leases.release_all(
            exit, state.manifest.settings, state.record.effect, self.scheduler.note_worker_lost
        )
        record_effects(state.record, effects)

    async def _finalize(
        self, exit: Exit, *, response: str | None, error: RunErrorView | None, cache: CacheVerdict
    ) -> None:
        """on_error for each error the run recovered from, in order, and for the error or cancellation that
        ended it; then on_finish: once per hook, whatever happened, also for hooks whose other stages were
        never reached. Their failures are diagnostics only."""
        record = self.state.record
        observed = [*self.state.recovered, *([error] if error is not None else [])]
        if observed:
            self.listing.enter(stages.Stage.ON_ERROR)
        for seen in observed:
            await self.runner.run(stages.STAGES[stages.Stage.ON_ERROR], seen)
        self.listing.enter(stages.Stage.ON_FINISH)
        outcome = RunOutcomeView(
            status=exit, response=response, stopped=record.stopped, error=error, diagnostics=[], cache=cache
        )
        # Each observer sees the diagnostics of the ones before it.
        await self.runner.run(
            stages.STAGES[stages.Stage.ON_FINISH],
            outcome,
            refresh=lambda seen: seen.model_copy(update={"diagnostics": list(record.diagnostics)}),
        )

    async def _terminal(self, status: RequestStatus, error: RequestError | None) -> None:
        state = self.state
        record = state.record
        record.status = status
        record.error = error
        terminal = COMPLETED if status is RequestStatus.SUCCEEDED else str(status)
        record.completed_at = workflow.now()
        self.listing.enter(
            terminal,
            outcome=self._outcome(status, error),
            more=story.reviewed_lines(record.checkpoints, with_text=state.manifest.ui_shows_text),
        )
        self.listing.publish()
        tried, wrote = self._written_with_hooks(status)
        try:
            await self.records.persist(LifecycleBoundary.TERMINAL, tried, wrote=wrote)
        except ApplicationError as err:
            if err.type == decisions.RECORD_NOT_STORED:
                # Listed as it ends: failed, whatever it was listed as a moment ago.
                self.listing.enter(str(RequestStatus.FAILED), outcome=story.failure_headline(err.type, err.message))
                self.listing.publish()
            raise

    def _written_with_hooks(self, status: RequestStatus) -> tuple[SnapshotAttempt | None, ExecutionRecord | None]:
        """The terminal snapshot the activity of the run's last hooks tried to write (a local batch's
        ``end``, or the planning activity's that answered), and the snapshot it wrote, for
        ``RecordKeeper.persist``: only a run that completed can be that snapshot; any other end is written
        with the next revision."""
        ended = self.state.end_attempt
        if ended is None:
            return None, None
        if status is not RequestStatus.SUCCEEDED:
            return ended.attempt.model_copy(update={"written": False}), None
        return ended.attempt, ended.written()

    def _outcome(self, status: RequestStatus, error: RequestError | None) -> str:
        """How the request ended, in one line: the failure's type and reason, who stopped it, or the answer
        (where the UI may show no text: the type, who stopped it, the status)."""
        with_text = self.state.manifest.ui_shows_text
        if error is not None:
            return story.failure_outcome(error.type, error.message, with_text=with_text)
        record = self.state.record
        stopped = record.stopped
        if not with_text:
            return f"stopped by {stopped.extension} at {stopped.phase}" if stopped is not None else status.value
        if stopped is not None:
            return f"stopped by {stopped.extension} at {stopped.phase}: {stopped.reason}"
        answer = record.final_response or ""
        served = record.short_circuit
        by = f" (short-circuit by {served.source}: {served.reason})" if served is not None else ""
        return f"{status.value}{by} — answer: {answer}"
