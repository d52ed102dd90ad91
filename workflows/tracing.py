"""One OpenTelemetry trace per request, whoever starts it.

Temporal's ``TracingInterceptor`` puts a workflow's spans in the trace of the client span that started
it. A request started without one — by the Temporal CLI, a schedule, a client without tracing — would
otherwise scatter its spans over one trace per workflow task. :class:`RequestTracing` gives such a
workflow a parent of its own: a span context derived from the workflow id and its first run id, the same
on every worker and on every replay, so every span of the request — each workflow task's, each hook's,
tool's and model call's activity span, its detached children — is in one trace whose id can be computed
from the request alone. (That parent is never exported itself: a trace viewer shows the request's
``RunWorkflow`` span as the top of the trace, with a parent it has not received.)

Local activities — the in-process hooks, the pipeline's resolution, the record's snapshots — get no
``StartActivity``/``RunActivity`` span pair: they never leave the worker, the pair would only wrap what
they trace themselves (each hook its ``pipeline.hook.<stage>.<hook>`` span), and it cost the benchmark's
standard request (seven local activities) about 5 ms of its ~150 ms, measured side by side on one
worker. Their context still travels in their headers, so every span they open is in the request's trace,
under the workflow's context. Regular activities keep the pair. (This reaches into the contrib
interceptor's internals — its workflow outbound class and header helpers — as the request parent does.)
"""

from __future__ import annotations

import hashlib
from typing import Any

import opentelemetry.context
from temporalio import activity, workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.contrib.opentelemetry._interceptor import _TracingWorkflowOutboundInterceptor
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    StartLocalActivityInput,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)


def request_trace_parent(workflow_id: str, first_run_id: str) -> str:
    """The W3C ``traceparent`` a request without a client span is traced under."""
    seed = hashlib.sha256(f"{workflow_id}\x00{first_run_id}".encode()).hexdigest()
    return f"00-{seed[:32]}-{seed[32:48]}-01"


class _RequestTraceOutbound(_TracingWorkflowOutboundInterceptor):
    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        input.headers = self.root._context_to_headers(input.headers)  # the workflow's context, no span
        return self.next.start_local_activity(input)


class _RequestTraceInbound(TracingWorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self.next.init(_RequestTraceOutbound(outbound, self))

    def _load_workflow_context_carrier(self) -> Any:
        carrier = super()._load_workflow_context_carrier()
        if carrier:
            return carrier
        info = workflow.info()
        self._workflow_context_carrier = {
            "traceparent": request_trace_parent(info.workflow_id, info.first_execution_run_id)
        }
        return self._workflow_context_carrier


class _LocalActivityContext(ActivityInboundInterceptor):
    """A local activity runs in the context its headers carry, without a span of its own; any other
    activity goes through the tracing interceptor (its ``RunActivity`` span)."""

    def __init__(self, next: ActivityInboundInterceptor, traced: ActivityInboundInterceptor, root: TracingInterceptor):
        super().__init__(next)
        self._traced, self._root = traced, root

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self._traced.init(outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if not activity.info().is_local:
            return await self._traced.execute_activity(input)
        context = self._root._context_from_headers(input.headers)
        token = opentelemetry.context.attach(context) if context is not None else None
        try:
            return await self.next.execute_activity(input)
        finally:
            if token is not None:
                opentelemetry.context.detach(token)


class RequestTracing(TracingInterceptor):
    """Temporal's tracing interceptor, with one trace per request even without a client span, and no
    span pair of its own around a local activity."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _LocalActivityContext(next, super().intercept_activity(next), self)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)  # registers the interceptor's extern functions
        return _RequestTraceInbound
