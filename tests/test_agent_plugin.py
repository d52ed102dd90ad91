"""``AgentPlugin`` on a client and worker of one's own: ``Client.connect(..., plugins=[plugin])`` and a
plain ``Worker`` run a request to completion — a checkpoint approved by a signed review included — and
``Replayer`` configured from the same plugin replays the history the worker wrote."""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Replayer, Worker

from agent_lifecycle import AgentClient, AgentPlugin, Settings
from client.reviewer_keys import generate_key, trust_reviewer_key
from examples.first_agent.pipeline import build

from .doubles import eventually


def _settings(client: Client, tmp_path: Path) -> Settings:
    trust = tmp_path / "reviewers.json"
    trust_reviewer_key(trust, "alice", generate_key(tmp_path / "alice.key"))
    return Settings.from_env(
        {
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "TEMPORAL_TASK_QUEUE": f"plugin-{uuid.uuid4().hex[:8]}",
            "AGENT_STATE_DIR": str(tmp_path / "state"),
            "AGENT_REVIEWER_KEYS": str(trust),
            "AGENT_REVIEWER_KEY": str(tmp_path / "alice.key"),
        }
    )


async def test_a_client_and_worker_of_ones_own_run_and_replay_a_request_with_only_the_plugin(client, tmp_path):
    settings = _settings(client, tmp_path)
    plugin = AgentPlugin(build, settings=settings)
    own = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace, plugins=[plugin])
    assert own.data_converter.external_storage is not None  # the payload store of the settings

    async with Worker(own, task_queue=settings.task_queue):
        agents = AgentClient(own, settings)
        read = await agents.execute("read groceries")
        assert read.response.endswith("— from the notes service")

        handle = await agents.start("write groceries: milk and eggs")

        async def in_inbox():
            return [p for p in await agents.inbox() if p.workflow_id == handle.id]

        [pending] = await eventually(in_inbox, timeout=60, what="the write in the inbox")
        [call] = pending.checkpoint.calls
        assert call.arguments == {"title": "groceries", "text": "milk and eggs"}
        await agents.approve(handle.id, reviewer="alice", comment="fine")
        written = await agents.result(handle.id)
        assert "notes-service/write_note" in written.response

        record = await agents.record(handle.id)
        assert record.pipeline == "first-agent"
        assert (record.checkpoints[0].verified_by or "").endswith(" of alice")
        history = await own.get_workflow_handle(handle.id).fetch_history()

    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert "execute_tool_step" in scheduled
    replayed = await Replayer(workflows=[], plugins=[plugin]).replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None


async def test_the_plugin_refuses_a_factory_that_returns_no_pipeline(tmp_path, client):
    settings = _settings(client, tmp_path)
    try:
        AgentPlugin(lambda settings: "not a pipeline", settings=settings)  # type: ignore[arg-type, return-value]
    except TypeError as err:
        assert "returned str, not LifecycleActivities" in str(err)
    else:
        raise AssertionError("a factory's wrong return passed")
