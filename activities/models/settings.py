"""Which OpenAI-compatible model to call, and how, read from the environment.

Any Chat Completions endpoint works: OpenAI, Azure OpenAI (its ``/openai/v1/`` base URL), vLLM, Ollama,
the llama.cpp server, a LiteLLM proxy. Without ``AGENT_MODEL`` (or a per-role model) nothing is
configured and the rule planner stays the default. The API key is a ``SecretStr``: it never appears in a
repr, a log line or an error message. A bad value fails at start-up with a ``ValueError`` naming its
variable.

| variable | default | meaning |
| --- | --- | --- |
| ``AGENT_MODEL_BASE_URL`` (else ``OPENAI_BASE_URL``) | the OpenAI API | the endpoint, up to ``/v1`` |
| ``AGENT_MODEL_API_KEY`` (else ``OPENAI_API_KEY``) | none | required for the OpenAI API itself |
| ``AGENT_MODEL`` | none | the model of both roles |
| ``AGENT_PLANNER_MODEL`` / ``AGENT_SYNTHESIZER_MODEL`` | ``AGENT_MODEL`` | per-role overrides |
| ``AGENT_MODEL_TIMEOUT_SECONDS`` | 25 | one HTTP call, connection included |
| ``AGENT_MODEL_MAX_OUTPUT_TOKENS`` | 1024 | per call |
| ``AGENT_MODEL_TEMPERATURE`` | not sent | 0–2 (some reasoning models refuse any value) |
| ``AGENT_MODEL_MAX_TOKENS_PER_REQUEST`` | no budget | tokens one request may spend on models |
| ``AGENT_MODEL_TOKEN_LIMIT_PARAMETER`` | ``max_tokens`` | or ``max_completion_tokens`` (OpenAI reasoning models) |
| ``AGENT_MODEL_PROVIDER`` | ``openai`` | ``gen_ai.provider.name`` on spans and metrics |
| ``AGENT_MODEL_CONTEXT_WINDOW`` | unknown | the model's context window in tokens (prompt budgets, memory caps) |
| ``AGENT_FALLBACK_MODEL`` | none | called when the primary model is unavailable after its retries |
| ``AGENT_FALLBACK_MODEL_BASE_URL`` / ``AGENT_FALLBACK_MODEL_API_KEY`` | the primary's | the fallback's endpoint and key |
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from openai import AsyncOpenAI
from pydantic import BaseModel, Field, SecretStr

T = TypeVar("T")

# Servers that ignore authentication (most local ones) still receive a bearer token: the client needs one.
PLACEHOLDER_API_KEY = "no-key"


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(variable, value) of the first of ``names`` set to a non-blank value."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _parsed(
    env: Mapping[str, str], name: str, parse: Callable[[str], T], check: Callable[[T], bool], expected: str
) -> T | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = parse(raw)
    except ValueError:
        raise ValueError(f"{name} must be {expected}, not {raw!r}") from None
    if not check(value):
        raise ValueError(f"{name} must be {expected}, not {raw!r}")
    return value


class ModelSettings(BaseModel):
    """The model endpoint and call options shared by the planner and the synthesizer."""

    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    planner_model: str | None = None
    synthesizer_model: str | None = None
    # Two planning turns (a call and its repair) fit in the plan activity's default 60-s timeout; raise the
    # stage timeouts with this one.
    timeout_seconds: float = Field(default=25.0, gt=0)
    max_output_tokens: int = Field(default=1024, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tokens_per_request: int | None = Field(default=None, gt=0)
    token_limit_parameter: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    provider: str = "openai"
    # The model's context window in tokens (None: unknown, so nothing is budgeted against it).
    context_window: int | None = Field(default=None, gt=0)
    # The model a planning or synthesis step falls back to when the primary is unavailable after its
    # retries, and its endpoint (by default the primary's).
    fallback_model: str | None = None
    fallback_base_url: str | None = None
    fallback_api_key: SecretStr | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ModelSettings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if found := _first(env, "AGENT_MODEL_BASE_URL", "OPENAI_BASE_URL"):
            name, url = found
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must be an http:// or https:// URL, not {url!r}")
            values["base_url"] = url
        if found := _first(env, "AGENT_MODEL_API_KEY", "OPENAI_API_KEY"):
            values["api_key"] = SecretStr(found[1])
        if found := _first(env, "AGENT_FALLBACK_MODEL_BASE_URL"):
            name, url = found
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{name} must be an http:// or https:// URL, not {url!r}")
            values["fallback_base_url"] = url
        if found := _first(env, "AGENT_FALLBACK_MODEL_API_KEY"):
            values["fallback_api_key"] = SecretStr(found[1])
        for name, key in (
            ("AGENT_MODEL", "model"),
            ("AGENT_PLANNER_MODEL", "planner_model"),
            ("AGENT_SYNTHESIZER_MODEL", "synthesizer_model"),
            ("AGENT_MODEL_PROVIDER", "provider"),
            ("AGENT_FALLBACK_MODEL", "fallback_model"),
        ):
            if found := _first(env, name):
                values[key] = found[1]
        numbers = {
            "timeout_seconds": _parsed(
                env, "AGENT_MODEL_TIMEOUT_SECONDS", float, lambda v: 0 < v < 3600, "seconds in (0, 3600)"
            ),
            "max_output_tokens": _parsed(
                env, "AGENT_MODEL_MAX_OUTPUT_TOKENS", int, lambda v: v > 0, "a positive integer"
            ),
            "temperature": _parsed(env, "AGENT_MODEL_TEMPERATURE", float, lambda v: 0 <= v <= 2, "a number in [0, 2]"),
            "max_tokens_per_request": _parsed(
                env, "AGENT_MODEL_MAX_TOKENS_PER_REQUEST", int, lambda v: v > 0, "a positive integer"
            ),
            "context_window": _parsed(
                env, "AGENT_MODEL_CONTEXT_WINDOW", int, lambda v: 256 <= v <= 100_000_000, "tokens, 256 or more"
            ),
        }
        values.update({key: value for key, value in numbers.items() if value is not None})
        if found := _first(env, "AGENT_MODEL_TOKEN_LIMIT_PARAMETER"):
            if found[1] not in ("max_tokens", "max_completion_tokens"):
                raise ValueError(
                    f"AGENT_MODEL_TOKEN_LIMIT_PARAMETER must be max_tokens or max_completion_tokens, not {found[1]!r}"
                )
            values["token_limit_parameter"] = found[1]
        settings = cls(**values)
        if settings.configured() and settings.base_url is None and settings.api_key is None:
            raise ValueError(
                "AGENT_MODEL_API_KEY (or OPENAI_API_KEY) is required for the OpenAI API; set it, or AGENT_MODEL_BASE_URL"
            )
        return settings

    def configured(self, role: Literal["planner", "synthesizer"] | None = None) -> bool:
        """Whether a model is set for ``role`` (by default: for either role). Where none is, the rule planner
        and the template synthesizer stay in place."""
        if role is None:
            return bool(self.model or self.planner_model or self.synthesizer_model)
        return bool((self.planner_model if role == "planner" else self.synthesizer_model) or self.model)

    def fallback(self) -> ModelSettings | None:
        """The fallback model's settings (its endpoint and key, else the primary's; the same call options),
        or None when no fallback model is set."""
        if not self.fallback_model:
            return None
        return self.model_copy(
            update={
                "base_url": self.fallback_base_url or self.base_url,
                "api_key": self.fallback_api_key or self.api_key,
                "model": self.fallback_model,
                "planner_model": None,
                "synthesizer_model": None,
                "fallback_model": None,
            }
        )

    def role_model(self, role: Literal["planner", "synthesizer"]) -> str:
        """The model of ``role``: its override, else ``model``."""
        model = (self.planner_model if role == "planner" else self.synthesizer_model) or self.model
        if not model:
            variable = "AGENT_PLANNER_MODEL" if role == "planner" else "AGENT_SYNTHESIZER_MODEL"
            raise ValueError(f"no model for the {role}: set AGENT_MODEL or {variable}")
        return model

    def client(self) -> AsyncOpenAI:
        """A client for this endpoint. Its own retries are off: the activity's retry policy owns retries."""
        return AsyncOpenAI(
            api_key=self.api_key.get_secret_value() if self.api_key else PLACEHOLDER_API_KEY,
            base_url=self.base_url,
            timeout=self.timeout_seconds,
            max_retries=0,
        )
