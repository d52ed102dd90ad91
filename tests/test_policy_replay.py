"""Policy replay against a real dev server, on SQLite and on PostgreSQL: demo traffic is recorded by a
worker running the demo's pipeline, then ``PolicyReplay`` runs candidate pipelines over those records on
the same worker, in shadow.

What a user checks: the requests a stricter allow-list would block, exactly; a declared HTTP hook that is
not shadow-safe reported ``not_replayed`` and never called; the CLI's exit code and report; and that no
row of any store (nor the demo's journals) changes except the replay's own report.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import Replayer

from client import cli, database, execution_store
from client.api import pending_checkpoint, review
from client.replay import replay_progress, replay_report, start_policy_replay
from client.settings import Settings
from workflows import PolicyReplayWorkflow, policy_replay
from workflows.models import EffectStatus, FindingKind, ReplayWindow, RequestInput, RequestResult

from . import replay_pipelines
from .hook_servers import Webhook
from .replay_pipelines import recorded

pytestmark = pytest.mark.asyncio(loop_scope="session")

PIPELINES = "tests.replay_pipelines"
# The demo traffic: (text, tenant, whether a stricter allow-list without stock quotes blocks a call of it).
TRAFFIC = [
    ("What is the price of ACME?", "acme-corp", True),
    ("What is the price of IBM?", "globex", True),
    ("Get quotes for ACME and MSFT", "acme-corp", True),
    ("Quote ACME and send it to team", "globex", True),  # two phases: the message references the quote
    ("Buy 10 ACME", "acme-corp", False),  # the required gate rejects the trade: nothing ran
    ("Send a message to ops: standup at 10", "globex", False),  # waits for a reviewer, then runs
]


def _settings(client: Client, tmp_path: Path, url: str | None) -> Settings:
    env = {
        "AGENT_STATE_DIR": str(tmp_path),
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": f"tq-{uuid.uuid4()}",
    }
    if url is not None:
        env["AGENT_DATABASE_URL"] = url
    return Settings.from_env(env)


async def _record_traffic(client: Client, settings: Settings, leftovers: list) -> dict[str, str]:
    """Run the demo traffic through the worker; the request id of each text."""
    ids: dict[str, str] = {}
    for text, tenant, _ in TRAFFIC:
        request_id = uuid.uuid4().hex[:10]
        handle = await client.start_workflow(
            "RequestLifecycle",
            RequestInput(request=text, request_id=request_id, metadata={"tenant_id": tenant}),
            id=f"request-{request_id}",
            task_queue=settings.task_queue,
            result_type=RequestResult,
        )
        leftovers.append(handle)
        ids[text] = request_id
        result = asyncio.ensure_future(handle.result())
        while not result.done():  # a reviewer approves every checkpoint (the messages wait for one)
            if await pending_checkpoint(client, handle.id) is not None:
                await review(client, handle.id, "approve", "alice")
            await asyncio.wait([result], timeout=0.1)
        result.exception()  # the rejected trade fails: its record is what the replay reads
    store = execution_store(settings)
    for request_id in ids.values():  # detached effects (audit, knowledge extraction) settle after the request
        for _ in range(300):
            stored = await store.get(request_id)
            if stored is not None and all(e.status is not EffectStatus.PENDING for e in stored.effects):
                break
            await asyncio.sleep(0.1)
    return ids


# The ledger of a store's migrations: its schema, not its data (a store opened on a new file records its
# migrations there as it creates its tables).
LEDGER = "agent_schema_migrations"


def _dump(settings: Settings) -> dict[str, Any]:
    """Every row of every store and the demo's journals, but the replay's own report."""
    found: dict[str, Any] = {}
    for path in sorted(settings.state_dir.glob("*.sqlite3")):
        if path.name == "policy-replay.sqlite3":
            continue
        with sqlite3.connect(path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'") if r[0] != LEDGER]
            for table in tables:
                found[f"{path.name}:{table}"] = sorted(map(repr, db.execute(f'SELECT * FROM "{table}"')))
    for path in sorted(settings.state_dir.glob("*.jsonl")):
        found[path.name] = path.read_bytes()
    if settings.database_url is not None:
        with psycopg.connect(settings.database_url.get_secret_value()) as conn:
            tables = [
                r[0]
                for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
                if not r[0].startswith("policy_replay")
            ]
            for table in tables:
                found[f"pg:{table}"] = sorted(map(repr, conn.execute(f'SELECT * FROM "{table}"').fetchall()))
    return found


async def _settled(settings: Settings) -> dict[str, Any]:
    """The dump once the requests' detached work has settled (two dumps a second apart agree)."""
    previous = _dump(settings)
    for _ in range(60):
        await asyncio.sleep(1.0)
        current = _dump(settings)
        if current == previous:
            return current
        previous = current
    raise AssertionError("the stores kept changing after the traffic ended")


def _unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    for name, rows in after.items():
        assert rows == before.get(name, [] if not isinstance(rows, bytes) else b""), name
    assert set(before) <= set(after)


async def test_a_stricter_allow_list_reports_exactly_the_requests_it_would_block_and_changes_no_row(
    client: Client, backend, tmp_path: Path, leftovers: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker import build_replay_worker, build_worker, policy_replay_activities

    settings = _settings(client, tmp_path, backend.url)
    activities = recorded(settings)
    replay = policy_replay_activities(settings, activities)
    db = database(settings)
    if db is not None:  # what a worker does at start-up: every store's schema, the report store's too
        await db.migrate()
    hits = Webhook()
    replay_pipelines.HTTP_HOOK_URL = hits.url
    try:
        async with (
            build_worker(client, settings.task_queue, activities, replay=replay),
            build_replay_worker(client, settings.task_queue, replay, batches=2),
        ):
            ids = await _record_traffic(client, settings, leftovers)
            before = await _settled(settings)

            # The stricter allow-list: the quote requests, and nothing else, are newly blocked.
            handle = await start_policy_replay(client, settings, f"{PIPELINES}:stricter", ReplayWindow(), batch_size=2)
            result = await handle.result()
            assert result.total == result.replayed == len(TRAFFIC)
            report = replay_report(settings, result, ReplayWindow())
            blocked = {
                r["request_id"]
                for r in report["requests"]
                if any(f["kind"] == FindingKind.NEWLY_BLOCKED for f in r["findings"])
            }
            assert blocked == {ids[text] for text, _, blocks in TRAFFIC if blocks}
            progress = await replay_progress(client, handle.id)
            assert (progress.done, progress.total, progress.replayed, progress.batches) == (True, 6, 6, 3)
            assert progress.counts["newly_blocked"] == 5
            by_request = {r["request_id"]: r for r in report["requests"]}
            first = [f for f in by_request[ids[TRAFFIC[0][0]]]["findings"] if f["kind"] == "newly_blocked"]
            assert [(f["hook"], f["tool"], f["stage"]) for f in first] == [
                ("allow-list", "stock-service/stock_quote", "before_tool")
            ]
            assert report["by_tool"]["stock-service/stock_quote"]["newly_blocked"] == 5
            assert report["by_tenant"]["acme-corp"]["newly_blocked"] == 2
            # Honest about what it cannot know: the message planned from a quote the candidate denies, and
            # the trade whose plan the recorded gate rejected (that plan is not in the record).
            two_phase = {f["kind"] for f in by_request[ids[TRAFFIC[3][0]]]["findings"]}
            assert FindingKind.DEPENDS_ON_UNRECORDED in two_phase
            trade = by_request[ids["Buy 10 ACME"]]["findings"]
            assert [f["kind"] for f in trade] == [FindingKind.DEPENDS_ON_UNRECORDED]

            # The recorded pipeline replayed on itself changes no decision.
            same = await (await start_policy_replay(client, settings, f"{PIPELINES}:same", ReplayWindow())).result()
            same_report = replay_report(settings, same, ReplayWindow())
            assert same_report["totals"]["with_decision_changes"] == 0

            # Resumable: a long replay continues as new, carrying its place and counts, and finishes the same.
            monkeypatch.setattr(policy_replay, "BATCHES_PER_RUN", 2)
            continued = await start_policy_replay(
                client, settings, f"{PIPELINES}:stricter", ReplayWindow(), batch_size=1, parallel_batches=1
            )
            again = await continued.result()
            assert (again.replayed, again.counts) == (result.replayed, result.counts)
            assert (await replay_progress(client, continued.id)).done
            first = client.get_workflow_handle(continued.id, run_id=continued.first_execution_run_id)
            first_run = await first.fetch_history()
            assert first_run.events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            monkeypatch.undo()

            # A declared HTTP hook that is not shadow-safe: reported, never called.
            http = await (
                await start_policy_replay(client, settings, f"{PIPELINES}:with_http_hook", ReplayWindow())
            ).result()
            http_report = replay_report(settings, http, ReplayWindow())
            assert hits.received == []
            assert http_report["by_hook"]["remote-policy"] == {"not_replayed": 7}  # each recorded call
            reasons = {
                f["detail"]
                for r in http_report["requests"]
                for f in r["findings"]
                if f["kind"] == "not_replayed" and f["hook"] == "remote-policy"
            }
            assert reasons == {"calls out and is not marked shadow_safe"}
            assert http_report["totals"]["with_decision_changes"] == 0  # never read as an allow or a block

            # The CLI: a progress line, a JSON report, exit 3 on --fail-on.
            for name, value in (
                ("AGENT_STATE_DIR", str(tmp_path)),
                ("TEMPORAL_ADDRESS", settings.temporal_address),
                ("TEMPORAL_TASK_QUEUE", settings.task_queue),
            ):
                monkeypatch.setenv(name, value)
            if backend.url is not None:
                monkeypatch.setenv("AGENT_DATABASE_URL", backend.url)
            out = tmp_path / "report.json"
            argv = ["replay-policy", "--pipeline", f"{PIPELINES}:stricter", "--since", "1d", "--out", str(out)]
            assert await asyncio.to_thread(cli.main, [*argv, "--fail-on", "newly_blocked,hook_failed"]) == 3
            assert {r["request_id"] for r in json.loads(out.read_text())["requests"]} >= blocked
            assert await asyncio.to_thread(cli.main, [*argv, "--fail-on", "newly_allowed"]) == 0
            html = tmp_path / "report.html"
            argv[-1] = str(html)
            assert await asyncio.to_thread(cli.main, argv) == 0
            assert "newly_blocked" in html.read_text() and "<script" not in html.read_text()

            # A candidate its factory cannot build fails the replay with a typed error.
            broken = await start_policy_replay(client, settings, f"{PIPELINES}:missing", ReplayWindow())
            with pytest.raises(WorkflowFailureError) as failed:
                await broken.result()
            assert isinstance(failed.value.cause, ApplicationError)
            assert failed.value.cause.type == "CandidatePipelineUnavailable"
            assert "missing" in failed.value.cause.message

            # Cancellable: cancelling the workflow stops its running batches.
            slow = await start_policy_replay(client, settings, f"{PIPELINES}:slow", ReplayWindow(), batch_size=1)
            while (await replay_progress(client, slow.id)).total is None:
                await asyncio.sleep(0.1)
            await slow.cancel()
            with pytest.raises(WorkflowFailureError) as failed:
                await slow.result()
            assert isinstance(failed.value.cause, CancelledError)
            assert (await replay_progress(client, slow.id)).done is False

            _unchanged(before, _dump(settings))

            # Deterministic: the replay's own history replays inside the sandbox.
            replayer = Replayer(workflows=[PolicyReplayWorkflow], data_converter=client.data_converter)
            await replayer.replay_workflow(await handle.fetch_history())
    finally:
        hits.close()


async def test_a_worker_killed_mid_replay_is_replaced_and_the_report_is_whole(
    client: Client, tmp_path: Path, leftovers: list
) -> None:
    # The replay runs on worker processes a supervisor keeps alive; the one running a batch is SIGKILLed.
    # The batch's missing heartbeats give it to the next worker within seconds; every record is replayed,
    # and the report has the findings of a replay that was never interrupted, each request once.
    import os
    import signal

    from worker import build_worker

    from .test_worker_loss import supervised_workers

    settings = _settings(client, tmp_path, None)
    async with build_worker(client, settings.task_queue, recorded(settings)):
        ids = await _record_traffic(client, settings, leftovers)
    async with supervised_workers(
        client, tmp_path, settings.task_queue, AGENT_PIPELINE=f"{PIPELINES}:recorded"
    ) as pids:
        handle = await start_policy_replay(
            client, settings, f"{PIPELINES}:slow", ReplayWindow(), batch_size=1, parallel_batches=1
        )
        async with asyncio.timeout(120):
            while (progress := await replay_progress(client, handle.id)).replayed < 1:
                await asyncio.sleep(0.1)
        os.kill(pids[-1], signal.SIGKILL)
        result = await asyncio.wait_for(handle.result(), timeout=180)
        reference = await asyncio.wait_for(
            (await start_policy_replay(client, settings, f"{PIPELINES}:slow", ReplayWindow())).result(), timeout=180
        )
        history = await handle.fetch_history()

    assert len(pids) >= 2 and progress.replayed < len(TRAFFIC)
    assert result.total == result.replayed == len(TRAFFIC)
    # The same findings, request by request, as the replay that was never interrupted, and each once.
    found = replay_report(settings, result, ReplayWindow())["requests"]
    expected = replay_report(settings, reference, ReplayWindow())["requests"]
    assert found == expected and len({r["request_id"] for r in found}) == len(found)
    assert {r["request_id"] for r in found} <= set(ids.values())
    assert (result.counts, result.changed) == (reference.counts, reference.changed)
    # The lost batch was run again by the new worker: a heartbeat timeout in the replay's history.
    timed_out = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
    retried = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert timed_out or retried
    replayer = Replayer(workflows=[PolicyReplayWorkflow], data_converter=client.data_converter)
    await replayer.replay_workflow(history)


async def test_a_replay_spreads_its_batches_over_the_workers_on_their_own_queue(
    client: Client, tmp_path: Path, leftovers: list
) -> None:
    # Batches run on the batch queue, where each worker takes at most its batch slots: with one slot each,
    # two workers share a wave of two batches, and the request queue's worker runs none of them.
    from worker import build_replay_worker, build_worker, policy_replay_activities

    settings = _settings(client, tmp_path, None)
    activities = recorded(settings)
    replay = policy_replay_activities(settings, activities)
    # Two worker processes, as far as the server can tell: a connection each.
    other = await Client.connect(
        client.service_client.config.target_host, namespace=client.namespace, data_converter=client.data_converter
    )
    async with (
        build_worker(client, settings.task_queue, activities, replay=replay),
        build_replay_worker(client, settings.task_queue, replay, batches=1, identity="replay-a"),
        build_replay_worker(other, settings.task_queue, replay, batches=1, identity="replay-b"),
    ):
        await _record_traffic(client, settings, leftovers)
        handle = await start_policy_replay(
            client, settings, f"{PIPELINES}:slow", ReplayWindow(), batch_size=1, parallel_batches=2
        )
        result = await handle.result()
        history = await handle.fetch_history()

    assert result.replayed == len(TRAFFIC)
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    batches = {i for i, a in scheduled.items() if a.activity_type.name == policy_replay.REPLAY_BATCH_ACTIVITY}
    assert {scheduled[i].task_queue.name for i in batches} == {policy_replay.replay_batch_queue(settings.task_queue)}
    ran_on = {
        e.activity_task_started_event_attributes.identity
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in batches
    }
    assert ran_on == {"replay-a", "replay-b"}
    replayer = Replayer(workflows=[PolicyReplayWorkflow], data_converter=client.data_converter)
    await replayer.replay_workflow(history)
