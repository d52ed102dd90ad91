"""The shadow evaluator: a candidate pipeline's decision stages run against one recorded request.

The stages run exactly as the lifecycle runs them — each hook's call built, checked and folded by its
stage's own ``StageSpec`` — but in shadow: every hook sees ``ctx.shadow``; what a hook reports, detaches
or leases is dropped (no effect, child workflow, lease or audit row exists afterwards); no tool,
planner or model runs; the record is read, never written. The stages replayed:

| stage | replayed on | compared with |
| --- | --- | --- |
| before_run (declared user_prompt_submit included) | the recorded ask | the recorded stop, if any |
| before_planning (the short-circuit gate) | the recorded request | the recorded short-circuit |
| after_planning (rewrites, the required gate) | each accepted plan | the plan that ran |
| approval rules | the candidate's plan | the recorded checkpoints |
| before_tool (declared pre_tool_use included) | each recorded call, its resolved arguments | what ran, or the denial |

A hook that calls out — a ``RunMode.ACTIVITY`` hook, one marked ``calls_service``, every declared hook
— runs only when it is ``shadow_safe``; otherwise, or when it raises ``NotReplayed``, it is reported
``not_replayed`` and the stage's verdict is not claimed as an allow. Where the candidate's decision
rests on state the record does not hold — a plan the recorded pipeline rejected, arguments resolved from
a step the candidate would have changed, a cache's contents now — the finding says so
(``depends_on_unrecorded``) instead of claiming more.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from workflows import decisions
from workflows.models import (
    ExecutionRecord,
    FindingKind,
    GateState,
    HookEntry,
    HookRequestView,
    Plan,
    PlanStep,
    ReplayFinding,
    RequestReplay,
    RunView,
    ShortCircuitProposal,
    Stage,
    StepResult,
    StepStatus,
    ToolCall,
)
from workflows.support import approval_reasons

from .stages import ShadowStages, StageRun

if TYPE_CHECKING:
    from ..lifecycle import LifecycleActivities

_REFERENCE = re.compile(r"\{\{\s*steps\.([A-Za-z0-9_.-]+?)\.")


class ShadowEvaluator:
    """Replays a candidate pipeline's decision stages on recorded requests (see the module docstring).

    Args:
        pipeline: The candidate's activities, as its factory built them; only its registry, tools and
            planner rules are used.
    """

    def __init__(self, pipeline: LifecycleActivities) -> None:
        self.pipeline = pipeline
        self.stages = ShadowStages(pipeline)

    async def evaluate(self, record: ExecutionRecord) -> RequestReplay:
        tenant, agent = _scope(record.metadata)
        replay = RequestReplay(
            request_id=record.request_id,
            workflow_id=record.workflow_id,
            run_id=record.run_id,
            tenant=tenant,
            agent=agent,
            started_at=record.started_at,
            status=record.status.value,
        )
        entries = self.pipeline.registry.visible_entries(tenant, agent)
        await _Replay(self, record, entries, replay).run()
        return replay


def _scope(metadata: dict[str, JsonValue]) -> tuple[str | None, str | None]:
    tenant, agent = metadata.get("tenant_id"), metadata.get("agent_id")
    return (tenant if isinstance(tenant, str) else None), (agent if isinstance(agent, str) else None)


def _references(arguments: Any) -> set[str]:
    """The step ids ``arguments`` reference (``{{steps.<id>.output...}}``)."""
    found: set[str] = set()
    if isinstance(arguments, str):
        found.update(_REFERENCE.findall(arguments))
    elif isinstance(arguments, dict):
        for value in arguments.values():
            found |= _references(value)
    elif isinstance(arguments, list):
        for value in arguments:
            found |= _references(value)
    return found


class _Replay:
    """One record through the candidate's decision stages, in lifecycle order."""

    def __init__(
        self, evaluator: ShadowEvaluator, record: ExecutionRecord, entries: list[HookEntry], replay: RequestReplay
    ) -> None:
        self.evaluator, self.record, self.entries, self.replay = evaluator, record, entries, replay
        self.steps: dict[str, StepResult] = {s.step_id: s for s in record.steps}
        self.changed_steps: set[str] = set()  # steps whose candidate decision differs: their outputs would too
        metadata = dict(record.metadata)
        self.view = HookRequestView(
            request=record.ask or record.request,
            metadata=metadata,
            request_id=record.request_id,
            workflow_id=record.workflow_id,
            enrichments=dict(record.enrichments),
            gate=GateState(cache_read_enabled=metadata.get("cache") != "bypass"),
            instructions=record.instructions,
            facts=dict(record.facts),
        )

    def add(self, kind: FindingKind, **fields: Any) -> None:
        self.replay.findings.append(ReplayFinding(kind=kind, **fields))

    def report_stage(
        self, stage: Stage, run: StageRun, *, step: PlanStep | None = None, phase: int | None = None
    ) -> None:
        """The stage's not-replayed hooks and the failures the record does not share."""
        where: dict[str, Any] = {"stage": stage, "phase": phase}
        if step is not None:
            where.update(step_id=step.step_id, tool=step.tool)
        for entry, reason in run.not_replayed:
            self.add(FindingKind.NOT_REPLAYED, hook=entry.name, detail=reason, **where)
        failures = list(run.open_failures)
        if run.failed is not None and not (run.failed.required and stage is Stage.AFTER_PLANNING):
            failures.append((run.failed, run.failure))
        for entry, message in failures:
            if not self._recorded_failure(entry.name, stage, step):
                self.add(FindingKind.HOOK_FAILED, hook=entry.name, detail=message, **where)

    def _recorded_failure(self, hook: str, stage: Stage, step: PlanStep | None) -> bool:
        return any(
            i.outcome.value != "succeeded" and (step is None or i.step_id == step.step_id)
            for i in self.record.invocations(stage, hook)
        )

    async def run(self) -> None:
        if not await self.before_run():
            return
        if not await self.before_planning():
            return
        await self.plans()

    # -- before_run ---------------------------------------------------------------------------------------

    async def before_run(self) -> bool:
        run_view = RunView(ask=self.record.request, instructions="", facts={})
        run = await self.evaluator.stages.run_stage(Stage.BEFORE_RUN, self.entries, self.view, run_view)
        self.report_stage(Stage.BEFORE_RUN, run)
        recorded = self.record.stopped is not None and self.record.stopped.phase == Stage.BEFORE_RUN.value
        stopped = run.ended_by is not None or run.failed is not None
        if stopped and not recorded:
            hook = (run.ended_by or run.failed).name  # type: ignore[union-attr]
            stop = getattr(run.outcome, "stop", None)
            self.add(
                FindingKind.NEWLY_BLOCKED,
                stage=Stage.BEFORE_RUN,
                hook=hook,
                recorded="ran",
                candidate="stopped before planning",
                detail=stop.text if stop is not None else run.failure,
            )
            return False
        if recorded and not stopped and run.complete:
            self.add(
                FindingKind.NEWLY_ALLOWED,
                stage=Stage.BEFORE_RUN,
                recorded=f"stopped by {self.record.stopped.extension}",  # type: ignore[union-attr]
                candidate="runs",
                detail="what the run would then have planned is not in the record",
            )
            return False
        return not recorded

    # -- before_planning: the short-circuit gate -----------------------------------------------------------

    async def before_planning(self) -> bool:
        run = await self.evaluator.stages.run_stage(
            Stage.BEFORE_PLANNING, self.entries, self.view, dict(self.view.enrichments)
        )
        self.report_stage(Stage.BEFORE_PLANNING, run)
        recorded = self.record.short_circuit
        proposal = getattr(run.outcome, "short_circuit", None) if run.ended_by is not None else None
        if proposal is not None and proposal.kind == "cache" and self._cached_later(proposal):
            proposal = None  # an entry written after the request started: its gate could not have served it
        if proposal is not None and recorded is None:
            # A cache's answer depends on what the cache holds now, so the replay goes on to the recorded
            # plans; any other short-circuit is a changed decision, and the replay ends there.
            cached = proposal.kind == "cache"
            self.add(
                FindingKind.DEPENDS_ON_UNRECORDED if cached else FindingKind.SHORT_CIRCUIT_CHANGED,
                stage=Stage.BEFORE_PLANNING,
                hook=run.ended_by.name,  # type: ignore[union-attr]
                recorded="planned",
                candidate=f"answered {'from the cache' if cached else 'before planning'} ({proposal.source})",
                detail="the cache's contents now are not what the request saw" if cached else "",
            )
            return cached
        if recorded is not None and proposal is None:
            self.add(
                FindingKind.DEPENDS_ON_UNRECORDED if recorded.kind == "cache" else FindingKind.SHORT_CIRCUIT_CHANGED,
                stage=Stage.BEFORE_PLANNING,
                recorded=f"answered before planning ({recorded.source})",
                candidate="would plan",
                detail="the plan the request would then have made is not in the record",
            )
            return False
        return recorded is None

    def _cached_later(self, proposal: ShortCircuitProposal) -> bool:
        meta = proposal.metadata
        if meta.get("cached_from_request") == self.record.request_id:
            return True
        cached_at = meta.get("cached_at")
        return isinstance(cached_at, (int, float)) and cached_at >= self.record.started_at.timestamp()

    # -- after_planning, approval, before_tool ------------------------------------------------------------

    async def plans(self) -> None:
        if not self.record.plans:
            error = self.record.error
            if error is not None and error.type == decisions.REQUIRED_AFTER_PLANNING_ERROR:
                self.add(
                    FindingKind.DEPENDS_ON_UNRECORDED,
                    stage=Stage.AFTER_PLANNING,
                    recorded="the required gate rejected the plan",
                    candidate="not replayed",
                    detail="the plan the recorded pipeline rejected is not in the record",
                )
            return
        prior: list[str] = []
        for accepted in sorted(self.record.plans, key=lambda p: p.phase):
            if self.changed_steps:
                self.add(
                    FindingKind.DEPENDS_ON_UNRECORDED,
                    stage=Stage.AFTER_PLANNING,
                    phase=accepted.phase,
                    detail="this phase was planned after results the candidate would have changed: the planner "
                    "might have planned otherwise",
                )
            if not await self.phase(accepted.plan, prior):
                return
            prior += [s.step_id for s in accepted.plan.steps]

    async def phase(self, recorded_plan: Plan, prior: list[str]) -> bool:
        phase = recorded_plan.phase
        view = self.view.model_copy(update={"plan_phase": phase})
        run = await self.evaluator.stages.run_stage(
            Stage.AFTER_PLANNING, self.entries, view, recorded_plan, prior_step_ids=list(prior), available_tools=None
        )
        self.report_stage(Stage.AFTER_PLANNING, run, phase=phase)
        if run.failed is not None and run.failed.required:
            self.add(
                FindingKind.REQUIRED_GATE_NOW_REJECTS,
                stage=Stage.AFTER_PLANNING,
                hook=run.failed.name,
                phase=phase,
                recorded="accepted",
                candidate="rejected: the request fails before any tool runs",
                detail=run.failure,
            )
            return False
        stop = getattr(run.outcome, "stop", None)
        if stop is not None:
            self.add(
                FindingKind.NEWLY_BLOCKED,
                stage=Stage.AFTER_PLANNING,
                hook=run.ended_by.name,  # type: ignore[union-attr]
                phase=phase,
                recorded="plan ran",
                candidate="run stopped",
                detail=stop.text,
            )
            return False
        plan: Plan = run.subject
        self.compare_plans(recorded_plan, plan, run)
        reasons = {r.step_id: r.reason for r in approval_reasons(plan, self.evaluator.pipeline.manifest.tools)}
        needs = set(reasons)
        reviewed = {r.step_id for c in self.record.checkpoints if c.phase == phase for r in c.reasons}
        for step in plan.steps:
            if not await self.call(step, phase, needs, reviewed, reasons):
                return False
        for step in recorded_plan.steps:
            if (
                step.step_id in reviewed
                and step.step_id not in needs
                and step.step_id in {s.step_id for s in plan.steps}
            ):
                self.add(
                    FindingKind.NO_LONGER_NEEDS_APPROVAL,
                    stage=Stage.AFTER_PLANNING,
                    step_id=step.step_id,
                    tool=step.tool,
                    phase=phase,
                    recorded="waited for a reviewer",
                    candidate="runs without review",
                )
        return True

    def compare_plans(self, recorded: Plan, candidate: Plan, run: StageRun) -> None:
        hook = run.modified_by[-1] if run.modified_by else None
        where: dict[str, Any] = {"stage": Stage.AFTER_PLANNING, "hook": hook, "phase": recorded.phase}

        def changed(kind: FindingKind, step: PlanStep, was: str, now: str, **fields: Any) -> None:
            self.add(kind, step_id=step.step_id, tool=step.tool, recorded=was, candidate=now, **where, **fields)

        kept = {s.step_id: s for s in candidate.steps}
        for step in recorded.steps:
            new = kept.get(step.step_id)
            if new is None:
                self.changed_steps.add(step.step_id)
                if self._ran(step.step_id):
                    changed(FindingKind.NEWLY_BLOCKED, step, "in the plan", "removed from the plan")
            elif new.arguments != step.arguments or new.tool_key != step.tool_key:
                self.changed_steps.add(step.step_id)
                changed(
                    FindingKind.ARGUMENTS_CHANGED,
                    new,
                    step.tool,
                    new.tool,
                    recorded_arguments=step.arguments,
                    candidate_arguments=new.arguments,
                )
        known = {s.step_id for s in recorded.steps}
        for step in candidate.steps:
            if step.step_id not in known:
                self.changed_steps.add(step.step_id)
                changed(
                    FindingKind.DEPENDS_ON_UNRECORDED,
                    step,
                    "not planned",
                    "added to the plan",
                    detail="the recorded request never ran this call",
                )

    def _ran(self, step_id: str) -> bool:
        step = self.steps.get(step_id)
        return step is not None and step.status is not StepStatus.SKIPPED

    async def call(
        self, step: PlanStep, phase: int, needs: set[str], reviewed: set[str], reasons: dict[str, str]
    ) -> bool:
        recorded = self.steps.get(step.step_id)
        if recorded is None or recorded.skip_reason in ("missing", "duplicate", "confirmation"):
            return True  # never reached its before_tool chain in the recorded run
        arguments, exact = self._arguments(step, recorded)
        upstream = _references(step.arguments) & self.changed_steps
        spec_call = ToolCall(
            step_id=step.step_id,
            namespace=step.namespace,
            agent=step.agent,
            capability=step.capability,
            arguments=arguments,
            plan_phase=phase,
            subagent=self._subagent(step),
        )
        self.replay.calls += 1
        view = self.view.model_copy(update={"plan_phase": phase})
        run = await self.evaluator.stages.run_stage(
            Stage.BEFORE_TOOL, self.entries, view, spec_call, tool_call=spec_call
        )
        self.report_stage(Stage.BEFORE_TOOL, run, step=step)
        where = {"stage": Stage.BEFORE_TOOL, "step_id": step.step_id, "tool": step.tool}
        if upstream or not exact:
            detail = (
                f"its arguments come from {', '.join(sorted(upstream))}, which the candidate would have changed"
                if upstream
                else "the arguments before the recorded rewrites are not in the record; replayed on the rewritten ones"
            )
            self.add(FindingKind.DEPENDS_ON_UNRECORDED, detail=detail, **where)
        verdict = getattr(run.outcome, "verdict", None)
        blocked = run.failed is not None or (verdict is not None and verdict.action in ("deny", "stop"))
        recorded_denied = recorded.status is StepStatus.SKIPPED and recorded.skip_reason == "policy"
        recorded_stopped = (
            self.record.stopped is not None
            and self.record.stopped.phase == Stage.BEFORE_TOOL.value
            and recorded.status is StepStatus.SKIPPED
        )
        recorded_blocked = recorded_denied or recorded_stopped
        deciding = run.failed or run.ended_by
        if blocked and not recorded_blocked:
            self.changed_steps.add(step.step_id)
            text = run.failure if run.failed is not None else (verdict.message if verdict else "")
            action = "failed closed" if run.failed is not None else verdict.action  # type: ignore[union-attr]
            self.add(
                FindingKind.NEWLY_BLOCKED,
                hook=deciding.name if deciding else None,
                recorded="ran" if recorded.status is not StepStatus.SKIPPED else "allowed",
                candidate=f"{action}: {text}",
                recorded_arguments=recorded.arguments,
                **where,
            )
            return not (verdict is not None and verdict.action == "stop") and run.failed is None
        if recorded_blocked and not blocked:
            if run.complete:
                self.changed_steps.add(step.step_id)
                self.add(
                    FindingKind.NEWLY_ALLOWED,
                    hook=recorded.skipped_by,
                    recorded=f"denied by {recorded.skipped_by}: {recorded.skip_detail or ''}".rstrip(": "),
                    candidate="runs",
                    candidate_arguments=run.subject.arguments,
                    **where,
                )
            return not recorded_stopped
        if not blocked and recorded.arguments is not None and run.subject.arguments != recorded.arguments:
            self.changed_steps.add(step.step_id)
            self.add(
                FindingKind.ARGUMENTS_CHANGED,
                hook=run.modified_by[-1] if run.modified_by else None,
                recorded="ran with the recorded arguments",
                candidate="runs with other arguments",
                recorded_arguments=recorded.arguments,
                candidate_arguments=run.subject.arguments,
                **where,
            )
        if not blocked and step.step_id in needs and step.step_id not in reviewed:
            self.add(
                FindingKind.NEWLY_NEEDS_APPROVAL,
                stage=Stage.AFTER_PLANNING,
                step_id=step.step_id,
                tool=step.tool,
                recorded="ran without review",
                candidate="waits for a reviewer",
                detail=reasons.get(step.step_id, ""),
            )
        return not (blocked and recorded_stopped)

    def _arguments(self, step: PlanStep, recorded: StepResult) -> tuple[dict[str, JsonValue], bool]:
        """The arguments the recorded before_tool chain received, and whether the record holds them
        exactly: the executed ones when no hook rewrote them, else the plan's when they reference nothing."""
        if recorded.arguments is not None and not recorded.modified_by:
            return dict(recorded.arguments), True
        if not _references(step.arguments):
            return dict(step.arguments), True
        return dict(recorded.arguments or step.arguments), False

    def _subagent(self, step: PlanStep) -> bool:
        tool = next((t for t in self.evaluator.pipeline.manifest.tools if t.key == step.tool_key), None)
        return tool is not None and tool.kind == "subagent"
