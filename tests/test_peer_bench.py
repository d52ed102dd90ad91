"""The benchmark against the OpenAI Agents SDK and pydantic-ai on Temporal (``benchmarks.peer``), in its
short mode, and the hooks each system runs in it.

Behaviour only, never timing: each system's hooks refuse a tool not on the allow-list and mask an account
number when they meet one (so the work the benchmark measures is real); every system answers the scripted
request with the model's text written from all three quotes, every hook of each ran (the lifecycle's
record, the peers' counters), each made the model calls its history and record say, the history figures
are what each request's history holds, the table prints with every cell filled, and no process tried to
reach beyond 127.0.0.1. The peers' packages are in the ``dev`` extra (through ``bench``).
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import subprocess
import sys
from collections import Counter
from typing import Any, cast

import pytest

from benchmarks.peer import (
    HOOKS,
    LIFECYCLE,
    LIFECYCLES,
    OPENAI_AGENTS,
    PYDANTIC_AI,
    QUOTE_CAPABILITY,
    SYMBOLS,
    SYSTEMS,
    policy,
)
from benchmarks.peer.bench import Options, combined, rotations, run, run_ratio_rows, table_rows
from benchmarks.peer.loopback import MARK, is_loopback
from benchmarks.peer.model_server import ScriptedModel, expected_answer
from demo.tools import quote_price


def quote_tools(name: str = f"demo-tools__stock-service__{QUOTE_CAPABILITY}") -> list[dict]:
    return [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]


def test_the_model_calls_the_quote_three_times_then_answers_from_the_results():
    model = ScriptedModel()
    status, first = model.reply({"model": "m", "messages": [{"role": "user", "content": "?"}], "tools": quote_tools()})
    assert status == 200 and first["choices"][0]["finish_reason"] == "tool_calls"
    calls = first["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"])["symbol"] for c in calls] == list(SYMBOLS)
    assert {c["function"]["name"] for c in calls} == {f"demo-tools__stock-service__{QUOTE_CAPABILITY}"}

    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": str(quote_price(s))}
        for c, s in zip(calls, SYMBOLS, strict=True)
    ]
    status, answer = model.reply(
        {"model": "m", "messages": [{"role": "user", "content": "?"}, *results], "tools": quote_tools()}
    )
    assert answer["choices"][0]["message"]["content"] == expected_answer()
    # A separate synthesis call (no tools offered) answers the same from the results in its prompt.
    prompt = "results: " + ", ".join(str(quote_price(s)) for s in SYMBOLS)
    _, synthesized = model.reply({"model": "m", "messages": [{"role": "user", "content": prompt}]})
    assert synthesized["choices"][0]["message"]["content"] == expected_answer()
    assert model.stats()["models"]["m"] == {"calls": 3, "tool_turns": 1, "answer_turns": 2}


def test_an_answer_without_the_quotes_is_counted_blind():
    model = ScriptedModel()
    _, answer = model.reply(
        {"model": "m", "messages": [{"role": "tool", "content": "nothing"}], "tools": quote_tools()}
    )
    assert answer["choices"][0]["message"]["content"] != expected_answer()
    status, _ = model.reply({"model": "m", "messages": [], "stream": True})
    assert status == 400
    assert model.stats()["models"]["m"]["blind_answers"] == 1
    assert model.stats()["models"]["m"]["bad_requests"] == 1


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_the_orders_put_each_system_in_each_place_and_after_each_other_equally_often(count):
    systems = "ABCDE"[:count]
    cycle = count if count % 2 == 0 else 2 * count
    orders = rotations(systems, 2 * cycle)
    assert orders[cycle:] == orders[:cycle]  # the cycle repeats
    assert all(sorted(order) == list(systems) for order in orders)
    places = Counter((system, place) for order in orders[:cycle] for place, system in enumerate(order))
    follows = Counter((a, b) for order in orders[:cycle] for a, b in itertools.pairwise(order))
    assert len(places) == count * count and len(set(places.values())) == 1
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1
    assert ["".join(order) for order in rotations("ABCD", 4)] == ["ABDC", "BCAD", "CDBA", "DACB"]


def test_only_loopback_addresses_pass_the_guard():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", None, b"127.0.0.1"))
    assert not any(is_loopback(h) for h in ("api.openai.com", "10.0.0.1", "192.168.1.1", "8.8.8.8", "0.0.0.0"))
    # In a process of its own (the hook cannot be removed): refused before any lookup or packet.
    probe = (
        "import socket\nfrom benchmarks.peer.loopback import guard\nguard()\n"
        "try:\n    socket.getaddrinfo('api.openai.com', 443)\nexcept ConnectionRefusedError:\n    print('refused')\n"
        "s = socket.socket()\ntry:\n    s.connect(('203.0.113.9', 443))\nexcept ConnectionRefusedError:\n    print('refused')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["refused", "refused"], done.stderr
    assert done.stderr.count(MARK) == 2


ACCOUNT = "ACCT-12345678"


def test_the_policy_refuses_other_tools_and_masks_account_numbers():
    assert policy.tool_allowed(QUOTE_CAPABILITY)
    assert policy.tool_allowed(f"demo-tools__stock-service__{QUOTE_CAPABILITY}")
    assert policy.tool_allowed(f"stock-service/{QUOTE_CAPABILITY}")
    for hostile in (
        "execute_trade",
        f"{QUOTE_CAPABILITY}_v2",
        f"x{QUOTE_CAPABILITY}",
        "",
        "stock_quote/../execute_trade",
    ):
        assert not policy.tool_allowed(hostile), hostile
    assert policy.refused_tools([QUOTE_CAPABILITY, "execute_trade"]) == ["execute_trade"]
    assert policy.redact(f"paid from {ACCOUNT}.") == f"paid from {policy.MASK}."
    assert policy.redact("ACCT-12 and ACCT-1234567890123 stay") == "ACCT-12 and ACCT-1234567890123 stay"
    untouched = {"symbol": "AAA", "price": 1.5}
    assert policy.redact_value(untouched) is untouched
    assert policy.redact_value({"symbol": "AAA", "note": ACCOUNT}) == {"symbol": "AAA", "note": policy.MASK}
    assert (
        policy.context_note("What is the price of AAA BBB CCC?") == "Symbols asked about: AAA, BBB, CCC. Prices in USD."
    )
    assert policy.audit("r1", "completed", "Prices.") in policy.AUDIT_LINES


async def test_the_lifecycle_hooks_refuse_other_tools_and_mask_what_they_meet():
    from benchmarks.peer.lifecycle_hooks import AnswerRedactor, PlanGuard, ResultRedactor, ToolAllowList
    from hooks import HookRejection
    from workflows.models import Plan, PlanStep, ToolCall, ToolOutcomeView

    trade = ToolCall(step_id="s1", namespace="demo-tools", agent="broker", capability="execute_trade")
    quote = ToolCall(step_id="s2", namespace="demo-tools", agent="stock-service", capability=QUOTE_CAPABILITY)
    ctx: Any = None  # the hooks read nothing from it
    denied = await ToolAllowList().before_tool(ctx, trade)
    assert denied is not None and denied.action == "deny"
    assert await ToolAllowList().before_tool(ctx, quote) is None
    plan = Plan(steps=[PlanStep(step_id="s1", namespace="demo-tools", agent="broker", capability="execute_trade")])
    with pytest.raises(HookRejection, match="execute_trade"):
        await PlanGuard().after_planning(ctx, plan)
    outcome = ToolOutcomeView(status="executed", result=f"debited {ACCOUNT}")
    assert await ResultRedactor().after_tool(ctx, quote, outcome) == f"debited {policy.MASK}"
    assert await ResultRedactor().after_tool(ctx, quote, ToolOutcomeView(status="executed", result="12.5")) is None
    assert await AnswerRedactor().after_synthesis(ctx, f"from {ACCOUNT}") == f"from {policy.MASK}"


async def test_the_openai_agents_hooks_refuse_other_tools_and_mask_what_they_meet():
    from agents import Agent, ModelResponse, RunContextWrapper, ToolInputGuardrailData, ToolOutputGuardrailData, Usage
    from agents.tool_context import ToolContext
    from openai.types.responses import ResponseFunctionToolCall
    from temporalio.exceptions import ApplicationError

    from benchmarks.peer.agents_peer import PolicyRunHooks, _answer_redactor, _quote_tool

    counts: Counter[str] = Counter()
    tool = _quote_tool(counts)
    agent = Agent(name="probe")

    def context(name: str) -> ToolContext:
        return ToolContext(context=None, tool_name=name, tool_call_id="c1", tool_arguments="{}")

    refused = await tool.tool_input_guardrails[0].run(
        ToolInputGuardrailData(context=context("execute_trade"), agent=agent)
    )
    assert refused.behavior["type"] == "reject_content"
    allowed = await tool.tool_input_guardrails[0].run(
        ToolInputGuardrailData(context=context(QUOTE_CAPABILITY), agent=agent)
    )
    assert allowed.behavior["type"] == "allow"
    data = ToolOutputGuardrailData(context=context(QUOTE_CAPABILITY), agent=agent, output=f"debited {ACCOUNT}")
    masked = await tool.tool_output_guardrails[0].run(data)
    assert masked.behavior == {"type": "reject_content", "message": f"debited {policy.MASK}"}
    answer = await _answer_redactor(counts).run(RunContextWrapper(context=None), agent, f"from {ACCOUNT}")
    assert answer.output.tripwire_triggered
    call = ResponseFunctionToolCall(arguments="{}", call_id="c1", name="execute_trade", type="function_call")
    with pytest.raises(ApplicationError, match="execute_trade"):
        await PolicyRunHooks(counts).on_llm_end(
            RunContextWrapper(context=None), agent, ModelResponse(output=[call], usage=Usage(), response_id=None)
        )
    assert counts == {"tool-allow-list": 2, "result-redactor": 1, "answer-redactor": 1, "plan-guard": 1}


async def test_the_pydantic_ai_hooks_refuse_other_tools_and_mask_what_they_meet():
    from pydantic_ai import ToolDefinition
    from pydantic_ai.exceptions import SkipToolExecution
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from temporalio.exceptions import ApplicationError

    from benchmarks.peer.pydantic_agent import HOOK_COUNTS, plan_guard, result_redactor, tool_allow_list

    counts: Counter[str] = Counter()
    HOOK_COUNTS.set(counts)
    ctx: Any = None  # the hooks read nothing from it
    trade = ToolCallPart(tool_name="execute_trade", args={})
    quote = ToolCallPart(tool_name=QUOTE_CAPABILITY, args={"symbol": "AAA"})
    with pytest.raises(SkipToolExecution) as skipped:
        await tool_allow_list(ctx, call=trade, tool_def=ToolDefinition(name="execute_trade"), args={})
    assert "execute_trade" in skipped.value.result
    args = {"symbol": "AAA"}
    assert await tool_allow_list(ctx, call=quote, tool_def=ToolDefinition(name=QUOTE_CAPABILITY), args=args) is args
    masked = await result_redactor(
        ctx, call=quote, tool_def=ToolDefinition(name=QUOTE_CAPABILITY), args=args, result={"note": ACCOUNT}
    )
    assert masked == {"note": policy.MASK}
    with pytest.raises(ApplicationError, match="execute_trade"):
        await plan_guard(ctx, request_context=cast(Any, None), response=ModelResponse(parts=[trade]))
    assert counts == {"tool-allow-list": 2, "result-redactor": 1, "plan-guard": 1}


def event_lines(timeline: str) -> list[str]:
    """The timeline's one line per event (offset, gap, event id, what it is)."""
    return [line for line in timeline.splitlines() if re.match(r"^\s+-?\d+\.\d\s+[+-]\d+\.\d\s+\d+\s", line)]


@pytest.mark.timeout(300)
async def test_the_short_benchmark_answers_correctly_on_every_system_and_fills_the_table():
    printed: list[str] = []
    figures = await run(Options.short(), out=printed.append)

    checks = figures["checks"]
    assert {system: checks[system]["model_calls"] for system in SYSTEMS} == dict.fromkeys(SYSTEMS, 2)
    # Every hook ran in every system: once per request, per planning turn or per tool call.
    for system in SYSTEMS:
        hooks = checks[system]["hook_invocations"]
        assert {hook: hooks.get(hook) for hook in HOOKS if hook != "request-context"} == {
            "plan-guard": 2,
            "tool-allow-list": 3,
            "result-redactor": 3,
            "answer-redactor": 1,
            "audit": 1,
        }, system
        # before planning in the lifecycle; for each model request in the peers' instructions
        assert hooks["request-context"] == (1 if system in LIFECYCLES else 2), system
    for block in figures["latencies"]:
        for system in SYSTEMS:
            calls = block["systems"][system]["model_calls"]
            assert calls["blind_answers"] == 0
            assert calls["tool_turns"] == calls["requests"]  # one tool-calls turn per request
            assert calls["calls"] == checks[system]["model_calls"] * calls["requests"]
    assert figures["outbound_connection_attempts"] == []

    # The history figures are what each request's history holds, event by event.
    history, timelines = figures["history"], figures["timelines"]
    for system in SYSTEMS:
        h = history[system]
        lines = event_lines(timelines[system])
        assert len(lines) == h["events"] == sum(h["by_kind"].values()), system
        assert sum(" MARKER " in line for line in lines) == h["markers"], system
        assert h["markers"] == h["by_kind"].get("local-activity marker", 0) + h["by_kind"].get("patch marker", 0)
        assert f"{h['events']} events" in timelines[system].splitlines()[0]
        assert h["by_kind"]["activity"] == 3 * len(h["activities"])  # scheduled, started, completed
    for system in LIFECYCLES:
        assert sorted(history[system]["activities"]) == ["execute_tool_step"] * 3 + ["plan"] * 2
    # One baseline: a request records no patch marker, however it is started.
    for system in LIFECYCLES:
        assert "patch marker" not in history[system]["by_kind"]
        assert "MARKER patch" not in timelines[system]
    assert sorted(history[OPENAI_AGENTS]["activities"]) == ["invoke_model_activity"] * 2 + ["stock_quote"] * 3
    assert history[OPENAI_AGENTS]["markers"] == 0
    pydantic_activities = history[PYDANTIC_AI]["activities"]
    assert sum(name.endswith("__model_request") for name in pydantic_activities) == 2
    assert sum(name.endswith("__call_tool") for name in pydantic_activities) == 3
    assert len(pydantic_activities) == 5

    rows = table_rows(figures)
    assert [row[1] for row in rows] == [
        "p50 sequential",
        "p95 sequential",
        "throughput at 4 concurrent",
        "CPU per request, server + worker",
        "of which the dev server",
        "of which the worker",
    ] * 2 + ["model calls per request", "history per request"]
    assert all(len(row) == 2 + len(SYSTEMS) and all(cell.strip() for cell in row) for row in rows)
    assert not any("nan" in cell for row in rows for cell in row)
    # The lifecycle's cells carry a ratio to each peer; the peers' cells none.
    lifecycle_cell, plain_cell, agents_cell, pydantic_cell = rows[0][2:]
    for cell in (lifecycle_cell, plain_cell):
        assert re.search(r"\(\d+\.\d\d× / \d+\.\d\d×\)", cell), cell
    assert "×" not in agents_cell and "×" not in pydantic_cell
    # The history row is the median over the sampled requests, the timeline's request among them.
    for system in SYSTEMS:
        over = history[system]["over_requests"]
        assert len(over["events"]["each"]) == figures["options"]["histories"]
        assert over["events"]["each"][0] == history[system]["events"]
        assert over["events"]["min"] <= over["events"]["median"] <= over["events"]["max"]
    events = history[LIFECYCLE]["over_requests"]["events"]
    assert rows[-1][2].startswith(f"{events['median']:g} events [{events['min']:g} – {events['max']:g}] (")
    table = next(text for text in printed if text.startswith("| model latency"))
    assert len(table.splitlines()) == 2 + len(rows) + 2

    # Several runs' outputs combine into one table: every run and burst pooled, the medians over them all.
    output = json.loads(json.dumps(figures))
    twice = combined([output, output])
    for block, pooled in zip(figures["latencies"], twice["latencies"], strict=True):
        for system in SYSTEMS:
            one, both = block["systems"][system], pooled["systems"][system]
            assert len(both["runs"]) == 2 * len(one["runs"]) and len(both["bursts"]) == 2 * len(one["bursts"])
            for key in ("p50_ms", "rps", "cpu_ms_per_request"):
                assert (both[key]["median"], both[key]["min"], both[key]["max"]) == (
                    one[key]["median"],
                    one[key]["min"],
                    one[key]["max"],
                )
            assert both["model_calls"]["per_request"] == one["model_calls"]["per_request"]
    assert [row[1:] for row in table_rows(twice)] == [row[1:] for row in rows]
    # Each run on its own: its lifecycles' medians against its peers'.
    each = run_ratio_rows([output, output])
    assert [row[:2] for row in each] == [
        [str(n), f"{block['model_latency_ms']:g} ms"] for n in (1, 2) for block in output["latencies"]
    ]
    pair = r"\d+\.\d\d× / \d+\.\d\d×"
    assert all(re.fullmatch(f"{pair}; {pair}", cell) for row in each for cell in row[2:]), each
    first = output["latencies"][0]["systems"]
    rps = {system: first[system]["rps"]["median"] for system in SYSTEMS}
    assert each[0][3].startswith(
        f"{rps[LIFECYCLE] / rps[OPENAI_AGENTS]:.2f}× / {rps[LIFECYCLE] / rps[PYDANTIC_AI]:.2f}×; "
    )
    # A second output with other figures: the medians are the pooled samples', the model calls summed.
    slower = json.loads(json.dumps(figures))
    for block in slower["latencies"]:
        for figures_of in block["systems"].values():
            for burst in figures_of["bursts"]:
                burst["cpu_ms_per_request"] += 100
    pooled = combined([output, slower])
    for index, block in enumerate(pooled["latencies"]):
        for system in SYSTEMS:
            samples = [
                b["cpu_ms_per_request"]
                for source in (output, slower)
                for b in source["latencies"][index]["systems"][system]["bursts"]
            ]
            cpu = block["systems"][system]["cpu_ms_per_request"]
            assert (cpu["median"], cpu["min"], cpu["max"]) == (
                round(statistics.median(samples), 2),
                min(samples),
                max(samples),
            )
            calls = output["latencies"][index]["systems"][system]["model_calls"]
            assert block["systems"][system]["model_calls"]["calls"] == 2 * calls["calls"]
    other = json.loads(json.dumps(figures))
    other["options"]["concurrency"] += 1
    with pytest.raises(ValueError, match="different model latencies or concurrency"):
        combined([output, other])
