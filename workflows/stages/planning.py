"""The planning stages: before_planning (enrich the request, or answer it outright), before_plan (narrow the
tools and add context for one planning attempt) and after_planning (the plan to run, copy-on-write,
validated after each hook; the required gate; or stop the run)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pydantic
from pydantic import BaseModel, Field, JsonValue

from ..decisions import HOOK_CONTRACT_ERROR, INVALID_PLAN, REASON_MODIFIED, short_circuit_decision
from ..models import (
    MAX_ENRICHMENT_BYTES,
    DecisionAction,
    EnrichmentChange,
    EnrichmentOperation,
    FailurePolicy,
    HookCall,
    HookEntry,
    HookOutcome,
    HookRequestView,
    PipelineShortCircuit,
    PipelineShortCircuitDecision,
    Plan,
    ShortCircuitKind,
    ShortCircuitProposal,
    Stage,
    StepSummary,
    Stop,
    json_size,
)
from ._base import Chaining, Checks, Fold, ResultRejected, StageSpec, rejected, returned

if TYPE_CHECKING:
    from hooks.contracts import PipelineContext, PipelineGate

__all__ = [
    "AfterPlanningHook",
    "BeforePlanHook",
    "BeforePlanningDecisionHook",
    "BeforePlanningHook",
    "PlanAttempt",
    "PlanAttemptPatch",
    "ToolDescriptor",
]

# --------------------------------------------------------------------------------------------------
# before_planning: enrich, or short-circuit (the first accepted one wins)
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class BeforePlanningHook(Protocol):
    """before_planning, legacy contract: enrich ``ctx.enrichments``; optionally answer outright.

    Return ``None`` to carry on. Returning a :class:`PipelineShortCircuit` ends the request with that
    answer and is treated as authoritative: planning, execution and synthesis are skipped and later
    before_planning hooks are not called. Errors fail open: the request continues without this hook's
    changes.
    """

    name: str

    def before_planning(self, ctx: PipelineContext) -> PipelineShortCircuit | None: ...


@runtime_checkable
class BeforePlanningDecisionHook(Protocol):
    """before_planning, provenance-aware contract: the one to use for caches.

    Return ``None`` to carry on, or a :class:`PipelineShortCircuitDecision`. A ``cache`` decision is
    served only when cache reads are enabled and ``cached_against`` (the variation map stored with the
    entry at write time, never ``gate.cache_vary()`` at lookup) matches every reserved dimension;
    otherwise planning continues. An unknown kind or a missing payload fails the request.
    """

    name: str

    def before_planning_decision(
        self, ctx: PipelineContext, gate: PipelineGate
    ) -> PipelineShortCircuitDecision | None: ...


class BeforePlanningCall(HookCall):
    pass


class BeforePlanningOutcome(HookOutcome):
    enrichment_changes: list[EnrichmentChange] = Field(default_factory=list)
    short_circuit: ShortCircuitProposal | None = None


def merge_enrichments(enrichments: Mapping[str, JsonValue], changes: list[EnrichmentChange]) -> dict[str, JsonValue]:
    """The enrichments after a hook's changes: added and updated keys set, removed keys dropped."""
    merged = dict(enrichments)
    for change in changes:
        if change.operation is EnrichmentOperation.REMOVED:
            merged.pop(change.key, None)
        else:
            merged[change.key] = change.after
    return merged


def enrichment_changes(before: Mapping[str, JsonValue], after: Mapping[str, Any]) -> list[EnrichmentChange]:
    """The added, updated and removed keys between two enrichment maps, after checking the new map is
    JSON with string keys and within the size limit."""
    for key, value in after.items():
        if not isinstance(key, str) or not key:
            raise rejected(f"enrichment key {key!r} is not a non-empty string")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise rejected(f"enrichment {key!r} is not JSON: {err}") from None
    size = json_size(after)
    if size > MAX_ENRICHMENT_BYTES:
        raise rejected(f"enrichments would be {size} bytes of JSON; the limit is {MAX_ENRICHMENT_BYTES}")
    changes = []
    for key, value in after.items():
        if key not in before:
            changes.append(EnrichmentChange(key=key, operation=EnrichmentOperation.ADDED, after=value))
        elif before[key] != value:
            changes.append(
                EnrichmentChange(key=key, operation=EnrichmentOperation.UPDATED, before=before[key], after=value)
            )
    for key in before:
        if key not in after:
            changes.append(EnrichmentChange(key=key, operation=EnrichmentOperation.REMOVED, before=before[key]))
    return changes


class BeforePlanningSpec(StageSpec[BeforePlanningCall, BeforePlanningOutcome]):
    """The subject is the request's enrichments (in the view every hook reads); the first short-circuit
    the gate accepts ends the stage, and the request with it."""

    stage = Stage.BEFORE_PLANNING
    protocols = {"before_planning": BeforePlanningHook, "before_planning_decision": BeforePlanningDecisionHook}
    failure_policy = FailurePolicy.FAIL_OPEN
    chaining = Chaining.FIRST_WINS

    def build(self, hook: HookEntry, view: HookRequestView, subject: Any, **extras: Any) -> BeforePlanningCall:
        return BeforePlanningCall(hook=hook, view=view.model_copy(update={"enrichments": subject}))

    def subject(self, call: BeforePlanningCall) -> dict[str, JsonValue]:
        return call.view.enrichments

    def with_subject(self, call: BeforePlanningCall, subject: Any) -> BeforePlanningCall:
        return call.model_copy(update={"view": call.view.model_copy(update={"enrichments": subject})})

    def method(self, entry: HookEntry) -> str:
        return "before_planning_decision" if entry.before_planning_contract == "decision" else "before_planning"

    def arguments(self, call: BeforePlanningCall, ctx: PipelineContext) -> tuple[Any, ...]:
        return (ctx.gate,) if call.hook.before_planning_contract == "decision" else ()

    def judge(
        self, call: BeforePlanningCall, value: Any, ctx: PipelineContext, checks: Checks
    ) -> BeforePlanningOutcome:
        entry, view = call.hook, call.view
        proposal = _proposal(entry, value)
        changes = enrichment_changes(view.enrichments, ctx.enrichments)
        if proposal is None:
            return BeforePlanningOutcome(enrichment_changes=changes, decision=self.success(entry))
        decision = short_circuit_decision(proposal, view.gate)
        checks.short_circuit_judged(call, proposal, decision)
        return BeforePlanningOutcome(enrichment_changes=changes, short_circuit=proposal, decision=decision)

    def fold(self, subject: dict[str, JsonValue], outcome: BeforePlanningOutcome) -> Fold:
        accepted = outcome.short_circuit is not None and outcome.decision.action is DecisionAction.SHORT_CIRCUIT
        merged = merge_enrichments(subject, outcome.enrichment_changes)
        return Fold(merged, ends=accepted, carries=outcome.short_circuit is None)


def _proposal(entry: HookEntry, value: Any) -> ShortCircuitProposal | None:
    """Check a before_planning return value against the hook's contract: a legacy short-circuit is
    authoritative (a decision of that kind); a decision must name a known kind and carry its payload (else
    ``HookContractError``)."""
    legacy = entry.before_planning_contract == "legacy"
    if legacy:
        answer = returned(value, "before_planning", PipelineShortCircuit)
        decided = None if answer is None else PipelineShortCircuitDecision(short_circuit=answer)
    else:
        decided = returned(value, "before_planning_decision", PipelineShortCircuitDecision)
    if decided is None:
        return None
    if decided.kind not in (ShortCircuitKind.AUTHORITATIVE, ShortCircuitKind.CACHE):
        raise ResultRejected(HOOK_CONTRACT_ERROR, f"unknown short-circuit kind {decided.kind!r}")
    if decided.short_circuit is None:
        raise ResultRejected(HOOK_CONTRACT_ERROR, "short-circuit decision has no short_circuit payload")
    payload = decided.short_circuit
    return ShortCircuitProposal(
        contract="legacy" if legacy else "decision",
        kind=decided.kind,
        response=payload.response,
        source=payload.source,
        metadata=payload.metadata,
        cached_against=decided.cached_against,
    )


# --------------------------------------------------------------------------------------------------
# before_plan: narrow the tools and add context for one planning attempt
# --------------------------------------------------------------------------------------------------

MAX_CONTEXT_TEXT_CHARS = 16_000


class ToolDescriptor(BaseModel):
    """A tool as planning hooks see it (never the executable tool): its key, what it does, whether it
    writes (``False`` for a read-only tool)."""

    key: str
    description: str = ""
    writes: bool = True

    def named(self, names: set[str]) -> bool:
        """Whether ``names`` names this tool: by its key, or by ``agent/capability``."""
        return self.key in names or self.key.split("/", 1)[-1] in names


def _with_descriptions(tools: Sequence[ToolDescriptor], checks: Checks) -> list[ToolDescriptor]:
    """``tools`` with what each does, as the worker's tools describe themselves (the workflow records tools
    without their descriptions); a tool the worker does not describe keeps the description it has."""
    descriptions = checks.tool_descriptions([tool.key for tool in tools])
    return [tool.model_copy(update={"description": descriptions.get(tool.key, tool.description)}) for tool in tools]


class PlanAttempt(BaseModel):
    """What before_plan sees: one attempt at planning one phase. ``attempt`` is 0 for the phase's first
    attempt and counts the retries after a malformed plan; ``tools`` are what the planner may still use;
    ``context_text`` is added to the planner's instructions for this attempt only; ``steps`` are the
    request's steps so far."""

    phase: int
    attempt: int = 0
    ask: str
    tools: list[ToolDescriptor] = Field(default_factory=list)
    context_text: str = ""
    steps: list[StepSummary] = Field(default_factory=list)

    @property
    def tool_keys(self) -> list[str]:
        return [tool.key for tool in self.tools]


class PlanAttemptPatch(BaseModel):
    """A before_plan answer. ``tools``: keep only these (keys, or ``agent/capability``) — filtering
    intersects, so a tool an earlier hook removed from this attempt cannot come back; ``context_text``:
    replaces the attempt's context text. Fields left ``None`` are kept."""

    tools: list[str] | None = None
    context_text: str | None = None


@runtime_checkable
class BeforePlanHook(Protocol):
    """before_plan: before every planning attempt (each phase, and again when a malformed plan is retried).
    Return ``PlanAttemptPatch`` to narrow the tools the planner sees (a rule or model planner sees only the
    remaining ones, and a plan using another is invalid) or to set context for this attempt, or ``None``.
    When no tools remain, the phase is answered without a planner call. A failure ends the run with
    ``ExtensionError``."""

    name: str

    def before_plan(self, ctx: PipelineContext, attempt: PlanAttempt) -> PlanAttemptPatch | None: ...


class BeforePlanCall(HookCall):
    attempt: PlanAttempt


class BeforePlanOutcome(HookOutcome):
    patch: PlanAttemptPatch | None = None


class BeforePlanSpec(StageSpec[BeforePlanCall, BeforePlanOutcome]):
    """Patches chain in order: tools intersect, the context text is replaced. The hook sees each tool's
    description (filled in by the worker, which has the tools)."""

    stage = Stage.BEFORE_PLAN
    protocols = {"before_plan": BeforePlanHook}
    chaining = Chaining.CHAIN
    subject_field = "attempt"

    def prepare(self, call: BeforePlanCall, checks: Checks) -> BeforePlanCall:
        attempt = call.attempt.model_copy(update={"tools": _with_descriptions(call.attempt.tools, checks)})
        return call.model_copy(update={"attempt": attempt})

    def judge(self, call: BeforePlanCall, value: Any, ctx: PipelineContext, checks: Checks) -> BeforePlanOutcome:
        patch = returned(value, "before_plan", PlanAttemptPatch)
        if patch is not None and patch.context_text is not None and len(patch.context_text) > MAX_CONTEXT_TEXT_CHARS:
            raise rejected(
                f"before_plan context_text is {len(patch.context_text)} characters; the limit is {MAX_CONTEXT_TEXT_CHARS}"
            )
        return BeforePlanOutcome(patch=patch, decision=self.success(call.hook, REASON_MODIFIED if patch else None))

    def fold(self, subject: PlanAttempt, outcome: BeforePlanOutcome) -> Fold:
        patch = outcome.patch
        if patch is None:
            return Fold(subject)
        update: dict[str, Any] = {}
        if patch.tools is not None:
            kept = set(patch.tools)
            update["tools"] = [tool for tool in subject.tools if tool.named(kept)]
        if patch.context_text is not None:
            update["context_text"] = patch.context_text
        return Fold(subject.model_copy(update=update))


# --------------------------------------------------------------------------------------------------
# after_planning: return the plan to run (copy-on-write, validated after each hook)
# --------------------------------------------------------------------------------------------------


@runtime_checkable
class AfterPlanningHook(Protocol):
    """after_planning: return the plan to run, possibly a modified copy, or ``Stop`` to end the run with
    your text (no step runs; answer transforms and memory are bypassed; finalizers run).

    ``plan`` is already a private copy. A returned plan passes the full plan validation, against the
    tools this planning attempt had; hooks chain in registration order. An ordinary hook's error, wrong
    return type or invalid plan is recorded and the last valid plan continues.
    """

    name: str

    def after_planning(self, ctx: PipelineContext, plan: Plan) -> Plan | Stop: ...


class AfterPlanningCall(HookCall):
    plan: Plan
    prior_step_ids: list[str] = Field(default_factory=list)  # steps of earlier phases, for implicit_deps
    available_tools: list[str] | None = None  # the tool keys the planning attempt had (None: every tool)
    attempt: int = 0  # the planning attempt that produced the plan (0: the phase's first)
    tools: list[ToolDescriptor] = Field(default_factory=list)  # the tools that attempt had
    steps: list[StepSummary] = Field(default_factory=list)  # the request's steps so far


class AfterPlanningOutcome(HookOutcome):
    plan: Plan
    changed: bool
    stop: Stop | None = None


class AfterPlanningSpec(StageSpec[AfterPlanningCall, AfterPlanningOutcome]):
    """Each hook receives the plan the previous one returned. Fails open, except for the one required
    hook, which fails closed whatever it declares: its failure ends the request before any tool runs."""

    stage = Stage.AFTER_PLANNING
    protocols = {"after_planning": AfterPlanningHook}
    failure_policy = FailurePolicy.FAIL_OPEN
    chaining = Chaining.CHAIN
    subject_field = "plan"
    echo = "plan"
    own_policy = False

    def prepare(self, call: AfterPlanningCall, checks: Checks) -> AfterPlanningCall:
        return call.model_copy(update={"tools": _with_descriptions(call.tools, checks)})

    def policy(self, hook: HookEntry) -> FailurePolicy:
        return FailurePolicy.FAIL_CLOSED if hook.required else self.failure_policy

    def judge(self, call: AfterPlanningCall, value: Any, ctx: PipelineContext, checks: Checks) -> AfterPlanningOutcome:
        returned(value, "after_planning", Plan, Stop, none=False, expected="a Plan or Stop")
        if isinstance(value, Stop):
            decision = self.stopped(call.hook, value)
            return AfterPlanningOutcome(plan=call.plan, changed=False, stop=value, decision=decision)
        try:
            plan = Plan.model_validate(value.model_dump(mode="json"))
        except pydantic.ValidationError as err:
            raise rejected(f"returned plan is malformed: {err}") from None
        problems = checks.plan_problems(plan, call.plan.phase, call.prior_step_ids, call.available_tools)
        if problems:
            raise ResultRejected(INVALID_PLAN, "invalid plan: " + "; ".join(problems))
        return AfterPlanningOutcome(plan=plan, changed=plan != call.plan, decision=self.success(call.hook))

    def fold(self, subject: Plan, outcome: AfterPlanningOutcome) -> Fold:
        if outcome.stop is not None:
            return Fold.end(subject)
        return Fold(outcome.plan)

    def on_plan(
        self, built: Mapping[str, Any], plan: Plan, planner_tokens: int, enrichments: Mapping[str, JsonValue]
    ) -> AfterPlanningCall:
        """A call built before its phase was planned (as JSON), as the workflow builds it once the plan is
        in: on ``plan``, its request's token budget (if it has one) less what the planner's calls spent, the
        enrichments the plan was made with (those the before_planning hooks left, where the planning
        activity ran them too)."""
        call = AfterPlanningCall.model_validate(built)
        update: dict[str, Any] = {"enrichments": dict(enrichments)}
        if call.view.model_tokens_left is not None:
            update["model_tokens_left"] = call.view.model_tokens_left - planner_tokens
        return call.model_copy(update={"plan": plan, "view": call.view.model_copy(update=update)})


BEFORE_PLANNING = BeforePlanningSpec()
BEFORE_PLAN = BeforePlanSpec()
AFTER_PLANNING = AfterPlanningSpec()
