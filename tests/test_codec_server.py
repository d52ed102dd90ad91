"""``agent-lifecycle codec-server`` over HTTP on loopback, as the Temporal Web UI calls it: a plan the
worker stored by reference comes back decoded — resolved from the payload store even when the UI asks to
preserve storage references — with every secret the redaction patterns match masked; ``/encode`` returns
what it is given; CORS answers the UI's origin on this machine and no other."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType

from client import Settings, process_data_converter
from client.codec import Codec, mask_payload, serve, storage_reference
from demo.screenshots import free_port

from .conftest import with_payload_store
from .doubles import FixedPlanner
from .harness import Harness
from .test_tool_hooks import Echo, step

SECRET = "sk-" + "codec" * 5
# Thirty more steps: the plan is over 2 KiB, so the worker stores it by reference.
STEPS = [step(f"pad-{n:02}", Echo, text=f"padding text number {n:02}") for n in range(30)]


@contextlib.asynccontextmanager
async def codec_server(codec: Codec) -> AsyncIterator[str]:
    port = free_port()
    task = asyncio.create_task(serve(codec, "127.0.0.1", port))
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
    stored = plan_result(out.history)
    assert stored.metadata["encoding"] == b"json/protobuf" and b"padding" not in stored.data  # a reference

    codec = Codec(process_data_converter(Settings(state_dir=tmp_path)).external_storage)
    request = {"payloads": [json_format.MessageToDict(stored)]}
    async with codec_server(codec) as base, httpx.AsyncClient() as http:
        answers = [
            await http.post(f"{base}/decode{query}", json=request, headers={"X-Namespace": "default"})
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

        # What the UI sends a workflow comes back as given.
        sent = Payload(metadata={"encoding": b"json/plain"}, data=b'{"reviewer":"alice"}')
        encoded = await http.post(f"{base}/encode", json={"payloads": [json_format.MessageToDict(sent)]})
        assert json_format.Parse(encoded.text, Payloads()).payloads == [sent]

        # CORS: the UI on this machine may call it (preflight and the call itself); another origin may not.
        ui = "http://127.0.0.1:8233"
        preflight = await http.options(
            f"{base}/decode",
            headers={
                "Origin": ui,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-namespace",
            },
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == ui
        assert preflight.headers["access-control-allow-headers"] == "content-type,x-namespace"
        called = await http.post(f"{base}/decode", json={"payloads": []}, headers={"Origin": ui})
        assert called.headers["access-control-allow-origin"] == ui
        elsewhere = await http.post(f"{base}/decode", json={"payloads": []}, headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in elsewhere.headers

        bad = await http.post(f"{base}/decode", content=b"not json")
        assert bad.status_code == 400


async def test_references_resolve_in_either_form_the_sdk_writes_and_an_unknown_driver_is_named(client, tmp_path):
    client = with_payload_store(client, tmp_path)
    planner = FixedPlanner(step("say", Echo, text="hello"), *STEPS)
    async with Harness(client, tmp_path, tools=[Echo()], planner=planner) as h:
        out = await h.run("say it", {"cache": "bypass"})
    assert out.failure is None, out.failure
    stored = plan_result(out.history)
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
        answer = await http.post(f"{base}/decode", json={"payloads": [json_format.MessageToDict(elsewhere)]})
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
