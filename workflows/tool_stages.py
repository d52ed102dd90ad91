"""The hook stages of one tool call, as the request workflow runs them: before_tool (allow / modify /
deny / stop), on_tool_error when the call failed, and after_tool on every outcome. Each runs only the
hooks whose matcher and sub-agent filter admit the call. Workflow code only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from . import stages
    from .invocation import HookRunner, OnOutcome, PreRun, RunStopped, StageRun
    from .models import (
        ApprovalCall,
        HookEntry,
        PlanStep,
        RecoveredError,
        StepResult,
        StepStatus,
        StepSummary,
        ToolCall,
        ToolOutcomeView,
    )
    from .run_state import RunState
    from .stages import Fold, Stage
    from .tool_outcomes import outcome_view

# Why a declared hook of a blocking event blocked when its handler could not decide (not its verdict).
_EVENT_FAILURES = frozenset({"hook_error", "timeout", "chain_budget_exhausted"})


@dataclass
class PreparedCall:
    """A step on its way to its tool: the call as it will run and the step's result so far. ``ready``: the
    tool may run (its references resolved, its arguments valid, its before_tool chain let it through);
    otherwise the result says why not — a missing input, invalid arguments (``invalid``), a denial."""

    call: ToolCall
    result: StepResult
    ready: bool
    invalid: bool = False
    steps: list[StepSummary] = field(default_factory=list)  # the request's steps finished when it was prepared

    def approval_call(self, step: PlanStep) -> ApprovalCall:
        """The call as a reviewer approves it: the arguments it will run with."""
        arguments = copy.deepcopy(self.call.arguments)
        return ApprovalCall(
            step_id=step.step_id,
            tool=step.tool,
            arguments=arguments,
            planned_arguments=copy.deepcopy(step.arguments) if arguments != step.arguments else None,
            modified_by=list(self.result.modified_by),
        )


class ToolStages:
    """The tool-call hook stages of a request's steps (see the module docstring)."""

    def __init__(self, state: RunState, runner: HookRunner) -> None:
        self._state, self._runner = state, runner

    async def _run(
        self,
        stage: Stage,
        step: PlanStep,
        tool_call: ToolCall,
        subject: Any,
        on_outcome: OnOutcome,
        prerun: PreRun | None = None,
        **extras: Any,
    ) -> StageRun:
        """A tool stage's chain for one step (``prerun``: its leading hooks already ran in the step's
        activity)."""
        hooks = self._state.manifest.tool_participants(stage, tool_call)
        spec = stages.STAGES[stage]
        return await self._runner.run(spec, subject, on_outcome, hooks=hooks, step=step, prerun=prerun, **extras)

    async def before_tool(
        self,
        step: PlanStep,
        call: ToolCall,
        result: StepResult,
        *,
        steps: list[StepSummary],
        prerun: PreRun | None = None,
    ) -> PreparedCall:
        """The before_tool chain: the call as it will run, or denied. A stop ends the run."""

        def on_outcome(
            hook: HookEntry, outcome: stages.execution.BeforeToolOutcome, before: ToolCall, folded: Fold
        ) -> None:
            verdict = outcome.verdict
            if verdict.action == "modify":
                result.arguments = folded.subject.arguments
                result.modified_by.append(hook.name)
            elif verdict.action == "deny":
                result.skip_reason, result.skipped_by = "policy", hook.name
                result.skip_detail = verdict.reason or None
                result.result = verdict.message or f"{step.tool} was not run: denied by {hook.name}"
                if hook.chain is not None and verdict.reason in _EVENT_FAILURES:
                    # A declared hook of a blocking event that failed blocks (fail closed): the run goes on
                    # without the call, and on_error observes the event's failure.
                    self._state.recover(
                        "event",
                        "EventHookFailed",
                        verdict.message,
                        {
                            "hook": hook.name,
                            "event": hook.chain.event,
                            "reason": verdict.reason,
                            "step_id": step.step_id,
                        },
                    )
            elif verdict.action == "stop":
                raise RunStopped(hook.name, Stage.BEFORE_TOOL.value, verdict.reason, verdict.message)

        chain = await self._run(Stage.BEFORE_TOOL, step, call, call, on_outcome, prerun, steps=steps)
        return PreparedCall(chain.subject, result, ready=not chain.ended, steps=steps)

    async def on_tool_error(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Offer a failed step to on_tool_error hooks: the first that handles it substitutes the result."""
        failed = ToolOutcomeView(status="failed", error=result.error, result=result.result or "")

        def on_outcome(hook: HookEntry, outcome: stages.execution.ToolErrorOutcome, before: Any, folded: Fold) -> None:
            if not folded.ends:
                return
            result.error_handled_by = hook.name
            result.result = outcome.resolution.result
            # Handled: the error is suppressed. The step succeeds with the substitute (its dependents run on
            # it), and the record keeps what failed beside it.
            result.recovered_from = RecoveredError(
                error=result.error, error_type=result.error_type, handled_by=hook.name
            )
            result.status, result.output = StepStatus.SUCCEEDED, outcome.resolution.result
            result.error = result.error_type = None

        await self._run(Stage.ON_TOOL_ERROR, step, call, failed, on_outcome, call=call)

    async def after_tool(self, step: PlanStep, prepared: PreparedCall, prerun: PreRun | None = None) -> None:
        """Chain result rewrites over the outcome of ``prepared``'s call, whatever it was (run, failed,
        skipped, denied); the execution status never changes here. The hooks see the request's steps as they
        were when the call was prepared."""
        call, result = prepared.call, prepared.result

        def on_outcome(hook: HookEntry, outcome: stages.execution.AfterToolOutcome, before: Any, folded: Fold) -> None:
            result.result = outcome.result

        outcome = outcome_view(result)
        await self._run(Stage.AFTER_TOOL, step, call, outcome, on_outcome, prerun, call=call, steps=prepared.steps)
