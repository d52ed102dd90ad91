"""A rule planner: the agent's tools chosen from the ask, without a model.

With ``AGENT_MODEL`` set, leave the planner out of ``build_pipeline`` and the model plans instead: it
reads each tool's description and arguments from the tool classes. A rule planner is the way to start
(and to test) before a model is wired in.
"""

from __future__ import annotations

import re

from agent_lifecycle import Plan, PlanningRequest, PlanStep


class NotesPlanner:
    """``read <title>`` finds a note; ``write <title>: <text>`` writes one; anything else plans nothing."""

    name = "notes-rules"

    async def plan(self, request: PlanningRequest) -> Plan:
        if request.phase > 1:
            return Plan(phase=request.phase)
        ask = request.request.strip()
        if match := re.match(r"(?i)write\s+(.+?):\s*(.+)", ask):
            return _one_step("write_note", title=match.group(1).strip(), text=match.group(2).strip())
        if match := re.match(r"(?i)read\s+(.+)", ask):
            return _one_step("find_note", title=match.group(1).strip())
        return Plan(phase=1)


def _one_step(capability: str, **arguments: str) -> Plan:
    step = PlanStep(step_id="s1", namespace="notes", agent="notes-service", capability=capability, arguments=arguments)
    return Plan(phase=1, steps=[step])
