"""Keeps the payloads of local activities out of the payload store.

A local activity's input never leaves the worker: writing it to the payload store (and reading it
back) would only add work to every in-process hook and record write. Its result is recorded in the
activity's marker, readable in the UI: it goes to the store only when it is large. This worker
interceptor marks them (see ``ByReference``) as the workflow schedules a local activity and as a local
activity returns.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity, workflow
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)


def _mark(value: Any, method: str) -> None:
    mark = getattr(value, method, None)
    if callable(mark):
        mark()


class _Outbound(WorkflowOutboundInterceptor):
    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        for arg in input.args:
            _mark(arg, "kept_inline")
        return super().start_local_activity(input)


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))


class _ActivityInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await super().execute_activity(input)
        if activity.info().is_local:
            _mark(result, "recorded_in_marker")
        return result


class LocalPayloadsInline(Interceptor):
    """Worker interceptor: local activities' inputs stay inline; their results go by reference only
    when large."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityInbound(super().intercept_activity(next))

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _Inbound
