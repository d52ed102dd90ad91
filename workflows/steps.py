"""How the request workflow executes a plan: each step through its tool-call stages, concurrently where
the plan allows.

A step starts once everything it depends on (``depends_on`` in its phase, ``implicit_deps`` in earlier
ones) has succeeded; its arguments' references are resolved and validated; then before_tool (allow /
modify / deny / stop), the tool (an activity, or a child ``RequestLifecycle`` for a sub-agent),
on_tool_error when it failed, and after_tool on every outcome. Workflow code only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

with workflow.unsafe.imports_passed_through():
    from . import search_attributes as sa
    from . import story
    from .effects import elapsed_ms
    from .invocation import HookInvoker, RunStopped, raise_if_cancelled
    from .models import (
        LOOP_DEPTH_EXCEEDED,
        MAX_SUBAGENT_DEPTH,
        METADATA_PARENT_WORKFLOW,
        METADATA_SUBAGENT_DEPTH,
        AfterToolCall,
        AfterToolOutcome,
        BeforeToolCall,
        BeforeToolOutcome,
        ExecutionResult,
        HookCall,
        HookEntry,
        Plan,
        PlanStep,
        RequestInput,
        RequestResult,
        Stage,
        StepResult,
        StepStatus,
        ToolCall,
        ToolErrorCall,
        ToolErrorOutcome,
        ToolMetrics,
        ToolOutcomeView,
        ToolStepInput,
        ToolStepOutput,
        subagent_depth,
    )
    from .plan_validation import UnresolvedReference, resolve_references
    from .support import idempotency_key

WORKFLOW_TYPE = "RequestLifecycle"
_OUTCOME_STATUS: dict[StepStatus, Literal["executed", "failed", "skipped"]] = {
    StepStatus.SUCCEEDED: "executed",
    StepStatus.FAILED: "failed",
    StepStatus.SKIPPED: "skipped",
}


class StepExecution(HookInvoker):
    """The request workflow's plan execution (its state is the workflow's)."""

    _results: dict[str, StepResult]

    async def _execute(self, plan: Plan) -> ExecutionResult:
        """One activity per step, each started as soon as its dependencies have succeeded. If a step ends
        the run (a stop, a hook that fails closed, cancellation) the steps still running are cancelled, and
        every step that finished is kept in the record."""
        self._set_stage("executing")
        results = self._results
        waiting = list(plan.steps)
        running: dict[asyncio.Task[StepResult], str] = {}
        try:
            while waiting or running:
                for step in list(waiting):
                    deps = [results.get(d) for d in [*step.depends_on, *step.implicit_deps]]
                    if any(d is None for d in deps):
                        continue
                    waiting.remove(step)
                    blocked = [d.step_id for d in deps if d is not None and d.status is not StepStatus.SUCCEEDED]
                    missing = f"dependency_not_succeeded: {', '.join(blocked)}" if blocked else None
                    running[asyncio.ensure_future(self._run_step(step, missing=missing))] = step.step_id
                if not running:
                    # Only reachable with a plan that bypassed validation: never wait on what cannot finish.
                    for step in waiting:
                        running[asyncio.ensure_future(self._run_step(step, missing="unresolvable_dependency"))] = (
                            step.step_id
                        )
                    waiting.clear()
                done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    result = task.result()
                    results[result.step_id] = result
                    self._count_tool_metrics(result)
        except BaseException:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            self._record.steps.extend(results[s.step_id] for s in plan.steps if s.step_id in results)
            raise
        execution = ExecutionResult(steps=[results[s.step_id] for s in plan.steps])
        self._record.steps.extend(execution.steps)
        return execution

    async def _run_step(self, step: PlanStep, *, missing: str | None = None) -> StepResult:
        """One step through its tool-call stages, then the cap on the result text a model reads."""
        started = workflow.now()
        result = StepResult(step_id=step.step_id, tool=step.tool, status=StepStatus.SKIPPED, started_at=started)
        call = ToolCall(
            step_id=step.step_id,
            namespace=step.namespace,
            agent=step.agent,
            capability=step.capability,
            plan_phase=self._phase,
            subagent=self._is_subagent(step),
        )
        if missing is None:
            try:
                call.arguments = resolve_references(step.arguments, self._results)
            except UnresolvedReference as err:
                missing = str(err)
        if missing is not None:
            result.skip_reason, result.skip_detail, result.result = "missing", missing, missing
        else:
            result.arguments = call.arguments
            problems = await self._resolved_argument_problems(step, call)
            if problems:
                # before_tool sees only validated arguments; these fail like a call the tool refused.
                result.status, result.error_type = StepStatus.FAILED, "InvalidArguments"
                result.error = result.result = "invalid arguments: " + "; ".join(problems)
                await self._on_tool_error(step, call, result)
            elif not await self._before_tool(step, call, result):
                await self._call_tool(step, call, result)
        await self._after_tool(step, call, result)
        limit = self._manifest.settings.max_tool_result_chars
        if result.result is not None and len(result.result) > limit:
            result.result = result.result[: max(0, limit - 1)] + "…"
        return result

    async def _resolved_argument_problems(self, step: PlanStep, call: ToolCall) -> list[str]:
        """Arguments with references were validated at planning only for presence; check their resolved
        values before any before_tool hook sees them (a local activity, where the tools live)."""
        if call.arguments == step.arguments or not self._manifest.tool_participants(Stage.BEFORE_TOOL, call):
            return []
        return await workflow.execute_local_activity(
            "validate_tool_arguments",
            step.model_copy(update={"arguments": call.arguments}),
            result_type=list[str],
            start_to_close_timeout=timedelta(seconds=10),
            summary=f"validate arguments · {step.step_id}",
        )

    async def _tool_stage(
        self,
        stage: Stage,
        step: PlanStep,
        call: ToolCall,
        make_call: Callable[[HookEntry], HookCall],
        apply: Callable[[HookEntry, Any], bool | None] | None = None,
    ) -> bool | None:
        """A tool stage's chain for one step: only the hooks whose matcher and sub-agent filter admit it."""
        return await self._run_stage(
            stage, make_call, apply, hooks=self._manifest.tool_participants(stage, call), step=step
        )

    async def _before_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> bool:
        """The before_tool chain; returns whether the call was denied. A stop ends the run."""

        def apply(hook: HookEntry, outcome: BeforeToolOutcome) -> bool | None:
            verdict = outcome.verdict
            if verdict.action == "modify":
                call.arguments = dict(verdict.arguments or {})
                result.arguments = call.arguments
                result.modified_by.append(hook.name)
            elif verdict.action == "deny":
                result.skip_reason, result.skipped_by = "policy", hook.name
                result.skip_detail = verdict.reason or None
                result.result = verdict.message or f"{step.tool} was not run: denied by {hook.name}"
                return True
            elif verdict.action == "stop":
                raise RunStopped(hook.name, Stage.BEFORE_TOOL.value, verdict.reason, verdict.message)
            return None

        def make(hook: HookEntry) -> BeforeToolCall:
            return BeforeToolCall(hook=hook, view=self._view(hook), call=call)

        return bool(await self._tool_stage(Stage.BEFORE_TOOL, step, call, make, apply))

    def _is_subagent(self, step: PlanStep) -> bool:
        return any(t.key == step.tool_key and t.kind == "subagent" for t in self._manifest.tools)

    async def _call_subagent(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Run a sub-agent step as a child ``RequestLifecycle`` one level deeper; beyond
        ``MAX_SUBAGENT_DEPTH`` the step fails with ``LoopDepthExceeded`` and no child starts."""
        info = workflow.info()
        depth = subagent_depth(self._input.metadata) + 1
        started = workflow.now()
        result.status = StepStatus.FAILED
        if depth > MAX_SUBAGENT_DEPTH:
            workflow.logger.warning("security.hook.loop_depth_exceeded step=%s depth=%s", step.step_id, depth)
            result.error_type = LOOP_DEPTH_EXCEEDED
            result.error = f"sub-agent depth {depth} exceeds the limit of {MAX_SUBAGENT_DEPTH}"
        else:
            asked = str(call.arguments.get("request") or self._ask)
            child = RequestInput(
                request=asked,
                metadata={
                    **self._input.metadata,
                    METADATA_SUBAGENT_DEPTH: depth,
                    METADATA_PARENT_WORKFLOW: info.workflow_id,
                },
            )
            self._publish_stage()
            try:
                answer = await workflow.execute_child_workflow(
                    WORKFLOW_TYPE,
                    child,
                    id=f"{info.workflow_id}/subagent/{step.step_id}",
                    task_queue=info.task_queue,
                    result_type=RequestResult,
                    static_summary=story.subagent_summary(step.tool, step.step_id, depth, asked),
                    static_details=story.subagent_details(info.workflow_id, self._request_id, asked),
                    search_attributes=self._child_kind(sa.KIND_SUBAGENT),
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
            await self._on_tool_error(step, call, result)

    async def _call_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Execute the tool; if it fails after its retries, offer the error to on_tool_error hooks."""
        if call.subagent:
            await self._call_subagent(step, call, result)
            return
        settings = self._manifest.settings
        info = workflow.info()
        # Keyed by run and by the arguments as executed: every retry of this call (and a dispatch after a
        # lost worker) carries the same key; another run or another call never does.
        result.idempotency_key = idempotency_key(
            info.workflow_id, info.first_execution_run_id, step.step_id, call.arguments
        )
        started = workflow.now()
        try:
            output = await self._activity(
                "execute_tool_step",
                ToolStepInput(
                    step=step.model_copy(update={"arguments": call.arguments}),
                    request_id=self._request_id,
                    idempotency_key=result.idempotency_key,
                ),
                result_type=ToolStepOutput,
                timeout=settings.tool_timeout_seconds,
                retry_policy=RetryPolicy(
                    maximum_attempts=settings.tool_max_attempts, non_retryable_error_types=["InvalidArguments"]
                ),
                summary=f"execute · {step.tool} ({step.step_id})",
            )
        except ActivityError as err:
            raise_if_cancelled(err)
            cause = err.cause
            result.duration_ms = elapsed_ms(started)
            result.status = StepStatus.FAILED
            result.error = getattr(cause, "message", None) or str(cause or err)
            result.error_type = getattr(cause, "type", None) or type(cause).__name__
            result.result = f"error: {result.error}"
            await self._on_tool_error(step, call, result)
            return
        result.duration_ms = elapsed_ms(started)
        result.status = StepStatus.SUCCEEDED
        result.output = output.output
        result.result = (
            output.output
            if isinstance(output.output, str)
            else json.dumps(output.output, ensure_ascii=False, sort_keys=True)
        )

    async def _on_tool_error(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Offer a failed step to on_tool_error hooks: the first that handles it substitutes the result."""
        failed = ToolOutcomeView(status="failed", error=result.error, result=result.result or "")

        def apply(hook: HookEntry, outcome: ToolErrorOutcome) -> bool | None:
            if not outcome.resolution.handled:
                return None
            result.error_handled_by = hook.name
            result.result = outcome.resolution.result
            return True

        def make(hook: HookEntry) -> ToolErrorCall:
            return ToolErrorCall(hook=hook, view=self._view(hook), call=call, outcome=failed)

        await self._tool_stage(Stage.ON_TOOL_ERROR, step, call, make, apply)

    async def _after_tool(self, step: PlanStep, call: ToolCall, result: StepResult) -> None:
        """Chain result rewrites over every outcome; the execution status never changes here."""

        def make(hook: HookEntry) -> AfterToolCall:
            view = ToolOutcomeView(
                status=_OUTCOME_STATUS[result.status],
                output=result.output if result.status is StepStatus.SUCCEEDED else None,
                reason=result.skip_reason,
                extension=result.skipped_by,
                error=result.error,
                result=result.result or "",
            )
            return AfterToolCall(hook=hook, view=self._view(hook), call=call, outcome=view)

        def apply(hook: HookEntry, outcome: AfterToolOutcome) -> None:
            result.result = outcome.result

        await self._tool_stage(Stage.AFTER_TOOL, step, call, make, apply)

    def _count_tool_metrics(self, result: StepResult) -> None:
        metrics = self._record.tool_metrics.setdefault(result.tool, ToolMetrics())
        if result.status is StepStatus.SKIPPED:
            metrics.skipped += 1
            return
        metrics.calls += 1
        metrics.failures += result.status is StepStatus.FAILED
        duration = result.duration_ms or 0.0
        metrics.total_duration_ms += duration
        metrics.max_duration_ms = max(metrics.max_duration_ms, duration)
