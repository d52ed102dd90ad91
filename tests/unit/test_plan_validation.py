"""Guards the structural plan rules every plan must pass (after the planner and after every
after_planning hook) and how step references are resolved when a step runs.

A step uses an earlier output with ``{{steps.<step_id>.output.<field>}}``: a same-phase reference needs
``depends_on``; a prior-phase one must appear exactly in ``implicit_deps`` (missing, unreferenced or
same-phase entries are rejected). A whole-string reference keeps the value's JSON type.
"""

from __future__ import annotations

import pytest

from workflows.models import Plan, PlanStep, StepResult, StepStatus, ToolSpec
from workflows.plan_validation import (
    MAX_PROBLEMS,
    UnresolvedReference,
    plan_problems,
    referencing_fields,
    resolve_references,
)

TOOLS = [
    ToolSpec(namespace="demo", agent="market", capability="quote", read_only=True),
    ToolSpec(namespace="demo", agent="notify", capability="send_message", approval_required=True),
]
AGENTS = {"quote": "market", "send_message": "notify"}


def step(step_id: str, capability: str = "quote", **fields) -> PlanStep:
    return PlanStep(
        step_id=step_id, namespace="demo", agent=AGENTS.get(capability, "market"), capability=capability, **fields
    )


def problems_of(*steps: PlanStep, phase: int = 1, prior: tuple[str, ...] = (), max_steps: int = 10) -> list[str]:
    return plan_problems(
        Plan(phase=phase, steps=list(steps)), TOOLS, max_steps=max_steps, phase=phase, prior_step_ids=prior
    )


QUOTE_PRICE = {"text": "ACME is at {{steps.q.output.price}} USD"}


# --- plan_problems -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps,phase,prior",
    [
        pytest.param([], 1, (), id="an empty plan"),
        pytest.param(
            [step("q"), step("n", "send_message", arguments=QUOTE_PRICE, depends_on=["q"])],
            1,
            (),
            id="a same-phase reference with depends_on",
        ),
        pytest.param(
            [step("n", "send_message", arguments=QUOTE_PRICE, implicit_deps=["q"])],
            2,
            ("q",),
            id="a prior-phase reference in implicit_deps",
        ),
        pytest.param(
            [
                step(
                    "n",
                    "send_message",
                    arguments={"text": "{{ steps.q.output.price }}", "to": ["{{steps.q.output.owner}}"]},
                    implicit_deps=["q"],
                )
            ],
            2,
            ("q",),
            id="references with spaces and inside lists",
        ),
        pytest.param(
            [step("a"), step("b", depends_on=["a"]), step("c", depends_on=["a", "b"])],
            1,
            (),
            id="a diamond of dependencies",
        ),
        pytest.param([step("quote.acme-1_x")], 1, (), id="a step id with dots, dashes and underscores"),
    ],
)
def test_a_valid_plan_has_no_problems(steps, phase, prior):
    assert problems_of(*steps, phase=phase, prior=prior) == []


@pytest.mark.parametrize(
    "steps,phase,prior,expected",
    [
        pytest.param([step("a", "buy")], 1, (), ["step 'a': unknown tool demo/market/buy"], id="an unknown tool"),
        pytest.param([step("a"), step("a")], 1, (), ["step 'a': duplicate step_id"], id="a duplicate step id"),
        pytest.param([step("bad id!")], 1, (), ["step 'bad id!': step_id must match"], id="a malformed step id"),
        pytest.param([step("")], 1, (), ["step #0: step_id must match"], id="an empty step id, named by position"),
        pytest.param(
            [step("q")],
            2,
            ("q",),
            ["step 'q': step_id is already used by an earlier phase"],
            id="a step id reused from an earlier phase",
        ),
        pytest.param(
            [step("a", depends_on=["a"])],
            1,
            (),
            ["step 'a': depends on itself (cycle)"],
            id="a step depending on itself",
        ),
        pytest.param(
            [step("a", depends_on=["b"]), step("b", depends_on=["a"])],
            1,
            (),
            ["step 'a': depends_on 'b' names a later step (cycle or forward reference)"],
            id="a depends_on cycle",
        ),
        pytest.param(
            [step("a", depends_on=["zz"])],
            1,
            (),
            ["step 'a': depends_on 'zz' is not a step of this plan"],
            id="depends_on an unknown id",
        ),
        pytest.param(
            [step("a", depends_on=["q"])],
            2,
            ("q",),
            ["step 'a': depends_on 'q' is not a step of this plan"],
            id="depends_on a prior-phase step",
        ),
        pytest.param(
            [step("a"), step("b", depends_on=["a", "a"])],
            1,
            (),
            ["step 'b': depends_on lists a step more than once"],
            id="depends_on listing a step twice",
        ),
        pytest.param(
            [step("q"), step("n", "send_message", arguments=QUOTE_PRICE)],
            1,
            (),
            ["step 'n': references same-phase step 'q' without depends_on"],
            id="a same-phase reference without depends_on",
        ),
        pytest.param(
            [step("n", "send_message", arguments=QUOTE_PRICE)],
            1,
            (),
            ["step 'n': references unknown step 'q'"],
            id="a reference to an unknown step",
        ),
        pytest.param(
            [step("n", "send_message", arguments=QUOTE_PRICE)],
            2,
            ("q",),
            ["step 'n': references prior-phase step 'q' missing from implicit_deps"],
            id="implicit_deps missing a prior-phase reference",
        ),
        pytest.param(
            [step("n", "send_message", arguments={"text": "hello"}, implicit_deps=["q"])],
            2,
            ("q",),
            ["step 'n': implicit_deps names 'q', which its arguments do not reference"],
            id="implicit_deps naming an unreferenced step",
        ),
        pytest.param(
            [
                step("a"),
                step(
                    "n", "send_message", arguments={"text": "{{steps.a.output}}"}, depends_on=["a"], implicit_deps=["a"]
                ),
            ],
            2,
            ("q",),
            ["step 'n': implicit_deps names same-phase step 'a'; use depends_on"],
            id="implicit_deps naming a same-phase step",
        ),
        pytest.param(
            [step("n", "send_message", arguments={"text": "hello"}, implicit_deps=["zz"])],
            2,
            ("q",),
            ["step 'n': implicit_deps names 'zz', which is not a step of an earlier phase"],
            id="implicit_deps naming an unknown step",
        ),
        pytest.param(
            [step("n", "send_message", arguments=QUOTE_PRICE, implicit_deps=["q", "q"])],
            2,
            ("q",),
            ["step 'n': implicit_deps lists a step more than once"],
            id="implicit_deps listing a step twice",
        ),
    ],
)
def test_each_broken_rule_is_reported_naming_the_step(steps, phase, prior, expected):
    problems = problems_of(*steps, phase=phase, prior=prior)

    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problems


def test_a_plan_for_another_phase_or_longer_than_the_limit_is_refused():
    plan = Plan(phase=2, steps=[step("a"), step("b"), step("c")])

    problems = plan_problems(plan, TOOLS, max_steps=2, phase=3)

    assert problems == ["plan is for phase 2, expected phase 3", "plan has 3 steps; the limit is 2"]


def test_the_problems_are_bounded():
    problems = problems_of(*(step(f"s{i}", "buy") for i in range(MAX_PROBLEMS + 5)), max_steps=100)

    assert len(problems) == MAX_PROBLEMS
    assert problems[0] == "step 's0': unknown tool demo/market/buy"


# --- resolve_references ----------------------------------------------------------------------------

QUOTE = {
    "symbol": "ACME",
    "price": 101.5,
    "open": True,
    "history": [99, 100.25],
    "venue": {"name": "NYSE"},
    "note": None,
}
RESULTS = {
    "q": StepResult(step_id="q", tool="market/quote", status=StepStatus.SUCCEEDED, output=QUOTE),
    "broken": StepResult(step_id="broken", tool="market/quote", status=StepStatus.FAILED, error="down"),
    "denied": StepResult(step_id="denied", tool="market/quote", status=StepStatus.SKIPPED, skip_reason="policy"),
}


@pytest.mark.parametrize(
    "reference,value",
    [
        ("{{steps.q.output.price}}", 101.5),
        ("{{steps.q.output.open}}", True),
        ("{{steps.q.output.history}}", [99, 100.25]),
        ("{{steps.q.output.venue}}", {"name": "NYSE"}),
        ("{{steps.q.output.note}}", None),
        ("{{steps.q.output.history.1}}", 100.25),
        ("{{steps.q.output}}", QUOTE),
        ("  {{ steps.q.output.price }} ", 101.5),
    ],
    ids=["number", "boolean", "list", "object", "null", "list item", "whole output", "padded"],
)
def test_a_whole_string_reference_becomes_the_value_with_its_json_type(reference, value):
    assert resolve_references({"x": reference}, RESULTS) == {"x": value}


@pytest.mark.parametrize(
    "text,resolved",
    [
        ("ACME at {{steps.q.output.price}} USD", "ACME at 101.5 USD"),
        ("{{steps.q.output.symbol}} on {{steps.q.output.venue.name}}", "ACME on NYSE"),
        ("venue: {{steps.q.output.venue}}", 'venue: {"name": "NYSE"}'),
        ("open: {{steps.q.output.open}}", "open: true"),
    ],
    ids=["number in text", "two references", "object in text as JSON", "boolean in text as JSON"],
)
def test_a_reference_inside_longer_text_is_replaced_by_its_text(text, resolved):
    assert resolve_references({"x": text}, RESULTS) == {"x": resolved}


def test_references_are_resolved_in_nested_arguments_and_everything_else_is_kept():
    arguments = {
        "to": ["alice", "{{steps.q.output.symbol}}"],
        "body": {"price": "{{steps.q.output.price}}", "count": 3},
        "plain": "no reference",
        "flag": False,
    }

    resolved = resolve_references(arguments, RESULTS)

    assert resolved == {
        "to": ["alice", "ACME"],
        "body": {"price": 101.5, "count": 3},
        "plain": "no reference",
        "flag": False,
    }
    assert arguments["body"]["price"] == "{{steps.q.output.price}}"  # the plan keeps what it said


@pytest.mark.parametrize(
    "reference",
    [
        "{{steps.missing.output}}",
        "{{steps.broken.output}}",
        "{{steps.denied.output.price}}",
        "{{steps.q.output.volume}}",
        "{{steps.q.output.history.5}}",
        "{{steps.q.output.price.cents}}",
        "total: {{steps.q.output.volume}}",
    ],
    ids=[
        "a step that did not run",
        "a failed step",
        "a skipped step",
        "a missing field",
        "an index out of range",
        "a field of a number",
        "a missing field inside text",
    ],
)
def test_a_reference_without_a_value_raises_unresolved_reference(reference):
    with pytest.raises(UnresolvedReference):
        resolve_references({"x": reference}, RESULTS)


# --- referencing_fields ----------------------------------------------------------------------------


def test_referencing_fields_are_the_top_level_arguments_that_contain_a_reference_anywhere():
    s = step(
        "n",
        "send_message",
        arguments={
            "text": "at {{steps.q.output.price}}",
            "to": ["alice", "{{steps.q.output.owner}}"],
            "options": {"retry": {"when": "{{steps.q.output.open}}"}},
            "subject": "Prices",
            "count": 2,
        },
    )

    assert referencing_fields(s) == {"text", "to", "options"}


def test_a_step_without_references_has_no_referencing_fields():
    assert referencing_fields(step("q", arguments={"symbol": "ACME", "steps": "{{not a reference}}"})) == set()
