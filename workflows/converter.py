"""The data converter every client and worker of this project uses.

It is Temporal's pydantic converter with one change: a payload that does not validate against its model
raises a non-retryable ``ApplicationError`` instead of a plain exception. For a workflow input that
fails the execution with a typed error (``InvalidRequest`` for ``RequestInput``) rather than failing the
workflow task and retrying it forever.
"""

from __future__ import annotations

from typing import Any

import pydantic
import temporalio.api.common.v1
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, DefaultPayloadConverter, JSONPlainPayloadConverter
from temporalio.exceptions import ApplicationError

MAX_REPORTED_ERRORS = 5


class _ValidatingJSONConverter(PydanticJSONPlainPayloadConverter):
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


class LifecyclePayloadConverter(CompositePayloadConverter):
    def __init__(self) -> None:
        json_converter = _ValidatingJSONConverter()
        super().__init__(
            *(
                json_converter if isinstance(c, JSONPlainPayloadConverter) else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


data_converter = DataConverter(payload_converter_class=LifecyclePayloadConverter)
