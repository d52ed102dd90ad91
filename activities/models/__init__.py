"""A planner and a synthesizer for any OpenAI-compatible Chat Completions endpoint (OpenAI, Azure OpenAI,
vLLM, Ollama, the llama.cpp server, a LiteLLM proxy), on the ``openai`` package's async client.

``ModelSettings`` (``settings.model`` of the process settings) names the endpoint and model;
``OpenAIPlanner`` and ``OpenAISynthesizer`` implement the framework's Planner and Synthesizer, and
``OpenAIMemoryModel`` the memory summarizer and memory hooks' model. Each
invocation's model calls go to a ``ModelCallLog`` of its own — recorded as ``ModelCall`` whatever their
outcome, spanned and measured in the OpenTelemetry GenAI conventions — and provider failures become typed
Temporal activity errors (``ModelUnavailable`` retried, with the provider's Retry-After; the others not).

The names below load on first use: reading the settings imports ``ModelSettings`` without the ``openai``
package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hooks._lazy import lazy_getattr

if TYPE_CHECKING:
    from .call_log import TOKEN_BUDGET_EXCEEDED, ModelCallLog
    from .calls import EMPTY_COMPLETION, MODEL_REFUSAL, MODEL_REQUEST_ERROR, MODEL_UNAVAILABLE, ChatModel
    from .memory import OpenAIMemoryModel
    from .planner import PLANNER_SYSTEM_PROMPT, OpenAIPlanner
    from .settings import ModelSettings
    from .synthesizer import SYNTHESIZER_SYSTEM_PROMPT, OpenAISynthesizer, SynthesisStream, build_synthesis_prompt
    from .tool_names import ToolNames, function_name

_WHERE = {
    "EMPTY_COMPLETION": ".calls",
    "MODEL_REFUSAL": ".calls",
    "MODEL_REQUEST_ERROR": ".calls",
    "MODEL_UNAVAILABLE": ".calls",
    "TOKEN_BUDGET_EXCEEDED": ".call_log",
    "ChatModel": ".calls",
    "ModelCallLog": ".call_log",
    "OpenAIMemoryModel": ".memory",
    "PLANNER_SYSTEM_PROMPT": ".planner",
    "OpenAIPlanner": ".planner",
    "ModelSettings": ".settings",
    "SYNTHESIZER_SYSTEM_PROMPT": ".synthesizer",
    "OpenAISynthesizer": ".synthesizer",
    "SynthesisStream": ".synthesizer",
    "build_synthesis_prompt": ".synthesizer",
    "ToolNames": ".tool_names",
    "function_name": ".tool_names",
}

__all__ = [
    "EMPTY_COMPLETION",
    "MODEL_REFUSAL",
    "MODEL_REQUEST_ERROR",
    "MODEL_UNAVAILABLE",
    "PLANNER_SYSTEM_PROMPT",
    "SYNTHESIZER_SYSTEM_PROMPT",
    "TOKEN_BUDGET_EXCEEDED",
    "ChatModel",
    "ModelCallLog",
    "ModelSettings",
    "OpenAIMemoryModel",
    "OpenAIPlanner",
    "OpenAISynthesizer",
    "SynthesisStream",
    "ToolNames",
    "build_synthesis_prompt",
    "function_name",
]

__getattr__ = lazy_getattr(globals(), _WHERE)
