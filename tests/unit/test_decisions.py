"""Guards the decision table of the hooks reference (``docs/hooks.md``): what the framework decides for
every hook invocation.

Each case below names the table row it checks (the ``situation`` text, verbatim) and computes the
decision the way the hook activities and the workflow do, with ``workflows.decisions``. A second test
reads the table itself, so a row added, removed or changed there without the matching change here (or in
the code) fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from workflows import decisions
from workflows.decisions import short_circuit_decision
from workflows.models import (
    DecisionAction,
    FailurePolicy,
    GateState,
    HookDecision,
    HookEntry,
    ShortCircuitProposal,
    Stage,
)
from workflows.stages import STAGES

README = Path(__file__).resolve().parents[2] / "docs" / "hooks.md"  # where the decision table is

OPEN, CLOSED = FailurePolicy.FAIL_OPEN, FailurePolicy.FAIL_CLOSED
CONTINUE, TERMINATE = DecisionAction.CONTINUE, DecisionAction.TERMINATE
SHORT_CIRCUIT, DENY, STOP, SKIP = (
    DecisionAction.SHORT_CIRCUIT,
    DecisionAction.DENY,
    DecisionAction.STOP,
    DecisionAction.SKIP,
)

# The hooks of the table: an ordinary one (every stage, no policy of its own), the pipeline's required
# after-planning hook, a protective hook that fails closed where its stage fails open, and an optional
# hook that fails open where its stage fails closed.
ORDINARY = HookEntry(name="ordinary", index=0, stages=list(Stage))
REQUIRED = HookEntry(name="allowed-operations", index=1, stages=[Stage.AFTER_PLANNING], required=True)
REQUIRED_CLAIMING_OPEN = REQUIRED.model_copy(update={"failure_policy": OPEN})
PROTECTIVE = HookEntry(name="secret-redaction", index=2, stages=list(Stage), failure_policy=CLOSED)
OPTIONAL = HookEntry(name="optional", index=3, stages=list(Stage), failure_policy=OPEN)

# Failure categories a hook activity reports, and the reason each becomes.
RAISED, TIMED_OUT, WRONG_TYPE, BAD_PLAN = (
    decisions.HOOK_ERROR,
    decisions.HOOK_TIMEOUT,
    decisions.INVALID_HOOK_RESULT,
    decisions.INVALID_PLAN,
)
REASONS = {
    RAISED: "hook_error",
    TIMED_OUT: "hook_timeout",
    WRONG_TYPE: "invalid_result",
    BAD_PLAN: "invalid_plan",
    decisions.WORKER_LOST: "worker_lost",
}
FAILURE_WORDS = {
    RAISED: "raised",
    TIMED_OUT: "timed out",
    WRONG_TYPE: "returned the wrong type",
    BAD_PLAN: "returned an invalid plan",
    decisions.WORKER_LOST: "lost its worker on every dispatch",
}

FAIL_OPEN_STAGES = [Stage.BEFORE_PLANNING, Stage.AFTER_PLANNING, Stage.AFTER_EXECUTION]
DECIDING_STAGES = [
    Stage.BEFORE_RUN,
    Stage.AFTER_RECALL,
    Stage.BEFORE_PLAN,
    Stage.BEFORE_FALLBACK,
    Stage.BEFORE_TOOL,
    Stage.ON_TOOL_ERROR,
    Stage.AFTER_TOOL,
    Stage.AFTER_SYNTHESIS,
    Stage.AFTER_ANSWER,
    Stage.BEFORE_REMEMBER,
]

# A request's cache gate: two reserved dimensions, reads enabled.
GATE = GateState(variation={"pipeline": "p-1", "locale": "fr"}, reserved_dimensions=["locale", "pipeline"])
READS_OFF = GATE.model_copy(update={"cache_read_enabled": False})


def proposal(
    kind: str, contract: str = "decision", cached_against: dict[str, str] | None = None
) -> ShortCircuitProposal:
    return ShortCircuitProposal(
        contract=contract,
        kind=kind,
        response="cached text",
        source="response-cache",
        cached_against=cached_against or {},
    )


@dataclass(frozen=True)
class Case:
    situation: str  # the README row, verbatim
    label: str  # what this case does within the row (the test id)
    decide: Callable[[], HookDecision]
    policy: FailurePolicy
    action: DecisionAction
    reason: str


ROWS = {
    "succeeded": "ordinary hook succeeded",
    "failed": "ordinary hook raised / timed out / returned the wrong type / an invalid plan",
    "closed": "a hook whose own `failure_policy` is `FAIL_CLOSED` (e.g. `secret-redaction`) failed",
    "panic": "a hook panicked — raised what is not an ordinary error (a `BaseException` that is not an "
    "`Exception`: `SystemExit`, `KeyboardInterrupt`, a class of its own): the request stops with `HookPanic`, "
    "whatever the policy; completed work stays in the record",
    "lost": "every dispatch of the invocation lost its worker (infrastructure, whatever the policy)",
    "too large": "the invocation's input or outcome is larger than Temporal (or the payload store) carries "
    "(infrastructure)",
    "required ok": "required after-planning hook accepted the plan",
    "required failed": "required after-planning hook raised / timed out / wrong type / invalid plan",
    "authoritative": "authoritative short-circuit (legacy or decision)",
    "cache hit": "cached response matched",
    "cache miss": "cached response did not match",
    "cache off": "cache reads disabled for the request",
    "contract": "unknown short-circuit kind / missing payload",
    "before_tool": "before_tool allow / modify / deny / stop",
    "text": "after_tool, after_answer kept / rewrote the text",
    "handled": "on_tool_error handled the error",
    "modified": "before_run, after_recall, before_plan or before_fallback changed what the run uses",
    "stopped": "before_run / before_fallback / after_answer stopped the run",
    "plan stopped": "after_planning stopped the run (an ordinary hook, or the required one)",
    "memory": "before_remember replaced / skipped the memory",
    "deciding failed": "a deciding or transforming extension failed",
    "observers": "on_error / on_finish observed / failed (any cause, a lost worker included: a diagnostic)",
}


def case(row: str, label: str, decide: Callable[[], HookDecision], policy, action, reason) -> Case:
    return Case(ROWS[row], label, decide, policy, action, reason)


CASES: list[Case] = [
    *(
        case(
            "succeeded",
            f"an ordinary {stage} hook succeeded",
            lambda s=stage: STAGES[s].success(ORDINARY),
            OPEN,
            CONTINUE,
            "accepted",
        )
        for stage in FAIL_OPEN_STAGES
    ),
    *(
        case(
            "failed",
            f"an ordinary {stage} hook {FAILURE_WORDS[category]}",
            lambda s=stage, c=category: STAGES[s].failure(ORDINARY, c),
            OPEN,
            CONTINUE,
            REASONS[category],
        )
        for stage in FAIL_OPEN_STAGES
        for category in (RAISED, TIMED_OUT, WRONG_TYPE)
    ),
    case(
        "failed",
        "an ordinary after_planning hook returned an invalid plan",
        lambda: STAGES[Stage.AFTER_PLANNING].failure(ORDINARY, BAD_PLAN),
        OPEN,
        CONTINUE,
        "invalid_plan",
    ),
    *(
        case(
            "closed",
            f"secret-redaction at after_synthesis {FAILURE_WORDS[category]}",
            lambda c=category: STAGES[Stage.AFTER_SYNTHESIS].failure(PROTECTIVE, c),
            CLOSED,
            TERMINATE,
            REASONS[category],
        )
        for category in (RAISED, TIMED_OUT, WRONG_TYPE)
    ),
    case(
        "closed",
        "a fail-closed before_planning hook raised",
        lambda: STAGES[Stage.BEFORE_PLANNING].failure(PROTECTIVE, RAISED),
        CLOSED,
        TERMINATE,
        "hook_error",
    ),
    case(
        "too large",
        "an ordinary after_synthesis hook returned more than a payload carries",
        lambda: STAGES[Stage.AFTER_SYNTHESIS].failure(ORDINARY, decisions.PAYLOAD_TOO_LARGE),
        CLOSED,
        TERMINATE,
        "payload_too_large",
    ),
    case(
        "too large",
        "a fail-open before_tool hook returned more than a payload carries",
        lambda: STAGES[Stage.BEFORE_TOOL].failure(OPTIONAL, decisions.PAYLOAD_TOO_LARGE),
        OPEN,
        TERMINATE,
        "payload_too_large",
    ),
    *(
        case(
            "panic",
            f"a{' fail-closed' if hook is PROTECTIVE else 'n ordinary'} {stage} hook panicked",
            lambda h=hook, s=stage: STAGES[s].failure(h, decisions.HOOK_PANIC),
            policy,
            DecisionAction.PROPAGATE_PANIC,
            "panic",
        )
        for hook, stage, policy in (
            (ORDINARY, Stage.AFTER_EXECUTION, OPEN),
            (ORDINARY, Stage.BEFORE_PLANNING, OPEN),
            (PROTECTIVE, Stage.AFTER_SYNTHESIS, CLOSED),
            (REQUIRED, Stage.AFTER_PLANNING, CLOSED),
        )
    ),
    case(
        "lost",
        "an ordinary before_planning hook lost its worker on every dispatch",
        lambda: STAGES[Stage.BEFORE_PLANNING].failure(ORDINARY, decisions.WORKER_LOST),
        OPEN,
        TERMINATE,
        "worker_lost",
    ),
    case(
        "lost",
        "a fail-open before_tool hook lost its worker on every dispatch",
        lambda: STAGES[Stage.BEFORE_TOOL].failure(OPTIONAL, decisions.WORKER_LOST),
        OPEN,
        TERMINATE,
        "worker_lost",
    ),
    case(
        "lost",
        "the required hook lost its worker on every dispatch",
        lambda: STAGES[Stage.AFTER_PLANNING].failure(REQUIRED, decisions.WORKER_LOST),
        CLOSED,
        TERMINATE,
        "worker_lost",
    ),
    case(
        "required ok",
        "the required hook accepted the plan",
        lambda: STAGES[Stage.AFTER_PLANNING].success(REQUIRED),
        CLOSED,
        CONTINUE,
        "accepted",
    ),
    case(
        "required ok",
        "the required hook accepted the plan although it declares fail_open",
        lambda: STAGES[Stage.AFTER_PLANNING].success(REQUIRED_CLAIMING_OPEN),
        CLOSED,
        CONTINUE,
        "accepted",
    ),
    *(
        case(
            "required failed",
            f"the required hook {FAILURE_WORDS[category]}",
            lambda c=category: STAGES[Stage.AFTER_PLANNING].failure(REQUIRED, c),
            CLOSED,
            TERMINATE,
            REASONS[category],
        )
        for category in (RAISED, TIMED_OUT, WRONG_TYPE, BAD_PLAN)
    ),
    case(
        "required failed",
        "the required hook raised although it declares fail_open",
        lambda: STAGES[Stage.AFTER_PLANNING].failure(REQUIRED_CLAIMING_OPEN, RAISED),
        CLOSED,
        TERMINATE,
        "hook_error",
    ),
    case(
        "authoritative",
        "a legacy short-circuit",
        lambda: short_circuit_decision(proposal("authoritative", contract="legacy"), GATE),
        OPEN,
        SHORT_CIRCUIT,
        "authoritative",
    ),
    case(
        "authoritative",
        "an authoritative decision",
        lambda: short_circuit_decision(proposal("authoritative"), GATE),
        OPEN,
        SHORT_CIRCUIT,
        "authoritative",
    ),
    case(
        "authoritative",
        "an authoritative decision while cache reads are disabled",
        lambda: short_circuit_decision(proposal("authoritative"), READS_OFF),
        OPEN,
        SHORT_CIRCUIT,
        "authoritative",
    ),
    case(
        "cache hit",
        "a cached answer recorded against the same dimensions",
        lambda: short_circuit_decision(proposal("cache", cached_against={"pipeline": "p-1", "locale": "fr"}), GATE),
        CLOSED,
        SHORT_CIRCUIT,
        "cache_match",
    ),
    case(
        "cache miss",
        "a cached answer recorded under another locale",
        lambda: short_circuit_decision(proposal("cache", cached_against={"pipeline": "p-1", "locale": "de"}), GATE),
        CLOSED,
        CONTINUE,
        "cache_dimension_mismatch",
    ),
    case(
        "cache miss",
        "a cached answer recorded without a reserved dimension",
        lambda: short_circuit_decision(proposal("cache", cached_against={"pipeline": "p-1"}), GATE),
        CLOSED,
        CONTINUE,
        "cache_dimension_mismatch",
    ),
    case(
        "cache off",
        "a matching cached answer for a request that bypasses the cache",
        lambda: short_circuit_decision(
            proposal("cache", cached_against={"pipeline": "p-1", "locale": "fr"}), READS_OFF
        ),
        CLOSED,
        CONTINUE,
        "cache_read_disabled",
    ),
    case(
        "contract",
        "a before_planning hook broke the short-circuit contract",
        lambda: STAGES[Stage.BEFORE_PLANNING].failure(ORDINARY, decisions.HOOK_CONTRACT_ERROR),
        CLOSED,
        TERMINATE,
        "contract_error",
    ),
    case(
        "contract",
        "a fail-open before_planning hook broke the short-circuit contract",
        lambda: STAGES[Stage.BEFORE_PLANNING].failure(OPTIONAL, decisions.HOOK_CONTRACT_ERROR),
        CLOSED,
        TERMINATE,
        "contract_error",
    ),
    *(
        case(
            "before_tool",
            f"before_tool decided {verdict}",
            lambda a=action, r=reason: STAGES[Stage.BEFORE_TOOL].success(ORDINARY, r, a),
            CLOSED,
            expected_action,
            expected_reason,
        )
        for verdict, action, reason, expected_action, expected_reason in [
            ("allow", CONTINUE, decisions.REASON_ALLOWED, CONTINUE, "allowed"),
            ("modify", CONTINUE, decisions.REASON_MODIFIED, CONTINUE, "modified"),
            ("deny", DENY, decisions.REASON_DENIED, DENY, "policy"),
            ("stop", STOP, decisions.REASON_STOPPED, STOP, "stopped"),
        ]
    ),
    *(
        case(
            "text",
            f"{stage} {verb} the text",
            lambda s=stage, r=reason: STAGES[s].success(ORDINARY, r),
            CLOSED,
            CONTINUE,
            expected_reason,
        )
        for stage in (Stage.AFTER_TOOL, Stage.AFTER_ANSWER)
        for verb, reason, expected_reason in [
            ("kept", decisions.REASON_ACCEPTED, "accepted"),
            ("rewrote", decisions.REASON_REWRITTEN, "rewritten"),
        ]
    ),
    case(
        "handled",
        "on_tool_error substituted a result",
        lambda: STAGES[Stage.ON_TOOL_ERROR].success(ORDINARY, decisions.REASON_HANDLED),
        CLOSED,
        CONTINUE,
        "handled",
    ),
    *(
        case(
            "stopped",
            f"{stage} stopped the run",
            lambda s=stage: STAGES[s].success(ORDINARY, decisions.REASON_STOPPED, STOP),
            CLOSED,
            STOP,
            "stopped",
        )
        for stage in (Stage.BEFORE_RUN, Stage.BEFORE_FALLBACK, Stage.AFTER_ANSWER)
    ),
    *(
        case(
            "plan stopped",
            f"after_planning stopped the run ({hook.name})",
            lambda h=hook: STAGES[Stage.AFTER_PLANNING].success(h, decisions.REASON_STOPPED, STOP),
            policy,
            STOP,
            "stopped",
        )
        for hook, policy in ((ORDINARY, OPEN), (REQUIRED, CLOSED))
    ),
    case(
        "memory",
        "before_remember replaced the candidate",
        lambda: STAGES[Stage.BEFORE_REMEMBER].success(ORDINARY, decisions.REASON_MEMORY_REPLACED),
        CLOSED,
        CONTINUE,
        "memory_replaced",
    ),
    case(
        "memory",
        "before_remember skipped the memory",
        lambda: STAGES[Stage.BEFORE_REMEMBER].success(ORDINARY, decisions.REASON_MEMORY_SKIPPED, SKIP),
        CLOSED,
        SKIP,
        "memory_skipped",
    ),
    *(
        case(
            "deciding failed",
            f"a {stage} hook {FAILURE_WORDS[category]}",
            lambda s=stage, c=category: STAGES[s].failure(ORDINARY, c),
            CLOSED,
            TERMINATE,
            REASONS[category],
        )
        for stage in DECIDING_STAGES
        for category in (RAISED, TIMED_OUT, WRONG_TYPE)
    ),
    *(
        case(
            "observers",
            f"an {stage} observer returned",
            lambda s=stage: STAGES[s].success(ORDINARY),
            OPEN,
            CONTINUE,
            "observed",
        )
        for stage in (Stage.ON_ERROR, Stage.ON_FINISH)
    ),
    *(
        case(
            "observers",
            f"a{' fail-closed' if hook is PROTECTIVE else 'n'} {stage} observer {FAILURE_WORDS[category]}",
            lambda h=hook, s=stage, c=category: STAGES[s].failure(h, c),
            OPEN,
            CONTINUE,
            REASONS[category],
        )
        for hook in (ORDINARY, PROTECTIVE)
        for stage in (Stage.ON_ERROR, Stage.ON_FINISH)
        for category in (RAISED, TIMED_OUT, WRONG_TYPE, decisions.WORKER_LOST)
    ),
    *(
        case(
            "modified",
            f"{stage} changed what the run uses",
            lambda s=stage: STAGES[s].success(ORDINARY, decisions.REASON_MODIFIED),
            CLOSED,
            CONTINUE,
            "modified",
        )
        for stage in (Stage.BEFORE_RUN, Stage.AFTER_RECALL, Stage.BEFORE_PLAN, Stage.BEFORE_FALLBACK)
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.label) for c in CASES])
def test_each_situation_gets_the_decision_the_readme_table_gives(case: Case):
    decision = case.decide()

    assert (decision.failure_policy, decision.action, decision.reason) == (case.policy, case.action, case.reason)


def readme_decision_table() -> dict[str, tuple[str, set[str], set[str]]]:
    """The README's decision table: situation → (failure policy, actions, reasons), alternatives split."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("| situation | failure policy | action | reason |")
    table = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        situation, policy, action, reason = (cell.strip() for cell in line.strip().strip("|").split("|"))

        def alternatives(cell: str) -> set[str]:
            return {re.sub(r"`", "", part).strip() for part in cell.split(" / ")}

        table[situation] = (policy.strip("`"), alternatives(action), alternatives(reason))
    return table


def test_every_row_of_the_readme_decision_table_is_checked_with_all_its_outcomes():
    table = readme_decision_table()

    assert set(table) == set(ROWS.values()), "the README table and ROWS list different situations"
    for situation, (policy, actions, reasons) in table.items():
        cases = [c for c in CASES if c.situation == situation]
        assert {c.action.value for c in cases} == actions, situation
        assert {c.reason for c in cases} == reasons, situation
        if policy != "the hook's":
            assert {c.policy.value for c in cases} == {policy}, situation


@pytest.mark.parametrize(
    "hook,stage,expected",
    [
        pytest.param(PROTECTIVE, Stage.AFTER_SYNTHESIS, CLOSED, id="fail_closed applies at after_synthesis"),
        pytest.param(PROTECTIVE, Stage.BEFORE_PLANNING, CLOSED, id="fail_closed applies at before_planning"),
        pytest.param(PROTECTIVE, Stage.AFTER_EXECUTION, CLOSED, id="fail_closed applies at after_execution"),
        pytest.param(OPTIONAL, Stage.BEFORE_TOOL, OPEN, id="fail_open applies at before_tool"),
        pytest.param(OPTIONAL, Stage.AFTER_TOOL, OPEN, id="fail_open applies at after_tool"),
        pytest.param(OPTIONAL, Stage.BEFORE_RUN, OPEN, id="fail_open applies at before_run"),
        pytest.param(PROTECTIVE, Stage.AFTER_PLANNING, OPEN, id="fail_closed is ignored at after_planning"),
        pytest.param(
            REQUIRED_CLAIMING_OPEN, Stage.AFTER_PLANNING, CLOSED, id="fail_open is ignored by the required hook"
        ),
        pytest.param(PROTECTIVE, Stage.ON_ERROR, OPEN, id="fail_closed is ignored by an on_error observer"),
        pytest.param(PROTECTIVE, Stage.ON_FINISH, OPEN, id="fail_closed is ignored by an on_finish observer"),
    ],
)
def test_a_hooks_own_failure_policy_replaces_the_stage_default_except_at_after_planning_and_observers(
    hook: HookEntry, stage: Stage, expected: FailurePolicy
):
    assert STAGES[stage].policy(hook) is expected


@pytest.mark.parametrize(
    "stage,expected",
    [
        *((stage, OPEN) for stage in (*FAIL_OPEN_STAGES, Stage.ON_ERROR, Stage.ON_FINISH)),
        *((stage, CLOSED) for stage in DECIDING_STAGES),
    ],
    ids=str,
)
def test_without_a_policy_of_its_own_a_hook_fails_open_at_pipeline_and_observer_stages_and_closed_elsewhere(
    stage: Stage, expected: FailurePolicy
):
    assert STAGES[stage].policy(ORDINARY) is expected
