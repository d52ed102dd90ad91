"""How the request workflow executes a plan: each step through its tool-call stages, concurrently where
the plan allows.

A step starts once everything it depends on (``depends_on`` in its phase, ``implicit_deps`` in earlier
ones) has succeeded; its arguments' references are resolved and validated; then before_tool (allow /
modify / deny / stop), the tool (an activity, or a child ``RequestLifecycle`` for a sub-agent),
on_tool_error when it failed, and after_tool on every outcome. A call that needs a reviewer is approved
exactly as it will run: prepared (resolved, validated, through before_tool) before its checkpoint opens,
and executed with a copy of the approved values; a reviewer may decline one call of a checkpoint, which
skips it (reason ``confirmation``) and lets the rest run.

Identical calls are found before they run, writes included (``identical_calls``); the hook stages of
one call are ``tool_stages``. Workflow code only.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from . import stages
    from .converter import Shown
    from .identical_calls import IdenticalCalls
    from .invocation import HookRunner, PreRun
    from .listing import EXECUTING, StageListing
    from .models import (
        ApprovalCall,
        ApprovalReason,
        Checkpoint,
        CheckpointStatus,
        Diagnostic,
        ExecutionResult,
        Plan,
        PlanStep,
        StepResult,
        StepStatus,
        ToolCall,
        ToolOutcomeView,
    )
    from .plan_validation import UnresolvedReference, resolve_references
    from .reviews import Reviews
    from .run_state import RunState
    from .scheduling import Scheduler
    from .snapshots import spent
    from .tool_calls import FusedCall, ToolCalls
    from .tool_outcomes import count_tool_metrics, outcome_view
    from .tool_stages import PreparedCall, ToolStages


class StepExecutor:
    """Executes the plans of one request (see the module docstring)."""

    def __init__(
        self,
        state: RunState,
        runner: HookRunner,
        scheduler: Scheduler,
        listing: StageListing,
        reviews: Reviews,
        *,
        workflow_type: str,
    ) -> None:
        self._state = state
        self._runner = runner
        self._listing = listing
        self._reviews = reviews
        self._tools = ToolCalls(state, scheduler, listing, workflow_type=workflow_type)
        self._executing = Plan()
        # The calls of this phase that need a reviewer, with why; those prepared before the phase's
        # checkpoint; and the checkpoint each approved call runs under.
        self._needs_approval: dict[str, list[ApprovalReason]] = {}
        self._prepared: dict[str, PreparedCall] = {}
        self._approved: dict[str, Checkpoint] = {}
        self._declined: dict[str, Checkpoint] = {}
        self._identical = IdenticalCalls(state)
        self._stages = ToolStages(state, runner)

    def _can_start(self, step: PlanStep) -> bool:
        """Whether every step ``step`` depends on (in its phase or an earlier one) has already succeeded."""
        deps = [self._state.results.get(d) for d in [*step.depends_on, *step.implicit_deps]]
        return all(d is not None and d.status is StepStatus.SUCCEEDED for d in deps)

    async def review_ready_calls(self, plan: Plan, reasons: list[ApprovalReason]) -> None:
        """Approve each call that needs a reviewer exactly as it will run. A call that can run now — all it
        depends on succeeded, so its references resolve — is prepared first: resolved, validated and
        through its before_tool chain, so every rewrite is done and a denial never reaches a reviewer; the
        phase's one checkpoint lists the prepared calls, and approval runs those values. A call that waits
        on steps of its own phase is prepared and approved when it is ready (:meth:`_confirm_step`)."""
        self._executing = plan
        self._needs_approval = {}
        for reason in reasons:
            self._needs_approval.setdefault(reason.step_id, []).append(reason)
        self._listing.enter(stages.Stage.BEFORE_TOOL)
        calls: list[ApprovalCall] = []
        for step in plan.steps:
            if step.step_id in self._needs_approval and self._can_start(step):
                prepared = await self._prepare_step(step)
                self._prepared[step.step_id] = prepared
                if prepared.ready:
                    calls.append(prepared.approval_call(step))
        if not calls:
            return
        checkpoint = self._reviews.new(
            plan, [r for call in calls for r in self._needs_approval[call.step_id]], calls=calls
        )
        await self._reviews.wait(checkpoint)
        for call in calls:
            self._decided(call.step_id, checkpoint)

    def _decided(self, step_id: str, checkpoint: Checkpoint) -> None:
        """The approved checkpoint ``step_id`` runs under — or, when its reviewer declined the call or
        rejected the checkpoint (where the pipeline tells the model), skips by."""
        if step_id in checkpoint.declined or checkpoint.status is CheckpointStatus.REJECTED:
            self._declined[step_id] = checkpoint
        else:
            self._approved[step_id] = checkpoint

    async def execute(self, plan: Plan) -> ExecutionResult:
        """One activity per step, each started as soon as its dependencies have succeeded. If a step ends
        the run (a stop, a hook that fails closed, cancellation) the steps still running are cancelled, and
        every step that finished — or had an outcome before a hook ended the run — is kept in the record."""
        self._listing.enter(EXECUTING)
        self._executing = plan
        self._identical.planned(plan)
        results = self._state.results
        record = self._state.record
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
                    count_tool_metrics(record, result)
        except BaseException:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            record.steps.extend(results[s.step_id] for s in plan.steps if s.step_id in results)
            raise
        finally:
            self._needs_approval, self._prepared, self._approved, self._declined = {}, {}, {}, {}
        execution = ExecutionResult(steps=[results[s.step_id] for s in plan.steps])
        record.steps.extend(execution.steps)
        return execution

    async def _run_step(self, step: PlanStep, *, missing: str | None = None) -> StepResult:
        """One step through its tool-call stages, then the cap on the result text a model reads. A call
        that needs a reviewer runs only once approved, with exactly the approved arguments."""
        prepared = self._prepared.pop(step.step_id, None)
        fused = None
        if prepared is None and missing is None:
            prepared, fused = await self._with_hooks(step)
        if prepared is None or missing is not None:
            prepared = await self._prepare_step(step, missing=missing)
            decided = step.step_id in self._approved or step.step_id in self._declined
            if prepared.ready and step.step_id in self._needs_approval and not decided:
                await self._confirm_step(step, prepared)
        call, result = prepared.call, prepared.result
        declined = self._declined.get(step.step_id)
        if prepared.ready and declined is not None:
            prepared.ready = False
            reviewer, comment = declined.reviewer or "the reviewer", declined.comment or ""
            verb = "rejected" if declined.status is CheckpointStatus.REJECTED else "declined"
            result.skip_reason, result.skip_detail = "confirmation", f"{verb} by {reviewer}"
            result.result = f"{step.tool} was not run: {reviewer} {verb} it" + (f": {comment}" if comment else "")
        try:
            if fused is not None:
                prepared = await self._took_with_hooks(step, prepared, fused)
                call = prepared.call
            elif prepared.ready:
                checkpoint = self._approved.get(step.step_id)
                if checkpoint is not None:
                    # Execution receives a copy of the approved values, whatever holds the call meanwhile.
                    [approved] = [c for c in checkpoint.calls if c.step_id == step.step_id]
                    call.arguments = copy.deepcopy(approved.arguments)
                    result.arguments, result.approved_in = call.arguments, checkpoint.checkpoint_id
                await self._run_once(step, prepared)
            elif prepared.invalid:
                await self._stages.on_tool_error(step, call, result)
            if result.status is StepStatus.FAILED:
                self._state.recover(
                    "tool",
                    result.error_type or "ToolError",
                    result.error or "",
                    {"step_id": step.step_id, "tool": step.tool_key},
                )
            await self._stages.after_tool(step, prepared, self._after_prerun(fused, call, result))
        except BaseException:
            # A step with an outcome — its tool ran, or it was skipped for a reason — stays in the record,
            # whatever ends the run after it (a hook that fails closed, a stop); one cut off mid-call does not.
            if result.status is not StepStatus.SKIPPED or result.skip_reason:
                self._state.results[step.step_id] = result
            raise
        limit = self._state.manifest.settings.max_tool_result_chars
        if result.result is not None and len(result.result) > limit:
            result.result = result.result[: max(0, limit - 1)] + "…"
        return result

    async def _run_once(self, step: PlanStep, prepared: PreparedCall) -> None:
        """Run the tool unless an identical call is running: then wait for it, and answer this one as an
        identical call to a finished step is answered (a read from its result, a write not at all)."""
        twin = self._identical.start(step, prepared.call)
        if twin is not None:
            await workflow.wait_condition(lambda: twin in self._state.results)
            unchanged = not prepared.result.modified_by  # a rewritten read is a call of its own
            read = self._identical.cached_read(step, prepared.call) if unchanged else None
            if self._identical.answer(step, prepared.call, prepared.result, read):
                prepared.ready = False
                return
        await self._call_tool(step, prepared.call, prepared.result)

    async def _prepare_step(self, step: PlanStep, *, missing: str | None = None) -> PreparedCall:
        """Resolve the step's references, validate the resolved arguments and run its before_tool chain:
        the call as it will run, or why it will not. A stop ends the run."""
        result = StepResult(step_id=step.step_id, tool=step.tool, status=StepStatus.SKIPPED, started_at=workflow.now())
        call = self._call_of(step)
        if missing is None:
            try:
                call.arguments = resolve_references(step.arguments, self._state.results)
            except UnresolvedReference as err:
                missing = str(err)
        if missing is not None:
            result.skip_reason, result.skip_detail, result.result = "missing", missing, missing
            return PreparedCall(call, result, ready=False)
        result.arguments = call.arguments
        problems = await self._resolved_argument_problems(step, call)
        if problems:
            # before_tool sees only validated arguments; these fail like a call the tool refused.
            result.status, result.error_type = StepStatus.FAILED, "InvalidArguments"
            result.error = result.result = "invalid arguments: " + "; ".join(problems)
            return PreparedCall(call, result, ready=False, invalid=True)
        read = self._identical.cached_read(step, call)  # a candidate before before_tool; a rewrite invalidates it
        asked = copy.deepcopy(call.arguments)
        prepared = await self._stages.before_tool(step, call, result, steps=self._state.steps_so_far())
        if prepared.ready:
            unchanged = prepared.call.arguments == asked
            if self._identical.answer(step, prepared.call, result, read if unchanged else None):
                prepared.ready = False
        return prepared

    async def _confirm_step(self, step: PlanStep, prepared: PreparedCall) -> None:
        """A call whose arguments existed only once steps of its own phase had run: its own checkpoint,
        opened now that it is ready, lists it as it will run."""
        checkpoint = self._reviews.new(
            self._executing,
            self._needs_approval[step.step_id],
            calls=[prepared.approval_call(step)],
            step_id=step.step_id,
        )
        await self._reviews.wait(checkpoint)
        self._decided(step.step_id, checkpoint)

    async def _resolved_argument_problems(self, step: PlanStep, call: ToolCall) -> list[str]:
        """Arguments with references were validated at planning only for presence; check their resolved
        values before any before_tool hook sees them (a local activity, where the tools live)."""
        if call.arguments == step.arguments or not self._state.manifest.tool_participants(
            stages.Stage.BEFORE_TOOL, call
        ):
            return []
        return await workflow.execute_local_activity(
            "validate_tool_arguments",
            step.model_copy(update={"arguments": call.arguments}),
            result_type=list[str],
            start_to_close_timeout=timedelta(seconds=10),
            summary=Shown(f"validate arguments · {step.step_id}"),
        )

    def _is_subagent(self, step: PlanStep) -> bool:
        return any(t.key == step.tool_key and t.kind == "subagent" for t in self._state.manifest.tools)

    async def _call_tool(
        self, step: PlanStep, call: ToolCall, result: StepResult, *, attempts: int | None = None
    ) -> None:
        """Execute the tool; if it fails after its retries, offer the error to on_tool_error hooks."""
        await self._tools.call(step, call, result, attempts=attempts)
        if result.status is StepStatus.FAILED:
            await self._stages.on_tool_error(step, call, result)

    # -- a tool call with its in-process hooks, in one activity -------------------------------------

    async def _with_hooks(self, step: PlanStep) -> tuple[PreparedCall | None, FusedCall | None]:
        """Make the call of a step whose tool hooks all run in-process together with them, in one activity
        (``tool_calls.ToolCalls.call_with_hooks``): a step that needs no reviewer, calls no sub-agent,
        resolves its references and repeats no call made or running. (None, None) for any other step, or
        when the activity itself failed: it goes through its stages one by one."""
        state = self._state
        if step.step_id in self._needs_approval or self._is_subagent(step):
            return None, None
        call = self._call_of(step)
        try:
            call.arguments = resolve_references(step.arguments, state.results)
        except UnresolvedReference:
            return None, None
        before = state.manifest.tool_participants(stages.Stage.BEFORE_TOOL, call)
        after = state.manifest.tool_participants(stages.Stage.AFTER_TOOL, call)
        if not (before or after) or not self._runner.dispatcher.local([*before, *after]):
            return None, None
        if self._identical.repeats(step, call):
            return None, None
        self._identical.start(step, call)  # until its result is in: an identical call waits for it
        steps = state.steps_so_far()
        view = state.view
        before_spec, after_spec = stages.STAGES[stages.Stage.BEFORE_TOOL], stages.STAGES[stages.Stage.AFTER_TOOL]
        untold = ToolOutcomeView(status="skipped")  # the activity puts in the call's outcome
        try:
            fused = await self._tools.call_with_hooks(
                step,
                call,
                (before, [before_spec.build(h, view(h), call, steps=steps) for h in before]),
                (after, [after_spec.build(h, view(h), untold, call=call, steps=steps) for h in after]),
            )
        except asyncio.CancelledError:
            # Cancelled with the run while its activity ran: what its hooks decided never came back.
            for name in dict.fromkeys(hook.name for hook in [*before, *after]):
                state.record.diagnostics.append(
                    Diagnostic(
                        extension=name,
                        phase="tool_step",
                        error=f"may have run in step {step.step_id}'s activity, cancelled with the run: outcome unknown",
                        error_type="Cancelled",
                    )
                )
            raise
        if fused.output is None:
            return None, None
        result = StepResult(
            step_id=step.step_id,
            tool=step.tool,
            status=StepStatus.SKIPPED,
            started_at=fused.started,
            arguments=call.arguments,
        )
        return PreparedCall(call, result, ready=True, steps=steps), fused

    async def _took_with_hooks(self, step: PlanStep, prepared: PreparedCall, fused: FusedCall) -> PreparedCall:
        """Record what the activity of a call with its hooks did: its before_tool hooks' invocations (and
        any it handed back, run now), the tool's outcome — retried alone with the attempts left after a
        failure it may retry, or made now when the hooks handed the call back before it ran."""
        output = fused.output
        assert output is not None
        result = prepared.result
        if output.problems:
            # before_tool sees only validated arguments; these fail like a call the tool refused.
            result.status, result.error_type = StepStatus.FAILED, "InvalidArguments"
            result.error = result.result = "invalid arguments: " + "; ".join(output.problems)
            await self._stages.on_tool_error(step, prepared.call, result)
            return PreparedCall(prepared.call, result, ready=False, invalid=True, steps=prepared.steps)
        prerun = None
        if output.before:
            calls = fused.before[: len(output.before)]
            prerun = PreRun(calls, output.before, fused.started, trusted=True)
        ran = await self._stages.before_tool(step, prepared.call, result, steps=prepared.steps, prerun=prerun)
        ran.steps = prepared.steps
        if not ran.ready:
            return ran
        if output.withheld:  # handed back before the tool: it runs now, on its own
            await self._run_once(step, ran)
            return ran
        result.idempotency_key = self._tools.key(step, ran.call.arguments)
        result.duration_ms = output.duration_ms
        if output.error is None:
            self._tools.took(step, result, output)
            return ran
        left = self._state.manifest.settings.tool_max_attempts - 1
        if output.error_retryable and left > 0:
            await self._call_tool(step, ran.call, result, attempts=left)
        else:
            ToolCalls.failed(result, output.error.message, output.error.type)
            await self._stages.on_tool_error(step, ran.call, result)
        return ran

    def _after_prerun(self, fused: FusedCall | None, call: ToolCall, result: StepResult) -> PreRun | None:
        """The after_tool hooks the activity of a call with its hooks ran on its outcome, as recorded."""
        output = fused.output if fused is not None else None
        if fused is None or output is None or not output.after or output.withheld or output.error is not None:
            return None
        calls = ToolCalls.after_calls(fused, call, outcome_view(result))[: len(output.after)]
        started = fused.started + spent(output.before) + timedelta(milliseconds=output.duration_ms)
        return PreRun(calls, output.after, started, trusted=True)

    def _call_of(self, step: PlanStep) -> ToolCall:
        return ToolCall(
            step_id=step.step_id,
            namespace=step.namespace,
            agent=step.agent,
            capability=step.capability,
            plan_phase=self._state.phase,
            subagent=self._is_subagent(step),
            brief=_brief(step, self._executing),
        )


def _brief(step: PlanStep, plan: Plan) -> str:
    """Why the planner made ``step``'s call: its own ``metadata["brief"]``, else its plan's rationale."""
    own = step.metadata.get("brief")
    return own if isinstance(own, str) and own else plan.rationale
