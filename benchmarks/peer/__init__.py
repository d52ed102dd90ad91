"""The lifecycle beside the OpenAI Agents SDK on Temporal: the same request, the same model server, the
same dev server, measured in one run (``python -m benchmarks.peer``).

The request: the model calls a quote tool three times in one turn (AAA, BBB, CCC), the tools run, the
model answers in text from their results. Six trivial hooks run on each side. The pieces:

- :mod:`benchmarks.peer.model_server`: the local OpenAI-compatible model server both systems call, in a
  process of its own; it answers every call from the conversation it is sent, so concurrent requests of
  any system get the same scripted turns, and it counts each system's calls;
- :mod:`benchmarks.peer.agents_peer`: the peer, ``openai-agents`` on ``temporalio-openai-agents``
  (an ``Agent`` with a Chat Completions model and the quote as ``activity_as_tool``, its hooks as
  guardrails and ``RunHooks``, the workflow in Temporal's sandbox);
- :mod:`benchmarks.peer.workers`: the worker processes, one per system;
- :mod:`benchmarks.peer.timeline`: a request's history, event by event, with time offsets;
- :mod:`benchmarks.peer.__main__`: the runner and its table.

This module holds only names they share: the peer's workflow sandbox imports it, so it imports nothing.
"""

from __future__ import annotations

REQUEST = "What is the price of AAA BBB CCC?"
SYMBOLS = ("AAA", "BBB", "CCC")
QUOTE_CAPABILITY = "stock_quote"

# The model name each system sends: the model server counts calls per name, i.e. per system.
PEER_MODEL = "bench-agents-peer"
LIFECYCLE_PHASES = {"lifecycle_1": 1, "lifecycle_3": None}  # None: the pipeline's defaults (3 phases)


def lifecycle_model(system: str) -> str:
    return f"bench-{system.replace('_', '-')}"
