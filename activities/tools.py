"""Tools: what a plan step calls. Each tool declares its identity and a pydantic model of its arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pydantic
from pydantic import BaseModel, JsonValue

from workflows.models import PlanStep, ToolSpec
from workflows.plan_validation import referencing_fields


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call. ``idempotency_key`` is the same on every retry of a step: a tool
    with side effects must use it so a retried activity never does the work twice."""

    request_id: str
    step_id: str
    idempotency_key: str
    attempt: int
    # The application's context for the request (its metadata, as the caller passed it; never in a prompt)
    # and the conversation it belongs to (None outside one).
    context: Mapping[str, JsonValue] = field(default_factory=dict)
    conversation_id: str | None = None


class Tool:
    """Base class for tools. Subclasses set the identity, ``Arguments`` and implement ``run``."""

    namespace: ClassVar[str]
    agent: ClassVar[str]
    capability: ClassVar[str]
    description: ClassVar[str] = ""
    read_only: ClassVar[bool] = False
    approval_required: ClassVar[bool] = False
    kind: ClassVar[Literal["tool", "subagent"]] = "tool"
    Arguments: ClassVar[type[BaseModel]]

    async def run(self, arguments: BaseModel, ctx: ToolContext) -> JsonValue:
        raise NotImplementedError

    @staticmethod
    def from_function(fn: Callable[..., Any], **options: Any) -> Tool:
        """The tool made of a typed function (arguments from its type hints, description from its
        docstring): :func:`activities.function_tools.function_tool`, which lists the options."""
        from .function_tools import function_tool

        return function_tool(fn, **options)

    @classmethod
    def spec(cls) -> ToolSpec:
        return ToolSpec(
            namespace=cls.namespace,
            agent=cls.agent,
            capability=cls.capability,
            description=cls.description,
            parameters=cls.Arguments.model_json_schema(),
            read_only=cls.read_only,
            approval_required=cls.approval_required,
            kind=cls.kind,
        )


class SubAgentArguments(BaseModel):
    """What a sub-agent step passes to its child request: the task, as the child's ask."""

    model_config = pydantic.ConfigDict(extra="forbid")
    request: str = pydantic.Field(min_length=1, max_length=8_000)


class SubAgentTool(Tool):
    """A tool whose steps run a sub-agent: the workflow starts a child ``RequestLifecycle`` with
    ``arguments.request`` as its ask, one level deeper (at most ``MAX_SUBAGENT_DEPTH``), and the child's
    answer becomes the step's result. Subclasses set the identity; ``run`` is never called."""

    kind: ClassVar[Literal["tool", "subagent"]] = "subagent"
    Arguments: ClassVar[type[BaseModel]] = SubAgentArguments

    async def run(self, arguments: BaseModel, ctx: ToolContext) -> JsonValue:
        raise RuntimeError("a sub-agent step runs as a child workflow, not as a tool activity")


class ToolRegistry:
    """The tools a worker can run, keyed by ``namespace/agent/capability``."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        self.add(tools)

    def add(self, tools: Iterable[Tool]) -> None:
        """Register more tools (before the worker serves requests: everything holding this registry sees them)."""
        for tool in tools:
            key = tool.spec().key
            if key in self._tools:
                raise ValueError(f"tool {key} is registered twice")
            self._tools[key] = tool

    def get(self, key: str) -> Tool | None:
        return self._tools.get(key)

    def specs(self) -> list[ToolSpec]:
        return [tool.spec() for tool in self._tools.values()]

    async def aclose(self) -> None:
        """Release what the tools hold open (a tool with an ``aclose`` method, such as an MCP server's
        connection); the worker calls this when it stops."""
        for tool in self._tools.values():
            close = getattr(tool, "aclose", None)
            if close is not None:
                await close()

    def argument_problems(self, step: PlanStep, *, resolved: bool = False) -> list[str]:
        """Why ``step.arguments`` do not fit its tool's parameters (empty when they do or the tool is
        unknown, which structural validation reports). An argument holding a step reference is checked
        only for presence here; its value is validated when the step runs, once resolved (``resolved``
        arguments are checked in full)."""
        tool = self._tools.get(step.tool_key)
        if tool is None:
            return []
        deferred = set() if resolved else referencing_fields(step)
        try:
            tool.Arguments.model_validate(step.arguments)
        except pydantic.ValidationError as err:
            return [
                f"step {step.step_id!r}: argument {'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in err.errors(include_url=False)
                if not (e["loc"] and e["loc"][0] in deferred and e["type"] != "missing")
            ]
        return []
