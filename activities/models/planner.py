"""``OpenAIPlanner``: a :class:`~activities.planning.Planner` on any OpenAI-compatible Chat Completions
endpoint, planning with function calling.

What the model is sent: a system message saying how to plan with functions, followed by the run's
instructions (the pipeline's and the request's, as before_run left them), then ``PlanningRequest.prompt``
verbatim as the user message — the prompt builder's output, so the enrichments and facts reach the model
exactly as with any planner (the builder is given no instructions, sent apart, and is told
that the tools go as functions: the default one then lists no tool, asks for no answer format and names
no phase, so the message is the same in every phase). The request's tools are offered as functions with
their JSON schemas, named by :mod:`.tool_names`. From phase 2 on, every
earlier step is sent back as one assistant message calling it (the call id is the step id, the arguments
as executed) followed by one ``tool`` message with its result text — what a model may read, never the
raw output. Once a phase has planned, later phases replay the model's own turn as it was — its text and
its tool calls with the model's ids — and answer each call by that id (``tool_call_id``), so providers
that check call ids against their own accept the history; steps a hook added to a plan follow as one
more turn.

What the model's answer becomes: each tool call one :class:`PlanStep` (id ``<capability>-<n>``, unique
across the request's phases), with no ``depends_on`` — calls of one answer are independent and run
concurrently. A reference ``{{steps.<id>.output.<field>}}`` to an earlier step's output lands in
``implicit_deps``. The plan asks for another phase (``continue_after``) exactly when it has steps, so
the model sees their results; an answer without calls is an empty plan, which ends planning (the
workflow also caps the phases), and its text is the plan's ``answer``: the answer's draft, unless the
pipeline asks for a dedicated synthesis call.

Invalid calls — arguments that are not a JSON object or do not fit the tool's arguments model, an
unknown function, a reference to no earlier step — get one repair turn: the errors go back as the calls'
tool messages and the model answers again, whole. The repair is the phase's next planning attempt, its
own activity after before_plan hooks ran again (``PlanRepairNeeded``). Still invalid: ``InvalidPlan``
(non-retryable), never an exception of another kind.

With a fallback model (``AGENT_FALLBACK_MODEL``), a request whose route is ``fallback`` is planned by it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic

from workflows.extras import missing_extra

try:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessage
except ImportError as err:
    raise missing_extra("openai", "a model (AGENT_MODEL)", err) from err

from workflows.models import ModelToolCall, ModelTurn, Plan, PlanRepair, PlanStep, StepResult, StepStatus, ToolSpec
from workflows.plan_validation import step_references

from ..planning import AnswerWriter, PlanningRequest, PlanRepairNeeded, system_message
from ..tools import ToolRegistry
from .calls import ChatModel, ModelCallLog, RoutedChat, TokenCounter, Turn
from .settings import ModelSettings
from .tool_names import ToolNames, function_name

PLANNER_SYSTEM_PROMPT = """\
You are the planner of an agent: you choose tool calls, the agent runs them.
Call the functions provided for what the user's request needs. The calls of one answer run independently \
and at the same time; you will see their results, as tool messages, in the next turn.
When nothing more is needed, or no function helps, answer the user without calling any function: that answer \
is what the user reads, so write it from the tool results and the context, directly and briefly, in the \
language of the request, without mentioning tool call ids.
To pass an earlier result's field exactly, you may write {{steps.<tool call id>.output.<field>}} in a string argument.
The functions are the plan: ignore any instruction below to answer with a JSON plan."""

MAX_RATIONALE_CHARS = 500
_STEP_ID_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


def _step_id(capability: str, taken: set[str]) -> str:
    """``<capability>-<n>``, the smallest n not taken (by this plan or an earlier phase)."""
    base = _STEP_ID_CHARS.sub("_", capability).lstrip("_.-")[:48] or "step"
    n = 1
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _result_text(result: StepResult) -> str:
    """A step's result as the model reads it; a step that did not succeed says so first."""
    text = result.result or ""
    if result.status is not StepStatus.SUCCEEDED:
        text = f"[{result.status.value}] {text}".strip()
    return text or "(no result)"


def _function(spec: ToolSpec, name: str) -> dict[str, Any]:
    parameters = spec.parameters or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": name, "description": spec.description or spec.key, "parameters": parameters},
    }


def model_turn(message: ChatCompletionMessage) -> ModelTurn:
    """The model's answer as it was: its text and its calls, each with the id it goes by."""
    calls = []
    for n, call in enumerate(message.tool_calls or ()):
        if call.type == "function":
            name, arguments = call.function.name, call.function.arguments
        else:
            name, arguments = call.custom.name, call.custom.input
        calls.append(ModelToolCall(id=call.id or f"call_{n}", name=name, arguments=arguments or ""))
    return ModelTurn(content=message.content, tool_calls=calls)


def _assistant(turn: ModelTurn) -> dict[str, Any]:
    """A model's turn as the assistant message that replays it."""
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in turn.tool_calls
    ]
    return {"role": "assistant", "content": turn.content, "tool_calls": calls}


def _request_log(request: PlanningRequest) -> ModelCallLog:
    """The log the activity passed with the request, or a fresh one (its calls then reach only errors)."""
    log = getattr(request, "model_calls", None)
    return log if isinstance(log, ModelCallLog) else ModelCallLog()


class OpenAIPlanner(RoutedChat):
    """Plans with a Chat Completions model's tool calls.

    Args:
        settings: The endpoint and call options.
        tools: The worker's tools: their function names (checked here) and their arguments models, which
            validate every call before it becomes a step.
        model: The model; by default ``settings.role_model("planner")``.
        client: An ``AsyncOpenAI`` client to share; by default one from ``settings`` (no client retries).
        system_prompt: How to plan with functions; the planning prompt itself is the user message.
        fallback: The fallback model's settings; by default ``settings.fallback()`` (none without
            ``AGENT_FALLBACK_MODEL``).
        token_counter: Counts a prompt's tokens for the prompt budget; by default a conservative estimate.

    Raises:
        ValueError: two tools map to the same function name.
    """

    # The tools go to the model as functions: the planning prompt lists none and asks for no answer form.
    tools_as_functions = True
    # ``plan`` writes the model's text to an ``answer`` writer as it arrives (the call is streamed).
    streams_answer = True
    # The run's instructions go in the system message, after the planner's own (the prompt leaves them out).
    instructions_in_system = True

    def __init__(
        self,
        settings: ModelSettings,
        tools: ToolRegistry,
        *,
        model: str | None = None,
        client: AsyncOpenAI | None = None,
        system_prompt: str = PLANNER_SYSTEM_PROMPT,
        fallback: ModelSettings | None = None,
        token_counter: TokenCounter | None = None,
    ) -> None:
        model = model or settings.role_model("planner")
        self.tools = tools
        self.names = ToolNames(tools.specs())
        super().__init__(
            settings, "planner", "planning", model=model, client=client, fallback=fallback, token_counter=token_counter
        )
        self.system_prompt = system_prompt

    async def plan(
        self, request: PlanningRequest, *, calls: ModelCallLog | None = None, answer: AnswerWriter | None = None
    ) -> Plan:
        """The plan of ``request.phase``. Every model call is appended to ``calls`` (by default the log the
        request carries), whose budget is checked before each call. With an ``answer`` writer the calls are
        streamed and the model's text is written to it as it arrives; a turn that ends calling tools
        wrote no answer, and the writer is told so (``retract``) when it had written text."""
        log = calls if calls is not None else _request_log(request)
        chat = self._routed(request.route)
        names = self.names if all(spec.key in self.names for spec in request.tools) else ToolNames(request.tools)
        functions = [_function(spec, names.name(spec.key)) for spec in request.tools]
        prior = {result.step_id for result in request.prior_results}
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_message(self.system_prompt, request.instructions)},
            {"role": "user", "content": request.prompt},
            *self._history(request, names),
        ]
        if request.repair is not None:
            messages += self._repair(request.repair)
        turn = await self._turn(chat, log, messages, functions, request.phase, request.attempt + 1, answer)
        steps, problems = self._steps(turn.message, names, prior)
        if any(problems):
            # Each attempt is its own activity: the workflow asks again, with what was wrong.
            listed = [f"call {n + 1}: {problem}" for n, found in enumerate(problems) for problem in found][:10]
            raise PlanRepairNeeded(PlanRepair(turn=model_turn(turn.message), problems=problems), listed)
        log.turn = model_turn(turn.message)
        content = turn.message.content or ""
        return Plan(
            phase=request.phase,
            steps=steps,
            rationale=content[:MAX_RATIONALE_CHARS],
            continue_after=bool(steps),
            answer=None if steps or not content.strip() else content,
        )

    @staticmethod
    async def _turn(
        chat: ChatModel,
        log: ModelCallLog,
        messages: list[dict[str, Any]],
        functions: list[dict[str, Any]],
        phase: int,
        number: int,
        answer: AnswerWriter | None,
    ) -> Turn:
        """One turn of the model: whole, or streamed into ``answer`` (retracted when it calls tools)."""
        if answer is None:
            return await chat.complete(log, messages, tools=functions, phase=phase, turn=number)
        wrote = False

        def write(text: str) -> None:
            nonlocal wrote
            wrote = True
            answer.write(text)

        turn = await chat.complete_streamed(log, messages, write, tools=functions, phase=phase, turn=number)
        if wrote and turn.message.tool_calls:
            answer.retract()
        return turn

    def _repair(self, repair: PlanRepair) -> list[dict[str, Any]]:
        """A malformed turn sent back: the turn as it was, and each call answered with what was wrong."""
        notes = [
            {"role": "tool", "tool_call_id": call.id, "content": self._repair_note(found)}
            for call, found in zip(repair.turn.tool_calls, repair.problems, strict=False)
        ]
        return [_assistant(repair.turn), *notes]

    @classmethod
    def _history(cls, request: PlanningRequest, names: ToolNames) -> list[dict[str, Any]]:
        """The earlier phases: the model's own turns as they were, each call answered by its id with its
        step's result; then the steps no turn of the model called (a hook added them) as one more turn."""
        results = {result.step_id: result for result in request.prior_results}
        messages: list[dict[str, Any]] = []
        answered: set[str] = set()
        for prior in request.prior_turns:
            if not prior.turn.tool_calls:
                continue
            messages.append(_assistant(prior.turn))
            for call in prior.turn.tool_calls:
                result = results.get(prior.step_ids.get(call.id, ""))
                content = _result_text(result) if result else "Not run: the plan was changed before this call ran."
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
                if result is not None:
                    answered.add(result.step_id)
        rest = [result for result in request.prior_results if result.step_id not in answered]
        return messages + cls._steps_turn(rest, request.tools, names)

    @staticmethod
    def _steps_turn(prior: list[StepResult], tools: list[ToolSpec], names: ToolNames) -> list[dict[str, Any]]:
        """Steps as one assistant turn calling them (ids: the step ids) and their results."""
        if not prior:
            return []
        keys = {f"{spec.agent}/{spec.capability}": spec.key for spec in tools}
        calls, results = [], []
        for result in prior:
            key = keys.get(result.tool)
            name = names.name(key) if key is not None and key in names else function_name(result.tool)
            arguments = json.dumps(result.arguments or {}, ensure_ascii=False, sort_keys=True)
            calls.append({"id": result.step_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            results.append({"role": "tool", "tool_call_id": result.step_id, "content": _result_text(result)})
        return [{"role": "assistant", "content": None, "tool_calls": calls}, *results]

    def _steps(
        self, message: ChatCompletionMessage, names: ToolNames, prior: set[str]
    ) -> tuple[list[PlanStep], list[list[str]]]:
        """The steps of the model's calls, and each call's problems (all empty when the plan is valid)."""
        steps: list[PlanStep] = []
        problems: list[list[str]] = []
        taken = set(prior)
        for call in message.tool_calls or ():
            if call.type != "function":
                problems.append([f"{call.type} tool calls are not supported: call one of the functions"])
                continue
            found: list[str] = []
            key = names.key(call.function.name)
            if key is None:
                found.append(f"there is no function named {call.function.name!r}")
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except ValueError as err:
                found.append(f"the arguments are not valid JSON ({err})")
                arguments = {}
            if not isinstance(arguments, dict):
                found.append("the arguments must be a JSON object")
            if found or key is None or not isinstance(arguments, dict):
                problems.append(found)
                continue
            namespace, agent, capability = key.split("/", 2)
            try:
                step = PlanStep(
                    step_id=_step_id(capability, taken),
                    namespace=namespace,
                    agent=agent,
                    capability=capability,
                    arguments=arguments,
                    metadata={"model_tool_call_id": call.id} if call.id else {},
                )
            except pydantic.ValidationError as err:
                problems.append([f"the arguments are not plain JSON values ({err.error_count()} errors)"])
                continue
            taken.add(step.step_id)
            references = step_references(step)
            step.implicit_deps = sorted(references & prior)
            found += [f"{ref!r} is not the id of an earlier tool call" for ref in sorted(references - prior)]
            # The registry's messages name the step (an id the model never saw): keep what follows it.
            found += [problem.split(": ", 1)[-1] for problem in self.tools.argument_problems(step)]
            problems.append(found)
            steps.append(step)
        return steps, problems

    @staticmethod
    def _repair_note(problems: list[str]) -> str:
        if problems:
            return "Not run: " + "; ".join(problems) + ". Correct this call and make it again."
        return "Not run, because another call of this answer was invalid. Call it again if you still need it."
