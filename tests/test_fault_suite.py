"""The fault suite's short mode (``python -m benchmarks.faults --short``) as a test: 8 requests of the demo
pipeline (more while a planned kill point is still missing) on its own dev server and two worker subprocesses, with workers SIGKILLed in a tool step, in the
detached audit write, at a checkpoint and in two random hook stages, and the server restarted mid-flight.
Every request ends as a user expects, no side effect is duplicated, and every kill recovers within the
bound."""

from __future__ import annotations

import pytest

from benchmarks.fault_pipeline import DETACHED_EFFECT, TOOL_STEP
from benchmarks.faults import CHECKPOINT_WAIT, RECOVERY_TARGET_SECONDS, SERVER_RESTART, report, run_suite

COVERAGE = "every planned kill point killed"


@pytest.mark.timeout(420)
async def test_requests_survive_killed_workers_and_a_server_restart():
    # Which points get a kill depends on timing (a kill needs a request at the point at the right
    # moment). A run that lost, duplicated, mis-answered or stranded nothing but missed a planned point
    # proves less than asked, not something wrong: run again with another seed, at most twice more.
    for _ in range(3):
        figures = await run_suite(short=True)
        if figures["targets"][COVERAGE] or not all(met for name, met in figures["targets"].items() if name != COVERAGE):
            break
    table = report(figures)  # every assertion shows the whole table: which point, which request

    totals = figures["totals"]
    assert totals["requests"] == totals["finished"] >= 8, table
    assert {name: totals[name] for name in ("lost", "duplicated", "wrong", "stuck")} == {
        "lost": 0,
        "duplicated": 0,
        "wrong": 0,
        "stuck": 0,
    }, table
    killed = {point: f for point, f in figures["per_point"].items() if f["kills"]}
    assert {TOOL_STEP, DETACHED_EFFECT, CHECKPOINT_WAIT, SERVER_RESTART} <= set(killed), table
    for point, f in killed.items():
        assert f["unrecovered"] == 0 and f["max"] <= RECOVERY_TARGET_SECONDS, f"{point}: {f}\n{table}"
    assert not figures["unexpected_worker_exits"], table
    assert figures["targets_met"], table
