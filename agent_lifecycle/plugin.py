"""The Temporal plugin: the lifecycle on a client and worker of one's own.

``AgentPlugin`` brings everything a lifecycle worker needs — the data converter (payload store, encryption),
request tracing, the workflows, the pipeline's activities, the workflow runner, the worker interceptors and
the caller identity that reviews are checked against — to ``Client.connect(..., plugins=[plugin])``. A
worker built from that client inherits it::

    plugin = AgentPlugin(build, settings=Settings.from_env())
    client = await Client.connect("localhost:7233", plugins=[plugin])
    async with Worker(client, task_queue="agent-requests"):
        ...

``Replayer(workflows=[], plugins=[plugin])`` replays the histories such a worker wrote. ``worker.py`` builds
its worker through the same plugin (``worker.build_worker``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from temporalio.plugin import SimplePlugin
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerConfig

from activities.lifecycle import LifecycleActivities
from activities.listing_watch import StageListingWatch
from client.settings import Settings
from workflows import WORKFLOWS, callers
from workflows.local_payloads import LocalPayloadsInline

PLUGIN_NAME = "agent-lifecycle"

# After a worker dies, the next workflow task of each of its requests first waits this long on the dead
# worker's sticky queue before any worker may take it (Temporal's default is 10 s): the setting's default.
STICKY_SCHEDULE_TO_START = timedelta(seconds=Settings.model_fields["worker_sticky_timeout_seconds"].default)
# Heartbeats reach the server at most this often; a cancellation reaches a heartbeating activity only in
# a heartbeat's reply, so this bounds how long stopping a lease keeper takes (the SDK's default: 80 % of
# the heartbeat timeout, i.e. 4 s).
HEARTBEAT_THROTTLE = timedelta(seconds=1)

PipelineFactory = Callable[[Settings], LifecycleActivities]


class AgentPlugin(SimplePlugin):
    """The lifecycle's workflows, activities, converter and interceptors, for a client and worker of one's own.

    Args:
        pipeline: The pipeline the worker runs: the ``LifecycleActivities`` a factory returned, or the
            factory itself (called with ``settings``; the worker settings are then applied around it, as
            ``worker.py`` does). ``None``: a client-only plugin (the converter and tracing; no worker parts).
        settings: The process settings (default: read from the environment). With them the plugin also
            sizes the worker, registers the lifecycle's search attributes before it polls, and closes the
            pipeline's connections (MCP servers, model clients) when it stops.
        data_converter: Whether the plugin sets the client's data converter (payload store, encryption).
        tracing: Whether one trace spans each request (the OpenTelemetry interceptor).
        sandboxed: Run the workflows in Temporal's sandbox (default: ``AGENT_WORKFLOW_SANDBOX``; see
            ``worker.build_worker`` for why the lifecycle does not need it).
        ui_shows_text: Show request text in the Temporal UI although payloads are encrypted (default:
            ``AGENT_UI_SHOWS_TEXT``).
        replay: The ``PolicyReplay`` activities to run beside the pipeline's (``worker.py`` gives its own).
    """

    def __init__(
        self,
        pipeline: LifecycleActivities | PipelineFactory | None = None,
        *,
        settings: Settings | None = None,
        data_converter: bool = True,
        tracing: bool = True,
        sandboxed: bool | None = None,
        ui_shows_text: bool | None = None,
        replay: Any = None,
        _manage: bool = True,
    ) -> None:
        if settings is None and (_manage or data_converter):
            settings = Settings.from_env()
        self.settings = settings
        if pipeline is not None and not isinstance(pipeline, LifecycleActivities):
            from client.pipeline import apply_settings

            assert settings is not None
            built = pipeline(settings)
            if not isinstance(built, LifecycleActivities):
                raise TypeError(
                    f"the pipeline factory returned {type(built).__name__}, not LifecycleActivities "
                    "(build it with agent_lifecycle.build_pipeline)"
                )
            apply_settings(built, settings)
            pipeline = built
        self.pipeline: LifecycleActivities | None = pipeline
        self._replay = replay
        self._sandboxed = sandboxed if sandboxed is not None else bool(settings and settings.workflow_sandbox)
        self._ui_shows_text = (
            ui_shows_text if ui_shows_text is not None else bool(settings and settings.protection.ui_shows_text)
        )
        self._manage = _manage and settings is not None
        converter = None
        if data_converter:
            from client import process_data_converter

            assert settings is not None
            converter = process_data_converter(settings)
        interceptors: list[Any] = []
        if tracing:
            from workflows.tracing import RequestTracing

            interceptors.append(RequestTracing())
        super().__init__(
            PLUGIN_NAME,
            data_converter=converter,
            interceptors=interceptors,
            workflows=list(WORKFLOWS) if pipeline is not None else None,
            workflow_runner=None if self._sandboxed or pipeline is None else UnsandboxedWorkflowRunner(),
            run_context=None,
        )

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        if self.pipeline is None:
            return super().configure_worker(config)
        if any(workflow in WORKFLOWS for workflow in config.get("workflows") or ()):
            return config  # given to the worker as well as its client: configured once
        from client.pipeline import check_servable

        check_servable(self.pipeline)  # no planner, or tools with no required gate: refused before it polls
        config = super().configure_worker(config)
        client = config["client"]  # type: ignore[typeddict-item]
        pipeline = self.pipeline
        replay = self._replay
        config["activities"] = [
            *(config.get("activities") or ()),
            *pipeline.activities(),
            *(replay.activities() if replay is not None else ()),
        ]
        # Encrypted payloads keep request text out of the UI's summaries unless the settings allow it.
        pipeline.manifest.ui_shows_text = client.data_converter.payload_codec is None or self._ui_shows_text
        callers.install()  # handlers can read who sent a signal or update (a reviewer, by the server's identity)
        config["interceptors"] = [LocalPayloadsInline(), StageListingWatch(client), *(config.get("interceptors") or ())]
        if self._manage and self.settings is not None:
            for name, value in self.settings.worker_options().items():
                config.setdefault(name, value)  # type: ignore[misc]
        config.setdefault("sticky_queue_schedule_to_start_timeout", STICKY_SCHEDULE_TO_START)
        config.setdefault("max_heartbeat_throttle_interval", HEARTBEAT_THROTTLE)
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        if not (self._manage and self.pipeline is not None and self.settings is not None):
            await next(worker)
            return
        await prepare(worker.client, self.settings, self.pipeline)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.pipeline.aclose)
            await next(worker)


async def prepare(client: Any, settings: Settings, activities: LifecycleActivities) -> None:
    """What a process does before it serves requests: register the lifecycle search attributes (or
    learn they cannot be), so requests set them and a reviewer's inbox can find waiting requests."""
    from client import database
    from client.search import ensure_search_attributes

    activities.manifest.search_attributes = await ensure_search_attributes(
        client, settings.temporal_namespace, wait_seconds=settings.temporal_wait_seconds
    )
    activities.manifest.stage_listing_delay_seconds = settings.stage_listing_delay_seconds
    activities.manifest.payload_store = client.data_converter.external_storage is not None
    db = database(settings)
    if db is not None:  # every store's schema on it, before any request
        await db.migrate()
