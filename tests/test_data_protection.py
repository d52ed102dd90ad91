"""Data protection end to end, as a deployment runs it: with ``AGENT_ENCRYPTION_KEYS_FILE`` set, a request
that carries a card number and a unique token — in what was asked, in a tool's arguments, in the answer —
leaves no plaintext of either in Temporal's history (read without the codec, by the SDK and by the
``temporal`` CLI), in what the Web UI shows without a codec (summaries of every event, the details, the
current details while a checkpoint waits and once it ended, the memo, the search attributes), or in the
stores' files. The codec server refuses a caller without a token and a page of another origin, and
decrypts for one with a token. Everything else keeps working: the answer, the execution record, replay
with the encrypting converter, a policy replay over the sealed records; a process without the key gets a
typed error naming it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities import LifecycleActivities
from client import Settings, process_data_converter
from client.api import AgentClient, RequestFailed
from client.codec import Access, Codec
from client.devserver import temporal_cli_path
from client.encryption import ENCODING, UnknownEncryptionKey, new_key_line
from client.pipeline import build_pipeline
from client.replay import replay_report
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.pipeline import demo_hooks
from demo.tools import demo_tools
from worker import build_replay_worker, build_worker, policy_replay_activities, prepare
from workflows import WORKFLOWS
from workflows import search_attributes as sa
from workflows.converter import SHOWN_METADATA
from workflows.local_payloads import LocalPayloadsInline
from workflows.models import ReplayWindow, StageSettings

from .test_codec_server import codec_server

pytestmark = pytest.mark.timeout(120)

CARD = "4111 1111 1111 1111"
# Every form the card could take in bytes: as typed, its digits run together, JSON's unicode escapes.
CARD_FORMS = [CARD, CARD.replace(" ", ""), CARD.replace(" ", "-")]
TOKEN = f"zq{uuid.uuid4().hex[:12]}marker"
ASKED = f"Send a message to alice: pay with card {CARD} ref {TOKEN}"
CODEC_TOKEN = "e2e-codec-token-" + "z" * 24
UI = "http://127.0.0.1:8233"


def protected_pipeline(settings: Settings) -> LifecycleActivities:
    """The demo's hooks, tools, planner and template, without its memory hooks (the memory stores keep
    what they search in plaintext: see docs/data-protection.md)."""
    return build_pipeline(
        settings,
        name="protected",
        hooks=demo_hooks(settings),
        tools=demo_tools(settings.state_dir),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        stage_settings=StageSettings(answer_streaming=False),
    )


def leaks(data: bytes | str) -> list[str]:
    """The markers ``data`` holds in plaintext; in a JSON document, also in the base64 of its payloads' data."""
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    found = [m for m in [TOKEN, *CARD_FORMS] if m in text]
    try:
        document = json.loads(text)
    except ValueError:
        return found
    return found + [m for blob in _payload_data(document) for m in leaks(blob)]


def _payload_data(value: object) -> list[bytes]:
    """The decoded ``data`` of every payload a JSON document holds."""
    if isinstance(value, list):
        return [blob for item in value for blob in _payload_data(item)]
    if not isinstance(value, dict):
        return []
    found = [blob for item in value.values() for blob in _payload_data(item)]
    data = value.get("data")
    if isinstance(data, str):
        try:
            found.append(base64.b64decode(data, validate=True))
        except ValueError:
            pass
    return found


def shown(payload: Payload) -> str:
    """A summary or details as the UI reads it without a codec: plain JSON text, or it fails."""
    assert payload.metadata.get(SHOWN_METADATA) == b"true" and payload.metadata["encoding"] == b"json/plain", payload
    return json.loads(payload.data)


@pytest.fixture
def settings(client: Client, tmp_path: Path) -> Settings:
    keys = tmp_path / "keys"
    keys.write_text(f"# the first key encrypts\n{new_key_line('k2')}\n{new_key_line('k1')}\n")
    keys.chmod(0o600)
    return Settings.from_env(
        {
            "AGENT_STATE_DIR": str(tmp_path / "state"),
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "TEMPORAL_TASK_QUEUE": f"tq-{uuid.uuid4()}",
            "AGENT_ENCRYPTION_KEYS_FILE": str(keys),
            "AGENT_CODEC_TOKEN": CODEC_TOKEN,
            "AGENT_CODEC_ALLOWED_ORIGINS": UI,
            "AGENT_PIPELINE": f"{__name__}:protected_pipeline",
        }
    )


async def test_nothing_a_request_carried_is_readable_without_the_keys(client: Client, settings: Settings, leftovers):
    agents = await AgentClient.connect(settings, tracing=False)
    activities = protected_pipeline(settings)
    await prepare(agents.temporal, settings, activities)
    replay = policy_replay_activities(settings, activities)
    bare = Client(client.service_client, namespace=client.namespace)  # no codec, no payload store
    async with (
        build_worker(agents.temporal, settings.task_queue, activities, replay=replay),
        build_replay_worker(agents.temporal, settings.task_queue, replay, batches=1),
    ):
        handle = await agents.start(ASKED, metadata={"tenant_id": "acme-corp", "cache": "bypass"})
        leftovers.append(handle)
        for _ in range(200):  # the message waits for a reviewer
            if await agents.pending(handle.id):
                break
            await asyncio.sleep(0.1)
        [waiting] = await agents.pending(handle.id)
        assert TOKEN in json.dumps(waiting.model_dump(mode="json"))  # the reviewer, with the keys, reads it all

        # While it waits: what the UI shows without a codec names the tool, the step and who asked.
        metadata = await bare.get_workflow_handle(handle.id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
        assert "stage:** awaiting_review" in metadata.current_details
        assert "notify-service/send_message" in metadata.current_details and "required by" in metadata.current_details
        assert not leaks(metadata.current_details), metadata.current_details

        await agents.approve(handle.id, reviewer="alice", comment=f"ok, card {CARD} checked")
        result = await agents.result(handle.id)
        ended = await bare.get_workflow_handle(handle.id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )

        # Everything keeps working: the answer, the record (the request, the call's arguments, the review).
        assert result.response == "Message sent to alice." and result.steps[0].status == "succeeded"
        live = await agents.record(handle.id)
        stored = await activities.store.get(handle.id)
        assert stored is not None and stored.request == ASKED == live.request
        assert stored.status.value == "succeeded" and stored.final_response == result.response
        assert [c.reviewer for c in stored.checkpoints] == ["alice"]
        assert any(TOKEN in json.dumps(s.model_dump(mode="json")) for s in stored.steps)

        # A policy replay reads the sealed records, and its report keeps no plaintext either.
        replayed = await agents.replay_policy(settings.pipeline_factory or "", ReplayWindow())
        outcome = await replayed.result()
        assert outcome.replayed == outcome.total == 1
        report = replay_report(settings, outcome, ReplayWindow())
        assert report["totals"]["records"] == 1 and report["requests"] == []  # the same pipeline: no change
        assert not leaks(json.dumps(report, default=str))

    # The raw history, as Temporal keeps it.
    history = await bare.get_workflow_handle(handle.id).fetch_history()
    raw = history.to_json()
    assert not leaks(raw), leaks(raw)
    assert result.response not in raw  # nor the answer
    assert not leaks(b"".join(e.SerializeToString() for e in history.events))
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.input.payloads[0].metadata["encoding"] == ENCODING
    assert (
        history.events[0].workflow_execution_started_event_attributes.input.payloads[0].metadata["encryption-key-id"]
        == b"k2"
    )

    # Every summary the UI shows on the Timeline is readable without a codec, and carries no text.
    summaries = [shown(e.user_metadata.summary) for e in history.events if e.user_metadata.HasField("summary")]
    checkpoint_timer = [s for s in summaries if s.startswith("awaiting review")]
    assert checkpoint_timer and all("approve notify-service/send_message (notify)" in s for s in checkpoint_timer)
    assert any(s.startswith("execute · notify-service/send_message") for s in summaries)
    assert any(s == f"request · {result.request_id}" for s in summaries)
    assert not [s for s in summaries if leaks(s)]
    assert "ok, card" not in ended.current_details and not leaks(ended.current_details)
    assert "stage:** completed" in ended.current_details and "by alice" in ended.current_details

    # What the description shows: summary, details, memo, search attributes.
    description = await bare.get_workflow_handle(handle.id).describe()
    assert await description.static_summary() == f"request · {result.request_id}"
    details = await description.static_details() or ""
    assert f"**request id:** {result.request_id}" in details and not leaks(details)
    assert not leaks(str(await description.memo())) and not leaks(str(description.typed_search_attributes))
    assert description.typed_search_attributes.get(sa.LIFECYCLE_STAGE) == "completed"

    # The `temporal` CLI reads the same: no codec, no plaintext.
    for command in (["workflow", "show", "--output", "json"], ["workflow", "describe", "--output", "json"]):
        shown_by_cli = subprocess.run(
            [temporal_cli_path(), *command, "--workflow-id", handle.id, "--address", settings.temporal_address],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
        )
        assert shown_by_cli.returncode == 0, shown_by_cli.stderr
        assert handle.id in shown_by_cli.stdout and not leaks(shown_by_cli.stdout), command

    # The stores' files: ciphertext only, each readable by its owner alone, in a directory only it enters.
    state = settings.state_dir
    files = sorted(p for p in state.iterdir() if ".sqlite3" in p.name)
    assert {p.name for p in files} >= {"executions.sqlite3", "payloads.sqlite3", "response-cache.sqlite3"}
    for path in files:
        assert not leaks(path.read_bytes()), path.name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
    assert stat.S_IMODE(state.stat().st_mode) == 0o700

    # Replay with the encrypting converter, in the sandbox.
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=agents.temporal.data_converter,
        workflow_runner=SandboxedWorkflowRunner(),
        interceptors=[LocalPayloadsInline()],
    )
    assert (await replayer.replay_workflow(WorkflowHistory(handle.id, history.events))).replay_failure is None

    # A process without the key that encrypted it is told which key it lacks.
    stranger_settings = settings.model_copy(
        update={"protection": settings.protection.model_copy(update={"keys_file": None, "keys": _other_key()})}
    )
    stranger = AgentClient(
        Client(
            client.service_client, namespace=client.namespace, data_converter=process_data_converter(stranger_settings)
        ),
        stranger_settings,
    )
    with pytest.raises(UnknownEncryptionKey, match="'k2'"):
        await stranger.result(handle.id)

    # The codec server: nothing for a caller without the token or a page of another origin; decrypted and
    # masked for one with it.
    started_payload = json_format.MessageToDict(started.input.payloads[0])
    access = Access.from_settings(settings.codec_server, "127.0.0.1")
    async with codec_server(Codec.of(process_data_converter(settings)), access) as base, httpx.AsyncClient() as http:
        body = {"payloads": [started_payload]}
        anonymous = await http.post(f"{base}/decode", json=body)
        foreign = await http.post(
            f"{base}/decode", json=body, headers={"Authorization": f"Bearer {CODEC_TOKEN}", "Origin": "https://x.test"}
        )
        assert (anonymous.status_code, foreign.status_code) == (401, 403)
        assert not leaks(anonymous.text + foreign.text)
        decoded = await http.post(
            f"{base}/decode", json=body, headers={"Authorization": f"Bearer {CODEC_TOKEN}", "Origin": UI}
        )
        assert decoded.status_code == 200 and decoded.headers["access-control-allow-origin"] == UI
        [request] = json_format.Parse(decoded.text, Payloads()).payloads
        asked = json.loads(request.data)["request"]
        assert TOKEN in asked and CARD not in asked and "[REDACTED]" in asked


def _other_key():
    from pydantic import SecretStr

    return SecretStr("k9=" + base64.b64encode(os.urandom(32)).decode())


async def test_a_failure_keeps_its_type_readable_and_its_reason_encrypted(
    client: Client, settings: Settings, leftovers
):
    """A refused request (the required hook rejects a trade): the UI reads the failure's type, the reason
    and the ask only with the keys."""
    agents = await AgentClient.connect(settings, tracing=False)
    activities = protected_pipeline(settings)
    await prepare(agents.temporal, settings, activities)
    bare = Client(client.service_client, namespace=client.namespace)
    async with build_worker(agents.temporal, settings.task_queue, activities):
        handle = await agents.start(f"Buy 10 ACME with card {CARD} ref {TOKEN}")
        leftovers.append(handle)
        with pytest.raises(RequestFailed) as failed:
            await agents.result(handle.id)
        details = await bare.get_workflow_handle(handle.id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
    assert failed.value.type == "RequiredAfterPlanningError"
    assert "required after_planning hook" in failed.value.message  # read with the keys
    history = await bare.get_workflow_handle(handle.id).fetch_history()
    assert not leaks(history.to_json())
    [ended] = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED]
    failure = ended.workflow_execution_failed_event_attributes.failure
    assert failure.message == "RequiredAfterPlanningError" and not failure.stack_trace
    assert failure.encoded_attributes.metadata["encoding"] == ENCODING
    assert "required after_planning hook" not in history.to_json()
    assert "RequiredAfterPlanningError" in details.current_details and not leaks(details.current_details)
