"""The pydantic-ai peer's workflow: one request, its agent (:mod:`benchmarks.peer.pydantic_agent`, with its
hooks) run until the model answers in text. It returns the answer and how many times each hook ran.

The workflow runs in Temporal's sandbox with the passthrough modules ``PydanticAIPlugin`` adds, and
imports the agent through it.
"""

from __future__ import annotations

from collections import Counter

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow

    from benchmarks.peer import PeerAnswer, PeerInput
    from benchmarks.peer.pydantic_agent import HOOK_COUNTS, agent

PYDANTIC_WORKFLOW = "BenchPydanticAIPeer"


@workflow.defn(name=PYDANTIC_WORKFLOW)
class PydanticPeerWorkflow(PydanticAIWorkflow):
    """One request: the agent runs until the model answers in text."""

    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, input: PeerInput) -> PeerAnswer:
        counts: Counter[str] = Counter()
        HOOK_COUNTS.set(counts)
        result = await agent.run(input.request)
        return PeerAnswer(answer=str(result.output), hook_invocations=dict(counts))
