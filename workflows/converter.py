"""The data converter every client and worker of this project uses.

It is Temporal's pydantic converter with two changes, both so that what arrives from outside can never
fail a workflow task (which Temporal retries forever) instead of ending in a typed outcome:

* a payload that does not decode into its declared type — wrong fields, invalid JSON, another
  encoding — raises a non-retryable ``ApplicationError`` (``InvalidRequest`` for ``RequestInput``);
* a payload decoded without a declared type (the workflow's own entry points take their arguments
  untyped and validate them themselves) that cannot be decoded at all comes back as a ``RawValue``
  rather than raising, so the workflow can refuse it with a reason.

Its failure converter presents expected failures for operators: a non-retryable ``ApplicationError``
with a type is a decision (a refused plan, a rejected checkpoint, an invalid request), not a bug, so its
failure carries no stack trace (none of the worker's paths) and its message starts with its type —
``RequiredAfterPlanningError: <reason>`` is the first line the Temporal UI and CLI show. Decoding takes
the type back off, so code that reads the error sees the message it was raised with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic
import temporalio.api.common.v1
from temporalio.api.failure.v1 import Failure
from temporalio.common import RawValue
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultFailureConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    JSONPlainPayloadConverter,
    PayloadConverter,
)
from temporalio.exceptions import ApplicationError

MAX_REPORTED_ERRORS = 5


# Payload metadata that marks an activity input or result the payload store may take by reference:
# ``reference`` (from a small size) or ``marker`` (a local activity's result: only when large).
BY_REFERENCE_METADATA = "agent-by-reference"


class _ValidatingJSONConverter(PydanticJSONPlainPayloadConverter):
    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
        if getattr(value, "defaults_omitted", False) and isinstance(value, pydantic.BaseModel):  # see ByReference
            data = type(value).__pydantic_serializer__.to_json(value, exclude_defaults=True)
            payload = temporalio.api.common.v1.Payload(metadata={"encoding": self.encoding.encode()}, data=data)
        else:
            payload = super().to_payload(value)
        placement = getattr(value, "payload_placement", "inline")  # see ByReference
        if payload is not None and placement != "inline":
            payload.metadata[BY_REFERENCE_METADATA] = placement.encode()
        return payload

    def from_payload(self, payload: temporalio.api.common.v1.Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except pydantic.ValidationError as err:
            error_type = getattr(type_hint, "invalid_payload_type", "InvalidPayload")
            problems = [
                {"loc": ".".join(str(p) for p in e["loc"]) or "(root)", "msg": e["msg"]}
                for e in err.errors(include_url=False)[:MAX_REPORTED_ERRORS]
            ]
            summary = "; ".join(f"{p['loc']}: {p['msg']}" for p in problems)
            name = getattr(type_hint, "__name__", "payload")
            raise ApplicationError(
                f"invalid {name}: {summary}", {"errors": problems}, type=error_type, non_retryable=True
            ) from None


def _encoding_converters() -> tuple[EncodingPayloadConverter, ...]:
    """The SDK's encodings, JSON replaced by the validating converter."""
    json_converter = _ValidatingJSONConverter()
    return tuple(
        json_converter if isinstance(c, JSONPlainPayloadConverter) else c
        for c in DefaultPayloadConverter.default_encoding_payload_converters
    )


# The SDK builds a new payload converter each time it binds a payload-store context to the data converter
# — several times per activity. The encoding converters hold no per-use state, so every instance shares
# these, and with them one cache of pydantic type adapters: a fresh set would rebuild the adapter of every
# model it decodes (a large share of a local activity's cost).
_ENCODINGS = _encoding_converters()


class LifecyclePayloadConverter(CompositePayloadConverter):
    def __init__(self) -> None:
        super().__init__(*_ENCODINGS)

    def from_payloads(
        self, payloads: Sequence[temporalio.api.common.v1.Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        hints: list[type | None] = list(type_hints or [])
        hints += [None] * (len(payloads) - len(hints))
        return [self._from_payload(payload, hint) for payload, hint in zip(payloads, hints, strict=True)]

    def _from_payload(self, payload: temporalio.api.common.v1.Payload, hint: type | None) -> Any:
        try:
            return super().from_payloads([payload], [hint] if hint is not None else None)[0]
        except Exception as err:  # an unknown encoding, bytes that are not what the encoding says, ...
            if hint is None:
                return RawValue(payload)
            if isinstance(err, ApplicationError):
                raise
            name = getattr(hint, "__name__", "payload")
            raise ApplicationError(
                f"invalid {name}: {err}",
                type=getattr(hint, "invalid_payload_type", "InvalidPayload"),
                non_retryable=True,
            ) from None


def is_expected(exception: BaseException) -> bool:
    """A typed, non-retryable application error: a failure the code decided on, not a crash."""
    return isinstance(exception, ApplicationError) and bool(exception.type) and exception.non_retryable


class LifecycleFailureConverter(DefaultFailureConverter):
    """Expected failures headed by their type and without stack traces (see the module docstring)."""

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        if not is_expected(exception):
            return
        prefix = f"{failure.application_failure_info.type}: "
        if not failure.message.startswith(prefix):
            failure.message = prefix + failure.message
        cause: Failure | None = failure
        while cause is not None:
            cause.stack_trace = ""
            cause = cause.cause if cause.HasField("cause") else None

    def from_failure(self, failure: Failure, payload_converter: PayloadConverter) -> BaseException:
        prefix = f"{failure.application_failure_info.type}: "
        if failure.HasField("application_failure_info") and prefix != ": " and failure.message.startswith(prefix):
            headed, failure = failure, Failure()
            failure.CopyFrom(headed)
            failure.message = headed.message.removeprefix(prefix)
        return super().from_failure(failure, payload_converter)


data_converter = DataConverter(
    payload_converter_class=LifecyclePayloadConverter, failure_converter_class=LifecycleFailureConverter
)
