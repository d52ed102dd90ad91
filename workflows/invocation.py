"""How the request workflow runs a stage's hooks: one chain runner for every stage, one invocation
(an activity, or a local activity) per hook, recorded whatever its outcome.

The runner walks a stage's participants in order. Each invocation's outcome is folded in by the stage's
own ``apply`` (which may end the stage early: a short-circuit, a denial); a failed invocation is acted
on by the decision the stage table and the hook's policy produced — ``terminate`` ends the request
with the stage's typed error (``RequiredAfterPlanningError`` for the required gate, ``HookContractError``
for a broken short-circuit contract, ``ExtensionError`` otherwise), ``continue`` goes on without the
hook's result, and at a finalizer stage any failure is a diagnostic. Workflow code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from pydantic import JsonValue

    from . import decisions, dispatch, patches, story
    from . import search_attributes as sa
    from .detached import DETACHED_WORKFLOW_TYPE, detached_workflow_id, start_effect_child
    from .effects import elapsed_ms, record_effects
    from .leases import ManagedLeases
    from .models import (
        MAX_IGNORED_MESSAGES,
        MAX_INLINE_PAYLOAD_BYTES,
        MAX_STORED_PAYLOAD_BYTES,
        STORED_REFERENCE_BYTES,
        TASK_PAYLOAD_BUDGET_BYTES,
        DecisionAction,
        DetachedEffectInput,
        DetachedWork,
        Diagnostic,
        EffectStatus,
        EnrichmentChange,
        EnrichmentOperation,
        ExecutionRecord,
        GateState,
        HookBatchCall,
        HookBatchOutcome,
        HookCall,
        HookEntry,
        HookInvocation,
        HookOutcome,
        HookRequestView,
        InvocationOutcome,
        PipelineHookEffect,
        PipelineManifest,
        PlanStep,
        RequestInput,
        RunMode,
        Stage,
        WorkerLoss,
        bounded_value,
        subagent_depth,
    )
    from .stages import HOOK_BATCH_ACTIVITY, STAGES
    from .support import (
        HOOK_RETRY_BACKOFF,
        HOOK_RETRY_INITIAL_INTERVAL,
        INFRASTRUCTURE_FAILURES,
        NON_RETRYABLE_HOOK_FAILURES,
        InvocationFailure,
        hook_retry_delay,
        payload_bytes,
    )

AWAITING_REVIEW_STAGE = "awaiting_review"

OutcomeT = TypeVar("OutcomeT", bound=HookOutcome)
ResultT = TypeVar("ResultT")
_INVOCATION_OUTCOMES = {
    decisions.HOOK_TIMEOUT: InvocationOutcome.TIMED_OUT,
    decisions.WORKER_LOST: InvocationOutcome.WORKER_LOST,
}


class RunStopped(Exception):
    """A hook stopped the run with its own answer (caught by the workflow's ``run``)."""

    def __init__(self, extension: str, phase: str, reason: str, text: str) -> None:
        super().__init__(f"{extension} stopped the run at {phase}: {reason}")
        self.extension, self.phase, self.reason, self.text = extension, phase, reason, text


class HookInvoker:
    """The request workflow's hook running, effects and activity scheduling (its state is the workflow's)."""

    _input: RequestInput
    _request_id: str
    _manifest: PipelineManifest
    _record: ExecutionRecord
    _enrichments: dict[str, JsonValue]
    _gate: GateState
    _phase: int
    _ask: str
    _instructions: str
    _facts: dict[str, JsonValue]
    _hook_state: dict[str, dict[str, JsonValue]]
    _leases: ManagedLeases
    _detached_tokens: dict[str, str]
    _behaviour: patches.Behaviour
    _local_bookkeeping: bool = False
    _hook_batches: bool = False
    _inflight_bytes: int = 0  # inline input bytes of the activities scheduled and not yet finished
    # Executions started from here on keep AgentLifecycleStage at the stage they wait in (see
    # _publish_stage), set AgentWorkflowKind, and start their children with their kind.
    _stage_upserts: bool = False
    _upserted_stage: str | None = None  # the stage AgentLifecycleStage holds
    _upserted_awaiting = False  # whether AgentAwaitingReview holds true
    _unpublished_stage: tuple[str, bool] | None = None  # (stage, terminal) entered since the last upsert
    _listing_timer: asyncio.Task[None] | None = None  # lists the stage once the listing delay has passed

    def _set_stage(self, stage: str, detail: str = "", *, outcome: str = "") -> None:
        """Enter ``stage``: the record and the current details an operator reads (what was asked, the
        stage, the outcome once there is one) at once; the search attributes, where the namespace has
        them, when the workflow next waits (:meth:`_publish_stage`). A stage with an ``outcome`` is the
        terminal one."""
        self._record.lifecycle_stage = str(stage)
        workflow.set_current_details(
            story.current_details(self._input.request, stage=str(stage), detail=detail, outcome=outcome)
        )
        if self._stage_upserts:
            self._unpublished_stage = (str(stage), bool(outcome))

    def _publish_stage(self) -> None:
        """List the stage entered last, where the workflow is about to wait on something outside its
        workflow task — an activity, a child, a reviewer — or to end. A listing reads the attributes as a
        workflow task leaves them, so the stages a task passes through on its way (in-process hooks run as
        local activities, stages without hooks) could never be seen there: they cost no upsert, and the
        stage a request is listed at is always one it waited in. The current details and the record show
        every stage at once.

        Each upsert is a write to the server's visibility store, the largest part of what a request costs
        the server beyond its activities. So, with a listing delay (the manifest's
        ``stage_listing_delay_seconds``), a request's first stage (with its kind), a change of
        ``AgentAwaitingReview`` (what reviewers' inboxes read) and its end are listed at once, and any
        other stage once the request has been waiting that long: one durable timer, started when such a
        stage is entered and none is running, lists the stage the request is in when it fires. A listing
        is then at most the delay behind, and a request that never waits that long costs one timer
        instead of an upsert per stage. Without a delay every stage a request waits in is listed at
        once."""
        if self._unpublished_stage is None or not self._manifest.search_attributes:
            return
        stage, terminal = self._unpublished_stage
        delay = self._manifest.stage_listing_delay_seconds
        at_once = (
            terminal
            or not delay
            or self._upserted_stage is None
            or (stage == AWAITING_REVIEW_STAGE) != self._upserted_awaiting
        )
        if at_once:
            self._list_stage()
        elif self._listing_timer is None:
            self._listing_timer = asyncio.create_task(self._list_stage_after(delay))

    async def _list_stage_after(self, delay: float) -> None:
        await workflow.sleep(delay, summary="list the stage it waits in")
        self._listing_timer = None
        self._list_stage()

    def _list_stage(self) -> None:
        if self._unpublished_stage is not None:
            stage, terminal = self._unpublished_stage
            self._unpublished_stage = None
            self._upsert_stage(stage, terminal=terminal)

    def _upsert_stage(self, stage: str, *, terminal: bool = False) -> None:
        """One upsert per change of stage. AgentWorkflowKind goes with the first; AgentAwaitingReview
        when a checkpoint opens, when it closes, and (false) at the end."""
        if not self._manifest.search_attributes or stage == self._upserted_stage:
            return
        awaiting = stage == AWAITING_REVIEW_STAGE
        updates: list[Any] = [sa.LIFECYCLE_STAGE.value_set(stage)]
        if awaiting != self._upserted_awaiting or terminal:
            updates.append(sa.AWAITING_REVIEW.value_set(awaiting))
        if self._upserted_stage is None:
            updates.append(sa.WORKFLOW_KIND.value_set(self._kind()))
        workflow.upsert_search_attributes(updates)
        self._upserted_stage, self._upserted_awaiting = stage, awaiting

    def _kind(self) -> str:
        return sa.KIND_SUBAGENT if subagent_depth(self._input.metadata) > 0 else sa.KIND_REQUEST

    async def _run_stage(
        self,
        stage: Stage,
        make_call: Callable[[HookEntry], HookCall],
        apply: Callable[[HookEntry, Any], ResultT | None] | None = None,
        *,
        hooks: list[HookEntry] | None = None,
        step: PlanStep | None = None,
        plan_phase: int | None = None,
    ) -> ResultT | None:
        """Run ``stage``'s hooks (``hooks``, or every participant) in order: ``apply(hook, outcome)`` folds
        each outcome in, and a value it returns ends the stage and is returned. A failed invocation is
        handled as its decision says (see the module docstring). Consecutive in-process hooks run in one
        local activity (see ``_invoke_batch``); the outcomes are folded in the same way, one by one."""
        spec = STAGES[stage]
        participants = self._manifest.participants(stage) if hooks is None else hooks
        done = 0
        while done < len(participants):
            batch = self._batchable(participants, done)
            try:
                if len(batch) > 1:
                    results = await self._invoke_batch(batch, stage, done + 1, make_call, plan_phase, step)
                else:
                    hook = participants[done]
                    results = [
                        (hook, *await self._invoke(hook, stage, done + 1, make_call(hook), plan_phase, step=step))
                    ]
            except (asyncio.CancelledError, ApplicationError) as err:
                if not spec.finalizer:
                    raise
                # A finalizer cancelled with the request, or whose workers kept dying: a diagnostic.
                message = err.message if isinstance(err, ApplicationError) else "cancelled with the request"
                category = (err.type or decisions.WORKER_LOST) if isinstance(err, ApplicationError) else "Cancelled"
                results = [(participants[done], None, InvocationFailure(category=category, message=message))]
            for hook, outcome, failure in results:
                done += 1
                if outcome is not None:
                    ended = apply(hook, outcome) if apply is not None else None
                    if ended is not None:
                        return ended
                elif failure is None:
                    continue
                elif spec.finalizer:
                    self._record.diagnostics.append(
                        Diagnostic(
                            extension=hook.name, phase=stage.value, error=failure.message, error_type=failure.category
                        )
                    )
                elif failure.decision is not None and failure.decision.action is DecisionAction.TERMINATE:
                    raise _stage_error(hook, stage, failure, plan_phase)
        return None

    def _batchable(self, hooks: list[HookEntry], start: int) -> list[HookEntry]:
        """The run of in-process hooks from ``start`` that one local activity may invoke together (at
        least the hook at ``start``). Executions started before batching existed replay one by one."""
        run = hooks[start : start + 1]
        if (
            hooks[start].run_mode is not RunMode.LOCAL_ACTIVITY
            or not self._manifest.settings.batch_local_hooks
            or not self._hook_batches
        ):
            return run
        for hook in hooks[start + 1 :]:
            if hook.run_mode is not RunMode.LOCAL_ACTIVITY:
                break
            run.append(hook)
        return run

    def _invocation(
        self, hook: HookEntry, stage: Stage, sequence: int, plan_phase: int | None, step: PlanStep | None
    ) -> HookInvocation:
        """The record entry of one invocation, as it starts."""
        return HookInvocation(
            hook=hook.name,
            stage=stage,
            sequence=sequence,
            plan_phase=self._phase if step is not None else plan_phase,
            step_id=step.step_id if step else None,
            started_at=workflow.now(),
            duration_ms=0.0,
            outcome=InvocationOutcome.SUCCEEDED,
        )

    async def _invoke(
        self,
        hook: HookEntry,
        stage: Stage,
        sequence: int,
        call: HookCall,
        plan_phase: int | None = None,
        *,
        step: PlanStep | None = None,
    ) -> tuple[Any, None] | tuple[None, InvocationFailure]:
        """Run one hook invocation as an activity (or a local activity) and record it, its decision and
        its effects, whatever its outcome; start the work it detached once it has succeeded. A lost worker
        dispatches the invocation again (its attempts stay the hook's own); workers lost on every dispatch
        end the request with ``WorkerLost``, recorded as such, never as the hook's verdict."""
        spec = STAGES[stage]
        summary = f"{stage.value} · {hook.name}" + (f" · {step.step_id}" if step else "")
        retry = RetryPolicy(
            initial_interval=HOOK_RETRY_INITIAL_INTERVAL,
            backoff_coefficient=HOOK_RETRY_BACKOFF,
            maximum_attempts=hook.max_attempts,
            non_retryable_error_types=NON_RETRYABLE_HOOK_FAILURES,
        )
        invocation = self._invocation(hook, stage, sequence, plan_phase, step)

        def lost(n: int) -> None:
            invocation.worker_losses = n

        try:
            if hook.run_mode is RunMode.LOCAL_ACTIVITY:
                outcome = await workflow.execute_local_activity(
                    spec.activity,
                    call,
                    result_type=spec.outcome,
                    start_to_close_timeout=timedelta(seconds=hook.timeout_seconds),
                    retry_policy=retry,
                    summary=summary,
                )
            else:
                outcome = await self._activity(
                    spec.activity,
                    call,
                    result_type=spec.outcome,
                    timeout=hook.timeout_seconds,
                    retry_policy=retry,
                    summary=summary,
                    on_worker_lost=lost,
                )
        except (ActivityError, ApplicationError, TimeoutError) as err:
            raise_if_cancelled(err)
            invocation.duration_ms = elapsed_ms(invocation.started_at)
            return None, self._failed(invocation, hook, stage, InvocationFailure.from_error(err, hook), err)
        invocation.duration_ms = elapsed_ms(invocation.started_at)
        return await self._succeeded(invocation, hook, outcome), None

    async def _invoke_batch(
        self,
        hooks: list[HookEntry],
        stage: Stage,
        first_sequence: int,
        make_call: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
    ) -> list[tuple[HookEntry, Any, InvocationFailure | None]]:
        """Run consecutive in-process hooks of a stage in one local activity: one workflow activation and
        one marker (summarised ``<stage> · <hook>, <hook>, ...``) instead of one per hook, while each hook
        keeps its own invocation — its attempts, its timeout, its span, its record entry. The activity
        passes each hook what the ones before it made of the stage, as this workflow would, and stops at
        a failure or at an outcome that ends the stage; the hooks it did not reach are left to the caller.
        Returns (hook, outcome, failure) for each hook that ran, in order."""
        spec = STAGES[stage]
        calls = [make_call(hook) for hook in hooks]
        names = ", ".join(hook.name for hook in hooks)
        summary = f"{stage.value} · {names}" + (f" · {step.step_id}" if step else "")
        # Every hook's every attempt, and the pauses between them: each hook's own bounds apply inside.
        budget = sum(
            hook.timeout_seconds * hook.max_attempts + sum(hook_retry_delay(n) for n in range(1, hook.max_attempts))
            for hook in hooks
        )
        started = workflow.now()
        try:
            batch = await workflow.execute_local_activity(
                HOOK_BATCH_ACTIVITY,
                HookBatchCall(stage=stage, calls=calls),
                result_type=HookBatchOutcome,
                start_to_close_timeout=timedelta(seconds=budget + 10),
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=summary,
            )
        except (ActivityError, ApplicationError, TimeoutError) as err:
            raise_if_cancelled(err)
            # The batch itself broke (not one of its hooks, whose failures are entries): each hook's
            # invocation is recorded as failed with the batch's error, and decided as usual.
            results: list[tuple[HookEntry, Any, InvocationFailure | None]] = []
            for offset, hook in enumerate(hooks):
                invocation = self._invocation(hook, stage, first_sequence + offset, plan_phase, step)
                failure = InvocationFailure.from_error(err, hook)
                results.append((hook, None, self._failed(invocation, hook, stage, failure, err)))
                if failure.decision is not None and failure.decision.action is DecisionAction.TERMINATE:
                    break
            return results
        results = []
        clock = started
        for offset, (hook, entry) in enumerate(zip(hooks, batch.entries, strict=False)):
            invocation = self._invocation(hook, stage, first_sequence + offset, plan_phase, step)
            invocation.started_at, invocation.duration_ms = clock, entry.duration_ms
            clock += timedelta(milliseconds=entry.duration_ms)
            if entry.failure is not None:
                failure = InvocationFailure.from_batch(entry.failure, hook)
                results.append((hook, None, self._failed(invocation, hook, stage, failure)))
            else:
                outcome = spec.outcome.model_validate(entry.outcome)
                results.append((hook, await self._succeeded(invocation, hook, outcome), None))
        return results

    def _failed(
        self,
        invocation: HookInvocation,
        hook: HookEntry,
        stage: Stage,
        failure: InvocationFailure,
        err: BaseException | None = None,
    ) -> InvocationFailure:
        """Record a failed invocation and its decision; an infrastructure failure ends the request."""
        invocation.outcome = _INVOCATION_OUTCOMES.get(failure.category, InvocationOutcome.FAILED)
        invocation.error = failure.message
        invocation.error_type = failure.category
        invocation.exception_type = failure.exception_type
        invocation.decision = failure.decision = decisions.failure_decision(hook, stage, failure.category)
        self._record.pipeline_hooks.append(invocation)
        record_effects(self._record, failure.effects)
        if failure.category in INFRASTRUCTURE_FAILURES:  # not the hook's verdict: the request ends as it is
            if isinstance(err, ApplicationError) and err.type == failure.category:
                raise err
            raise ApplicationError(
                failure.message,
                {"hook": hook.name, "stage": stage.value},
                type=failure.category,
                non_retryable=True,
            ) from None
        return failure

    async def _succeeded(self, invocation: HookInvocation, hook: HookEntry, outcome: OutcomeT) -> OutcomeT:
        """Record a successful invocation; keep the hook's state, adopt its leases, start its detached work."""
        invocation.decision = outcome.decision
        self._record.pipeline_hooks.append(invocation)
        if outcome.state is not None:
            self._hook_state[hook.name] = outcome.state
        record_effects(self._record, outcome.effects)
        for lease in outcome.leases:
            self._leases.adopt(lease, self._manifest.settings)
        for work in outcome.detached:
            await self._start_detached(work)
        return outcome

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
        inline = self._inline_bytes(self._check_payload(summary, arg))
        self._publish_stage()

        def lost(n: int) -> None:
            self._note_worker_lost(activity, summary, n)
            if on_worker_lost is not None:
                on_worker_lost(n)

        # What is in flight is bounded in bytes, so no workflow task can schedule more than a gRPC message
        # carries: a large fan-out waits here for earlier activities to finish.
        if self._inflight_bytes and self._inflight_bytes + inline > TASK_PAYLOAD_BUDGET_BYTES:
            await workflow.wait_condition(
                lambda: self._inflight_bytes + inline <= TASK_PAYLOAD_BUDGET_BYTES or not self._inflight_bytes
            )
        self._inflight_bytes += inline
        try:
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
        finally:
            self._inflight_bytes -= inline

    async def _bookkeeping(
        self,
        activity: str,
        arg: Any,
        *,
        result_type: type[ResultT],
        timeout: float,
        retry_policy: RetryPolicy,
        summary: str,
    ) -> ResultT:
        """The framework's own in-process steps (resolving the pipeline, writing the record): local
        activities, so they cost no server round trip and their input — the whole record — never enters
        the history. Executions started before this ran them as activities, and replay the same way."""
        if not self._local_bookkeeping:
            return await self._activity(
                activity, arg, result_type=result_type, timeout=timeout, retry_policy=retry_policy, summary=summary
            )
        try:
            return await workflow.execute_local_activity(
                activity,
                arg,
                result_type=result_type,
                start_to_close_timeout=timedelta(seconds=timeout),
                retry_policy=retry_policy,
                summary=summary,
            )
        except (ApplicationError, TimeoutError) as err:  # a local activity's failure arrives unwrapped
            raise ActivityError(
                str(err),
                scheduled_event_id=0,
                started_event_id=0,
                identity="",
                activity_type=activity,
                activity_id="",
                retry_state=None,
            ) from err

    def _inline_bytes(self, size: int) -> int:
        """What a payload of ``size`` bytes adds to a workflow task: itself, or its reference in the store."""
        return STORED_REFERENCE_BYTES if self._manifest.payload_store and size >= STORED_REFERENCE_BYTES else size

    def _check_payload(self, summary: str, arg: Any) -> int:
        """Refuse to send what Temporal (or the payload store) cannot carry: a typed failure now, instead of
        a workflow task that fails on every retry. Returns the payload's size."""
        size = payload_bytes(arg)
        limit = MAX_STORED_PAYLOAD_BYTES if self._manifest.payload_store else MAX_INLINE_PAYLOAD_BYTES
        if size > limit:
            raise ApplicationError(
                f"{summary}: its input is {size} bytes; one payload may be at most {limit}",
                {"summary": summary, "bytes": size, "limit": limit, "payload_store": self._manifest.payload_store},
                type=decisions.PAYLOAD_TOO_LARGE,
                non_retryable=True,
            )
        return size

    def _note_worker_lost(self, activity: str, summary: str, dispatch_number: int) -> None:
        workflow.logger.warning("worker lost under %s (dispatch %s); dispatching it again", summary, dispatch_number)
        if len(self._record.worker_losses) < MAX_IGNORED_MESSAGES:
            self._record.worker_losses.append(
                WorkerLoss(activity=activity, summary=summary, at=workflow.now(), dispatch=dispatch_number)
            )

    async def _start_detached(self, work: DetachedWork) -> None:
        """Start the child that carries a detached effect to its terminal state; it outlives the request."""
        effect = self._record.effect(work.effect_id)
        if effect is None:
            return
        info = workflow.info()
        self._check_payload(f"detached · {work.hook} · {work.effect_id}", work)
        settings = self._manifest.settings
        self._publish_stage()
        await start_effect_child(
            self._record,
            self._detached_tokens,
            effect,
            lambda token: DetachedEffectInput(
                parent_workflow_id=info.workflow_id,
                parent_run_id=info.run_id,
                request_id=self._request_id,
                work=work,
                effect=effect,
                update_token=token,
                heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
                max_worker_losses=settings.max_worker_losses,
            ),
            workflow_type=DETACHED_WORKFLOW_TYPE,
            id=detached_workflow_id(info.workflow_id, work.effect_id),
            what="detached work",
            static_summary=story.detached_summary(work.stage.value, work.hook, work.effect_id),
            static_details=story.detached_details(info.workflow_id, self._request_id),
            search_attributes=self._child_kind(sa.KIND_DETACHED_EFFECT),
        )

    def _child_kind(self, kind: str) -> TypedSearchAttributes | None:
        """The search attributes a child starts with: its kind, where the namespace has it."""
        if self._stage_upserts and self._manifest.search_attributes:
            return TypedSearchAttributes([SearchAttributePair(sa.WORKFLOW_KIND, kind)])
        return None

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


def _stage_error(hook: HookEntry, stage: Stage, failure: InvocationFailure, plan_phase: int | None) -> ApplicationError:
    """The typed, non-retryable error with which a terminating hook failure ends the request."""
    if failure.category == decisions.HOOK_CONTRACT_ERROR:
        return ApplicationError(
            f"{stage.value} hook {hook.name!r} broke the short-circuit contract: {failure.message}",
            {"hook": hook.name, "stage": stage.value, "cause": failure.message},
            type=decisions.HOOK_CONTRACT_ERROR,
            non_retryable=True,
        )
    if hook.required and stage is Stage.AFTER_PLANNING:
        return ApplicationError(
            f"required after_planning hook {hook.name!r} rejected the plan: {failure.message}",
            {
                "hook": hook.name,
                "cause": failure.message,
                "cause_type": failure.category,
                "exception_type": failure.exception_type,
                "plan_phase": plan_phase,
            },
            type=decisions.REQUIRED_AFTER_PLANNING_ERROR,
            non_retryable=True,
        )
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


def raise_if_cancelled(err: BaseException) -> None:
    """An activity cancelled because the request was cancelled ends the request as cancelled, not as a
    hook error or a failed stage."""
    if isinstance(err, CancelledError) or isinstance(getattr(err, "cause", None), CancelledError):
        raise asyncio.CancelledError() from err


def error_text(err: BaseException) -> str:
    """The most specific message an activity or application failure carries."""
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)
