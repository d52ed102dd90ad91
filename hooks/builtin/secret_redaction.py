"""``secret-redaction``: an after_synthesis guardrail that masks credentials in the response.

Its patterns are the project's one redaction set (``workflows.masking``: card numbers, SSNs, cloud and VCS
tokens, private keys, credential pairs), the same set that masks what the workflow shows operators in the
Temporal UI and what the codec server decodes for it. They are deliberately conservative: a pattern that
over-matches corrupts legitimate output, which is its own failure. The effect it reports counts
redactions per pattern, never the secret itself.

It fails closed: when it errs, times out or its worker keeps dying, the request ends with
``ExtensionError`` instead of sending (or caching) an answer nobody redacted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from workflows.masking import COMMON_SECRET_PATTERNS, MASK, Rule, masked_preview, redact
from workflows.models import FailurePolicy

from ..contracts import PipelineContext, PipelineHook

__all__ = ["COMMON_SECRET_PATTERNS", "MASK", "Rule", "SecretRedactionHook", "masked_preview", "redact"]


class SecretRedactionHook(PipelineHook):
    """Mask the redaction set (card numbers, SSNs, API keys, tokens, private keys, credential pairs) in
    the final response."""

    name = "secret-redaction"
    timeout_seconds = 5.0
    failure_policy = FailurePolicy.FAIL_CLOSED

    def __init__(self, patterns: Mapping[str, re.Pattern[str] | Rule] | None = None) -> None:
        self.patterns = dict(patterns or COMMON_SECRET_PATTERNS)

    def after_synthesis(self, ctx: PipelineContext, response: str) -> str:
        redacted, counts = redact(response, self.patterns)
        ctx.report_effect(
            "secret_redaction",
            name="Secret redaction",
            data={"redactions": sum(counts.values()), "by_pattern": counts},
            summary=f"{sum(counts.values())} redaction(s)",
        )
        return redacted
