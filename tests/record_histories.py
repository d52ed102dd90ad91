"""Regenerate the committed histories replayed by tests/test_replay.py.

    .venv/bin/python -m tests.record_histories          # only scenarios without a history yet
    .venv/bin/python -m tests.record_histories --all    # every scenario

The histories are this release's baseline. Regenerate them only for a change no released execution can be
running into (before a release); after a release, guard a change with ``workflow.patched`` and keep the
old histories, which is what they are for (see docs/deployment.md, upgrading workers).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from activities.memory import ConversationMemoryStore, MemoryStore
from client.devserver import temporal_cli_path
from client.settings import Settings
from demo.pipeline import demo_hooks
from workflows import data_converter, search_attributes

from .doubles import eventually
from .harness import Harness, history_json

HISTORIES = Path(__file__).with_name("histories")
# name: (request, metadata, reviewer who approves checkpoints or None). The demo pipeline with conversation
# memory: in-process hooks batched, the required gate, the cache, a checkpoint approved as its calls run.
SCENARIOS = {
    "quote_answered": ("What is the price of ACME?", {"cache": "bypass"}, None),
    "trade_refused_by_required_hook": ("Buy 10 ACME", {}, None),
    "quote_served_from_cache": ("What is the price of ACME?", {}, None),
    "quotes_with_hook_batches_and_memory": (
        "What is the price of MSFT and ACME?",
        {"cache": "bypass", "conversation_id": "c2"},
        None,
    ),
    "two_phase_message_approved_as_it_runs": (
        "Send a message to alice with the price of GBX",
        {"cache": "bypass"},
        "history-reviewer",
    ),
}
# Stages after the first listed only once a request has waited in them that long (one timer that never
# fires on these), a checkpoint's opening and closing and the end at once. Recorded with a delay no stage
# here lasts.
LISTING_DELAY_SCENARIOS = {
    "message_with_listing_delay_approved_at_checkpoint": (
        "Send a message to erin with the price of ACME",
        {"cache": "bypass"},
        "history-reviewer",
    ),
}
# The demo pipeline with build_memory_hooks: an announced activity signal handed to the workflow as a
# managed lease (renewed by timer, released after the request), episodic memory and a detached knowledge
# extraction.
MEMORY_SCENARIOS = {
    "quote_with_shared_memory_and_managed_lease": ("What is the price of ACME?", {"cache": "bypass"}, None),
}
# A sub-agent step run as a child RequestLifecycle (which recurses to the depth bound, started with its
# kind), a declared command hook the workflow's matcher filter applies to the echo step only, and a
# subagent_stop hook on the sub-agent step only.
SUBAGENT_SCENARIOS = {
    "subagent_delegation_with_declared_hooks": ("Ask a sub-agent to look deeper", {"cache": "bypass"}, None),
}
# In-process hooks as local activities typed ``<stage>:<hook>`` (a batch ``<stage>:<hook> + ...``), and a
# timer marking each refusal: a call the tool allow-list denies (stock_quote left off it), a plan the
# required hook refuses.
NAMED_HOOK_SCENARIOS = {
    "quote_denied_with_named_hooks": ("What is the price of ACME?", {"cache": "bypass"}, None),
    "trade_refused_with_decision_mark": ("Buy 3 ACME", {"cache": "bypass"}, None),
}
NAMED_HOOK_ALLOW_LIST = ["stock-service/execute_trade", "notify-service/send_message"]
# A request started directly with metadata.conversation_id claims its turn from its conversation (claim
# activity, granted signal) before its first hook and releases it at its end.
CONVERSATION_SCENARIOS = {
    "quote_in_its_conversation_turn": (
        "What is the price of ACME?",
        {"cache": "bypass", "conversation_id": "history-direct"},
        None,
    ),
}
# And the conversation itself: three turns submitted together, run one after another as child requests;
# its first run continues as new after two turns with the third still queued.
CONVERSATION_WORKFLOW_SCENARIO = "conversation_of_three_turns_continued_as_new"


async def record_conversation_scenario(client, state: Path) -> None:
    from client.api import AgentClient
    from workflows.models import conversation_workflow_id

    async with Harness(client, state) as h:
        agents = AgentClient(client, Settings(task_queue=h.task_queue, conversation_turns_per_run=2))
        conversation = f"history-{uuid.uuid4().hex[:6]}"
        accepted = [await agents.submit_turn(conversation, "What is the price of GBX?") for _ in range(3)]
        for turn in accepted:
            await agents.turn_result(turn)
        handle = client.get_workflow_handle(conversation_workflow_id(conversation))
        first_run = (await handle.fetch_history()).events[0].workflow_execution_started_event_attributes
        history = await client.get_workflow_handle(handle.id, run_id=first_run.first_execution_run_id).fetch_history()
    (HISTORIES / f"{CONVERSATION_WORKFLOW_SCENARIO}.json").write_text(history_json(history) + "\n")
    print(f"wrote {CONVERSATION_WORKFLOW_SCENARIO}.json ({len(history.events)} events)")


# A model's tool call planned, its answer synthesized and streamed to a client reading the request's durable
# stream (publish signals and poll updates in the history).
MODEL_SCENARIO = "model_plans_and_streams_its_answer"
# The model's text turn is the draft, no synthesis call; the answer reaches a streaming client at the end.
PLANNER_ANSWER_SCENARIO = "model_answers_in_its_own_turn"
# Started by a plain client; the hooks of after_planning, after_execution, after_synthesis and after_answer
# after the model's text answer in one local activity, which also writes the terminal snapshot.
ANSWER_END_SCENARIO = "model_answer_stages_and_end_in_one_local_activity"
WITH_TAIL_HOOKS = (ANSWER_END_SCENARIO,)
# The model writes a few words before its tool call (streamed, then retracted) and its answering turn
# streams (publish signals while each plan activity runs).
PLANNER_STREAM_SCENARIO = "model_streams_its_planning_turns"
# A tool call held past the listing delay asks the request (a signal) to list "executing"; no listing timer
# runs.
LISTED_BY_ACTIVITY_SCENARIO = "quote_listed_late_by_its_held_tool"


class TailAudit:
    """An in-process hook before the run, before planning and at every stage after a planning turn, that
    leaves each as it was (so before_run runs on into before_planning, after_planning into the rest)."""

    name = "tail-audit"

    async def before_run(self, ctx, run):
        return None

    async def before_planning(self, ctx):
        return None

    async def after_planning(self, ctx, plan):
        return plan

    async def after_execution(self, ctx, execution):
        return None

    async def after_synthesis(self, ctx, response):
        return response

    async def after_answer(self, ctx, answer):
        return None


async def record_model_scenario(client, state: Path, name: str = MODEL_SCENARIO) -> None:
    from pydantic import SecretStr

    from activities.models import ModelSettings, OpenAIPlanner, OpenAISynthesizer, function_name
    from activities.tools import ToolRegistry
    from agent_lifecycle.testing import model as ai
    from client.api import answer_chunks
    from demo.tools import demo_tools
    from workflows.models import StageSettings

    planner_answers = name in (PLANNER_ANSWER_SCENARIO, PLANNER_STREAM_SCENARIO, *WITH_TAIL_HOOKS)
    hooks = [TailAudit()] if name in WITH_TAIL_HOOKS else ()
    async with ai.OpenAIServer() as server:
        quote = function_name("demo-tools/stock-service/stock_quote")
        if name == PLANNER_STREAM_SCENARIO:
            call = {"id": "call_q", "type": "function", "function": {"name": quote, "arguments": '{"symbol": "ACME"}'}}
            server.push(
                ai.completion({"content": "Let me look that up.", "tool_calls": [call]}, finish_reason="tool_calls")
            )
        else:
            server.push(ai.tool_calls((quote, {"symbol": "ACME"})))
        if planner_answers:  # the answering turn streams its text (a chunk a word), then the final chunk
            server.push(ai.answer("ACME trades at its quoted price."))
        else:
            server.push(ai.answer("Enough."), ai.streamed([f"piece{n} " for n in range(12)]))
        model = ModelSettings(base_url=server.base_url, api_key=SecretStr("sk-history"), model="history-model")
        planner = OpenAIPlanner(model, ToolRegistry(demo_tools(state)))
        settings = StageSettings(dedicated_synthesis=not planner_answers)
        async with Harness(
            client, state, planner=planner, synthesizer=OpenAISynthesizer(model), settings=settings, hooks=hooks
        ) as h:
            if name in WITH_TAIL_HOOKS:  # as a plain Temporal client starts a request
                handle = await client.start_workflow(
                    "RequestLifecycle",
                    {"request": "What is the price of ACME?", "stream_answer": True},
                    id=f"history-{name}",
                    task_queue=h.task_queue,
                )
            else:
                handle = await h.start(
                    {"request": "What is the price of ACME?", "stream_answer": True}, workflow_id=f"history-{name}"
                )
            chunks = [chunk async for chunk in answer_chunks(client, handle.id)]
            out = await h.finish(handle)
    # the preamble's 5 words and its retraction; the answer's 6 words, or the 12 synthesized pieces; the final
    expected = (6 if name == PLANNER_STREAM_SCENARIO else 0) + (6 if planner_answers else 12) + 1
    assert out.failure is None and len(chunks) == expected and chunks[-1].final, (
        out.failure,
        chunks,
    )
    (HISTORIES / f"{name}.json").write_text(history_json(out.history) + "\n")
    print(f"wrote {name}.json ({len(out.history.events)} events)")


# Two quotes recorded, replayed by PolicyReplay with a candidate that no longer offers quotes (two
# batches, listed into the report store first).
REPLAY_SCENARIO = "policy_replay_of_recorded_quotes"


async def record_replay_scenario(client, state: Path) -> None:
    from client.replay import start_policy_replay
    from worker import build_replay_worker, policy_replay_activities
    from workflows.models import ReplayWindow

    from .harness import history_json as as_json
    from .replay_pipelines import recorded

    settings = Settings.from_env({"AGENT_STATE_DIR": str(state)})
    activities = recorded(settings)
    replay = policy_replay_activities(settings, activities)
    async with (
        Harness(client, state, worker_options={"replay": replay}) as h,
        build_replay_worker(client, h.task_queue, replay, batches=2),  # the batches run on their own queue
    ):
        for text in ("What is the price of ACME?", "What is the price of IBM?"):
            await h.run(text, {"cache": "bypass"})
        handle = await start_policy_replay(
            client,
            settings.model_copy(update={"task_queue": h.task_queue}),
            "tests.replay_pipelines:stricter",
            ReplayWindow(),
            replay_id=REPLAY_SCENARIO,
            batch_size=1,
        )
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.replayed == 2 and result.counts.get("newly_blocked") == 2, result
    (HISTORIES / f"{REPLAY_SCENARIO}.json").write_text(as_json(history) + "\n")
    print(f"wrote {REPLAY_SCENARIO}.json ({len(history.events)} events)")


def subagent_harness(client, state: Path) -> Harness:
    from hooks.declarative import DeclaredHookRuntime, HookStore, declared_hooks, parse_hooks

    from .doubles import FixedPlanner
    from .test_declared_hooks import Echo, echo
    from .test_declared_subagents import Delegate, delegate

    runtime = DeclaredHookRuntime(store=HookStore(state / "hooks.sqlite3"))
    declared = {
        "hooks": [
            {
                "id": "echo-guard",
                "event": "pre_tool_use",
                "handler_type": "command",
                "matcher": "^echo/",
                "config": {"command": "true"},
            },
            {"id": "child-done", "event": "subagent_stop", "handler_type": "command", "config": {"command": "true"}},
        ]
    }
    hooks = declared_hooks(parse_hooks(declared), runtime)
    planner = FixedPlanner(delegate(), echo("e", "hi"))
    return Harness(client, state, hooks=hooks, tools=[Delegate(), Echo()], planner=planner)


async def record_listed_by_activity_scenario(client, state: Path) -> None:
    from .doubles import FixedPlanner, HeldTool

    name = LISTED_BY_ACTIVITY_SCENARIO
    tool = HeldTool()
    async with Harness(
        client, state, tools=[tool], planner=FixedPlanner(HeldTool.step()), stage_listing_delay=0.5
    ) as h:
        handle = await h.start("wait for the held tool", {"cache": "bypass"}, workflow_id=f"history-{name}")
        await asyncio.wait_for(tool.started.wait(), timeout=30)

        async def asked() -> bool:
            events = (await handle.fetch_history()).events
            return any(e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES for e in events[-3:])

        await eventually(asked, what="the held call's ask listed")
        tool.release.set()
        out = await h.finish(handle)
    signals = [e for e in out.history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
    timers = [e for e in out.history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
    assert out.failure is None and signals and not timers, (out.failure, signals, timers)
    (HISTORIES / f"{name}.json").write_text(history_json(out.history) + "\n")
    print(f"wrote {name}.json ({len(out.history.events)} events)")


# A pipeline with instructions and a request with its own; a reviewer rejects the message, which the planner
# is told (the pipeline's ``on_reject="tell_model"``), and the request answers.
REJECTION_TOLD_SCENARIO = "message_rejected_and_told_to_the_planner"


async def record_rejection_scenario(client, state: Path) -> None:
    from workflows.models import RequestInput, ReviewSettings

    name = REJECTION_TOLD_SCENARIO
    async with Harness(client, state, review=ReviewSettings(on_reject="tell_model")) as h:
        h.activities.manifest.instructions = "You are the desk's assistant."
        request = RequestInput(
            request="Send a message to alice: hi", instructions="Be brief.", metadata={"cache": "bypass"}
        )
        handle = await h.start(request.model_dump(mode="json"), workflow_id=f"history-{name}")
        checkpoint = await h.wait_for_checkpoint(handle)
        await handle.signal(
            "reject", {"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "history-reviewer", "reason": "not now"}
        )
        out = await h.finish(handle)
    assert out.failure is None and out.record is not None, out.failure
    assert out.record.instructions == "You are the desk's assistant.\n\nBe brief."
    assert [(s.status.value, s.skip_detail) for s in out.record.steps] == [("skipped", "rejected by history-reviewer")]
    (HISTORIES / f"{name}.json").write_text(history_json(out.history) + "\n")
    print(f"wrote {name}.json ({len(out.history.events)} events)")


async def record(h: Harness, scenarios: dict, rewrite_all: bool, check=None) -> None:
    """Run each scenario without a committed history yet (every one with ``rewrite_all``) and write its
    history; ``check(name, outcome)`` asserts what the scenario is there to show."""
    for name, (text, metadata, reviewer) in scenarios.items():
        if (HISTORIES / f"{name}.json").exists() and not rewrite_all:
            continue
        out = await h.run(text, metadata, workflow_id=f"history-{name}", approve_as=reviewer)
        if check is not None:
            check(name, out)
        (HISTORIES / f"{name}.json").write_text(history_json(out.history) + "\n")
        print(f"wrote {name}.json ({len(out.history.events)} events)")


def batched(name: str, out) -> None:
    if "hook_batches" in name:
        assert any(a.batched for a in out.scheduled), "no hooks ran in a batch"
    if "message" in name:
        assert out.failure is None and out.record.checkpoints[0].calls, "no call was approved as it runs"


def released_a_lease(name: str, out) -> None:
    assert any(a.activity_type == "release_lease" for a in out.scheduled), "no managed lease was released"


def named(name: str, out) -> None:
    assert any(a.recorded_type for a in out.scheduled), "no in-process hook ran under a type naming it"
    if "denied" in name or "refused" in name:
        marks = [e for e in out.history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
        assert marks, "no refusal was marked"


def succeeded(name: str, out) -> None:
    assert out.failure is None, out.failure


def claimed_a_turn(name: str, out) -> None:
    assert out.failure is None and "claim_conversation_turn" in out.activity_types(), out.failure


async def main(rewrite_all: bool) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        data_converter=data_converter,
        search_attributes=search_attributes.ALL,
    )
    try:
        with tempfile.TemporaryDirectory() as state:
            settings = Settings(state_dir=Path(state))
            memory = ConversationMemoryStore(Path(state) / "memory.sqlite3")
            async with Harness(env.client, Path(state), hooks=demo_hooks(settings), memory=memory) as h:
                await record(h, SCENARIOS, rewrite_all, batched)
        with tempfile.TemporaryDirectory() as state:
            settings = Settings(state_dir=Path(state))
            async with Harness(env.client, Path(state), hooks=demo_hooks(settings), stage_listing_delay=600) as h:
                await record(h, LISTING_DELAY_SCENARIOS, rewrite_all, succeeded)
        with tempfile.TemporaryDirectory() as state:
            settings = Settings(state_dir=Path(state))
            memory = MemoryStore(Path(state) / "memory.sqlite3")
            async with Harness(
                env.client, Path(state), hooks=demo_hooks(settings, memory), memory=memory, pipeline="demo"
            ) as h:
                await record(h, MEMORY_SCENARIOS, rewrite_all, released_a_lease)
        with tempfile.TemporaryDirectory() as state:
            settings = Settings(state_dir=Path(state), tool_allow_list=NAMED_HOOK_ALLOW_LIST)
            async with Harness(env.client, Path(state), hooks=demo_hooks(settings)) as h:
                await record(h, NAMED_HOOK_SCENARIOS, rewrite_all, named)
        with tempfile.TemporaryDirectory() as state:
            async with subagent_harness(env.client, Path(state)) as h:
                await record(h, SUBAGENT_SCENARIOS, rewrite_all, succeeded)
        for name in (MODEL_SCENARIO, PLANNER_ANSWER_SCENARIO, *WITH_TAIL_HOOKS, PLANNER_STREAM_SCENARIO):
            if rewrite_all or not (HISTORIES / f"{name}.json").exists():
                with tempfile.TemporaryDirectory() as state:
                    await record_model_scenario(env.client, Path(state), name)
        with tempfile.TemporaryDirectory() as state:
            async with Harness(env.client, Path(state)) as h:
                await record(h, CONVERSATION_SCENARIOS, rewrite_all, claimed_a_turn)
        if rewrite_all or not (HISTORIES / f"{CONVERSATION_WORKFLOW_SCENARIO}.json").exists():
            with tempfile.TemporaryDirectory() as state:
                await record_conversation_scenario(env.client, Path(state))
        if rewrite_all or not (HISTORIES / f"{LISTED_BY_ACTIVITY_SCENARIO}.json").exists():
            with tempfile.TemporaryDirectory() as state:
                await record_listed_by_activity_scenario(env.client, Path(state))
        if rewrite_all or not (HISTORIES / f"{REJECTION_TOLD_SCENARIO}.json").exists():
            with tempfile.TemporaryDirectory() as state:
                await record_rejection_scenario(env.client, Path(state))
        if rewrite_all or not (HISTORIES / f"{REPLAY_SCENARIO}.json").exists():
            with tempfile.TemporaryDirectory() as state:
                await record_replay_scenario(env.client, Path(state))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    # Writes only the scenarios that have no history yet; --all rewrites every one.
    asyncio.run(main(rewrite_all="--all" in sys.argv))
