"""``agent-lifecycle codec-server``: Temporal's remote codec protocol for the Web UI (and the ``temporal``
CLI's ``--codec-endpoint``), so an operator reads every payload of a request — the plan, a tool's input
and output — decrypted, including those stored by reference in the payload store, and masked.

    AGENT_CODEC_TOKEN=… agent-lifecycle codec-server                       # http://127.0.0.1:8888
    agent-lifecycle codec-server --port 9000 --allow-origin https://temporal.example.com
    temporal workflow show -w request-1 --codec-endpoint http://127.0.0.1:8888 --codec-auth "Bearer $AGENT_CODEC_TOKEN"

The protocol: ``POST /decode`` and ``POST /encode`` with the JSON form of ``temporal.api.common.v1.Payloads``
(``{"payloads": [{"metadata": {...}, "data": "<base64>"}]}``), answered in the same form. ``/decode``
resolves each payload stored by reference (the UI asks with ``?preserveStorageRefs=true``, and would
otherwise show a download button: the reference is resolved here whatever it asks), decrypts it with the
deployment's keys (``AGENT_ENCRYPTION_KEYS_FILE``), and masks it with the project's redaction set
(``workflows.masking``: every match in every text it carries is ``[REDACTED]``), so the UI never shows a
secret those rules mask. ``/encode`` (what the UI sends a workflow: a signal's or update's input) encrypts
as the deployment's clients do.

It is fit to expose behind the UI, and refuses whatever is not the UI's or an operator's call:

* every request but a CORS preflight needs a bearer token: the shared ``AGENT_CODEC_TOKEN`` (compared in
  constant time), or a JWT signed by a key of ``AGENT_CODEC_JWKS_FILE`` with the configured audience and
  issuer (the UI passes its users' access tokens with ``TEMPORAL_CODEC_PASS_ACCESS_TOKEN=true``); without
  either it does not start;
* CORS answers the configured UI origins only (``AGENT_CODEC_ALLOWED_ORIGINS``, ``--allow-origin``), never
  with credentials; a browser request from any other origin is refused;
* the ``Host`` header must be one of its names (``AGENT_CODEC_ALLOWED_HOSTS``; the loopback names when it
  listens on loopback, and it will not listen elsewhere without them), so a DNS name rebound to its
  address reaches nothing;
* a body over ``AGENT_CODEC_MAX_BODY_BYTES`` (4 MiB) is refused with 413 before it is read.

The server reads the payload store the deployment's workers write (``AGENT_DATABASE_URL``, else the SQLite
file in the state directory) and holds the encryption keys: what it decodes is what the requests carried
(masked), for whoever holds a token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    PayloadCodec,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
)

from workflows.masking import redact

from .codec_auth import AuthError, BearerAuth
from .settings import _origin

if TYPE_CHECKING:
    from .settings import CodecServerSettings

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
    the deployment keeps every payload inline); ``encryption`` decrypts what the deployment encrypted
    (None: it encrypts nothing)."""

    def __init__(self, storage: ExternalStorage | None, encryption: PayloadCodec | None = None) -> None:
        self._storage = storage
        self._encryption = encryption

    @classmethod
    def of(cls, converter: DataConverter) -> Codec:
        """The codec of a process's data converter (``client.process_data_converter``): its payload store
        and its encryption."""
        return cls(converter.external_storage, converter.payload_codec)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Each payload resolved from the payload store where it is a reference, decrypted, then masked."""
        resolved = list(payloads)
        if self._storage is not None and resolved:
            resolved = await resolve_references(self._storage, resolved)
        if self._encryption is not None:
            resolved = await self._encryption.decode(resolved)
        return [mask_payload(p) for p in resolved]

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """What the UI sends a workflow (a signal's or an update's input), encrypted as the deployment's
        clients encrypt it."""
        if self._encryption is not None:
            return await self._encryption.encode(list(payloads))
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


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def loopback(host: str) -> bool:
    return host in _LOOPBACK


@dataclass(frozen=True)
class Access:
    """Who may call the endpoints, from where, and how much they may send.

    Args:
        auth: The bearer tokens accepted (every request but a CORS preflight needs one).
        origins: The Web UI origins a browser may call from (exact; a request from any other is refused).
        hosts: The names a request's ``Host`` header may carry: ``host`` (any port) or ``host:port``.
        max_body_bytes: The largest body read; a larger one is refused with 413.
    """

    auth: BearerAuth
    origins: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset(LOOPBACK_NAMES)
    max_body_bytes: int = 4 * 1024 * 1024

    def host_allowed(self, host: str) -> bool:
        host = host.strip().lower()
        if not host:
            return False
        if host in self.hosts:
            return True
        name = host.split("]", 1)[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
        return name in self.hosts

    @classmethod
    def from_settings(cls, settings: CodecServerSettings, host: str, extra_origins: Sequence[str] = ()) -> Access:
        """The access ``settings`` configure for a server bound to ``host``. Raises ``ValueError`` for a
        server that would serve no one (no token, no JWKS) or that listens beyond loopback without the
        names it is reached by (``AGENT_CODEC_ALLOWED_HOSTS``)."""
        from .codec_auth import JwtVerifier, load_jwks

        jwt = None
        if settings.jwks_file is not None:
            assert settings.jwt_audience and settings.jwt_issuer  # the settings require them together
            jwt = JwtVerifier(load_jwks(settings.jwks_file), settings.jwt_audience, settings.jwt_issuer)
        auth = BearerAuth(token=settings.shared_token(), jwt=jwt)
        hosts = set(settings.allowed_hosts)
        if not hosts:
            if not loopback(host):
                raise ValueError(
                    f"the codec server listens on {host}: set AGENT_CODEC_ALLOWED_HOSTS to the names it is reached "
                    "by (a request under any other Host is refused)"
                )
            hosts = set(LOOPBACK_NAMES)
        origins = {_origin(o) for o in [*settings.allowed_origins, *extra_origins]}
        return cls(auth, frozenset(origins), frozenset(hosts), settings.max_body_bytes)


class _TooLarge(Exception):
    pass


async def _body(request: Any, limit: int) -> bytes:
    """The request's body, refusing one over ``limit`` bytes before reading it where it says its length."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def app(codec: Codec, access: Access) -> Any:
    """The ASGI application: the two endpoints, behind ``access``. In order: a ``Host`` it is not known by
    is refused (400, so a DNS name rebound to this address reaches nothing), a browser request from another
    origin than the UI's (403: no CORS for it, credentialed or not), one without an accepted bearer token
    (401), a body over the limit (413), one that is not payloads (400)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    def cors(origin: str, request: Request) -> dict[str, str]:
        if not origin:
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": "authorization, content-type, x-namespace",
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        }

    def endpoint(convert: Any) -> Any:
        async def handle(request: Request) -> Response:
            if not access.host_allowed(request.headers.get("host", "")):
                return PlainTextResponse("unknown host", status_code=400)
            origin = request.headers.get("origin", "")
            if origin and _origin_or_none(origin) not in access.origins:
                return PlainTextResponse("origin not allowed", status_code=403, headers={"Vary": "Origin"})
            headers = cors(origin, request)
            if request.method == "OPTIONS":
                return Response(status_code=204, headers=headers)
            try:
                access.auth.check(request.headers.get("authorization"))
            except AuthError as err:
                return PlainTextResponse(
                    f"unauthorized: {err}", status_code=401, headers={**headers, "WWW-Authenticate": "Bearer"}
                )
            try:
                raw = await _body(request, access.max_body_bytes)
            except _TooLarge:
                return PlainTextResponse(
                    f"the body is over {access.max_body_bytes} bytes", status_code=413, headers=headers
                )
            try:
                body = Payloads()
                json_format.Parse(raw or b"{}", body, ignore_unknown_fields=True)
            except (json_format.ParseError, UnicodeDecodeError) as err:
                return PlainTextResponse(f"invalid payloads: {err}", status_code=400, headers=headers)
            try:
                converted = await convert(list(body.payloads))
            except Exception as err:  # noqa: BLE001 - a reference the store cannot resolve, a key it lacks: say so
                return PlainTextResponse(f"cannot decode: {err}", status_code=500, headers=headers)
            text = json_format.MessageToJson(Payloads(payloads=converted))
            return Response(text, media_type="application/json", headers=headers)

        return handle

    return Starlette(
        routes=[
            Route("/decode", endpoint(codec.decode), methods=["POST", "OPTIONS"]),
            Route("/encode", endpoint(codec.encode), methods=["POST", "OPTIONS"]),
        ]
    )


def _origin_or_none(origin: str) -> str | None:
    try:
        return _origin(origin)
    except ValueError:
        return None


async def serve(codec: Codec, host: str, port: int, access: Access) -> None:
    """Serve the endpoints until cancelled."""
    import uvicorn

    config = uvicorn.Config(
        app(codec, access),
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        # Only the bind decides who may connect: no proxy's forwarded headers are believed.
        proxy_headers=False,
        server_header=False,
    )
    print(f"codec server on http://{host}:{port} (POST /decode, /encode)", flush=True)
    await uvicorn.Server(config).serve()
