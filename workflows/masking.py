"""The redaction set: what is masked wherever this project shows or hands on text that may carry a secret.

One set, used by every place that masks: the workflow (the summaries and details it shows operators),
the ``secret-redaction`` hook and the ``redact`` plugin, the previews the record keeps, and the codec
server (every payload the Temporal UI decodes). It covers

* payment card numbers (13 to 19 digits, plain or in groups split by spaces or dashes, only those that
  pass the Luhn check) and US social security numbers (``123-45-6789``, ``123 45 6789``);
* cloud and VCS tokens: AWS access key ids and secret access keys (the secret beside its name), GitHub
  (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), GitLab (``glpat-``), Slack
  (``xox?-``), OpenAI and Anthropic (``sk-…``), Google (``AIza…``), Stripe (``sk_live_``, ``rk_live_``
  and their test forms), JSON web tokens and bearer tokens;
* private-key PEM blocks;
* credential pairs: ``password=…``, ``secret: …``, ``token=…``, ``api_key: …`` and their kin, in text,
  query strings and JSON (the value is masked, the name stays).

Pure functions over regular expressions: deterministic, so workflow code may call them. Each rule is
conservative (a pattern that over-matches corrupts legitimate output, which is its own failure): a
16-digit number that fails the Luhn check, an order number, a date, stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MASK = "[REDACTED]"


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (what every payment card number does)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _card_number(match: re.Match[str]) -> bool:
    digits = re.sub(r"[ -]", "", match.group(0))
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


@dataclass(frozen=True)
class Rule:
    """A pattern whose matches are masked: the whole match, or only ``group`` (a credential's value, its
    name kept); with ``check``, only the matches it accepts."""

    pattern: re.Pattern[str]
    group: int = 0
    check: Callable[[re.Match[str]], bool] | None = None


# A credential's name, then ``=`` or ``:`` (quotes around either side, as JSON writes them), then its value.
_CREDENTIAL_NAMES = (
    r"password|passwd|pwd|passphrase|secret|client[_-]?secret|token|access[_-]?token|refresh[_-]?token|"
    r"auth[_-]?token|api[_-]?key|apikey|private[_-]?key"
)

COMMON_SECRET_PATTERNS: dict[str, re.Pattern[str] | Rule] = {
    "private_key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]+?-----END [A-Z ]*PRIVATE KEY-----"),
    "aws_access_key_id": re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    "aws_secret_access_key": Rule(
        re.compile(r"(?i)\baws_?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"),
        group=1,
    ),
    "github_token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b"),
    "gitlab_token": re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),
    "slack_token": re.compile(r"\bxox[a-z]-[A-Za-z0-9-]{10,}\b"),
    "api_key_sk": re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),
    "google_api_key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"),
    "stripe_key": re.compile(r"\b(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\b"),
    "bearer_token": re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{20,}=*"),
    # Groups of four split the same way throughout (``4111 1111 1111 1111``), the 4-6-5 form, or the
    # digits run together; never part of a longer run of digits.
    "card_number": Rule(
        re.compile(
            r"(?<!\w)(?:[0-9]{4}([ -])[0-9]{4}\1[0-9]{4}\1[0-9]{1,7}|[0-9]{4}([ -])[0-9]{6}\2[0-9]{4,5}|[0-9]{13,19})"
            r"(?!\w)"
        ),
        check=_card_number,
    ),
    # Area 001-899 but 666, group 01-99, serial 0001-9999; both separators the same.
    "us_ssn": re.compile(r"(?<![\w-])(?!000|666|9[0-9]{2})[0-9]{3}([- ])(?!00)[0-9]{2}\1(?!0000)[0-9]{4}(?![\w-])"),
    "credential": Rule(
        re.compile(rf"(?i)(?<![A-Za-z0-9_])(?:{_CREDENTIAL_NAMES})[\"']?\s*[:=]\s*[\"']?([^\s\"',;&<>\[\]{{}}]{{4,}})"),
        group=1,
    ),
}


def _mask_rule(rule: Rule, text: str) -> tuple[str, int]:
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if rule.check is not None and not rule.check(match):
            return match.group(0)
        count += 1
        if not rule.group:
            return MASK
        start, end = match.span(rule.group)
        offset = match.start(0)
        whole = match.group(0)
        return whole[: start - offset] + MASK + whole[end - offset :]

    return rule.pattern.sub(replace, text), count


def redact(
    text: str, patterns: Mapping[str, re.Pattern[str] | Rule] = COMMON_SECRET_PATTERNS
) -> tuple[str, dict[str, int]]:
    """Mask every match; returns the new text and the number of matches per pattern name."""
    counts: dict[str, int] = {}
    for name, pattern in patterns.items():
        if isinstance(pattern, Rule):
            text, n = _mask_rule(pattern, text)
        else:
            text, n = pattern.subn(MASK, text)
        if n:
            counts[name] = n
    return text, counts


def masked_preview(text: str, limit: int, *, ellipsis: bool = False) -> str:
    """At most ``limit`` characters of ``text`` with the redaction set masked (safe to show or keep where
    the text itself is not); ``ellipsis`` marks a cut."""
    masked, _ = redact(text[: limit * 4])
    return masked[:limit] + ("…" if ellipsis and len(masked) > limit else "")
