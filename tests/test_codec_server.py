"""``agent-lifecycle codec-server`` over HTTP on loopback, as the Temporal Web UI calls it: a plan the
worker stored by reference comes back decoded — resolved from the payload store even when the UI asks to
preserve storage references, decrypted where the deployment encrypts — with every secret the redaction
set matches masked; ``/encode`` encrypts as the clients do. It answers only a caller with a bearer token
(the shared token, or a valid JWT of the configured issuer and audience), CORS only to the configured UI
origin (never credentialed), only under its own host names, and reads no body over its limit."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from client import Settings, process_data_converter
from client.codec import Access, Codec, mask_payload, serve, storage_reference
from client.codec_auth import BearerAuth, JwtVerifier, load_jwks
from client.encryption import ENCODING
from client.settings import CodecServerSettings
from demo.screenshots import free_port

from .conftest import with_payload_store
from .doubles import FixedPlanner
from .harness import Harness
from .jwt_tokens import AUDIENCE, ISSUER, IdentityProvider
from .test_tool_hooks import Echo, step

SECRET = "sk-" + "codec" * 5
CARD = "4111 1111 1111 1111"
# Thirty more steps: the plan is over 2 KiB, so the worker stores it by reference.
STEPS = [step(f"pad-{n:02}", Echo, text=f"padding text number {n:02}") for n in range(30)]
TOKEN = "codec-test-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UI = "http://127.0.0.1:8233"
KEYS = "k1=" + base64.b64encode(b"\x01" * 32).decode()


def access(**options) -> Access:
    return Access(BearerAuth(token=TOKEN), origins=frozenset({UI}), **options)


@contextlib.asynccontextmanager
async def codec_server(codec: Codec, allowed: Access | None = None) -> AsyncIterator[str]:
    port = free_port()
    task = asyncio.create_task(serve(codec, "127.0.0.1", port, allowed or access()))
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(100):
                with contextlib.suppress(httpx.TransportError):
                    await http.post(f"{base}/encode", json={"payloads": []})
                    break
                await asyncio.sleep(0.05)
        yield base
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def encrypting(client: Client, state_dir) -> tuple[Client, Settings]:
    """``client`` on the same connection with the data converter of an encrypting deployment on ``state_dir``."""
    settings = Settings(state_dir=state_dir, protection={"keys": KEYS})
    converter = process_data_converter(settings)
    return Client(
        client.service_client, namespace=client.namespace, data_converter=converter, interceptors=[TracingInterceptor()]
    ), settings


def plan_result(history) -> Payload:
    """The ``plan`` activity's result payload as the history holds it."""
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "plan"
    }
    [completed] = [
        e.activity_task_completed_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
    ]
    return completed.result.payloads[0]


async def test_the_ui_reads_a_plan_stored_by_reference_decoded_and_masked(client, tmp_path):
    client = with_payload_store(client, tmp_path)
    planner = FixedPlanner(step("say", Echo, text=f"key {SECRET}"), *STEPS)
    async with Harness(client, tmp_path, tools=[Echo()], planner=planner) as h:
        out = await h.run("say it", {"cache": "bypass"})
    assert out.failure is None, out.failure
    stored = plan_result(out.stored_history)
    assert stored.metadata["encoding"] == b"json/protobuf" and b"padding" not in stored.data  # a reference

    codec = Codec(process_data_converter(Settings(state_dir=tmp_path)).external_storage)
    request = {"payloads": [json_format.MessageToDict(stored)]}
    async with codec_server(codec) as base, httpx.AsyncClient() as http:
        answers = [
            await http.post(f"{base}/decode{query}", json=request, headers={"X-Namespace": "default", **AUTH})
            for query in ("", "?preserveStorageRefs=true")
        ]
        for answer in answers:
            assert answer.status_code == 200, answer.text
            [decoded] = json_format.Parse(answer.text, Payloads()).payloads
            assert decoded.metadata["encoding"] == b"json/plain"
            plan = json.loads(decoded.data)
            steps = (plan["plan"] if "plan" in plan else plan)["steps"]
            assert len(steps) == 31 and steps[0]["arguments"]["text"] == "key [REDACTED]"
            assert SECRET not in answer.text and SECRET.encode() not in decoded.data

        # What the UI sends a workflow comes back as given (this deployment encrypts nothing).
        sent = Payload(metadata={"encoding": b"json/plain"}, data=b'{"reviewer":"alice"}')
        encoded = await http.post(f"{base}/encode", json={"payloads": [json_format.MessageToDict(sent)]}, headers=AUTH)
        assert json_format.Parse(encoded.text, Payloads()).payloads == [sent]

        bad = await http.post(f"{base}/decode", content=b"not json", headers=AUTH)
        assert bad.status_code == 400


async def test_references_resolve_in_either_form_the_sdk_writes_and_an_unknown_driver_is_named(client, tmp_path):
    client = with_payload_store(client, tmp_path)
    planner = FixedPlanner(step("say", Echo, text="hello"), *STEPS)
    async with Harness(client, tmp_path, tools=[Echo()], planner=planner) as h:
        out = await h.run("say it", {"cache": "bypass"})
    assert out.failure is None, out.failure
    stored = plan_result(out.stored_history)
    name, claim = storage_reference(stored) or pytest.fail("the plan was not stored by reference")
    codec = Codec(process_data_converter(Settings(state_dir=tmp_path)).external_storage)
    [as_written] = await codec.decode([stored])
    assert b"padding text number 29" in as_written.data

    # The form from before the reference message: the same driver and claim, as a JSON object.
    earlier = Payload(
        metadata={"encoding": b"json/external-storage-reference"},
        data=json.dumps({"driver_name": name, "driver_claim": {"claim_data": dict(claim.claim_data)}}).encode(),
    )
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"not a reference"')
    assert await codec.decode([earlier, plain, stored]) == [as_written, plain, as_written]

    # A reference to a driver this deployment does not have: the UI is told which.
    elsewhere = Payload()
    elsewhere.CopyFrom(stored)
    elsewhere.data = stored.data.replace(name.encode(), b"s3-archive")
    async with codec_server(codec) as base, httpx.AsyncClient() as http:
        answer = await http.post(
            f"{base}/decode", json={"payloads": [json_format.MessageToDict(elsewhere)]}, headers=AUTH
        )
    assert answer.status_code == 500 and "s3-archive" in answer.text


@pytest.mark.parametrize(
    ("encoding", "data", "expected"),
    [
        (b"json/plain", json.dumps({"k": f"x {SECRET}", SECRET: [SECRET]}).encode(), None),
        (b"binary/plain", f"raw {SECRET}".encode(), b"raw [REDACTED]"),
        (b"binary/plain", b"\xff\xfe " + SECRET.encode(), b"\xff\xfe [REDACTED]"),
    ],
)
def test_every_payload_is_masked_whatever_its_encoding(encoding, data, expected):
    masked = mask_payload(Payload(metadata={"encoding": encoding}, data=data))
    assert SECRET.encode() not in masked.data
    if expected is not None:
        assert masked.data == expected
    else:
        assert json.loads(masked.data) == {"k": "x [REDACTED]", "[REDACTED]": ["[REDACTED]"]}


async def test_an_encrypted_plan_is_ciphertext_in_the_store_and_decrypted_and_masked_for_the_ui(client, tmp_path):
    client, settings = encrypting(client, tmp_path)
    planner = FixedPlanner(step("say", Echo, text=f"card {CARD}"), *STEPS)
    async with Harness(client, tmp_path, tools=[Echo()], planner=planner) as h:
        out = await h.run("say it", {"cache": "bypass"})
    assert out.failure is None, out.failure
    stored = plan_result(out.stored_history)
    name, claim = storage_reference(stored) or pytest.fail("the plan was not stored by reference")
    [kept] = await process_data_converter(settings).external_storage.drivers[0].retrieve(None, [claim])  # type: ignore[union-attr, arg-type]
    assert kept.metadata["encoding"] == ENCODING and b"padding" not in kept.data  # ciphertext in the store too
    store_bytes = (tmp_path / "payloads.sqlite3").read_bytes()
    assert b"padding text" not in store_bytes and CARD.encode() not in store_bytes

    async with codec_server(Codec.of(process_data_converter(settings))) as base, httpx.AsyncClient() as http:
        answer = await http.post(f"{base}/decode", json={"payloads": [json_format.MessageToDict(stored)]}, headers=AUTH)
        assert answer.status_code == 200, answer.text
        [decoded] = json_format.Parse(answer.text, Payloads()).payloads
        plan = json.loads(decoded.data)
        steps = (plan["plan"] if "plan" in plan else plan)["steps"]
        assert steps[0]["arguments"]["text"] == "card [REDACTED]" and len(steps) == 31

        # What the UI sends a workflow is encrypted as the clients encrypt it, and decodes back.
        sent = Payload(metadata={"encoding": b"json/plain"}, data=b'{"reviewer":"alice"}')
        encoded = await http.post(f"{base}/encode", json={"payloads": [json_format.MessageToDict(sent)]}, headers=AUTH)
        [sealed] = json_format.Parse(encoded.text, Payloads()).payloads
        assert sealed.metadata["encoding"] == ENCODING and b"alice" not in sealed.data
        back = await http.post(f"{base}/decode", json={"payloads": [json_format.MessageToDict(sealed)]}, headers=AUTH)
        assert json_format.Parse(back.text, Payloads()).payloads == [sent]

        # A payload of a key the server does not have: the UI is told which key.
        foreign = Payload()
        foreign.CopyFrom(sealed)
        foreign.metadata["encryption-key-id"] = b"k-retired"
        lost = await http.post(f"{base}/decode", json={"payloads": [json_format.MessageToDict(foreign)]}, headers=AUTH)
        assert lost.status_code == 500 and "'k-retired'" in lost.text


async def test_only_a_caller_with_a_token_from_the_ui_origin_under_a_known_host_is_answered(tmp_path):
    idp = IdentityProvider()
    verifier = JwtVerifier(load_jwks(idp.write_jwks(tmp_path / "jwks.json")), AUDIENCE, ISSUER)
    allowed = Access(BearerAuth(token=TOKEN, jwt=verifier), origins=frozenset({UI}), max_body_bytes=4096)
    sealed = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps({"card": CARD}).encode())
    body = {"payloads": [json_format.MessageToDict(sealed)]}
    async with codec_server(Codec(None), allowed) as base, httpx.AsyncClient() as http:

        async def decode(headers: dict[str, str], **options) -> httpx.Response:
            return await http.post(f"{base}/decode", json=body, headers=headers, **options)

        ok = await decode(AUTH)
        assert ok.status_code == 200 and CARD not in ok.text  # answered, and masked
        assert (await decode({"Authorization": f"Bearer {idp.token('ES256')}"})).status_code == 200

        refused = {
            "no token": await decode({}),
            "another scheme": await decode({"Authorization": f"Basic {TOKEN}"}),
            "a wrong token": await decode({"Authorization": "Bearer " + "y" * 40}),
            "an expired JWT": await decode({"Authorization": f"Bearer {idp.token(lifetime=-600)}"}),
            "a JWT for another audience": await decode({"Authorization": f"Bearer {idp.token(aud='other')}"}),
            "a JWT from another provider": await decode({"Authorization": f"Bearer {IdentityProvider().token()}"}),
        }
        for why, answer in refused.items():
            assert answer.status_code == 401, why
            assert answer.headers["www-authenticate"] == "Bearer" and CARD not in answer.text
        assert "expired" in refused["an expired JWT"].text

        # A browser page of another origin: refused outright, token or not, preflight or call; no CORS.
        for origin in ("https://evil.example", "http://127.0.0.1:9999", "null"):
            call = await decode({**AUTH, "Origin": origin})
            preflight = await http.options(
                f"{base}/decode", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
            )
            for answer in (call, preflight):
                assert answer.status_code == 403, origin
                assert "access-control-allow-origin" not in answer.headers

        # The UI's origin: its preflight is answered (without credentials), and so is its call with a token.
        preflight = await http.options(
            f"{base}/decode",
            headers={
                "Origin": UI,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type,x-namespace",
            },
        )
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == UI
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        assert "access-control-allow-credentials" not in preflight.headers
        called = await decode({**AUTH, "Origin": UI})
        assert called.status_code == 200 and called.headers["access-control-allow-origin"] == UI
        assert (await decode({"Origin": UI})).status_code == 401  # the origin is no credential

        # A name it is not known by (a DNS name rebound to loopback): refused before anything else.
        for host in ("evil.example", "evil.example:8888", "127.0.0.2", ""):
            answer = await decode({**AUTH, "Host": host})
            assert answer.status_code == 400, host
        assert (await decode({**AUTH, "Host": "localhost"})).status_code == 200

        # A body over the limit: refused whether it says its length or not.
        big = {"payloads": [{"metadata": {"encoding": "YmluYXJ5L3BsYWlu"}, "data": "A" * 5000}]}
        assert (await http.post(f"{base}/decode", json=big, headers=AUTH)).status_code == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        streamed = await http.post(
            f"{base}/decode", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
        )
        assert streamed.status_code == 413
        unauthenticated_big = await http.post(f"{base}/decode", json=big)
        assert unauthenticated_big.status_code == 401  # nobody without a token gets its body read

        assert (await http.get(f"{base}/decode", headers=AUTH)).status_code == 405


def test_a_server_beyond_loopback_needs_its_names_and_every_server_a_credential():
    settings = CodecServerSettings(token=TOKEN)
    with pytest.raises(ValueError, match="AGENT_CODEC_ALLOWED_HOSTS"):
        Access.from_settings(settings, "0.0.0.0")
    exposed = Access.from_settings(
        CodecServerSettings(
            token=TOKEN, allowed_hosts=["codec.example.com"], allowed_origins=["https://ui.example.com"]
        ),
        "0.0.0.0",
    )
    assert exposed.host_allowed("codec.example.com:443") and not exposed.host_allowed("127.0.0.1:8888")
    assert exposed.origins == frozenset({"https://ui.example.com"})
    local = Access.from_settings(settings, "127.0.0.1", ["http://localhost:8233"])
    assert local.host_allowed("127.0.0.1:8888") and local.host_allowed("[::1]:8888") and local.host_allowed("localhost")
    assert not local.host_allowed("localhost.evil.example")
    with pytest.raises(ValueError, match="AGENT_CODEC_TOKEN or AGENT_CODEC_JWKS_FILE"):
        Access.from_settings(CodecServerSettings(), "127.0.0.1")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "AGENT_CODEC_TOKEN or AGENT_CODEC_JWKS_FILE"),
        (["--host", "0.0.0.0"], {"AGENT_CODEC_TOKEN": TOKEN}, "AGENT_CODEC_ALLOWED_HOSTS"),
        ([], {"AGENT_CODEC_TOKEN": "short"}, "AGENT_CODEC_TOKEN: too short"),
        (["--allow-origin", "*"], {"AGENT_CODEC_TOKEN": TOKEN}, "not an origin"),
    ],
)
def test_the_cli_will_not_start_a_codec_server_that_would_serve_anyone(tmp_path, args, env, message):
    import subprocess
    import sys
    from pathlib import Path

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "TEMPORAL_"))}
    done = subprocess.run(
        [sys.executable, "-m", "client.cli", "codec-server", "--port", str(free_port()), *args],
        cwd=Path(__file__).parent.parent,
        env={**clean, "AGENT_STATE_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert TOKEN not in done.stderr
