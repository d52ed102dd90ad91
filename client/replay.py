"""Policy replay from a service or the CLI: start ``PolicyReplay`` for a candidate pipeline over a window
of records, follow its progress, and read its report.

    agents = await AgentClient.connect()
    handle = await agents.replay_policy("my_app.pipeline:stricter", ReplayWindow(since=week_ago))
    result = await handle.result()
    report = replay_report(agents.settings, result, window)  # JSON-ready dict; to_html(report) for people
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import Client, WorkflowHandle

from workflows import POLICY_REPLAY_WORKFLOW_TYPE, policy_replay_workflow_id
from workflows.models import PolicyReplayInput, PolicyReplayResult, ReplayProgress, ReplayWindow

from .settings import Settings

if TYPE_CHECKING:
    from storage.replays import ReplayReportStore

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w``: that long before ``now``."""
    found = _DURATION.match(text)
    if found is None:
        raise ValueError(f"--since {text!r}: give a duration such as 7d, 12h or 30m")
    return (now or datetime.now(UTC)) - timedelta(**{_UNITS[found.group(2)]: float(found.group(1))})


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; without a zone it is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-30T00:00:00Z)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def replay_report_store(settings: Settings) -> ReplayReportStore:
    """Where replays keep their findings: the database with ``AGENT_DATABASE_URL``, else a SQLite file of
    the state directory (what every worker of the deployment writes to)."""
    from storage.replays import ReplayReportStore

    from . import database

    db = database(settings)
    return ReplayReportStore(db if db is not None else settings.state_dir / "policy-replay.sqlite3")


async def start_policy_replay(
    client: Client,
    settings: Settings,
    pipeline: str,
    window: ReplayWindow,
    *,
    replay_id: str | None = None,
    batch_size: int = 100,
    parallel_batches: int = 4,
) -> WorkflowHandle[Any, PolicyReplayResult]:
    """Start ``PolicyReplay`` (workflow id ``policy-replay/<replay id>``) on the workers' task queue."""
    replay_id = replay_id or uuid.uuid4().hex[:12]
    return await client.start_workflow(
        POLICY_REPLAY_WORKFLOW_TYPE,
        PolicyReplayInput(
            replay_id=replay_id,
            pipeline=pipeline,
            window=window,
            batch_size=batch_size,
            parallel_batches=parallel_batches,
        ),
        id=policy_replay_workflow_id(replay_id),
        task_queue=settings.task_queue,
        result_type=PolicyReplayResult,
    )


async def replay_progress(client: Client, workflow_id: str) -> ReplayProgress:
    """Query ``progress`` of the replay's latest run (it continues as new every so many batches)."""
    return await client.get_workflow_handle(workflow_id).query("progress", result_type=ReplayProgress)


def progress_line(progress: ReplayProgress, width: int = 30) -> str:
    """``[#########.....] 450/1000 records · 12 with findings``."""
    total = progress.total
    if total is None:
        return "listing records…"
    done = int(width * progress.replayed / total) if total else width
    return (
        f"[{'#' * done}{'.' * (width - done)}] {progress.replayed}/{total} records · {progress.changed} with findings"
    )


def replay_report(settings: Settings, result: PolicyReplayResult, window: ReplayWindow) -> dict[str, Any]:
    """The finished replay's report (see ``activities.policy_replay.report``), from the report store."""
    from activities.policy_replay.report import build_report

    requests = replay_report_store(settings).requests(result.replay_id)
    return build_report(
        requests,
        replay_id=result.replay_id,
        pipeline=result.pipeline,
        window=window.model_dump(mode="json", exclude_none=True),
        total=result.total,
    )
