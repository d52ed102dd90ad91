"""Guards when a cached answer may be served: the request's cache gate, the symmetric comparison of
reserved dimensions, and the judgement of cache versus authoritative short-circuits.

A cached answer is served only when reads are enabled (``{"cache": "bypass"}`` disables them) and every
reserved dimension matches on both sides — a value on one side only is a mismatch.
"""

from __future__ import annotations

import pytest

from workflows.decisions import gate_for_request, short_circuit_decision, variation_mismatches
from workflows.models import DecisionAction, FailurePolicy, GateState, ShortCircuitProposal

PIPELINE = {"pipeline": "p-1", "planner": "rule-v2", "tools": "t-9"}


def proposal(kind: str, cached_against: dict[str, str] | None = None) -> ShortCircuitProposal:
    return ShortCircuitProposal(
        contract="decision",
        kind=kind,
        response="cached text",
        source="response-cache",
        cached_against=cached_against or {},
    )


# --- gate_for_request ----------------------------------------------------------------------------


def test_the_pipelines_own_dimensions_are_always_reserved_with_their_values():
    gate = gate_for_request({}, PIPELINE, [])

    assert gate.variation == PIPELINE
    assert gate.reserved_dimensions == ["pipeline", "planner", "tools"]
    assert gate.cache_read_enabled


def test_a_reserved_metadata_dimension_the_request_carries_joins_the_variation():
    gate = gate_for_request({"locale": "fr", "desk": "a"}, PIPELINE, ["locale"])

    assert gate.variation == {**PIPELINE, "locale": "fr"}
    assert gate.reserved_dimensions == ["locale", "pipeline", "planner", "tools"]


def test_metadata_keys_not_declared_reserved_do_not_vary_the_cache():
    gate = gate_for_request({"desk": "a", "user_id": "u-1"}, PIPELINE, ["locale"])

    assert "desk" not in gate.variation and "user_id" not in gate.variation
    assert "desk" not in gate.reserved_dimensions


@pytest.mark.parametrize(
    "metadata", [{}, {"locale": None}], ids=["request without the key", "request with a null value"]
)
def test_a_reserved_metadata_dimension_the_request_lacks_is_reserved_but_absent_from_the_variation(metadata):
    gate = gate_for_request(metadata, PIPELINE, ["locale"])

    assert "locale" in gate.reserved_dimensions
    assert "locale" not in gate.variation


@pytest.mark.parametrize(
    "one,other", [(3, 4), (True, False), ({"level": 1}, {"level": 2})], ids=["number", "boolean", "object"]
)
def test_a_reserved_metadata_dimension_with_a_value_that_is_not_text_still_varies_the_cache(one, other):
    first = gate_for_request({"tier": one}, {}, ["tier"])
    same = gate_for_request({"tier": one}, {}, ["tier"])
    different = gate_for_request({"tier": other}, {}, ["tier"])

    assert all(isinstance(value, str) for value in first.variation.values())
    assert variation_mismatches(first, same.variation) == []
    assert variation_mismatches(first, different.variation) == ["tier"]


@pytest.mark.parametrize(
    "metadata,enabled",
    [
        ({}, True),
        ({"cache": "bypass"}, False),
        ({"cache": "use"}, True),
        ({"cache": None}, True),
    ],
    ids=["no cache key", "bypass", "another value", "null"],
)
def test_only_cache_bypass_in_the_request_metadata_disables_cache_reads(metadata, enabled):
    assert gate_for_request(metadata, PIPELINE, []).cache_read_enabled is enabled


def test_a_dimension_declared_twice_is_reserved_once():
    gate = gate_for_request({}, {"locale": "fr"}, ["locale", "locale"])

    assert gate.reserved_dimensions == ["locale"]


# --- variation_mismatches ------------------------------------------------------------------------

GATE = GateState(variation={"pipeline": "p-1", "locale": "fr"}, reserved_dimensions=["locale", "pipeline", "tenant"])


@pytest.mark.parametrize(
    "cached_against,mismatched",
    [
        pytest.param({"pipeline": "p-1", "locale": "fr"}, [], id="same values match"),
        pytest.param(
            {"pipeline": "p-1", "locale": "fr", "desk": "a"}, [], id="a dimension that is not reserved is ignored"
        ),
        pytest.param({"pipeline": "p-1", "locale": "de"}, ["locale"], id="a different value mismatches"),
        pytest.param({"pipeline": "p-1"}, ["locale"], id="a value only in the request mismatches"),
        pytest.param(
            {"pipeline": "p-1", "locale": "fr", "tenant": "acme"}, ["tenant"], id="a value only in the cache mismatches"
        ),
        pytest.param(
            {}, ["locale", "pipeline"], id="an entry recorded against nothing mismatches every present dimension"
        ),
        pytest.param(
            {"pipeline": "p-2", "locale": "de", "tenant": "acme"},
            ["locale", "pipeline", "tenant"],
            id="every mismatch is listed in dimension order",
        ),
    ],
)
def test_reserved_dimensions_match_only_when_both_sides_agree(cached_against, mismatched):
    assert variation_mismatches(GATE, cached_against) == mismatched


def test_a_gate_built_for_a_request_refuses_an_entry_cached_for_another_locale_and_for_no_locale():
    french = gate_for_request({"locale": "fr"}, PIPELINE, ["locale"])
    no_locale = gate_for_request({}, PIPELINE, ["locale"])

    assert variation_mismatches(french, french.variation) == []
    assert variation_mismatches(french, {**PIPELINE, "locale": "de"}) == ["locale"]
    assert variation_mismatches(french, no_locale.variation) == ["locale"]
    assert variation_mismatches(no_locale, french.variation) == ["locale"]


# --- short_circuit_decision ----------------------------------------------------------------------

FRENCH = {"pipeline": "p-1", "locale": "fr"}
READS_OFF = GATE.model_copy(update={"cache_read_enabled": False})


@pytest.mark.parametrize(
    "kind,gate,cached_against,action,reason",
    [
        pytest.param("cache", GATE, FRENCH, "short_circuit", "cache_match", id="a matching cache entry is served"),
        pytest.param(
            "cache",
            GATE,
            {**FRENCH, "locale": "de"},
            "continue",
            "cache_dimension_mismatch",
            id="a mismatching one is not",
        ),
        pytest.param(
            "cache", READS_OFF, FRENCH, "continue", "cache_read_disabled", id="a matching one is not served on bypass"
        ),
        pytest.param(
            "cache",
            READS_OFF,
            {**FRENCH, "locale": "de"},
            "continue",
            "cache_read_disabled",
            id="bypass is reported before a mismatch",
        ),
        pytest.param(
            "authoritative", GATE, {}, "short_circuit", "authoritative", id="an authoritative answer ends the request"
        ),
        pytest.param(
            "authoritative",
            READS_OFF,
            {"locale": "de"},
            "short_circuit",
            "authoritative",
            id="an authoritative answer ignores the cache gate",
        ),
    ],
)
def test_a_cache_proposal_is_judged_by_the_gate_and_an_authoritative_one_is_not(
    kind, gate, cached_against, action, reason
):
    decision = short_circuit_decision(proposal(kind, cached_against), gate)

    assert (decision.action, decision.reason) == (DecisionAction(action), reason)
    expected_policy = FailurePolicy.FAIL_OPEN if kind == "authoritative" else FailurePolicy.FAIL_CLOSED
    assert decision.failure_policy is expected_policy
