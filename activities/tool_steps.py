"""The tool-step activities: a plan step's tool with validated arguments and the step's idempotency key —
with its in-process before_tool and after_tool hooks around it when the workflow sends them — and the
check of a step's resolved arguments.

A call with its hooks (``ToolStepInput.hooks``, see ``workflows.tool_calls``): the resolved arguments are
checked first (invalid ones run nothing), then the before_tool hooks in order, each as a local batch runs it
(its attempts, timeout, span), the tool on the call they let through (``workflows.stages.let_through``) and
the after_tool hooks on its outcome. A hook's outcome the workflow must act on first (a denial, a stop, a
lease, detached work, a model call) ends the activity there: the workflow records what ran and goes on
from that hook. The tool's own failure is answered (``ToolStepOutput.error``), never raised, so the
activity is never retried with its hooks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pydantic
from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows import idempotency_key
from workflows.models import (
    MAX_TOOL_OUTPUT_BYTES,
    HookBatchFailure,
    PlanStep,
    StepResult,
    StepStatus,
    ToolCall,
    ToolStepInput,
    ToolStepOutput,
    json_size,
)
from workflows.stages import STAGES, Stage, let_through
from workflows.tool_outcomes import apply_output, outcome_view

from . import telemetry
from .heartbeat import heartbeating
from .tools import ToolContext, ToolRegistry

if TYPE_CHECKING:
    from .hook_stages import HookStageActivities

INVALID_ARGUMENTS = "InvalidArguments"
# How much of a formatter's failure the record keeps.
FORMATTED_FAILURE_CHARS = 300


class ToolSteps:
    """The tool-step activities of a worker (see the module docstring).

    Args:
        hooks: The worker's stage activities: its tools, and how a stage's hooks run in one activity.
    """

    def __init__(self, hooks: HookStageActivities) -> None:
        self._hooks = hooks

    @property
    def tools(self) -> ToolRegistry:
        return self._hooks.tools

    def activities(self) -> list[Callable[..., Any]]:
        return [self.validate_tool_arguments, self.execute_tool_step]

    @activity.defn(name="validate_tool_arguments")
    async def validate_tool_arguments(self, step: PlanStep) -> list[str]:
        """Why a step's resolved arguments do not fit its tool (empty when they do)."""
        return self.tools.argument_problems(step, resolved=True)

    @activity.defn(name="execute_tool_step")
    @heartbeating
    async def execute_tool_step(self, input: ToolStepInput) -> ToolStepOutput:
        """Run one plan step's tool (with its hooks around it, where the workflow sends them)."""
        if input.hooks is None:
            return await self._run_tool(input, input.step.arguments)
        return self._hooks.bounded_result(await self._with_hooks(input), f"execute · {input.step.step_id}")

    async def _run_tool(self, input: ToolStepInput, arguments_in: dict[str, Any]) -> ToolStepOutput:
        step = input.step
        tool = self.tools.get(step.tool_key)
        if tool is None:
            raise ApplicationError(f"unknown tool {step.tool_key}", type=INVALID_ARGUMENTS, non_retryable=True)
        try:
            arguments = tool.Arguments.model_validate(arguments_in)
        except pydantic.ValidationError as err:
            raise ApplicationError(
                f"invalid arguments for {step.tool_key}: {err}", type=INVALID_ARGUMENTS, non_retryable=True
            ) from None
        ctx = ToolContext(
            request_id=input.request_id,
            step_id=step.step_id,
            idempotency_key=input.idempotency_key,
            attempt=activity.info().attempt,
            context=MappingProxyType(input.context),
            conversation_id=input.conversation_id,
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
        formatter = getattr(tool, "format", None)
        if not callable(formatter):
            return ToolStepOutput(output=output)
        try:
            text = formatter(output)
            if not isinstance(text, str):
                raise TypeError(f"format returned {type(text).__name__}, not str")
        except Exception as err:  # noqa: BLE001 - a formatter's failure keeps the output (recovered)
            problem = f"{step.tool_key} could not format its output: {type(err).__name__}: {err}"[
                :FORMATTED_FAILURE_CHARS
            ]
            return ToolStepOutput(output=output, text=f"{step.tool} completed.", format_error=problem)
        return ToolStepOutput(output=output, text=text)

    async def _with_hooks(self, input: ToolStepInput) -> ToolStepOutput:
        hooks, step = input.hooks, input.step
        assert hooks is not None
        problems = self.tools.argument_problems(step, resolved=True)
        if problems:
            return ToolStepOutput(problems=problems, withheld=True)
        answer = ToolStepOutput()
        before = hooks.before_calls()
        call = ToolCall.model_validate(before[0]["call"]) if before else None
        if before:
            answer.before, ran, _ = await self._hooks.run_stage(Stage.BEFORE_TOOL, before)
            passed = let_through(STAGES[Stage.BEFORE_TOOL], ran) if len(ran) == len(before) else None
            if passed is None:
                answer.withheld = True
                return answer
            call = passed
        arguments = call.arguments if call is not None else step.arguments
        if arguments != step.arguments:
            answer.arguments = arguments
        info = activity.info()
        key = idempotency_key(info.workflow_id or "", hooks.first_run_id, step.step_id, arguments)
        started = time.monotonic()
        try:
            tool = await self._run_tool(input.model_copy(update={"idempotency_key": key}), arguments)
        except ApplicationError as err:
            answer.error = HookBatchFailure(type=err.type or "ToolError", message=err.message)
            answer.error_retryable = not err.non_retryable
        except Exception as err:  # noqa: BLE001 - the tool's failure is the workflow's to retry or report
            answer.error = HookBatchFailure(type=type(err).__name__, message=str(err))
            answer.error_retryable = True
        answer.duration_ms = round((time.monotonic() - started) * 1000.0, 3)
        if answer.error is not None:
            return answer
        answer.output, answer.text, answer.format_error = tool.output, tool.text, tool.format_error
        if hooks.after:
            result = StepResult(step_id=step.step_id, tool=step.tool, status=StepStatus.SKIPPED)
            apply_output(result, answer)
            outcome = outcome_view(result).model_dump(mode="json")
            templates = hooks.after_calls()
            ran_call = call.model_dump(mode="json") if call is not None else templates[0]["call"]
            calls = [{**template, "call": ran_call, "outcome": outcome} for template in templates]
            answer.after, _, _ = await self._hooks.run_stage(Stage.AFTER_TOOL, calls)
        return answer
