"""One request's history read as a timeline: each event with its time offset and what it is, and where
the request's time went.

A local activity leaves no event while it runs: it runs inside the workflow task that scheduled it (the
task is held open, heartbeating, until it completes), and its marker is written when that task
completes. So a workflow task's time (started → completed) includes the local activities it ran; the
markers it wrote are listed under it.

:func:`breakdown` splits the request's wall time (execution started → completed) into three parts that
add up to it: workflow tasks queued (from the later of their scheduling and the last result they carry
to a worker picking them up), workflow tasks running (started → completed, local activities included),
and the workflow waiting on its activities and timers (the rest).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict
from temporalio.api.enums.v1 import EventType

_E = EventType
KINDS = {
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: "execution",
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "execution",
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "execution",
    _E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: "workflow task",
    _E.EVENT_TYPE_WORKFLOW_TASK_STARTED: "workflow task",
    _E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "workflow task",
    _E.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow task",
    _E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow task",
    _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity",
    _E.EVENT_TYPE_ACTIVITY_TASK_STARTED: "activity",
    _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity",
    _E.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity",
    _E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity",
    _E.EVENT_TYPE_TIMER_STARTED: "timer",
    _E.EVENT_TYPE_TIMER_FIRED: "timer",
    _E.EVENT_TYPE_TIMER_CANCELED: "timer",
    _E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: "search attribute upsert",
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signal",
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: "update",
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED: "update",
    _E.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED: "memo",
}


_INPUTS = {
    _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    _E.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    _E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    _E.EVENT_TYPE_TIMER_FIRED,
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
}


def _ms(event: Any) -> float:
    return event.event_time.seconds * 1000.0 + event.event_time.nanos / 1e6


def _summary(event: Any) -> str:
    data = event.user_metadata.summary.data
    if not data:
        return ""
    try:
        return str(json.loads(data))
    except ValueError:
        return data.decode(errors="replace")


def _marker_detail(event: Any, key: str) -> dict[str, Any]:
    payloads = event.marker_recorded_event_attributes.details.get(key)
    if payloads is None or not payloads.payloads:
        return {}
    try:
        value = json.loads(payloads.payloads[0].data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def kind(event: Any) -> str:
    """What the event is, in the words the analysis uses."""
    if event.event_type == _E.EVENT_TYPE_MARKER_RECORDED:
        name = event.marker_recorded_event_attributes.marker_name
        if name == "core_local_activity":
            return "local-activity marker"
        if name == "core_patch":
            return "patch marker"
        return f"marker {name}"
    return KINDS.get(event.event_type, EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower())


def describe(event: Any) -> str:
    """The event's type and, where it has them, what ran or changed."""
    name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
    summary = _summary(event)
    if event.event_type == _E.EVENT_TYPE_MARKER_RECORDED:
        attributes = event.marker_recorded_event_attributes
        if attributes.marker_name == "core_local_activity":
            data = _marker_detail(event, "data")
            return f"MARKER local activity {data.get('activity_type', '?')}" + (f" · {summary}" if summary else "")
        if attributes.marker_name == "core_patch":
            return f"MARKER patch {_marker_detail(event, 'patch-data').get('id', '?')}"
        return f"MARKER {attributes.marker_name}"
    if event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        activity = event.activity_task_scheduled_event_attributes.activity_type.name
        return f"{name} {activity}" + (f" · {summary}" if summary and summary != activity else "")
    if event.event_type == _E.EVENT_TYPE_TIMER_STARTED:
        attributes = event.timer_started_event_attributes
        seconds = attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        return f"{name} {seconds:g} s" + (f" · {summary}" if summary else "")
    if event.event_type == _E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
        fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        return f"{name} " + ", ".join(f"{k}={v.data.decode(errors='replace')}" for k, v in fields.items())
    if event.event_type == _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
        return f"{name} {event.workflow_execution_signaled_event_attributes.signal_name}"
    return name


def by_reference_bytes(events: Iterable[Any]) -> int:
    """Bytes kept out of the history by reference (in an external payload store), as the references say."""
    total = 0

    def walk(value: Any) -> None:
        nonlocal total
        if isinstance(value, dict):
            for external in value.get("externalPayloads", ()):
                total += int(external.get("sizeBytes", 0))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for event in events:
        walk(MessageToDict(event))
    return total


def history_figures(events: Sequence[Any]) -> dict[str, Any]:
    """Events (of which markers: local activities' and patches'), serialized bytes, bytes by reference,
    and events by :func:`kind`."""
    return {
        "events": len(events),
        "markers": sum(e.event_type == _E.EVENT_TYPE_MARKER_RECORDED for e in events),
        "bytes": sum(e.ByteSize() for e in events),
        "by_reference_bytes": by_reference_bytes(events),
        "by_kind": dict(Counter(kind(e) for e in events)),
    }


@dataclass
class Breakdown:
    total_ms: float
    workflow_task_queue_ms: float  # scheduled -> started, summed
    workflow_task_run_ms: float  # started -> completed, summed (local activities included)
    waiting_ms: float  # the workflow waiting on activities and timers
    workflow_tasks: int
    local_activities: int
    activity_queue_ms: float  # activities' scheduled -> started, summed over those the workflow waited on
    activity_run_ms: float  # started -> completed, summed likewise

    def as_dict(self) -> dict[str, float | int]:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def breakdown(events: Sequence[Any]) -> Breakdown:
    start = _ms(events[0])
    end = _ms(events[-1])
    queue = run = waiting = 0.0
    scheduled_at: float | None = None
    started_at: float | None = None
    last_completed = start
    last_input = start  # the latest activity completion, timer or signal: what a workflow task waits for
    tasks = 0
    for event in events:
        if event.event_type in _INPUTS:
            last_input = max(last_input, _ms(event))
        elif event.event_type == _E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled_at = _ms(event)
        elif event.event_type == _E.EVENT_TYPE_WORKFLOW_TASK_STARTED and scheduled_at is not None:
            # A task scheduled by the first of several activities waits for the others' results too:
            # it is queued only from the last input it carries.
            started_at = _ms(event)
            ready = min(started_at, max(scheduled_at, last_input))
            waiting += max(0.0, ready - last_completed)
            queue += started_at - ready
        elif event.event_type == _E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started_at is not None:
            last_completed = _ms(event)
            run += last_completed - started_at
            tasks += 1
            scheduled_at = started_at = None
    # Activities, by the workflow task that waited for them: each wait is as long as its slowest
    # activity, whose queue and run times are the ones on the request's path.
    scheduled: dict[int, float] = {}
    started: dict[int, float] = {}
    spans: dict[int, tuple[float, float]] = {}  # scheduled id -> (queue, run)
    for event in events:
        if event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = _ms(event)
        elif event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[event.activity_task_started_event_attributes.scheduled_event_id] = _ms(event)
        elif event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = event.activity_task_completed_event_attributes.scheduled_event_id
            if sid in scheduled and sid in started:
                spans[sid] = (started[sid] - scheduled[sid], _ms(event) - started[sid])
    batches: dict[int, list[tuple[float, float]]] = {}
    for event in events:
        if event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED and event.event_id in spans:
            task = event.activity_task_scheduled_event_attributes.workflow_task_completed_event_id
            batches.setdefault(task, []).append(spans[event.event_id])
    critical = [max(batch, key=sum) for batch in batches.values()]
    return Breakdown(
        total_ms=end - start,
        workflow_task_queue_ms=queue,
        workflow_task_run_ms=run,
        waiting_ms=waiting + max(0.0, end - last_completed),
        workflow_tasks=tasks,
        local_activities=sum(kind(e) == "local-activity marker" for e in events),
        activity_queue_ms=sum(q for q, _ in critical),
        activity_run_ms=sum(r for _, r in critical),
    )


def format_timeline(title: str, events: Sequence[Any]) -> str:
    """The events in order: offset from the start (ms), the gap since the previous event (ms), event id,
    what it is. A workflow task's completion also shows how long it ran."""
    start = _ms(events[0])
    lines = [f"{title}: {len(events)} events, {sum(e.ByteSize() for e in events)} bytes"]
    lines.append(f"{'offset ms':>10} {'+ms':>7}  {'id':>3}  event")
    previous = start
    task_started: float | None = None
    for event in events:
        at = _ms(event)
        note = ""
        if event.event_type == _E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            task_started = at
        elif event.event_type == _E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and task_started is not None:
            note = f"  (ran {at - task_started:.1f} ms)"
        elif event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            note = f"  (of #{event.activity_task_completed_event_attributes.scheduled_event_id})"
        elif event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            note = f"  (of #{event.activity_task_started_event_attributes.scheduled_event_id})"
        lines.append(f"{at - start:>10.1f} {at - previous:>+7.1f}  {event.event_id:>3}  {describe(event)}{note}")
        previous = at
    parts = breakdown(events)
    lines.append(
        f"  total {parts.total_ms:.1f} ms = workflow tasks queued {parts.workflow_task_queue_ms:.1f} "
        f"+ workflow tasks running {parts.workflow_task_run_ms:.1f} ({parts.workflow_tasks} tasks, "
        f"{parts.local_activities} local activities inside) + waiting on activities/timers "
        f"{parts.waiting_ms:.1f} (on the path: activity queue {parts.activity_queue_ms:.1f}, "
        f"run {parts.activity_run_ms:.1f})"
    )
    counts = Counter(kind(e) for e in events)
    lines.append("  events: " + ", ".join(f"{n} {k}" for k, n in counts.most_common()))
    return "\n".join(lines)
