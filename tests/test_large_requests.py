"""Requests that carry a lot — many large tool outputs, a large view, a wide fan-out — finish, with a
history that does not grow with what they carry; what cannot be sent ends in a typed failure, never in a
workflow task that fails forever or a terminated workflow.

With the payload store (what ``worker.py`` configures), activity payloads from 2 KiB travel by
reference; without it, the workflow bounds the bytes in flight so that no workflow task completion
exceeds what one gRPC message carries, and refuses a single payload over the inline limit.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from pydantic import BaseModel, ConfigDict
from temporalio.api.common.v1 import Payload

from activities.tools import Tool, ToolContext
from hooks import PipelineHook, RunMode, ToolDecision
from workflows.models import PlanStep, RequestStatus, StageSettings

from .conftest import with_payload_store
from .doubles import FixedPlanner
from .harness import Harness

KIB = 1024


class BlobArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class Blob(Tool):
    """Returns about 30 KB of JSON: under the 32 KiB output cap."""

    namespace = "test-tools"
    agent = "blob"
    capability = "read"
    read_only = True
    Arguments = BlobArguments

    async def run(self, arguments: BlobArguments, ctx: ToolContext):
        return {"n": arguments.n, "data": "x" * (30 * KIB)}


def blob_steps(count: int) -> list[PlanStep]:
    return [
        PlanStep(step_id=f"b{i}", namespace="test-tools", agent="blob", capability="read", arguments={"n": i})
        for i in range(count)
    ]


class BigContext(PipelineHook):
    """Puts a 250 KB enrichment in the view every later hook receives (under a key the prompt does not
    render, so the answer stays small)."""

    name = "big-context"

    def before_planning(self, ctx):
        ctx.enrichments["reference_material"] = "y" * (250 * KIB)


class RemoteGate(PipelineHook):
    """A before_tool hook that runs as a regular activity (so the view it receives is sent through Temporal)."""

    name = "remote-gate"
    run_mode = RunMode.ACTIVITY

    def before_tool(self, ctx, call):
        return ToolDecision()


class Observe(PipelineHook):
    name = "observe"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def after_execution(self, ctx, execution):
        self.seen.append(len(execution.steps))


def history_bytes(out) -> int:
    return sum(e.ByteSize() for e in out.stored_history.events)


@pytest.mark.parametrize("stored", [True, False], ids=["payload store", "no payload store"])
async def test_seventy_steps_of_thirty_kilobytes_finish_and_after_execution_sees_bounded_text(client, tmp_path, stored):
    client = with_payload_store(client, tmp_path) if stored else client
    observe = Observe()
    settings = StageSettings(max_plan_steps=70)
    async with Harness(
        client, tmp_path, hooks=[observe], tools=[Blob()], planner=FixedPlanner(*blob_steps(70)), settings=settings
    ) as h:
        out = await h.run("read seventy blobs")

    assert out.failure is None, out.failure
    assert observe.seen == [70]
    record = await out.stored()
    assert record.status is RequestStatus.SUCCEEDED and len(record.steps) == 70
    assert all(len(s.output["data"]) == 30 * KIB for s in record.steps)  # the record keeps every raw output
    if stored:
        assert history_bytes(out) < 400 * KIB, history_bytes(out)


@pytest.mark.parametrize("stored", [True, False], ids=["payload store", "no payload store"])
async def test_a_wide_fan_out_with_a_large_view_is_never_terminated(client, tmp_path, stored):
    """Twenty parallel steps, each with a before_tool activity that receives a 250 KB view: without the
    store, the workflow starts them in batches that fit a workflow task; with it, they travel by reference."""
    client = with_payload_store(client, tmp_path) if stored else client
    hooks = [BigContext(), RemoteGate()]
    async with Harness(client, tmp_path, hooks=hooks, tools=[Blob()], planner=FixedPlanner(*blob_steps(20))) as h:
        out = await h.run("read twenty blobs")

    assert out.failure is None, out.failure
    assert [s.status.value for s in out.record.steps] == ["succeeded"] * 20
    assert len(out.record.invocations(hook="remote-gate")) == 20
    if stored:
        assert history_bytes(out) < 300 * KIB, history_bytes(out)


class Oversized(PipelineHook):
    """Hands off detached work whose payload no workflow task could carry inline."""

    name = "oversized"

    def after_execution(self, ctx, execution):
        ctx.detach("oversized-work", name="Oversized work", payload="z" * (2 * 1024 * KIB))

    async def run_detached(self, work):
        return None


class Finisher(PipelineHook):
    name = "finisher"

    def __init__(self) -> None:
        self.outcomes: list[tuple[str, str | None]] = []

    def on_finish(self, ctx, outcome):
        self.outcomes.append((outcome.status, outcome.error.type if outcome.error else None))


async def test_a_payload_that_cannot_be_sent_ends_in_a_typed_failure_with_finalizers_and_a_record(client, tmp_path):
    finisher = Finisher()
    async with Harness(client, tmp_path, hooks=[Oversized(), finisher]) as h:
        out = await h.run("What is the price of ACME?")

    assert out.failure is not None and out.failure.type == "PayloadTooLarge" and out.failure.non_retryable
    assert f"at most {1536 * KIB}" in out.failure.message and out.failure_details()["hook"] == "oversized"
    assert finisher.outcomes == [("error", "PayloadTooLarge")]
    stored = await out.stored()
    assert stored.status is RequestStatus.FAILED and stored.error.type == "PayloadTooLarge"
    assert [s.status.value for s in stored.steps] == ["succeeded"]  # the work done before is kept


class Noop(PipelineHook):
    def __init__(self, name: str, run_mode: RunMode) -> None:
        self.name = name
        self.run_mode = run_mode

    def after_synthesis(self, ctx, response):
        return response


@pytest.mark.parametrize("run_mode", [RunMode.LOCAL_ACTIVITY, RunMode.ACTIVITY])
async def test_twenty_hooks_with_a_250_kb_enrichment_cost_under_a_megabyte_of_history(client, tmp_path, run_mode):
    client = with_payload_store(client, tmp_path)
    hooks = [BigContext(), *(Noop(f"noop-{i}", run_mode) for i in range(20))]
    async with Harness(client, tmp_path, hooks=hooks) as h:
        out = await h.run("What is the price of ACME?")
        baseline = await h.run("What is the price of ACME?", {"cache": "bypass"})

    assert out.failure is None and baseline.failure is None
    assert history_bytes(out) < 1024 * KIB, history_bytes(out)
    assert len(out.record.invocations(hook="noop-7")) == 1


class Tag(PipelineHook):
    def __init__(self, name: str) -> None:
        self.name = name

    def after_synthesis(self, ctx, response):
        return response + f" [{self.name}]"


async def test_in_process_hooks_never_write_their_input_to_the_payload_store(client, tmp_path):
    """A local activity's input (here: three hooks' calls, each carrying a 60 KB metadata view) never
    leaves the worker, so it is never stored; its small result stays readable in its marker."""
    client = with_payload_store(client, tmp_path)
    metadata = {"profile": "m" * (60 * KIB)}
    async with Harness(client, tmp_path, hooks=[Tag("a"), Tag("b"), Tag("c")]) as h:
        out = await h.run("What is the price of ACME?", metadata)

    assert out.failure is None, out.failure
    assert out.result.response.endswith("[a] [b] [c]")
    with sqlite3.connect(tmp_path / "payloads.sqlite3") as db:
        stored = [
            json.loads(Payload.FromString(row[0]).data or b"null") for row in db.execute("SELECT data FROM payloads")
        ]
    assert not any(isinstance(v, dict) and ("calls" in v or "view" in v or "record" in v) for v in stored)
    # The batch's marker is readable: one entry per hook, inline.
    assert [a.summary for a in out.scheduled if a.batched] == [f"after_synthesis · {n}" for n in "abc"]
