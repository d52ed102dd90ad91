"""The agent's tools: read notes (read only), and write a note (needs a reviewer's approval).

A tool is a class: its identity (``namespace/agent/capability``), what it is for (the model reads the
description), its arguments as a pydantic model (validated before it runs) and ``run``. The notes live in
a JSON file in the state directory, so every worker process sees the same notes.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agent_lifecycle import Tool, ToolContext


class _Notes:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, str]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def write(self, notes: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(notes, indent=2, sort_keys=True))


class FindNoteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1, max_length=200)


class FindNote(Tool):
    namespace, agent, capability = "notes", "notes-service", "find_note"
    description = "Read the note with this title."
    read_only = True  # an answer built only from read-only tools may be cached
    Arguments = FindNoteArguments

    def __init__(self, notes: _Notes) -> None:
        self._notes = notes

    async def run(self, arguments: FindNoteArguments, ctx: ToolContext) -> dict[str, str]:
        text = self._notes.read().get(arguments.title)
        return {"title": arguments.title, "text": text if text is not None else "(no such note)"}


class WriteNoteArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=4000)


class WriteNote(Tool):
    namespace, agent, capability = "notes", "notes-service", "write_note"
    description = "Write (or replace) the note with this title."
    approval_required = True  # the request waits for a reviewer before this runs, as it will run
    Arguments = WriteNoteArguments

    def __init__(self, notes: _Notes) -> None:
        self._notes = notes

    async def run(self, arguments: WriteNoteArguments, ctx: ToolContext) -> dict[str, str]:
        notes = self._notes.read()
        notes[arguments.title] = arguments.text
        self._notes.write(notes)
        return {"title": arguments.title, "written": "yes"}


def notes_tools(state_dir: Path) -> list[Tool]:
    notes = _Notes(state_dir / "first-agent-notes.json")
    return [FindNote(notes), WriteNote(notes)]
