"""The hook activities: one per stage (``<stage>_hook``, named by its stage), each invoking one hook, all
with one body: the stage says what its method receives and judges what it returned. In-process hooks run
as local activities typed by the hooks they run (``<stage>:<hook>``, a batch ``<stage>:<hook> + ...``),
all served by one dynamic activity with the same body (``run_named_hooks``).

A hook invocation here is the complete framework-observed boundary: the call of the stage method, the
check of what it returned (type, short-circuit contract, plan validation), its span, and the effects,
detached work, leases and private state it leaves. Failures reach the workflow as the categories it
decides on: ``HookError`` (the hook raised), ``InvalidHookResult``, ``InvalidPlan``, ``HookContractError``
(the boundary rejected what it returned) — the stage's decisions then say what that means.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pydantic
from opentelemetry.trace import Span, Status, StatusCode
from pydantic import JsonValue
from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from hooks.contracts import HookRejection, PipelineContext
from hooks.model_budget import metered
from hooks.registry import HookRegistry
from workflows import decisions, snapshots
from workflows.models import (
    MAX_INLINE_PAYLOAD_BYTES,
    MAX_STORED_PAYLOAD_BYTES,
    AcceptedPlanWrite,
    DecisionAction,
    EffectStatus,
    ExecutionRecord,
    HookBatchCall,
    HookBatchEntry,
    HookBatchFailure,
    HookBatchOutcome,
    HookBatchSegment,
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    ModelUsage,
    PipelineManifest,
    Plan,
    PlanEnding,
    PlanInput,
    PlanOutput,
    PlanStep,
    RecordedOutcome,
    ShortCircuitProposal,
    SnapshotAttempt,
    Stage,
    TerminalWrite,
    json_size,
)
from workflows.stages import (
    HOOK_BATCH_ACTIVITY,
    STAGES,
    ResultRejected,
    StageSpec,
    answered,
    hands_on,
    hook_stage_of,
    next_call,
    returned,
)
from workflows.support import BATCH_TIMEOUT, NON_RETRYABLE_HOOK_FAILURES, hook_retry_delay

from . import telemetry
from .heartbeat import heartbeating
from .stoppable import HookAttempt, call_stoppable
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


async def call_hook(fn: Callable[..., Any], *args: Any, where: HookAttempt | None = None) -> Any:
    """Call a hook method so that it stops when its invocation times out or is cancelled: a plain
    function in a thread of its own (it cannot block the event loop), a coroutine in a task of its own.
    ``where``: the invocation it belongs to, whose earlier attempts it never overlaps (see
    ``activities.stoppable``)."""
    return await call_stoppable(fn, args, where)


async def _within_attempt(spec: StageSpec, call: HookCall, invoke: Awaitable[Any]) -> Any:
    """One invocation of one hook as its own activity: ended by this worker when its attempt's
    start-to-close timeout is up, as the server ends it, so that the hook is stopped then — the server
    tells a worker nothing when it times an attempt out. (A local activity's timeout is the worker's
    own: it cancels the attempt then.)"""
    info = activity.info()
    timeout = info.start_to_close_timeout
    if info.is_local or timeout is None:
        return await invoke
    try:
        async with asyncio.timeout(timeout.total_seconds()):
            return await invoke
    except TimeoutError:
        raise ApplicationError(
            f"hook did not finish within {call.hook.timeout_seconds:g}s (start_to_close)",
            {"hook": call.hook.name, "stage": spec.stage.value},
            type=decisions.HOOK_TIMEOUT,
        ) from None


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
    async def save_record(self, record: ExecutionRecord) -> tuple[int, bool]:
        """Write a record snapshot to the execution store: (the revision stored, whether this one was
        written — an older or equal revision never replaces a newer one)."""

    @abc.abstractmethod
    def plan_problems(
        self, plan: Plan, phase: int, prior_step_ids: Sequence[str] = (), available: Sequence[str] | None = None
    ) -> list[str]:
        """Why a plan an after_planning hook returned is invalid (empty when it is valid); ``available``: the
        tool keys its planning attempt had (None: every tool)."""

    def stage_activities(self) -> list[Callable[..., Any]]:
        """One bound activity per row of the stage table, and the batch activity that runs several."""
        found: list[Callable[..., Any]] = []
        for spec in STAGES.values():
            fn = getattr(self, spec.activity)
            assert activity._Definition.must_from_callable(fn).name == spec.activity, spec.activity
            found.append(fn)
        return [*found, self.run_hook_batch, self.run_named_hooks]

    @activity.defn(dynamic=True)
    async def run_named_hooks(self, args: Sequence[RawValue]) -> Any:
        """In-process hooks scheduled under a type that names them (``<stage>:<hook>``, or a batch's
        ``<stage>:<hook> + <hook> + ...``; see ``workflows.stages.hook_activity_type``): the same body
        as ``<stage>_hook`` for one hook's call, as ``run_hook_batch`` for a batch's. The type gives
        the stage, the input the hooks. Any other type no activity of this worker serves is refused."""
        activity_type = activity.info().activity_type
        stage = hook_stage_of(activity_type)
        if stage is None or stage not in STAGES or len(args) != 1:
            raise ApplicationError(
                f"no activity {activity_type!r} on this worker", type="UnknownActivity", non_retryable=True
            )
        spec = STAGES[stage]
        converter = activity.payload_converter()
        value = converter.from_payload(args[0].payload)
        if isinstance(value, dict) and "calls" in value:
            return await self.run_hook_batch(HookBatchCall.model_validate(value))
        call = spec.call.model_validate(value)
        return RecordedOutcome.model_validate(spec.entry_outcome(call, await self.invoke_stage(spec, call)))

    @activity.defn(name=HOOK_BATCH_ACTIVITY)
    async def run_hook_batch(self, batch: HookBatchCall) -> HookBatchOutcome:
        """Invoke consecutive in-process hooks of one stage in order, each exactly as its own stage
        activity would (its span, its checks, its outcome), with its own timeout and attempts. Each hook
        after the first receives the stage as the previous one left it (``workflows.stages.next_call``).
        Stops after a hook that failed on its last attempt, or whose outcome only the workflow can carry
        on from; the workflow runs the rest. Where the workflow sent the hooks of the stages that follow
        (``batch.ahead``), runs on into each while the stages before it left the run as it was
        (``workflows.stages.hands_on``). Where the workflow sent the accepted plan's snapshot
        (``batch.write``) and every hook left the plan and the run as they were, writes it; where it sent
        the terminal snapshot (``batch.end``) and every hook of every stage did, writes that."""
        entries, ran, ran_on = await self.run_stage(batch.stage, batch.calls)
        outcome = HookBatchOutcome(entries=entries)
        if batch.write is not None and ran_on:
            write = batch.write
            outcome.snapshot = await self._write_snapshot(
                write.record,
                lambda: snapshots.accepted_plan_snapshot(write, ran, entries, in_place=True),
                "accepted plan",
            )
        if ran_on:
            outcome.ahead, ran_on = await self.run_on(batch.ahead)
        if batch.end is not None and ran_on:
            outcome.end = await self.write_end(batch.end, [entries, *outcome.ahead])
        return self.bounded_result(outcome, f"{batch.stage.value} batch")

    async def run_on(self, segments: Sequence[HookBatchSegment]) -> tuple[list[list[HookBatchEntry]], bool]:
        """Run on into each stage of ``segments`` in order, while the stages before left the run as it was
        (``workflows.stages.hands_on``): each stage's entries, and whether every stage ran and did."""
        ahead: list[list[HookBatchEntry]] = []
        for segment in segments:
            entries, _, ran_on = await self.run_stage(segment.stage, segment.calls)
            ahead.append(entries)
            if not ran_on:
                return ahead, False
        return ahead, True

    async def end_with_answer(
        self,
        ending: PlanEnding,
        write: AcceptedPlanWrite,
        output: PlanOutput,
        input: PlanInput,
        before_planning: snapshots.BeforePlanningRan | None,
    ) -> None:
        """After a phase's after_planning hooks left its plan, the planner's text answer, as it was (their
        entries in ``output.after``; ``write.record`` as the planning activity took the plan; ``input``:
        what the planner was asked, ``before_planning``: the hooks of that stage the activity ran first):
        run on into the stages that follow (``ending``, their calls built on a stand-in answer, completed
        here as the workflow completes them, ``workflows.stages.answered``) while each leaves the run as it
        was, then write the request's terminal snapshot as the workflow would build it from the same
        outcomes. Each stage's entries and what became of the snapshot go back in ``output``."""
        plan = output.plan
        answer = (plan.answer or "") if plan is not None else ""
        if plan is None or plan.continue_after or not answer.strip() or output.draft is None:
            return  # not the run's answer: the workflow carries on
        spent = ModelUsage.of(output.model_calls).total_tokens
        segments = [
            HookBatchSegment(
                stage=segment.stage,
                calls=[
                    answered(
                        STAGES[segment.stage].call.model_validate(c), answer, input.route, spent, input.enrichments
                    )
                    for c in segment.calls
                ],
            )
            for segment in ending.segments
        ]
        output.ahead, ran_on = await self.run_on(segments)
        if ran_on:
            later = [segment.stage for segment in segments]
            end = snapshots.answered_end(write, output, ending.end, later, input.route, before_planning)
            output.end = await self.write_end(end, [output.after, *output.ahead])

    async def _write_snapshot(
        self, record: ExecutionRecord, build: Callable[[], ExecutionRecord], what: str
    ) -> SnapshotAttempt:
        """Write the snapshot after ``record`` that ``build`` makes, as the workflow would build it from
        these outcomes. Not written when the store fails or already holds that revision (an earlier
        attempt's): the workflow then writes its own, with the next revision."""
        tried = SnapshotAttempt(revision=record.record_revision + 1)
        try:
            _, tried.written = await self.save_record(build())
        except Exception as err:  # noqa: BLE001 - the hooks' outcomes stand; the workflow writes the snapshot
            logger.warning("%s of %s not written with its hooks: %s", what, record.workflow_id, err)
        return tried

    async def write_end(self, end: TerminalWrite, parts: Sequence[Sequence[HookBatchEntry]]) -> SnapshotAttempt:
        """Write the request's terminal snapshot after the hooks of ``end.parts`` (``parts``: each one's
        entries) left the run as it was, as the workflow would build it from the same outcomes."""
        build = functools.partial(snapshots.terminal_snapshot, end, parts, in_place=True)
        return await self._write_snapshot(end.record, build, "terminal snapshot")

    async def run_stage(
        self, stage: Stage, calls: Sequence[Any]
    ) -> tuple[list[HookBatchEntry], list[tuple[HookCall, HookOutcome]], bool]:
        """One stage's hooks of a batch, in order: their entries (each outcome without the subject it would
        only hand back unchanged, ``StageSpec.entry_outcome``), each call as its hook received it with its
        outcome, and whether the batch may run on into the next stage (every hook ran and left the run as
        it was)."""
        spec = STAGES[stage]
        planned = [spec.call.model_validate(call) for call in calls]
        entries: list[HookBatchEntry] = []
        ran: list[tuple[HookCall, HookOutcome]] = []
        call: HookCall | None = planned[0] if planned else None
        for index, _ in enumerate(planned):
            if call is None:
                break
            started = time.monotonic()
            outcome, failure, attempts = await _attempts(lambda c: self.invoke_stage(spec, c), call)
            entries.append(
                HookBatchEntry(
                    hook=call.hook.name,
                    outcome=spec.entry_outcome(call, outcome) if outcome is not None else None,
                    failure=failure,
                    attempts=attempts,
                    duration_ms=round((time.monotonic() - started) * 1000.0, 3),
                )
            )
            if outcome is None:
                break
            ran.append((call, outcome))
            if index + 1 == len(planned):
                break
            call = next_call(spec, call, outcome, planned[index + 1])
        return entries, ran, len(ran) == len(planned) and hands_on(spec, ran)

    async def invoke_stage(self, spec: StageSpec, call: HookCall) -> HookOutcome:
        """The body of every stage activity: call the stage's method with what the stage passes it, and
        let the stage judge what came back."""

        async def run(hook: Any, ctx: PipelineContext, span: Span) -> HookOutcome:
            checks = _Checks(self, span)
            prepared = spec.prepare(call, checks)
            ctx.told(**spec.context(prepared))
            info = activity.info()
            where = HookAttempt(
                workflow_id=call.view.workflow_id,
                stage=spec.stage.value,
                hook=call.hook.name,
                activity_id=info.activity_id,
                attempt=_BATCH_ATTEMPT.get() or info.attempt,
            )
            value = await call_hook(
                getattr(hook, spec.method(call.hook)), ctx, *spec.arguments(prepared, ctx), where=where
            )
            return spec.judge(prepared, value, ctx, checks)

        return await self._invoke(call, spec.stage, run)

    def _context(self, call: HookCall, stage: Stage) -> PipelineContext:
        name = call.hook.name
        return PipelineContext.of_view(call.view, stage=stage, hook_name=name, hook=self.registry.hook(name))

    async def _invoke(self, call: HookCall, stage: Stage, run: Run) -> Any:
        """Run ``run(hook, ctx, span)`` inside the hook's span and translate failures into the
        categories the workflow decides on."""
        entry = call.hook
        hook = self.registry.hook(entry.name)
        ctx = self._context(call, stage)
        info = activity.info()
        attempt = _BATCH_ATTEMPT.get() or info.attempt
        final_attempt = attempt >= entry.max_attempts
        with (
            telemetry.tracer().start_as_current_span(
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
            ) as span,
            metered(call.view.model_tokens_left, hook=entry.name) as budget,
        ):
            try:
                outcome = await run(hook, ctx, span)
                # What every stage's outcome carries besides its own result: added here, once.
                outcome.effects = ctx.effects
                outcome.detached = ctx.detached
                outcome.state = _checked_state(entry, ctx.state)
                outcome.leases = ctx.leases
                outcome.model_calls = budget.calls
                self.bounded(outcome, f"{stage.value} · {entry.name}")
                self._mark_succeeded(span, outcome.decision)
                return outcome
            except ResultRejected as err:
                self._mark_failed(span, entry, stage, err.category, str(err), final=True)
                raise ApplicationError(
                    str(err),
                    {"hook": entry.name, "effects": _failed_effects(ctx, str(err)), "model_calls": budget.dumped()},
                    type=err.category,
                    non_retryable=True,
                ) from None
            except asyncio.CancelledError:
                ctx._cancel.set()  # a hook still running in a thread can see it (``ctx.cancelled``) and return
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
                        "model_calls": budget.dumped(),
                    },
                    type=decisions.HOOK_ERROR,
                    non_retryable=deliberate,
                    # A deliberate refusal is an outcome, not a fault: no error log or failure metric.
                    category=ApplicationErrorCategory.BENIGN if deliberate else ApplicationErrorCategory.UNSPECIFIED,
                ) from None
            except BaseException as err:  # noqa: BLE001 - a panic (SystemExit, KeyboardInterrupt, ...): stop
                span.record_exception(err)
                message = str(err) or type(err).__name__
                self._mark_failed(span, entry, stage, decisions.HOOK_PANIC, message, final=True)
                raise ApplicationError(
                    message,
                    {
                        "hook": entry.name,
                        "exception_type": type(err).__name__,
                        "effects": _failed_effects(ctx, message),
                        "model_calls": budget.dumped(),
                    },
                    type=decisions.HOOK_PANIC,
                    non_retryable=True,
                ) from None

    @staticmethod
    def _mark_failed(span: Span, entry: HookEntry, stage: Stage, category: str, message: str, final: bool) -> None:
        span.set_status(Status(StatusCode.ERROR, message[:512]))
        span.set_attribute("pipeline.hook.outcome", "failed")
        span.set_attribute("pipeline.hook.error_type", category)
        if final:
            span.set_attributes(telemetry.decision_attributes(STAGES[stage].failure(entry, category)))

    @staticmethod
    def _mark_succeeded(span: Span, decision: HookDecision) -> None:
        span.set_attribute("pipeline.hook.outcome", "succeeded")
        span.set_attributes(telemetry.decision_attributes(decision))


class _Checks:
    """What a stage's judge asks of this worker (``workflows.stages.Checks``)."""

    def __init__(self, activities: HookStageActivities, span: Span) -> None:
        self._activities, self._span = activities, span

    def plan_problems(
        self, plan: Plan, phase: int, prior_step_ids: Sequence[str], available: Sequence[str] | None = None
    ) -> list[str]:
        return self._activities.plan_problems(plan, phase, prior_step_ids, available)

    def argument_problems(self, step: PlanStep) -> list[str]:
        return self._activities.tools.argument_problems(step, resolved=True)

    def tool_descriptions(self, keys: Sequence[str]) -> dict[str, str]:
        tools = self._activities.tools
        return {key: tool.description for key in keys if (tool := tools.get(key)) is not None}

    def short_circuit_judged(self, call: HookCall, proposal: ShortCircuitProposal, decision: HookDecision) -> None:
        accepted = decision.action is DecisionAction.SHORT_CIRCUIT
        telemetry.record_short_circuit(proposal.kind, decision.reason, "accepted" if accepted else "rejected")
        self._span.add_event(
            "pipeline.short_circuit.decision",
            {"kind": proposal.kind, "reason": decision.reason, "accepted": accepted, "source": proposal.source},
        )
        if proposal.contract == "legacy" and call.view.gate.reserved_dimensions:
            logger.warning(
                "hook %s returned a legacy short-circuit while reserved cache dimensions exist; it is "
                "treated as authoritative. Cache hooks should use before_planning_decision.",
                call.hook.name,
            )


def _stage_activity(spec: StageSpec) -> Callable[..., Any]:
    """The activity ``<stage>_hook``: one invocation of one hook at ``spec``'s stage, by the shared body."""

    async def invoke(self: HookStageActivities, call: Any) -> Any:
        return await _within_attempt(spec, call, self.invoke_stage(spec, call))

    invoke.__name__ = invoke.__qualname__ = spec.activity
    invoke.__doc__ = f"Invoke one {spec.stage.value} hook: call it, judge what it returned, record its span."
    invoke.__annotations__ = {"call": spec.call, "return": spec.outcome}
    return activity.defn(name=spec.activity)(heartbeating(invoke))


for _spec in STAGES.values():
    setattr(HookStageActivities, _spec.activity, _stage_activity(_spec))


def returned_or_default(value: Any, expected: type[ResultT], method: str) -> ResultT:
    """``value`` if it is an ``expected``, its default for ``None``; otherwise the hook broke its contract
    (never retried)."""
    try:
        return returned(value, method, expected) or expected()
    except ResultRejected as err:
        raise ApplicationError(str(err), type=err.category, non_retryable=True) from None
