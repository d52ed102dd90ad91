"""What an execution shows an operator in the Temporal UI and CLI: its user metadata (static summary and
details, set by whoever starts it) and its current details (set by the workflow as it moves).

Everything here is bounded and masked: the request and the answer are cut to a few hundred characters
and the common secret patterns are replaced before any of it leaves the workflow, so the UI never shows
more of a request than an operator needs to recognise it. The UI renders these fields as markdown: an
excerpt is one line, and cannot form a link, an image or an HTML tag. Pure functions: workflow code
may call them.
"""

from __future__ import annotations

import functools
import json
import re

from .masking import masked_preview
from .models import Checkpoint

SUMMARY_CHARS = 120  # the one-line summary in the workflow list
EXCERPT_CHARS = 400  # the request or answer excerpt in the details
MAX_SUMMARY_BYTES = 400  # what the server accepts for a summary
_NEUTRALIZED = str.maketrans({"<": "‹", ">": "›"})
_WHITESPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=64)  # the same request is shown at every stage
def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """One line of at most ``limit`` characters of ``text``, secrets masked, no link, image or tag."""
    line = _WHITESPACE.sub(" ", masked_preview(text, limit, ellipsis=True)).strip()
    return line.translate(_NEUTRALIZED).replace("](", "] (")


def _bounded(summary: str) -> str:
    while len(summary.encode()) > MAX_SUMMARY_BYTES:
        summary = summary[:-2] + "…"
    return summary


def request_summary(text: str) -> str:
    """The static summary of a request: what was asked, on one line."""
    return _bounded(f"request: {excerpt(text, SUMMARY_CHARS)}")


def request_details(text: str, request_id: str) -> str:
    """The static details of a request: the request id and a longer excerpt of what was asked."""
    return f"**request id:** {excerpt(request_id, 200)}\n\n**asked:** {excerpt(text)}"


def subagent_summary(tool: str, step_id: str, depth: int, text: str) -> str:
    return _bounded(f"sub-agent · {tool} ({step_id}) · depth {depth}: {excerpt(text, SUMMARY_CHARS)}")


def subagent_details(parent_workflow_id: str, request_id: str, text: str) -> str:
    return (
        f"**sub-agent of:** {excerpt(parent_workflow_id, 200)} (request {excerpt(request_id, 200)})\n\n"
        f"**asked:** {excerpt(text)}"
    )


def detached_summary(stage: str, hook: str, effect_id: str) -> str:
    return _bounded(f"detached effect · {stage} · {hook} · {effect_id}")


def detached_details(parent_workflow_id: str, request_id: str) -> str:
    return f"**detached effect of:** {excerpt(parent_workflow_id, 200)} (request {excerpt(request_id, 200)})"


def lease_keeper_summary(hook: str, lease_id: str) -> str:
    return _bounded(f"lease keeper · {hook} · {excerpt(lease_id, 200)}")


def lease_keeper_details(parent_workflow_id: str, request_id: str) -> str:
    return (
        f"**keeps a lease of:** {excerpt(parent_workflow_id, 200)} (request {excerpt(request_id, 200)}) until "
        "the request ends"
    )


def review_notification_details(parent_workflow_id: str, request_id: str, checkpoint_id: str) -> str:
    return (
        f"**reviewers told of checkpoint** {excerpt(checkpoint_id, 200)} **of:** {excerpt(parent_workflow_id, 200)} "
        f"(request {excerpt(request_id, 200)})"
    )


def checkpoint_detail(checkpoint: Checkpoint) -> str:
    """What a waiting request's current details say of its checkpoint: the calls to approve, as they will
    run, and why each needs a reviewer."""
    why = "; ".join(dict.fromkeys(f"{r.tool}: {r.reason}" for r in checkpoint.reasons))
    if not checkpoint.calls:
        return f"checkpoint {checkpoint.checkpoint_id}: {why or 'review the plan'}"
    calls = "; ".join(
        f"{call.tool} {json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)}" for call in checkpoint.calls
    )
    return f"checkpoint {checkpoint.checkpoint_id}: approve {calls} ({why})"


def decision_mark(verb: str, stage: str, hook: str, reason: str, step_id: str | None = None) -> str:
    """The summary of the timer that marks a hook's refusal on the Timeline: what it did, where, and
    why, all on the first line."""
    where = f"{stage} · {excerpt(hook, 120)}" + (f" · {excerpt(step_id, 80)}" if step_id else "")
    return _bounded(f"✗ {verb} — {where}: {excerpt(reason, 300)}")


def failure_headline(error_type: str, message: str) -> str:
    """A failure as one first line: its type, then its reason."""
    return f"{error_type}: {message}"


def current_details(asked: str, *, stage: str, detail: str = "", outcome: str = "") -> str:
    """The workflow's current details: what was asked, the stage it is in, and once it ended its outcome."""
    lines = [f"**asked:** {excerpt(asked)}", f"**stage:** {stage}" + (f" — {excerpt(detail)}" if detail else "")]
    if outcome:
        lines.append(f"**outcome:** {excerpt(outcome)}")
    return "\n\n".join(lines)
