"""The default planning prompt, for a planner that reads the tools from it and for one that offers them to
its model as functions."""

from __future__ import annotations

from activities.planning import PromptInput, build_planning_prompt
from workflows.models import ENRICHMENT_RAG_CONTEXT, ToolSpec

QUOTE = ToolSpec(
    namespace="demo-tools",
    agent="stock-service",
    capability="stock_quote",
    description="Current price of a stock",
    parameters={"properties": {"symbol": {"type": "string"}}},
)


def prompt(phase: int = 1, **options) -> str:
    return build_planning_prompt(
        PromptInput(
            request="Price of ACME?",
            enrichments={ENRICHMENT_RAG_CONTEXT: "ACME reports on Friday."},
            tools=[QUOTE],
            phase=phase,
            instructions="Quote in USD.",
            facts={"desk": "eu"},
            context_text="Prefer the primary listing.",
            **options,
        )
    )


def test_a_planner_that_reads_the_tools_from_the_prompt_gets_them_listed_with_the_answer_format():
    text = prompt(phase=2)
    assert text.startswith("You are the planner of an agent.")
    assert '- demo-tools/stock-service/stock_quote: Current price of a stock parameters={"symbol": ' in text
    assert "User request (planning phase 2):\nPrice of ACME?" in text
    assert text.endswith("depends_on may name only earlier steps.")
    assert "<agent_memory>\nACME reports on Friday.\n</agent_memory>" in text


def test_a_planner_that_offers_the_tools_as_functions_gets_the_request_in_its_context_alone():
    text = prompt(tools_as_functions=True)
    assert text == (
        "<instructions>\nQuote in USD.\n</instructions>\n\n"
        "<facts>\ndesk: eu\n</facts>\n\n"
        "<agent_memory>\nACME reports on Friday.\n</agent_memory>\n\n"
        "<planning_context>\nPrefer the primary listing.\n</planning_context>\n\n"
        "User request:\nPrice of ACME?"
    )
    # The same in every phase: the conversation's prefix does not change from one phase to the next.
    assert prompt(phase=3, tools_as_functions=True) == text


def test_without_context_the_message_is_the_labelled_request_alone():
    text = build_planning_prompt(PromptInput(request="Hello", enrichments={}, tools=[QUOTE], tools_as_functions=True))
    assert text == "User request:\nHello"
