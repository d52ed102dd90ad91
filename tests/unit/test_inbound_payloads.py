"""Guards that whatever arrives from outside is answered with a reason, never a wedged workflow task:
decoding one payload into a model (``single_payload`` / ``decode_payload``), the project's data
converter, and the idempotency key a tool receives for a step.

The data converter raises a non-retryable ``ApplicationError`` (typed by the model's
``invalid_payload_type``) for a typed decode that fails, and returns a ``RawValue`` for an untyped one,
so the workflow can refuse it with a reason instead of failing its task forever.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator

import pytest
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from workflows.converter import BY_REFERENCE_METADATA, data_converter
from workflows.models import (
    MAX_INBOUND_PAYLOAD_BYTES,
    ApproveSignal,
    ByReference,
    PlanInput,
    RecoveredError,
    RequestInput,
    ReviewRequest,
    StepResult,
    StepStatus,
    ToolStepOutput,
    json_size,
)
from workflows.support import decode_payload, idempotency_key, single_payload

CONVERTER = data_converter.payload_converter


def raw(encoding: bytes | None, data: bytes = b"{}") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding} if encoding is not None else {}, data=data))


# --- single_payload / decode_payload ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args,problem",
    [
        pytest.param([], "expected one JSON payload, got 0", id="no payload"),
        pytest.param([{"request": "a"}, {"request": "b"}], "expected one JSON payload, got 2", id="two payloads"),
        pytest.param(
            [raw(b"binary/protobuf")], "payload encoding 'binary/protobuf' is not JSON", id="a protobuf payload"
        ),
        pytest.param([raw(None)], "payload encoding '(none)' is not JSON", id="a payload without an encoding"),
        pytest.param([b"\x00\x01"], "payload is binary data, not JSON", id="bytes"),
        pytest.param([bytearray(b"abc")], "payload is binary data, not JSON", id="a bytearray"),
    ],
)
def test_anything_but_one_json_value_is_refused_with_the_reason(args, problem):
    assert single_payload(args) == (None, problem)
    assert decode_payload(RequestInput, args) == (None, problem)


@pytest.mark.parametrize(
    "value", [{"request": "hi"}, "text", 0, None, [1, 2]], ids=["object", "string", "number", "null", "list"]
)
def test_one_json_value_is_passed_through(value):
    assert single_payload([value]) == (value, None)


def test_a_payload_of_exactly_max_bytes_is_accepted_and_one_byte_more_is_refused():
    value = {"comment": "é" * 10}  # the limit counts UTF-8 bytes of compact JSON, not characters
    size = json_size(value)

    assert single_payload([value], max_bytes=size) == (value, None)
    assert single_payload([value], max_bytes=size - 1) == (
        None,
        f"payload is {size} bytes of JSON; the limit is {size - 1}",
    )


def test_an_oversize_signal_is_refused_before_it_is_validated():
    signal = {"checkpoint_id": "x" * (MAX_INBOUND_PAYLOAD_BYTES + 1)}

    decoded, problem = decode_payload(ApproveSignal, [signal], max_bytes=MAX_INBOUND_PAYLOAD_BYTES)

    assert decoded is None
    assert problem.startswith("payload is ") and problem.endswith(f"the limit is {MAX_INBOUND_PAYLOAD_BYTES}")


def test_a_valid_payload_decodes_into_its_model():
    decoded, problem = decode_payload(
        RequestInput, [{"request": "What is the price of ACME?", "metadata": {"desk": "a"}}]
    )

    assert problem is None
    assert decoded == RequestInput(request="What is the price of ACME?", metadata={"desk": "a"})


@pytest.mark.parametrize(
    "model,value,named",
    [
        pytest.param(RequestInput, {"request": 5}, ["request"], id="a request that is not text"),
        pytest.param(RequestInput, {"request": "   "}, ["request"], id="a blank request"),
        pytest.param(
            RequestInput, {"request": "hi", "metadata": []}, ["metadata"], id="metadata that is not an object"
        ),
        pytest.param(RequestInput, {"request": "hi", "extra": 1}, ["extra"], id="an unknown field"),
        pytest.param(
            RequestInput, {"request": "hi", "request_id": "bad id"}, ["request_id"], id="a malformed request id"
        ),
        pytest.param(RequestInput, "just text", ["(root)"], id="not an object"),
        pytest.param(
            ReviewRequest,
            {"checkpoint_id": "cp", "reviewer": "r", "decision": "maybe"},
            ["decision"],
            id="an unknown decision",
        ),
        pytest.param(ReviewRequest, {}, ["checkpoint_id", "decision"], id="missing fields"),
        pytest.param(ApproveSignal, {"checkpoint_id": "x" * 200}, ["checkpoint_id"], id="a field over its length"),
    ],
)
def test_a_payload_that_does_not_validate_is_refused_naming_the_model_and_each_field(model, value, named):
    decoded, problem = decode_payload(model, [value], max_bytes=MAX_INBOUND_PAYLOAD_BYTES)

    assert decoded is None
    assert problem.startswith(f"invalid {model.__name__}: ")
    for field in named:
        assert f"{field}: " in problem


def test_at_most_three_validation_errors_are_reported():
    value = {"request": 1, "metadata": 2, "request_id": 3, "unknown": 4, "other": 5}

    _, problem = decode_payload(RequestInput, [value])

    assert problem.count(": ") == 1 + 3  # "invalid RequestInput: " and three field errors


# --- the data converter ------------------------------------------------------------------------------


def test_a_typed_decode_of_a_valid_payload_returns_the_model():
    payloads = CONVERTER.to_payloads([RequestInput(request="hi", metadata={"desk": "a"})])

    assert CONVERTER.from_payloads(payloads, [RequestInput]) == [RequestInput(request="hi", metadata={"desk": "a"})]


@pytest.mark.parametrize(
    "payload,message",
    [
        pytest.param(
            Payload(metadata={"encoding": b"json/plain"}, data=b'{"request": ""}'),
            "request",
            id="a field that does not validate",
        ),
        pytest.param(
            Payload(metadata={"encoding": b"json/plain"}, data=b'{"request": "hi", "x": 1}'), "x", id="an unknown field"
        ),
        pytest.param(
            Payload(metadata={"encoding": b"json/plain"}, data=b"{not json"), "Invalid JSON", id="broken JSON"
        ),
        pytest.param(
            Payload(metadata={"encoding": b"binary/custom"}, data=b"xx"), "binary/custom", id="an unknown encoding"
        ),
    ],
)
def test_a_typed_decode_of_an_invalid_payload_raises_a_non_retryable_typed_error(payload, message):
    with pytest.raises(ApplicationError) as raised:
        CONVERTER.from_payloads([payload], [RequestInput])

    assert raised.value.type == RequestInput.invalid_payload_type == "InvalidRequest"
    assert raised.value.non_retryable
    assert raised.value.message.startswith("invalid RequestInput: ")
    assert message in raised.value.message


def test_a_typed_decode_reports_each_invalid_field_in_the_error_details():
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b'{"request": 5, "metadata": []}')

    with pytest.raises(ApplicationError) as raised:
        CONVERTER.from_payloads([payload], [RequestInput])

    assert [e["loc"] for e in raised.value.details[0]["errors"]] == ["request", "metadata"]


def test_a_model_without_its_own_error_type_is_refused_as_invalid_payload():
    payload = Payload(metadata={"encoding": b"json/plain"}, data=b'{"decision": "maybe"}')

    with pytest.raises(ApplicationError) as raised:
        CONVERTER.from_payloads([payload], [ReviewRequest])

    assert raised.value.type == "InvalidPayload" and raised.value.non_retryable


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(Payload(metadata={"encoding": b"binary/custom"}, data=b"xx"), id="an unknown encoding"),
        pytest.param(Payload(metadata={"encoding": b"json/plain"}, data=b"{not json"), id="broken JSON"),
        pytest.param(Payload(metadata={}, data=b"{}"), id="no encoding"),
    ],
)
def test_an_untyped_decode_of_an_undecodable_payload_returns_it_raw(payload):
    [value] = CONVERTER.from_payloads([payload])

    assert isinstance(value, RawValue)
    assert value.payload == payload


def test_an_untyped_decode_keeps_the_decodable_payloads_beside_a_raw_one():
    good = CONVERTER.to_payloads([{"request": "hi"}])[0]
    bad = Payload(metadata={"encoding": b"json/plain"}, data=b"{not json")

    first, second = CONVERTER.from_payloads([good, bad])

    assert first == {"request": "hi"}
    assert isinstance(second, RawValue)


@pytest.mark.parametrize(
    "payload,named",
    [
        pytest.param(
            Payload(metadata={"encoding": b"binary/custom"}, data=b"xx"), "'binary/custom'", id="an unknown encoding"
        ),
        pytest.param(
            Payload(metadata={"encoding": b"json/plain"}, data=b"{not json"), "not valid JSON", id="broken JSON"
        ),
        pytest.param(Payload(metadata={"encoding": b"binary/plain"}, data=b"\x00"), "binary data", id="binary data"),
    ],
)
def test_an_entry_point_refuses_what_the_converter_could_not_decode_with_a_reason(payload, named):
    args = CONVERTER.from_payloads([payload])  # what an untyped workflow entry point receives

    decoded, problem = decode_payload(RequestInput, args)

    assert decoded is None
    assert named in problem


# --- idempotency_key ---------------------------------------------------------------------------------

ARGS = {"symbol": "ACME", "side": "buy", "quantity": 10, "limits": {"max": 101.5, "min": 99}}
KEY = ("request-t1", "run-1", "trade-acme", ARGS)


def test_the_same_call_always_gets_the_same_key_starting_with_the_step_id():
    assert idempotency_key(*KEY) == idempotency_key("request-t1", "run-1", "trade-acme", dict(ARGS))
    assert idempotency_key(*KEY).startswith("trade-acme-")


def test_the_order_of_argument_keys_does_not_change_the_key():
    reordered = {"limits": {"min": 99, "max": 101.5}, "quantity": 10, "side": "buy", "symbol": "ACME"}

    assert idempotency_key("request-t1", "run-1", "trade-acme", reordered) == idempotency_key(*KEY)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(("request-t2", "run-1", "trade-acme", ARGS), id="another workflow id"),
        pytest.param(("request-t1", "run-2", "trade-acme", ARGS), id="another run"),
        pytest.param(("request-t1", "run-1", "trade-acme-2", ARGS), id="another step"),
        pytest.param(("request-t1", "run-1", "trade-acme", {**ARGS, "quantity": 20}), id="another quantity"),
        pytest.param(("request-t1", "run-1", "trade-acme", {**ARGS, "quantity": "10"}), id="the quantity as text"),
        pytest.param(("request-t1", "run-1", "trade-acme", {**ARGS, "note": None}), id="an extra argument"),
        pytest.param(("request-t1", "run-1", "trade-acme", {}), id="no arguments"),
    ],
)
def test_any_other_call_gets_another_key(other):
    assert idempotency_key(*other) != idempotency_key(*KEY)


# --- the wire form of the framework's own activity payloads -----------------------------------------


def _models_within(annotation: object) -> Iterator[type[BaseModel]]:
    """Every pydantic model a field annotation names, at any depth of ``list``, ``dict``, ``| None``..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_within(argument)


def _unions_within(annotation: object) -> Iterator[set[type[BaseModel]]]:
    """The models of each union an annotation holds, at any depth (``list[A | B]`` holds ``{A, B}``)."""
    arguments = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        yield {a for a in arguments if isinstance(a, type) and issubclass(a, BaseModel)}
    for argument in arguments:
        yield from _unions_within(argument)


def _closure(model: type[BaseModel]) -> set[type[BaseModel]]:
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(m for f in current.model_fields.values() for m in _models_within(f.annotation))
    return seen


def _omitting() -> list[type[ByReference]]:
    found, todo = [], list(ByReference.__subclasses__())
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        if model.defaults_omitted:
            found.append(model)
    return sorted(found, key=lambda m: m.__name__)


def test_the_manifest_planning_tool_and_synthesis_payloads_travel_without_their_defaults():
    assert [m.__name__ for m in _omitting()] == [
        "PipelineManifest",
        "PlanInput",
        "PlanOutput",
        "SynthesizeInput",
        "SynthesizeOutput",
        "ToolStepInput",
        "ToolStepOutput",
    ]


def test_a_planner_input_carries_only_what_differs_from_the_defaults_and_reads_back_whole():
    handled = StepResult(
        step_id="quote-2",
        tool="stock-service/stock_quote",
        status=StepStatus.SUCCEEDED,
        result="AAA 245.61",
        recovered_from=RecoveredError(error="timeout", handled_by="fallback-quote"),
        modified_by=["redact"],
    )
    plain = StepResult(step_id="quote-1", tool="stock-service/stock_quote", status=StepStatus.SUCCEEDED, result="ok")
    value = PlanInput(request="price?", request_id="r-1", workflow_id="w-1", phase=2, prior_results=[plain, handled])
    [payload] = CONVERTER.to_payloads([value])
    sent = json.loads(payload.data)
    assert sent == {
        "request": "price?",
        "request_id": "r-1",
        "workflow_id": "w-1",
        "phase": 2,
        "prior_results": [
            {"step_id": "quote-1", "tool": "stock-service/stock_quote", "status": "succeeded", "result": "ok"},
            {
                "step_id": "quote-2",
                "tool": "stock-service/stock_quote",
                "status": "succeeded",
                "result": "AAA 245.61",
                "recovered_from": {"error": "timeout", "handled_by": "fallback-quote"},
                "modified_by": ["redact"],
            },
        ],
    }
    assert payload.metadata[BY_REFERENCE_METADATA] == b"reference"  # still the store's to take when large
    assert len(payload.data) < len(value.model_dump_json()) // 2
    [back] = CONVERTER.from_payloads([payload], [PlanInput])
    assert back == value


def test_other_payloads_keep_every_field_so_the_ui_shows_them_whole():
    value = RequestInput(request="price?")
    [payload] = CONVERTER.to_payloads([value])
    assert json.loads(payload.data) == value.model_dump(mode="json")


@pytest.mark.parametrize("model", _omitting(), ids=lambda m: m.__name__)
def test_a_payload_without_its_defaults_has_no_union_of_models_to_tell_apart(model):
    """Validation puts an omitted field back from the model's default; a union of two models could then
    take one for the other, so none may be within a payload that omits its defaults."""
    for part in _closure(model):
        for name, field in part.model_fields.items():
            for members in _unions_within(field.annotation):
                assert len(members) <= 1, f"{part.__name__}.{name}: a union of {sorted(m.__name__ for m in members)}"


def test_the_union_check_finds_a_union_of_models_inside_a_list():
    class A(BaseModel):
        a: int = 0

    class B(BaseModel):
        b: int = 0

    assert [sorted(m.__name__ for m in u) for u in _unions_within(list[A | B] | None)] == [[], ["A", "B"]]


@pytest.mark.parametrize(
    "output",
    [
        pytest.param({"price": None, "tags": [], "count": 0, "note": ""}, id="empty values inside JSON"),
        pytest.param([None, {}, []], id="a list of empty values"),
        pytest.param(0, id="zero"),
        pytest.param("", id="an empty string"),
    ],
)
def test_what_a_tool_returned_reads_back_as_it_was_even_where_it_looks_like_a_default(output):
    value = ToolStepOutput(output=output, text="")
    [payload] = CONVERTER.to_payloads([value])
    [back] = CONVERTER.from_payloads([payload], [ToolStepOutput])
    assert back == value and back.output == output
