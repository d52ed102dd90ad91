"""A worker around a chosen pipeline, and what a user would check after a request.

Every history a :class:`Harness` produces is replayed with ``Replayer`` when the harness closes, so
each test also proves the workflow deterministic for the paths it exercised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory, WorkflowQueryFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities import LifecycleActivities, ToolRegistry
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.tools import demo_tools
from hooks import HookRegistry
from storage.executions import SQLiteExecutionStore
from worker import build_worker
from workflows import WORKFLOWS, data_converter, idempotency_key
from workflows.local_payloads import LocalPayloadsInline
from workflows.model_steps import ANSWERS
from workflows.models import (
    ApproveSignal,
    Checkpoint,
    ExecutionRecord,
    HookBatchOutcome,
    RequestInput,
    RequestResult,
    ReviewSettings,
    Stage,
    StageSettings,
)
from workflows.stages import HOOK_BATCH_ACTIVITY, STAGE_SEPARATOR, STAGES, hook_stage_of

HOOK_ACTIVITY_TYPES = {"before_planning_hook", "after_planning_hook", "after_execution_hook", "after_synthesis_hook"}


def marker_activity_type(marker: Any) -> str | None:
    """The activity type of a local activity's marker as the stage table names it: an in-process hook's
    ``<stage>:<hook>`` as ``<stage>_hook``, a batch's ``<stage>:<hook> + ...`` as ``run_hook_batch`` (the
    types executions recorded before hooks were named by their types ran under); None for another marker."""
    if marker.marker_name != "core_local_activity" or "data" not in marker.details:
        return None
    recorded = data_converter.payload_converter.from_payloads(marker.details["data"].payloads)[0]["activity_type"]
    stage = hook_stage_of(recorded)
    if stage is None:
        return recorded
    return HOOK_BATCH_ACTIVITY if _is_batch(marker) else STAGES[stage].activity


def marker_stage_activity(marker: Any) -> str | None:
    """The ``<stage>_hook`` activity of the stage whose in-process hooks a local activity's marker ran
    (the first stage of a batch that ran on into later ones); None for a marker of anything else."""
    if marker.marker_name != "core_local_activity" or "data" not in marker.details:
        return None
    stage = hook_stage_of(
        data_converter.payload_converter.from_payloads(marker.details["data"].payloads)[0]["activity_type"]
    )
    return STAGES[stage].activity if stage is not None else None


def _is_batch(marker: Any) -> bool:
    """Whether a local activity marker recorded a batch's result (each hook's entry)."""
    if "result" not in marker.details:
        return False
    result = data_converter.payload_converter.from_payloads(marker.details["result"].payloads)[0]
    return isinstance(result, dict) and "entries" in result


def _batched_invocations(marker: Any, summary: str | None, recorded: str) -> list[ScheduledActivity]:
    """The hook invocations one batch marker records, from its result: ``<stage> · <hook>`` each, with
    the step suffix of the batch's summary — the hooks of each later stage the batch ran on into
    (``<stage> · <hooks> → <stage> · <hooks>``) after the first stage's."""
    if "result" not in marker.details or summary is None:
        return []
    batch = data_converter.payload_converter.from_payloads(marker.details["result"].payloads, [HookBatchOutcome])[0]
    parts = summary.split(STAGE_SEPARATOR)
    found = []
    for part, entries in zip(parts, [batch.entries, *batch.ahead], strict=False):
        stage, _, rest = part.partition(" · ")
        step = rest.rsplit(" · ", 1)[1] if rest.count(" · ") else None
        found += [
            ScheduledActivity(
                STAGES[Stage(stage)].activity,
                f"{stage} · {entry.hook}" + (f" · {step}" if step else ""),
                local=True,
                batched=True,
                recorded_type=None if recorded == HOOK_BATCH_ACTIVITY else recorded,
            )
            for entry in entries
        ]
    return found


def _tool_step_invocations(summary: str, result: Any) -> list[ScheduledActivity]:
    """A tool step's activity that ran its in-process hooks around the tool (``execute · <tool> (<step>)
    with <stage>:<hook> + <hook> · …``): each hook invocation its result records, as a batch's are
    reported, and the tool itself unless the hooks withheld it (or the activity never completed: then the
    tool alone, as asked)."""
    head = summary.removeprefix("execute · ").split(" with ", 1)[0]
    tool, _, step = head.rpartition(" (")
    step = step.rstrip(")")
    call = ScheduledActivity("execute_tool_step", f"execute · {tool} ({step})")
    if result is None:
        return [call]
    output = data_converter.payload_converter.from_payloads(result.payloads if hasattr(result, "payloads") else result)[
        0
    ]
    found = [
        ScheduledActivity(STAGES[Stage.BEFORE_TOOL].activity, f"before_tool · {e['hook']} · {step}", True, True)
        for e in output.get("before", [])
    ]
    if not output.get("withheld"):
        found.append(call)
    found += [
        ScheduledActivity(STAGES[Stage.AFTER_TOOL].activity, f"after_tool · {e['hook']} · {step}", True, True)
        for e in output.get("after", [])
    ]
    return found


@dataclass
class ScheduledActivity:
    activity_type: str
    summary: str | None
    local: bool = False
    batched: bool = False  # one hook invocation of a batch (one marker for consecutive in-process hooks)
    # The type the history records, where it differs: an in-process hook's ``<stage>:<hook>`` (or a
    # batch's ``<stage>:<hook> + <hook>``), reported in ``activity_type`` as its stage's ``<stage>_hook``
    # (and left out of comparisons: tests compare what was scheduled at which stage).
    recorded_type: str | None = field(default=None, compare=False)


def _plan_invocations(summary: str, result: Any) -> list[ScheduledActivity]:
    """A planning activity that ran in-process planning hooks (``plan · phase <n> with
    before_planning:<hook> + <hook> · after_planning:<hook> + <hook>``, then ``· if it answers:`` and the
    stages it runs on into after a text answer): each before_planning invocation its result records, the
    planning (unless those hooks stopped it), then each after_planning invocation and each invocation of
    the stages it ran on into, as a batch's are reported (the planning alone when the activity never
    completed: the workflow ran them)."""
    planning = ScheduledActivity("plan", summary.split(" with ", 1)[0])
    if result is None:
        return [planning]
    output = data_converter.payload_converter.from_payloads(result)[0]
    found = [
        ScheduledActivity(STAGES[Stage.BEFORE_PLANNING].activity, f"before_planning · {e['hook']}", True, True)
        for e in output.get("before", [])
    ]
    if output.get("planned", True):
        found.append(planning)
    found += [
        ScheduledActivity(STAGES[Stage.AFTER_PLANNING].activity, f"after_planning · {e['hook']}", True, True)
        for e in output.get("after", [])
    ]
    ending = summary.split(f" {ANSWERS} ", 1)[1].split(" · ") if f" {ANSWERS} " in summary else []
    for stage, entries in zip((Stage(part.split(":", 1)[0]) for part in ending), output.get("ahead", []), strict=False):
        found += [
            ScheduledActivity(STAGES[stage].activity, f"{stage.value} · {e['hook']}", True, True) for e in entries
        ]
    return found


@dataclass
class Outcome:
    """One finished request as a user sees it: result or typed failure, record, history."""

    workflow_id: str
    result: RequestResult | None
    failure: ApplicationError | None
    record: ExecutionRecord | None  # None when the input never decoded
    # Every activity's input and result as the activity received and returned it (a payload the store
    # holds read from there); ``stored_history``: the history as the server holds it, references and all.
    history: WorkflowHistory
    store: SQLiteExecutionStore
    stored_history: WorkflowHistory

    @property
    def scheduled(self) -> list[ScheduledActivity]:
        """Every activity the workflow scheduled (and local activity it recorded), in history order."""
        converter = data_converter.payload_converter
        found = []
        completed = {
            e.activity_task_completed_event_attributes.scheduled_event_id: e.activity_task_completed_event_attributes
            for e in self.history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        }
        for event in self.history.events:
            summary = None
            if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
                summary = converter.from_payload(event.user_metadata.summary, str)
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                done = completed.get(event.event_id)
                if attrs.activity_type.name == "execute_tool_step" and summary and " with " in summary:
                    found.extend(_tool_step_invocations(summary, done.result.payloads if done else None))
                elif attrs.activity_type.name == "plan" and summary and " with " in summary:
                    found.extend(_plan_invocations(summary, done.result.payloads if done else None))
                else:
                    found.append(ScheduledActivity(attrs.activity_type.name, summary))
            elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                attrs = event.marker_recorded_event_attributes
                if attrs.marker_name == "core_local_activity" and "data" in attrs.details:
                    data = converter.from_payloads(attrs.details["data"].payloads)[0]
                    recorded = data["activity_type"]
                    stage = hook_stage_of(recorded)
                    if recorded == HOOK_BATCH_ACTIVITY or (stage is not None and _is_batch(attrs)):
                        found.extend(_batched_invocations(attrs, summary, recorded))
                    elif stage is not None:
                        found.append(ScheduledActivity(STAGES[stage].activity, summary, True, False, recorded))
                    else:
                        found.append(ScheduledActivity(recorded, summary, local=True))
        return found

    def local_results(self) -> list[tuple[str, Any]]:
        """Each local activity marker, in history order: its activity type and the result it recorded."""
        converter = data_converter.payload_converter
        found = []
        for event in self.history.events:
            attrs = event.marker_recorded_event_attributes
            if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED or "data" not in attrs.details:
                continue
            recorded = converter.from_payloads(attrs.details["data"].payloads)[0]["activity_type"]
            result = attrs.details["result"].payloads if "result" in attrs.details else None
            found.append((recorded, converter.from_payloads(result)[0] if result else None))
        return found

    def planning_outputs(self) -> list[dict[str, Any]]:
        """What each completed planning activity returned, in history order, as history holds it."""
        converter = data_converter.payload_converter
        planned = {
            e.event_id
            for e in self.history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "plan"
        }
        return [
            converter.from_payloads(e.activity_task_completed_event_attributes.result.payloads)[0]
            for e in self.history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in planned
        ]

    @property
    def summaries(self) -> list[str]:
        return [a.summary for a in self.scheduled if a.summary]

    def shown_summaries(self, activity_type: str) -> list[str]:
        """The summary of each ``activity_type`` activity the workflow scheduled, as the Temporal UI shows it."""
        converter = data_converter.payload_converter
        return [
            converter.from_payload(event.user_metadata.summary, str)
            for event in self.history.events
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and event.activity_task_scheduled_event_attributes.activity_type.name == activity_type
            and event.user_metadata.HasField("summary")
        ]

    def activity_types(self) -> list[str]:
        return [a.activity_type for a in self.scheduled]

    def hook_summaries(self) -> list[str]:
        return [a.summary for a in self.scheduled if a.activity_type in HOOK_ACTIVITY_TYPES]

    @property
    def tool_activities(self) -> list[ScheduledActivity]:
        return [a for a in self.scheduled if a.activity_type == "execute_tool_step"]

    @property
    def first_run_id(self) -> str:
        """The first run of this execution's chain: with the workflow id, what tool keys are scoped to."""
        return self.history.events[0].workflow_execution_started_event_attributes.first_execution_run_id

    def idempotency_key(self, step_id: str, arguments: dict[str, Any]) -> str:
        """The key a tool step of this request receives for ``arguments``."""
        return idempotency_key(self.workflow_id, self.first_run_id, step_id, arguments)

    async def stored(self) -> ExecutionRecord | None:
        return await self.store.get(self.workflow_id)

    def failure_details(self) -> dict[str, Any]:
        assert self.failure is not None, "the request did not fail"
        return self.failure.details[0] if self.failure.details else {}


@dataclass
class Harness:
    """Run requests through ``RequestLifecycle`` with a given pipeline on a fresh task queue.

    Use as ``async with Harness(client, tmp_path, hooks=[...]) as h: outcome = await h.run("...")``.
    """

    client: Client
    state_dir: Path
    hooks: Sequence[Any] = ()
    tools: Sequence[Any] | None = None
    planner: Any = None
    synthesizer: Any = None
    settings: StageSettings | None = None
    cache_variation: dict[str, str] | None = None
    reserved_metadata_dimensions: Sequence[str] = ()
    review: ReviewSettings | None = None
    # The dev server fixture registers the lifecycle search attributes; the time-skipping server does not.
    search_attributes: bool = True
    # A worker lists a stage once a request has waited in it this long (2 s by default); the harness
    # lists every stage at once, so a test reads each stage a request waited in from its history.
    stage_listing_delay: float = 0.0
    memory: Any = None  # a ConversationMemory: completed runs are remembered
    review_webhook: Any = None  # a ReviewWebhook: told of every checkpoint that opens
    pipeline: str = "test"
    task_queue: str = field(default_factory=lambda: f"tq-{uuid.uuid4()}")
    worker_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        self.store = SQLiteExecutionStore(self.state_dir / "executions.sqlite3")
        self.activities = LifecycleActivities(
            registry=HookRegistry(list(self.hooks), pipeline=self.pipeline),
            tools=ToolRegistry(self.tools if self.tools is not None else demo_tools(self.state_dir)),
            planner=self.planner or RulePlanner(),
            synthesizer=self.synthesizer or TemplateSynthesizer(),
            store=self.store,
            settings=self.settings,
            cache_variation=self.cache_variation,
            reserved_metadata_dimensions=self.reserved_metadata_dimensions,
            review=self.review,
            search_attributes=self.search_attributes,
            memory=self.memory,
            review_webhook=self.review_webhook,
        )
        self.activities.manifest.stage_listing_delay_seconds = self.stage_listing_delay
        # The tests' pipelines exercise each stage on its own: most run tools with no required gate, and
        # say so, as a deployment's factory would have to (build_pipeline(..., ungated=True)).
        self.activities.ungated = True
        self.histories: list[WorkflowHistory] = []

    async def __aenter__(self) -> Harness:
        self.activities.manifest.payload_store = self.client.data_converter.external_storage is not None
        self.worker = build_worker(self.client, self.task_queue, self.activities, **self.worker_options)
        await self.worker.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.end_conversations()
        await self.worker.__aexit__(*exc)
        if exc[0] is None:
            await self.replay()

    async def end_conversations(self) -> None:
        """Terminate the conversations this harness's requests started: they would otherwise stay on its
        task queue after its worker is gone, and a later test's request of the same conversation id
        would wait there for a turn that never comes."""
        query = f"WorkflowType = 'Conversation' AND TaskQueue = '{self.task_queue}' AND ExecutionStatus = 'Running'"
        try:
            running = [execution.id async for execution in self.client.list_workflows(query)]
        except RPCError as err:  # the time-skipping test server lists nothing (and runs no conversation)
            if err.status is not RPCStatusCode.UNIMPLEMENTED:
                raise
            return
        for workflow_id in running:
            with contextlib.suppress(RPCError):
                await self.client.get_workflow_handle(workflow_id).terminate("the test's worker stops")

    async def replay(self) -> None:
        # Workers run the workflows outside the sandbox; replaying inside it fails on anything it forbids.
        replayer = Replayer(
            workflows=WORKFLOWS,
            data_converter=self.client.data_converter,
            workflow_runner=SandboxedWorkflowRunner(),
            interceptors=[LocalPayloadsInline()],
        )
        for history in self.histories:
            await replayer.replay_workflow(history)

    async def start(
        self,
        request: str | dict,
        metadata: dict | None = None,
        *,
        request_id: str | None = None,
        workflow_id: str | None = None,
    ):
        """Start a request. A dict is sent as the raw JSON input (to test malformed input)."""
        workflow_id = workflow_id or f"req-{uuid.uuid4()}"
        arg = (
            request
            if isinstance(request, dict)
            else RequestInput(request=request, metadata=metadata or {}, request_id=request_id)
        )
        return await self.client.start_workflow(
            "RequestLifecycle", arg, id=workflow_id, task_queue=self.task_queue, result_type=RequestResult
        )

    async def finish(self, handle, *, approve_as: str | None = None) -> Outcome:
        """Wait for a started request and gather its outcome; with ``approve_as``, approve every
        checkpoint it opens (by the ``approve`` signal) as that reviewer."""
        result = failure = None
        reviewer = asyncio.create_task(self._approve_checkpoints(handle, approve_as)) if approve_as else None
        try:
            result = await handle.result()
        except WorkflowFailureError as err:
            failure = err.cause
        finally:
            if reviewer is not None:
                reviewer.cancel()
        history = await handle.fetch_history()
        self.histories.append(history)
        try:
            record = await handle.query("execution_record", result_type=ExecutionRecord)
        except WorkflowQueryFailedError:
            record = None  # an input that never decoded: the SDK cannot instantiate the workflow to answer
        return Outcome(handle.id, result, failure, record, await self._stored_read(history), self.store, history)

    async def _stored_read(self, history: WorkflowHistory) -> WorkflowHistory:
        """``history`` with every activity's input and result as the activity received and returned it:
        what the payload store holds in place of each reference (a copy; the history replayed is the one
        the server holds)."""
        converter = self.client.data_converter
        if converter.external_storage is None:
            return history
        events = []
        for event in history.events:
            copy = type(event)()
            copy.CopyFrom(event)
            for attrs, field_name in (
                (copy.activity_task_scheduled_event_attributes, "input"),
                (copy.activity_task_completed_event_attributes, "result"),
            ):
                payloads = getattr(attrs, field_name)
                if payloads.payloads:
                    values = await converter.decode(list(payloads.payloads))
                    del payloads.payloads[:]
                    payloads.payloads.extend(data_converter.payload_converter.to_payloads(values))
            events.append(copy)
        return WorkflowHistory(history.workflow_id, events)

    @staticmethod
    async def _approve_checkpoints(handle, reviewer: str) -> None:
        decided: set[str] = set()
        while True:
            checkpoint = await handle.query("pending_checkpoint", result_type=Checkpoint | None)
            if checkpoint is not None and checkpoint.checkpoint_id not in decided:
                decided.add(checkpoint.checkpoint_id)
                await handle.signal("approve", ApproveSignal(checkpoint_id=checkpoint.checkpoint_id, reviewer=reviewer))
            await asyncio.sleep(0.05)

    async def wait_for_checkpoint(self, handle, *, timeout: float = 30.0) -> Checkpoint:
        """The checkpoint the request opens, once it is open."""
        async with asyncio.timeout(timeout):
            while True:
                checkpoint = await handle.query("pending_checkpoint", result_type=Checkpoint | None)
                if checkpoint is not None:
                    return checkpoint
                await asyncio.sleep(0.05)

    async def run(
        self, request: str | dict, metadata: dict | None = None, *, approve_as: str | None = None, **kwargs: Any
    ) -> Outcome:
        return await self.finish(await self.start(request, metadata, **kwargs), approve_as=approve_as)


def history_json(history: WorkflowHistory) -> str:
    return json.dumps(json.loads(history.to_json()), indent=1)
