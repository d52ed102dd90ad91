"""What every stage is made of: a :class:`StageSpec` says how one hook invocation at the stage is called,
how what the hook returned is judged (in the activity), and how its outcome folds into the request (in
the workflow, and between the hooks one local batch runs). Each stage is one ``StageSpec`` subclass,
declared beside its call and outcome models and its hook Protocol in the module of its family."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, get_args, get_origin

from ..decisions import (
    HOOK_CONTRACT_ERROR,
    HOOK_PANIC,
    INVALID_HOOK_RESULT,
    PAYLOAD_TOO_LARGE,
    REASON_ACCEPTED,
    REASON_OBSERVED,
    REASON_STOPPED,
    WORKER_LOST,
    failure_reason,
)
from ..models import (
    DecisionAction,
    FailurePolicy,
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    HookRequestView,
    Plan,
    PlanStep,
    ShortCircuitProposal,
    Stage,
    Stop,
)

if TYPE_CHECKING:
    from hooks.contracts import PipelineContext

# The local activity that runs consecutive in-process hooks of one stage (see ``next_call``).
HOOK_BATCH_ACTIVITY = "run_hook_batch"
# The longest local activity type that names in-process hooks (see ``hook_activity_type``).
MAX_HOOK_ACTIVITY_TYPE = 200


def hook_activity_type(stage: Stage, hooks: Sequence[str]) -> str:
    """The local activity type of an invocation of in-process hooks — ``<stage>:<hook>`` for one hook,
    ``<stage>:<hook> + <hook> + ...`` for a batch — so the Temporal UI's Timeline (which labels a local
    activity by its type alone) and the SDK's metrics (``activity_type``) name the hooks. A long batch is
    cut to ``MAX_HOOK_ACTIVITY_TYPE`` characters, the hooks left out counted (``+N more``); the worker's
    dynamic activity reads the stage alone from it (see ``hook_stage_of``), the hooks from its input."""
    prefix = f"{stage.value}:"
    names = [" ".join(name.split()) or "?" for name in hooks]
    for shown in range(len(names), 0, -1):
        rest = len(names) - shown
        text = prefix + " + ".join(names[:shown]) + (f" +{rest} more" if rest else "")
        if len(text) <= MAX_HOOK_ACTIVITY_TYPE:
            return text
    text = prefix + names[0]
    more = f" +{len(names) - 1} more" if len(names) > 1 else ""
    return text[: MAX_HOOK_ACTIVITY_TYPE - len(more) - 1] + "…" + more


# Between the stages of one local activity's type (see ``stages_activity_type``).
STAGE_SEPARATOR = " → "


def stages_activity_type(segments: Sequence[tuple[Stage, Sequence[str]]]) -> str:
    """The local activity type of in-process hooks of consecutive stages run by one local activity (see
    ``hands_on``): each stage's part as :func:`hook_activity_type` writes it, in order,
    ``<stage>:<hook> → <stage>:<hook> + <hook>``. Past ``MAX_HOOK_ACTIVITY_TYPE`` characters the stages
    after the first are named with their count of hooks (``<stage>:N hooks``), and then cut as one stage
    is. The first stage is the type's stage (:func:`hook_stage_of`)."""
    if len(segments) == 1:
        return hook_activity_type(*segments[0])
    parts = [hook_activity_type(stage, hooks) for stage, hooks in segments]
    text = STAGE_SEPARATOR.join(parts)
    if len(text) <= MAX_HOOK_ACTIVITY_TYPE:
        return text
    counted = [f"{stage.value}:{len(hooks)} hook{'s' if len(hooks) != 1 else ''}" for stage, hooks in segments[1:]]
    rest = STAGE_SEPARATOR + STAGE_SEPARATOR.join(counted)
    first = parts[0]
    if len(first) + len(rest) > MAX_HOOK_ACTIVITY_TYPE:
        first = first[: max(MAX_HOOK_ACTIVITY_TYPE - len(rest) - 1, len(segments[0][0].value) + 2)] + "…"
    return (first + rest)[:MAX_HOOK_ACTIVITY_TYPE]


def hook_stage_of(activity_type: str) -> Stage | None:
    """The stage of a local activity type made by :func:`hook_activity_type` (None for any other type)."""
    stage, sep, _ = activity_type.partition(":")
    if not sep:
        return None
    try:
        return Stage(stage)
    except ValueError:
        return None


class Chaining(StrEnum):
    """How the outcomes of one stage's hooks combine, in execution order (what :meth:`StageSpec.fold`
    does with each): documented on each stage and held by the stage tests."""

    CHAIN = "chain"  # each hook receives what the previous one returned (a plan, an answer, a result text)
    FIRST_WINS = "first_wins"  # the first hook that decides ends the stage (a short-circuit, a handled error)
    GATE = "gate"  # each hook lets the run through, changes it, or ends it (deny, stop, skip)
    OBSERVE = "observe"  # every hook runs; what they return changes nothing


class ResultRejected(Exception):
    """The boundary rejected what a hook returned or left behind (not an exception the hook raised);
    ``category`` is the failure category the workflow decides on."""

    def __init__(self, category: str, message: str) -> None:
        super().__init__(message)
        self.category = category


def returned(value: Any, method: str, *types: type, none: bool = True, expected: str | None = None) -> Any:
    """``value`` if it is one of ``types`` (or ``None`` when ``none``); otherwise the hook broke its stage's
    contract: ``InvalidHookResult`` naming what the method must return."""
    if isinstance(value, types) or (none and value is None):
        return value
    if expected is None:
        names = [t.__name__ for t in types] + (["None"] if none else [])
        expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    raise ResultRejected(INVALID_HOOK_RESULT, f"{method} must return {expected}, got {type(value).__name__}")


def rejected(message: str) -> ResultRejected:
    """A hook's result its stage refuses: ``InvalidHookResult``."""
    return ResultRejected(INVALID_HOOK_RESULT, message)


class Checks(Protocol):
    """What a stage's judge may ask of the worker that runs the hook: the checks that need its tools
    and its planner's rules, and where a short-circuit decision is reported."""

    def plan_problems(
        self, plan: Plan, phase: int, prior_step_ids: Sequence[str], available: Sequence[str] | None = None
    ) -> list[str]:
        """Why ``plan`` is invalid (empty when it is valid); ``available``: the tool keys this planning
        attempt may use (None: every tool)."""
        ...

    def argument_problems(self, step: PlanStep) -> list[str]: ...

    def tool_descriptions(self, keys: Sequence[str]) -> dict[str, str]:
        """What each tool does, by key, as the worker's tools describe themselves (the workflow records
        tools without their descriptions)."""
        ...

    def short_circuit_judged(self, call: HookCall, proposal: ShortCircuitProposal, decision: HookDecision) -> None:
        """Report how a short-circuit was judged (metrics, the hook's span, a legacy contract's warning)."""
        ...


@dataclass(frozen=True)
class Fold:
    """An outcome folded into a stage's subject: the subject as the next hook receives it; ``ends``: the
    stage is over (a short-circuit, a denial, a stop, a handled error, a skip); ``carries``: the next hook
    of a local batch may run on ``subject`` without the workflow (else the batch hands the rest back)."""

    subject: Any
    ends: bool = False
    carries: bool = True

    @classmethod
    def end(cls, subject: Any) -> Fold:
        """The stage is over, and the workflow acts on it (a denial, a stop, a skip)."""
        return cls(subject, ends=True, carries=False)


CallT = TypeVar("CallT", bound=HookCall)
OutcomeT = TypeVar("OutcomeT", bound=HookOutcome)


class StageSpec(Generic[CallT, OutcomeT]):
    """One stage. Subclasses set the class attributes and override what differs from the defaults:

    - ``call``/``outcome``: the models one invocation receives and returns, read from the class's type
      parameters (``StageSpec[TheCall, TheOutcome]``); ``subject_field`` the field of the call that holds
      what the stage's hooks work on (the plan, the answer, the tool call, ...).
    - ``methods`` and ``protocols``: the hook methods that implement the stage and the Protocol declaring
      each one's signature (the registry checks hooks against them).
    - :meth:`arguments` (what the method receives after ``ctx``) and :meth:`judge` (what its return value
      means, or why it is refused) run in the stage's activity; :meth:`fold` runs in the workflow.
    """

    stage: ClassVar[Stage]
    call: ClassVar[type[HookCall]]
    outcome: ClassVar[type[HookOutcome]]
    protocols: ClassVar[dict[str, type]]  # hook method -> the Protocol that declares it
    # Unless the hook sets its own (where ``own_policy`` allows): a stage that decides or transforms fails
    # closed; the pipeline stages and the observers fail open.
    failure_policy: ClassVar[FailurePolicy] = FailurePolicy.FAIL_CLOSED
    chaining: ClassVar[Chaining]
    subject_field: ClassVar[str | None] = None  # None: the stage's hooks work on nothing but the request
    # The outcome field that hands the stage's subject back whole (the plan, the answer, ...), where the
    # outcome has one. A local activity records the outcome without it when the hook left the subject as
    # it received it (:meth:`entry_outcome`): history grows with what hooks change, not with what they read.
    echo: ClassVar[str | None] = None
    tool_stage: ClassVar[bool] = False  # invoked per plan step; ``matcher`` / ``subagent_only`` filter it
    own_policy: ClassVar[bool] = True  # a hook's ``failure_policy`` replaces the default here
    finalizer: ClassVar[bool] = False  # runs on every exit; a failure is a diagnostic, never the run's outcome

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Reads ``call`` and ``outcome`` from the type arguments the subclass gives its base."""
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            parameters = getattr(get_origin(base), "__parameters__", ())
            for parameter, argument in zip(parameters, get_args(base), strict=False):
                if isinstance(argument, type) and parameter is CallT:
                    cls.call = argument
                elif isinstance(argument, type) and parameter is OutcomeT:
                    cls.outcome = argument

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.protocols)

    @property
    def activity(self) -> str:
        """The activity that invokes one hook at this stage (``<stage>_hook``)."""
        return f"{self.stage.value}_hook"

    # -- the call ------------------------------------------------------------------------------------

    def build(self, hook: HookEntry, view: HookRequestView, subject: Any, **extras: Any) -> CallT:
        """One hook's call: its entry, the request as it sees it, the stage's subject and the extras."""
        fields = {self.subject_field: subject} if self.subject_field else {}
        return self.call(hook=hook, view=view, **fields, **extras)  # type: ignore[return-value]

    def subject(self, call: CallT) -> Any:
        return getattr(call, self.subject_field) if self.subject_field else None

    def with_subject(self, call: CallT, subject: Any) -> CallT:
        return call.model_copy(update={self.subject_field: subject}) if self.subject_field else call

    def echoed(self, call: CallT) -> Any:
        """What the ``echo`` field holds when the hook left the subject as ``call`` carried it."""
        return self.subject(call)

    def entry_outcome(self, call: CallT, outcome: OutcomeT) -> dict[str, Any]:
        """``outcome`` as a local activity records it (one in-process hook's result, a batch's entry):
        without its ``echo`` field when that only hands back what ``call`` carried (:meth:`outcome_of`
        puts it back)."""
        data = outcome.model_dump(mode="json")
        if self.echo is not None and getattr(outcome, self.echo) == self.echoed(call):
            del data[self.echo]
        return data

    def outcome_of(self, call: CallT, data: dict[str, Any]) -> OutcomeT:
        """The outcome a local activity recorded for the hook that received ``call``: its ``echo`` field
        back from the call where the record left it out (one recorded before holds it whole)."""
        if self.echo is not None and self.echo not in data:
            echoed = self.echoed(call)
            dump: Callable[..., Any] | None = getattr(echoed, "model_dump", None)
            data = {**data, self.echo: dump(mode="json") if dump is not None else echoed}
        return self.outcome.model_validate(data)  # type: ignore[return-value]

    # -- the activity side ---------------------------------------------------------------------------

    def method(self, entry: HookEntry) -> str:
        """The hook method this invocation calls."""
        return self.methods[0]

    def prepare(self, call: CallT, checks: Checks) -> CallT:
        """The call as the hook receives it, completed with what only the worker knows (the default: as
        the workflow built it)."""
        return call

    def context(self, call: CallT) -> dict[str, Any]:
        """What the hook's context carries of the call besides the request view, where the stage gives it:
        the request's steps so far (``steps``), the tools and the attempt of a planning stage."""
        fields = type(call).model_fields
        return {name: _copy(getattr(call, name)) for name in _CONTEXT_FIELDS if name in fields}

    def arguments(self, call: CallT, ctx: PipelineContext) -> tuple[Any, ...]:
        """What the method receives after ``ctx``: a private copy of the subject."""
        return (_copy(self.subject(call)),)

    def judge(self, call: CallT, value: Any, ctx: PipelineContext, checks: Checks) -> OutcomeT:
        """What the hook returned, checked and decided: the outcome, or ``ResultRejected``."""
        raise NotImplementedError

    # -- the workflow side ---------------------------------------------------------------------------

    def fold(self, subject: Any, outcome: OutcomeT) -> Fold:
        """The one rule by which an outcome combines into the stage's subject (the default: unchanged)."""
        return Fold(subject)

    def refusal(self, hook: HookEntry, message: str, reason: str) -> OutcomeT | None:
        """The outcome by which the workflow refuses what this stage gates for a hook it could not let
        decide (its chain's time ran out, and it blocks on a timeout): ``message`` is what the run reads.
        None where the stage gates nothing; the hook's timeout is then a failure like any other."""
        return None

    # -- decisions -----------------------------------------------------------------------------------

    def policy(self, hook: HookEntry) -> FailurePolicy:
        """By default pipeline hooks and observers fail open; the required after-planning hook and every
        decision or transformation stage (before_run, before_tool, after_tool, on_tool_error, after_answer,
        before_remember) fail closed. A hook's own ``failure_policy`` replaces the default wherever
        ``own_policy`` allows (not at after_planning, governed by the required marker, nor at the
        observers, which never change the outcome): a redaction hook fails closed at after_synthesis."""
        if hook.failure_policy is not None and self.own_policy:
            return hook.failure_policy
        return self.failure_policy

    def success(
        self, hook: HookEntry, reason: str | None = None, action: DecisionAction = DecisionAction.CONTINUE
    ) -> HookDecision:
        """The decision for an invocation that returned a valid result. ``reason`` defaults to ``accepted``
        (``observed`` for observers); deciding stages pass what they decided."""
        default = REASON_OBSERVED if self.finalizer else REASON_ACCEPTED
        return HookDecision(failure_policy=self.policy(hook), action=action, reason=reason or default)

    def stopped(self, hook: HookEntry, stop: Stop) -> HookDecision:
        """The decision for an invocation that stopped the run with ``stop``, whose text becomes the run's
        answer: refused when that answer is empty."""
        if not stop.text.strip():
            raise rejected(f"{self.stage.value} stopped the run with an empty answer")
        return self.success(hook, REASON_STOPPED, DecisionAction.STOP)

    def failure(self, hook: HookEntry, category: str) -> HookDecision:
        """The decision for a failed invocation: terminate when the boundary fails closed, else continue.

        A broken short-circuit contract fails the request whatever the hook's policy, and so do lost workers
        and oversized values (an infrastructure failure is never read as the hook's verdict, open or closed)
        — except at the finalizer stages, where any failure is a diagnostic.
        """
        reason = failure_reason(category)
        if category == HOOK_CONTRACT_ERROR:
            return HookDecision(
                failure_policy=FailurePolicy.FAIL_CLOSED, action=DecisionAction.TERMINATE, reason=reason
            )
        policy = self.policy(hook)
        if self.finalizer:
            return HookDecision(failure_policy=policy, action=DecisionAction.CONTINUE, reason=reason)
        if category == HOOK_PANIC:  # not an ordinary error: even a fail-open hook's panic stops the request
            return HookDecision(failure_policy=policy, action=DecisionAction.PROPAGATE_PANIC, reason=reason)
        terminal = policy is FailurePolicy.FAIL_CLOSED or category in (WORKER_LOST, PAYLOAD_TOO_LARGE)
        return HookDecision(
            failure_policy=policy,
            action=DecisionAction.TERMINATE if terminal else DecisionAction.CONTINUE,
            reason=reason,
        )


class ObserverSpec(StageSpec[CallT, OutcomeT]):
    """A stage whose hooks observe only: they must return None, and every hook runs."""

    chaining = Chaining.OBSERVE
    failure_policy = FailurePolicy.FAIL_OPEN

    def judge(self, call: CallT, value: Any, ctx: PipelineContext, checks: Checks) -> OutcomeT:
        if value is not None:
            raise rejected(f"{self.method(call.hook)} observes only and must return None, got {type(value).__name__}")
        return self.outcome(decision=self.success(call.hook))  # type: ignore[return-value]


# The fields of a stage's call that its hooks read from their context (``PipelineContext``).
_CONTEXT_FIELDS = ("steps", "tools", "attempt")


def _copy(value: Any) -> Any:
    copy: Callable[..., Any] | None = getattr(value, "model_copy", None)
    return copy(deep=True) if copy is not None else value


# The decisions after which a batch never runs on into the next stage: the workflow acts on each (it
# marks them on the Timeline, ends the stage or the run) before any later stage's hooks may run.
_HANDED_BACK = frozenset(
    {
        DecisionAction.TERMINATE,
        DecisionAction.SHORT_CIRCUIT,
        DecisionAction.DENY,
        DecisionAction.STOP,
        DecisionAction.SKIP,
    }
)


def hands_on(spec: StageSpec, ran: Sequence[tuple[HookCall, HookOutcome]]) -> bool:
    """Whether a local activity that ran every in-process hook of ``spec``'s stage (``ran``: each call as
    its hook received it, and its outcome, in order) may go on to the hooks of the next stage, whose calls
    the workflow built before the activity on the premise that this stage leaves everything as it was.
    True when it did: every hook's outcome folds to the subject the stage started with, keeps the hook's
    private state, hands the workflow no lease, detached work or model call, and decides nothing the workflow must
    act on first (a denial, a stop, a skip, a short-circuit, a termination). Anything else hands the rest
    back to the workflow, which then runs the next stage's hooks on what this one made of the run."""
    if not ran:
        return False
    through = let_through(spec, ran)
    return through is not None and through == spec.subject(ran[0][0])


def let_through(spec: StageSpec, ran: Sequence[tuple[HookCall, HookOutcome]]) -> Any:
    """What a gate's hooks (``ran``: each call as its hook received it, and its outcome, in order) let
    through, where a local activity may act on it without the workflow — a tool step's activity runs the
    tool on the call its before_tool hooks left: their subject as folded (a rewrite included), when every
    hook ran, kept its private state, handed the workflow no lease, detached work or model call and decided
    nothing the workflow must act on first. None otherwise: the workflow goes on from there."""
    if not ran:
        return None
    subject = spec.subject(ran[0][0])
    for call, outcome in ran:
        if outcome.leases or outcome.detached or outcome.model_calls or outcome.decision.action in _HANDED_BACK:
            return None
        if outcome.state is not None and outcome.state != call.view.state:
            return None
        folded = spec.fold(subject, outcome)
        if folded.ends or not folded.carries:
            return None
        subject = folded.subject
    return subject


def next_call(spec: StageSpec, applied: HookCall, outcome: HookOutcome, prebuilt: HookCall) -> HookCall | None:
    """What the hook after one in a batch receives: the stage's subject folded as the workflow folds it
    (``spec.fold`` of the previous hook's call and outcome), and the hook's own entry and private state
    from the call the workflow built for it (``prebuilt``). None when the batch must stop and hand the
    rest of the stage back to the workflow: the outcome ends the stage or is left to the workflow
    (``Fold.carries``), or it hands over leases or detached work (adopted or started before the next
    hook runs), or it spent model tokens (the next hook's budget is what the workflow says is left). A
    failed invocation always stops the batch."""
    if outcome.leases or outcome.detached or outcome.model_calls:
        return None
    folded = spec.fold(spec.subject(applied), outcome)
    if folded.ends or not folded.carries:
        return None
    carried = spec.with_subject(applied, folded.subject)
    view = carried.view.model_copy(update={"state": prebuilt.view.state, "plan_phase": prebuilt.view.plan_phase})
    return carried.model_copy(update={"hook": prebuilt.hook, "view": view})
