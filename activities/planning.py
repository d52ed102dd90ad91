"""The planner and synthesizer interfaces, and the default planning prompt builder (which renders the
well-known enrichments in their sections)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

from workflows.models import (
    ENRICHMENT_ACTIVITY_COORDINATION,
    ENRICHMENT_CONVERSATION_HISTORY,
    ENRICHMENT_RAG_CONTEXT,
    ENRICHMENT_USER_PROFILE,
    Plan,
    PlanRepair,
    PriorTurn,
    StepResult,
    StepStatus,
    SynthesizeInput,
    SynthesizeOutput,
    ToolSpec,
)

if TYPE_CHECKING:  # activities.models imports this module
    from .models.call_log import ModelCallLog

# The well-known keys the default builder renders, in prompt order, and the tag each is wrapped in.
# user_profile has no tag: it is inserted verbatim, so its writer supplies its own <user_profile> block.
RENDERED_ENRICHMENTS: tuple[tuple[str, str | None], ...] = (
    (ENRICHMENT_RAG_CONTEXT, "agent_memory"),
    (ENRICHMENT_CONVERSATION_HISTORY, "conversation_history"),
    (ENRICHMENT_ACTIVITY_COORDINATION, "agent_coordination"),
    (ENRICHMENT_USER_PROFILE, None),
)


@dataclass(frozen=True)
class PromptInput:
    """What a prompt builder reads: the request, a copy of the enrichments, the tools, the phase."""

    request: str
    enrichments: Mapping[str, JsonValue]
    tools: list[ToolSpec]
    phase: int = 1
    instructions: str = ""
    facts: Mapping[str, JsonValue] = field(default_factory=dict)
    context_text: str = ""  # from before_plan hooks, for this planning attempt only
    # The planner offers the tools to its model as functions (tool calling, ``Planner.tools_as_functions``):
    # the functions carry the tools and the answer's form, so the prompt states neither.
    tools_as_functions: bool = False


@dataclass(frozen=True)
class PlanningRequest:
    """What a planner receives. An LLM planner sends ``prompt``; a rule planner may read ``request``."""

    request: str
    request_id: str
    prompt: str
    enrichments: Mapping[str, JsonValue]
    tools: list[ToolSpec]
    phase: int = 1
    metadata: Mapping[str, JsonValue] = field(default_factory=dict)
    # Every step of the earlier phases, in order, as a model reads them (result text, no raw output):
    # what a later phase plans from. To pass an output to a tool, write {{steps.<step_id>.output.<field>}}
    # in an argument and list the step id in implicit_deps; the workflow resolves it at execution.
    prior_results: list[StepResult] = field(default_factory=list)
    # The pipeline's and the request's instructions, as before_run hooks left them.
    instructions: str = ""
    facts: Mapping[str, JsonValue] = field(default_factory=dict)
    # This invocation's model calls and the token budget left: a model planner appends every call it makes.
    model_calls: ModelCallLog | None = None
    # The planning attempt (0, then one more for each malformed plan retried), its context text from
    # before_plan hooks, and — on a retry — the malformed turn and what was wrong with it.
    attempt: int = 0
    context_text: str = ""
    repair: PlanRepair | None = None
    # The model's own turns of earlier phases, replayed to it as they were (each call answered by its id).
    prior_turns: list[PriorTurn] = field(default_factory=list)
    route: str = "primary"  # "fallback": the primary model failed; the planner's fallback model plans


class PlanRepairNeeded(Exception):
    """Raised by a planner whose plan is malformed in a way it can correct on another attempt: the turn,
    and what was wrong with each of its calls. The next attempt receives them as ``PlanningRequest.repair``
    (after before_plan hooks run again); a plan still malformed then is ``InvalidPlan``."""

    def __init__(self, repair: PlanRepair, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.repair, self.problems = repair, problems


class AnswerWriter(Protocol):
    """Where a planner that streams writes its model's text while the model writes it (the request's
    answer stream, for a request that asked to stream its answer)."""

    def write(self, text: str) -> None:
        """The next piece of the model's text."""
        ...

    def retract(self) -> None:
        """The text written since the last retraction is no answer: the turn that wrote it went on to
        call tools (a preamble such as "Let me look that up")."""
        ...


class Planner(Protocol):
    """Chooses the tools for a request. Returns a :class:`Plan` for ``request.phase``; setting
    ``continue_after`` asks to plan again once this phase's steps have run.

    A planner that offers the tools to its model as functions (tool calling) says so with a class
    attribute ``tools_as_functions = True``: the prompt it receives then lists no tool and asks for no
    answer format (``PromptInput.tools_as_functions``).

    A planner that sends the run's instructions to its model itself (as its system message) says so with
    ``instructions_in_system = True``: the prompt it receives then leaves them out (they are still in
    ``PlanningRequest.instructions``), so the model reads them once.

    A planner whose model may answer in text (``Plan.answer``, the answer's draft) can stream that text:
    it says so with a class attribute ``streams_answer = True``, and its ``plan`` then takes a keyword
    argument ``answer``, an :class:`AnswerWriter`, when the request streams its answer. It writes each
    piece of its model's text there as it arrives, and retracts what a turn wrote when that turn calls
    tools. (The plan activity also retracts text left standing by a plan that is not a text answer, or
    by a planner that failed.)"""

    name: str

    async def plan(self, request: PlanningRequest) -> Plan: ...


class Synthesizer(Protocol):
    """Writes the answer from the request, the plan and the step results."""

    name: str

    async def synthesize(self, input: SynthesizeInput) -> SynthesizeOutput: ...


PromptBuilder = Callable[[PromptInput], str]


def _as_text(value: JsonValue) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def context_sections(
    instructions: str, facts: Mapping[str, JsonValue], enrichments: Mapping[str, JsonValue]
) -> list[str]:
    """The request's context as a model reads it: the instructions, the facts, then each well-known
    enrichment in its tagged section (``RENDERED_ENRICHMENTS`` order); empty parts are left out."""
    sections: list[str] = []
    if instructions:
        sections.append(f"<instructions>\n{instructions}\n</instructions>")
    if facts:
        lines = "\n".join(f"{key}: {_as_text(value)}" for key, value in sorted(facts.items()))
        sections.append(f"<facts>\n{lines}\n</facts>")
    for key, tag in RENDERED_ENRICHMENTS:
        value = enrichments.get(key)
        if value is None or value == "":
            continue
        text = _as_text(value)
        sections.append(f"<{tag}>\n{text}\n</{tag}>" if tag else text)
    return sections


def system_message(system_prompt: str, instructions: str) -> str:
    """A model's system message: how it works (the planner's or synthesizer's own prompt), then the run's
    instructions, tagged, where there are any."""
    if not instructions.strip():
        return system_prompt
    return f"{system_prompt}\n\n<instructions>\n{instructions}\n</instructions>"


def build_planning_prompt(input: PromptInput) -> str:
    """The default planning prompt: known enrichments as tagged sections, then tools, then the request.

    Only the four well-known keys are rendered; any other enrichment needs a custom builder.

    For a planner that offers the tools as functions (``input.tools_as_functions``) the prompt is the
    user's message alone: the context sections, then the request. The functions carry the tools with
    their schemas and the answer's form (a tool call, or text), so listing them again would cost input
    tokens on every call and asking for a JSON answer would contradict them; the message names no phase,
    so it is the same in every phase and a provider's prompt cache keeps the conversation's prefix.
    """
    context = context_sections(input.instructions, input.facts, input.enrichments)
    if input.context_text:
        context.append(f"<planning_context>\n{input.context_text}\n</planning_context>")
    if input.tools_as_functions:
        return "\n\n".join([*context, f"User request:\n{input.request}"])
    sections = [
        "You are the planner of an agent. Choose the tool calls that answer the user's request, or none.",
        *context,
    ]
    tool_lines = [
        f"- {t.key}: {t.description} parameters={json.dumps(t.parameters.get('properties', {}), sort_keys=True)}"
        for t in input.tools
    ]
    sections.append("Available tools:\n" + ("\n".join(tool_lines) if tool_lines else "(none)"))
    sections.append(f"User request (planning phase {input.phase}):\n{input.request}")
    sections.append(
        'Answer with JSON: {"steps": [{"step_id", "namespace", "agent", "capability", "arguments", '
        '"depends_on"}]}; depends_on may name only earlier steps.'
    )
    return "\n\n".join(sections)


class ReadableSynthesizer:
    """The default synthesizer without a model: each step's outcome on its own line, the result text as a
    planner or model would read it (after after_tool hooks), and a line saying nothing ran when nothing did."""

    name = "readable"

    async def synthesize(self, input: SynthesizeInput) -> SynthesizeOutput:
        steps = input.execution.steps
        if not steps:
            return SynthesizeOutput(response="No tool was needed for this request, and none ran.", confidence=0.5)
        lines = []
        for step in steps:
            text = (step.result or "").strip() or "(no result)"
            if step.recovered_from is not None:
                lines.append(f"{step.tool}: failed, handled by {step.recovered_from.handled_by}: {text}")
            elif step.status is StepStatus.SUCCEEDED:
                lines.append(f"{step.tool}: {text}")
            elif step.status is StepStatus.FAILED:
                lines.append(f"{step.tool} failed: {text}")
            else:
                lines.append(f"{step.tool} was not run ({step.skip_reason or 'skipped'}): {text}")
        succeeded = sum(s.status is StepStatus.SUCCEEDED and s.recovered_from is None for s in steps)
        return SynthesizeOutput(response="\n".join(lines), confidence=round(succeeded / len(steps), 3))
