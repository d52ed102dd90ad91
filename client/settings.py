"""Process settings for the worker, the demo and the CLI, read from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator

from workflows.models import MAX_CHECKPOINT_EXPIRY_SECONDS

_ENVIRONMENT = {
    "TEMPORAL_ADDRESS": "temporal_address",
    "TEMPORAL_NAMESPACE": "temporal_namespace",
    "TEMPORAL_TASK_QUEUE": "task_queue",
    "TEMPORAL_UI_PORT": "ui_port",
    "AGENT_STATE_DIR": "state_dir",
    "AGENT_EXECUTION_STORE": "execution_store",
    "AGENT_PIPELINE": "pipeline_factory",
    "AGENT_RECORD_RETENTION_DAYS": "record_retention_days",
    "AGENT_ERROR_RETENTION_DAYS": "error_retention_days",
    "AGENT_CACHE_TTL_SECONDS": "cache_ttl_seconds",
    "AGENT_CHECKPOINT_EXPIRY_SECONDS": "checkpoint_expiry_seconds",
    "AGENT_HOOKS_FILE": "hooks_file",
    "AGENT_HOOK_STORE": "hook_store",
    "AGENT_HOOK_SECRET_KEY": "hook_secret_key",
    "AGENT_HOOK_ALLOW_LOOPBACK": "hook_allow_loopback",
    "AGENT_HOOK_EDITION": "hook_edition",
    "AGENT_HOOK_CHAIN_BUDGET_SECONDS": "hook_chain_budget_seconds",
    "AGENT_PAYLOAD_STORE": "payload_store",
    "AGENT_WORKFLOW_SANDBOX": "workflow_sandbox",
    "AGENT_DATABASE_URL": "database_url",
    "AGENT_DATABASE_POOL_SIZE": "database_pool_size",
    "AGENT_REVIEW_WEBHOOK": "review_webhook",
    "AGENT_MCP_SERVERS": "mcp_servers_file",
    "AGENT_MCP_ALLOW_LOOPBACK": "mcp_allow_loopback",
    "AGENT_TEMPORAL_WAIT_SECONDS": "temporal_wait_seconds",
    "AGENT_STAGE_LISTING_DELAY_SECONDS": "stage_listing_delay_seconds",
    "AGENT_WORKER_MAX_ACTIVITIES": "worker_max_activities",
    "AGENT_WORKER_MAX_LOCAL_ACTIVITIES": "worker_max_local_activities",
    "AGENT_WORKER_MAX_WORKFLOW_TASKS": "worker_max_workflow_tasks",
    "AGENT_WORKER_WORKFLOW_POLLERS": "worker_workflow_pollers",
    "AGENT_WORKER_ACTIVITY_POLLERS": "worker_activity_pollers",
    "AGENT_WORKER_MAX_CACHED_WORKFLOWS": "worker_max_cached_workflows",
    "AGENT_WORKER_STICKY_TIMEOUT_SECONDS": "worker_sticky_timeout_seconds",
    "AGENT_WORKER_THREADS": "worker_threads",
}
_LIST_ENVIRONMENT = {
    "AGENT_ALLOWED_OPERATIONS": "allowed_operations",
    "AGENT_TOOL_ALLOW_LIST": "tool_allow_list",
    "AGENT_REVIEWERS": "reviewers",
}


class Settings(BaseModel):
    """Where to find Temporal, where state lives, and which pipeline the worker runs.

    Environment: ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_TASK_QUEUE``, ``TEMPORAL_UI_PORT``,
    ``AGENT_STATE_DIR``, ``AGENT_EXECUTION_STORE``, ``AGENT_PIPELINE`` (``module:function``),
    ``AGENT_ALLOWED_OPERATIONS`` (comma-separated ``namespace/agent/capability``),
    ``AGENT_RECORD_RETENTION_DAYS``, ``AGENT_ERROR_RETENTION_DAYS``, ``AGENT_CACHE_TTL_SECONDS``,
    ``AGENT_REVIEWERS`` (comma-separated; empty: any named reviewer), ``AGENT_CHECKPOINT_EXPIRY_SECONDS``,
    ``AGENT_TOOL_ALLOW_LIST`` (comma-separated ``agent/capability``: the allow-list plugin),
    ``AGENT_HOOKS_FILE`` (declared hooks), ``AGENT_HOOK_STORE``, ``AGENT_HOOK_SECRET_KEY`` (base64, 32
    bytes), ``AGENT_HOOK_ALLOW_LOOPBACK`` (tests only), ``AGENT_HOOK_EDITION`` (``lite``: every handler type;
    ``standard``: no ``command`` handlers), ``AGENT_HOOK_CHAIN_BUDGET_SECONDS`` (what the declared hooks of
    one event share per occurrence, at most 10), ``AGENT_PAYLOAD_STORE`` (file, or ``off``),
    ``AGENT_WORKFLOW_SANDBOX`` (``true``: run the workflows in Temporal's sandbox), ``AGENT_DATABASE_URL``
    (``postgresql://…``: every store on PostgreSQL, shared by workers on several machines),
    ``AGENT_DATABASE_POOL_SIZE``, ``AGENT_REVIEW_WEBHOOK`` (an ``http(s)://`` URL told of every checkpoint
    that opens; Slack-compatible; loopback only with ``AGENT_HOOK_ALLOW_LOOPBACK``), ``AGENT_MCP_SERVERS``
    (the MCP servers whose tools the worker offers), ``AGENT_MCP_ALLOW_LOOPBACK`` (tests only),
    ``AGENT_TEMPORAL_WAIT_SECONDS``, ``AGENT_STAGE_LISTING_DELAY_SECONDS``, and the worker's capacity:
    ``AGENT_WORKER_MAX_ACTIVITIES``, ``AGENT_WORKER_MAX_LOCAL_ACTIVITIES``, ``AGENT_WORKER_MAX_WORKFLOW_TASKS``,
    ``AGENT_WORKER_WORKFLOW_POLLERS``, ``AGENT_WORKER_ACTIVITY_POLLERS``, ``AGENT_WORKER_MAX_CACHED_WORKFLOWS``,
    ``AGENT_WORKER_STICKY_TIMEOUT_SECONDS``, ``AGENT_WORKER_THREADS``.
    """

    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
    task_queue: str = "agent-requests"
    ui_port: int = 8233
    state_dir: Path = Path(".agent-state")
    execution_store: Path | None = None
    # The pipeline factory ``module:function`` the worker loads; a worker without one refuses to start.
    pipeline_factory: str | None = None
    # Lists for a pipeline's allow-list hooks (None: the pipeline's own default; the demo's is its tools).
    allowed_operations: list[str] | None = None
    tool_allow_list: list[str] | None = None
    record_retention_days: float = Field(default=7.0, gt=0)
    error_retention_days: float = Field(default=30.0, gt=0)
    cache_ttl_seconds: float = Field(default=300.0, gt=0)
    reviewers: list[str] = Field(default_factory=list)
    checkpoint_expiry_seconds: float = Field(default=24 * 3600.0, gt=0, le=MAX_CHECKPOINT_EXPIRY_SECONDS)
    # Declared hooks: the file, their store, the AES-256-GCM key, and the loopback switch.
    hooks_file: Path | None = None
    hook_store: Path | None = None
    hook_secret_key: SecretStr | None = None
    hook_allow_loopback: bool = False
    # The declared hooks' edition (``standard`` refuses command handlers at load and at dispatch) and the
    # time the declared hooks of one event share at each occurrence (never above 10 s).
    hook_edition: Literal["lite", "standard"] = "lite"
    hook_chain_budget_seconds: float = Field(default=10.0, gt=0, le=10.0)
    # Large payloads by reference (see storage.payloads): the store file, or "off" (with database_url the
    # store is in the database).
    payload_store: str | None = None
    # Run the workflows in Temporal's sandbox (see worker.build_worker for why the default is not to).
    workflow_sandbox: bool = False
    # PostgreSQL for the stores workers on several machines share (see storage); unset: SQLite files.
    database_url: SecretStr | None = None
    database_pool_size: int = Field(default=10, ge=1, le=1000)
    # The reviewers' webhook (a secret: a Slack webhook URL is its own credential); unset: nobody is told.
    review_webhook: SecretStr | None = None
    # MCP servers whose tools the worker offers (see activities.mcp), and the loopback switch of their
    # SSRF check (their encrypted headers use hook_secret_key).
    mcp_servers_file: Path | None = None
    mcp_allow_loopback: bool = False
    # How long a starting worker waits for an unreachable Temporal server (one restarting, one started
    # after the worker) before it gives up with an error.
    temporal_wait_seconds: float = Field(default=60.0, ge=0, le=3600)
    # How long a request waits in a stage before AgentLifecycleStage lists it (its first stage, a
    # checkpoint and its end are listed at once); 0 lists every stage it waits in at once, at the cost
    # of a visibility write per stage.
    stage_listing_delay_seconds: float = Field(default=2.0, ge=0, le=3600)
    # One worker's capacity. Nothing holds a slot for a request's whole life (waiting is timers, signals and
    # updates), so requests beyond these numbers queue on the server and are served as slots free up:
    # activities (hooks run as activities, tools, planning, synthesis), local activities (in-process hooks,
    # the record), workflow tasks, the pollers of each queue, and the workflows kept in memory between
    # their tasks (one evicted is replayed from its history when it next runs).
    worker_max_activities: int = Field(default=100, ge=1, le=10_000)
    worker_max_local_activities: int = Field(default=100, ge=1, le=10_000)
    worker_max_workflow_tasks: int = Field(default=100, ge=2, le=10_000)
    worker_workflow_pollers: int = Field(default=5, ge=2, le=100)
    worker_activity_pollers: int = Field(default=5, ge=1, le=100)
    worker_max_cached_workflows: int = Field(default=2000, ge=0, le=100_000)
    # How long a workflow task waits for this worker (the one that has the workflow cached) before any
    # worker may take it: after a crash, a dead worker's requests are picked up that much later.
    worker_sticky_timeout_seconds: float = Field(default=3.0, gt=0, le=60)
    # Threads for blocking work: plain ``def`` hook methods, the SQLite stores, the PostgreSQL stores'
    # synchronous side (Python's own default is the CPU count + 4, a queue under load).
    worker_threads: int = Field(default=64, ge=1, le=1024)

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("review_webhook")
    @classmethod
    def _webhook_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        parsed = urlsplit(value.get_secret_value().strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        try:
            parsed.port  # noqa: B018 - a port that does not parse raises here
        except ValueError as err:
            raise ValueError(f"bad port: {err}") from None
        return SecretStr(value.get_secret_value().strip())

    def worker_options(self) -> dict[str, Any]:
        """The ``temporalio.worker.Worker`` options these settings size."""
        from temporalio.worker import PollerBehaviorSimpleMaximum  # only a worker needs it (the CLI starts faster)

        return {
            "max_concurrent_activities": self.worker_max_activities,
            "max_concurrent_local_activities": self.worker_max_local_activities,
            "max_concurrent_workflow_tasks": self.worker_max_workflow_tasks,
            "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(self.worker_workflow_pollers),
            "activity_task_poller_behavior": PollerBehaviorSimpleMaximum(self.worker_activity_pollers),
            "max_cached_workflows": self.worker_max_cached_workflows,
            "sticky_queue_schedule_to_start_timeout": timedelta(seconds=self.worker_sticky_timeout_seconds),
        }

    @property
    def hook_store_path(self) -> Path:
        return self.hook_store or self.state_dir / "hooks.sqlite3"

    @property
    def payload_store_path(self) -> Path | None:
        if self.payload_store == "off":
            return None
        return Path(self.payload_store) if self.payload_store else self.state_dir / "payloads.sqlite3"

    @property
    def execution_store_path(self) -> Path:
        return self.execution_store or self.state_dir / "executions.sqlite3"

    @property
    def ui_url(self) -> str:
        host = self.temporal_address.rsplit(":", 1)[0] or "localhost"
        return f"http://{host}:{self.ui_port}/namespaces/{self.temporal_namespace}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> Settings:
        env = os.environ if env is None else env
        values: dict = {field: env[name] for name, field in _ENVIRONMENT.items() if env.get(name)}
        for name, field in _LIST_ENVIRONMENT.items():
            if env.get(name) is not None:
                values[field] = [item.strip() for item in env[name].split(",") if item.strip()]
        values.update(overrides)
        return cls.model_validate(values)

    @staticmethod
    def variable(field: str) -> str:
        """The environment variable that sets ``field`` (for error messages)."""
        found = [name for name, f in {**_ENVIRONMENT, **_LIST_ENVIRONMENT}.items() if f == field]
        return found[0] if found else field
