"""Secret masking shared by the workflow (what it shows operators) and the ``secret-redaction`` hook.

Pure functions over regular expressions: deterministic, so workflow code may call them. The patterns
are deliberately conservative: a pattern that over-matches corrupts legitimate output, which is its own
failure.
"""

from __future__ import annotations

import re

MASK = "[REDACTED]"

COMMON_SECRET_PATTERNS: dict[str, re.Pattern[str]] = {
    "private_key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]+?-----END [A-Z ]*PRIVATE KEY-----"),
    "aws_access_key_id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "github_token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "slack_token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),
    "api_key_sk": re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\b"),
    "bearer_token": re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{20,}=*"),
}


def redact(text: str, patterns: dict[str, re.Pattern[str]] = COMMON_SECRET_PATTERNS) -> tuple[str, dict[str, int]]:
    """Mask every match; returns the new text and the number of matches per pattern name."""
    counts: dict[str, int] = {}
    for name, pattern in patterns.items():
        text, n = pattern.subn(MASK, text)
        if n:
            counts[name] = n
    return text, counts


def masked_preview(text: str, limit: int, *, ellipsis: bool = False) -> str:
    """At most ``limit`` characters of ``text`` with the common secret patterns masked (safe to show or
    keep where the text itself is not); ``ellipsis`` marks a cut."""
    masked, _ = redact(text[: limit * 4])
    return masked[:limit] + ("…" if ellipsis and len(masked) > limit else "")
