"""The data converter every client and worker of this project uses.

It is Temporal's pydantic converter with two changes, both so that what arrives from outside can never
fail a workflow task (which Temporal retries forever) instead of ending in a typed outcome:

* a payload that does not decode into its declared type — wrong fields, invalid JSON, another
  encoding — raises a non-retryable ``ApplicationError`` (``InvalidRequest`` for ``RequestInput``);
* a payload decoded without a declared type (the workflow's own entry points take their arguments
  untyped and validate them themselves) that cannot be decoded at all comes back as a ``RawValue``
  rather than raising, so the workflow can refuse it with a reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pydantic
import temporalio.api.common.v1
from temporalio.common import RawValue
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    EncodingPayloadConverter,
    JSONPlainPayloadConverter,
)
from temporalio.exceptions import ApplicationError

MAX_REPORTED_ERRORS = 5


# Payload metadata that marks an activity input or result the payload store may take by reference:
# ``reference`` (from a small size) or ``marker`` (a local activity's result: only when large).
BY_REFERENCE_METADATA = "agent-by-reference"


class _ValidatingJSONConverter(PydanticJSONPlainPayloadConverter):
    def to_payload(self, value: Any) -> temporalio.api.common.v1.Payload | None:
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
    """The SDK's encodings, JSON replaced by the validating converter; built once per process."""
    json_converter = _ValidatingJSONConverter()
    return tuple(
        json_converter if isinstance(c, JSONPlainPayloadConverter) else c
        for c in DefaultPayloadConverter.default_encoding_payload_converters
    )


class LifecyclePayloadConverter(CompositePayloadConverter):
    # The SDK builds a new payload converter each time it binds a payload-store context to the data
    # converter — several times per activity. The encoding converters hold no per-use state, so every
    # instance shares one set of them, and with it one cache of pydantic type adapters: a fresh set would
    # rebuild the adapter of every model it decodes (a large share of a local activity's cost).
    _shared: ClassVar[tuple[EncodingPayloadConverter, ...] | None] = None

    def __init__(self) -> None:
        if LifecyclePayloadConverter._shared is None:
            LifecyclePayloadConverter._shared = _encoding_converters()
        super().__init__(*LifecyclePayloadConverter._shared)

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


data_converter = DataConverter(payload_converter_class=LifecyclePayloadConverter)
