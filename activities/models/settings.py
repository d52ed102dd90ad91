"""Which OpenAI-compatible model to call, and how: ``settings.model`` of the process settings.

Any Chat Completions endpoint works: OpenAI, Azure OpenAI (its ``/openai/v1/`` base URL), vLLM, Ollama,
the llama.cpp server, a LiteLLM proxy. Without ``AGENT_MODEL`` (or a per-role model) nothing is
configured: a pipeline built with ``client.pipeline.build_pipeline`` then needs a planner of its own. The
API key is a ``SecretStr``: it never appears in a repr, a log line or an error message.

Each field declares its environment variable (``validation_alias``), its default, its bounds and its
meaning (``description``); ``client.settings.Settings.from_env`` reads them with every other setting,
and ``docs/configuration.md`` lists them from these declarations. This module imports nothing heavy (the
``openai`` client is imported when a client is made), so reading the settings stays fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal, Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# Servers that ignore authentication (most local ones) still receive a bearer token: the client needs one.
PLACEHOLDER_API_KEY = "no-key"


class ModelSettings(BaseModel):
    """The model endpoint and call options shared by the planner and the synthesizer."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("AGENT_MODEL_BASE_URL", "OPENAI_BASE_URL"),
        description="the OpenAI-compatible endpoint, up to `/v1`",
        json_schema_extra={"default": "the OpenAI API"},
    )
    api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("AGENT_MODEL_API_KEY", "OPENAI_API_KEY"),
        description="required for the OpenAI API itself; never logged or recorded",
    )
    model: str | None = Field(
        default=None,
        validation_alias="AGENT_MODEL",
        description="the model of the planner and the synthesizer (unset: no model)",
    )
    planner_model: str | None = Field(
        default=None,
        validation_alias="AGENT_PLANNER_MODEL",
        description="the planner's model, instead of `AGENT_MODEL`",
        json_schema_extra={"default": "`AGENT_MODEL`"},
    )
    synthesizer_model: str | None = Field(
        default=None,
        validation_alias="AGENT_SYNTHESIZER_MODEL",
        description="the synthesizer's model, instead of `AGENT_MODEL`",
        json_schema_extra={"default": "`AGENT_MODEL`"},
    )
    # Two planning turns (a call and its repair) fit in the plan activity's default 60-s timeout; raise the
    # stage timeouts with this one.
    timeout_seconds: float = Field(
        default=25.0,
        gt=0,
        lt=3600,
        validation_alias="AGENT_MODEL_TIMEOUT_SECONDS",
        description="one HTTP call to the model, connection included",
    )
    max_output_tokens: int = Field(
        default=1024,
        gt=0,
        validation_alias="AGENT_MODEL_MAX_OUTPUT_TOKENS",
        description="tokens per call (capped by what the request's budget has left)",
    )
    temperature: float | None = Field(
        default=None,
        ge=0,
        le=2,
        validation_alias="AGENT_MODEL_TEMPERATURE",
        description="the sampling temperature (some reasoning models refuse any value)",
        json_schema_extra={"default": "not sent"},
    )
    max_tokens_per_request: int | None = Field(
        default=None,
        gt=0,
        validation_alias="AGENT_MODEL_MAX_TOKENS_PER_REQUEST",
        description="tokens one request may spend on model calls",
        json_schema_extra={"default": "no budget"},
    )
    token_limit_parameter: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens",
        validation_alias="AGENT_MODEL_TOKEN_LIMIT_PARAMETER",
        description="the request parameter that caps the output (`max_completion_tokens` for OpenAI's reasoning models)",
    )
    provider: str = Field(
        default="openai",
        validation_alias="AGENT_MODEL_PROVIDER",
        description="`gen_ai.provider.name` on spans and metrics",
    )
    context_window: int | None = Field(
        default=None,
        ge=256,
        le=100_000_000,
        validation_alias="AGENT_MODEL_CONTEXT_WINDOW",
        description="the model's context window in tokens, for prompt budgets and memory caps",
        json_schema_extra={"default": "unknown: nothing is budgeted against it"},
    )
    fallback_model: str | None = Field(
        default=None,
        validation_alias="AGENT_FALLBACK_MODEL",
        description="the model planning and synthesis fall back to when the primary is unavailable after its retries",
        json_schema_extra={"default": "none: no fallback"},
    )
    fallback_base_url: str | None = Field(
        default=None,
        validation_alias="AGENT_FALLBACK_MODEL_BASE_URL",
        description="the fallback model's endpoint, up to `/v1`",
        json_schema_extra={"default": "the primary's"},
    )
    fallback_api_key: SecretStr | None = Field(
        default=None,
        validation_alias="AGENT_FALLBACK_MODEL_API_KEY",
        description="the fallback model's key; never logged or recorded",
        json_schema_extra={"default": "the primary's"},
    )

    @field_validator("base_url", "fallback_base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _key_for_the_openai_api(self) -> Self:
        if self.configured() and self.base_url is None and self.api_key is None:
            raise ValueError(
                "AGENT_MODEL_API_KEY (or OPENAI_API_KEY) is required for the OpenAI API; set it, or AGENT_MODEL_BASE_URL"
            )
        return self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ModelSettings:
        """The model settings of the environment: ``Settings.from_env(env).model`` (kept for compatibility;
        a pipeline factory reads ``settings.model``).

        Raises:
            client.settings.SettingsError: a variable without a valid value (the message names it).
        """
        from client.settings import Settings  # the one loader; imported here, the layer above this one

        return Settings.from_env(env).model

    def configured(self, role: Literal["planner", "synthesizer"] | None = None) -> bool:
        """Whether a model is set for ``role`` (by default: for either role)."""
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
        from openai import AsyncOpenAI

        return AsyncOpenAI(
            api_key=self.api_key.get_secret_value() if self.api_key else PLACEHOLDER_API_KEY,
            base_url=self.base_url,
            timeout=self.timeout_seconds,
            max_retries=0,
        )
