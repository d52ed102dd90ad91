"""A planner and a synthesizer for any OpenAI-compatible Chat Completions endpoint (OpenAI, Azure OpenAI,
vLLM, Ollama, the llama.cpp server, a LiteLLM proxy), on the ``openai`` package's async client.

``ModelSettings.from_env()`` reads the endpoint and model; ``OpenAIPlanner`` and ``OpenAISynthesizer``
implement the framework's Planner and Synthesizer. Each invocation's model calls go to a
``ModelCallLog`` of its own — recorded as ``ModelCall`` whatever their outcome, spanned and measured in
the OpenTelemetry GenAI conventions — and provider failures become typed Temporal activity errors
(``ModelUnavailable`` retried, with the provider's Retry-After; the others not).
"""

from .calls import (
    EMPTY_COMPLETION,
    MODEL_REFUSAL,
    MODEL_REQUEST_ERROR,
    MODEL_UNAVAILABLE,
    TOKEN_BUDGET_EXCEEDED,
    ChatModel,
    ModelCallLog,
)
from .planner import PLANNER_SYSTEM_PROMPT, OpenAIPlanner
from .settings import ModelSettings
from .synthesizer import SYNTHESIZER_SYSTEM_PROMPT, OpenAISynthesizer, SynthesisStream, build_synthesis_prompt
from .tool_names import ToolNames, function_name

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
    "OpenAIPlanner",
    "OpenAISynthesizer",
    "SynthesisStream",
    "ToolNames",
    "build_synthesis_prompt",
    "function_name",
]
