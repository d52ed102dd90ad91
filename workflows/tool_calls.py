"""A step's call of its tool: an ``execute_tool_step`` activity, a child ``RequestLifecycle`` for a
sub-agent, or — where every tool hook of the step runs in-process — one ``execute_tool_step`` activity that
runs the before_tool hooks, the tool and the after_tool hooks together: no marker, workflow task or round
trip for the hooks beyond what the call itself needs, while each invocation is still recorded, spanned and
named as its own (the workflow records the activity's entries as a local batch's, ``hook_dispatch.PreRun``).

The combined activity makes one attempt: it answers the tool's failure instead of raising it, and the
workflow retries the tool alone with the attempts left, so no hook runs twice for one call. Workflow code
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from . import search_attributes as sa
    from . import story
    from .converter import Shown
    from .effects import elapsed_ms
    from .hook_dispatch import hooks_budget, raise_if_cancelled
    from .listing import StageListing
    from .models import (
        LOOP_DEPTH_EXCEEDED,
        MAX_SUBAGENT_DEPTH,
        METADATA_PARENT_WORKFLOW,
        METADATA_SUBAGENT_DEPTH,
        Diagnostic,
        HookCall,
        HookEntry,
        PlanStep,
        RequestInput,
        RequestResult,
        StepResult,
        StepStatus,
        ToolCall,
        ToolOutcomeView,
        ToolStepHooks,
        ToolStepInput,
        ToolStepOutput,
        subagent_depth,
    )
    from .run_state import RunState
    from .scheduling import Scheduler
    from .support import idempotency_key
    from .tool_outcomes import apply_output


@dataclass
class FusedCall:
    """A tool call made together with its in-process hooks: the calls the workflow built for them, and
    what the activity answered (None: the activity itself failed — nothing of it is taken)."""

    before: list[HookCall]
    after: list[HookCall]  # built before the tool ran; :meth:`ToolCalls.after_calls` puts in its outcome
    started: datetime
    output: ToolStepOutput | None = None


class ToolCalls:
    """Makes the tool calls of one request's steps (see the module docstring)."""

    def __init__(self, state: RunState, scheduler: Scheduler, listing: StageListing, *, workflow_type: str) -> None:
        self._state = state
        self._scheduler = scheduler
        self._listing = listing
        self._workflow_type = workflow_type  # a sub-agent step runs a child of this type

    def _input(self, step: PlanStep, call: ToolCall, key: str, hooks: ToolStepHooks | None = None) -> ToolStepInput:
        return ToolStepInput(
            step=step.model_copy(update={"arguments": call.arguments}),
            request_id=self._state.request_id,
            idempotency_key=key,
            context=self._state.input.metadata,
            conversation_id=self._state.conversation_id,
            hooks=hooks,
        )

    @staticmethod
    def key(step: PlanStep, arguments: dict[str, Any]) -> str:
        """The idempotency key of a call: by run and by the arguments as executed, so every retry of the
        call (and a dispatch after a lost worker) carries the same key and another call never does."""
        info = workflow.info()
        return idempotency_key(info.workflow_id, info.first_execution_run_id, step.step_id, arguments)

    async def call(self, step: PlanStep, call: ToolCall, result: StepResult, *, attempts: int | None = None) -> None:
        """Execute the tool (a sub-agent as a child request); ``result`` says how it went."""
        if call.subagent:
            await self._call_subagent(step, call, result)
            return
        settings = self._state.manifest.settings
        result.idempotency_key = self.key(step, call.arguments)
        started = workflow.now()
        try:
            output = await self._scheduler.activity(
                "execute_tool_step",
                self._input(step, call, result.idempotency_key),
                result_type=ToolStepOutput,
                timeout=settings.tool_timeout_seconds,
                retry_policy=RetryPolicy(
                    maximum_attempts=attempts or settings.tool_max_attempts,
                    non_retryable_error_types=["InvalidArguments"],
                ),
                summary=Shown(f"execute · {step.tool} ({step.step_id})"),
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            cause = err.cause
            result.duration_ms = elapsed_ms(started)
            self.failed(
                result,
                getattr(cause, "message", None) or str(cause or err),
                getattr(cause, "type", None) or type(cause).__name__,
            )
            return
        result.duration_ms = elapsed_ms(started)
        self.took(step, result, output)

    @staticmethod
    def failed(result: StepResult, error: str, error_type: str) -> None:
        result.status = StepStatus.FAILED
        result.error, result.error_type = error, error_type
        result.result = f"error: {error}"

    def took(self, step: PlanStep, result: StepResult, output: ToolStepOutput) -> None:
        """Take a successful call's output; a formatter that failed is recovered from, and observed."""
        apply_output(result, output)
        if output.format_error is not None:
            # The output is kept; the model reads that the tool completed.
            self._state.record.diagnostics.append(
                Diagnostic(
                    extension="(formatter)", phase="after_tool", error=output.format_error, error_type="FormatterError"
                )
            )
            self._state.recover(
                "formatter", "FormatterError", output.format_error, {"step_id": step.step_id, "tool": step.tool_key}
            )

    # -- with its hooks ------------------------------------------------------------------------------

    async def call_with_hooks(
        self,
        step: PlanStep,
        call: ToolCall,
        before: tuple[list[HookEntry], list[HookCall]],
        after: tuple[list[HookEntry], list[HookCall]],
    ) -> FusedCall:
        """Run the step's in-process before_tool hooks, its tool and its after_tool hooks in one activity
        (see the module docstring)."""
        settings = self._state.manifest.settings
        budget = hooks_budget([*before[0], *after[0]])
        fused = FusedCall(before=before[1], after=after[1], started=workflow.now())
        labels = [
            f"{stage}:" + " + ".join(dict.fromkeys(hook.name for hook in entries))
            for stage, entries in (("before_tool", before[0]), ("after_tool", after[0]))
            if entries
        ]
        try:
            fused.output = await self._scheduler.activity(
                "execute_tool_step",
                self._input(
                    step,
                    call,
                    self.key(step, call.arguments),
                    ToolStepHooks.of(before[1], after[1], workflow.info().first_execution_run_id),
                ),
                result_type=ToolStepOutput,
                timeout=settings.tool_timeout_seconds + budget,
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=Shown(f"execute · {step.tool} ({step.step_id}) with {' · '.join(labels)}"),
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            workflow.logger.warning(
                "%s with its hooks failed: %s; its hooks and tool run again one by one", step.step_id, err
            )
        return fused

    @staticmethod
    def after_calls(fused: FusedCall, call: ToolCall, outcome: ToolOutcomeView) -> list[HookCall]:
        """The after_tool calls as the activity ran them: on the call as it ran, and its outcome."""
        return [c.model_copy(update={"call": call, "outcome": outcome}) for c in fused.after]

    # -- a sub-agent ---------------------------------------------------------------------------------

    async def _call_subagent(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Run a sub-agent step as a child ``RequestLifecycle`` one level deeper; beyond
        ``MAX_SUBAGENT_DEPTH`` the step fails with ``LoopDepthExceeded`` and no child starts."""
        state = self._state
        info = workflow.info()
        depth = subagent_depth(state.input.metadata) + 1
        started = workflow.now()
        result.status = StepStatus.FAILED
        if depth > MAX_SUBAGENT_DEPTH:
            workflow.logger.warning("security.hook.loop_depth_exceeded step=%s depth=%s", step.step_id, depth)
            result.error_type = LOOP_DEPTH_EXCEEDED
            result.error = f"sub-agent depth {depth} exceeds the limit of {MAX_SUBAGENT_DEPTH}"
        else:
            asked = str(call.arguments.get("request") or state.ask)
            metadata = {
                **state.input.metadata,
                METADATA_SUBAGENT_DEPTH: depth,
                METADATA_PARENT_WORKFLOW: info.workflow_id,
            }
            self._listing.publish()
            try:
                answer = await workflow.execute_child_workflow(
                    self._workflow_type,
                    RequestInput(request=asked, metadata=metadata),
                    id=f"{info.workflow_id}/subagent/{step.step_id}",
                    task_queue=info.task_queue,
                    result_type=RequestResult,
                    static_summary=story.subagent_summary(
                        step.tool, step.step_id, depth, asked, with_text=state.manifest.ui_shows_text
                    ),
                    static_details=story.subagent_details(
                        info.workflow_id, state.request_id, asked, with_text=state.manifest.ui_shows_text
                    ),
                    search_attributes=self._listing.child_request(sa.KIND_SUBAGENT),
                )
            except FailureError as err:
                raise_if_cancelled(err)
                cause = getattr(err, "cause", None) or err
                result.error_type = getattr(cause, "type", None) or type(cause).__name__
                result.error = getattr(cause, "message", None) or str(cause)
            else:
                result.status = StepStatus.SUCCEEDED
                result.output = {"response": answer.response, "workflow_id": answer.workflow_id, "depth": depth}
                result.result = answer.response
        result.duration_ms = elapsed_ms(started)
        if result.status is StepStatus.FAILED:
            result.result = f"error: {result.error}"
