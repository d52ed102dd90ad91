"""Committed histories replay against today's workflow code: a refactor that changes the commands a
recorded execution issued is caught here, before it breaks executions in flight."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from client import Settings, process_data_converter
from client.encryption import new_key_line
from workflows import WORKFLOWS, data_converter

# The converter of a deployment that encrypts: histories written before still replay.
ENCRYPTING = process_data_converter(Settings(payload_store="off", protection={"keys": new_key_line("k1")}))
HISTORIES = sorted(Path(__file__).with_name("histories").glob("*.json"))


def test_histories_are_committed():
    assert len(HISTORIES) >= 5


@pytest.mark.parametrize("converter", [data_converter, ENCRYPTING], ids=["plain", "encrypting"])
@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_committed_history_replays(path: Path, converter):
    # The workflow id matters on replay (child workflow ids derive from it): record_histories uses this one.
    history = WorkflowHistory.from_json(f"history-{path.stem}", path.read_text())
    replayer = Replayer(workflows=WORKFLOWS, data_converter=converter)
    result = await replayer.replay_workflow(history)
    assert result.replay_failure is None
