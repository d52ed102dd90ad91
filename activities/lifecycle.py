"""The activities of ``RequestLifecycle``: pipeline resolution, hook invocation per stage, planning, tool
steps, synthesis and record persistence.

Built once per worker with its dependencies (``LifecycleActivities(registry=..., tools=..., ...)``) and
registered as bound methods. A hook invocation here is the complete framework-observed boundary: the
hook call, the check of what it returned (type, short-circuit contract, plan validation) and its span.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pydantic
from opentelemetry.trace import Span, Status, StatusCode
from pydantic import BaseModel, JsonValue
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from hooks.contracts import (
    DetachedContext,
    LeaseContext,
    PipelineContext,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    ShortCircuitKind,
    HookRejection,
)
from hooks.builtin.secret_redaction import redact
from hooks.registry import HookRegistry
from workflows import decisions
from workflows.models import (
    MAX_ENRICHMENT_BYTES,
    MAX_TOOL_OUTPUT_BYTES,
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
    DetachedEffectInput,
    DetachedWorkResult,
    EffectStatus,
    EffectUpdateInput,
    EnrichmentChange,
    EnrichmentOperation,
    HookDecision,
    HookEntry,
    HookRequestView,
    LeaseCall,
    LeaseKeeperReport,
    LeaseObservation,
    MemoryCandidate,
    MemoryOutcome,
    ModelDraft,
    ObserveOutcome,
    OnErrorCall,
    OnFinishCall,
    PersistRecordInput,
    PersistRecordOutput,
    PipelineManifest,
    Plan,
    PlanInput,
    PlanOutput,
    PlanStep,
    RememberInput,
    ResolvePipelineInput,
    ReviewSettings,
    ShortCircuitProposal,
    SkipMemory,
    Stage,
    StageSettings,
    Stop,
    SynthesizeInput,
    SynthesizeOutput,
    RunPatch,
    ToolDecision,
    ToolErrorCall,
    ToolErrorOutcome,
    ToolErrorResolution,
    ToolStepInput,
    ToolStepOutput,
    json_size,
)
from workflows.plan_validation import plan_problems

from . import telemetry
from .heartbeat import heartbeating, heartbeat_interval
from .planning import Planner, PlanningRequest, PromptBuilder, PromptInput, Synthesizer, build_planning_prompt
from .memory import ConversationMemory
from .store import ExecutionStore
from .tools import ToolContext, ToolRegistry

logger = logging.getLogger(__name__)
ResultT = TypeVar("ResultT", bound=BaseModel)

INVALID_ARGUMENTS = "InvalidArguments"
MAX_PRIVATE_STATE_BYTES = 64 * 1024
DRAFT_PREVIEW_CHARS = 160  # of the model's draft, secrets masked, as the record keeps it


class _HookFailed(Exception):
    """A failure the boundary found in what a hook did (not an exception the hook raised)."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a stage method; plain functions run in a thread so they cannot block the event loop."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result


def enrichment_changes(before: Mapping[str, JsonValue], after: Mapping[str, Any]) -> list[EnrichmentChange]:
    """The added, updated and removed keys between two enrichment maps, after checking the new map is
    JSON with string keys and within the size limit."""
    for key, value in after.items():
        if not isinstance(key, str) or not key:
            raise _HookFailed(decisions.INVALID_HOOK_RESULT, f"enrichment key {key!r} is not a non-empty string")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise _HookFailed(decisions.INVALID_HOOK_RESULT, f"enrichment {key!r} is not JSON: {err}") from None
    size = json_size(after)
    if size > MAX_ENRICHMENT_BYTES:
        raise _HookFailed(
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
        raise _HookFailed(decisions.INVALID_HOOK_RESULT, f"ctx.state must stay a dict, got {type(state).__name__}")
    try:
        json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise _HookFailed(decisions.INVALID_HOOK_RESULT, f"private state of {entry.name!r} is not JSON: {err}") from None
    size = json_size(state)
    if size > MAX_PRIVATE_STATE_BYTES:
        raise _HookFailed(
            decisions.INVALID_HOOK_RESULT, f"private state of {entry.name!r} is {size} bytes; the limit is {MAX_PRIVATE_STATE_BYTES}"
        )
    return state


def _failed_effects(ctx: PipelineContext, error: str) -> list[dict]:
    """Effects a failed invocation announced, as the record keeps them: a pending one can no longer
    complete (its detached work is never started), so it is failed with the invocation's error."""
    failed = []
    for effect in ctx.effects:
        if effect.status is EffectStatus.PENDING:
            effect = effect.model_copy(update={"status": EffectStatus.FAILED, "error": error, "summary": "submission failed"})
        failed.append(effect.model_dump(mode="json"))
    return failed


class LifecycleActivities:
    """Every activity ``RequestLifecycle`` schedules, bound to one worker's dependencies.

    Args:
        registry: The validated hook pipeline.
        tools: The tools plan steps may call.
        planner: Chooses tools; receives the prompt built by ``prompt_builder``.
        synthesizer: Writes the answer.
        store: Where execution records are persisted.
        settings: Timeouts and limits of the framework's own activities.
        cache_variation: Extra pipeline-owned cache dimensions (merged over the built-in ones).
        reserved_metadata_dimensions: Request-metadata keys that are cache dimensions (e.g. ``locale``).
        prompt_builder: Renders the planning prompt; the default renders the well-known enrichments.
        review: Who may decide checkpoints and how long they wait.
        search_attributes: Whether the lifecycle search attributes exist on the namespace (the worker
            checks and sets this; without them the workflow does not upsert them).
        memory: Conversation memory: completed runs are remembered (after before_remember hooks).
    """

    def __init__(
        self,
        *,
        registry: HookRegistry,
        tools: ToolRegistry,
        planner: Planner,
        synthesizer: Synthesizer,
        store: ExecutionStore,
        settings: StageSettings | None = None,
        cache_variation: Mapping[str, str] | None = None,
        reserved_metadata_dimensions: Sequence[str] = (),
        prompt_builder: PromptBuilder = build_planning_prompt,
        review: ReviewSettings | None = None,
        search_attributes: bool = False,
        memory: ConversationMemory | None = None,
    ) -> None:
        self.registry = registry
        self.tools = tools
        self.planner = planner
        self.synthesizer = synthesizer
        self.store = store
        self.settings = settings or StageSettings()
        self.prompt_builder = prompt_builder
        self.memory = memory
        self.manifest = PipelineManifest(
            pipeline=registry.pipeline,
            hooks=registry.entries,
            tools=tools.specs(),
            cache_variation={**self._builtin_variation(), **(cache_variation or {})},
            reserved_metadata_dimensions=list(reserved_metadata_dimensions),
            settings=self.settings,
            review=review or ReviewSettings(),
            search_attributes=search_attributes,
            memory=memory is not None,
        )

    def _builtin_variation(self) -> dict[str, str]:
        """Dimensions the orchestration owns: a cached answer is stale once any of them changes."""

        def digest(value: Any) -> str:
            return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]

        return {
            "pipeline": digest([(e.name, [s.value for s in e.stages]) for e in self.registry.entries]),
            "planner": getattr(self.planner, "name", type(self.planner).__name__),
            "synthesizer": getattr(self.synthesizer, "name", type(self.synthesizer).__name__),
            "tools": digest([t.model_dump(mode="json") for t in self.tools.specs()]),
        }

    def activities(self) -> list[Callable[..., Any]]:
        """The bound activity methods to give a ``Worker``."""
        return [
            self.resolve_pipeline,
            self.before_planning_hook,
            self.after_planning_hook,
            self.after_execution_hook,
            self.after_synthesis_hook,
            self.plan,
            self.execute_tool_step,
            self.synthesize,
            self.persist_execution_record,
            self.run_detached_work,
            self.merge_effect_update,
            self.keep_lease,
            self.release_lease,
            self.before_tool_hook,
            self.on_tool_error_hook,
            self.after_tool_hook,
            self.before_run_hook,
            self.after_answer_hook,
            self.before_remember_hook,
            self.on_error_hook,
            self.on_finish_hook,
            self.remember,
            self.validate_tool_arguments,
        ]

    # ------------------------------------------------------------------------------------------------
    # Pipeline
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name="resolve_pipeline")
    @heartbeating
    async def resolve_pipeline(self, input: ResolvePipelineInput) -> PipelineManifest:
        """The hooks (order, stages, required flag, run options), tools and cache dimensions of this
        worker, recorded in history so replay never depends on the worker's current configuration.
        Scoped hooks are filtered here: the request's tenant (metadata ``tenant_id``) and agent
        (``agent_id``) see only global hooks, their tenant's and their agent's (seed 004)."""
        tenant, agent = input.metadata.get("tenant_id"), input.metadata.get("agent_id")
        visible = self.registry.visible_entries(
            tenant if isinstance(tenant, str) else None, agent if isinstance(agent, str) else None
        )
        if len(visible) == len(self.manifest.hooks):
            return self.manifest
        return self.manifest.model_copy(update={"hooks": visible})

    # ------------------------------------------------------------------------------------------------
    # Hook invocation, one activity per stage
    # ------------------------------------------------------------------------------------------------

    def _context(self, entry: HookEntry, stage: Stage, view: HookRequestView) -> PipelineContext:
        return PipelineContext.create(
            request=view.request,
            metadata=view.metadata,
            enrichments=view.enrichments,
            request_id=view.request_id,
            workflow_id=view.workflow_id,
            stage=stage,
            hook_name=entry.name,
            gate=view.gate,
            plan_phase=view.plan_phase,
            hook=self.registry.hook(entry.name),
            instructions=view.instructions,
            facts=view.facts,
            state=view.state,
            managed_leases=view.leases,
        )

    async def _invoke(
        self,
        entry: HookEntry,
        stage: Stage,
        view: HookRequestView,
        run: Callable[[Any, PipelineContext, Span], Any],
    ) -> Any:
        """Run ``run(hook, ctx, span)`` inside the hook's span and translate failures into the
        categories the workflow decides on (``HookError``, ``InvalidHookResult``, ...)."""
        hook = self.registry.hook(entry.name)
        ctx = self._context(entry, stage, view)
        info = activity.info()
        final_attempt = info.attempt >= entry.max_attempts
        with telemetry.tracer().start_as_current_span(
            telemetry.hook_span_name(stage.value, entry.name),
            attributes={
                "pipeline.hook.name": entry.name,
                "pipeline.hook.stage": stage.value,
                "pipeline.hook.required": entry.required,
                "pipeline.request_id": view.request_id,
                "temporal.activity.attempt": info.attempt,
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
                self._mark_succeeded(span, outcome.decision)
                return outcome
            except _HookFailed as err:
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
            except Exception as err:  # the hook raised: the stage's failure policy decides
                deliberate = isinstance(err, HookRejection) or (
                    isinstance(err, ApplicationError) and err.non_retryable
                )
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

    @activity.defn(name="before_planning_hook")
    @heartbeating
    async def before_planning_hook(self, call: BeforePlanningCall) -> BeforePlanningOutcome:
        """Invoke one before_planning hook: its enrichment changes and its short-circuit, judged."""
        entry, view = call.hook, call.view

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforePlanningOutcome:
            if entry.before_planning_contract == "decision":
                returned = await _call(hook.before_planning_decision, ctx, ctx.gate)
            else:
                returned = await _call(hook.before_planning, ctx)
            proposal = self._proposal(entry, returned)
            changes = enrichment_changes(view.enrichments, ctx.enrichments)
            if proposal is None:
                decision = decisions.success_decision(entry, Stage.BEFORE_PLANNING)
            else:
                decision = decisions.short_circuit_decision(proposal, view.gate)
                accepted = decision.action.value == "short_circuit"
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
            return BeforePlanningOutcome(
                enrichment_changes=changes,
                short_circuit=proposal,
                decision=decision,
            )

        return await self._invoke(entry, Stage.BEFORE_PLANNING, view, run)

    @staticmethod
    def _proposal(entry: HookEntry, returned: Any) -> ShortCircuitProposal | None:
        """Check a before_planning return value against the hook's contract (seed 000 §6)."""
        if returned is None:
            return None
        if entry.before_planning_contract == "legacy":
            if not isinstance(returned, PipelineShortCircuit):
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT,
                    f"before_planning must return PipelineShortCircuit or None, got {type(returned).__name__}",
                )
            return ShortCircuitProposal(
                contract="legacy",
                kind=ShortCircuitKind.AUTHORITATIVE,
                response=returned.response,
                source=returned.source,
                metadata=returned.metadata,
            )
        if not isinstance(returned, PipelineShortCircuitDecision):
            raise _HookFailed(
                decisions.INVALID_HOOK_RESULT,
                f"before_planning_decision must return PipelineShortCircuitDecision or None, "
                f"got {type(returned).__name__}",
            )
        if returned.kind not in (ShortCircuitKind.AUTHORITATIVE, ShortCircuitKind.CACHE):
            raise _HookFailed(decisions.HOOK_CONTRACT_ERROR, f"unknown short-circuit kind {returned.kind!r}")
        if returned.short_circuit is None:
            raise _HookFailed(decisions.HOOK_CONTRACT_ERROR, "short-circuit decision has no short_circuit payload")
        payload = returned.short_circuit
        return ShortCircuitProposal(
            contract="decision",
            kind=returned.kind,
            response=payload.response,
            source=payload.source,
            metadata=payload.metadata,
            cached_against=returned.cached_against,
        )

    @activity.defn(name="after_planning_hook")
    @heartbeating
    async def after_planning_hook(self, call: AfterPlanningCall) -> AfterPlanningOutcome:
        """Invoke one after_planning hook on a private copy of the plan and validate what it returns."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterPlanningOutcome:
            returned = await _call(hook.after_planning, ctx, call.plan.model_copy(deep=True))
            if not isinstance(returned, Plan):
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT, f"after_planning must return a Plan, got {type(returned).__name__}"
                )
            try:
                plan = Plan.model_validate(returned.model_dump(mode="json"))
            except pydantic.ValidationError as err:
                raise _HookFailed(decisions.INVALID_HOOK_RESULT, f"returned plan is malformed: {err}") from None
            problems = self._plan_problems(plan, call.plan.phase, call.prior_step_ids)
            if problems:
                raise _HookFailed(decisions.INVALID_PLAN, "invalid plan: " + "; ".join(problems))
            decision = decisions.success_decision(entry, Stage.AFTER_PLANNING)
            return AfterPlanningOutcome(
                plan=plan, changed=plan != call.plan, decision=decision
            )

        return await self._invoke(entry, Stage.AFTER_PLANNING, call.view, run)

    @activity.defn(name="after_execution_hook")
    @heartbeating
    async def after_execution_hook(self, call: AfterExecutionCall) -> ObserveOutcome:
        """Invoke one observe-only after_execution hook."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> ObserveOutcome:
            returned = await _call(hook.after_execution, ctx, call.execution.model_copy(deep=True))
            if returned is not None:
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT,
                    f"after_execution is observe-only and must return None, got {type(returned).__name__}",
                )
            decision = decisions.success_decision(entry, Stage.AFTER_EXECUTION)
            return ObserveOutcome(decision=decision)

        return await self._invoke(entry, Stage.AFTER_EXECUTION, call.view, run)

    @activity.defn(name="after_synthesis_hook")
    @heartbeating
    async def after_synthesis_hook(self, call: AfterSynthesisCall) -> AfterSynthesisOutcome:
        """Invoke one after_synthesis hook; its string result becomes the next hook's input."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterSynthesisOutcome:
            returned = await _call(hook.after_synthesis, ctx, call.response)
            if not isinstance(returned, str):
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT,
                    f"after_synthesis must return str, got {type(returned).__name__}",
                )
            decision = decisions.success_decision(entry, Stage.AFTER_SYNTHESIS)
            return AfterSynthesisOutcome(
                response=returned, decision=decision
            )

        return await self._invoke(entry, Stage.AFTER_SYNTHESIS, call.view, run)

    # ------------------------------------------------------------------------------------------------
    # Tool-call stages (seeds 001, 003)
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name="before_tool_hook")
    @heartbeating
    async def before_tool_hook(self, call: BeforeToolCall) -> BeforeToolOutcome:
        """Invoke one before_tool hook; a modify is validated against the tool's parameters here, so
        invalid rewritten arguments never reach execution."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforeToolOutcome:
            returned = await _call(hook.before_tool, ctx, call.call.model_copy(deep=True))
            verdict = ToolDecision() if returned is None else returned
            if not isinstance(verdict, ToolDecision):
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT, f"before_tool must return ToolDecision or None, got {type(returned).__name__}"
                )
            if verdict.action == "stop" and not verdict.message.strip():
                raise _HookFailed(decisions.INVALID_HOOK_RESULT, "a stop decision needs the run's answer as its message")
            if verdict.action == "modify":
                if verdict.arguments is None:
                    raise _HookFailed(decisions.INVALID_HOOK_RESULT, "a modify decision needs arguments")
                step = PlanStep(
                    step_id=call.call.step_id,
                    namespace=call.call.namespace,
                    agent=call.call.agent,
                    capability=call.call.capability,
                    arguments=verdict.arguments,
                )
                problems = self.tools.argument_problems(step, resolved=True)
                if problems:
                    raise _HookFailed(decisions.INVALID_HOOK_RESULT, "rewritten arguments are invalid: " + "; ".join(problems))
            action, reason = {
                "allow": (DecisionAction.CONTINUE, decisions.REASON_ALLOWED),
                "modify": (DecisionAction.CONTINUE, decisions.REASON_MODIFIED),
                "deny": (DecisionAction.DENY, decisions.REASON_DENIED),
                "stop": (DecisionAction.STOP, decisions.REASON_STOPPED),
            }[verdict.action]
            decision = decisions.success_decision(entry, Stage.BEFORE_TOOL, reason, action)
            return BeforeToolOutcome(verdict=verdict, decision=decision)

        return await self._invoke(entry, Stage.BEFORE_TOOL, call.view, run)

    @activity.defn(name="on_tool_error_hook")
    @heartbeating
    async def on_tool_error_hook(self, call: ToolErrorCall) -> ToolErrorOutcome:
        """Invoke one on_tool_error hook: it may substitute a result and suppress the error."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> ToolErrorOutcome:
            returned = await _call(hook.on_tool_error, ctx, call.call.model_copy(deep=True), call.outcome.model_copy())
            resolution = ToolErrorResolution() if returned is None else returned
            if not isinstance(resolution, ToolErrorResolution):
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT,
                    f"on_tool_error must return ToolErrorResolution or None, got {type(returned).__name__}",
                )
            reason = decisions.REASON_HANDLED if resolution.handled else decisions.REASON_ACCEPTED
            decision = decisions.success_decision(entry, Stage.ON_TOOL_ERROR, reason)
            return ToolErrorOutcome(resolution=resolution, decision=decision)

        return await self._invoke(entry, Stage.ON_TOOL_ERROR, call.view, run)

    @activity.defn(name="after_tool_hook")
    @heartbeating
    async def after_tool_hook(self, call: AfterToolCall) -> AfterToolOutcome:
        """Invoke one after_tool hook: it may rewrite the result text, never the status."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterToolOutcome:
            returned = await _call(hook.after_tool, ctx, call.call.model_copy(deep=True), call.outcome.model_copy(deep=True))
            if returned is not None and not isinstance(returned, str):
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT, f"after_tool must return str or None, got {type(returned).__name__}"
                )
            result = call.outcome.result if returned is None else returned
            reason = decisions.REASON_ACCEPTED if result == call.outcome.result else decisions.REASON_REWRITTEN
            decision = decisions.success_decision(entry, Stage.AFTER_TOOL, reason)
            return AfterToolOutcome(result=result, decision=decision)

        return await self._invoke(entry, Stage.AFTER_TOOL, call.view, run)

    # ------------------------------------------------------------------------------------------------
    # Run-level extension stages (seed 003)
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name="before_run_hook")
    @heartbeating
    async def before_run_hook(self, call: BeforeRunCall) -> BeforeRunOutcome:
        """Invoke one before_run hook: rewrite the ask, instructions or facts, or stop the run."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforeRunOutcome:
            returned = await _call(hook.before_run, ctx, call.run.model_copy(deep=True))
            patch = stop = None
            if isinstance(returned, Stop):
                stop = returned
                if not stop.text.strip():
                    raise _HookFailed(decisions.INVALID_HOOK_RESULT, "before_run stopped the run with an empty answer")
            elif isinstance(returned, RunPatch):
                patch = returned
                if patch.ask is not None and not patch.ask.strip():
                    raise _HookFailed(decisions.INVALID_HOOK_RESULT, "before_run rewrote the ask to empty text")
            elif returned is not None:
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT, f"before_run must return RunPatch, Stop or None, got {type(returned).__name__}"
                )
            decision = (
                decisions.success_decision(entry, Stage.BEFORE_RUN, decisions.REASON_STOPPED, DecisionAction.STOP)
                if stop
                else decisions.success_decision(entry, Stage.BEFORE_RUN, decisions.REASON_MODIFIED if patch else None)
            )
            return BeforeRunOutcome(patch=patch, stop=stop, decision=decision)

        return await self._invoke(entry, Stage.BEFORE_RUN, call.view, run)

    @activity.defn(name="after_answer_hook")
    @heartbeating
    async def after_answer_hook(self, call: AfterAnswerCall) -> AfterAnswerOutcome:
        """Invoke one after_answer hook: rewrite the final text or stop; an empty answer is an error."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> AfterAnswerOutcome:
            returned = await _call(hook.after_answer, ctx, call.answer.model_copy(deep=True))
            stop = returned if isinstance(returned, Stop) else None
            if returned is None:
                text = call.answer.text
            elif isinstance(returned, str):
                text = returned
            elif stop is not None:
                text = stop.text
            else:
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT, f"after_answer must return str, Stop or None, got {type(returned).__name__}"
                )
            if not text.strip():
                raise _HookFailed(decisions.INVALID_HOOK_RESULT, "after_answer produced an empty answer")
            if stop:
                decision = decisions.success_decision(entry, Stage.AFTER_ANSWER, decisions.REASON_STOPPED, DecisionAction.STOP)
            else:
                reason = decisions.REASON_ACCEPTED if text == call.answer.text else decisions.REASON_REWRITTEN
                decision = decisions.success_decision(entry, Stage.AFTER_ANSWER, reason)
            return AfterAnswerOutcome(text=text, stop=stop, decision=decision)

        return await self._invoke(entry, Stage.AFTER_ANSWER, call.view, run)

    @activity.defn(name="before_remember_hook")
    @heartbeating
    async def before_remember_hook(self, call: BeforeRememberCall) -> BeforeRememberOutcome:
        """Invoke one before_remember hook: replace the memory candidate or skip saving it."""
        entry = call.hook

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> BeforeRememberOutcome:
            returned = await _call(hook.before_remember, ctx, call.candidate.model_copy(deep=True))
            candidate, skip, reason, action = call.candidate, None, decisions.REASON_ACCEPTED, DecisionAction.CONTINUE
            if isinstance(returned, SkipMemory):
                skip, reason, action = returned, decisions.REASON_MEMORY_SKIPPED, DecisionAction.SKIP
            elif isinstance(returned, MemoryCandidate):
                candidate, reason = returned, decisions.REASON_MEMORY_REPLACED
            elif returned is not None:
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT,
                    f"before_remember must return MemoryCandidate, SkipMemory or None, got {type(returned).__name__}",
                )
            decision = decisions.success_decision(entry, Stage.BEFORE_REMEMBER, reason, action)
            return BeforeRememberOutcome(
                candidate=candidate, skip=skip, decision=decision
            )

        return await self._invoke(entry, Stage.BEFORE_REMEMBER, call.view, run)

    @activity.defn(name="on_error_hook")
    @heartbeating
    async def on_error_hook(self, call: OnErrorCall) -> ObserveOutcome:
        """Invoke one on_error observer."""
        return await self._observe(call.hook, Stage.ON_ERROR, call.view, "on_error", call.error)

    @activity.defn(name="on_finish_hook")
    @heartbeating
    async def on_finish_hook(self, call: OnFinishCall) -> ObserveOutcome:
        """Invoke one on_finish observer."""
        return await self._observe(call.hook, Stage.ON_FINISH, call.view, "on_finish", call.outcome)

    async def _observe(self, entry: HookEntry, stage: Stage, view: HookRequestView, method: str, subject: Any) -> ObserveOutcome:
        async def run(hook: Any, ctx: PipelineContext, span: Span) -> ObserveOutcome:
            returned = await _call(getattr(hook, method), ctx, subject.model_copy(deep=True))
            if returned is not None:
                raise _HookFailed(
                    decisions.INVALID_HOOK_RESULT, f"{method} observes only and must return None, got {type(returned).__name__}"
                )
            decision = decisions.success_decision(entry, stage)
            return ObserveOutcome(decision=decision)

        return await self._invoke(entry, stage, view, run)

    @activity.defn(name="remember")
    @heartbeating
    async def remember(self, input: RememberInput) -> MemoryOutcome:
        """Save a completed run's memory candidate to the conversation memory."""
        if self.memory is None:
            raise ApplicationError("no conversation memory is configured", type="MemoryUnavailable", non_retryable=True)
        await self.memory.save(input.candidate, request_id=input.request_id)
        return MemoryOutcome(action="saved", conversation_id=input.candidate.conversation_id)

    # ------------------------------------------------------------------------------------------------
    # Plan, execute, synthesize, persist
    # ------------------------------------------------------------------------------------------------

    def _plan_problems(self, plan: Plan, phase: int, prior_step_ids: Sequence[str] = ()) -> list[str]:
        problems = plan_problems(
            plan, self.manifest.tools, max_steps=self.settings.max_plan_steps, phase=phase, prior_step_ids=prior_step_ids
        )
        for step in plan.steps:
            problems.extend(self.tools.argument_problems(step))
        return problems[:10]

    @activity.defn(name="plan")
    @heartbeating
    async def plan(self, input: PlanInput) -> PlanOutput:
        """Build the planning prompt from the enrichments and ask the planner for a valid plan."""
        tools = self.manifest.tools
        prompt = self.prompt_builder(
            PromptInput(
                request=input.request,
                enrichments=copy.deepcopy(input.enrichments),
                tools=tools,
                phase=input.phase,
                instructions=input.instructions,
                facts=copy.deepcopy(input.facts),
            )
        )
        plan = await self.planner.plan(
            PlanningRequest(
                request=input.request,
                request_id=input.request_id,
                prompt=prompt,
                enrichments=copy.deepcopy(input.enrichments),
                tools=tools,
                phase=input.phase,
                prior_results=[r.model_view() for r in input.prior_results],
                instructions=input.instructions,
                facts=copy.deepcopy(input.facts),
            )
        )
        if not isinstance(plan, Plan):
            raise ApplicationError(
                f"planner returned {type(plan).__name__}, not a Plan", type=decisions.INVALID_PLAN, non_retryable=True
            )
        problems = self._plan_problems(plan, input.phase, [r.step_id for r in input.prior_results])
        if problems:
            raise ApplicationError(
                "planner produced an invalid plan: " + "; ".join(problems),
                {"problems": problems},
                type=decisions.INVALID_PLAN,
                non_retryable=True,
            )
        return PlanOutput(plan=plan, prompt=prompt, planner=getattr(self.planner, "name", type(self.planner).__name__))

    @activity.defn(name="validate_tool_arguments")
    async def validate_tool_arguments(self, step: PlanStep) -> list[str]:
        """Why a step's resolved arguments do not fit its tool (empty when they do)."""
        return self.tools.argument_problems(step, resolved=True)

    @activity.defn(name="execute_tool_step")
    @heartbeating
    async def execute_tool_step(self, input: ToolStepInput) -> ToolStepOutput:
        """Run one plan step's tool with validated arguments and the step's idempotency key."""
        step = input.step
        tool = self.tools.get(step.tool_key)
        if tool is None:
            raise ApplicationError(f"unknown tool {step.tool_key}", type=INVALID_ARGUMENTS, non_retryable=True)
        try:
            arguments = tool.Arguments.model_validate(step.arguments)
        except pydantic.ValidationError as err:
            raise ApplicationError(
                f"invalid arguments for {step.tool_key}: {err}", type=INVALID_ARGUMENTS, non_retryable=True
            ) from None
        ctx = ToolContext(
            request_id=input.request_id,
            step_id=step.step_id,
            idempotency_key=input.idempotency_key,
            attempt=activity.info().attempt,
        )
        started = time.monotonic()
        try:
            output = await tool.run(arguments, ctx)
        except BaseException as err:
            telemetry.record_tool_call(step.tool, "failed" if isinstance(err, Exception) else "cancelled", started)
            raise
        telemetry.record_tool_call(step.tool, "succeeded", started)
        size = json_size(output)
        if size > MAX_TOOL_OUTPUT_BYTES:
            raise ApplicationError(
                f"{step.tool_key} returned {size} bytes; the limit is {MAX_TOOL_OUTPUT_BYTES}",
                type="ToolOutputTooLarge",
                non_retryable=True,
            )
        return ToolStepOutput(output=output)

    @activity.defn(name="synthesize")
    @heartbeating
    async def synthesize(self, input: SynthesizeInput) -> SynthesizeOutput:
        """Ask the synthesizer for the answer (the model output, before after_synthesis hooks)."""
        output = await self.synthesizer.synthesize(input)
        if not isinstance(output, SynthesizeOutput):
            raise ApplicationError(
                f"synthesizer returned {type(output).__name__}, not SynthesizeOutput",
                type="InvalidSynthesis",
                non_retryable=True,
            )
        masked, _ = redact(output.response[: DRAFT_PREVIEW_CHARS * 4])
        preview = masked[:DRAFT_PREVIEW_CHARS] + ("…" if len(masked) > DRAFT_PREVIEW_CHARS else "")
        return output.model_copy(update={"draft": ModelDraft.of(output.response, preview)})

    @activity.defn(name="persist_execution_record")
    @heartbeating
    async def persist_execution_record(self, input: PersistRecordInput) -> PersistRecordOutput:
        """Write a full record snapshot; an older or equal revision never replaces a newer one."""
        revision, written = await self.store.save(input.record)
        return PersistRecordOutput(stored_revision=revision, written=written)

    # ------------------------------------------------------------------------------------------------
    # Detached effects
    # ------------------------------------------------------------------------------------------------

    @activity.defn(name="run_detached_work")
    @heartbeating
    async def run_detached_work(self, input: DetachedEffectInput) -> DetachedWorkResult:
        """Run the work a hook detached, through that hook's ``run_detached``."""
        work = input.work
        try:
            hook = self.registry.hook(work.hook)
        except LookupError as err:
            raise ApplicationError(str(err), type="HookNotRegistered", non_retryable=True) from None
        ctx = DetachedContext(
            effect_id=work.effect_id,
            name=work.name,
            payload=copy.deepcopy(work.payload),
            request_id=input.request_id,
            workflow_id=input.parent_workflow_id,
            attempt=activity.info().attempt,
            run_id=input.parent_run_id,
        )
        with telemetry.tracer().start_as_current_span(
            f"pipeline.hook.detached.{work.hook}",
            attributes={"pipeline.hook.name": work.hook, "pipeline.effect_id": work.effect_id},
        ):
            returned = await _call(hook.run_detached, ctx)
        return _returned_or_default(returned, DetachedWorkResult, "run_detached")

    @activity.defn(name="merge_effect_update")
    @heartbeating
    async def merge_effect_update(self, input: EffectUpdateInput) -> PersistRecordOutput:
        """Merge a terminal effect into the stored record of its request (accepted once per effect)."""
        revision, written = await self.store.update_effect(input.workflow_id, input.run_id, input.effect)
        return PersistRecordOutput(stored_revision=revision, written=written)

    # ------------------------------------------------------------------------------------------------
    # Managed leases: renewed and released by the request owner (the workflow)
    # ------------------------------------------------------------------------------------------------

    def _lease_context(self, call: LeaseCall, ordinal: int = 0) -> tuple[Any, LeaseContext]:
        lease = call.lease
        try:
            hook = self.registry.hook(lease.hook)
        except LookupError as err:
            raise ApplicationError(str(err), type="HookNotRegistered", non_retryable=True) from None
        ctx = LeaseContext(
            lease_id=lease.lease_id,
            payload=copy.deepcopy(lease.payload),
            ttl_seconds=lease.ttl_seconds,
            request_id=call.request_id,
            workflow_id=call.workflow_id,
            ordinal=ordinal,
            attempt=activity.info().attempt,
            exit=call.exit,
        )
        return hook, ctx

    def _lease_span(self, method: str, call: LeaseCall):
        return telemetry.tracer().start_as_current_span(
            f"pipeline.hook.lease.{method}.{call.lease.hook}",
            attributes={
                "pipeline.hook.name": call.lease.hook,
                "pipeline.lease_id": call.lease.lease_id,
                "pipeline.request_id": call.request_id,
            },
        )

    @activity.defn(name="keep_lease")
    async def keep_lease(self, call: LeaseCall) -> LeaseKeeperReport:
        """Keep a managed lease alive until the request owner stops it: renew it through its hook's
        ``renew_lease`` every renew interval, heartbeating in between. One activity for the lease's whole
        life, however long the request waits; resumed on another worker from the last heartbeat's counts
        if this one dies. Returns what it did when the workflow cancels it."""
        lease = call.lease
        hook, _ = self._lease_context(call)
        details = activity.info().heartbeat_details
        report = LeaseKeeperReport.model_validate(details[0]) if details else LeaseKeeperReport()
        beat = heartbeat_interval() or 1.0
        try:
            while True:
                deadline = time.monotonic() + lease.renew_interval_seconds
                while (left := deadline - time.monotonic()) > 0:
                    activity.heartbeat(report.model_dump(mode="json"))
                    await asyncio.sleep(min(beat, left))
                report.submitted += 1
                _, ctx = self._lease_context(call, ordinal=call.ordinal + report.submitted)
                try:
                    with self._lease_span("renew_lease", call):
                        returned = await asyncio.wait_for(
                            _call(hook.renew_lease, ctx), timeout=max(1.0, min(30.0, lease.renew_interval_seconds))
                        )
                    observed = _returned_or_default(returned, LeaseObservation, "renew_lease")
                    report.renewed += 1
                    report.expires_at = observed.expires_at or report.expires_at
                except (Exception, asyncio.TimeoutError) as err:  # noqa: BLE001 - a provider error: counted
                    report.errors += 1
                    report.last_error = f"renew_lease of {lease.hook!r}: {err or type(err).__name__}"[:500]
                activity.heartbeat(report.model_dump(mode="json"))
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is not None and details.cancel_requested:
                return report  # the request owner stopped it: report what was done
            # Worker shutdown or a lost heartbeat: fail this attempt so the server retries it elsewhere,
            # continuing from the counts of the last heartbeat.
            raise ApplicationError("lease keeper interrupted", type="LeaseKeeperInterrupted") from None

    @activity.defn(name="release_lease")
    @heartbeating
    async def release_lease(self, call: LeaseCall) -> LeaseObservation:
        """Release a managed lease through its hook's ``release_lease`` (after its keeper has stopped)."""
        hook, ctx = self._lease_context(call)
        with self._lease_span("release_lease", call):
            try:
                returned = await _call(hook.release_lease, ctx)
            except Exception as err:  # noqa: BLE001 - a provider error the owner counts (after retries)
                raise ApplicationError(
                    f"release_lease of {call.lease.hook!r}: {err}", {"exception_type": type(err).__name__}, type="LeaseProviderError"
                ) from None
        return _returned_or_default(returned, LeaseObservation, "release_lease")


def _returned_or_default(returned: Any, expected: type[ResultT], method: str) -> ResultT:
    """``returned`` if it is an ``expected``, its default for ``None``; otherwise the hook broke its
    contract (never retried)."""
    if returned is None:
        return expected()
    if isinstance(returned, expected):
        return returned
    raise ApplicationError(
        f"{method} must return {expected.__name__} or None, got {type(returned).__name__}",
        type=decisions.INVALID_HOOK_RESULT,
        non_retryable=True,
    )
