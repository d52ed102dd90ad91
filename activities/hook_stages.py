"""The hook activities: one per stage (``<stage>_hook``, named by the stage table), each invoking one hook.

A hook invocation here is the complete framework-observed boundary: the call of the stage method, the
check of what it returned (type, short-circuit contract, plan validation), its span, and the effects,
detached work, leases and private state it leaves. Failures reach the workflow as the categories it
decides on: ``HookError`` (the hook raised), ``InvalidHookResult``, ``InvalidPlan``, ``HookContractError``
(the boundary rejected what it returned) — the workflow's stage table then says what that means.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import pydantic
from opentelemetry.trace import Span, Status, StatusCode
from pydantic import JsonValue
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from hooks.contracts import (
    HookRejection,
    PipelineContext,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    ShortCircuitKind,
)
from hooks.registry import HookRegistry
from workflows import decisions
from workflows.models import (
    MAX_ENRICHMENT_BYTES,
    MAX_INLINE_PAYLOAD_BYTES,
    MAX_STORED_PAYLOAD_BYTES,
    AfterAnswerCall,
    AfterAnswerOutcome,
    AfterExecutionCall,
    AfterPlanningCall,
    AfterPlanningOutcome,
    AfterSynthesisCall,
    AfterSynthesisOutcome,
    AfterToolCall,
    AfterToolOutcome,
    BeforePlanningCall,
    BeforePlanningOutcome,
    BeforeRememberCall,
    BeforeRememberOutcome,
    BeforeRunCall,
    BeforeRunOutcome,
    BeforeToolCall,
    BeforeToolOutcome,
    DecisionAction,
    EffectStatus,
    EnrichmentChange,
    EnrichmentOperation,
    HookBatchCall,
    HookBatchEntry,
    HookBatchFailure,
    HookBatchOutcome,
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    MemoryCandidate,
    ObserveOutcome,
    OnErrorCall,
    OnFinishCall,
    PipelineManifest,
    Plan,
    PlanStep,
    RunPatch,
    ShortCircuitProposal,
    SkipMemory,
    Stage,
    Stop,
    ToolDecision,
    ToolErrorCall,
    ToolErrorOutcome,
    ToolErrorResolution,
    json_size,
)
from workflows.stages import HOOK_BATCH_ACTIVITY, STAGES, next_call
from workflows.support import BATCH_TIMEOUT, NON_RETRYABLE_HOOK_FAILURES, hook_retry_delay

from . import telemetry
from .heartbeat import heartbeating
from .tools import ToolRegistry

logger = logging.getLogger(__name__)

MAX_PRIVATE_STATE_BYTES = 64 * 1024
# The attempt of the invocation running now, when a batch (not Temporal) retries it.
_BATCH_ATTEMPT: contextvars.ContextVar[int | None] = contextvars.ContextVar("hook_batch_attempt", default=None)


async def _attempts(
    invoke: Callable[[Any], Awaitable[HookOutcome]], call: HookCall
) -> tuple[HookOutcome | None, HookBatchFailure | None, int]:
    """One hook's invocation in a batch, retried as Temporal would retry its own activity: up to the
    hook's attempts, each within its timeout, the pause doubling; not after a failure retrying cannot
    change. Returns (outcome, None, attempts) or (None, why, attempts)."""
    entry = call.hook
    attempt = 1
    while True:
        token = _BATCH_ATTEMPT.set(attempt)
        try:
            async with asyncio.timeout(entry.timeout_seconds):
                outcome = await invoke(call)
            return outcome, None, attempt
        except ApplicationError as err:
            details = err.details[0] if err.details and isinstance(err.details[0], dict) else {}
            failure = HookBatchFailure(type=err.type or decisions.HOOK_ERROR, message=err.message, details=details)
            retryable = not err.non_retryable and err.type not in NON_RETRYABLE_HOOK_FAILURES
        except TimeoutError:
            failure = HookBatchFailure(type=BATCH_TIMEOUT, message=f"did not finish within {entry.timeout_seconds:g}s")
            retryable = True
        finally:
            _BATCH_ATTEMPT.reset(token)
        if not retryable or attempt >= entry.max_attempts:
            return None, failure, attempt
        await asyncio.sleep(hook_retry_delay(attempt))
        attempt += 1


class ResultRejected(Exception):
    """The boundary rejected what a hook returned or left behind (not an exception the hook raised);
    ``category`` is the failure category the workflow decides on."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


async def call_hook(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a hook method; plain functions run in a thread so they cannot block the event loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


def returned(value: Any, method: str, *types: type, none: bool = True, expected: str | None = None) -> Any:
    """``value`` if it is one of ``types`` (or ``None`` when ``none``); otherwise the hook broke its stage's
    contract: ``InvalidHookResult`` naming what the method must return."""
    if isinstance(value, types) or (none and value is None):
        return value
    if expected is None:
        names = [t.__name__ for t in types] + (["None"] if none else [])
        expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    raise ResultRejected(decisions.INVALID_HOOK_RESULT, f"{method} must return {expected}, got {type(value).__name__}")


def enrichment_changes(before: Mapping[str, JsonValue], after: Mapping[str, Any]) -> list[EnrichmentChange]:
    """The added, updated and removed keys between two enrichment maps, after checking the new map is
    JSON with string keys and within the size limit."""
    for key, value in after.items():
        if not isinstance(key, str) or not key:
            raise ResultRejected(decisions.INVALID_HOOK_RESULT, f"enrichment key {key!r} is not a non-empty string")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ResultRejected(decisions.INVALID_HOOK_RESULT, f"enrichment {key!r} is not JSON: {err}") from None
    size = json_size(after)
    if size > MAX_ENRICHMENT_BYTES:
        raise ResultRejected(
            decisions.INVALID_HOOK_RESULT,
            f"enrichments would be {size} bytes of JSON; the limit is {MAX_ENRICHMENT_BYTES}",
        )
    changes = []
    for key, value in after.items():
        if key not in before:
            changes.append(EnrichmentChange(key=key, operation=EnrichmentOperation.ADDED, after=value))
        elif before[key] != value:
            changes.append(
                EnrichmentChange(key=key, operation=EnrichmentOperation.UPDATED, before=before[key], after=value)
            )
    for key in before:
        if key not in after:
            changes.append(EnrichmentChange(key=key, operation=EnrichmentOperation.REMOVED, before=before[key]))
    return changes


def _checked_state(entry: HookEntry, state: Any) -> dict[str, JsonValue]:
    """A hook's private state after an invocation: a JSON object within the size limit."""
    if not isinstance(state, dict):
        raise ResultRejected(decisions.INVALID_HOOK_RESULT, f"ctx.state must stay a dict, got {type(state).__name__}")
    try:
        json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ResultRejected(
            decisions.INVALID_HOOK_RESULT, f"private state of {entry.name!r} is not JSON: {err}"
        ) from None
    size = json_size(state)
    if size > MAX_PRIVATE_STATE_BYTES:
        raise ResultRejected(
            decisions.INVALID_HOOK_RESULT,
            f"private state of {entry.name!r} is {size} bytes; the limit is {MAX_PRIVATE_STATE_BYTES}",
        )
    return state


def _failed_effects(ctx: PipelineContext, error: str) -> list[dict]:
    """Effects a failed invocation announced, as the record keeps them: a pending one can no longer
    complete (its detached work is never started), so it is failed with the invocation's error."""
    failed = []
    for effect in ctx.effects:
        if effect.status is EffectStatus.PENDING:
            effect = effect.model_copy(
                update={"status": EffectStatus.FAILED, "error": error, "summary": "submission failed"}
            )
        failed.append(effect.model_dump(mode="json"))
    return failed


Run = Callable[[Any, PipelineContext, Span], Awaitable[HookOutcome]]
ResultT = TypeVar("ResultT", bound=pydantic.BaseModel)


class HookStageActivities(abc.ABC):
    """The stage activities of ``LifecycleActivities`` (which provides ``registry``, ``tools`` and
    ``plan_problems``)."""

    registry: HookRegistry
    tools: ToolRegistry
    manifest: PipelineManifest

    def bounded(self, result: pydantic.BaseModel, what: str) -> None:
        """Refuse a result Temporal (or the payload store) could not carry — ``PayloadTooLarge``, which
        ends the request — instead of an activity completion the server would reject on every retry."""
        limit = MAX_STORED_PAYLOAD_BYTES if self.manifest.payload_store else MAX_INLINE_PAYLOAD_BYTES
        size = len(result.model_dump_json().encode())
        if size > limit:
            raise ResultRejected(
                decisions.PAYLOAD_TOO_LARGE, f"{what}: its result is {size} bytes; one payload may be at most {limit}"
            )

    def bounded_result(self, result: ResultT, what: str) -> ResultT:
        """``result``, checked by :meth:`bounded` (for the framework's own activities)."""
        try:
            self.bounded(result, what)
        except ResultRejected as err:
            raise ApplicationError(str(err), type=err.category, non_retryable=True) from None
        return result

    @abc.abstractmethod
    def plan_problems(self, plan: Plan, phase: int, prior_step_ids: Sequence[str] = ()) -> list[str]:
        """Why a plan an after_planning hook returned is invalid (empty when it is valid)."""

    def stage_activities(self) -> list[Callable[..., Any]]:
        """One bound activity per row of the stage table, and the batch activity that runs several."""
        found: list[Callable[..., Any]] = []
        for spec in STAGES.values():
            fn = getattr(self, spec.activity)
            assert activity._Definition.must_from_callable(fn).name == spec.activity, spec.activity
            found.append(fn)
        return [*found, self.run_hook_batch]

    @activity.defn(name=HOOK_BATCH_ACTIVITY)
    async def run_hook_batch(self, batch: HookBatchCall) -> HookBatchOutcome:
        """Invoke consecutive in-process hooks of one stage in order, each exactly as its own stage
        activity would (its span, its checks, its outcome), with its own timeout and attempts. Each hook
        after the first receives the stage as the previous one left it (``workflows.stages.next_call``).
        Stops after a hook that failed on its last attempt, or whose outcome only the workflow can carry
        on from; the workflow runs the rest."""
        spec = STAGES[batch.stage]
        invoke = getattr(self, spec.activity)
        planned = [spec.call.model_validate(call) for call in batch.calls]
        entries: list[HookBatchEntry] = []
        call: HookCall | None = planned[0]
        for index, _ in enumerate(planned):
            if call is None:
                break
            started = time.monotonic()
            outcome, failure, attempts = await _attempts(invoke, call)
            entries.append(
                HookBatchEntry(
                    hook=call.hook.name,
                    outcome=outcome,
                    failure=failure,
                    attempts=attempts,
                    duration_ms=round((time.monotonic() - started) * 1000.0, 3),
                )
            )
            if outcome is None or index + 1 == len(planned):
                break
            call = next_call(spec, call, outcome, planned[index + 1])
        return self.bounded_result(HookBatchOutcome(entries=entries), f"{batch.stage.value} batch")

    def _context(self, call: HookCall, stage: Stage) -> PipelineContext:
        view = call.view
        return PipelineContext.create(
            request=view.request,
            metadata=view.metadata,
            enrichments=view.enrichments,
            request_id=view.request_id,
            workflow_id=view.workflow_id,
            stage=stage,
            hook_name=call.hook.name,
            gate=view.gate,
            plan_phase=view.plan_phase,
            hook=self.registry.hook(call.hook.name),
            instructions=view.instructions,
            facts=view.facts,
            state=view.state,
            managed_leases=view.leases,
        )

    async def _invoke(self, call: HookCall, stage: Stage, run: Run) -> Any:
        """Run ``run(hook, ctx, span)`` inside the hook's span and translate failures into the
        categories the workflow decides on."""
        entry = call.hook
        hook = self.registry.hook(entry.name)
        ctx = self._context(call, stage)
        info = activity.info()
        attempt = _BATCH_ATTEMPT.get() or info.attempt
        final_attempt = attempt >= entry.max_attempts
        with telemetry.tracer().start_as_current_span(
            telemetry.hook_span_name(stage.value, entry.name),
            attributes={
                "pipeline.hook.name": entry.name,
                "pipeline.hook.stage": stage.value,
                "pipeline.hook.required": entry.required,
                "pipeline.request_id": call.view.request_id,
                "temporal.activity.attempt": attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                outcome = await run(hook, ctx, span)
                # What every stage's outcome carries besides its own result: added here, once.
                outcome.effects = ctx.effects
                outcome.detached = ctx.detached
                outcome.state = _checked_state(entry, ctx.state)
                outcome.leases = ctx.leases
                self.bounded(outcome, f"{stage.value} · {entry.name}")
                self._mark_succeeded(span, outcome.decision)
                return outcome
            except ResultRejected as err:
                self._mark_failed(span, entry, stage, err.category, str(err), final=True)
                raise ApplicationError(
                    str(err),
                    {"hook": entry.name, "effects": _failed_effects(ctx, str(err))},
                    type=err.category,
                    non_retryable=True,
                ) from None
            except asyncio.CancelledError:
                self._mark_failed(span, entry, stage, decisions.HOOK_TIMEOUT, "cancelled or timed out", final_attempt)
                raise
            except Exception as err:  # noqa: BLE001 - the hook raised: the stage's failure policy decides
                deliberate = isinstance(err, HookRejection) or (isinstance(err, ApplicationError) and err.non_retryable)
                span.record_exception(err)
                self._mark_failed(span, entry, stage, decisions.HOOK_ERROR, str(err), final_attempt or deliberate)
                raise ApplicationError(
                    str(err),
                    {
                        "hook": entry.name,
                        "exception_type": type(err).__name__,
                        "effects": _failed_effects(ctx, str(err)),
                    },
                    type=decisions.HOOK_ERROR,
                    non_retryable=deliberate,
                    # A deliberate refusal is an outcome, not a fault: no error log or failure metric.
                    category=ApplicationErrorCategory.BENIGN if deliberate else ApplicationErrorCategory.UNSPECIFIED,
                ) from None

    @staticmethod
    def _mark_failed(span: Span, entry: HookEntry, stage: Stage, category: str, message: str, final: bool) -> None:
        span.set_status(Status(StatusCode.ERROR, message[:512]))
        span.set_attribute("pipeline.hook.outcome", "failed")
        span.set_attribute("pipeline.hook.error_type", category)
        if final:
            span.set_attributes(telemetry.decision_attributes(decisions.failure_decision(entry, stage, category)))

    @staticmethod
    def _mark_succeeded(span: Span, decision: HookDecision) -> None:
        span.set_attribute("pipeline.hook.outcome", "succeeded")
        span.set_attributes(telemetry.decision_attributes(decision))

    # ------------------------------------------------------------------------------------------------
    # The stages, in lifecycle order
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name=STAGES[Stage.BEFORE_RUN].activity)
    @heartbeating
    async def before_run_hook(self, call: BeforeRunCall) -> BeforeRunOutcome:
        """Invoke one before_run hook: rewrite the ask, instructions or facts, or stop the run."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforeRunOutcome:
            value = returned(
                await call_hook(hook.before_run, ctx, call.run.model_copy(deep=True)), "before_run", RunPatch, Stop
            )
            if isinstance(value, Stop):
                if not value.text.strip():
                    raise ResultRejected(
                        decisions.INVALID_HOOK_RESULT, "before_run stopped the run with an empty answer"
                    )
                decision = decisions.success_decision(
                    call.hook, Stage.BEFORE_RUN, decisions.REASON_STOPPED, DecisionAction.STOP
                )
                return BeforeRunOutcome(stop=value, decision=decision)
            if value is not None and value.ask is not None and not value.ask.strip():
                raise ResultRejected(decisions.INVALID_HOOK_RESULT, "before_run rewrote the ask to empty text")
            reason = decisions.REASON_MODIFIED if value is not None else None
            return BeforeRunOutcome(
                patch=value, decision=decisions.success_decision(call.hook, Stage.BEFORE_RUN, reason)
            )

        return await self._invoke(call, Stage.BEFORE_RUN, run)

    @activity.defn(name=STAGES[Stage.BEFORE_PLANNING].activity)
    @heartbeating
    async def before_planning_hook(self, call: BeforePlanningCall) -> BeforePlanningOutcome:
        """Invoke one before_planning hook: its enrichment changes and its short-circuit, judged."""
        entry, view = call.hook, call.view

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforePlanningOutcome:
            if entry.before_planning_contract == "decision":
                value = await call_hook(hook.before_planning_decision, ctx, ctx.gate)
            else:
                value = await call_hook(hook.before_planning, ctx)
            proposal = _proposal(entry, value)
            changes = enrichment_changes(view.enrichments, ctx.enrichments)
            if proposal is None:
                decision = decisions.success_decision(entry, Stage.BEFORE_PLANNING)
            else:
                decision = decisions.short_circuit_decision(proposal, view.gate)
                accepted = decision.action is DecisionAction.SHORT_CIRCUIT
                telemetry.record_short_circuit(proposal.kind, decision.reason, "accepted" if accepted else "rejected")
                span.add_event(
                    "pipeline.short_circuit.decision",
                    {"kind": proposal.kind, "reason": decision.reason, "accepted": accepted, "source": proposal.source},
                )
                if proposal.contract == "legacy" and view.gate.reserved_dimensions:
                    logger.warning(
                        "hook %s returned a legacy short-circuit while reserved cache dimensions exist; it is "
                        "treated as authoritative. Cache hooks should use before_planning_decision.",
                        entry.name,
                    )
            return BeforePlanningOutcome(enrichment_changes=changes, short_circuit=proposal, decision=decision)

        return await self._invoke(call, Stage.BEFORE_PLANNING, run)

    @activity.defn(name=STAGES[Stage.AFTER_PLANNING].activity)
    @heartbeating
    async def after_planning_hook(self, call: AfterPlanningCall) -> AfterPlanningOutcome:
        """Invoke one after_planning hook on a private copy of the plan and validate what it returns."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterPlanningOutcome:
            value = await call_hook(hook.after_planning, ctx, call.plan.model_copy(deep=True))
            returned(value, "after_planning", Plan, none=False, expected="a Plan")
            try:
                plan = Plan.model_validate(value.model_dump(mode="json"))
            except pydantic.ValidationError as err:
                raise ResultRejected(decisions.INVALID_HOOK_RESULT, f"returned plan is malformed: {err}") from None
            problems = self.plan_problems(plan, call.plan.phase, call.prior_step_ids)
            if problems:
                raise ResultRejected(decisions.INVALID_PLAN, "invalid plan: " + "; ".join(problems))
            decision = decisions.success_decision(call.hook, Stage.AFTER_PLANNING)
            return AfterPlanningOutcome(plan=plan, changed=plan != call.plan, decision=decision)

        return await self._invoke(call, Stage.AFTER_PLANNING, run)

    @activity.defn(name=STAGES[Stage.BEFORE_TOOL].activity)
    @heartbeating
    async def before_tool_hook(self, call: BeforeToolCall) -> BeforeToolOutcome:
        """Invoke one before_tool hook; a modify is validated against the tool's parameters here, so
        invalid rewritten arguments never reach execution."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforeToolOutcome:
            value = returned(
                await call_hook(hook.before_tool, ctx, call.call.model_copy(deep=True)), "before_tool", ToolDecision
            )
            verdict = value or ToolDecision()
            if verdict.action == "stop" and not verdict.message.strip():
                raise ResultRejected(
                    decisions.INVALID_HOOK_RESULT, "a stop decision needs the run's answer as its message"
                )
            if verdict.action == "modify":
                if verdict.arguments is None:
                    raise ResultRejected(decisions.INVALID_HOOK_RESULT, "a modify decision needs arguments")
                step = PlanStep(
                    step_id=call.call.step_id,
                    namespace=call.call.namespace,
                    agent=call.call.agent,
                    capability=call.call.capability,
                    arguments=verdict.arguments,
                )
                problems = self.tools.argument_problems(step, resolved=True)
                if problems:
                    raise ResultRejected(
                        decisions.INVALID_HOOK_RESULT, "rewritten arguments are invalid: " + "; ".join(problems)
                    )
            action, reason = _TOOL_VERDICTS[verdict.action]
            decision = decisions.success_decision(call.hook, Stage.BEFORE_TOOL, reason, action)
            return BeforeToolOutcome(verdict=verdict, decision=decision)

        return await self._invoke(call, Stage.BEFORE_TOOL, run)

    @activity.defn(name=STAGES[Stage.ON_TOOL_ERROR].activity)
    @heartbeating
    async def on_tool_error_hook(self, call: ToolErrorCall) -> ToolErrorOutcome:
        """Invoke one on_tool_error hook: it may substitute a result and suppress the error."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> ToolErrorOutcome:
            value = await call_hook(hook.on_tool_error, ctx, call.call.model_copy(deep=True), call.outcome.model_copy())
            resolution = returned(value, "on_tool_error", ToolErrorResolution) or ToolErrorResolution()
            reason = decisions.REASON_HANDLED if resolution.handled else decisions.REASON_ACCEPTED
            return ToolErrorOutcome(
                resolution=resolution, decision=decisions.success_decision(call.hook, Stage.ON_TOOL_ERROR, reason)
            )

        return await self._invoke(call, Stage.ON_TOOL_ERROR, run)

    @activity.defn(name=STAGES[Stage.AFTER_TOOL].activity)
    @heartbeating
    async def after_tool_hook(self, call: AfterToolCall) -> AfterToolOutcome:
        """Invoke one after_tool hook: it may rewrite the result text, never the status."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterToolOutcome:
            value = await call_hook(
                hook.after_tool, ctx, call.call.model_copy(deep=True), call.outcome.model_copy(deep=True)
            )
            result = returned(value, "after_tool", str)
            result = call.outcome.result if result is None else result
            reason = decisions.REASON_ACCEPTED if result == call.outcome.result else decisions.REASON_REWRITTEN
            return AfterToolOutcome(
                result=result, decision=decisions.success_decision(call.hook, Stage.AFTER_TOOL, reason)
            )

        return await self._invoke(call, Stage.AFTER_TOOL, run)

    @activity.defn(name=STAGES[Stage.AFTER_EXECUTION].activity)
    @heartbeating
    async def after_execution_hook(self, call: AfterExecutionCall) -> ObserveOutcome:
        """Invoke one observe-only after_execution hook."""
        return await self._observe(call, Stage.AFTER_EXECUTION, "after_execution", call.execution)

    @activity.defn(name=STAGES[Stage.AFTER_SYNTHESIS].activity)
    @heartbeating
    async def after_synthesis_hook(self, call: AfterSynthesisCall) -> AfterSynthesisOutcome:
        """Invoke one after_synthesis hook; its string result becomes the next hook's input."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterSynthesisOutcome:
            response = returned(
                await call_hook(hook.after_synthesis, ctx, call.response), "after_synthesis", str, none=False
            )
            return AfterSynthesisOutcome(
                response=response, decision=decisions.success_decision(call.hook, Stage.AFTER_SYNTHESIS)
            )

        return await self._invoke(call, Stage.AFTER_SYNTHESIS, run)

    @activity.defn(name=STAGES[Stage.AFTER_ANSWER].activity)
    @heartbeating
    async def after_answer_hook(self, call: AfterAnswerCall) -> AfterAnswerOutcome:
        """Invoke one after_answer hook: rewrite the final text or stop; an empty answer is an error."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterAnswerOutcome:
            value = returned(
                await call_hook(hook.after_answer, ctx, call.answer.model_copy(deep=True)), "after_answer", str, Stop
            )
            stop = value if isinstance(value, Stop) else None
            text: str = call.answer.text if value is None else value.text if isinstance(value, Stop) else value
            if not text.strip():
                raise ResultRejected(decisions.INVALID_HOOK_RESULT, "after_answer produced an empty answer")
            if stop:
                decision = decisions.success_decision(
                    call.hook, Stage.AFTER_ANSWER, decisions.REASON_STOPPED, DecisionAction.STOP
                )
            else:
                reason = decisions.REASON_ACCEPTED if text == call.answer.text else decisions.REASON_REWRITTEN
                decision = decisions.success_decision(call.hook, Stage.AFTER_ANSWER, reason)
            return AfterAnswerOutcome(text=text, stop=stop, decision=decision)

        return await self._invoke(call, Stage.AFTER_ANSWER, run)

    @activity.defn(name=STAGES[Stage.BEFORE_REMEMBER].activity)
    @heartbeating
    async def before_remember_hook(self, call: BeforeRememberCall) -> BeforeRememberOutcome:
        """Invoke one before_remember hook: replace the memory candidate or skip saving it."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforeRememberOutcome:
            value = await call_hook(hook.before_remember, ctx, call.candidate.model_copy(deep=True))
            value = returned(value, "before_remember", MemoryCandidate, SkipMemory)
            if isinstance(value, SkipMemory):
                decision = decisions.success_decision(
                    call.hook, Stage.BEFORE_REMEMBER, decisions.REASON_MEMORY_SKIPPED, DecisionAction.SKIP
                )
                return BeforeRememberOutcome(candidate=call.candidate, skip=value, decision=decision)
            reason = decisions.REASON_MEMORY_REPLACED if value is not None else decisions.REASON_ACCEPTED
            decision = decisions.success_decision(call.hook, Stage.BEFORE_REMEMBER, reason)
            return BeforeRememberOutcome(candidate=value or call.candidate, decision=decision)

        return await self._invoke(call, Stage.BEFORE_REMEMBER, run)

    @activity.defn(name=STAGES[Stage.ON_ERROR].activity)
    @heartbeating
    async def on_error_hook(self, call: OnErrorCall) -> ObserveOutcome:
        """Invoke one on_error observer."""
        return await self._observe(call, Stage.ON_ERROR, "on_error", call.error)

    @activity.defn(name=STAGES[Stage.ON_FINISH].activity)
    @heartbeating
    async def on_finish_hook(self, call: OnFinishCall) -> ObserveOutcome:
        """Invoke one on_finish observer."""
        return await self._observe(call, Stage.ON_FINISH, "on_finish", call.outcome)

    async def _observe(self, call: HookCall, stage: Stage, method: str, subject: pydantic.BaseModel) -> ObserveOutcome:
        async def run(hook: Any, ctx: PipelineContext, span: Span) -> ObserveOutcome:
            value = await call_hook(getattr(hook, method), ctx, subject.model_copy(deep=True))
            if value is not None:
                raise ResultRejected(
                    decisions.INVALID_HOOK_RESULT,
                    f"{method} observes only and must return None, got {type(value).__name__}",
                )
            return ObserveOutcome(decision=decisions.success_decision(call.hook, stage))

        return await self._invoke(call, stage, run)


_TOOL_VERDICTS = {
    "allow": (DecisionAction.CONTINUE, decisions.REASON_ALLOWED),
    "modify": (DecisionAction.CONTINUE, decisions.REASON_MODIFIED),
    "deny": (DecisionAction.DENY, decisions.REASON_DENIED),
    "stop": (DecisionAction.STOP, decisions.REASON_STOPPED),
}


def _proposal(entry: HookEntry, value: Any) -> ShortCircuitProposal | None:
    """Check a before_planning return value against the hook's contract: a legacy short-circuit is
    authoritative; a decision must name a known kind and carry its payload (else ``HookContractError``)."""
    if entry.before_planning_contract == "legacy":
        legacy = returned(value, "before_planning", PipelineShortCircuit)
        if legacy is None:
            return None
        return ShortCircuitProposal(
            contract="legacy",
            kind=ShortCircuitKind.AUTHORITATIVE,
            response=legacy.response,
            source=legacy.source,
            metadata=legacy.metadata,
        )
    decided = returned(value, "before_planning_decision", PipelineShortCircuitDecision)
    if decided is None:
        return None
    if decided.kind not in (ShortCircuitKind.AUTHORITATIVE, ShortCircuitKind.CACHE):
        raise ResultRejected(decisions.HOOK_CONTRACT_ERROR, f"unknown short-circuit kind {decided.kind!r}")
    if decided.short_circuit is None:
        raise ResultRejected(decisions.HOOK_CONTRACT_ERROR, "short-circuit decision has no short_circuit payload")
    payload = decided.short_circuit
    return ShortCircuitProposal(
        contract="decision",
        kind=decided.kind,
        response=payload.response,
        source=payload.source,
        metadata=payload.metadata,
        cached_against=decided.cached_against,
    )
