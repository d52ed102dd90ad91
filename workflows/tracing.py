"""One OpenTelemetry trace per request, whoever starts it.

Temporal's ``TracingInterceptor`` puts a workflow's spans in the trace of the client span that started
it. A request started without one — by the Temporal CLI, a schedule, a client without tracing — would
otherwise scatter its spans over one trace per workflow task. :class:`RequestTracing` gives such a
workflow a parent of its own: a span context derived from the workflow id and its first run id, the same
on every worker and on every replay, so every span of the request — each workflow task's, each hook's,
tool's and model call's activity span, its detached children — is in one trace whose id can be computed
from the request alone. (That parent is never exported itself: a trace viewer shows the request's
``RunWorkflow`` span as the top of the trace, with a parent it has not received.)
"""

from __future__ import annotations

import hashlib
from typing import Any

from temporalio import workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.worker import WorkflowInterceptorClassInput


def request_trace_parent(workflow_id: str, first_run_id: str) -> str:
    """The W3C ``traceparent`` a request without a client span is traced under."""
    seed = hashlib.sha256(f"{workflow_id}\x00{first_run_id}".encode()).hexdigest()
    return f"00-{seed[:32]}-{seed[32:48]}-01"


class _RequestTraceInbound(TracingWorkflowInboundInterceptor):
    def _load_workflow_context_carrier(self) -> Any:
        carrier = super()._load_workflow_context_carrier()
        if carrier:
            return carrier
        info = workflow.info()
        self._workflow_context_carrier = {
            "traceparent": request_trace_parent(info.workflow_id, info.first_execution_run_id)
        }
        return self._workflow_context_carrier


class RequestTracing(TracingInterceptor):
    """Temporal's tracing interceptor, with one trace per request even without a client span."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)  # registers the interceptor's extern functions
        return _RequestTraceInbound
