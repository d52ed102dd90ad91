"""How the request workflow runs a stage's hooks: one runner for every stage, one invocation (an activity,
or a local activity) per hook, recorded whatever its outcome.

The runner walks a stage's participants in order, building each call from the stage's subject (the plan,
the answer, the tool call, ...) and folding each outcome into it with the stage's own rule
(``StageSpec.fold``), which may end the stage early (a short-circuit, a denial). A failed invocation is
acted on by the decision the stage and the hook's policy produced — ``terminate`` ends the request with
the stage's typed error (``RequiredAfterPlanningError`` for the required gate, ``HookContractError`` for a
broken short-circuit contract, ``ExtensionError`` otherwise), ``continue`` goes on without the hook's
result, and at a finalizer stage any failure is a diagnostic. Workflow code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from . import decisions, story
    from . import search_attributes as sa
    from .converter import Shown
    from .detached import DETACHED_WORKFLOW_TYPE, detached_workflow_id, start_effect_child
    from .effects import elapsed_ms, record_effects
    from .listing import StageListing
    from .models import (
        MIN_CHAIN_START_SECONDS,
        AcceptedPlanWrite,
        DecisionAction,
        DetachedEffectInput,
        DetachedWork,
        Diagnostic,
        HookBatchCall,
        HookBatchEntry,
        HookBatchOutcome,
        HookBatchSegment,
        HookCall,
        HookChain,
        HookDecision,
        HookEntry,
        HookInvocation,
        HookOutcome,
        InvocationOutcome,
        PlanStep,
        RunMode,
        SnapshotAttempt,
        Stage,
        TerminalEnd,
        TerminalPart,
        TerminalWrite,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .snapshots import EndAttempt, invocation_entry, spent
    from .stages import STAGE_SEPARATOR, STAGES, Fold, StageSpec, hook_activity_type, next_call, stages_activity_type
    from .support import (
        HOOK_RETRY_BACKOFF,
        HOOK_RETRY_INITIAL_INTERVAL,
        INFRASTRUCTURE_FAILURES,
        NON_RETRYABLE_HOOK_FAILURES,
        InvocationFailure,
        hook_retry_delay,
    )

_INVOCATION_OUTCOMES = {
    decisions.HOOK_TIMEOUT: InvocationOutcome.TIMED_OUT,
    decisions.WORKER_LOST: InvocationOutcome.WORKER_LOST,
}
# The decisions a hook's row on the Timeline is marked with (see ``HookRunner._mark``), as it reads them.
_MARKED = {
    DecisionAction.DENY: "denied",
    DecisionAction.STOP: "stopped the run",
    DecisionAction.TERMINATE: "ended the request",
    DecisionAction.PROPAGATE_PANIC: "panicked",
}
DECISION_MARK = timedelta(milliseconds=1)
# The diagnostic of a hook a local activity ran ahead for a stage the run reached changed, or never reached.
STALE_RUN_AHEAD = "StaleRunAhead"
# What the workflow does with each outcome besides folding it: (hook, outcome, subject before, the fold).
OnOutcome = Callable[[HookEntry, Any, Any, Fold], None]
_Result = tuple[HookEntry, Any, InvocationFailure | None]


class RunStopped(Exception):
    """A hook stopped the run with its own answer (caught by the workflow's ``run``)."""

    def __init__(self, extension: str, phase: str, reason: str, text: str) -> None:
        super().__init__(f"{extension} stopped the run at {phase}: {reason}")
        self.extension, self.phase, self.reason, self.text = extension, phase, reason, text


@dataclass
class StageRun:
    """What a stage's hooks made of its subject; ``ended_by``: the hook whose outcome ended the stage;
    ``snapshot``: what became of the accepted plan's snapshot its local activity tried to write (see
    ``HookRunner.run``'s ``write_accepted_plan``)."""

    subject: Any
    ended_by: HookEntry | None = None
    outcome: Any = None
    snapshot: SnapshotAttempt | None = None

    @property
    def ended(self) -> bool:
        return self.ended_by is not None


@dataclass(frozen=True)
class Ahead:
    """A stage the run goes on to with nothing between, if the stage before leaves the run as it is:
    ``subject`` is what its hooks would then work on. Its in-process hooks may run in the same local
    activity as the stage before (see :meth:`HookRunner.run`)."""

    stage: Stage
    subject: Any
    plan_phase: int | None = None


@dataclass
class _RanAhead:
    """What a local activity ran of a later stage's hooks: the calls the workflow built for them, their
    entries, and when the first of them started."""

    calls: list[HookCall]
    entries: list[HookBatchEntry]
    started: datetime


@dataclass
class ChainClock:
    """The time each chain has spent in one run of a stage (one occurrence of its event), in workflow time:
    a worker that crashes mid-chain resumes with what the history says was spent."""

    spent: dict[str, timedelta] = field(default_factory=dict)

    def left(self, chain: HookChain) -> float:
        return chain.budget_seconds - self.spent.get(chain.event, timedelta()).total_seconds()

    def spend(self, chain: HookChain, since: datetime) -> None:
        self.spent[chain.event] = self.spent.get(chain.event, timedelta()) + (workflow.now() - since)


class HookRunner:
    """Runs a stage's hooks for the request workflow (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing) -> None:
        self._state = state
        self._scheduler = scheduler
        self._listing = listing
        self._ran_ahead: dict[Stage, _RanAhead] = {}  # later stages' hooks a local activity already ran

    async def run(
        self,
        spec: StageSpec,
        subject: Any = None,
        on_outcome: OnOutcome | None = None,
        *,
        hooks: list[HookEntry] | None = None,
        step: PlanStep | None = None,
        plan_phase: int | None = None,
        refresh: Callable[[Any], Any] | None = None,
        ahead: Sequence[Ahead] = (),
        write_accepted_plan: bool = False,
        end: TerminalEnd | None = None,
        **extras: Any,
    ) -> StageRun:
        """Run ``spec``'s hooks (``hooks``, or every participant) in order on ``subject``: each call is
        built from the subject as the hooks before left it (``refresh`` first brings it up to date with
        the run, where the stage shows the run's progress), each outcome is folded in by the stage and
        handed to ``on_outcome``, and an outcome that ends the stage ends the run of hooks. A failed
        invocation is handled as its decision says (see the module docstring). Consecutive in-process
        hooks run in one local activity (see :meth:`_invoke_batch`); their outcomes are folded in the
        same way, one by one.

        ``ahead``: the stages the caller goes on to with nothing between when this one leaves the run as
        it is. The local activity that runs this stage's last in-process hooks then runs theirs too, in
        order, while each stage leaves the run as it found it (``workflows.stages.hands_on``): one
        workflow activation and one marker for several stages. Each of their invocations is recorded,
        decided and marked when the workflow reaches its stage, exactly as if it ran then, once the calls
        the workflow builds there are found equal to those the activity ran.

        ``write_accepted_plan`` (after_planning, for a plan whose snapshot is written next): where one local
        activity runs every hook of the stage, it is handed that snapshot and writes it once the hooks have
        left the plan and the run as they were (``workflows.snapshots``); the stage's run says what became
        of it, for ``records.RecordKeeper.persist``.

        ``end`` (where nothing but the hooks of this stage and of the stages of ``ahead`` comes before the
        run's end, see ``lifecycle``): where one local activity runs every hook of the stage and of those
        stages, it is handed the request's terminal snapshot, ending as ``end`` says, and writes it once
        every hook has left the run as it was; the run's state keeps what became of it
        (``RunState.end_attempt``) for the record keeper at the end."""
        state = self._state
        participants = state.manifest.participants(spec.stage) if hooks is None else hooks
        done = 0
        chains = ChainClock()
        offer = (
            write_accepted_plan
            and bool(participants)
            and spec.stage not in self._ran_ahead
            and self._local(participants)
        )
        snapshot: SnapshotAttempt | None = None
        ending = (
            end
            if end is not None
            and not offer
            and bool(participants)
            and spec.stage not in self._ran_ahead
            and self._local(participants)
            else None
        )

        def call_for(hook: HookEntry) -> HookCall:
            nonlocal subject
            if refresh is not None:
                subject = refresh(subject)
            return spec.build(hook, state.view(hook, plan_phase), subject, **extras)

        ran_ahead = self._ran_ahead.pop(spec.stage, None)
        while done < len(participants):
            batch = self._batchable(participants, done)
            last = done + len(batch) == len(participants) and self._local(batch)
            segments = self._segments(ahead) if last and ran_ahead is None and not offer else []
            try:
                if ran_ahead is not None:
                    results = await self._results_ran_ahead(spec, participants, ran_ahead, call_for, plan_phase, step)
                    ran_ahead = None
                    if not results:
                        continue
                elif len(batch) > 1 or segments or offer or ending:
                    whole = ending is not None and len(batch) == len(participants) and self._covers(ahead, segments)
                    results, snapshot = await self._invoke_batch(
                        spec,
                        batch,
                        done + 1,
                        call_for,
                        plan_phase,
                        step,
                        segments,
                        write=offer,
                        end=ending if whole else None,
                    )
                elif participants[done].chain is not None:
                    hook = participants[done]
                    results = [
                        (hook, *await self._invoke_chained(spec, hook, done + 1, call_for, plan_phase, step, chains))
                    ]
                else:
                    hook = participants[done]
                    results = [(hook, *await self._invoke(spec, hook, done + 1, call_for(hook), plan_phase, step))]
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
                    folded = spec.fold(subject, outcome)
                    if on_outcome is not None:
                        on_outcome(hook, outcome, subject, folded)
                    subject = folded.subject
                    await self._mark(spec, hook, outcome.decision, step, _refusal_text(outcome))
                    if folded.ends:
                        return StageRun(subject, hook, outcome, snapshot)
                elif failure is None:
                    continue
                elif spec.finalizer:
                    state.record.diagnostics.append(
                        Diagnostic(
                            extension=hook.name,
                            phase=spec.stage.value,
                            error=failure.message,
                            error_type=failure.category,
                        )
                    )
                elif failure.decision is not None and failure.decision.action.ends_request:
                    error = _stage_error(hook, spec.stage, failure, plan_phase)
                    await self._mark(spec, hook, failure.decision, step, error.message)
                    raise error
        return StageRun(subject, snapshot=snapshot)

    def _local(self, hooks: list[HookEntry]) -> bool:
        """Whether ``hooks`` run in one local activity (in-process, outside any chain, batching on)."""
        return self._state.manifest.settings.batch_local_hooks and all(
            hook.run_mode is RunMode.LOCAL_ACTIVITY and hook.chain is None for hook in hooks
        )

    def _covers(
        self, ahead: Sequence[Ahead], segments: Sequence[tuple[StageSpec, list[HookEntry], list[HookCall]]]
    ) -> bool:
        """Whether ``segments`` run every hook of every stage of ``ahead``."""
        ran = {spec.stage: len(hooks) for spec, hooks, _ in segments}
        participants = self._state.manifest.participants
        return all(ran.get(later.stage, 0) == len(participants(later.stage)) for later in ahead)

    def _segments(self, ahead: Sequence[Ahead]) -> list[tuple[StageSpec, list[HookEntry], list[HookCall]]]:
        """The later stages whose in-process hooks the local activity of a stage's last hooks may run on
        into: each stage of ``ahead`` in order (one without hooks passed over), up to the first whose
        hooks are not all in-process — that one's leading in-process hooks included. Their calls are
        built now, as the workflow would build them on reaching the stage with the run unchanged."""
        state = self._state
        if not ahead:
            return []
        segments: list[tuple[StageSpec, list[HookEntry], list[HookCall]]] = []
        for later in ahead:
            spec = STAGES[later.stage]
            hooks = state.manifest.participants(later.stage)
            if spec.finalizer or spec.tool_stage:
                break
            if not hooks:
                continue
            leading = self._batchable(hooks, 0) if self._local(hooks[:1]) else []
            if not leading:
                break
            view = state.view
            calls = [spec.build(hook, view(hook, later.plan_phase), later.subject) for hook in leading]
            segments.append((spec, leading, calls))
            if len(leading) < len(hooks):
                break
        return segments

    async def _results_ran_ahead(
        self,
        spec: StageSpec,
        participants: list[HookEntry],
        ran: _RanAhead,
        call_for: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
    ) -> list[_Result]:
        """The results of this stage's leading hooks that a local activity of an earlier stage ran, when
        the calls built for them now are the ones it ran. Otherwise (the run changed between: not a path
        a caller announces ``ahead`` on) none: each hook that ran on what the run no longer is becomes a
        diagnostic, and the stage's hooks run as usual."""
        hooks = participants[: len(ran.calls)]
        # Compared as JSON: what the hooks received is what counts (and a sandboxed replay may build the
        # same call from another copy of its class).
        if [call_for(hook).model_dump(mode="json") for hook in hooks] == [c.model_dump(mode="json") for c in ran.calls]:
            return await self._batch_results(spec, hooks, ran.calls, 1, plan_phase, step, ran.entries, ran.started)
        for entry in ran.entries:
            self._state.record.diagnostics.append(
                Diagnostic(
                    extension=entry.hook,
                    phase=spec.stage.value,
                    error="ran ahead on a request the run had changed by the time it reached the stage; run again",
                    error_type=STALE_RUN_AHEAD,
                )
            )
        return []

    def unreached(self) -> None:
        """Record the hooks a local activity ran ahead for a stage the run never reached (it ended first)
        as diagnostics: they ran, and the record says so."""
        for stage, ran in self._ran_ahead.items():
            for entry in ran.entries:
                self._state.record.diagnostics.append(
                    Diagnostic(
                        extension=entry.hook,
                        phase=stage.value,
                        error="ran ahead for a stage the run ended before reaching",
                        error_type=STALE_RUN_AHEAD,
                    )
                )
        self._ran_ahead.clear()

    def _batchable(self, hooks: list[HookEntry], start: int) -> list[HookEntry]:
        """The run of in-process hooks from ``start`` that one local activity may invoke together (at
        least the hook at ``start``)."""
        run = hooks[start : start + 1]
        if (
            hooks[start].run_mode is not RunMode.LOCAL_ACTIVITY
            or hooks[start].chain is not None
            or not self._state.manifest.settings.batch_local_hooks
        ):
            return run
        for hook in hooks[start + 1 :]:
            if hook.run_mode is not RunMode.LOCAL_ACTIVITY or hook.chain is not None:
                break
            run.append(hook)
        return run

    async def _mark(
        self,
        spec: StageSpec,
        hook: HookEntry,
        decision: HookDecision | None,
        step: PlanStep | None,
        reason: str | None = None,
    ) -> None:
        """Mark a hook's refusal on the request's Timeline, at its own row: a hook that denied a call,
        stopped the run or ended the request leaves a one-millisecond timer whose summary says so, the
        reason on its first line (the Temporal UI labels a local activity by its type alone and never
        shows one as failed, so its marker could not). Nothing for any other decision, or at a finalizer
        stage."""
        if decision is None or decision.action not in _MARKED or spec.finalizer:
            return
        summary = story.decision_mark(
            _MARKED[decision.action],
            spec.stage.value,
            hook.name,
            reason or decision.reason,
            step and step.step_id,
            with_text=self._state.manifest.ui_shows_text,
        )
        await workflow.sleep(DECISION_MARK, summary=summary)

    @staticmethod
    def _local_type(spec: StageSpec, hooks: list[HookEntry]) -> str:
        """The local activity type of in-process ``hooks`` at ``spec``'s stage: one that names the stage
        and the hooks (``stage:hook``, what the UI's Timeline and the SDK's metrics show)."""
        return hook_activity_type(spec.stage, [hook.name for hook in hooks])

    def _invocation(
        self, hook: HookEntry, stage: Stage, sequence: int, plan_phase: int | None, step: PlanStep | None
    ) -> HookInvocation:
        """The record entry of one invocation, as it starts."""
        return invocation_entry(
            hook.name,
            stage,
            sequence,
            self._state.phase if step is not None else plan_phase,
            step.step_id if step else None,
            workflow.now(),
        )

    async def _invoke(
        self,
        spec: StageSpec,
        hook: HookEntry,
        sequence: int,
        call: HookCall,
        plan_phase: int | None,
        step: PlanStep | None,
        *,
        deadline: datetime | None = None,
    ) -> tuple[Any, None] | tuple[None, InvocationFailure | None]:
        """Run one hook invocation as an activity (or a local activity) and record it, its decision and
        its effects, whatever its outcome; start the work it detached once it has succeeded. A lost worker
        dispatches the invocation again (its attempts stay the hook's own); workers lost on every dispatch
        end the request with ``WorkerLost``, recorded as such, never as the hook's verdict. A ``deadline``
        (its chain's) bounds the invocation with all its retries; one that times out there leaves its
        chain's decision to :meth:`_chain_exhausted`."""
        summary = f"{spec.stage.value} · {hook.name}" + (f" · {step.step_id}" if step else "")
        retry = RetryPolicy(
            initial_interval=HOOK_RETRY_INITIAL_INTERVAL,
            backoff_coefficient=HOOK_RETRY_BACKOFF,
            maximum_attempts=hook.max_attempts,
            non_retryable_error_types=NON_RETRYABLE_HOOK_FAILURES,
        )
        invocation = self._invocation(hook, spec.stage, sequence, plan_phase, step)

        def lost(n: int) -> None:
            invocation.worker_losses = n

        try:
            if hook.run_mode is RunMode.LOCAL_ACTIVITY:
                recorded = await workflow.execute_local_activity(
                    self._local_type(spec, [hook]),
                    call,
                    result_type=dict,
                    start_to_close_timeout=timedelta(seconds=hook.timeout_seconds),
                    schedule_to_close_timeout=deadline - workflow.now() if deadline is not None else None,
                    retry_policy=retry,
                    summary=Shown(summary),
                )
                outcome = spec.outcome_of(call, recorded)
            else:
                outcome = await self._scheduler.activity(
                    spec.activity,
                    call,
                    result_type=spec.outcome,
                    timeout=hook.timeout_seconds,
                    retry_policy=retry,
                    summary=Shown(summary),
                    on_worker_lost=lost,
                    deadline=deadline,
                )
        except (ActivityError, ApplicationError, TimeoutError) as err:
            raise_if_cancelled(err)
            invocation.duration_ms = elapsed_ms(invocation.started_at)
            timed_out = isinstance(err, TimeoutError) or isinstance(getattr(err, "cause", None), TimeoutError)
            if deadline is not None and timed_out and _seconds_until(deadline) < MIN_CHAIN_START_SECONDS:
                return self._chain_exhausted(spec, hook, invocation, started=True)
            return None, self._failed(spec, invocation, hook, InvocationFailure.from_error(err, hook), err)
        invocation.duration_ms = elapsed_ms(invocation.started_at)
        return await self._succeeded(invocation, hook, outcome), None

    async def _invoke_chained(
        self,
        spec: StageSpec,
        hook: HookEntry,
        sequence: int,
        call_for: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
        chains: ChainClock,
    ) -> tuple[Any, None] | tuple[None, InvocationFailure | None]:
        """One hook of a chain: not started once its chain has less than ``MIN_CHAIN_START_SECONDS`` left,
        else invoked with what is left as its deadline (the time it takes is the chain's)."""
        chain = hook.chain
        assert chain is not None
        left = chains.left(chain)
        if left < MIN_CHAIN_START_SECONDS:
            return self._chain_exhausted(
                spec, hook, self._invocation(hook, spec.stage, sequence, plan_phase, step), started=False
            )
        started = workflow.now()
        deadline = started + timedelta(seconds=left)
        result = await self._invoke(spec, hook, sequence, call_for(hook), plan_phase, step, deadline=deadline)
        chains.spend(chain, started)  # an invocation that raised ended the stage: nothing left to budget
        return result

    def _chain_exhausted(
        self, spec: StageSpec, hook: HookEntry, invocation: HookInvocation, *, started: bool
    ) -> tuple[Any, None] | tuple[None, InvocationFailure | None]:
        """A hook whose chain's budget ran out, before its turn (``started`` False: it never ran) or while
        it ran, decides as its own timeout would: a block refuses what the stage gates (the call is
        denied, the run stopped) and ends the stage, so the rest of the chain never starts; an allow lets
        the stage go on without it. The record says which, with the reason ``chain_budget_exhausted``."""
        chain = hook.chain
        assert chain is not None
        reason = decisions.REASON_CHAIN_BUDGET_EXHAUSTED
        invocation.outcome = InvocationOutcome.TIMED_OUT if started else InvocationOutcome.NOT_STARTED
        invocation.error_type = decisions.CHAIN_BUDGET_EXHAUSTED
        invocation.error = f"the {chain.event} chain spent its {chain.budget_seconds:g} s budget" + (
            "" if started else " before this hook's turn: not started"
        )
        outcome = None
        if chain.on_exhausted == "block":
            outcome = spec.refusal(hook, f"blocked by hook {hook.name}: {reason}", reason)
            if outcome is None:  # nothing to refuse here: the timeout is the hook's failure
                failure = InvocationFailure(category=decisions.HOOK_TIMEOUT, message=invocation.error)
                return None, self._failed(spec, invocation, hook, failure)
            invocation.decision = outcome.decision
        else:
            invocation.decision = HookDecision(
                failure_policy=spec.policy(hook), action=DecisionAction.CONTINUE, reason=reason
            )
        self._state.record.pipeline_hooks.append(invocation)
        return outcome, None

    async def _invoke_batch(
        self,
        spec: StageSpec,
        hooks: list[HookEntry],
        first_sequence: int,
        call_for: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
        segments: Sequence[tuple[StageSpec, list[HookEntry], list[HookCall]]] = (),
        *,
        write: bool = False,
        end: TerminalEnd | None = None,
    ) -> tuple[list[_Result], SnapshotAttempt | None]:
        """Run consecutive in-process hooks of a stage in one local activity: one workflow activation and
        one marker (summarised ``<stage> · <hook>, <hook>, ...``) instead of one per hook, while each hook
        keeps its own invocation — its attempts, its timeout, its span, its record entry. The activity
        passes each hook what the ones before it made of the stage, as this workflow would
        (``workflows.stages.next_call``), and stops at a failure or at an outcome that ends the stage; the
        hooks it did not reach are left to the caller. ``segments``: later stages' in-process hooks the
        activity runs on into (see :meth:`run`); what it ran of them is kept for their stage. ``write``: the
        activity is handed the accepted plan's snapshot, ``end`` the terminal one (see :meth:`run`).
        Returns (hook, outcome, failure) for each hook of this stage that ran, in order, and what became
        of the accepted plan's snapshot (the terminal one's is kept in ``RunState.end_attempt``)."""
        stage = spec.stage
        calls = [call_for(hook) for hook in hooks]
        parts = [(stage, hooks)] + [(later.stage, later_hooks) for later, later_hooks, _ in segments]
        summary = STAGE_SEPARATOR.join(
            f"{part.value} · {', '.join(hook.name for hook in part_hooks)}" for part, part_hooks in parts
        )
        summary += f" · {step.step_id}" if step else ""
        # Every hook's every attempt, and the pauses between them: each hook's own bounds apply inside.
        budget = sum(
            hook.timeout_seconds * hook.max_attempts + sum(hook_retry_delay(n) for n in range(1, hook.max_attempts))
            for _, part_hooks in parts
            for hook in part_hooks
        )
        if segments:
            activity_type = stages_activity_type(
                [(part, [hook.name for hook in part_hooks]) for part, part_hooks in parts]
            )
        else:
            activity_type = self._local_type(spec, hooks)
        started = workflow.now()
        snapshot = None
        if write:
            snapshot = AcceptedPlanWrite(
                record=self._state.record, started=started, first_sequence=first_sequence, plan_phase=plan_phase
            )
        ending = None
        if end is not None:
            ending = TerminalWrite(
                record=self._state.record.model_copy(deep=True),
                started=started,
                parts=[
                    TerminalPart(stage=stage, first_sequence=first_sequence, plan_phase=plan_phase),
                    *(TerminalPart(stage=later.stage) for later, _, _ in segments),
                ],
                plan=STAGES[stage].subject(calls[0]) if stage is Stage.AFTER_PLANNING else None,
                end=end,
            )
        try:
            batch = await workflow.execute_local_activity(
                activity_type,
                HookBatchCall(
                    stage=stage,
                    calls=calls,
                    ahead=[
                        HookBatchSegment(stage=later.stage, calls=later_calls) for later, _, later_calls in segments
                    ],
                    write=snapshot,
                    end=ending,
                ),
                result_type=HookBatchOutcome,
                start_to_close_timeout=timedelta(seconds=budget + 10),
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=Shown(summary),
            )
        except (ActivityError, ApplicationError, TimeoutError) as err:
            raise_if_cancelled(err)
            # The batch itself broke (not one of its hooks, whose failures are entries): each hook's
            # invocation is recorded as failed with the batch's error, and decided as usual. The later
            # stages' hooks run at their stage.
            results: list[_Result] = []
            for offset, hook in enumerate(hooks):
                invocation = self._invocation(hook, stage, first_sequence + offset, plan_phase, step)
                failure = InvocationFailure.from_error(err, hook)
                results.append((hook, None, self._failed(spec, invocation, hook, failure, err)))
                if failure.decision is not None and failure.decision.action.ends_request:
                    break
            return results, None
        clock = started + spent(batch.entries)
        for (later, _, later_calls), entries in zip(segments, batch.ahead, strict=False):
            if entries:
                self._ran_ahead[later.stage] = _RanAhead(
                    calls=later_calls[: len(entries)], entries=entries, started=clock
                )
            clock += spent(entries)
        if ending is not None and batch.end is not None:
            self._state.end_attempt = EndAttempt(ending, [batch.entries, *batch.ahead], batch.end)
        results = await self._batch_results(
            spec, hooks, calls, first_sequence, plan_phase, step, batch.entries, started
        )
        return results, batch.snapshot

    async def _batch_results(
        self,
        spec: StageSpec,
        hooks: list[HookEntry],
        calls: Sequence[HookCall],
        first_sequence: int,
        plan_phase: int | None,
        step: PlanStep | None,
        entries: list[HookBatchEntry],
        started: datetime,
    ) -> list[_Result]:
        """Each entry of a batch recorded as its hook's invocation (from ``started``, one after another).
        ``calls``: the calls the workflow built for ``hooks`` before the batch; each hook after the first
        received its call as the batch passed it on (``next_call``), and an entry that left out an
        unchanged subject gets it back from there."""
        results: list[_Result] = []
        clock = started
        received = calls[0]
        for offset, (hook, entry) in enumerate(zip(hooks, entries, strict=False)):
            invocation = self._invocation(hook, spec.stage, first_sequence + offset, plan_phase, step)
            invocation.started_at, invocation.duration_ms = clock, entry.duration_ms
            clock += timedelta(milliseconds=entry.duration_ms)
            if entry.failure is not None:
                failure = InvocationFailure.from_batch(entry.failure, hook)
                results.append((hook, None, self._failed(spec, invocation, hook, failure)))
            else:
                outcome = spec.outcome_of(received, entry.outcome)
                results.append((hook, await self._succeeded(invocation, hook, outcome), None))
                if offset + 1 < len(calls):  # None: the batch stopped at this hook, no entry follows
                    received = next_call(spec, received, outcome, calls[offset + 1]) or received
        return results

    def _failed(
        self,
        spec: StageSpec,
        invocation: HookInvocation,
        hook: HookEntry,
        failure: InvocationFailure,
        err: BaseException | None = None,
    ) -> InvocationFailure:
        """Record a failed invocation and its decision; an infrastructure failure ends the request."""
        invocation.outcome = _INVOCATION_OUTCOMES.get(failure.category, InvocationOutcome.FAILED)
        invocation.error = failure.message
        invocation.error_type = failure.category
        invocation.exception_type = failure.exception_type
        invocation.decision = failure.decision = spec.failure(hook, failure.category)
        record = self._state.record
        record.pipeline_hooks.append(invocation)
        record_effects(record, failure.effects)
        record.model_calls.extend(failure.model_calls)
        if failure.category in INFRASTRUCTURE_FAILURES:  # not the hook's verdict: the request ends as it is
            if isinstance(err, ApplicationError) and err.type == failure.category:
                raise err
            raise ApplicationError(
                failure.message,
                {"hook": hook.name, "stage": spec.stage.value},
                type=failure.category,
                non_retryable=True,
            ) from None
        return failure

    async def _succeeded(self, invocation: HookInvocation, hook: HookEntry, outcome: HookOutcome) -> HookOutcome:
        """Record a successful invocation; keep the hook's state, adopt its leases, start its detached work."""
        state = self._state
        invocation.decision = outcome.decision
        state.record.pipeline_hooks.append(invocation)
        if outcome.state is not None:
            state.hook_state[hook.name] = outcome.state
        record_effects(state.record, outcome.effects)
        state.record.model_calls.extend(outcome.model_calls)
        for lease in outcome.leases:
            state.leases.adopt(lease, state.manifest.settings)
        for work in outcome.detached:
            await self._start_detached(work)
        return outcome

    async def _start_detached(self, work: DetachedWork) -> None:
        """Start the child that carries a detached effect to its terminal state; it outlives the request."""
        state = self._state
        effect = state.record.effect(work.effect_id)
        if effect is None:
            return
        info = workflow.info()
        self._scheduler.check_payload(f"detached · {work.hook} · {work.effect_id}", work)
        settings = state.manifest.settings
        self._listing.publish(untimed=True)  # the server starts the child at once
        await start_effect_child(
            state.record,
            state.detached_tokens,
            effect,
            lambda token: DetachedEffectInput(
                parent_workflow_id=info.workflow_id,
                parent_run_id=info.run_id,
                request_id=state.request_id,
                work=work,
                effect=effect,
                update_token=token,
                heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
                max_worker_losses=settings.max_worker_losses,
                ui_shows_text=state.manifest.ui_shows_text,
            ),
            workflow_type=DETACHED_WORKFLOW_TYPE,
            id=detached_workflow_id(info.workflow_id, work.effect_id),
            what="detached work",
            static_summary=story.detached_summary(work.stage.value, work.hook, work.effect_id),
            static_details=story.detached_details(info.workflow_id, state.request_id),
            search_attributes=self._listing.child_kind(sa.KIND_DETACHED_EFFECT),
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
    if failure.category == decisions.HOOK_PANIC:
        return ApplicationError(
            f"extension {hook.name!r} panicked at {stage.value}: {failure.message}",
            {
                "extension": hook.name,
                "phase": stage.value,
                "cause": failure.message,
                "exception_type": failure.exception_type,
                "failure_policy": failure.decision.failure_policy.value if failure.decision else None,
            },
            type=decisions.HOOK_PANIC,
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


def _refusal_text(outcome: Any) -> str | None:
    """Why an outcome refused, in the hook's words: its verdict's or stop's reason and message."""
    for holder in (getattr(outcome, "verdict", None), getattr(outcome, "stop", None)):
        if holder is None:
            continue
        words = [getattr(holder, "reason", ""), getattr(holder, "message", "") or getattr(holder, "text", "")]
        text = " — ".join(dict.fromkeys(w.strip() for w in words if isinstance(w, str) and w.strip()))
        if text:
            return text
    return None


def _seconds_until(moment: datetime) -> float:
    return (moment - workflow.now()).total_seconds()


def raise_if_cancelled(err: BaseException) -> None:
    """An activity cancelled because the request was cancelled ends the request as cancelled, not as a
    hook error or a failed stage."""
    if isinstance(err, CancelledError) or isinstance(getattr(err, "cause", None), CancelledError):
        raise asyncio.CancelledError() from err


def error_text(err: BaseException) -> str:
    """The most specific message an activity or application failure carries."""
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)
