"""The work every system's hooks do, one function per kind of hook, so the three systems do the same.

The hooks are the ones applications put in most, each with trivial but real work — a check, a string
replace — and none of them changes this request's outcome: the request names only allowed tools and its
texts hold no account number to mask. Each system calls these functions from its own hook points:

| hook | its work |
| --- | --- |
| request context | :func:`context_note`: the symbols the request names, as a line for the model |
| plan guard | :func:`refused_tools`: the planned tools not on the allow-list (an error if any) |
| tool allow-list | :func:`tool_allowed`: the called tool is on the allow-list (a denial if not) |
| result redactor | :func:`redact`: account numbers in the tool's result masked |
| answer redactor | :func:`redact`: account numbers in the answer masked |
| audit | :func:`audit`: one line per finished request into an in-process sink |

Workflow code of the peers imports this module (passed through Temporal's sandbox): it imports ``re``
and ``collections`` only, and its one piece of state, the audit sink, is bounded.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from benchmarks.peer import QUOTE_CAPABILITY

ALLOWED_TOOLS = frozenset({QUOTE_CAPABILITY})
ACCOUNT_NUMBER = re.compile(r"\bACCT-\d{6,12}\b")
MASK = "[account]"
_SYMBOL = re.compile(r"\b[A-Z]{2,5}\b")
AUDIT_LINES: deque[str] = deque(maxlen=1024)


def tool_name(name: str) -> str:
    """The tool's own name, whatever prefix a framework gives it (``demo-tools__stock-service__x``, ``a/b``)."""
    return name.rsplit("/", 1)[-1].rsplit("__", 1)[-1]


def context_note(request: str) -> str:
    """What the request-context hook adds for the model: the symbols the request names."""
    return f"Symbols asked about: {', '.join(_SYMBOL.findall(request)) or 'none'}. Prices in USD."


def tool_allowed(name: str) -> bool:
    return tool_name(name) in ALLOWED_TOOLS


def refused_tools(names: Iterable[str]) -> list[str]:
    """The planned tools the plan guard refuses (none for this request)."""
    return [name for name in names if not tool_allowed(name)]


def denial(name: str) -> str:
    return f"The tool {tool_name(name)} is not on this deployment's allow-list."


def redact(text: str) -> str:
    return ACCOUNT_NUMBER.sub(MASK, text)


def redact_value(value: Any) -> Any:
    """:func:`redact` on a tool result that is text, or on the text values of a JSON object; the value
    itself when nothing was masked."""
    if isinstance(value, str):
        masked = redact(value)
        return value if masked == value else masked
    if isinstance(value, dict):
        masked = {key: redact_value(item) for key, item in value.items()}
        return value if all(masked[key] is value[key] for key in value) else masked
    return value


def audit(request_id: str, status: str, answer: str) -> str:
    line = f"{request_id} {status} answer={len(answer)} chars"
    AUDIT_LINES.append(line)
    return line
