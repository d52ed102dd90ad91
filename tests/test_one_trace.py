"""One trace per request, whoever starts it: a request started without a client span (as the Temporal CLI
or a schedule starts one) is still one trace — rooted at its workflow span, with every hook, tool and
framework activity in it — and the execution record names that trace."""

from __future__ import annotations

import uuid

from temporalio.client import Client

from client.cli import format_record
from workflows.models import RequestInput
from workflows.tracing import RequestTracing, request_trace_parent

from .harness import Harness


async def test_a_request_started_without_a_client_span_is_one_trace_named_in_its_record(client, tmp_path, spans):
    worker_client = Client(
        client.service_client,
        namespace=client.namespace,
        data_converter=client.data_converter,
        interceptors=[RequestTracing()],  # as client.connect sets it up
    )
    untraced = Client(client.service_client, namespace=client.namespace, data_converter=client.data_converter)
    workflow_id = f"req-{uuid.uuid4()}"
    async with Harness(worker_client, tmp_path) as h:
        handle = await untraced.start_workflow(
            "RequestLifecycle",
            RequestInput(request="What is the price of ACME?", metadata={"cache": "bypass"}),
            id=workflow_id,
            task_queue=h.task_queue,
        )
        out = await h.finish(handle)

    assert out.result is not None and out.record is not None
    mine = [s for s in spans.get_finished_spans() if (s.attributes or {}).get("temporalWorkflowID") == workflow_id]
    names = {s.name for s in mine}
    assert {"RunWorkflow:RequestLifecycle", "RunActivity:plan", "RunActivity:execute_tool_step"} <= names
    assert len({s.context.trace_id for s in mine}) == 1  # one trace, not one per workflow task
    trace_id = format(mine[0].context.trace_id, "032x")
    assert request_trace_parent(workflow_id, out.first_run_id).split("-")[1] == trace_id  # computable from the request
    assert out.record.trace_id == trace_id
    assert f"trace {trace_id}" in format_record(out.record)


class Auditor:
    """In-process before_planning and after_planning hooks (run by the request's first planning activity,
    before and after the planner) that change nothing, and an after_synthesis hook (a local activity) that
    keeps the answer."""

    name = "auditor"

    async def before_planning(self, ctx):
        return None

    async def after_planning(self, ctx, plan):
        return plan

    async def after_synthesis(self, ctx, response):
        return response


async def test_local_activities_trace_only_what_they_do_in_the_request_trace(client, tmp_path, spans):
    """An in-process hook's span is in the request's trace, under the workflow's context (or under the
    activity that ran it: the planning's); the local activities (the hook, the pipeline's resolution, the
    record's snapshots) add no StartActivity / RunActivity pair of their own, while the plan and the tools
    keep theirs."""
    worker_client = Client(
        client.service_client,
        namespace=client.namespace,
        data_converter=client.data_converter,
        interceptors=[RequestTracing()],
    )
    async with Harness(worker_client, tmp_path, hooks=[Auditor()]) as h:
        out = await h.run("What is the price of ACME?", metadata={"cache": "bypass"})

    assert out.result is not None and out.record is not None
    assert "after_synthesis_hook" in out.activity_types() and "persist_execution_record" in out.activity_types()
    finished = spans.get_finished_spans()
    trace_id = int(out.record.trace_id, 16)
    in_trace = [s for s in finished if s.context.trace_id == trace_id]
    names = {s.name for s in in_trace}
    [hook_span] = [s for s in in_trace if s.name == "pipeline.hook.after_synthesis.auditor"]
    [run_workflow] = [s for s in in_trace if s.name == "RunWorkflow:RequestLifecycle"]
    assert hook_span.parent is not None and hook_span.parent.span_id == run_workflow.parent.span_id
    [run_plan] = [s for s in in_trace if s.name == "RunActivity:plan"]
    for stage in ("before_planning", "after_planning"):
        [planned_hook] = [s for s in in_trace if s.name == f"pipeline.hook.{stage}.auditor"]
        assert planned_hook.parent is not None and planned_hook.parent.span_id == run_plan.context.span_id
    assert {"RunActivity:plan", "StartActivity:plan", "RunActivity:execute_tool_step"} <= names
    local = ("after_synthesis_hook", "resolve_pipeline", "persist_execution_record", "run_hook_batch")
    assert not [n for n in names if n.split(":")[-1] in local], sorted(names)
