"""How the request workflow runs a stage's hooks: one fold-and-decide loop for every stage.

The runner walks a stage's participants in order, building each call from the stage's subject (the plan,
the answer, the tool call, ...) and folding each outcome into it with the stage's own rule
(``StageSpec.fold``), which may end the stage early (a short-circuit, a denial). A failed invocation is
acted on by the decision the stage and the hook's policy produced — ``terminate`` ends the request with
the stage's typed error (``RequiredAfterPlanningError`` for the required gate, ``HookContractError`` for a
broken short-circuit contract, ``ExtensionError`` otherwise), ``propagate_panic`` with ``HookPanic``,
``continue`` goes on without the hook's result, and at a finalizer stage any failure is a diagnostic. A
hook that refuses is marked on the Timeline at its own row.

How each invocation is scheduled — an activity, a local activity, a batch of them running on into later
stages, a chain within its budget, hooks a local activity ran earlier — is ``workflows.hook_dispatch``'s;
what it leaves in the record is ``workflows.hook_record``'s. Workflow code only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from . import decisions, story
    from .hook_dispatch import Ahead, HookDispatcher, PreRun, StageDispatch, raise_if_cancelled
    from .hook_record import InvocationRecorder
    from .listing import StageListing
    from .models import (
        DecisionAction,
        Diagnostic,
        HookDecision,
        HookEntry,
        PlanStep,
        SnapshotAttempt,
        Stage,
        TerminalEnd,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .stages import STAGES, Fold, StageSpec
    from .support import InvocationFailure

__all__ = [
    "Ahead",
    "HookRunner",
    "OnOutcome",
    "PreRun",
    "RunStopped",
    "StageRun",
    "error_text",
    "raise_if_cancelled",
]

# The decisions a hook's row on the Timeline is marked with (see ``HookRunner._mark``), as it reads them.
_MARKED = {
    DecisionAction.DENY: "denied",
    DecisionAction.STOP: "stopped the run",
    DecisionAction.TERMINATE: "ended the request",
    DecisionAction.PROPAGATE_PANIC: "panicked",
}
DECISION_MARK = timedelta(milliseconds=1)
# What the workflow does with each outcome besides folding it: (hook, outcome, subject before, the fold).
OnOutcome = Callable[[HookEntry, Any, Any, Fold], None]


class RunStopped(Exception):
    """A hook stopped the run with its own answer (caught by the workflow's ``run``)."""

    def __init__(self, extension: str, phase: str, reason: str, text: str) -> None:
        super().__init__(f"{extension} stopped the run at {phase}: {reason}")
        self.extension, self.phase, self.reason, self.text = extension, phase, reason, text


@dataclass
class StageRun:
    """What a stage's hooks made of its subject; ``ended_by``: the hook whose outcome ended the stage;
    ``snapshot``: what became of the accepted plan's snapshot its local activity tried to write (see
    ``hook_dispatch.StageDispatch``)."""

    subject: Any
    ended_by: HookEntry | None = None
    outcome: Any = None
    snapshot: SnapshotAttempt | None = None

    @property
    def ended(self) -> bool:
        return self.ended_by is not None


class HookRunner:
    """Runs a stage's hooks for the request workflow (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing) -> None:
        self._state, self._listing = state, listing
        self.recorder = InvocationRecorder(state, scheduler, listing)
        self.dispatcher = HookDispatcher(state, scheduler, self.recorder)

    def unreached(self) -> None:
        """Record the hooks a local activity ran ahead for a stage the run never reached."""
        self.dispatcher.unreached()

    async def stage(
        self, stage: Stage, subject: Any = None, on_outcome: OnOutcome | None = None, **options: Any
    ) -> Any:
        """Enter ``stage`` (its listing) and run its hooks on ``subject``: what they made of it."""
        self._listing.enter(stage)
        return (await self.run(STAGES[stage], subject, on_outcome, **options)).subject

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
        prerun: PreRun | None = None,
        **extras: Any,
    ) -> StageRun:
        """Run ``spec``'s hooks (``hooks``, or every participant) in order on ``subject``: each call is
        built from the subject as the hooks before left it (``refresh`` first brings it up to date with
        the run, where the stage shows the run's progress), each outcome is folded in by the stage and
        handed to ``on_outcome``, and an outcome that ends the stage ends the run of hooks. A failed
        invocation is handled as its decision says (see the module docstring).

        ``ahead``, ``write_accepted_plan`` and ``end`` let the invocations be scheduled with the stages
        that follow and a record snapshot; ``prerun``: the stage's leading hooks already ran (see
        ``hook_dispatch.StageDispatch``). Each invocation is recorded, decided and marked here exactly as
        if it ran on its own."""
        state = self._state
        participants = state.manifest.participants(spec.stage) if hooks is None else hooks

        def call_for(hook: HookEntry) -> Any:
            nonlocal subject
            if refresh is not None:
                subject = refresh(subject)
            return spec.build(hook, state.view(hook, plan_phase), subject, **extras)

        dispatch = StageDispatch(
            self.dispatcher,
            spec,
            participants,
            call_for,
            plan_phase=plan_phase,
            step=step,
            ahead=ahead,
            write=write_accepted_plan,
            end=end,
            prerun=prerun,
        )
        while (results := await dispatch.next()) is not None:
            for hook, outcome, failure in results:
                if outcome is not None:
                    folded = spec.fold(subject, outcome)
                    if on_outcome is not None:
                        on_outcome(hook, outcome, subject, folded)
                    subject = folded.subject
                    await self._mark(spec, hook, outcome.decision, step, _refusal_text(outcome))
                    if folded.ends:
                        return StageRun(subject, hook, outcome, dispatch.snapshot)
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
        return StageRun(subject, snapshot=dispatch.snapshot)

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


def _stage_error(hook: HookEntry, stage: Stage, failure: InvocationFailure, plan_phase: int | None) -> ApplicationError:
    """The typed, non-retryable error with which a terminating hook failure ends the request."""
    if failure.category == decisions.HOOK_CONTRACT_ERROR:
        return ApplicationError(
            f"{stage.value} hook {hook.name!r} broke the short-circuit contract: {failure.message}",
            {"hook": hook.name, "stage": stage.value, "cause": failure.message},
            type=decisions.HOOK_CONTRACT_ERROR,
            non_retryable=True,
        )
    # A panic (a BaseException the hook raised) ends the request as itself, the required gate's rejection
    # as the gate's, any other failure that ends it as the hook's ExtensionError.
    panicked = failure.category == decisions.HOOK_PANIC
    if hook.required and stage is Stage.AFTER_PLANNING and not panicked:
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
    details: dict[str, Any] = {"extension": hook.name, "phase": stage.value, "cause": failure.message}
    if not panicked:
        details["cause_type"] = failure.category
    details["exception_type"] = failure.exception_type
    details["failure_policy"] = failure.decision.failure_policy.value if failure.decision else None
    return ApplicationError(
        f"extension {hook.name!r} {'panicked' if panicked else 'failed'} at {stage.value}: {failure.message}",
        details,
        type=decisions.HOOK_PANIC if panicked else decisions.EXTENSION_ERROR,
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


def error_text(err: BaseException) -> str:
    """The most specific message an activity or application failure carries."""
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or getattr(err, "message", None) or cause or err)
