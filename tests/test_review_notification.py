"""The reviewers' webhook: a checkpoint that opens is announced by a ``ReviewNotification`` child (a
Slack-compatible POST, retried with backoff, behind the SSRF guard of HTTP hooks) that never holds up
the request and outlives it; without a webhook a checkpoint starts nothing. Real Temporal server, real
HTTP server on 127.0.0.1; every history (the request's and the child's) is replayed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import ApplicationError

from activities.review_webhook import REQUEST_EXCERPT_CHARS, ReviewWebhook
from hooks import PlanStep
from workflows import search_attributes as sa
from workflows.models import (
    ApprovalReason,
    Checkpoint,
    EffectStatus,
    PipelineHookEffect,
    Plan,
    ReviewAck,
    ReviewNotificationInput,
    ReviewRequest,
    ReviewSettings,
)
from workflows.notification import REVIEW_NOTIFICATION_WORKFLOW_TYPE, review_notification_workflow_id

from .doubles import FixedPlanner, eventually
from .harness import Harness
from .hook_servers import Receiver, Reply, Webhook
from .test_entrypoints import ROOT, _cli, _running_worker

SECRET = "sk-" + "A1b2C3d4E5f6G7h8J9k0"  # matches the common API-key pattern masked_preview masks
ASK = f"Tell bob the launch moved; my key is {SECRET}. " + "Background. " * 200


def message(text: str) -> PlanStep:
    """A demo ``send_message`` step: its tool needs approval, so the plan waits at a checkpoint."""
    return PlanStep(
        step_id="notify",
        namespace="demo-tools",
        agent="notify-service",
        capability="send_message",
        arguments={"to": "bob", "text": text},
    )


@pytest.fixture
def receiver():
    servers: list[Webhook] = []

    def make(*replies: Reply) -> Webhook:
        servers.append(Webhook(*replies))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def children(history: WorkflowHistory) -> list[str]:
    """The workflow types of the children a request started."""
    return [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]


def activity_attempts(history: WorkflowHistory, activity: str) -> list[tuple[int, str]]:
    """Each call of ``activity`` in a history: the attempt that ended it, and the failure of the attempt
    before that (the server records retries in the started event of the last attempt only)."""
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity
    }
    return [
        (
            e.activity_task_started_event_attributes.attempt,
            e.activity_task_started_event_attributes.last_failure.message,
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]


async def approve(handle: WorkflowHandle, checkpoint_id: str) -> None:
    request = ReviewRequest(checkpoint_id=checkpoint_id, reviewer="alice", decision="approve", comment="ok")
    await handle.execute_update("review", request, result_type=ReviewAck)


async def notification(client: Client, h: Harness, handle: WorkflowHandle, checkpoint_id: str) -> WorkflowHandle:
    """The request's notification child for ``checkpoint_id``; its history joins the replayed ones."""
    child = client.get_workflow_handle(
        review_notification_workflow_id(handle.id, checkpoint_id), result_type=PipelineHookEffect
    )
    try:
        await child.result()
    except WorkflowFailureError:
        pass
    h.histories.append(await child.fetch_history())
    return child


async def test_an_opening_checkpoint_posts_one_slack_compatible_notification(client, tmp_path, leftovers, receiver):
    server = receiver(Reply(body={"ok": True}))
    webhook = ReviewWebhook(server.url + "/review", allow_loopback=True)
    planner = FixedPlanner(message(f"launch moved, use {SECRET}"))
    review = ReviewSettings(reviewers=["alice", "carol"])
    async with Harness(client, tmp_path, planner=planner, review=review, review_webhook=webhook) as h:
        handle = await h.start(ASK, request_id="launch-42")
        leftovers.append(handle)
        checkpoint = await h.wait_for_checkpoint(handle)
        await eventually(lambda: _async(server.received), what="the webhook's POST")
        await approve(handle, checkpoint.checkpoint_id)
        outcome = await h.finish(handle)
        child = await notification(client, h, handle, checkpoint.checkpoint_id)

    assert outcome.failure is None and outcome.result is not None
    assert [s.status for s in outcome.result.steps] == ["succeeded"]
    assert children(outcome.history) == [REVIEW_NOTIFICATION_WORKFLOW_TYPE]
    assert len(server.received) == 1
    post = server.received[0]
    assert post.path == "/review" and post.headers["content-type"] == "application/json"
    body = post.body
    # Slack's incoming webhook reads `text` and `blocks`; everything else reads `review`.
    assert body["text"].startswith(f"Review needed: request launch-42 waits at checkpoint {checkpoint.checkpoint_id}")
    assert "notify-service/send_message" in body["text"]
    assert [b["type"] for b in body["blocks"]] == [
        "header",
        "section",
        "section",
        "section",
        "section",
        "section",
        "context",
    ]
    assert body["blocks"][4]["text"]["text"].startswith(
        "*Approving runs exactly*\n• `demo-tools/notify-service/send_message`"
    )
    review_fields = body["review"]
    request = review_fields["request"]
    assert request["request_id"] == "launch-42" and request["workflow_id"] == handle.id
    assert request["excerpt"].startswith("Tell bob the launch moved; my key is ")
    assert len(request["excerpt"]) <= REQUEST_EXCERPT_CHARS + 1 and request["excerpt"].endswith("…")
    assert SECRET not in str(body), "the webhook must never receive an unmasked secret"
    assert review_fields["checkpoint"] == {
        "checkpoint_id": checkpoint.checkpoint_id,
        "phase": 1,
        # each tool by its key, as a person reads it (the checkpoint keeps the matchers' agent/capability)
        "reasons": [{**r.model_dump(mode="json"), "tool": f"demo-tools/{r.tool}"} for r in checkpoint.reasons],
        "step_id": None,
        "requested_at": checkpoint.requested_at.isoformat(),
        "expires_at": checkpoint.expires_at.isoformat(),
    }
    # The call approval runs, exactly as it will run (masked like every excerpt).
    [call] = review_fields["calls"]
    assert (call["step_id"], call["tool"], call["modified_by"]) == (
        "notify",
        "demo-tools/notify-service/send_message",
        [],
    )
    assert '"to": "bob"' in call["arguments"] and call["planned_arguments"] is None
    [step] = review_fields["plan"]["steps"]
    assert step["step_id"] == "notify" and step["tool"] == "demo-tools/notify-service/send_message"
    assert '"to": "bob"' in step["arguments"] and "launch moved, use " in step["arguments"]
    assert review_fields["reviewers"] == ["alice", "carol"]
    decide = review_fields["decide"]
    assert decide["approve"].startswith(f"agent-lifecycle approve {handle.id} --checkpoint {checkpoint.checkpoint_id}")
    assert decide["reject"].startswith(f"agent-lifecycle reject {handle.id} --checkpoint {checkpoint.checkpoint_id}")
    assert decide["update"] == {
        "workflow_id": handle.id,
        "name": "review",
        "checkpoint_id": checkpoint.checkpoint_id,
        "decisions": ["approve", "reject"],
    }

    effect = await child.result()
    assert effect.status is EffectStatus.SUCCEEDED and effect.data == {"http_status": 200, "attempts": 1}
    # In the UI's list the child says what it is and whose checkpoint it announced.
    description = await child.describe()
    assert description.typed_search_attributes.get(sa.WORKFLOW_KIND) == sa.KIND_REVIEW_NOTIFICATION
    assert await description.static_summary() == f"review notification · {checkpoint.checkpoint_id}"
    assert handle.id in (await description.static_details() or "")
    recorded = outcome.record.effect(f"review_notification:{checkpoint.checkpoint_id}")
    assert recorded is not None and recorded.status is EffectStatus.SUCCEEDED


async def test_a_failing_receiver_is_retried_until_it_answers_after_the_request_ended(client, tmp_path, leftovers):
    ended = threading.Event()  # the receiver fails until the request has ended, then answers
    server = Receiver(lambda _: Reply(body={"ok": True}) if ended.is_set() else Reply(status=503, body="down"))
    try:
        webhook = ReviewWebhook(server.url, allow_loopback=True)
        async with Harness(client, tmp_path, planner=FixedPlanner(message("hi")), review_webhook=webhook) as h:
            handle = await h.start("tell bob hi")
            leftovers.append(handle)
            checkpoint = await h.wait_for_checkpoint(handle)
            await eventually(lambda: _async(server.received), what="the first POST")
            await approve(handle, checkpoint.checkpoint_id)  # while the webhook answers nothing but 503
            outcome = await h.finish(handle)
            ended.set()
            child = await notification(client, h, handle, checkpoint.checkpoint_id)
    finally:
        server.close()

    assert outcome.failure is None and outcome.result is not None
    effect = await child.result()
    attempts = len(server.received)
    assert attempts >= 2 and effect.status is EffectStatus.SUCCEEDED
    assert effect.data == {"http_status": 200, "attempts": attempts}
    assert activity_attempts(await child.fetch_history(), "notify_reviewers") == [
        (attempts, "the reviewers' webhook answered 503: down")
    ]
    # The request had ended when the notification succeeded: the stored record has its outcome all the same.
    effect_id = f"review_notification:{checkpoint.checkpoint_id}"
    await eventually(lambda: _stored_status(outcome, effect_id), what="the notification's outcome in the store")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://10.0.0.1:9/review", "10.0.0.1, a private address"),  # refused before any connection
        ("http://localhost:{port}/review", "a loopback address"),  # loopback not allowed here
    ],
)
async def test_a_refused_address_fails_the_notification_not_the_request(
    client, tmp_path, leftovers, receiver, url, problem
):
    server = receiver(Reply(body={"ok": True}))
    webhook = ReviewWebhook(url.format(port=server.httpd.server_address[1]), allow_loopback=False)
    async with Harness(client, tmp_path, planner=FixedPlanner(message("hi")), review_webhook=webhook) as h:
        handle = await h.start("tell bob hi")
        leftovers.append(handle)
        checkpoint = await h.wait_for_checkpoint(handle)
        started = time.monotonic()
        child = await notification(client, h, handle, checkpoint.checkpoint_id)
        assert time.monotonic() - started < 10
        await approve(handle, checkpoint.checkpoint_id)
        outcome = await h.finish(handle)

    assert outcome.failure is None and outcome.result is not None
    with pytest.raises(WorkflowFailureError) as failed:
        await child.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ReviewWebhookRefused"
    assert "SSRF protection refused" in cause.message and problem in cause.message
    assert activity_attempts(await child.fetch_history(), "notify_reviewers") == [(1, "")], (
        "a refused address is never retried"
    )
    assert server.received == []
    recorded = outcome.record.effect(f"review_notification:{checkpoint.checkpoint_id}")
    assert recorded is not None and recorded.status is EffectStatus.FAILED
    assert recorded.error is not None and recorded.error.startswith("ReviewWebhookRefused: SSRF protection refused")


async def test_without_a_webhook_a_checkpoint_starts_no_child(client, tmp_path, leftovers):
    async with Harness(client, tmp_path, planner=FixedPlanner(message("hi"))) as h:
        assert not h.activities.manifest.review.notify
        outcome = await h.run("tell bob hi", approve_as="alice")

    assert outcome.failure is None and [c.status for c in outcome.record.checkpoints] == ["approved"]
    assert children(outcome.history) == []
    assert not [e for e in outcome.record.effects if e.effect_id.startswith("review_notification")]


@pytest.mark.parametrize(
    ("reply", "error_type", "retried"),
    [
        (Reply(status=404, body="no such hook"), "ReviewWebhookRejected", False),
        (Reply(status=302, body=""), "ReviewWebhookRejected", False),  # redirects are not followed
        (Reply(status=429, body="slow down"), "ReviewWebhookFailed", True),
        (Reply(body={"ok": True}, delay=1.0), "ReviewWebhookFailed", True),  # no answer within the timeout
    ],
)
async def test_each_failed_delivery_has_a_type_that_says_whether_it_is_retried(receiver, reply, error_type, retried):
    server = receiver(reply)
    webhook = ReviewWebhook(server.url, allow_loopback=True, timeout_seconds=0.3)
    with pytest.raises(ApplicationError) as failed:
        await webhook.deliver(_notice())
    assert failed.value.type == error_type and failed.value.non_retryable is not retried


def _notice() -> ReviewNotificationInput:
    now = datetime.now(UTC)
    plan = Plan(steps=[message("hi")])
    reason = ApprovalReason(step_id="notify", tool="notify-service/send_message", reason="tool requires approval")
    checkpoint = Checkpoint(
        checkpoint_id="cp-1-0", phase=1, plan=plan, reasons=[reason], requested_at=now, expires_at=now
    )
    effect = PipelineHookEffect(effect_id="review_notification:cp-1-0", name="n", status=EffectStatus.PENDING)
    return ReviewNotificationInput(
        parent_workflow_id="req-1",
        parent_run_id="run",
        request_id="1",
        request="hi",
        checkpoint=checkpoint,
        effect=effect,
    )


def test_a_bad_webhook_url_is_a_start_up_error(monkeypatch, capsys):
    import worker

    for bad in ("ftp://hooks.example/x", "not a url", "http://:80/x", "https://hooks.example:99999/x"):
        monkeypatch.setenv("AGENT_REVIEW_WEBHOOK", bad)
        assert worker.main(["--check"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("configuration error: AGENT_REVIEW_WEBHOOK") and bad not in err, err


async def _async(value):
    return value


async def _stored_status(outcome, effect_id: str) -> bool:
    record = await outcome.stored()
    effect = record.effect(effect_id) if record is not None else None
    return effect is not None and effect.status is EffectStatus.SUCCEEDED


def test_a_worker_configured_by_the_environment_tells_the_webhook_and_its_command_approves(tmp_path, receiver):
    """``worker.py`` with ``AGENT_REVIEW_WEBHOOK``: the reviewer pastes the payload's approve command into a
    shell and the request completes."""
    server = receiver(Reply(body={"ok": True}))
    webhook = {"AGENT_REVIEW_WEBHOOK": server.url + "/slack", "AGENT_HOOK_ALLOW_LOOPBACK": "true"}
    with _running_worker(tmp_path, **webhook) as env:
        started = _cli(env, "start", "Send a message to alice with the price of ACME")
        assert started.returncode == 0, started.stderr
        workflow_id = started.stdout.split()[-1]
        deadline = time.monotonic() + 30
        while not server.received:
            assert time.monotonic() < deadline, "the webhook was not told"
            time.sleep(0.1)
        decide = server.received[0].body["review"]["decide"]
        shell_env = {**env, "USER": "alice", "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}
        approved = subprocess.run(
            decide["approve"], shell=True, cwd=ROOT, env=shell_env, capture_output=True, text=True, timeout=60
        )
        assert approved.returncode == 0, approved.stderr
        assert json.loads(approved.stdout)["reviewer"] == "alice"
        result = _cli(env, "result", workflow_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert decide["update"]["workflow_id"] == workflow_id and len(server.received) == 1
