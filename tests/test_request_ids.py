"""What a request id means to a service: starting the same request twice runs it once; reusing an id for
a different request is refused; and a tool's idempotency key never makes one run return another run's
side effect."""

from __future__ import annotations

import json
import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus

from client.api import RequestIdConflict, start_request
from client.settings import Settings

from .harness import Harness


def ledger(tmp_path) -> list[dict]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_starting_a_request_id_again_with_the_same_input_attaches_to_the_one_run(client, tmp_path):
    async with Harness(client, tmp_path) as h:
        settings = Settings(task_queue=h.task_queue, state_dir=tmp_path)
        request_id = uuid.uuid4().hex[:12]
        first = await start_request(client, settings, "Buy 10 ACME", metadata={"desk": "a"}, request_id=request_id)
        again_while_running = await start_request(
            client, settings, "Buy 10 ACME", metadata={"desk": "a"}, request_id=request_id
        )
        result = await first.result()
        again_when_finished = await start_request(
            client, settings, "Buy 10 ACME", metadata={"desk": "a"}, request_id=request_id
        )
        attached = await again_when_finished.result()
        h.histories.append(await first.fetch_history())

    assert first.id == again_while_running.id == again_when_finished.id == f"request-{request_id}"
    assert (await again_while_running.describe()).run_id == (await first.describe()).run_id
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{first.id}'")]
    assert len(runs) == 1 and runs[0].status == WorkflowExecutionStatus.COMPLETED
    assert attached == result
    assert [(e["side"], e["quantity"]) for e in ledger(tmp_path)] == [("buy", 10)]  # bought once


@pytest.mark.parametrize(
    "text,metadata",
    [("Buy 20 ACME", {"desk": "a"}), ("Buy 10 ACME", {"desk": "b"}), ("Buy 10 ACME", {})],
    ids=["other request", "other metadata", "no metadata"],
)
async def test_reusing_a_request_id_for_a_different_request_is_refused(client, tmp_path, text, metadata):
    async with Harness(client, tmp_path) as h:
        settings = Settings(task_queue=h.task_queue, state_dir=tmp_path)
        request_id = uuid.uuid4().hex[:12]
        first = await start_request(client, settings, "Buy 10 ACME", metadata={"desk": "a"}, request_id=request_id)
        with pytest.raises(RequestIdConflict) as refused:
            await start_request(client, settings, text, metadata=metadata, request_id=request_id)
        await first.result()
        with pytest.raises(RequestIdConflict):  # ... and after it finished
            await start_request(client, settings, text, metadata=metadata, request_id=request_id)
        h.histories.append(await first.fetch_history())

    assert refused.value.type == "RequestIdConflict" and refused.value.non_retryable
    assert refused.value.details[0]["workflow_id"] == first.id
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{first.id}'")]
    assert len(runs) == 1
    assert [(e["side"], e["quantity"]) for e in ledger(tmp_path)] == [("buy", 10)]


async def test_a_new_run_under_a_reused_workflow_id_never_gets_the_earlier_runs_side_effect(client, tmp_path):
    """Started directly (Temporal's default id policy allows a new run once the first has closed): the
    second run's trade is a different call, so it is executed, not answered with the first run's order."""
    workflow_id = f"reused-{uuid.uuid4().hex[:8]}"
    async with Harness(client, tmp_path) as h:
        first = await h.run("Buy 10 ACME", workflow_id=workflow_id)
        second = await h.run("Buy 20 ACME", workflow_id=workflow_id)
        same_again = await h.run("Buy 20 ACME", workflow_id=workflow_id)

    for out in (first, second, same_again):
        assert out.failure is None
    trades = [s.output for out in (first, second, same_again) for s in out.record.steps]
    assert [(t["quantity"], t["replayed"]) for t in trades] == [(10, False), (20, False), (20, False)]
    assert len({t["order_id"] for t in trades}) == 3
    assert [(e["side"], e["quantity"]) for e in ledger(tmp_path)] == [("buy", 10), ("buy", 20), ("buy", 20)]
    keys = [s.idempotency_key for out in (first, second, same_again) for s in out.record.steps]
    assert len(set(keys)) == 3
    assert keys[1] == second.idempotency_key("trade-acme", {"symbol": "ACME", "side": "buy", "quantity": 20})


async def test_a_namespace_without_the_lifecycle_search_attributes_still_takes_requests(client):
    # The client starts a request listed with its kind and first stage; a namespace that lacks those
    # attributes refuses such a start, and the client starts it unlisted instead of failing.
    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
    from temporalio.client import Client
    from temporalio.service import RPCError

    from workflows import data_converter
    from workflows import search_attributes as sa

    from .doubles import eventually

    namespace = f"bare-{uuid.uuid4().hex[:8]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400))
    )
    bare = Client(client.service_client, namespace=namespace, data_converter=data_converter)
    handles = []

    async def started() -> bool:
        try:
            handles.append(await start_request(bare, Settings(task_queue="nobody-polls"), "What is ACME at?"))
        except RPCError as err:  # the namespace not yet known to every part of the server
            if "namespace" not in err.message.lower():
                raise
            return False
        return True

    await eventually(started, what="a request started on the new namespace", timeout=60)
    handle = handles[0]
    attributes = (await handle.describe()).typed_search_attributes
    assert attributes.get(sa.WORKFLOW_KIND) is None and attributes.get(sa.LIFECYCLE_STAGE) is None
    await handle.terminate("test over")
