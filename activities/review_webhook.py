"""The reviewers' webhook (``AGENT_REVIEW_WEBHOOK``): told when a checkpoint opens.

The payload is a Slack incoming-webhook message — a top-level ``text`` and ``blocks`` — so a Slack
webhook URL works as it is, and carries the same facts as structured fields under ``review`` for any
other receiver: the request (id, a short excerpt of what was asked with common secrets masked), the
checkpoint (id, phase, reasons, expiry), the calls approval runs — exactly as they will run, after every
rewrite, with the arguments as planned where those differ — the plan for context (each step's tool and an
excerpt of its arguments; every excerpt with common secrets masked) and how to decide it (the CLI commands and the workflow's ``review`` update).

The POST goes through the SSRF guard of declared HTTP hooks: the URL's host is resolved, every address
checked, and the connection pinned to the checked address; loopback only with
``AGENT_HOOK_ALLOW_LOOPBACK``. Errors are typed for the retry policy of ``ReviewNotification``:
``ReviewWebhookRefused`` (the guard refused the address) and ``ReviewWebhookRejected`` (a 4xx other
than 408/429) are final; ``ReviewWebhookFailed`` (5xx, 408, 429, a connection that failed) is retried.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from hooks.builtin.secret_redaction import masked_preview
from hooks.declarative.handlers import HandlerError, post_json
from workflows.models import ReviewNotificationInput, ReviewNotificationResult

WEBHOOK_REFUSED = "ReviewWebhookRefused"
WEBHOOK_REJECTED = "ReviewWebhookRejected"
WEBHOOK_FAILED = "ReviewWebhookFailed"
WEBHOOK_NOT_CONFIGURED = "ReviewWebhookNotConfigured"

REQUEST_EXCERPT_CHARS = 300
ARGUMENTS_EXCERPT_CHARS = 200
MAX_LISTED_STEPS = 20  # the plan's steps shown (a Slack message holds at most 50 blocks)
RETRIED_4XX = (408, 429)


@dataclass(frozen=True)
class ReviewWebhook:
    """Where checkpoint notifications go. ``allow_loopback`` lets the URL reach loopback (tests only)."""

    url: str
    allow_loopback: bool = False
    timeout_seconds: float = 10.0  # one POST, connection included (a hung receiver is a failed attempt)

    async def deliver(self, input: ReviewNotificationInput) -> ReviewNotificationResult:
        """POST the notification once (the workflow retries).

        Raises:
            ApplicationError: ``ReviewWebhookRefused``, ``ReviewWebhookRejected`` (both non-retryable)
                or ``ReviewWebhookFailed``.
        """
        try:
            async with asyncio.timeout(self.timeout_seconds):
                response = await post_json(
                    self.url, review_payload(input), {}, allow_loopback=self.allow_loopback, retry_5xx=False
                )
        except HandlerError as err:
            if err.metadata.get("ssrf_blocked"):
                raise ApplicationError(str(err), type=WEBHOOK_REFUSED, non_retryable=True) from None
            raise ApplicationError(str(err), type=WEBHOOK_FAILED) from None
        except TimeoutError:
            raise ApplicationError(
                f"the reviewers' webhook did not answer within {self.timeout_seconds:g} s", type=WEBHOOK_FAILED
            ) from None
        status = response.status
        text = response.body[:200].decode(errors="replace")
        if 200 <= status < 300:
            return ReviewNotificationResult(http_status=status, attempt=_attempt())
        message = f"the reviewers' webhook answered {status}: {text}"
        if status >= 500 or status in RETRIED_4XX:
            raise ApplicationError(message, {"http_status": status}, type=WEBHOOK_FAILED)
        raise ApplicationError(message, {"http_status": status}, type=WEBHOOK_REJECTED, non_retryable=True)


def _attempt() -> int:
    return activity.info().attempt if activity.in_activity() else 1


def _excerpt(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return masked_preview(text, limit, ellipsis=True)


def _mrkdwn(text: str) -> str:
    """Text as Slack shows it literally (its control characters escaped)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def decide_commands(workflow_id: str, checkpoint_id: str) -> dict[str, str]:
    """The CLI commands that decide the checkpoint, ready to paste into a shell."""
    target = f'{shlex.quote(workflow_id)} --checkpoint {shlex.quote(checkpoint_id)} --reviewer "$USER"'
    return {
        "approve": f"agent-lifecycle approve {target} --comment 'checked'",
        "reject": f"agent-lifecycle reject {target} --comment 'why not'",
    }


def review_payload(input: ReviewNotificationInput) -> dict[str, Any]:
    """The JSON the webhook receives (see the module docstring)."""
    checkpoint = input.checkpoint
    workflow_id = input.parent_workflow_id
    excerpt = _excerpt(input.request, REQUEST_EXCERPT_CHARS)
    # Tools by their key (namespace/agent/capability), as everything a person reads names them; the
    # checkpoint's own reasons and calls keep the agent/capability name hook matchers see.
    keys = {step.step_id: step.tool_key for step in checkpoint.plan.steps}
    steps = [
        {"step_id": step.step_id, "tool": step.tool_key, "arguments": _excerpt(step.arguments, ARGUMENTS_EXCERPT_CHARS)}
        for step in checkpoint.plan.steps
    ]
    reasons = [
        {**reason.model_dump(mode="json"), "tool": keys.get(reason.step_id, reason.tool)}
        for reason in checkpoint.reasons
    ]
    calls = [
        {
            "step_id": call.step_id,
            "tool": keys.get(call.step_id, call.tool),
            "arguments": _excerpt(call.arguments, ARGUMENTS_EXCERPT_CHARS),
            "planned_arguments": (
                _excerpt(call.planned_arguments, ARGUMENTS_EXCERPT_CHARS)
                if call.planned_arguments is not None
                else None
            ),
            "modified_by": list(call.modified_by),
        }
        for call in checkpoint.calls
    ]
    commands = decide_commands(workflow_id, checkpoint.checkpoint_id)
    review = {
        "request": {"request_id": input.request_id, "workflow_id": workflow_id, "excerpt": excerpt},
        "checkpoint": {
            "checkpoint_id": checkpoint.checkpoint_id,
            "phase": checkpoint.phase,
            "reasons": reasons,
            "step_id": checkpoint.step_id,
            "requested_at": checkpoint.requested_at.isoformat(),
            "expires_at": checkpoint.expires_at.isoformat(),
        },
        "calls": calls,
        "plan": {"phase": checkpoint.plan.phase, "steps": steps},
        "reviewers": list(input.reviewers),
        "decide": {
            **commands,
            # The workflow update the CLI sends: {"checkpoint_id", "decision", "reviewer", "comment"}.
            "update": {
                "workflow_id": workflow_id,
                "name": "review",
                "checkpoint_id": checkpoint.checkpoint_id,
                "decisions": ["approve", "reject"],
            },
        },
    }
    tools = ", ".join(dict.fromkeys(reason["tool"] for reason in reasons)) or "the plan"
    text = (
        f"Review needed: request {input.request_id} waits at checkpoint {checkpoint.checkpoint_id} "
        f"(phase {checkpoint.phase}) for approval of {tools}; expires {checkpoint.expires_at.isoformat()}."
    )
    listed = "\n".join(f"• `{_mrkdwn(s['tool'])}` {_mrkdwn(s['arguments'])}" for s in steps[:MAX_LISTED_STEPS]) + (
        f"\n… and {len(steps) - MAX_LISTED_STEPS} more" if len(steps) > MAX_LISTED_STEPS else ""
    )
    why = "\n".join(f"• {_mrkdwn(r['tool'])}: {_mrkdwn(r['reason'])}" for r in reasons[:MAX_LISTED_STEPS])
    runs = "\n".join(
        f"• `{_mrkdwn(keys.get(c.step_id, c.tool))}` {_mrkdwn(_excerpt(c.arguments, ARGUMENTS_EXCERPT_CHARS))}"
        + (f" (rewritten by {_mrkdwn(', '.join(c.modified_by))})" if c.modified_by else "")
        for c in checkpoint.calls[:MAX_LISTED_STEPS]
    )
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": f"Review needed: {input.request_id}"[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Asked:* {_mrkdwn(excerpt)}"}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Checkpoint*\n{_mrkdwn(checkpoint.checkpoint_id)}"},
                {"type": "mrkdwn", "text": f"*Phase*\n{checkpoint.phase}"},
                {"type": "mrkdwn", "text": f"*Expires*\n{checkpoint.expires_at.isoformat()}"},
                {"type": "mrkdwn", "text": f"*Workflow*\n{_mrkdwn(workflow_id)}"},
            ],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Why*\n{why or '—'}"[:3000]}},
        *(
            [{"type": "section", "text": {"type": "mrkdwn", "text": f"*Approving runs exactly*\n{runs}"[:3000]}}]
            if runs
            else []
        ),
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Plan*\n{listed or '—'}"[:3000]}},
        {
            "type": "context",
            "elements": [
                {"type": "mrkdwn", "text": f"Approve: `{_mrkdwn(commands['approve'])}`"},
                {"type": "mrkdwn", "text": f"Reject: `{_mrkdwn(commands['reject'])}`"},
            ],
        },
    ]
    return {"text": text, "blocks": blocks, "review": review}
