"""Holds under load: no request holds a worker slot for its whole life.

The short mode of ``benchmarks.load``: one ``worker.py`` with the demo pipeline as the quick start runs it
(shared memory with managed activity leases), sized down to 4 activity and 4 local-activity slots, a dev
server of its own with the poll limit raised, and ten times as many requests in flight as the worker has
slots — quotes with the cache bypassed, refused trades, and messages a reviewer loop approves through the
``review`` update while they wait. The coordination signals are renewed every second, so the messages
waiting for review renew theirs all along. Under a keeper that held a slot for a request's life, four
such requests filled the worker and nothing closed again. These tests fail on a deadlock (requests that
stop closing), a lost or duplicated message, or a wrong outcome — never on timing.
"""

from __future__ import annotations

import pytest

from benchmarks.load import Figures, run_scenario

TINY_WORKER = {
    "AGENT_WORKER_MAX_ACTIVITIES": "4",
    "AGENT_WORKER_MAX_LOCAL_ACTIVITIES": "4",
    "AGENT_MEMORY_ACTIVITY_TTL_SECONDS": "3",
}


def assert_drained(figures: Figures, total: int) -> None:
    assert not figures.deadlocked, f"requests stopped closing with {figures.running} running"
    assert figures.failures == [], figures.failures
    assert (figures.closed, figures.failed, figures.running) == (total, 0, 0)
    assert figures.reviews == total // 4  # every message's checkpoint was approved, once
    assert figures.duplicate_deliveries == 0 and figures.lost_deliveries == 0


@pytest.mark.timeout(300)
async def test_ten_times_more_requests_in_flight_than_slots_all_complete():
    figures = await run_scenario(in_flight=40, total=60, worker_env=TINY_WORKER, stall_seconds=90)
    assert_drained(figures, 60)


@pytest.mark.timeout(300)
async def test_a_worker_killed_under_load_is_replaced_and_its_requests_drain_once():
    figures = await run_scenario(in_flight=30, total=40, kill=True, worker_env=TINY_WORKER, stall_seconds=90)
    assert figures.killed_worker
    assert_drained(figures, 40)


@pytest.mark.timeout(300)
async def test_the_load_drains_on_postgresql_too(postgres_url):
    figures = await run_scenario(
        in_flight=40, total=48, backend="postgres", database_url=postgres_url, worker_env=TINY_WORKER, stall_seconds=90
    )
    assert_drained(figures, 48)
