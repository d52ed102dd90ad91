"""Tools from typed functions: ``@tool`` (or ``function_tool(fn)``) makes a :class:`~activities.tools.Tool`
of a function, the way agent developers write one.

- Its arguments model is built from the type hints (``Annotated[..., Field(...)]`` constraints and
  defaults honoured; unknown arguments refused), so a call is validated before the function runs and its
  JSON schema is what the model is offered.
- Its description is the docstring's first paragraph; an ``Args:`` section (Google style) or a
  ``Parameters`` section (numpy style) gives each argument its description.
- Its name is the function's: ``namespace/agent/capability`` with ``capability`` the function's name and
  ``namespace`` and ``agent`` defaulting to ``functions``; each may be given to the decorator.
- A parameter annotated :class:`~activities.tools.ToolContext` receives the call's context (request id,
  idempotency key, ...) and is no part of the schema.
- A coroutine function is awaited; a plain function runs in a worker thread, so it never blocks the
  activity's event loop.

The result is a full tool: rule planners call it by its key, the model planner sees its schema, approval
and tool hooks treat it as any other.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, TypedDict, Unpack, overload

import pydantic
from pydantic import BaseModel, Field, JsonValue

from .tools import Tool, ToolContext

DEFAULT_NAMESPACE = "functions"
DEFAULT_AGENT = "functions"
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?|Notes?)\s*:?\s*$")
_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ARG = re.compile(r"^\s*(\w+)\s*(?::\s*.*)?$")


class FunctionToolError(TypeError):
    """A function that cannot be a tool (an untyped or variadic parameter, a bad name), naming it."""


def docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """A docstring's first paragraph, and each argument's description from its ``Args:`` (Google) or
    ``Parameters`` (numpy) section."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line):
            break
        summary.append(line.strip())
    arguments: dict[str, str] = {}
    current: str | None = None
    section: str | None = None
    numpy = False
    base_indent = 0
    for n, line in enumerate(lines):
        heading = _SECTION.match(line)
        if heading:
            section = heading.group(1).lower()
            numpy = n + 1 < len(lines) and bool(_UNDERLINE.match(lines[n + 1]))
            current = None
            continue
        if section not in ("args", "arguments", "parameters", "params") or _UNDERLINE.match(line):
            continue
        if not line.strip():
            current = None if numpy else current
            continue
        indent = len(line) - len(line.lstrip())
        if current is None or indent <= base_indent:
            match = (_NUMPY_ARG if numpy else _GOOGLE_ARG).match(line)
            if match:
                argument: str = match.group(1).lstrip("*")
                current, base_indent = argument, indent
                arguments[argument] = "" if numpy else match.group(2).strip()
                continue
        if current is not None:
            arguments[current] = f"{arguments[current]} {line.strip()}".strip()
    return " ".join(summary), arguments


def _is_context(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return ToolContext in typing.get_args(annotation)
    return annotation is ToolContext


def arguments_model(fn: Callable[..., Any], name: str) -> tuple[type[BaseModel], str | None]:
    """The pydantic model of ``fn``'s arguments (the context parameter left out), and the name of that
    parameter, if it has one.

    Raises:
        FunctionToolError: a parameter without a type hint, or one taking ``*args``/``**kwargs``.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    _, described = docstring_parts(fn.__doc__)
    fields: dict[str, Any] = {}
    context: str | None = None
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise FunctionToolError(f"tool {name!r}: *{parameter.name} cannot be a tool argument: name each one")
        if parameter.name not in hints:
            raise FunctionToolError(f"tool {name!r}: argument {parameter.name!r} has no type hint")
        annotation = hints[parameter.name]
        if _is_context(annotation):
            context = parameter.name
            continue
        default = ... if parameter.default is parameter.empty else parameter.default
        if described.get(parameter.name):
            # First, so a description the hints give (``Annotated[..., Field(description=...)]``) wins.
            docstring = Field(description=described[parameter.name])
            if typing.get_origin(annotation) is Annotated:
                base, *metadata = typing.get_args(annotation)
                annotation = Annotated[base, docstring, *metadata]
            else:
                annotation = Annotated[annotation, docstring]
        fields[parameter.name] = (annotation, default)
    model_name = "".join(part.title() for part in re.split(r"[^A-Za-z0-9]+", name) if part) + "Arguments"
    model = pydantic.create_model(model_name, __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    return model, context


class FunctionTool(Tool):
    """A tool made of a function (see :func:`function_tool`); each function gets its own subclass."""

    function: ClassVar[Callable[..., Any]]
    context_parameter: ClassVar[str | None] = None

    async def run(self, arguments: BaseModel, ctx: ToolContext) -> JsonValue:
        values = {name: getattr(arguments, name) for name in type(arguments).model_fields}
        if self.context_parameter is not None:
            values[self.context_parameter] = ctx
        fn = type(self).function
        if inspect.iscoroutinefunction(fn):
            return await fn(**values)
        return await asyncio.to_thread(functools.partial(fn, **values))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, so a decorated function can still be called (and tested) directly."""
        return type(self).function(*args, **kwargs)


def function_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    agent: str = DEFAULT_AGENT,
    namespace: str = DEFAULT_NAMESPACE,
    description: str | None = None,
    read_only: bool = False,
    approval_required: bool = False,
) -> FunctionTool:
    """The tool made of ``fn`` (see the module's docstring).

    Args:
        fn: The function; every parameter typed, an optional :class:`ToolContext` one among them.
        name: The capability; default: the function's name.
        agent: The middle part of the tool's key.
        namespace: The first part of the tool's key.
        description: What the model reads; default: the docstring's first paragraph.
        read_only: The tool changes nothing (a cache may keep an answer that used it).
        approval_required: Every call waits for a reviewer's approval before it runs.

    Raises:
        FunctionToolError: a parameter the schema cannot take, or no function.
    """
    if not callable(fn):
        raise FunctionToolError(f"@tool needs a function, not {type(fn).__name__}")
    capability = name or getattr(fn, "__name__", "")
    for part, value in (("name", capability), ("agent", agent), ("namespace", namespace)):
        if not value or "/" in value or not value.strip():
            raise FunctionToolError(f"tool {capability!r}: its {part} must be non-empty text without '/'")
    model, context = arguments_model(fn, capability)
    summary, _ = docstring_parts(fn.__doc__)
    attributes: dict[str, Any] = {
        "namespace": namespace,
        "agent": agent,
        "capability": capability,
        "description": description if description is not None else summary,
        "read_only": read_only,
        "approval_required": approval_required,
        "Arguments": model,
        "function": fn,
        "context_parameter": context,
        "__doc__": fn.__doc__,
    }
    cls = type(f"{model.__name__.removesuffix('Arguments')}Tool", (FunctionTool,), attributes)
    return cls()


class ToolOptions(TypedDict, total=False):
    """The options ``@tool(...)`` takes; :func:`function_tool` says what each means and its default."""

    name: str | None
    agent: str
    namespace: str
    description: str | None
    read_only: bool
    approval_required: bool


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(**options: Unpack[ToolOptions]) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, **options: Unpack[ToolOptions]
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool of a typed function: ``@tool`` or ``@tool(agent="desk", read_only=True)``; see
    :func:`function_tool` for the options."""
    if fn is not None:
        return function_tool(fn, **options)
    return lambda f: function_tool(f, **options)
