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

Where payloads are encrypted (``client.encryption``), two things change:

* a value built as :class:`Shown` — a summary, details, the current details the Temporal UI shows without a
  codec — carries ``SHOWN_METADATA`` in its payload, and the encrypting codec leaves it readable (what it
  may say is ``workflows.story``'s business: names, stages, ids and counts, no request text unless the
  deployment allows it); every other payload is encrypted;
* the encrypting failure converter (:class:`EncryptingFailureConverter`) moves every failure's message
  and stack trace into its encoded attributes, which the codec encrypts: a tool's error that quotes its
  arguments is not readable in the history. What stays readable is the failure's type
  (``RequiredAfterPlanningError``), never its reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, ClassVar

import pydantic
import temporalio.api.common.v1
from temporalio.api.failure.v1 import Failure
from temporalio.api.sdk.v1 import WorkflowMetadata
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
# Payload metadata of a value the Temporal UI shows without a codec (see ``Shown``): the encrypting codec
# leaves such a payload readable.
SHOWN_METADATA = "agent-shown"


# What an encrypted payload says of itself (``client.encryption``): its encoding and its key's id.
ENCRYPTED_ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"


class EncryptedPayloadError(RuntimeError):
    """An encrypted payload reached a converter without the codec that decrypts it: a process of the
    deployment without its keys. Not the sender's fault, so never a typed failure of the request: the task
    that met it fails and is retried until a process with the keys takes it."""

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"a payload encrypted with key {key_id!r} reached a process without encryption keys: set "
            "AGENT_ENCRYPTION_KEYS_FILE (or AGENT_ENCRYPTION_KEYS) as the deployment's other processes do"
        )


class Shown(str):
    """Text the Temporal UI shows without a codec: a summary, details, a memo value. Its payload is marked
    ``SHOWN_METADATA`` and is never encrypted, so build one only from what may be read without the keys
    (``workflows.story`` decides what that is); a plain ``str`` in its place is encrypted like any payload."""

    __slots__ = ()


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
        if payload is not None and isinstance(value, Shown):
            payload.metadata[SHOWN_METADATA] = b"true"
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

    def to_payloads(self, values: Sequence[Any]) -> list[temporalio.api.common.v1.Payload]:
        payloads = super().to_payloads(values)
        for value, payload in zip(values, payloads, strict=False):
            # The answer to the UI's metadata query: the workflow's current details (``Shown`` text) and
            # the names of its handlers.
            if isinstance(value, WorkflowMetadata):
                payload.metadata[SHOWN_METADATA] = b"true"
        return payloads

    def from_payloads(
        self, payloads: Sequence[temporalio.api.common.v1.Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        hints: list[type | None] = list(type_hints or [])
        hints += [None] * (len(payloads) - len(hints))
        return [self._from_payload(payload, hint) for payload, hint in zip(payloads, hints, strict=True)]

    def _from_payload(self, payload: temporalio.api.common.v1.Payload, hint: type | None) -> Any:
        if payload.metadata.get("encoding") == ENCRYPTED_ENCODING:
            raise EncryptedPayloadError(payload.metadata.get(KEY_ID_METADATA, b"").decode("utf-8", "replace"))
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


# Whether a failure converter call is converting the cause of another (the outermost call encrypts the chain).
_converting_cause: ContextVar[bool] = ContextVar("converting_cause", default=False)
ENCODED_FAILURE_MESSAGE = "Encoded failure"  # what the SDK's own encoding shows, for a failure without a type


class LifecycleFailureConverter(DefaultFailureConverter):
    """Expected failures headed by their type and without stack traces (see the module docstring)."""

    encrypts: ClassVar[bool] = False

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        outermost = not _converting_cause.get()
        token = _converting_cause.set(True)
        try:
            super().to_failure(exception, payload_converter, failure)
        finally:
            _converting_cause.reset(token)
        if is_expected(exception):
            prefix = f"{failure.application_failure_info.type}: "
            if not failure.message.startswith(prefix):
                failure.message = prefix + failure.message
            cause: Failure | None = failure
            while cause is not None:
                cause.stack_trace = ""
                cause = cause.cause if cause.HasField("cause") else None
        if outermost and self.encrypts:
            _encode_chain(failure, payload_converter)

    def from_failure(self, failure: Failure, payload_converter: PayloadConverter) -> BaseException:
        if failure.HasField("encoded_attributes"):
            failure = _decoded(failure, payload_converter)
        prefix = f"{failure.application_failure_info.type}: "
        if failure.HasField("application_failure_info") and prefix != ": " and failure.message.startswith(prefix):
            headed, failure = failure, Failure()
            failure.CopyFrom(headed)
            failure.message = headed.message.removeprefix(prefix)
        return super().from_failure(failure, payload_converter)


class EncryptingFailureConverter(LifecycleFailureConverter):
    """:class:`LifecycleFailureConverter` whose failures keep their message and stack trace in their
    encoded attributes (which the codec encrypts); the readable message is the failure's type."""

    encrypts = True


def _encode_chain(failure: Failure, payload_converter: PayloadConverter) -> None:
    """Move each message and stack trace of the chain into its encoded attributes. A failure whose type
    names it (an ``ApplicationError``) keeps its type as its readable message; the fixed messages the SDK
    gives an activity's or a child's failure stay; any other says ``Encoded failure``."""
    level: Failure | None = failure
    while level is not None:
        if not level.HasField("encoded_attributes"):
            level.encoded_attributes.CopyFrom(
                payload_converter.to_payloads([{"message": level.message, "stack_trace": level.stack_trace}])[0]
            )
            kind = level.WhichOneof("failure_info")
            if kind == "application_failure_info":
                level.message = level.application_failure_info.type or ENCODED_FAILURE_MESSAGE
            elif kind not in ("activity_failure_info", "child_workflow_execution_failure_info"):
                level.message = ENCODED_FAILURE_MESSAGE
            level.stack_trace = ""
        level = level.cause if level.HasField("cause") else None


def _decoded(failure: Failure, payload_converter: PayloadConverter) -> Failure:
    """A copy of ``failure`` with the message and stack trace its encoded attributes hold put back."""
    decoded = Failure()
    decoded.CopyFrom(failure)
    decoded.ClearField("encoded_attributes")
    try:
        [attributes] = payload_converter.from_payloads([failure.encoded_attributes])
    except Exception:  # noqa: BLE001 - attributes this process cannot read: the failure as it stands
        return decoded
    if isinstance(attributes, dict):
        if isinstance(attributes.get("message"), str):
            decoded.message = attributes["message"]
        if isinstance(attributes.get("stack_trace"), str):
            decoded.stack_trace = attributes["stack_trace"]
    return decoded


data_converter = DataConverter(
    payload_converter_class=LifecyclePayloadConverter, failure_converter_class=LifecycleFailureConverter
)
