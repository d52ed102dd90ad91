"""How an activity lists the stage of a request that has waited on it for the listing delay.

A request lists the stage it waits in (``AgentLifecycleStage``) once it has waited there for the listing
delay, so that a request that never waits that long costs no event for its listing. When it waits on
activities, those activities keep the time: the workflow gives each one it schedules for such a wait the
ask (the activity header ``LISTING_HEADER``: the delay and which listing it is for), and an activity still
running once the delay has passed since it was scheduled — or one that only starts then — signals the
request (``LIST_STAGE_SIGNAL``), which lists the stage it is in by then. The activities of one wait that
run in one worker send one signal between them; a request that has ended is not signalled.

This worker interceptor does both sides: it adds the header as the workflow schedules the activity (the
request workflow's ``listing_header``), and watches the clock while the activity runs — the part that
runs in the activity worker, so the module lives with the activities. ``worker.build_worker`` installs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from workflows.listing import LIST_STAGE_SIGNAL, LISTING_HEADER

logger = logging.getLogger(__name__)

# The (run, listing) pairs this worker has signalled, newest last: enough to cover every wait in flight.
_REMEMBERED_ASKS = 4096


class _Outbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        header_of = getattr(workflow.instance(), "listing_header", None)  # the request workflow's
        header = header_of() if callable(header_of) else None
        if isinstance(header, Payload):
            input.headers = {**input.headers, LISTING_HEADER: header}
        return super().start_activity(input)


class _Inbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Outbound(outbound))


class _Watched(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, watch: StageListingWatch) -> None:
        super().__init__(next)
        self._watch = watch

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        header = input.headers.get(LISTING_HEADER)
        if header is None:
            return await super().execute_activity(input)
        watcher = asyncio.create_task(self._watch.list_when_due(activity.info(), header))
        try:
            return await super().execute_activity(input)
        finally:
            watcher.cancel()


class StageListingWatch(Interceptor):
    """Worker interceptor: the activities a request waits on ask it to list its stage once it has waited
    for the listing delay (see the module docstring). ``client``: the worker's, to signal with."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._asked: OrderedDict[tuple[str, int], None] = OrderedDict()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Watched(super().intercept_activity(next), self)

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _Inbound

    async def list_when_due(self, info: activity.Info, header: Any) -> None:
        """Once the listing delay has passed since the activity was scheduled, signal its request to list
        its stage — unless another activity of the same wait in this worker has."""
        try:
            ask = PayloadConverter.default.from_payload(header, dict)
            after, listing = float(ask["after_seconds"]), int(ask["listing"])
        except Exception:  # noqa: BLE001 - a header this worker cannot read asks nothing of it
            logger.warning("unreadable %s header on %s", LISTING_HEADER, info.activity_type)
            return
        workflow_id = info.workflow_id
        if workflow_id is None:  # an activity started on its own: no request to list
            return
        scheduled = info.scheduled_time
        if scheduled.tzinfo is None:
            scheduled = scheduled.replace(tzinfo=UTC)
        await asyncio.sleep(max(0.0, after - (datetime.now(UTC) - scheduled).total_seconds()))
        key = (info.workflow_run_id or workflow_id, listing)
        if key in self._asked:
            return
        self._asked[key] = None
        while len(self._asked) > _REMEMBERED_ASKS:
            self._asked.popitem(last=False)
        handle = self._client.get_workflow_handle(workflow_id, run_id=info.workflow_run_id)
        try:
            await handle.signal(LIST_STAGE_SIGNAL)
        except RPCError as err:  # the request ended meanwhile: nothing is left to list
            logger.debug("no stage listed for %s: %s", workflow_id, err)
        except Exception:  # the listing is bookkeeping: the activity goes on whatever it meets
            logger.warning("could not ask %s to list its stage", workflow_id, exc_info=True)
