"""A hook call that whoever waits for it gives up on — a lease renewal's ``asyncio.wait_for``, a policy
replay's timeout — is stopped, not left running in its thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from activities.hook_stages import call_hook


async def test_a_plain_hook_method_given_up_on_stops_at_its_next_python_step():
    lock = threading.Lock()
    steps: list[float] = []
    ended = threading.Event()

    def renew_lease(ctx) -> str:
        try:
            for _ in range(300):
                time.sleep(0.01)
                with lock:
                    steps.append(time.monotonic())
            return "renewed"
        finally:
            ended.set()

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call_hook(renew_lease, None), timeout=0.2)
    gave_up = time.monotonic()
    assert await asyncio.to_thread(ended.wait, 10), "the method never ended"
    with lock:
        assert steps and all(step <= gave_up for step in steps), "the method ran on after its caller gave up"
