"""What a reviewer approves is exactly what runs.

Every rewrite of a call — a Python ``ToolDecision.modify``, a declared command or HTTP hook's
``updatedInput``, the resolution of a reference to an earlier step's output — finishes before the call's
checkpoint opens; the checkpoint lists the call as it will run; approval executes a copy of those values
and no hook runs in between. A call denied before confirmation never reaches a reviewer. Against a real
Temporal server, in process and through ``worker.py`` with a pipeline of one's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError

from demo.tools import quote_price
from hooks import PipelineHook, PlanStep, ToolDecision
from workflows.models import ApprovalCall, Checkpoint, ExecutionRecord, RequestInput, RequestResult, ReviewRequest

from .doubles import FixedPlanner, eventually, quote
from .harness import Harness, Outcome
from .hook_servers import Received, Receiver, Reply
from .test_checkpoints import live_record, message, outbox, scheduled_ids, signal_events, start
from .test_declared_hooks import cmd_hook, declare, http_hook, runtime_for

ROOT = Path(__file__).resolve().parent.parent
NS = "demo-tools"


class Rewrite(PipelineHook):
    """A before_tool hook that rewrites every message to ``arguments`` (a Python ``ToolDecision.modify``)."""

    def __init__(self, name: str, **arguments: str) -> None:
        self.name = name
        self.arguments = arguments
        self.seen: list[dict] = []

    def before_tool(self, ctx, call):
        self.seen.append(dict(call.arguments))
        if call.capability != "send_message":
            return None
        return ToolDecision.modify({**call.arguments, **self.arguments}, reason="house style")


class DenyMessages(PipelineHook):
    name = "no-messages"

    def before_tool(self, ctx, call):
        if call.capability == "send_message":
            return ToolDecision.deny("messages are off today", reason="messages-off")
        return None


def before_tool_events(out: Outcome) -> list[int]:
    return scheduled_ids(out, "before_tool_hook") + scheduled_ids(out, "run_hook_batch")


def approve_event(out: Outcome) -> int:
    [signal] = [e.event_id for e in signal_events(out)]
    return signal


async def approve(handle, checkpoint: Checkpoint, reviewer: str = "ops") -> None:
    await handle.signal("approve", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": reviewer, "comment": ""})


# --------------------------------------------------------------------------------------------------
# In process
# --------------------------------------------------------------------------------------------------


async def test_a_python_rewrite_is_what_the_reviewer_approves_and_exactly_what_runs(client, tmp_path, leftovers):
    rewrite = Rewrite("redirect", to="mallory", text="changed before approval")
    planner = FixedPlanner(quote("quote-acme", "ACME"), message("notify", "bob", "hi bob"))
    async with Harness(client, tmp_path, hooks=[rewrite], planner=planner) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)

        # The reviewer is shown the call as it will run, after the rewrite, beside what was planned.
        assert checkpoint.calls == [
            ApprovalCall(
                step_id="notify",
                tool="notify-service/send_message",
                arguments={"to": "mallory", "text": "changed before approval"},
                planned_arguments={"to": "bob", "text": "hi bob"},
                modified_by=["redirect"],
            )
        ]
        assert checkpoint.plan.steps[1].arguments == {"to": "bob", "text": "hi bob"}  # the plan as accepted
        assert [c.checkpoint_id for c in await handle.query("pending_checkpoints", result_type=list[Checkpoint])] == [
            checkpoint.checkpoint_id
        ]
        live = await live_record(handle)
        assert live.lifecycle_stage == "awaiting_review"
        # Only the call that needs approval went through before_tool before the checkpoint.
        assert [(i.hook, i.step_id) for i in live.invocations()] == [("redirect", "notify")]
        assert outbox(tmp_path) == []
        await approve(handle, checkpoint)
        out = await h.finish(handle)

    assert out.failure is None, out.failure
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("mallory", "changed before approval")]
    notify = next(s for s in out.record.steps if s.step_id == "notify")
    assert notify.arguments == {"to": "mallory", "text": "changed before approval"}
    assert notify.approved_in == checkpoint.checkpoint_id and notify.modified_by == ["redirect"]
    # before_tool ran once per step: the message's before the checkpoint, none after the approval.
    signal = approve_event(out)
    assert rewrite.seen == [{"to": "bob", "text": "hi bob"}, {"symbol": "ACME"}]  # notify first, before approval
    assert [i.step_id for i in out.record.invocations() if i.stage.value == "before_tool"] == ["notify", "quote-acme"]
    notify_tool = [a for a in out.tool_activities if "(notify)" in (a.summary or "")]
    assert len(notify_tool) == 1
    assert min(scheduled_ids(out, "execute_tool_step")) > signal  # nothing of the phase ran before approval


async def test_a_denial_before_confirmation_never_reaches_a_reviewer(client, tmp_path, leftovers):
    planner = FixedPlanner(quote("quote-acme", "ACME"), message("notify", "bob", "hi bob"))
    async with Harness(client, tmp_path, hooks=[DenyMessages()], planner=planner) as h:
        out = await h.run("please do it")

    assert out.failure is None, out.failure
    assert out.record.checkpoints == [] and signal_events(out) == []
    notify = next(s for s in out.record.steps if s.step_id == "notify")
    assert (notify.status.value, notify.skip_reason, notify.skipped_by) == ("skipped", "policy", "no-messages")
    assert outbox(tmp_path) == []
    assert [s.step_id for s in out.record.steps if s.status.value == "succeeded"] == ["quote-acme"]


async def test_a_call_that_references_a_step_of_its_phase_is_approved_with_the_resolved_value(
    client, tmp_path, leftovers
):
    """The message's text holds the quote's price: its final arguments exist only once the quote has
    run. No checkpoint opens before the quote; then the message's own checkpoint shows the real price,
    after the before_tool rewrite of the resolved text."""
    notify = PlanStep(
        step_id="notify",
        namespace=NS,
        agent="notify-service",
        capability="send_message",
        arguments={"to": "alice", "text": "ACME is at {{steps.quote-acme.output.price}}"},
        depends_on=["quote-acme"],
    )
    rewrite = Rewrite("polite", to="alice")
    planner = FixedPlanner(quote("quote-acme", "ACME"), notify)
    price = quote_price("ACME")
    async with Harness(client, tmp_path, hooks=[rewrite], planner=planner) as h:
        handle = await start(h, leftovers)
        checkpoint = await h.wait_for_checkpoint(handle)
        live = await live_record(handle)
        assert [(s.step_id, s.status.value) for s in live.steps] == []  # the phase is still running
        assert checkpoint.step_id == "notify"
        [call] = checkpoint.calls
        assert call.arguments == {"to": "alice", "text": f"ACME is at {price}"}
        assert call.planned_arguments == {"to": "alice", "text": "ACME is at {{steps.quote-acme.output.price}}"}
        assert rewrite.seen[-1] == {"to": "alice", "text": f"ACME is at {price}"}  # before_tool saw it resolved
        assert outbox(tmp_path) == []
        await approve(handle, checkpoint)
        out = await h.finish(handle)

    assert out.failure is None, out.failure
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("alice", f"ACME is at {price}")]
    quote_event, notify_event = scheduled_ids(out, "execute_tool_step")
    assert quote_event < approve_event(out) < notify_event
    [decided] = out.record.checkpoints
    assert (decided.step_id, decided.status.value) == ("notify", "approved")
    assert out.record.steps[1].approved_in == decided.checkpoint_id


async def test_a_ready_call_and_a_dependent_one_are_approved_each_as_it_will_run(client, tmp_path, leftovers):
    """The phase's checkpoint holds the message that can go now; the one that quotes the price opens its
    own checkpoint once the price is known. Rejecting that one fails the request before it runs."""
    second = PlanStep(
        step_id="second",
        namespace=NS,
        agent="notify-service",
        capability="send_message",
        arguments={"to": "carol", "text": "price {{steps.quote-acme.output.price}}"},
        depends_on=["quote-acme"],
    )
    planner = FixedPlanner(message("first", "bob", "hello"), quote("quote-acme", "ACME"), second)
    async with Harness(client, tmp_path, planner=planner) as h:
        handle = await start(h, leftovers)
        phase = await h.wait_for_checkpoint(handle)
        assert phase.step_id is None and [c.step_id for c in phase.calls] == ["first"]
        await approve(handle, phase)

        async def step_checkpoint():
            found = await handle.query("pending_checkpoint", result_type=Checkpoint | None)
            return found if found is not None and found.checkpoint_id != phase.checkpoint_id else None

        own = await eventually(step_checkpoint, what="the dependent message's own checkpoint")
        assert own.step_id == "second" and own.calls[0].arguments["text"] == f"price {quote_price('ACME')}"
        await handle.signal("reject", {"checkpoint_id": own.checkpoint_id, "reviewer": "ops", "reason": "not carol"})
        out = await h.finish(handle)

    assert out.failure is not None and out.failure.type == "CheckpointRejected"
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("bob", "hello")]
    assert [(c.step_id, c.status.value) for c in out.record.checkpoints] == [(None, "approved"), ("second", "rejected")]


async def test_declared_command_and_http_rewrites_finish_before_the_checkpoint(client, tmp_path, leftovers):
    script = tmp_path / "address.py"
    script.write_text(
        "import json, sys\n"
        "event = json.load(sys.stdin)\n"
        "args = event['tool_input']\n"
        "print(json.dumps({'updatedInput': {**args, 'to': args['to'] + '@example.com'}}))\n"
    )

    def annotate(received: Received) -> Reply:
        args = received.body["tool_input"]
        return Reply(body={"decision": "allow", "updatedInput": {**args, "text": args["text"] + " (via http)"}})

    server = Receiver(respond=annotate)
    try:
        runtime = runtime_for(tmp_path / "hooks.sqlite3")
        hooks = declare(
            runtime,
            cmd_hook("address", f"{sys.executable} {script}", priority=2),
            http_hook("annotate", server.url, priority=1),
        )
        async with Harness(client, tmp_path, hooks=hooks, planner=FixedPlanner(message("notify", "bob", "hi"))) as h:
            handle = await start(h, leftovers)
            checkpoint = await h.wait_for_checkpoint(handle)
            [call] = checkpoint.calls
            assert call.arguments == {"to": "bob@example.com", "text": "hi (via http)"}
            assert call.modified_by == ["address", "annotate"]
            assert len(server.received) == 1
            await approve(handle, checkpoint)
            out = await h.finish(handle)
    finally:
        server.close()

    assert out.failure is None, out.failure
    assert [(m["to"], m["text"]) for m in outbox(tmp_path)] == [("bob@example.com", "hi (via http)")]
    assert len(server.received) == 1  # the hook never ran again after the approval
    assert max(scheduled_ids(out, "before_tool_hook")) < approve_event(out)


# --------------------------------------------------------------------------------------------------
# Through worker.py, with a pipeline of one's own
# --------------------------------------------------------------------------------------------------


async def _worker(env: dict[str, str]) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "worker.py",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = (await process.stdout.readline()).decode()
            assert line, "the worker exited before it polled"
            if "worker polling" in line:
                return process


async def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client.cli", *args, cwd=ROOT, env=env, stdout=-1, stderr=-1
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, stdout.decode(), stderr.decode()


async def test_a_pipeline_of_ones_own_gets_every_review_setting_and_approves_what_runs(client, tmp_path):
    """``AGENT_PIPELINE`` names a pipeline built by hand, with none of the settings wired in. The worker
    applies the declared hooks, the reviewers and their keys, the expiry and the reviewers' webhook around
    it; the Python, command and HTTP rewrites all finish before the checkpoint; a decision that is not
    signed by a trusted reviewer's key is refused; the approved call — signed for by the CLI with alice's
    key — is exactly what the outbox receives."""
    script = tmp_path / "address.py"
    script.write_text(
        "import json, sys\n"
        "args = json.load(sys.stdin)['tool_input']\n"
        "print(json.dumps({'updatedInput': {**args, 'to': args['to'] + '@example.com'}}))\n"
    )

    def annotate(received: Received) -> Reply:
        args = received.body["tool_input"]
        return Reply(body={"updatedInput": {**args, "text": args["text"] + " (via http)"}})

    hooks_server, webhook = Receiver(respond=annotate), Receiver(respond=lambda received: Reply(body={"ok": True}))
    hooks_file = tmp_path / "hooks.json"
    hooks_file.write_text(
        json.dumps(
            {
                "hooks": [
                    cmd_hook("address", f"{sys.executable} {script}", priority=-1),
                    http_hook("annotate", hooks_server.url, priority=-2),
                ]
            }
        )
    )
    queue = f"own-{uuid.uuid4().hex[:8]}"
    plan = [message("notify", "bob", "hi bob").model_dump(mode="json")]
    alice_key, trust = tmp_path / "alice.key", tmp_path / "reviewers.json"
    code, _, err = await _cli(
        {**os.environ, "AGENT_STATE_DIR": str(tmp_path / "state")},
        *("reviewer-key", "--reviewer", "alice", "--key-file", str(alice_key), "--trust-file", str(trust)),
    )
    assert code == 0, err
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": queue,
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_PIPELINE": "tests.worker_pipelines:hand_built",
        "AGENT_TEST_PLAN": json.dumps(plan),
        "AGENT_REVIEWERS": "alice",
        "AGENT_REVIEWER_KEYS": str(trust),
        "AGENT_CHECKPOINT_EXPIRY_SECONDS": "900",
        "AGENT_HOOKS_FILE": str(hooks_file),
        "AGENT_HOOK_ALLOW_LOOPBACK": "true",
        "AGENT_REVIEW_WEBHOOK": webhook.url,
        "PYTHONUNBUFFERED": "1",
    }
    worker = await _worker(env)
    try:
        handle = await client.start_workflow(
            "RequestLifecycle",
            RequestInput(request="tell bob hi"),
            id=f"own-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            result_type=RequestResult,
        )

        async def opened():
            return await handle.query("pending_checkpoint", result_type=Checkpoint | None)

        checkpoint = await eventually(opened, timeout=60, what="the checkpoint")
        final = {"to": "bob@example.com", "text": "hi bob [signed] (via http)"}
        [call] = checkpoint.calls
        assert (call.arguments, call.modified_by) == (final, ["sign-messages", "address", "annotate"])
        assert (
            checkpoint.expires_at - checkpoint.requested_at
        ).total_seconds() == 900  # AGENT_CHECKPOINT_EXPIRY_SECONDS

        # The reviewers' webhook is told of the call as it will run.
        async def notified():
            return webhook.received or None

        [told] = await eventually(notified, what="the reviewers' webhook")
        [told_call] = told.body["review"]["calls"]
        assert json.loads(told_call["arguments"]) == final
        assert told_call["modified_by"] == ["sign-messages", "address", "annotate"]
        assert "bob@example.com" in json.dumps(told.body["blocks"])

        # The reviewers' keys hold for this pipeline too: a typed name is refused, alice's included; the
        # CLI's inbox shows the call and its digest, and the CLI signs alice's approval with her key.
        for name in ("mallory", "alice"):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(
                    "review",
                    ReviewRequest(checkpoint_id=checkpoint.checkpoint_id, reviewer=name, decision="approve"),
                )
            assert "a decision must be signed" in str(refused.value.cause)
        code, shown, err = await _cli(env, "show", handle.id)
        assert code == 0, err
        assert '"to": "bob@example.com"' in shown and "[signed] (via http)" in shown
        assert f"calls digest: {checkpoint.calls_digest}" in shown
        reviewer = {**env, "AGENT_REVIEWER_KEY": str(alice_key)}
        code, _, err = await _cli(
            reviewer, "approve", handle.id, "--reviewer", "alice", "--comment", "ok", "--calls-digest", "sha256:0"
        )
        assert (code, err.strip()) == (1, f"refused: checkpoint {checkpoint.checkpoint_id} now runs other calls than "
                                          f"those shown ({checkpoint.calls_digest}, not sha256:0): look at it again "
                                          "before deciding")  # fmt: skip
        code, _, err = await _cli(
            reviewer, "approve", handle.id, *("--reviewer", "alice", "--comment", "ok"),
            *("--calls-digest", str(checkpoint.calls_digest)),
        )  # fmt: skip
        assert code == 0, err
        try:
            result = await asyncio.wait_for(handle.result(), 60)
        except WorkflowFailureError as failure:
            raise AssertionError(failure.cause) from failure
        record = await handle.query("execution_record", result_type=ExecutionRecord)
    finally:
        worker.terminate()
        await worker.wait()
        hooks_server.close()
        webhook.close()

    assert [(m["to"], m["text"]) for m in outbox(tmp_path / "state")] == [(final["to"], final["text"])]
    assert "send_message" in result.response
    assert record.pipeline == "hand-built" and record.steps[0].approved_in == checkpoint.checkpoint_id
    [decided] = record.checkpoints
    assert (decided.reviewer, decided.status.value) == ("alice", "approved")
    assert decided.verified_by is not None and decided.verified_by.endswith(" of alice")
    assert record.ignored_reviews == []  # the update was refused before it was accepted
    before_tool = [a for a in record.pipeline_hooks if a.stage.value == "before_tool"]
    assert [i.hook for i in before_tool] == ["sign-messages", "address", "annotate"]
    assert len(hooks_server.received) == 1
    assert all(i.started_at < checkpoint.requested_at for i in before_tool)
