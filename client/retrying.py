"""Waiting out a Temporal server that cannot be reached for a moment (restarting, or started after the
process that needs it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    *,
    transient: Callable[[BaseException], bool],
    within: float,
    waiting: str,
) -> T:
    """``attempt()``, made again after a ``transient`` failure — with a pause growing from 0.2 s to 5 s,
    each logged as ``waiting`` — for up to ``within`` seconds; any other failure, or the last one, is
    raised."""
    deadline = time.monotonic() + within
    pause = 0.2
    while True:
        try:
            return await attempt()
        except Exception as err:
            if not transient(err) or time.monotonic() + pause > deadline:
                raise
            logger.warning("%s (%s); retrying", waiting, err)
        await asyncio.sleep(pause)
        pause = min(pause * 2, 5.0)
