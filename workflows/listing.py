"""Where a request shows which stage it is in: the execution record and the current details at once, the
search attributes ``AgentLifecycleStage`` / ``AgentAwaitingReview`` / ``AgentWorkflowKind`` when the
workflow next waits. Also the names of the stages that are not hook stages. Workflow code only (the
activities' side of a late listing is ``activities.listing_watch``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.converter import PayloadConverter

with workflow.unsafe.imports_passed_through():
    from . import search_attributes as sa
    from . import story
    from .run_state import RunState

# The stages of a request besides its hook stages (each named by its ``Stage``), in lifecycle order.
RESOLVING_PIPELINE = sa.STAGE_AT_START
RECALLING = "recalling"
PLANNING = "planning"
AWAITING_REVIEW = "awaiting_review"
EXECUTING = "executing"
SYNTHESIZING = "synthesizing"
REMEMBERING = "remembering"
RELEASING_LEASES = "releasing_leases"
COMPLETED = "completed"  # then the other terminal stages: the request's status (failed, stopped, ...)
# The summary of the timer that lists a stage late: bookkeeping, so the Timeline does not read it as a wait.
LISTING_TIMER_SUMMARY = story.shown("bookkeeping · list the stage in search (not a wait)")
# The signal by which an activity the request has waited on for the listing delay asks it to list its stage,
# and the activity header that asks the activity to (its value: the delay, ``after_seconds``, and which
# listing the ask is for, ``listing``).
LIST_STAGE_SIGNAL = "bookkeeping · list the stage in search"
LISTING_HEADER = "agent-lifecycle-list-stage"


class StageListing:
    """The stage a request is in, as the record, the current details and the search attributes show it."""

    def __init__(self, state: RunState) -> None:
        self._state = state
        self._upserted_stage: str | None = None  # the stage AgentLifecycleStage holds
        self._upserted_awaiting = False  # whether AgentAwaitingReview holds true
        self._unpublished: tuple[str, bool] | None = None  # (stage, terminal) entered since the last upsert
        self._timer: asyncio.Task[None] | None = None  # lists the stage once the listing delay has passed
        self._carried = False  # the activities being scheduled ask to list the stage once the delay has passed
        self._listings = 0  # upserts so far: which listing an activity's ask is for
        self._mislisted = False  # started listed as another kind: its first listing corrects that at once

    def started(self) -> None:
        """Take the listing a client started the request with (its kind and first stage, see
        ``search_attributes.listed_at_start``) as its first: the request is already found, so its first
        wait is listed as any later stage is, without an upsert of its own."""
        at_start = workflow.info().typed_search_attributes
        stage, kind = at_start.get(sa.LIFECYCLE_STAGE), at_start.get(sa.WORKFLOW_KIND)
        if stage is not None and kind == self._state.kind():
            self._upserted_stage = stage
        self._mislisted = kind is not None and kind != self._state.kind()

    def enter(self, stage: str, detail: str = "", *, outcome: str = "", more: Sequence[str] = ()) -> None:
        """Enter ``stage``: the record and the current details an operator reads (what was asked, the
        stage, the outcome once there is one) at once; the search attributes, where the namespace has
        them, when the workflow next waits (:meth:`publish`). A stage with an ``outcome`` is the
        terminal one."""
        state = self._state
        state.record.lifecycle_stage = str(stage)
        workflow.set_current_details(
            story.current_details(
                state.input.request,
                stage=str(stage),
                detail=detail,
                outcome=outcome,
                more=more,
                with_text=state.manifest.ui_shows_text,
            )
        )
        self._unpublished = (str(stage), bool(outcome))

    def publish(self, *, untimed: bool = False) -> None:
        """List the stage entered last, where the workflow is about to wait on something outside its
        workflow task — an activity, a child, a reviewer — or to end. A listing reads the attributes as a
        workflow task leaves them, so the stages a task passes through on its way (in-process hooks run as
        local activities, stages without hooks) could never be seen there: they cost no upsert, and the
        stage a request is listed at is always one it waited in. The current details and the record show
        every stage at once.

        Each upsert is a write to the server's visibility store, the largest part of what a request costs
        the server beyond its activities. So, with a listing delay (the manifest's
        ``stage_listing_delay_seconds``), a change of ``AgentAwaitingReview`` (what reviewers' inboxes
        read), its end, and the kind of a request started listed as another are listed at once, and any
        other stage — the first of a request started with no listing (by a plain Temporal client)
        included, its kind with it — once the request has been waiting that long: a request started by
        ``AgentClient`` is listed from its start, one started elsewhere once it has run for the delay, or
        when it ends. A wait that is ``untimed`` costs nothing
        until then: a wait on activities, each of which carries the ask (``LISTING_HEADER``) and, still
        running (or only starting) once the delay has passed, signals the request (``LIST_STAGE_SIGNAL``)
        to list the stage it is in then (``activities.listing_watch``); or the server's start of a child,
        which it answers at once. Any other wait starts one durable timer, if none is running, that lists
        the stage the request is in when it fires. A listing is then at most the delay behind a wait on a
        child, and behind a wait on an activity once a worker runs it; a request that never waits that
        long costs no event for its listing. Without a delay every stage a request waits in is listed at
        once."""
        manifest = self._state.manifest
        if self._unpublished is None or not manifest.search_attributes:
            return
        stage, terminal = self._unpublished
        delay = manifest.stage_listing_delay_seconds
        at_once = terminal or not delay or self._mislisted or (stage == AWAITING_REVIEW) != self._upserted_awaiting
        if at_once:
            self._list()
        elif self._timer is not None:
            pass  # the running timer lists the stage the request is in when it fires
        elif untimed:
            self._carried = True
        else:
            self._timer = asyncio.create_task(self._list_after(delay))

    def activity_header(self) -> Payload | None:
        """The ask (``LISTING_HEADER``) an activity the request schedules now carries, while a stage waits
        to be listed by the activities it waits on."""
        if not (self._carried and self._unpublished is not None):
            return None
        ask = {"after_seconds": self._state.manifest.stage_listing_delay_seconds, "listing": self._listings}
        return PayloadConverter.default.to_payload(ask)

    def list_asked(self) -> None:
        """An activity the request has waited on for the listing delay asks to list the stage the request
        is in (``LIST_STAGE_SIGNAL``); nothing when it is listed already."""
        self._list()

    async def _list_after(self, delay: float) -> None:
        await workflow.sleep(delay, summary=LISTING_TIMER_SUMMARY)
        self._timer = None
        self._list()

    def _list(self) -> None:
        if self._unpublished is None:
            return
        stage, terminal = self._unpublished
        self._unpublished = None
        self._carried = False
        self._mislisted = False
        if not self._state.manifest.search_attributes or stage == self._upserted_stage:
            return
        # One upsert per change of stage. AgentWorkflowKind goes with the first; AgentAwaitingReview when a
        # checkpoint opens, when it closes, and (false) at the end.
        awaiting = stage == AWAITING_REVIEW
        updates: list[Any] = [sa.LIFECYCLE_STAGE.value_set(stage)]
        if awaiting != self._upserted_awaiting or terminal:
            updates.append(sa.AWAITING_REVIEW.value_set(awaiting))
        if self._upserted_stage is None:
            updates.append(sa.WORKFLOW_KIND.value_set(self._state.kind()))
        workflow.upsert_search_attributes(updates)
        self._upserted_stage, self._upserted_awaiting = stage, awaiting
        self._listings += 1

    def child_kind(self, kind: str) -> TypedSearchAttributes | None:
        """The search attributes a child starts with: its kind, where the namespace has it."""
        if self._state.manifest.search_attributes:
            return TypedSearchAttributes([SearchAttributePair(sa.WORKFLOW_KIND, kind)])
        return None

    def child_request(self, kind: str) -> TypedSearchAttributes | None:
        """The search attributes a child request (a sub-agent's) starts with, where the namespace has them:
        its kind and first stage, as a client starts a request — listed from its start, without an upsert
        of its own."""
        if self._state.manifest.search_attributes:
            return sa.listed_at_start(kind)
        return None
