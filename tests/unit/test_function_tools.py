"""Tools made of typed functions: the arguments model from the type hints, the description from the
docstring, the key from the function's name, the context injected and kept out of the schema, sync
functions run off the event loop, and functions that cannot be tools refused with their name."""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any, Literal

import pydantic
import pytest
from pydantic import Field

from activities import Tool, ToolContext, ToolRegistry, tool
from activities.function_tools import FunctionToolError, docstring_parts
from workflows.models import PlanStep

CTX = ToolContext(request_id="r-1", step_id="quote-1", idempotency_key="k-1", attempt=1)


@tool
async def quote(
    symbol: Annotated[str, Field(pattern=r"^[A-Z]{1,5}$")],
    currency: Literal["USD", "EUR"] = "USD",
    ctx: ToolContext | None = None,
) -> dict:
    """Current price of a stock.

    Prices are delayed by 15 minutes.

    Args:
        symbol: The ticker,
            in upper case.
        currency: The currency of the price.
    """
    assert ctx is not None
    return {"symbol": symbol, "currency": currency, "request": ctx.request_id}


def test_the_schema_comes_from_the_type_hints_and_the_docstring():
    spec = quote.spec()
    schema: Any = spec.parameters
    assert spec.key == "functions/functions/quote"
    assert spec.description == "Current price of a stock."
    assert (spec.read_only, spec.approval_required, spec.kind) == (False, False, "tool")
    properties = schema["properties"]
    assert set(properties) == {"symbol", "currency"}  # the context is no argument
    assert properties["symbol"]["pattern"] == "^[A-Z]{1,5}$"
    assert properties["symbol"]["description"] == "The ticker, in upper case."
    assert properties["currency"] == {
        "default": "USD",
        "description": "The currency of the price.",
        "enum": ["USD", "EUR"],
        "title": "Currency",
        "type": "string",
    }
    assert schema["required"] == ["symbol"]
    assert schema["additionalProperties"] is False


def test_the_decorator_names_the_tool_and_sets_its_flags_and_a_description_of_the_hints_wins():
    @tool(name="place", agent="desk", namespace="trading", approval_required=True)
    def place_order(
        symbol: str, quantity: Annotated[int, Field(gt=0, le=1000, description="Shares, at most 1000")]
    ) -> dict:
        """Place an order.

        Parameters
        ----------
        symbol : str
            The ticker.
        quantity : int
            Shares.
        """
        return {"symbol": symbol, "quantity": quantity}

    spec = place_order.spec()
    schema: Any = spec.parameters
    assert spec.key == "trading/desk/place" and spec.approval_required and not spec.read_only
    assert spec.description == "Place an order."
    assert schema["properties"]["symbol"]["description"] == "The ticker."
    assert schema["properties"]["quantity"]["description"] == "Shares, at most 1000"
    assert place_order("ACME", 3) == {"symbol": "ACME", "quantity": 3}  # still callable as the function

    def double(n: int) -> int:
        """Twice n."""
        return 2 * n

    assert Tool.from_function(double, name="twice", read_only=True).spec().key == "functions/functions/twice"


async def test_a_call_is_validated_before_the_function_runs_and_the_context_is_injected():
    assert await quote.run(quote.Arguments.model_validate({"symbol": "ACME"}), CTX) == {
        "symbol": "ACME",
        "currency": "USD",
        "request": "r-1",
    }
    for bad in ({"symbol": "acme"}, {"symbol": "ACME", "currency": "GBP"}, {"symbol": "ACME", "extra": 1}, {}):
        with pytest.raises(pydantic.ValidationError):
            quote.Arguments.model_validate(bad)
    step = PlanStep(
        step_id="q-1", namespace="functions", agent="functions", capability="quote", arguments={"symbol": 5}
    )
    [problem] = ToolRegistry([quote]).argument_problems(step)
    assert problem.startswith("step 'q-1': argument symbol: ")


async def test_a_sync_function_runs_in_a_worker_thread():
    loop_thread = threading.get_ident()

    @tool
    def where(label: str) -> dict:
        """Which thread ran the call."""
        return {"label": label, "thread": threading.get_ident()}

    result: Any = await where.run(where.Arguments(label="x"), CTX)
    assert result["label"] == "x" and result["thread"] != loop_thread
    assert asyncio.iscoroutinefunction(where.run)


def test_functions_that_cannot_be_tools_are_refused_with_their_name():
    def untyped(symbol):
        """No hints."""

    def variadic(*symbols: str) -> None:
        """Many."""

    with pytest.raises(FunctionToolError, match="'untyped'.*'symbol' has no type hint"):
        tool(untyped)
    with pytest.raises(FunctionToolError, match="'variadic'.*symbols"):
        tool(variadic)
    with pytest.raises(FunctionToolError, match="name must be non-empty text without '/'"):
        tool(name="a/b")(variadic)
    with pytest.raises(FunctionToolError, match="needs a function"):
        tool("quote")  # type: ignore[call-overload]


def test_a_docstring_without_sections_is_its_first_paragraph():
    assert docstring_parts("Quote a stock\nquickly.\n\nMore.") == ("Quote a stock quickly.", {})
    assert docstring_parts(None) == ("", {})
