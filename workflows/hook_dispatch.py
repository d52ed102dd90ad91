"""How a stage's hook invocations are scheduled: each hook as an activity or a local activity, the hooks of
a chain within their chain's time budget, consecutive in-process hooks in one local activity (a batch),
which may run on into later stages while each leaves the run as it was and write a record snapshot with
them; and the results of hooks an earlier local activity already ran. What each invocation means for the
request — folding its outcome, deciding on its failure — is the runner's (``workflows.invocation``).
Workflow code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from . import decisions
    from .converter import Shown
    from .effects import elapsed_ms
    from .hook_record import InvocationRecorder
    from .models import (
        MIN_CHAIN_START_SECONDS,
        AcceptedPlanWrite,
        DecisionAction,
        Diagnostic,
        ExecutionRecord,
        HookBatchCall,
        HookBatchEntry,
        HookBatchOutcome,
        HookBatchSegment,
        HookCall,
        HookDecision,
        HookEntry,
        HookInvocation,
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
    from .snapshots import EndAttempt, spent
    from .stages import STAGE_SEPARATOR, STAGES, StageSpec, hook_activity_type, next_call, stages_activity_type
    from .support import (
        HOOK_RETRY_BACKOFF,
        HOOK_RETRY_INITIAL_INTERVAL,
        NON_RETRYABLE_HOOK_FAILURES,
        InvocationFailure,
        hook_retry_delay,
    )

# The diagnostic of a hook a local activity ran ahead for a stage the run reached changed, or never reached.
STALE_RUN_AHEAD = "StaleRunAhead"
# One invocation's result: the hook, and its outcome or why it failed (neither: nothing to decide).
Result = tuple[HookEntry, Any, InvocationFailure | None]


@dataclass(frozen=True)
class Ahead:
    """A stage the run goes on to with nothing between, if the stage before leaves the run as it is:
    ``subject`` is what its hooks would then work on. Its in-process hooks may run in the same local
    activity as the stage before (see :class:`StageDispatch`)."""

    stage: Stage
    subject: Any
    plan_phase: int | None = None


@dataclass
class PreRun:
    """Hooks of a stage that an activity ran before the workflow reached the stage (a local batch running
    on, a tool step's or a planning activity's hooks): the calls they received, their entries, and when the
    first started. ``trusted``: the calls are the ones the workflow built for them itself (a tool step's
    hooks), so they are taken as they are; otherwise they are taken only if the workflow, on reaching the
    stage, builds the same. ``snapshot``: what became of the snapshot the activity was handed with them,
    taken with them."""

    calls: list[HookCall]
    entries: list[HookBatchEntry]
    started: datetime
    trusted: bool = False
    snapshot: SnapshotAttempt | None = None  # the accepted plan's, where the activity was handed it


@dataclass
class ChainClock:
    """The time each chain has spent in one run of a stage (one occurrence of its event), in workflow time:
    a worker that crashes mid-chain resumes with what the history says was spent."""

    spent: dict[str, timedelta] = field(default_factory=dict)

    def left(self, event: str, budget_seconds: float) -> float:
        return budget_seconds - self.spent.get(event, timedelta()).total_seconds()

    def spend(self, event: str, since: datetime) -> None:
        self.spent[event] = self.spent.get(event, timedelta()) + (workflow.now() - since)


Segments = list[tuple[StageSpec, list[HookEntry], list[HookCall]]]


class HookDispatcher:
    """Schedules the hook invocations of one request (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, recorder: InvocationRecorder) -> None:
        self._state = state
        self._scheduler = scheduler
        self._recorder = recorder
        self.ran_ahead: dict[Stage, PreRun] = {}  # later stages' hooks a local activity already ran

    def unreached(self) -> None:
        """Record the hooks a local activity ran ahead for a stage the run never reached (it ended first)
        as diagnostics: they ran, and the record says so. on_finish is reached on every exit: what ran ahead
        for it is taken, or found stale, there."""
        for stage, ran in list(self.ran_ahead.items()):
            if stage is not Stage.ON_FINISH:
                self._stale(stage, ran, "ran ahead for a stage the run ended before reaching")
                del self.ran_ahead[stage]

    def _stale(self, stage: Stage, ran: PreRun, why: str) -> None:
        for entry in ran.entries:
            self._state.record.diagnostics.append(
                Diagnostic(extension=entry.hook, phase=stage.value, error=why, error_type=STALE_RUN_AHEAD)
            )

    # -- what runs in one local activity ----------------------------------------------------------------

    def local(self, hooks: list[HookEntry]) -> bool:
        """Whether ``hooks`` run in one local activity (in-process, outside any chain, batching on)."""
        return self._state.manifest.settings.batch_local_hooks and all(
            hook.run_mode is RunMode.LOCAL_ACTIVITY and hook.chain is None for hook in hooks
        )

    def batchable(self, hooks: list[HookEntry], start: int) -> list[HookEntry]:
        """The run of in-process hooks from ``start`` that one local activity may invoke together (at
        least the hook at ``start``)."""
        run = hooks[start : start + 1]
        if not self.local(run):
            return run
        for hook in hooks[start + 1 :]:
            if not self.local([hook]):
                break
            run.append(hook)
        return run

    def segments(self, ahead: Sequence[Ahead]) -> Segments:
        """The later stages whose in-process hooks the local activity of a stage's last hooks may run on
        into: each stage of ``ahead`` in order (one without hooks passed over; on_finish, where the run's end
        is all that follows), up to the first whose hooks are not all in-process — that one's leading in-process hooks included. Their calls are
        built now, as the workflow would build them on reaching the stage with the run unchanged."""
        state = self._state
        segments: Segments = []
        for later in ahead:
            spec = STAGES[later.stage]
            hooks = state.manifest.participants(later.stage)
            if spec.tool_stage or later.stage is Stage.ON_ERROR:
                break
            if not hooks:
                continue
            leading = self.batchable(hooks, 0) if self.local(hooks[:1]) else []
            if not leading:
                break
            calls = [spec.build(hook, state.view(hook, later.plan_phase), later.subject) for hook in leading]
            segments.append((spec, leading, calls))
            if len(leading) < len(hooks):
                break
        return segments

    def covers(self, ahead: Sequence[Ahead], segments: Segments) -> bool:
        """Whether ``segments`` run every hook of every stage of ``ahead``."""
        ran = {spec.stage: len(hooks) for spec, hooks, _ in segments}
        participants = self._state.manifest.participants
        return all(ran.get(later.stage, 0) == len(participants(later.stage)) for later in ahead)

    # -- one invocation --------------------------------------------------------------------------------

    async def invoke(
        self,
        spec: StageSpec,
        hook: HookEntry,
        sequence: int,
        call: HookCall,
        plan_phase: int | None,
        step: PlanStep | None,
        *,
        deadline: datetime | None = None,
    ) -> Result:
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
        invocation = self._recorder.entry(hook, spec.stage, sequence, plan_phase, step)

        def lost(n: int) -> None:
            invocation.worker_losses = n

        try:
            if hook.run_mode is RunMode.LOCAL_ACTIVITY:
                recorded = await workflow.execute_local_activity(
                    hook_activity_type(spec.stage, [hook.name]),
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
            if (
                deadline is not None
                and timed_out
                and (deadline - workflow.now()).total_seconds() < MIN_CHAIN_START_SECONDS
            ):
                return self._chain_exhausted(spec, hook, invocation, started=True)
            return (
                hook,
                None,
                self._recorder.failed(spec, invocation, hook, InvocationFailure.from_error(err, hook), err),
            )
        invocation.duration_ms = elapsed_ms(invocation.started_at)
        return hook, await self._recorder.succeeded(invocation, hook, outcome), None

    async def invoke_chained(
        self,
        spec: StageSpec,
        hook: HookEntry,
        sequence: int,
        call_for: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
        chains: ChainClock,
    ) -> Result:
        """One hook of a chain: not started once its chain has less than ``MIN_CHAIN_START_SECONDS`` left,
        else invoked with what is left as its deadline (the time it takes is the chain's)."""
        chain = hook.chain
        assert chain is not None
        left = chains.left(chain.event, chain.budget_seconds)
        if left < MIN_CHAIN_START_SECONDS:
            entry = self._recorder.entry(hook, spec.stage, sequence, plan_phase, step)
            return self._chain_exhausted(spec, hook, entry, started=False)
        started = workflow.now()
        result = await self.invoke(
            spec, hook, sequence, call_for(hook), plan_phase, step, deadline=started + timedelta(seconds=left)
        )
        chains.spend(chain.event, started)  # an invocation that raised ended the stage: nothing left to budget
        return result

    def _chain_exhausted(
        self, spec: StageSpec, hook: HookEntry, invocation: HookInvocation, *, started: bool
    ) -> Result:
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
                return hook, None, self._recorder.failed(spec, invocation, hook, failure)
            invocation.decision = outcome.decision
        else:
            invocation.decision = HookDecision(
                failure_policy=spec.policy(hook), action=DecisionAction.CONTINUE, reason=reason
            )
        self._state.record.pipeline_hooks.append(invocation)
        return hook, outcome, None

    # -- a batch ---------------------------------------------------------------------------------------

    async def invoke_batch(
        self,
        spec: StageSpec,
        hooks: list[HookEntry],
        first_sequence: int,
        call_for: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
        segments: Segments,
        *,
        write: bool = False,
        end: TerminalEnd | None = None,
    ) -> tuple[list[Result], SnapshotAttempt | None]:
        """Run consecutive in-process hooks of a stage in one local activity: one workflow activation and
        one marker (summarised ``<stage> · <hook>, <hook>, ...``) instead of one per hook, while each hook
        keeps its own invocation — its attempts, its timeout, its span, its record entry. The activity
        passes each hook what the ones before it made of the stage, as this workflow would
        (``workflows.stages.next_call``), and stops at a failure or at an outcome that ends the stage; the
        hooks it did not reach are left to the caller. ``segments``: later stages' in-process hooks the
        activity runs on into; what it ran of them is kept for their stage. ``write``: the activity is
        handed the accepted plan's snapshot, ``end`` the terminal one (see :class:`StageDispatch`).
        Returns (hook, outcome, failure) for each hook of this stage that ran, in order, and what became
        of the accepted plan's snapshot (the terminal one's is kept in ``RunState.end_attempt``)."""
        stage = spec.stage
        calls = [call_for(hook) for hook in hooks]
        parts = [(stage, hooks)] + [(later.stage, later_hooks) for later, later_hooks, _ in segments]
        summary = STAGE_SEPARATOR.join(
            f"{part.value} · {', '.join(hook.name for hook in part_hooks)}" for part, part_hooks in parts
        )
        summary += f" · {step.step_id}" if step else ""
        budget = hooks_budget(hook for _, part_hooks in parts for hook in part_hooks)
        named = [(part, [hook.name for hook in part_hooks]) for part, part_hooks in parts]
        activity_type = stages_activity_type(named) if segments else hook_activity_type(stage, named[0][1])
        started = workflow.now()
        snapshot = None
        if write:
            snapshot = AcceptedPlanWrite(
                record=self._state.record, started=started, first_sequence=first_sequence, plan_phase=plan_phase
            )
        ending, sent = None, ""
        if end is not None:
            sent = self._state.record.model_dump_json()  # the record as the activity receives it
            ending = TerminalWrite(
                record=self._state.record,
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
            results: list[Result] = []
            for offset, hook in enumerate(hooks):
                invocation = self._recorder.entry(hook, stage, first_sequence + offset, plan_phase, step)
                failure = InvocationFailure.from_error(err, hook)
                results.append((hook, None, self._recorder.failed(spec, invocation, hook, failure, err)))
                if failure.decision is not None and failure.decision.action.ends_request:
                    break
            return results, None
        clock = started + spent(batch.entries)
        for (later, _, later_calls), entries in zip(segments, batch.ahead, strict=False):
            if entries:
                self.ran_ahead[later.stage] = PreRun(calls=later_calls[: len(entries)], entries=entries, started=clock)
            clock += spent(entries)
        if ending is not None and batch.end is not None:
            handed = ending

            def handed_write() -> TerminalWrite:
                return handed.model_copy(update={"record": ExecutionRecord.model_validate_json(sent)})

            self._state.end_attempt = EndAttempt(handed_write, [batch.entries, *batch.ahead], batch.end)
        results = await self.entries_recorded(
            spec, hooks, calls, first_sequence, plan_phase, step, batch.entries, started
        )
        return results, batch.snapshot

    async def entries_recorded(
        self,
        spec: StageSpec,
        hooks: list[HookEntry],
        calls: Sequence[HookCall],
        first_sequence: int,
        plan_phase: int | None,
        step: PlanStep | None,
        entries: list[HookBatchEntry],
        started: datetime,
    ) -> list[Result]:
        """Each entry of a local activity recorded as its hook's invocation (from ``started``, one after
        another). ``calls``: the calls the workflow built for ``hooks`` before the activity; each hook after
        the first received its call as the activity passed it on (``next_call``), and an entry that left
        out an unchanged subject gets it back from there."""
        results: list[Result] = []
        clock = started
        received = calls[0]
        for offset, (hook, entry) in enumerate(zip(hooks, entries, strict=False)):
            invocation = self._recorder.entry(hook, spec.stage, first_sequence + offset, plan_phase, step)
            invocation.started_at, invocation.duration_ms = clock, entry.duration_ms
            clock += timedelta(milliseconds=entry.duration_ms)
            if entry.failure is not None:
                failure = InvocationFailure.from_batch(entry.failure, hook)
                results.append((hook, None, self._recorder.failed(spec, invocation, hook, failure)))
            else:
                outcome = spec.outcome_of(received, entry.outcome)
                results.append((hook, await self._recorder.succeeded(invocation, hook, outcome), None))
                if offset + 1 < len(calls):  # None: the activity stopped at this hook, no entry follows
                    received = next_call(spec, received, outcome, calls[offset + 1]) or received
        return results

    async def prerun_results(
        self,
        spec: StageSpec,
        participants: list[HookEntry],
        ran: PreRun,
        call_for: Callable[[HookEntry], HookCall],
        plan_phase: int | None,
        step: PlanStep | None,
    ) -> list[Result]:
        """The results of this stage's leading hooks that a local activity ran before the workflow reached
        the stage, when the calls built for them now are the ones it ran (or the workflow built those
        itself: ``ran.trusted``). Otherwise (the run changed between: not a path a caller announces
        ``ahead`` on) none: each hook that ran on what the run no longer is becomes a diagnostic, and the
        stage's hooks run as usual."""
        hooks = participants[: len(ran.calls)]
        # Compared as JSON: what the hooks received is what counts (and a sandboxed replay may build the
        # same call from another copy of its class).
        if ran.trusted or [call_for(h).model_dump(mode="json") for h in hooks] == [
            c.model_dump(mode="json") for c in ran.calls
        ]:
            return await self.entries_recorded(spec, hooks, ran.calls, 1, plan_phase, step, ran.entries, ran.started)
        self._stale(
            spec.stage, ran, "ran ahead on a request the run had changed by the time it reached the stage; run again"
        )
        return []


class StageDispatch:
    """The invocations of one stage's hooks, handed to the runner a run of them at a time (:meth:`next`),
    scheduled as cheaply as the hooks allow: a chain's hooks one by one within its budget, a hook of its
    own as an activity or a local activity, consecutive in-process hooks in one local activity that runs on
    into the stages of ``ahead`` while each leaves the run as it was.

    ``write``: where one local activity runs every hook of the stage (after_planning, for a plan whose
    snapshot is written next), it is handed that snapshot and writes it once the hooks have left the plan
    and the run as they were (``workflows.snapshots``); :attr:`snapshot` says what became of it.

    ``end`` (where nothing but the hooks of this stage and of the stages of ``ahead`` comes before the
    run's end): where one local activity runs every hook of the stage and of those stages, it is handed
    the request's terminal snapshot and writes it once every hook has left the run as it was
    (``RunState.end_attempt`` keeps what became of it)."""

    def __init__(
        self,
        dispatcher: HookDispatcher,
        spec: StageSpec,
        participants: list[HookEntry],
        call_for: Callable[[HookEntry], HookCall],
        *,
        plan_phase: int | None = None,
        step: PlanStep | None = None,
        ahead: Sequence[Ahead] = (),
        write: bool = False,
        end: TerminalEnd | None = None,
        prerun: PreRun | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._spec = spec
        self._participants = participants
        self._call_for = call_for
        self._plan_phase, self._step, self._ahead = plan_phase, step, ahead
        self._ran = prerun or dispatcher.ran_ahead.pop(spec.stage, None)
        alone = bool(participants) and self._ran is None and dispatcher.local(participants)
        self._offer = write and alone
        self._end = end if end is not None and not self._offer and alone else None
        self._chains = ChainClock()
        self._done = 0
        self.snapshot: SnapshotAttempt | None = None

    async def next(self) -> list[Result] | None:
        """The next run of invocations, once they ran and were recorded; None once every hook was handed out."""
        dispatcher, spec, participants = self._dispatcher, self._spec, self._participants
        while self._done < len(participants):
            done = self._done
            batch = dispatcher.batchable(participants, done)
            last = done + len(batch) == len(participants) and dispatcher.local(batch)
            segments = dispatcher.segments(self._ahead) if last and self._ran is None and not self._offer else []
            results: list[Result]
            try:
                if self._ran is not None:
                    ran, self._ran = self._ran, None
                    results = await dispatcher.prerun_results(
                        spec, participants, ran, self._call_for, self._plan_phase, self._step
                    )
                    if not results:
                        continue
                    self.snapshot = ran.snapshot
                elif len(batch) > 1 or segments or self._offer or self._end:
                    whole = self._end is not None and len(batch) == len(participants)
                    results, snapshot = await dispatcher.invoke_batch(
                        spec,
                        batch,
                        done + 1,
                        self._call_for,
                        self._plan_phase,
                        self._step,
                        segments,
                        write=self._offer,
                        end=self._end if whole and dispatcher.covers(self._ahead, segments) else None,
                    )
                    self.snapshot = snapshot or self.snapshot
                elif participants[done].chain is not None:
                    chained = dispatcher.invoke_chained(
                        spec, participants[done], done + 1, self._call_for, self._plan_phase, self._step, self._chains
                    )
                    results = [await chained]
                else:
                    hook = participants[done]
                    call = self._call_for(hook)
                    results = [await dispatcher.invoke(spec, hook, done + 1, call, self._plan_phase, self._step)]
            except (asyncio.CancelledError, ApplicationError) as err:
                if not spec.finalizer:
                    raise
                # A finalizer cancelled with the request, or whose workers kept dying: a diagnostic.
                message = err.message if isinstance(err, ApplicationError) else "cancelled with the request"
                category = (err.type or decisions.WORKER_LOST) if isinstance(err, ApplicationError) else "Cancelled"
                results = [(participants[done], None, InvocationFailure(category=category, message=message))]
            self._done += len(results)
            return results
        return None


def hooks_budget(hooks: Iterable[HookEntry]) -> float:
    """The seconds an activity running ``hooks`` one after another may take besides its own work: every
    hook's every attempt and the pauses between them (each hook's own bounds apply inside)."""
    return sum(
        hook.timeout_seconds * hook.max_attempts + sum(hook_retry_delay(n) for n in range(1, hook.max_attempts))
        for hook in hooks
    )


def raise_if_cancelled(err: BaseException) -> None:
    """An activity cancelled because the request was cancelled ends the request as cancelled, not as a
    hook error or a failed stage."""
    if isinstance(err, CancelledError) or isinstance(getattr(err, "cause", None), CancelledError):
        raise asyncio.CancelledError() from err
