"""What an execution shows an operator in the Temporal UI and CLI: its user metadata (static summary and
details, set by whoever starts it) and its current details (set by the workflow as it moves).

Everything here is bounded and masked: the request and the answer are cut to a few hundred characters
and the redaction set (``workflows.masking``) is applied before any of it leaves the workflow, so the UI
never shows more of a request than an operator needs to recognise it. The UI renders these fields as
markdown: an excerpt is one line, and cannot form a link, an image or an HTML tag. Pure functions:
workflow code may call them.

Where payloads are encrypted, these fields are the part of a request the UI shows without a codec (each
is built as ``Shown``, which the encrypting codec leaves readable), so with ``with_text=False`` (the
request's ``PipelineManifest.ui_shows_text``) they carry no request text, no tool argument, no reason a
hook or a reviewer wrote and no answer: only names (hooks, tools, stages, reviewers), ids, counts, times
and the failure's type. ``shown`` marks the summaries built elsewhere, which carry names and ids only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence

from .converter import Shown
from .masking import masked_preview
from .models import Checkpoint
from .support import TOOL_POLICY_REASON

SUMMARY_CHARS = 120  # the one-line summary in the workflow list
EXCERPT_CHARS = 400  # the request or answer excerpt in the details
MAX_SUMMARY_BYTES = 400  # what the server accepts for a summary
_NEUTRALIZED = str.maketrans({"<": "‹", ">": "›"})
_WHITESPACE = re.compile(r"\s+")
# What stands where the request's text would be, where the UI may not show it.
NOT_SHOWN = "(encrypted: read it through the codec server)"


def shown(text: str) -> Shown:
    """``text`` as a summary the UI shows without a codec: for summaries of names, ids and counts only."""
    return Shown(text)


@functools.lru_cache(maxsize=64)  # the same request is shown at every stage
def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """One line of at most ``limit`` characters of ``text``, secrets masked, no link, image or tag."""
    line = _WHITESPACE.sub(" ", masked_preview(text, limit, ellipsis=True)).strip()
    return line.translate(_NEUTRALIZED).replace("](", "] (")


def _bounded(summary: str) -> Shown:
    while len(summary.encode()) > MAX_SUMMARY_BYTES:
        summary = summary[:-2] + "…"
    return Shown(summary)


def request_summary(text: str, request_id: str = "", *, with_text: bool = True) -> Shown:
    """The static summary of a request: what was asked, on one line (without text: its request id)."""
    if not with_text:
        return _bounded(f"request · {excerpt(request_id, SUMMARY_CHARS)}")
    return _bounded(f"request: {excerpt(text, SUMMARY_CHARS)}")


def request_details(text: str, request_id: str, *, with_text: bool = True) -> Shown:
    """The static details of a request: the request id and a longer excerpt of what was asked."""
    return Shown(f"**request id:** {excerpt(request_id, 200)}\n\n**asked:** {_asked(text, with_text)}")


def _asked(text: str, with_text: bool) -> str:
    return excerpt(text) if with_text else NOT_SHOWN


def subagent_summary(tool: str, step_id: str, depth: int, text: str, *, with_text: bool = True) -> Shown:
    asked = f": {excerpt(text, SUMMARY_CHARS)}" if with_text else ""
    return _bounded(f"sub-agent · {tool} ({step_id}) · depth {depth}{asked}")


def subagent_details(parent_workflow_id: str, request_id: str, text: str, *, with_text: bool = True) -> Shown:
    return Shown(
        f"**sub-agent of:** {excerpt(parent_workflow_id, 200)} (request {excerpt(request_id, 200)})\n\n"
        f"**asked:** {_asked(text, with_text)}"
    )


def detached_summary(stage: str, hook: str, effect_id: str) -> Shown:
    return _bounded(f"detached effect · {stage} · {hook} · {effect_id}")


def detached_details(parent_workflow_id: str, request_id: str) -> Shown:
    return Shown(f"**detached effect of:** {excerpt(parent_workflow_id, 200)} (request {excerpt(request_id, 200)})")


def lease_keeper_summary(hook: str, lease_id: str) -> Shown:
    return _bounded(f"lease keeper · {hook} · {excerpt(lease_id, 200)}")


def lease_keeper_details(parent_workflow_id: str, request_id: str) -> Shown:
    return Shown(
        f"**keeps a lease of:** {excerpt(parent_workflow_id, 200)} (request {excerpt(request_id, 200)}) until "
        "the request ends"
    )


def review_notification_details(parent_workflow_id: str, request_id: str, checkpoint_id: str) -> Shown:
    return Shown(
        f"**reviewers told of checkpoint** {excerpt(checkpoint_id, 200)} **of:** {excerpt(parent_workflow_id, 200)} "
        f"(request {excerpt(request_id, 200)})"
    )


def _calls_text(checkpoint: Checkpoint, with_text: bool = True) -> str:
    """The calls a checkpoint approves, as they will run: tool key and arguments (masked by ``excerpt``;
    without text, the tool and step only)."""
    return "; ".join(
        f"{call.tool} {json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)} ({call.step_id})"
        if with_text
        else f"{call.tool} ({call.step_id})"
        for call in checkpoint.calls
    )


def _reasons_text(
    checkpoint: Checkpoint, required_by: Mapping[str, str], *, tools: bool = True, with_text: bool = True
) -> str:
    """Why each call needs a reviewer, and who asked: the after_planning hook that marked it, or the
    tool's own policy (without text, who asked only: a hook's reason may quote the arguments)."""
    return "; ".join(
        dict.fromkeys(
            (f"{r.tool}: " if tools else "")
            + (
                f"{r.reason} (required by {_required_by(r.step_id, r.reason, required_by)})"
                if with_text
                else f"required by {_required_by(r.step_id, r.reason, required_by)}"
            )
            for r in checkpoint.reasons
        )
    )


def _required_by(step_id: str, reason: str, required_by: Mapping[str, str]) -> str:
    if reason == TOOL_POLICY_REASON:
        return "the tool's policy"
    return f"hook {required_by[step_id]}" if step_id in required_by else "an after_planning hook"


def _code(text: str, limit: int) -> str:
    """``text`` masked and bounded as an excerpt, as inline code (shown exactly as it is)."""
    return "`" + excerpt(text, limit).replace("`", "'") + "`"


def _reviewers_text(reviewers: Sequence[str]) -> str:
    return ", ".join(reviewers) if reviewers else "any reviewer"


def checkpoint_timer_summary(
    checkpoint: Checkpoint, reviewers: Sequence[str], required_by: Mapping[str, str], *, with_text: bool = True
) -> Shown:
    """The summary of a checkpoint's expiry timer, the row a waiting request's Timeline ends with: what
    waits for whom, and why, on one line (without text: the tools and who asked for the review)."""
    what = _calls_text(checkpoint, with_text) or "the plan"
    why = _reasons_text(checkpoint, required_by, tools=False, with_text=with_text)
    return _bounded(
        f"awaiting review · {checkpoint.checkpoint_id} until expiry: approve {excerpt(what, 120)} — "
        f"{excerpt(why, 160)} · reviewers: {excerpt(_reviewers_text(reviewers), 80)}"
    )


def checkpoint_lines(
    checkpoint: Checkpoint,
    workflow_id: str,
    reviewers: Sequence[str],
    required_by: Mapping[str, str],
    *,
    with_text: bool = True,
) -> list[str]:
    """What a waiting request's current details say besides its stage: the calls awaiting approval as they
    will run (after every rewrite; arguments masked, or left out without text), why each needs a reviewer
    and which hook asked, who may review, until when, and the exact commands that approve or reject it."""
    cp = excerpt(checkpoint.checkpoint_id, 128)
    wid = excerpt(workflow_id, 200)
    who = "<reviewer>" if not reviewers else excerpt(reviewers[0], 128)
    update = json.dumps({"checkpoint_id": checkpoint.checkpoint_id, "reviewer": "REVIEWER", "decision": "approve"})
    calls = "; ".join(
        (
            _code(f"{call.tool} {json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)}", 300)
            if with_text
            else _code(call.tool, 300)
        )
        + f" ({excerpt(call.step_id, 80)})"
        for call in checkpoint.calls
    )
    why = _reasons_text(checkpoint, required_by, with_text=with_text)
    lines = [
        f"**awaiting approval:** {calls or 'the plan as planned'}",
        f"**why:** {excerpt(why or 'review the plan')}",
        f"**reviewers:** {excerpt(_reviewers_text(reviewers), 300)} · **expires:** "
        f"{checkpoint.expires_at.strftime('%Y-%m-%d %H:%M:%S')} UTC",
        f'**approve:** `agent-lifecycle approve {wid} --reviewer {who} --checkpoint {cp} --comment "ok"`',
        f'**reject:** `agent-lifecycle reject {wid} --reviewer {who} --checkpoint {cp} --comment "why"`',
        f"**or the update:** `temporal workflow update execute --workflow-id {wid} --name review --input "
        f"'{excerpt(update, 300)}'` (decision approve or reject)",
    ]
    return lines


def reviewed_lines(checkpoints: Sequence[Checkpoint], *, with_text: bool = True) -> list[str]:
    """What an ended request's details say of its checkpoints: how each was decided, by whom, and why
    (without text, not why: a reviewer's comment may quote the request)."""
    lines = []
    for checkpoint in checkpoints:
        line = f"**checkpoint** {excerpt(checkpoint.checkpoint_id, 128)} {checkpoint.status.value}"
        if checkpoint.reviewer:
            line += f" by {excerpt(checkpoint.reviewer, 128)}"
        if checkpoint.comment and with_text:
            line += f": {excerpt(checkpoint.comment, 200)}"
        if checkpoint.declined:
            line += f" (declined {excerpt(', '.join(checkpoint.declined), 200)})"
        lines.append(line)
    return lines


def decision_mark(
    verb: str, stage: str, hook: str, reason: str, step_id: str | None = None, *, with_text: bool = True
) -> Shown:
    """The summary of the timer that marks a hook's refusal on the Timeline: what it did, where, and
    why, all on the first line (without text, not why: a hook's reason may quote the arguments)."""
    where = f"{stage} · {excerpt(hook, 120)}" + (f" · {excerpt(step_id, 80)}" if step_id else "")
    return _bounded(f"✗ {verb} — {where}" + (f": {excerpt(reason, 300)}" if with_text else ""))


def failure_headline(error_type: str, message: str) -> str:
    """A failure as one first line: its type, then its reason."""
    return f"{error_type}: {message}"


def current_details(
    asked: str,
    *,
    stage: str,
    detail: str = "",
    outcome: str = "",
    more: Sequence[str] = (),
    with_text: bool = True,
) -> Shown:
    """The workflow's current details: what was asked, the stage it is in (``more``: lines of this module
    that tell more of it), and once it ended its outcome (built by :func:`outcome`; ``detail`` names a
    checkpoint or a conversation, never text)."""
    lines = [
        f"**asked:** {_asked(asked, with_text)}",
        f"**stage:** {stage}" + (f" — {excerpt(detail)}" if detail else ""),
    ]
    if outcome:
        lines.append(f"**outcome:** {excerpt(outcome)}")
    lines += more
    return Shown("\n\n".join(lines))


def failure_outcome(error_type: str, message: str, *, with_text: bool = True) -> str:
    """A failed request's outcome: its type, then its reason (without text: its type)."""
    return failure_headline(error_type, message) if with_text else error_type
