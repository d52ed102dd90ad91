"""Conversations against a real Temporal server: the turns of one conversation run one at a time in the
order they were accepted, whichever way they end; different conversations run at the same time; a
malformed turn is refused before it is queued."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from temporalio.client import Client
from temporalio.common import TypedSearchAttributes
from temporalio.converter import decode_typed_search_attributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.memory import ConversationMemoryStore
from activities.tools import Tool, ToolContext
from client.api import AgentClient, RequestFailed, TurnRefused
from client.settings import Settings
from hooks import Stop
from workflows import search_attributes as sa
from workflows.models import ConversationTurns, Plan, PlanStep, RequestResult, conversation_workflow_id, estimate_tokens

from .doubles import CapturingPlanner, HeldTool
from .harness import Harness
from .test_declared_subagents import Delegate, delegate

ROOT = Path(__file__).resolve().parent.parent


class NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass
class Span:
    request_id: str
    started: float
    ended: float = field(default=0.0)


class SlowTool(Tool):
    """Takes ``seconds``; keeps when each call started and ended (by the request that made it)."""

    namespace = "test-tools"
    agent = "slow-service"
    capability = "take_a_while"
    read_only = True
    Arguments = NoArguments

    def __init__(self, seconds: float = 1.5) -> None:
        self.seconds = seconds
        self.spans: list[Span] = []

    async def run(self, arguments: Any, ctx: ToolContext) -> str:
        span = Span(ctx.request_id, time.monotonic())
        self.spans.append(span)
        await asyncio.sleep(self.seconds)
        span.ended = time.monotonic()
        return "done"

    def of(self, prefix: str) -> list[Span]:
        return [s for s in self.spans if s.request_id.startswith(prefix)]


def step(tool: type[Tool], step_id: str = "s1") -> PlanStep:
    return PlanStep(step_id=step_id, namespace=tool.namespace, agent=tool.agent, capability=tool.capability)


class ScriptedPlanner:
    """``slow`` → the slow tool; ``hold`` → the held tool; ``fail`` → a planner error; else no steps."""

    name = "scripted-planner"

    async def plan(self, request: Any) -> Plan:
        if "fail" in request.request:
            raise ApplicationError("the planner gave up", type="PlannerDown", non_retryable=True)
        if "hold" in request.request:
            return Plan(phase=request.phase, steps=[step(HeldTool, "held")])
        if "delegate" in request.request:
            return Plan(phase=request.phase, steps=[delegate()] if request.phase == 1 else [])
        if "slow" in request.request:
            return Plan(phase=request.phase, steps=[step(SlowTool)])
        return Plan(phase=request.phase, steps=[])


def overlapping(spans: list[Span]) -> list[tuple[str, str]]:
    ordered = sorted(spans, key=lambda s: s.started)
    return [(a.request_id, b.request_id) for a, b in zip(ordered, ordered[1:], strict=False) if b.started < a.ended]


def agents_for(h: Harness) -> AgentClient:
    return AgentClient(h.client, Settings(task_queue=h.task_queue))


async def keep_histories(h: Harness, conversation_id: str, turn_ids: list[str]) -> None:
    """Every history of the conversation and its turns goes to the harness's replay."""
    for workflow_id in [conversation_workflow_id(conversation_id), *turn_ids]:
        h.histories.append(await h.client.get_workflow_handle(workflow_id).fetch_history())


def new_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def test_three_turns_submitted_together_run_one_after_another_in_order(client: Client, tmp_path):
    slow = SlowTool()
    async with Harness(client, tmp_path, tools=[slow], planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("c")
        accepted = await asyncio.gather(*(agents.submit_turn(conversation, f"slow turn {i}") for i in range(3)))
        results = await asyncio.gather(*(agents.turn_result(a) for a in accepted))
        turns = await settled(agents, conversation, 3)
        await keep_histories(h, conversation, [a.workflow_id for a in accepted])

    assert sorted(a.turn for a in accepted) == [1, 2, 3]
    assert {a.workflow_id for a in accepted} == {f"conversation-{conversation}/turn-{n}" for n in (1, 2, 3)}
    assert all(r.response for r in results)
    spans = slow.of(f"conversation-{conversation}/")
    assert len(spans) == 3 and all(s.ended for s in spans)
    assert overlapping(spans) == []
    # Run in the order they were accepted.
    assert [s.request_id for s in sorted(spans, key=lambda s: s.started)] == [
        f"conversation-{conversation}/turn-{n}" for n in (1, 2, 3)
    ]
    assert [(t.turn, t.status) for t in turns.done] == [(1, "succeeded"), (2, "succeeded"), (3, "succeeded")]
    assert turns.running is None and turns.queued == []


async def test_three_conversations_at_once_run_at_the_same_time(client: Client, tmp_path):
    slow = SlowTool(seconds=2.0)
    async with Harness(client, tmp_path, tools=[slow], planner=ScriptedPlanner()) as h:
        agents = agents_for(h)
        conversations = [new_id("par") for _ in range(3)]
        accepted = await asyncio.gather(*(agents.submit_turn(c, "slow, please") for c in conversations))
        await asyncio.gather(*(agents.turn_result(a) for a in accepted))
        for c, a in zip(conversations, accepted, strict=True):
            await keep_histories(h, c, [a.workflow_id])

    spans = [s for c in conversations for s in slow.of(f"conversation-{c}/")]
    assert len(spans) == 3
    assert overlapping(spans), "different conversations should not wait for each other"


async def test_a_malformed_turn_is_refused_before_it_is_queued(client: Client, tmp_path):
    async with Harness(client, tmp_path, planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("bad")
        with pytest.raises(TurnRefused, match="message"):
            await agents.submit_turn(conversation, "")
        with pytest.raises(TurnRefused, match="not this conversation"):
            await agents.submit_turn(conversation, "hello", metadata={"conversation_id": "someone-else"})
        with pytest.raises(TurnRefused, match="conversation id"):
            await agents.submit_turn("has space", "hello")
        turns = await agents.turns(conversation)
        assert turns.queued == [] and turns.done == [] and turns.turns_submitted == 0
        accepted = await agents.submit_turn(conversation, "hello")
        await agents.turn_result(accepted)
        await keep_histories(h, conversation, [accepted.workflow_id])
    assert accepted.turn == 1


async def test_a_failed_turn_and_a_cancelled_turn_release_the_next_one(client: Client, tmp_path):
    held = HeldTool()
    async with Harness(client, tmp_path, tools=[held], planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("f")
        failing = await agents.submit_turn(conversation, "fail now")
        holding = await agents.submit_turn(conversation, "hold on")
        last = await agents.submit_turn(conversation, "and then?")
        with pytest.raises(RequestFailed) as failed:
            await agents.turn_result(failing)
        await asyncio.wait_for(held.started.wait(), 30)
        queued = await agents.turns(conversation)
        await agents.cancel(holding.workflow_id)
        with pytest.raises(RequestFailed) as cancelled:
            await agents.turn_result(holding)
        answer = await agents.turn_result(last)
        turns = await settled(agents, conversation, 3)
        await keep_histories(h, conversation, [failing.workflow_id, holding.workflow_id, last.workflow_id])

    assert failed.value.type == "PlanningFailed"
    assert cancelled.value.type == "Cancelled"
    assert answer.response
    assert queued.running is not None and queued.running.turn == 2 and [t.turn for t in queued.queued] == [3]
    assert [(t.turn, t.status) for t in turns.done] == [(1, "failed"), (2, "cancelled"), (3, "succeeded")]


def listing(history) -> tuple[TypedSearchAttributes, list[list[str]]]:
    """What a run started listed with, and the attributes each of its upserts set."""
    started = history.events[0].workflow_execution_started_event_attributes
    upserts = [
        sorted(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    ]
    return decode_typed_search_attributes(started.search_attributes), upserts


async def test_the_conversation_is_listed_as_a_conversation_and_its_turns_as_requests_from_their_start(
    client: Client, tmp_path
):
    async with Harness(client, tmp_path, planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("kind")
        accepted = await agents.submit_turn(conversation, "hello")
        await agents.turn_result(accepted)
        description = await client.get_workflow_handle(conversation_workflow_id(conversation)).describe()
        turn_history = await client.get_workflow_handle(accepted.workflow_id).fetch_history()
        await keep_histories(h, conversation, [accepted.workflow_id])
    assert description.typed_search_attributes.get(sa.WORKFLOW_KIND) == "conversation"
    assert description.workflow_type == "Conversation"
    # A turn starts listed as a client starts a request: found from its start, no upsert to list its kind.
    at_start, upserts = listing(turn_history)
    assert at_start.get(sa.WORKFLOW_KIND) == "request" and at_start.get(sa.LIFECYCLE_STAGE) == "resolve_pipeline"
    assert upserts and all(sa.WORKFLOW_KIND.name not in fields for fields in upserts)


# --------------------------------------------------------------------------------------------------
# Requests started directly with metadata.conversation_id take their turn through the conversation
# --------------------------------------------------------------------------------------------------


async def test_requests_started_directly_and_submitted_turns_of_one_conversation_never_overlap(
    client: Client, tmp_path
):
    slow = SlowTool(seconds=1.0)
    async with Harness(client, tmp_path, tools=[slow], planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("mix")
        direct = [
            await h.start("slow direct", {"conversation_id": conversation}, workflow_id=f"direct-{conversation}-{i}")
            for i in range(2)
        ]
        submitted = [await agents.submit_turn(conversation, f"slow submitted {i}") for i in range(2)]
        direct.append(
            await h.start("slow direct", {"conversation_id": conversation}, workflow_id=f"direct-{conversation}-2")
        )
        outcomes = [await h.finish(handle) for handle in direct]
        answers = [await agents.turn_result(a) for a in submitted]
        turns = await settled(agents, conversation, 5)
        await keep_histories(h, conversation, [a.workflow_id for a in submitted])

    assert all(o.failure is None for o in outcomes) and all(a.response for a in answers)
    spans = [s for s in slow.spans if conversation in s.request_id]
    assert len(spans) == 5 and overlapping(spans) == []
    # Each direct request claimed its turn before its first hook, and gave it back.
    for outcome in outcomes:
        types = outcome.activity_types()
        assert types.index("claim_conversation_turn") < types.index("plan")
    assert [t.status for t in turns.done] == ["succeeded"] * 5
    assert {t.workflow_id for t in turns.done if t.claimed} == {o.workflow_id for o in outcomes}


async def test_a_direct_request_that_fails_or_is_cancelled_gives_its_turn_back(client: Client, tmp_path):
    held = HeldTool()
    async with Harness(client, tmp_path, tools=[held], planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("dx")
        failing = await h.start("fail now", {"conversation_id": conversation}, workflow_id=f"d-{conversation}-fail")
        failed = await h.finish(failing)
        holding = await h.start("hold on", {"conversation_id": conversation}, workflow_id=f"d-{conversation}-hold")
        await asyncio.wait_for(held.started.wait(), 30)
        # A direct request's place is where its claim arrives: each waits to be queued before the next.
        waiting = await h.start("and then?", {"conversation_id": conversation}, workflow_id=f"d-{conversation}-wait")
        await queued(agents, conversation, 1)
        queued_then_cancelled = await agents.submit_turn(conversation, "hello")
        withdrawn = await h.start("never mind", {"conversation_id": conversation}, workflow_id=f"d-{conversation}-gone")
        await queued(agents, conversation, 3)
        await withdrawn.cancel()  # cancelled before its turn came: withdraws its claim
        await holding.cancel()
        cancelled = await h.finish(holding)
        answered = await h.finish(waiting)
        await agents.turn_result(queued_then_cancelled)
        gone = await h.finish(withdrawn)
        turns = await settled(agents, conversation, 5)
        await keep_histories(h, conversation, [queued_then_cancelled.workflow_id])

    assert failed.failure is not None and failed.failure.type == "PlanningFailed"
    assert cancelled.record is not None and cancelled.record.status == "cancelled"
    assert answered.failure is None
    assert gone.record is not None and gone.record.status == "cancelled"
    assert "plan" not in gone.activity_types()  # it never ran a hook or planned
    assert [(t.workflow_id, t.status) for t in turns.done] == [
        (failing.id, "failed"),
        (withdrawn.id, "cancelled"),
        (holding.id, "cancelled"),
        (waiting.id, "succeeded"),
        (queued_then_cancelled.workflow_id, "succeeded"),
    ]


async def settled(agents: AgentClient, conversation: str, done: int) -> ConversationTurns:
    """The conversation's turns once ``done`` of them ended (a turn's answer reaches its submitter a
    moment before the conversation has moved on)."""
    async with asyncio.timeout(30):
        while len((turns := await agents.turns(conversation)).done) < done:
            await asyncio.sleep(0.05)
    return turns


async def arrived(agents: AgentClient, conversation: str, workflow_id: str) -> None:
    """Wait until the conversation holds the turn ``workflow_id`` (queued, running or done)."""
    async with asyncio.timeout(30):
        while True:
            try:
                turns = await agents.turns(conversation)
            except RPCError:  # not started yet: the claim that starts it is on its way
                await asyncio.sleep(0.05)
                continue
            held = [*turns.done, *([turns.running] if turns.running else []), *turns.queued]
            if any(t.workflow_id == workflow_id for t in held):
                return
            await asyncio.sleep(0.05)


async def queued(agents: AgentClient, conversation: str, count: int) -> None:
    async with asyncio.timeout(30):
        while len((await agents.turns(conversation)).queued) < count:
            await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------------
# Bounded history: continue-as-new between turns, idle end and restart
# --------------------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_a_long_conversation_continues_as_new_between_turns_and_loses_none(client: Client, tmp_path):
    slow = SlowTool(seconds=0.2)
    async with Harness(client, tmp_path, tools=[slow], planner=ScriptedPlanner()) as h:
        agents = AgentClient(h.client, Settings(task_queue=h.task_queue, conversation_turns_per_run=2))
        conversation = new_id("can")
        accepted = [await agents.submit_turn(conversation, f"slow turn {i}") for i in range(5)]
        answers = [await agents.turn_result(a) for a in accepted]
        more = await agents.submit_turn(conversation, "slow again")  # after the chain moved on
        await agents.turn_result(more)
        turns = await settled(agents, conversation, 6)
        handle = client.get_workflow_handle(conversation_workflow_id(conversation))
        first_run = (await handle.fetch_history()).events[0]
        started = first_run.workflow_execution_started_event_attributes
        # The runs the chain closed by continuing as new, and every turn, go to the harness's replay.
        first = client.get_workflow_handle(handle.id, run_id=started.first_execution_run_id)
        h.histories.append(await first.fetch_history())
        for turn in [*accepted, more]:
            h.histories.append(await client.get_workflow_handle(turn.workflow_id).fetch_history())

    assert [a.turn for a in [*accepted, more]] == [1, 2, 3, 4, 5, 6] and all(r.response for r in answers)
    spans = slow.of(f"conversation-{conversation}/")
    # Each turn ran once, in order, never two at a time, across the runs of the chain.
    assert [s.request_id for s in sorted(spans, key=lambda s: s.started)] == [a.workflow_id for a in [*accepted, more]]
    assert overlapping(spans) == []
    assert turns.runs >= 3 and [t.turn for t in turns.done] == [1, 2, 3, 4, 5, 6]
    assert started.continued_execution_run_id  # the current run is a continuation
    # The runs after the first still start their turns listed as requests.
    assert listing(h.histories[-1])[0].get(sa.WORKFLOW_KIND) == "request"


async def test_an_idle_conversation_ends_and_the_next_turn_starts_it_again_with_its_counter(client: Client, tmp_path):
    async with Harness(client, tmp_path, planner=ScriptedPlanner()) as h:
        agents = AgentClient(h.client, Settings(task_queue=h.task_queue, conversation_idle_seconds=1))
        conversation = new_id("idle")
        first = await agents.submit_turn(conversation, "hello")
        await agents.turn_result(first)
        handle = client.get_workflow_handle(conversation_workflow_id(conversation))
        ended = await handle.result()
        h.histories.append(await handle.fetch_history())
        second = await agents.submit_turn(conversation, "hello again")
        await agents.turn_result(second)
        await keep_histories(h, conversation, [first.workflow_id, second.workflow_id])

    assert ended["turns_submitted"] == 1 if isinstance(ended, dict) else ended.turns_submitted == 1
    assert (first.turn, second.turn) == (1, 2)
    assert second.workflow_id == f"conversation-{conversation}/turn-2"


# --------------------------------------------------------------------------------------------------
# Memory across the turns of a conversation
# --------------------------------------------------------------------------------------------------


class FailingSummarizer:
    async def complete(self, prompt: str) -> str:
        raise RuntimeError("summarizer unavailable")


async def test_the_turns_of_a_conversation_share_a_memory_kept_within_its_limits(client: Client, tmp_path):
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    planner = CapturingPlanner()
    async with Harness(client, tmp_path, planner=planner, memory=memory) as h:
        h.activities.memory_context_window = 1024
        agents, conversation = agents_for(h), new_id("mem")
        accepted = [await agents.submit_turn(conversation, f"tell me about topic {n}") for n in range(1, 6)]
        for a in accepted:
            await agents.turn_result(a)
        records = [await agents.record(a.workflow_id) for a in accepted]
        await keep_histories(h, conversation, [a.workflow_id for a in accepted])

    recalled = await memory.recall(conversation)
    assert [e.request for e in recalled.exchanges] == [f"tell me about topic {n}" for n in (3, 4, 5)]
    assert "topic 1" in recalled.summary and "topic 2" in recalled.summary
    assert estimate_tokens(recalled.summary) <= 1024 // 8
    fourth, fifth = records[3].memory, records[4].memory
    assert fourth is not None and (fourth.evicted, fourth.summary) == (1, "heuristic")
    assert fifth is not None and fifth.evicted == 1
    # The fifth turn planned with the summary of the first two and the three exchanges after them.
    assert "topic 1" in planner.prompts[-1] and "topic 4" in planner.prompts[-1]


async def test_a_summarizer_failure_keeps_the_answer_and_is_a_memory_diagnostic(client: Client, tmp_path):
    memory = ConversationMemoryStore(tmp_path / "memory.sqlite3")
    async with Harness(client, tmp_path, planner=ScriptedPlanner(), memory=memory) as h:
        h.activities.memory_summarizer = FailingSummarizer()
        agents, conversation = agents_for(h), new_id("memfail")
        accepted = [await agents.submit_turn(conversation, f"turn {n}") for n in range(1, 5)]
        answers = [await agents.turn_result(a) for a in accepted]
        outcome = await h.finish(h.client.get_workflow_handle(accepted[3].workflow_id, result_type=RequestResult))

    assert all(a.response for a in answers)
    assert outcome.failure is None and outcome.record is not None
    assert [d.error_type for d in outcome.record.diagnostics] == ["MemoryError"]
    assert outcome.activity_types().count("remember") == 1 and outcome.activity_types().count("plan") == 1
    assert len((await memory.recall(conversation)).exchanges) == 3


# --------------------------------------------------------------------------------------------------
# agent-lifecycle chat
# --------------------------------------------------------------------------------------------------


async def test_chat_reads_turns_from_stdin_prints_answers_and_asks_for_approval(client: Client, tmp_path):
    async with Harness(client, tmp_path) as h:
        conversation = new_id("chat")
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "TEMPORAL_TASK_QUEUE": h.task_queue,
            "AGENT_STATE_DIR": str(tmp_path / "cli"),
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none",
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "client.cli",
            "chat",
            "--conversation",
            conversation,
            "--reviewer",
            "alice",
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        lines = "What is the price of ACME?\nSend bob a message saying hello\ny\n/quit\n"
        stdout, stderr = await asyncio.wait_for(process.communicate(lines.encode()), 120)
        agents = agents_for(h)
        turns = await settled(agents, conversation, 2)
        second = await agents.record(turns.done[1].workflow_id)
        await keep_histories(h, conversation, [t.workflow_id for t in turns.done])

    out, err = stdout.decode(), stderr.decode()
    assert process.returncode == 0, err
    assert "ACME" in out and "approve? [y/N]" in out
    assert f"[turn 1: conversation-{conversation}/turn-1]" in err and "approved" in err
    assert [t.status for t in turns.done] == ["succeeded", "succeeded"]
    assert [c.status for c in second.checkpoints] == ["approved"] and second.checkpoints[0].reviewer == "alice"


async def test_both_entry_paths_stay_in_order_across_continue_as_new(client: Client, tmp_path):
    slow = SlowTool(seconds=0.5)
    async with Harness(client, tmp_path, tools=[slow], planner=ScriptedPlanner()) as h:
        agents = AgentClient(h.client, Settings(task_queue=h.task_queue, conversation_turns_per_run=2))
        conversation = new_id("mixcan")
        order: list[str] = [(await agents.submit_turn(conversation, "slow submitted 1")).workflow_id]
        direct = []
        for n in range(1, 4):
            handle = await h.start("slow direct", {"conversation_id": conversation}, workflow_id=f"d{n}-{conversation}")
            direct.append(handle)
            order.append(handle.id)
            await arrived(agents, conversation, handle.id)  # its claim is in: the next turn queues behind it
            order.append((await agents.submit_turn(conversation, f"slow submitted {n + 1}")).workflow_id)
        outcomes = [await h.finish(handle) for handle in direct]
        turns = await settled(agents, conversation, len(order))
        await keep_histories(h, conversation, [w for w in order if w.startswith("conversation-")])

    assert all(o.failure is None for o in outcomes)
    spans = sorted((s for s in slow.spans if conversation in s.request_id), key=lambda s: s.started)
    assert [s.request_id for s in spans] == order and overlapping(spans) == []
    assert turns.runs >= 3 and [t.workflow_id for t in turns.done][-len(order) :] == order


class StopWhenAsked:
    name = "stop-when-asked"

    async def before_run(self, ctx: Any, run: Any) -> Any:
        if "stop" in run.ask:
            return Stop(text="Not today.", reason="asked to stop")
        return None


async def test_a_stopped_turn_of_either_entry_path_releases_the_next_one(client: Client, tmp_path):
    async with Harness(client, tmp_path, hooks=[StopWhenAsked()], planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("stop")
        direct = await h.start("please stop", {"conversation_id": conversation}, workflow_id=f"d-{conversation}")
        await arrived(agents, conversation, direct.id)
        submitted = await agents.submit_turn(conversation, "stop here too")
        last = await agents.submit_turn(conversation, "and go on")
        stopped = await h.finish(direct)
        by_turn = await agents.turn_result(submitted)
        answer = await agents.turn_result(last)
        turns = await settled(agents, conversation, 3)
        await keep_histories(h, conversation, [submitted.workflow_id, last.workflow_id])

    assert stopped.result is not None and stopped.result.stopped is not None
    assert by_turn.stopped is not None and answer.stopped is None
    assert [t.status for t in turns.done] == ["stopped", "stopped", "succeeded"]


async def test_a_sub_agent_runs_within_its_parents_turn_without_claiming_one(client: Client, tmp_path):
    async with Harness(client, tmp_path, tools=[Delegate()], planner=ScriptedPlanner()) as h:
        agents, conversation = agents_for(h), new_id("sub")
        direct = await h.start("delegate it", {"conversation_id": conversation}, workflow_id=f"d-{conversation}")
        submitted = await agents.submit_turn(conversation, "delegate this one too")
        outcome = await asyncio.wait_for(h.finish(direct), 60)
        answer = await asyncio.wait_for(agents.turn_result(submitted), 60)
        turns = await settled(agents, conversation, 2)
        await keep_histories(h, conversation, [submitted.workflow_id])

    assert outcome.failure is None and answer.steps[0].status == "succeeded"
    assert [t.status for t in turns.done] == ["succeeded", "succeeded"]  # no sub-agent took a turn
