"""``agent-lifecycle codec-server``: Temporal's remote codec protocol for the Web UI (and ``temporal``
CLI's ``--codec-endpoint``), so an operator reads every payload of a request — the plan, a tool's input
and output — including those stored by reference in the payload store.

    agent-lifecycle codec-server                          # http://127.0.0.1:8888
    agent-lifecycle codec-server --port 9000 --host 127.0.0.1 --allow-origin http://ui.example:8080

The protocol: ``POST /decode`` and ``POST /encode`` with the JSON form of ``temporal.api.common.v1.Payloads``
(``{"payloads": [{"metadata": {...}, "data": "<base64>"}]}``), answered in the same form, with CORS for
the UI's origin. ``/decode`` resolves each payload stored by reference (the UI asks with
``?preserveStorageRefs=true``, and would otherwise show a download button: the reference is resolved here
whatever it asks) and masks it as the request's summaries and details are masked: every match of the
common secret patterns (``workflows.masking``) in every text it carries is ``[REDACTED]``, so the UI never
shows a secret those patterns mask. ``/encode`` (what the UI sends a workflow: a signal's or update's input)
returns the payloads as given: this project's payloads carry no encoding of their own.

The server reads the payload store the deployment's workers write (``AGENT_DATABASE_URL``, else the SQLite
file in the state directory); bind it to loopback, or put it behind the same access control as the UI:
what it decodes is what the requests carried (masked).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference
from temporalio.converter import ExternalStorage, StorageDriverClaim, StorageDriverRetrieveContext

from workflows.masking import redact

DEFAULT_PORT = 8888
DEFAULT_HOST = "127.0.0.1"
_JSON_ENCODINGS = (b"json/plain", b"json/protobuf")
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# How the SDK writes a payload stored by reference: the JSON form of an ``ExternalStorageReference``
# (the driver's name and its claim), and, from before that message existed, a JSON object of its own.
_REFERENCE_TYPE = ExternalStorageReference.DESCRIPTOR.full_name.encode()
_EARLIER_REFERENCE_ENCODING = b"json/external-storage-reference"


def _masked_json(value: Any) -> Any:
    """``value`` with every string in it (keys too) masked."""
    if isinstance(value, str):
        return redact(value)[0]
    if isinstance(value, list):
        return [_masked_json(v) for v in value]
    if isinstance(value, dict):
        return {redact(k)[0] if isinstance(k, str) else k: _masked_json(v) for k, v in value.items()}
    return value


def mask_payload(payload: Payload) -> Payload:
    """A copy of ``payload`` with every secret the common patterns match masked: a JSON payload's every
    string, any other payload's bytes as text (a binary one byte for byte, so it stays what it was)."""
    masked = Payload()
    masked.CopyFrom(payload)
    encoding = payload.metadata.get("encoding", b"")
    if encoding in _JSON_ENCODINGS:
        try:
            value = json.loads(payload.data)
        except ValueError:
            pass
        else:
            masked.data = json.dumps(_masked_json(value), ensure_ascii=False, separators=(",", ":")).encode()
            return masked
    try:
        masked.data = redact(payload.data.decode())[0].encode()
    except UnicodeDecodeError:
        masked.data = redact(payload.data.decode("latin-1"))[0].encode("latin-1")
    return masked


class Codec:
    """What the endpoints do, apart from HTTP: ``storage`` resolves payloads stored by reference (None:
    the deployment keeps every payload inline)."""

    def __init__(self, storage: ExternalStorage | None) -> None:
        self._storage = storage

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Each payload resolved from the payload store where it is a reference, then masked."""
        resolved = list(payloads)
        if self._storage is not None and resolved:
            resolved = await resolve_references(self._storage, resolved)
        return [mask_payload(p) for p in resolved]

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


async def resolve_references(storage: ExternalStorage, payloads: list[Payload]) -> list[Payload]:
    """``payloads`` with each reference replaced by what the driver it names reads for its claim (one
    call per driver), as a worker resolves it; a payload that is no reference stays as it is. A
    reference to a driver this deployment does not have is a ``ValueError``."""
    drivers = {driver.name(): driver for driver in storage.drivers}
    claims: dict[str, list[tuple[int, StorageDriverClaim]]] = {}
    for index, payload in enumerate(payloads):
        reference = storage_reference(payload)
        if reference is None:
            continue
        name, claim = reference
        if name not in drivers:
            raise ValueError(f"a payload is stored by the driver {name!r}, which this deployment does not have")
        claims.setdefault(name, []).append((index, claim))
    resolved = list(payloads)
    for name, indexed in claims.items():
        stored = await drivers[name].retrieve(StorageDriverRetrieveContext(), [claim for _, claim in indexed])
        if len(stored) != len(indexed):
            raise ValueError(f"the driver {name!r} returned {len(stored)} payloads for {len(indexed)} claims")
        for (index, _), payload in zip(indexed, stored, strict=True):
            resolved[index] = payload
    return resolved


def storage_reference(payload: Payload) -> tuple[str, StorageDriverClaim] | None:
    """The driver's name and claim of a payload stored by reference; None for any other payload."""
    encoding = payload.metadata.get("encoding", b"")
    try:
        if encoding == b"json/protobuf" and payload.metadata.get("messageType") == _REFERENCE_TYPE:
            reference = json_format.Parse(payload.data, ExternalStorageReference(), ignore_unknown_fields=True)
            return reference.driver_name, StorageDriverClaim(claim_data=dict(reference.claim_data))
        if encoding == _EARLIER_REFERENCE_ENCODING:
            earlier = json.loads(payload.data)
            claim = earlier["driver_claim"]["claim_data"]
            return str(earlier["driver_name"]), StorageDriverClaim(
                claim_data={str(k): str(v) for k, v in claim.items()}
            )
    except (ValueError, KeyError, TypeError, AttributeError, json_format.ParseError):
        return None
    return None


def loopback_origin(origin: str) -> bool:
    """Whether a browser origin is a page served from this machine (the dev server's UI)."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and (parts.hostname or "") in _LOOPBACK


def app(codec: Codec, allowed_origins: Sequence[str] = ()) -> Any:
    """The ASGI application: the two endpoints, with CORS for the UI's origin — ``allowed_origins``, and
    any page served from this machine."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    allowed = set(allowed_origins)

    def cors(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin", "")
        if not origin or not (origin in allowed or "*" in allowed or loopback_origin(origin)):
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Credentials": "true",
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": request.headers.get(
                "access-control-request-headers", "content-type, x-namespace, authorization"
            ),
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        }

    def endpoint(convert: Any) -> Any:
        async def handle(request: Request) -> Response:
            headers = cors(request)
            if request.method == "OPTIONS":
                return Response(status_code=204, headers=headers)
            try:
                body = Payloads()
                json_format.Parse(await request.body() or b"{}", body, ignore_unknown_fields=True)
            except json_format.ParseError as err:
                return Response(f"invalid payloads: {err}", status_code=400, headers=headers)
            try:
                converted = await convert(list(body.payloads))
            except Exception as err:  # noqa: BLE001 - a reference the store cannot resolve: say so
                return Response(f"cannot decode: {err}", status_code=500, headers=headers)
            text = json_format.MessageToJson(Payloads(payloads=converted))
            return Response(text, media_type="application/json", headers=headers)

        return handle

    return Starlette(
        routes=[
            Route("/decode", endpoint(codec.decode), methods=["POST", "OPTIONS"]),
            Route("/encode", endpoint(codec.encode), methods=["POST", "OPTIONS"]),
        ]
    )


async def serve(codec: Codec, host: str, port: int, allowed_origins: Sequence[str] = ()) -> None:
    """Serve the endpoints until cancelled."""
    import uvicorn

    config = uvicorn.Config(app(codec, allowed_origins), host=host, port=port, log_level="warning", lifespan="off")
    print(f"codec server on http://{host}:{port} (POST /decode, /encode)", flush=True)
    await uvicorn.Server(config).serve()
