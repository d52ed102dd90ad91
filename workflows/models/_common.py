"""Limits, well-known keys and the enums every part of the lifecycle shares."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, PrivateAttr

__all__ = [
    "CHARS_PER_TOKEN",
    "ENRICHMENT_ACTIVITY_COORDINATION",
    "ENRICHMENT_CONVERSATION_HISTORY",
    "ENRICHMENT_RAG_CONTEXT",
    "ENRICHMENT_USER_PROFILE",
    "MAX_EFFECT_VALUE_BYTES",
    "MAX_ENRICHMENT_BYTES",
    "MAX_INLINE_PAYLOAD_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_RECORDED_PROMPT_CHARS",
    "MAX_REQUEST_CHARS",
    "MAX_STORED_PAYLOAD_BYTES",
    "MAX_TOOL_OUTPUT_BYTES",
    "METADATA_CACHE",
    "METADATA_CONVERSATION_TURNS",
    "METADATA_MAX_MODEL_TOKENS",
    "REQUEST_ID_PATTERN",
    "STORED_REFERENCE_BYTES",
    "TASK_PAYLOAD_BUDGET_BYTES",
    "ByReference",
    "DecisionAction",
    "FailurePolicy",
    "RunMode",
    "Stage",
    "bounded_value",
    "estimate_tokens",
    "json_size",
]

MAX_REQUEST_CHARS = 8_000
# A pipeline's or a request's instructions (what the model is told before the request).
MAX_INSTRUCTIONS_CHARS = 8_000
MAX_METADATA_BYTES = 64 * 1024
MAX_ENRICHMENT_BYTES = 256 * 1024
MAX_TOOL_OUTPUT_BYTES = 32 * 1024
# Effect values and the recorded prompt above these sizes are kept by reference (digest, size, preview)
# so a record stays well under Temporal's 2 MB payload limit.
MAX_EFFECT_VALUE_BYTES = 32 * 1024
MAX_RECORDED_PROMPT_CHARS = 64 * 1024
# What one payload the workflow sends may weigh: inline, under Temporal's 2 MiB limit with room for the
# event around it; by reference (the payload store configured), what the store takes.
MAX_INLINE_PAYLOAD_BYTES = 1536 * 1024
MAX_STORED_PAYLOAD_BYTES = 32 * 1024 * 1024
# Inline bytes the workflow lets one workflow task schedule (its completion is one gRPC message of at most
# 4 MiB): a larger fan-out of steps is started in batches as earlier steps finish.
TASK_PAYLOAD_BUDGET_BYTES = 1024 * 1024
# What a payload costs in history once the store holds it: the reference.
STORED_REFERENCE_BYTES = 512
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$"
# Well-known enrichment keys: the default planning prompt renders each in its own section.
ENRICHMENT_RAG_CONTEXT = "rag_context"
ENRICHMENT_CONVERSATION_HISTORY = "conversation_history"
ENRICHMENT_ACTIVITY_COORDINATION = "activity_coordination"
ENRICHMENT_USER_PROFILE = "user_profile"
# Request metadata carrying raw conversation turns (promoted to conversation_history).
METADATA_CONVERSATION_TURNS = "conversation_turns"
# Request metadata switch: {"cache": "bypass"} disables response-cache reads.
METADATA_CACHE = "cache"
# Request metadata lowering the pipeline's model token budget for this request (never raising it).
METADATA_MAX_MODEL_TOKENS = "max_model_tokens"


class ByReference(BaseModel):
    """An activity's input or result. Above the payload store's threshold it travels through Temporal as
    a reference to the store (see ``storage.payloads``); what operators read — the request's input
    and result, signals, queries — stays inline unless it would not fit a payload at all.

    A local activity's input never leaves the worker: ``kept_inline()`` keeps it out of the store. Its
    result is recorded in the activity's marker: ``recorded_in_marker()`` lets it go by reference only
    when it is large, so the marker stays readable where it can.

    A model with ``defaults_omitted`` travels without the fields that hold their default (a step result's
    ten empty error and skip fields, a plan step's empty dependency lists): the receiver's validation puts
    them back. A model may say so only when it holds no union of models (with a field omitted, one member
    could read as another), and its defaults are then part of its recorded form: a history replays its
    results with the defaults of the code that replays it."""

    defaults_omitted: ClassVar[bool] = False
    _placement: Literal["reference", "inline", "marker"] = PrivateAttr(default="reference")

    def kept_inline(self) -> Self:
        self._placement = "inline"
        return self

    def recorded_in_marker(self) -> Self:
        self._placement = "marker"
        return self

    @property
    def payload_placement(self) -> str:
        """How the payload store may take this value: ``reference``, ``marker`` or ``inline``."""
        return self._placement


def json_size(value: Any) -> int:
    """Bytes of the compact JSON encoding of ``value`` (the size it has in a payload). A lone surrogate,
    which JSON can carry, counts as the three bytes it takes escaped or stored."""
    return len(
        json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    )


# A conservative token estimate: fewer characters per token than any common tokenizer reaches on prose,
# code or JSON, so a text estimated to fit does fit; non-ASCII text is counted by its UTF-8 bytes.
CHARS_PER_TOKEN = 3
BYTES_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """An upper estimate of the tokens ``text`` takes in a model's prompt (no tokenizer needed)."""
    if not text:
        return 0
    return max(-(-len(text) // CHARS_PER_TOKEN), -(-len(text.encode()) // BYTES_PER_TOKEN))


def bounded_value(value: Any) -> Any:
    """``value`` itself if its JSON is small, else a reference: sha256 of the canonical JSON, size, preview."""
    size = json_size(value)
    if size <= MAX_EFFECT_VALUE_BYTES:
        return value
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return {
        "$truncated": True,
        "sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        "bytes": size,
        "preview": text[:512],
    }


class Stage(StrEnum):
    """The stages a hook can implement: the pipeline stages (before/after planning, after execution, after
    synthesis), the tool-call stages and the run-level stages, in one registry (see ``workflows.stages``)."""

    BEFORE_RUN = "before_run"
    AFTER_RECALL = "after_recall"
    BEFORE_PLANNING = "before_planning"
    BEFORE_PLAN = "before_plan"
    AFTER_PLANNING = "after_planning"
    BEFORE_FALLBACK = "before_fallback"
    BEFORE_TOOL = "before_tool"
    ON_TOOL_ERROR = "on_tool_error"
    AFTER_TOOL = "after_tool"
    AFTER_EXECUTION = "after_execution"
    AFTER_SYNTHESIS = "after_synthesis"
    AFTER_ANSWER = "after_answer"
    BEFORE_REMEMBER = "before_remember"
    ON_ERROR = "on_error"
    ON_FINISH = "on_finish"


class FailurePolicy(StrEnum):
    FAIL_OPEN = "fail_open"
    FAIL_CLOSED = "fail_closed"


class DecisionAction(StrEnum):
    CONTINUE = "continue"
    TERMINATE = "terminate"
    SHORT_CIRCUIT = "short_circuit"
    DENY = "deny"
    STOP = "stop"
    SKIP = "skip"
    # A hook panicked (raised what is not an ordinary error): the request stops whatever the failure policy.
    PROPAGATE_PANIC = "propagate_panic"

    @property
    def ends_request(self) -> bool:
        return self in (DecisionAction.TERMINATE, DecisionAction.PROPAGATE_PANIC)


class RunMode(StrEnum):
    """How a hook invocation is scheduled by the workflow.

    ``local_activity`` (the default for hooks) runs in the workflow's worker without a round trip to the
    server — the hooks of one stage run in one workflow task — recorded as a marker with its summary:
    for fast, in-process work. ``activity`` is a regular activity: its own task, visible in the UI with
    its summary, retried, timed out and heartbeated by the server: for hooks that call something remote
    or slow.
    """

    ACTIVITY = "activity"
    LOCAL_ACTIVITY = "local_activity"


class TextDigest(BaseModel):
    """A text kept by digest — the sha256 and size of the exact text, and a preview its writer made safe
    to show — where keeping the text itself is unsafe (an unguarded draft) or too large (a prompt)."""

    sha256: str
    chars: int
    preview: str = ""

    @classmethod
    def of(cls, text: str, preview: str = "") -> Self:
        return cls(sha256=hashlib.sha256(text.encode()).hexdigest(), chars=len(text), preview=preview)

    def matches(self, text: str) -> bool:
        return self.sha256 == hashlib.sha256(text.encode()).hexdigest()
