"""The lifecycle beside the agent frameworks users would put on Temporal: the same request, the same model
server, the same dev server, the same hooks, measured in one run (``python -m benchmarks.peer``).

The request: the model calls a quote tool three times in one turn (AAA, BBB, CCC), the tools run, the
model answers in text from their results. Each system runs the hooks applications put in most — a
request context, a plan guard, an allow-list and a redactor on every tool call, an answer redactor, an
audit — at its own hook points, each doing the same work (:mod:`benchmarks.peer.policy`). The pieces:

- :mod:`benchmarks.peer.model_server`: the local OpenAI-compatible model server every system calls, in a
  process of its own; it answers every call from the conversation it is sent, so concurrent requests of
  any system get the same scripted turns, and it counts each system's calls;
- :mod:`benchmarks.peer.lifecycle_hooks`: the lifecycle's hooks;
- :mod:`benchmarks.peer.agents_peer`: ``openai-agents`` on ``temporalio-openai-agents``;
- :mod:`benchmarks.peer.pydantic_agent` and :mod:`benchmarks.peer.pydantic_peer`: pydantic-ai's
  Temporal integration (``TemporalDurability``);
- :mod:`benchmarks.peer.workers`: the worker processes, one per framework;
- :mod:`benchmarks.peer.timeline`: a request's history, event by event, with time offsets;
- :mod:`benchmarks.peer.bench`: the runner and its table.

This module holds only names they share: the peers' workflow sandbox imports it, so it imports nothing
but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REQUEST = "What is the price of AAA BBB CCC?"
SYMBOLS = ("AAA", "BBB", "CCC")
QUOTE_CAPABILITY = "stock_quote"
# The peers' instructions (the lifecycle's planner has its own prompt).
INSTRUCTIONS = "You answer questions about stock prices. Use the stock_quote tool for every symbol asked about."

# The systems, in the table's order: the lifecycle started through the project's client and through a
# plain Temporal client (one worker, two queues), then the peers.
LIFECYCLE = "lifecycle"
LIFECYCLE_PLAIN = "lifecycle_plain"
OPENAI_AGENTS = "openai_agents"
PYDANTIC_AI = "pydantic_ai"
SYSTEMS: tuple[str, ...] = (LIFECYCLE, LIFECYCLE_PLAIN, OPENAI_AGENTS, PYDANTIC_AI)
PEERS: tuple[str, ...] = (OPENAI_AGENTS, PYDANTIC_AI)
LIFECYCLES: tuple[str, ...] = (LIFECYCLE, LIFECYCLE_PLAIN)
# The hooks, by the names every system counts them under.
HOOKS: tuple[str, ...] = (
    "request-context",
    "plan-guard",
    "tool-allow-list",
    "result-redactor",
    "answer-redactor",
    "audit",
)


def model_name(system: str) -> str:
    """The model name each system sends: the model server counts calls per name, i.e. per system."""
    return f"bench-{system.replace('_', '-')}"


AGENTS_MODEL = model_name(OPENAI_AGENTS)
PYDANTIC_MODEL = model_name(PYDANTIC_AI)
# Where pydantic-ai's agent reads the model server's URL as its module is imported.
PYDANTIC_MODEL_URL_VARIABLE = "BENCH_MODEL_URL"


@dataclass
class PeerInput:
    request: str


@dataclass
class PeerAnswer:
    answer: str
    # hook -> invocations in this request
    hook_invocations: dict[str, int] = field(default_factory=dict)
