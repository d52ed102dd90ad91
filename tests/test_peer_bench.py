"""The benchmark against the OpenAI Agents SDK on Temporal (``benchmarks.peer``), in its short mode.

Behaviour only, never timing: both systems answer the scripted request with the model's text written from
all three quotes, every hook of each ran, each made the model calls its history and record say, the
table prints with every cell filled, the timelines show what each request scheduled, and no process
tried to reach beyond 127.0.0.1. The peer's packages are in the ``dev`` extra (through ``bench``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.peer import QUOTE_CAPABILITY, SYMBOLS
from benchmarks.peer.bench import SYSTEMS, Options, run, table_rows
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


@pytest.mark.timeout(300)
async def test_the_short_benchmark_answers_correctly_on_both_sides_and_fills_the_table():
    printed: list[str] = []
    figures = await run(Options.short(), out=printed.append)

    checks = figures["checks"]
    assert checks["lifecycle_1"]["model_calls"] == 2 == checks["peer"]["model_calls"]
    assert checks["lifecycle_3"]["model_calls"] == 2  # the text answer of its second turn is the draft
    assert checks["peer"]["hook_invocations"] == {
        "screen-request": 1,
        "tag-request": 1,
        "on_llm_end": 2,
        "on_tool_end": 3,
        "check-answer": 1,
        "tag-answer": 1,
    }
    assert all(n >= 1 for n in checks["lifecycle_1"]["hook_invocations"].values())
    for block in figures["latencies"]:
        for system in SYSTEMS:
            calls = block["systems"][system]["model_calls"]
            assert calls["blind_answers"] == 0
            assert calls["tool_turns"] == calls["requests"]  # one tool-calls turn per request
            assert calls["calls"] == checks[system]["model_calls"] * calls["requests"]
    assert figures["outbound_connection_attempts"] == []

    rows = table_rows(figures)
    assert [row[1] for row in rows] == [
        "p50 sequential",
        "throughput at 4 concurrent",
        "CPU per request, server + worker",
        "of which the dev server",
        "of which the worker",
    ] * 2 + ["model calls per request", "history per request"]
    assert all(len(row) == 2 + len(SYSTEMS) and all(cell.strip() for cell in row) for row in rows)
    assert not any("nan" in cell for row in rows for cell in row)
    table = next(text for text in printed if text.startswith("| model latency"))
    assert len(table.splitlines()) == 2 + len(rows) + 2

    timelines = figures["timelines"]
    assert timelines["peer"].count("ACTIVITY_TASK_SCHEDULED invoke_model_activity") == 2
    assert timelines["peer"].count("ACTIVITY_TASK_SCHEDULED stock_quote") == 3
    for system in ("lifecycle_1", "lifecycle_3"):
        assert timelines[system].count("ACTIVITY_TASK_SCHEDULED execute_tool_step") == 3
        # the two before_planning hooks run in one local activity whose type names both
        assert (
            "MARKER local activity before_planning:noop-before-planning-1 + noop-before-planning-2" in timelines[system]
        )
    # Four workflow tasks, or five when a quote's result arrives while the one after the first runs.
    peer_kinds = figures["history"]["peer"]["by_kind"]
    assert peer_kinds in (
        {"execution": 2, "workflow task": 12, "activity": 15},
        {"execution": 2, "workflow task": 15, "activity": 15},
    ), peer_kinds
