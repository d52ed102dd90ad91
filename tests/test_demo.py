"""The quick start's demo, run as a user runs it (``python -m demo``), on free ports: every check it prints
passes, its reviewer finds the waiting request in the inbox (``AgentAwaitingReview = true``), and what it
prints never contains the secret its redaction hook masks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .test_entrypoints import _free_port

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_passes_its_checks_and_its_reviewer_finds_the_request_in_the_inbox(tmp_path):
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": f"127.0.0.1:{_free_port()}",
        "TEMPORAL_UI_PORT": str(_free_port()),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "[FAILED]" not in output
    assert "[ok] the waiting message request was in the reviewers' inbox (AgentAwaitingReview = true)" in output
    assert "sk-demo-" not in output  # the knowledge base's key: redacted in answers, never printed as a draft
