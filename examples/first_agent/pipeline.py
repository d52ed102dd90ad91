"""The pipeline factory the worker loads: ``AGENT_PIPELINE=examples.first_agent.pipeline:build``.

``build_pipeline`` takes the agent's own parts and applies every worker setting around them: the declared
hooks of ``AGENT_HOOKS_FILE``, the MCP servers of ``AGENT_MCP_SERVERS``, the model of ``AGENT_MODEL`` (the
planner and synthesizer when none is given), the reviewers of ``AGENT_REVIEWERS``, the checkpoint expiry,
the reviewers' webhook and the execution store.
"""

from __future__ import annotations

from agent_lifecycle import LifecycleActivities, ReadableSynthesizer, Settings, build_pipeline

from .hooks import Disclaimer, NoSecrets, OnlyNotesTools
from .planner import NotesPlanner
from .tools import notes_tools


def build(settings: Settings) -> LifecycleActivities:
    return build_pipeline(
        settings,
        name="first-agent",
        hooks=[NoSecrets(), Disclaimer(), OnlyNotesTools()],  # the required gate last among after_planning
        tools=notes_tools(settings.state_dir),
        planner=NotesPlanner(),  # leave it out to plan with AGENT_MODEL
        synthesizer=ReadableSynthesizer(),  # leave it out to write the answer with the model
    )
