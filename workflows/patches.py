"""The patches of ``RequestLifecycle``: what changed in the workflow's commands, and since when.

A running request replays its history on every worker that picks it up, so a change to the commands the
workflow sends is guarded by a patch: executions started before it replay the old branch, executions
started after it take the new one. Each patch costs a new execution a marker and an upsert of
``TemporalChangeVersion``, so one patch stands for every change made at once (the newest, ``LATEST``),
and :func:`detect` checks it first thing, before any other command: a new execution records that one
marker, and an older history finds the patch it was recorded with. (A patch checked later — after a local
activity, say — can land in a different workflow task than the code that checked it, and replay would
then miss it.) :class:`Behaviour` says which branch each change takes (``RunState.behaviour``); each old branch
stays beside the new one and names the field it reads — :class:`Behaviour` lists where.

A request started by a client that knows this worker's newest patch carries it in its memo
(``STARTED_AS``, :func:`start_memo`): a worker that knows that patch runs it without recording the marker
(and the upsert the SDK adds to it), two events less per request. Only a first run may take the stamp at
its word: on replay, the history says which worker ran it — a marker of an older patch means a worker that
did not know the stamp started it, and the execution replays that branch; no marker at all means a worker
that knew the stamp did. (A worker from before the first patch, which records no marker, must not run
stamped requests.)

Workflow code, and :func:`start_memo` for the clients that start requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from .converter import Shown

# Resolving the pipeline and writing the record as local activities, and consecutive in-process hooks of a
# stage in one local activity.
IN_PROCESS_PATCH = "in-process-bookkeeping-and-hook-batches"
# AgentLifecycleStage kept at the stage a request waits in, AgentWorkflowKind set, children started with
# their kind.
STAGE_SEARCH_ATTRIBUTES_PATCH = "stage-and-kind-search-attributes"
# Both of the above.
LIFECYCLE_2026_12 = "lifecycle-2026-12"
# Also: a call that needs a reviewer is approved as it will run — resolved, validated and through its
# before_tool chain before its checkpoint opens, and executed with exactly the approved arguments (before,
# the checkpoint showed the plan as planned and before_tool ran after the approval); an on_tool_error
# hook that handles an error makes its step succeed with the substitute (before, the step stayed failed);
# and a managed lease is renewed with durable timers and short renewals — the request's own local
# activities, then a LeaseKeeper child's activities (before, one keep_lease activity held a worker slot for
# the request's life).
LIFECYCLE_2026_12_B = "lifecycle-2026-12-b"
# Every change made since (each listed on its ``Behaviour`` field, ``False`` for older executions).
LIFECYCLE_2027_01 = "lifecycle-2027-01"
LATEST = LIFECYCLE_2027_01
# The memo key under which a starter says which patch it expects the request to run (see the docstring).
STARTED_AS = "agent_lifecycle"


@dataclass(frozen=True)
class Behaviour:
    """Which branch of each change an execution runs: the one its history was recorded with. Where the
    old branch of each lives:

    - ``local_bookkeeping``: ``scheduling.Scheduler.bookkeeping`` (activities instead of local activities);
    - ``hook_batches``: ``invocation.HookRunner._batchable`` (one invocation per hook);
    - ``stage_upserts``: ``listing.StageListing.legacy_upsert`` and ``ending.RunEnding._terminal``;
    - ``approval_after_rewrites``: ``reviews.Reviews.wait_for_plan``, chosen in ``lifecycle._run_phases``;
    - ``handled_tool_error_succeeds``: ``steps.StepExecutor._on_tool_error`` (the step stays failed);
    - ``lease_renewal_by_timer``: ``leases.ManagedLeases._keep_by_activity``;
    - ``run_extensions``: the conversation's memory recalled (after_recall), each planning attempt its own
      plan activity after before_plan (a malformed model plan was repaired inside one activity), identical
      calls answered from earlier steps, declined calls, recovered errors observed by on_error, the model's
      own turns replayed — ``lifecycle._recall``, ``model_steps.ModelSteps.plan``, ``steps.StepExecutor``,
      ``ending.RunEnding._finalize`` (without them: none of it);
    - ``hook_chain_budget``: ``invocation.HookRunner.run`` (every hook invoked on its own timeout alone:
      no chain budget, no schedule-to-close timeout);
    - ``planner_answers``: ``model_steps.ModelSteps.synthesize`` (a synthesis call wrote every answer, even
      after the planner had answered in text) and ``lifecycle._run_phases`` (a plan without steps was
      written to the store on acceptance too);
    - ``named_hook_activities``: ``invocation.HookRunner._local_type`` (in-process hooks run as the
      stage's ``<stage>_hook`` and batches as ``run_hook_batch``, instead of types that name their hooks);
    - ``decision_marks``: ``invocation.HookRunner._mark`` (no timer marks a hook's denial or termination);
    - ``conversation_turns``: a request with ``metadata.conversation_id`` not started by its conversation
      claims its turn before its first hook and releases it on every exit — ``lifecycle._take_turn``
      and ``lifecycle.run`` (without it: the request runs at once, whatever else of its conversation runs);
    - ``stage_listed_at_start``: ``listing.StageListing.started`` (the first stage a request waited in was
      upserted with its kind at once, even when a client had started it with both);
    - ``stage_lookahead``: ``invocation.HookRunner._segments`` (each stage's in-process hooks ran in a
      local activity of their own, even where the stages before left the run as it was);
    - ``accepted_plan_with_hooks``: ``invocation.HookRunner.run`` and ``lifecycle._after_planning`` (the
      accepted plan's snapshot was always a local activity of its own after the after_planning hooks, and
      the plan was accepted at the workflow's time after them);
    - ``terminal_with_hooks``: ``invocation.HookRunner.run`` and ``ending.RunEnding._terminal`` (the
      terminal snapshot was always a local activity of its own after the run's last hooks, and the request
      completed at the workflow's time then);
    - ``stage_listed_by_activities``: ``listing.StageListing.publish`` (a wait on activities started the
      listing timer as any other wait did).
    """

    local_bookkeeping: bool = True
    hook_batches: bool = True
    stage_upserts: bool = True
    approval_after_rewrites: bool = True
    handled_tool_error_succeeds: bool = True
    lease_renewal_by_timer: bool = True
    run_extensions: bool = True
    # The hooks of one chain (the declared hooks of one blocking event) share a time budget per occurrence.
    hook_chain_budget: bool = True
    # A model planner's text answer is the answer's draft: no synthesis call after it; a plan without
    # steps is recorded by the next write rather than one of its own.
    planner_answers: bool = True
    # In-process hooks scheduled under local activity types that name them (``<stage>:<hook>``).
    named_hook_activities: bool = True
    # A hook that denies, stops or terminates marked on the Timeline by a short timer that says so.
    decision_marks: bool = True
    # A request of a conversation runs in its conversation's turn.
    conversation_turns: bool = True
    # A request a client started with its kind and first stage is listed by them until its next listing.
    stage_listed_at_start: bool = True
    # The in-process hooks of consecutive stages run in one local activity while each stage leaves the run
    # as it was (before_run or after_recall, then before_planning; the stages after a text answer).
    stage_lookahead: bool = True
    # The local activity that runs every after_planning hook of a phase writes the accepted plan's snapshot
    # when they leave the plan and the run as they were; a plan is accepted as its last hook ends.
    accepted_plan_with_hooks: bool = True
    # The local activity of the run's last hooks (after the planner's text answer or a synthesis, when
    # nothing else comes before the end) writes the terminal snapshot when they leave the run as it was;
    # the request then completed as its last hook ended.
    terminal_with_hooks: bool = True
    # A stage the request waits in on activities is listed late by those activities (a signal once the
    # listing delay has passed) instead of a timer: a request that never waits that long starts no timer.
    stage_listed_by_activities: bool = True


# The fields of every change recorded under ``LIFECYCLE_2027_01``: off for executions recorded before it.
SINCE_2027_01 = (
    "run_extensions",
    "hook_chain_budget",
    "planner_answers",
    "named_hook_activities",
    "decision_marks",
    "conversation_turns",
    "stage_listed_at_start",
    "stage_lookahead",
    "accepted_plan_with_hooks",
    "terminal_with_hooks",
    "stage_listed_by_activities",
)


def _before_2027_01(**fields: bool) -> Behaviour:
    """The behaviour of an execution recorded before ``LIFECYCLE_2027_01``, with ``fields`` as given."""
    return Behaviour(**{name: False for name in SINCE_2027_01}, **fields)


def start_memo() -> dict[str, str]:
    """The memo a request is started with so that a worker of this version runs it without a patch marker
    (a version name: readable in the UI where payloads are encrypted)."""
    return {STARTED_AS: Shown(LATEST)}


def detect() -> Behaviour:
    """The behaviour of this execution; call it before the workflow sends any other command."""
    stamped = _started_as_latest()
    if stamped and not workflow.unsafe.is_replaying():
        return Behaviour()  # this worker runs the stamped request from its first task: no marker needed
    if workflow.patched(LIFECYCLE_2027_01):
        return Behaviour()
    if workflow.patched(LIFECYCLE_2026_12_B):
        return _before_2027_01()
    earlier = _before_2027_01(
        approval_after_rewrites=False, handled_tool_error_succeeds=False, lease_renewal_by_timer=False
    )
    if workflow.patched(LIFECYCLE_2026_12):
        return earlier
    in_process = workflow.patched(IN_PROCESS_PATCH)
    stage_upserts = workflow.patched(STAGE_SEARCH_ATTRIBUTES_PATCH)
    if stamped and not (in_process or stage_upserts):
        return Behaviour()  # a stamped request replayed without any marker: a worker that knew the stamp ran it
    return _before_2027_01(
        local_bookkeeping=in_process,
        hook_batches=in_process,
        stage_upserts=stage_upserts,
        approval_after_rewrites=False,
        handled_tool_error_succeeds=False,
        lease_renewal_by_timer=False,
    )


def _started_as_latest() -> bool:
    try:
        return workflow.memo_value(STARTED_AS, None, type_hint=str) == LATEST
    except Exception:  # noqa: BLE001 - a memo value that is not a string is no stamp
        return False
