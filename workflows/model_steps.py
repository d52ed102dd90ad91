"""The request's planner and synthesizer steps: each one activity, its model calls and token spend kept in
the record, its failure the request's typed failure (``PlanningFailed``, ``SynthesisFailed``, or the
model's own error). Workflow code only."""

from __future__ import annotations

from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from . import decisions
    from .invocation import raise_if_cancelled
    from .listing import PLANNING, SYNTHESIZING, StageListing
    from .models import (
        MAX_RECORDED_PROMPT_CHARS,
        METADATA_MAX_MODEL_TOKENS,
        ExecutionResult,
        ModelCall,
        ModelDraft,
        Plan,
        PlanInput,
        PlanOutput,
        SynthesizeInput,
        SynthesizeOutput,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .support import activity_error_details, stage_failure


OutputT = TypeVar("OutputT", PlanOutput, SynthesizeOutput)


class ModelSteps:
    """Plans and synthesizes for one request (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing) -> None:
        self._state = state
        self._scheduler = scheduler
        self._listing = listing

    async def plan(self, phase: int) -> Plan:
        state = self._state
        record = state.record
        self._listing.enter(PLANNING)
        settings = state.manifest.settings
        output = await self._model_activity(
            "plan",
            PlanInput(
                request=state.ask,
                request_id=state.request_id,
                workflow_id=record.workflow_id,
                enrichments=state.enrichments,
                phase=phase,
                prior_results=[s.model_view() for s in record.steps],
                instructions=state.instructions,
                facts=state.facts,
                max_tokens_remaining=self._tokens_left(),
            ),
            result_type=PlanOutput,
            timeout=settings.plan_timeout_seconds,
            retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=[decisions.INVALID_PLAN]),
            summary=f"plan · phase {phase}",
            failure=(decisions.PLANNING_FAILED, "planning failed"),
        )
        record.model_calls.extend(output.model_calls)
        record.planning_prompt = output.prompt[:MAX_RECORDED_PROMPT_CHARS]
        record.planner = output.planner
        return output.plan

    async def synthesize(self, plan: Plan, execution: ExecutionResult) -> SynthesizeOutput:
        state = self._state
        self._listing.enter(SYNTHESIZING)
        output = await self._model_activity(
            "synthesize",
            SynthesizeInput(
                request=state.ask,
                request_id=state.request_id,
                plan=plan,
                execution=ExecutionResult(steps=[s.model_view() for s in execution.steps]),
                enrichments=state.enrichments,
                instructions=state.instructions,
                facts=state.facts,
                max_tokens_remaining=self._tokens_left(),
                stream=state.input.stream_answer and state.manifest.settings.answer_streaming,
            ),
            result_type=SynthesizeOutput,
            timeout=state.manifest.settings.synthesize_timeout_seconds,
            retry_policy=RetryPolicy(maximum_attempts=3),
            summary="synthesize",
            failure=(decisions.SYNTHESIS_FAILED, "synthesis failed"),
        )
        state.record.model_calls.extend(output.model_calls)
        # The draft is not yet guarded: the record keeps it by digest and a masked preview only.
        state.record.model_draft = output.draft or ModelDraft.of(output.response)
        return output

    async def _model_activity(
        self,
        activity: str,
        arg: Any,
        *,
        result_type: type[OutputT],
        timeout: float,
        retry_policy: RetryPolicy,
        summary: str,
        failure: tuple[str, str],
    ) -> OutputT:
        """Run the planner's or the synthesizer's activity; its failure is the request's ``failure`` (type,
        message), the model calls it made before it failed kept in the record."""
        try:
            return await self._scheduler.activity(
                activity, arg, result_type=result_type, timeout=timeout, retry_policy=retry_policy, summary=summary
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            self._record_failed_model_calls(err)
            raise stage_failure(*failure, err) from None

    def _tokens_left(self) -> int | None:
        """The request's model token budget — the pipeline's, or lower where the request's metadata asks —
        less what its recorded model calls spent (None: no budget)."""
        state = self._state
        budgets = [
            state.manifest.settings.max_model_tokens_per_request,
            state.input.metadata.get(METADATA_MAX_MODEL_TOKENS),
        ]
        limits = [budget for budget in budgets if type(budget) is int]
        return min(limits) - state.record.model_usage.total_tokens if limits else None

    def _record_failed_model_calls(self, err: ActivityError) -> None:
        """Keep the model calls a failed planning or synthesis activity reported in its error details."""
        calls = activity_error_details(err).get("model_calls")
        for call in calls if isinstance(calls, list) else []:
            try:
                self._state.record.model_calls.append(ModelCall.model_validate(call))
            except ValueError:
                pass  # not a model call this framework wrote: nothing to record
