"""The process settings: one typed model, read once from the environment.

:meth:`Settings.from_env` reads every variable the worker, the CLI, the demo and a pipeline factory use,
into :class:`Settings` and its sections — ``settings.model`` (:class:`~activities.models.ModelSettings`),
``settings.memory`` (:class:`~hooks.builtin.MemoryOptions`), ``settings.telemetry``
(:class:`TelemetrySettings`) — and every part reads its own section from it: no part reads the
environment for a setting of its own.

Each variable is declared once, as a pydantic field: its variable is the field's ``validation_alias``
(an ``AliasChoices`` where an alternative is honoured, such as ``OPENAI_API_KEY``), its type and bounds
are the field's, its default the field's (``json_schema_extra={"default": ...}`` says it in words where a
value cannot), and its one-line meaning the field's ``description``. ``docs/configuration.md`` is
generated from these declarations (``python -m client.settings_reference --write docs/configuration.md``), and a
unit test fails when the two differ. Adding a variable is one field in the class of the part that reads
it, then regenerating that file.

Reading: a variable set to blank counts as unset, except a list (blank: the empty list); a relative path
is resolved against the working directory once, when the settings are read. A variable without a valid
value is a :class:`SettingsError` that names it (and shows the value, unless it is a secret); the worker
and the CLI print it on one line and exit 2.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from activities.models.settings import ModelSettings
from hooks.builtin.memory import MemoryOptions
from workflows.models import MAX_CHECKPOINT_EXPIRY_SECONDS

if TYPE_CHECKING:
    from .encryption import Keyring

APP_NAME = "agent-lifecycle"


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where state lives unless ``AGENT_STATE_DIR`` says otherwise: ``$XDG_STATE_HOME/agent-lifecycle``,
    else ``~/.local/state/agent-lifecycle`` (the XDG base directory convention for state)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME", "").strip()
    if base and Path(base).is_absolute():  # the convention ignores a relative XDG_STATE_HOME
        return Path(base) / APP_NAME
    home = env.get("HOME", "").strip()
    return (Path(home) if home else Path.home()) / ".local" / "state" / APP_NAME


def _absolute(value: Path | None) -> Path | None:
    """A path as given, made absolute once (against the working directory at load time)."""
    if value is None:
        return None
    value = value.expanduser()
    return value if value.is_absolute() else Path.cwd() / value


def _comma_separated(value: Any) -> Any:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


# A list read from one variable, comma-separated (``a, b``: ``["a", "b"]``; blank: the empty list).
CommaList = Annotated[list[str], BeforeValidator(_comma_separated)]

EXPORTERS = ("otlp", "console", "none")
OtlpProtocol = Literal["http/protobuf", "grpc"]


def _lowercase(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _exporters(value: Any) -> Any:
    names = [name.lower() for name in _comma_separated(value)] if isinstance(value, str) else value
    if not isinstance(names, list):
        return names
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        hint = " (Temporal's metrics for Prometheus: AGENT_PROMETHEUS_BIND)" if unknown[0] == "prometheus" else ""
        raise ValueError(f"unknown exporter {unknown[0]!r}; use {', '.join(EXPORTERS)}{hint}")
    if "none" in names and len(names) > 1:
        raise ValueError("'none' cannot be listed with other exporters")
    return [name for name in names if name != "none"]


Exporters = Annotated[list[Literal["otlp", "console"]], BeforeValidator(_exporters)]
Protocol = Annotated[OtlpProtocol, BeforeValidator(_lowercase)]


def parse_headers(text: str) -> dict[str, str]:
    """OTLP headers: ``key=value`` pairs, comma-separated, URL-encoded (as OpenTelemetry specifies)."""
    headers = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{item.strip()!r} is not key=value")
        headers[unquote(name.strip()).lower()] = unquote(value.strip())
    return headers


class TelemetrySettings(BaseModel):
    """Where traces and metrics go: OpenTelemetry's standard variables, and Temporal's SDK metrics.

    The OTLP exporters also read OpenTelemetry's own TLS, timeout and compression variables
    (``OTEL_EXPORTER_OTLP_CERTIFICATE``, ``…_TIMEOUT``, ``…_COMPRESSION`` and their per-signal forms), and
    the resource ``OTEL_RESOURCE_ATTRIBUTES``, as the OpenTelemetry SDK documents them.
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    traces_exporter: Exporters = Field(
        default_factory=list,
        validation_alias="OTEL_TRACES_EXPORTER",
        description="where spans go: a list of `otlp`, `console`, or `none`",
        json_schema_extra={"default": "`none`"},
    )
    metrics_exporter: Exporters = Field(
        default_factory=list,
        validation_alias="OTEL_METRICS_EXPORTER",
        description="where metrics go: a list of `otlp`, `console`, or `none` (Prometheus: `AGENT_PROMETHEUS_BIND`)",
        json_schema_extra={"default": "`none`"},
    )
    otlp_protocol: Protocol = Field(
        default="http/protobuf",
        validation_alias="OTEL_EXPORTER_OTLP_PROTOCOL",
        description="the OTLP protocol of both signals",
    )
    otlp_traces_protocol: Protocol | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        description="the OTLP protocol of traces, instead of the general one",
        json_schema_extra={"default": "`OTEL_EXPORTER_OTLP_PROTOCOL`"},
    )
    otlp_metrics_protocol: Protocol | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        description="the OTLP protocol of metrics, instead of the general one",
        json_schema_extra={"default": "`OTEL_EXPORTER_OTLP_PROTOCOL`"},
    )
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="the collector's base URL (over HTTP `/v1/traces` and `/v1/metrics` are appended)",
        json_schema_extra={"default": "`http://localhost:4318` (gRPC: `:4317`)"},
    )
    otlp_traces_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        description="the traces endpoint, used as it is",
    )
    otlp_metrics_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        description="the metrics endpoint, used as it is (also for Temporal's metrics)",
    )
    otlp_headers: SecretStr | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_HEADERS",
        description="`key=value` pairs, comma-separated, URL-encoded, sent with every export",
    )
    otlp_traces_headers: SecretStr | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        description="the headers of trace exports, instead of the general ones",
    )
    otlp_metrics_headers: SecretStr | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        description="the headers of metric exports (also Temporal's), instead of the general ones",
    )
    metric_export_interval_ms: int = Field(
        default=60_000,
        gt=0,
        validation_alias="OTEL_METRIC_EXPORT_INTERVAL",
        description="milliseconds between metric exports (also of Temporal's metrics over OTLP)",
    )
    otlp_metrics_temporality: Annotated[Literal["cumulative", "delta", "lowmemory"], BeforeValidator(_lowercase)] = (
        Field(
            default="cumulative",
            validation_alias="OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            description="the temporality of exported metrics (Temporal's: `delta`, else cumulative)",
        )
    )
    service_name: str | None = Field(
        default=None,
        validation_alias="OTEL_SERVICE_NAME",
        description="`service.name` of the resource",
        json_schema_extra={"default": "the process's own (`agent-lifecycle-worker`, …)"},
    )
    prometheus_bind: str | None = Field(
        default=None,
        validation_alias="AGENT_PROMETHEUS_BIND",
        description="`host:port` where a worker serves Temporal's SDK metrics for Prometheus at `/metrics`",
    )

    @field_validator("otlp_endpoint", "otlp_traces_endpoint", "otlp_metrics_endpoint")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is not None and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("otlp_headers", "otlp_traces_headers", "otlp_metrics_headers")
    @classmethod
    def _headers(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parse_headers(value.get_secret_value())
        return value

    @field_validator("prometheus_bind")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None:
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("not host:port (e.g. 0.0.0.0:9464)")
        return value

    @property
    def exports(self) -> bool:
        """Whether this process sends spans or metrics anywhere (a process that sends neither needs no
        tracer or meter of its own)."""
        return bool(self.traces_exporter or self.metrics_exporter)

    def exporters(self, signal: Literal["traces", "metrics"]) -> list[Literal["otlp", "console"]]:
        return self.traces_exporter if signal == "traces" else self.metrics_exporter

    def protocol(self, signal: Literal["traces", "metrics"]) -> OtlpProtocol:
        own = self.otlp_traces_protocol if signal == "traces" else self.otlp_metrics_protocol
        return own or self.otlp_protocol

    def endpoint(self, signal: Literal["traces", "metrics"]) -> str:
        """Where OTLP exports of ``signal`` go, as the OpenTelemetry SDK reads it: the per-signal endpoint
        as it is, else the base endpoint (over HTTP with ``/v1/<signal>`` appended), else the collector on
        localhost."""
        own = self.otlp_traces_endpoint if signal == "traces" else self.otlp_metrics_endpoint
        if own:
            return own
        protocol = self.protocol(signal)
        base = self.otlp_endpoint or (
            "http://localhost:4318" if protocol == "http/protobuf" else "http://localhost:4317"
        )
        return base.rstrip("/") + f"/v1/{signal}" if protocol == "http/protobuf" else base

    def headers(self, signal: Literal["traces", "metrics"]) -> dict[str, str]:
        own = self.otlp_traces_headers if signal == "traces" else self.otlp_metrics_headers
        chosen = own or self.otlp_headers
        return parse_headers(chosen.get_secret_value()) if chosen else {}


def _readable_file(value: Path | None) -> Path | None:
    """A path made absolute (see ``_absolute``) that names a readable file."""
    value = _absolute(value)
    if value is not None and not value.is_file():
        raise ValueError(f"{value} is not a file")
    if value is not None and not os.access(value, os.R_OK):
        raise ValueError(f"{value} is not readable")
    return value


class TemporalSecurity(BaseModel):
    """How processes authenticate to the Temporal cluster and encrypt the connection: TLS (the server's
    CA, a client certificate for mutual TLS, the server name to verify) and an API key, as Temporal Cloud
    and a self-hosted mTLS cluster need them. The variables are the ones the ``temporal`` CLI reads, so one
    environment serves both. The worker, ``AgentClient`` and the CLI connect through
    ``client.connect_options``."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    tls: bool | None = Field(
        default=None,
        validation_alias="TEMPORAL_TLS",
        description="connect over TLS (`false` refuses the other TLS settings)",
        json_schema_extra={"default": "on when any TLS setting or an API key is set"},
    )
    server_ca_cert: Path | None = Field(
        default=None,
        validation_alias="TEMPORAL_TLS_SERVER_CA_CERT_PATH",
        description="the CA certificate (PEM) the server's certificate must chain to",
        json_schema_extra={"default": "the system's roots"},
    )
    client_cert: Path | None = Field(
        default=None,
        validation_alias="TEMPORAL_TLS_CLIENT_CERT_PATH",
        description="the client certificate (PEM) for mutual TLS, with `TEMPORAL_TLS_CLIENT_KEY_PATH`",
    )
    client_key: Path | None = Field(
        default=None,
        validation_alias="TEMPORAL_TLS_CLIENT_KEY_PATH",
        description="the client certificate's private key (PEM)",
    )
    server_name: str | None = Field(
        default=None,
        validation_alias="TEMPORAL_TLS_SERVER_NAME",
        description="the name the server's certificate must carry, when it is not the address's host",
    )
    api_key: SecretStr | None = Field(
        default=None,
        validation_alias="TEMPORAL_API_KEY",
        description="an API key sent with every call (`Authorization: Bearer …`; Temporal Cloud)",
    )

    @field_validator("server_ca_cert", "client_cert", "client_key")
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        return _readable_file(value)

    @model_validator(mode="after")
    def _consistent(self) -> TemporalSecurity:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError(
                "TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH go together: set both or neither"
            )
        files = self.server_ca_cert or self.client_cert or self.server_name
        if self.tls is False and files:
            raise ValueError("TEMPORAL_TLS is false, yet a TLS certificate, key or server name is set")
        return self

    @property
    def uses_tls(self) -> bool:
        if self.tls is not None:
            return self.tls
        return bool(self.server_ca_cert or self.client_cert or self.server_name or self.api_key)


class DataProtection(BaseModel):
    """Payload encryption at rest (``client.encryption``) and what the Temporal UI shows without a codec."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    keys_file: Path | None = Field(
        default=None,
        validation_alias="AGENT_ENCRYPTION_KEYS_FILE",
        description="turns payload encryption on: a file of `<key id>=<base64 32-byte key>` lines, the first "
        "encrypting, every one decrypting",
        json_schema_extra={"default": "unset: payloads are not encrypted"},
    )
    keys: SecretStr | None = Field(
        default=None,
        validation_alias="AGENT_ENCRYPTION_KEYS",
        description="the keys inline instead of a file: `<key id>=<base64 key>` entries, comma-separated",
    )
    ui_shows_text: bool = Field(
        default=False,
        validation_alias="AGENT_UI_SHOWS_TEXT",
        description="with encryption on, let the summaries and details the Temporal UI shows without a codec "
        "carry excerpts of the request, tool arguments and the answer (masked)",
    )

    @field_validator("keys_file")
    @classmethod
    def _keys_file(cls, value: Path | None) -> Path | None:
        value = _readable_file(value)
        if value is not None:
            from .encryption import Keyring

            Keyring.from_file(value)  # a bad line is a settings error, named (never the key)
        return value

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            from .encryption import Keyring

            Keyring.parse(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DataProtection:
        if self.keys_file is not None and self.keys is not None:
            raise ValueError("set AGENT_ENCRYPTION_KEYS_FILE or AGENT_ENCRYPTION_KEYS, not both")
        return self

    @property
    def encrypts(self) -> bool:
        return self.keys_file is not None or self.keys is not None

    @property
    def shows_text(self) -> bool:
        """Whether the UI's summaries and details may carry request text: always without encryption (the
        payloads are readable anyway), with it only when ``AGENT_UI_SHOWS_TEXT`` says so."""
        return not self.encrypts or self.ui_shows_text

    def keyring(self) -> Keyring | None:
        from .encryption import Keyring

        if self.keys_file is not None:
            return Keyring.from_file(self.keys_file)
        if self.keys is not None:
            return Keyring.parse(self.keys.get_secret_value())
        return None


def _strong_token(token: str) -> str:
    if len(token.strip()) < 32:
        raise ValueError("too short: use at least 32 characters (e.g. `openssl rand -base64 32`)")
    return token.strip()


def _origin(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"{value!r} is not an origin (scheme://host[:port], e.g. https://temporal.example.com)")
    return f"{parts.scheme}://{parts.netloc}".lower()


class CodecServerSettings(BaseModel):
    """``agent-lifecycle codec-server``: who may call it (a bearer token: a shared secret, or a JWT checked
    against a JWKS), from which Web UI origin, under which host names, and how large a request may be."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    token: SecretStr | None = Field(
        default=None,
        validation_alias="AGENT_CODEC_TOKEN",
        description="a shared secret callers send as `Authorization: Bearer …` (at least 32 characters)",
    )
    token_file: Path | None = Field(
        default=None,
        validation_alias="AGENT_CODEC_TOKEN_FILE",
        description="the shared token read from a file instead (a mounted secret)",
    )
    jwks_file: Path | None = Field(
        default=None,
        validation_alias="AGENT_CODEC_JWKS_FILE",
        description="a JWKS (JSON) whose keys sign the JWTs callers may send instead (RS256, ES256, EdDSA), "
        "e.g. the Web UI's users' access tokens",
    )
    jwt_audience: str | None = Field(
        default=None,
        validation_alias="AGENT_CODEC_JWT_AUDIENCE",
        description="the `aud` a JWT must carry (required with `AGENT_CODEC_JWKS_FILE`)",
    )
    jwt_issuer: str | None = Field(
        default=None,
        validation_alias="AGENT_CODEC_JWT_ISSUER",
        description="the `iss` a JWT must carry (required with `AGENT_CODEC_JWKS_FILE`)",
    )
    allowed_origins: CommaList = Field(
        default_factory=list,
        validation_alias="AGENT_CODEC_ALLOWED_ORIGINS",
        description="the Web UI origins a browser may call it from (exact origins; no wildcard)",
        json_schema_extra={"default": "none: no browser may"},
    )
    allowed_hosts: CommaList = Field(
        default_factory=list,
        validation_alias="AGENT_CODEC_ALLOWED_HOSTS",
        description="the names (`host` or `host:port`) a request's `Host` header may carry",
        json_schema_extra={"default": "the loopback names, when it listens on loopback"},
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        validation_alias="AGENT_CODEC_MAX_BODY_BYTES",
        description="the largest request body it reads (larger: 413)",
    )

    @field_validator("token")
    @classmethod
    def _strong(cls, value: SecretStr | None) -> SecretStr | None:
        return SecretStr(_strong_token(value.get_secret_value())) if value is not None else None

    @field_validator("token_file")
    @classmethod
    def _token_file(cls, value: Path | None) -> Path | None:
        value = _readable_file(value)
        if value is not None:
            _strong_token(value.read_text())
        return value

    def shared_token(self) -> str | None:
        """The shared token: ``AGENT_CODEC_TOKEN``, else the content of ``AGENT_CODEC_TOKEN_FILE``."""
        if self.token is not None:
            return self.token.get_secret_value()
        return self.token_file.read_text().strip() if self.token_file is not None else None

    @field_validator("jwks_file")
    @classmethod
    def _jwks(cls, value: Path | None) -> Path | None:
        value = _readable_file(value)
        if value is not None:
            from .codec_auth import load_jwks

            load_jwks(value)
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        if "*" in value:
            raise ValueError("no wildcard: name the Web UI's origin")
        return [_origin(origin) for origin in value]

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            if not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?", host):
                raise ValueError(f"{host!r} is not a host name or host:port")
        return [host.lower() for host in value]

    @model_validator(mode="after")
    def _jwt_claims(self) -> CodecServerSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set AGENT_CODEC_TOKEN or AGENT_CODEC_TOKEN_FILE, not both")
        if self.jwks_file is not None and not (self.jwt_audience and self.jwt_issuer):
            raise ValueError(
                "AGENT_CODEC_JWKS_FILE needs AGENT_CODEC_JWT_AUDIENCE and AGENT_CODEC_JWT_ISSUER: a token the "
                "identity provider issued for another application must not pass"
            )
        return self


class Settings(BaseModel):
    """Where to find Temporal, where state lives, which pipeline the worker runs and how it is sized, with
    the sections of the parts that have settings of their own (``model``, ``memory``, ``telemetry``), and
    of the deployment's protection (``temporal_security``, ``protection``, ``codec_server``).

    Read it with :meth:`from_env`; ``docs/configuration.md`` lists every variable.
    """

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    temporal_address: str = Field(
        default="localhost:7233",
        validation_alias="TEMPORAL_ADDRESS",
        description="the Temporal server's `host:port` (`--dev` starts the embedded server there)",
    )
    temporal_namespace: str = Field(
        default="default", validation_alias="TEMPORAL_NAMESPACE", description="the Temporal namespace"
    )
    task_queue: str = Field(
        default="agent-requests",
        validation_alias="TEMPORAL_TASK_QUEUE",
        description="the task queue the worker polls and clients start requests on",
    )
    ui_port: int = Field(
        default=8233,
        ge=1,
        le=65535,
        validation_alias="TEMPORAL_UI_PORT",
        description="the embedded dev server's UI port",
    )
    state_dir: Path = Field(
        default_factory=default_state_dir,
        validation_alias="AGENT_STATE_DIR",
        description="the SQLite stores, payloads, audit files and the dev server's database (a relative path is "
        "resolved against the directory the process starts in)",
        json_schema_extra={"default": "`$XDG_STATE_HOME/agent-lifecycle`, else `~/.local/state/agent-lifecycle`"},
    )
    execution_store: Path | None = Field(
        default=None,
        validation_alias="AGENT_EXECUTION_STORE",
        description="the execution records' SQLite file",
        json_schema_extra={"default": "`$AGENT_STATE_DIR/executions.sqlite3`"},
    )
    other_variables: CommaList = Field(
        default_factory=list,
        validation_alias="AGENT_OTHER_VARIABLES",
        description="`AGENT_*` variables the environment holds for another program (a CI agent's, say), which the "
        "settings leave alone; any other unknown `AGENT_*` variable is an error naming the closest setting",
        json_schema_extra={"default": "none"},
    )
    pipeline_factory: str | None = Field(
        default=None,
        validation_alias="AGENT_PIPELINE",
        description="the pipeline factory the worker runs, `module:function` (the demo's: `demo.pipeline:build_activities`)",
        json_schema_extra={"default": "none: a worker without one refuses to start"},
    )
    # Lists for a pipeline's allow-list hooks (None: the pipeline's own default; the demo's is its tools).
    allowed_operations: CommaList | None = Field(
        default=None,
        validation_alias="AGENT_ALLOWED_OPERATIONS",
        description="tool keys (`namespace/agent/capability`) for a pipeline's `AllowedOperationsHook` (the demo's "
        "required gate)",
        json_schema_extra={"default": "the pipeline's own"},
    )
    tool_allow_list: CommaList | None = Field(
        default=None,
        validation_alias="AGENT_TOOL_ALLOW_LIST",
        description="tools for a pipeline's `allow_list` plugin (the demo's): keys, or `agent/capability` names",
        json_schema_extra={"default": "the pipeline's own"},
    )
    record_retention_days: float = Field(
        default=7.0,
        gt=0,
        validation_alias="AGENT_RECORD_RETENTION_DAYS",
        description="how long successful records are kept",
    )
    error_retention_days: float = Field(
        default=30.0,
        gt=0,
        validation_alias="AGENT_ERROR_RETENTION_DAYS",
        description="how long failed records are kept",
    )
    cache_ttl_seconds: float = Field(
        default=300.0,
        gt=0,
        validation_alias="AGENT_CACHE_TTL_SECONDS",
        description="how long a pipeline's `ResponseCacheHook` (the demo's) serves a cached answer",
    )
    reviewers: CommaList = Field(
        default_factory=list,
        validation_alias="AGENT_REVIEWERS",
        description="who may decide checkpoints, comma-separated (verified as `AGENT_REVIEW_VERIFICATION` says)",
        json_schema_extra={"default": "any reviewer the verification accepts"},
    )
    review_verification: Literal["signed", "server-identity", "none"] | None = Field(
        default=None,
        validation_alias="AGENT_REVIEW_VERIFICATION",
        description="how a worker knows who decided a checkpoint: `signed` (a decision signed with a key of "
        "`AGENT_REVIEWER_KEYS`), `server-identity` (the identity the Temporal server's authorizer verified), or "
        "`none` (a typed name: development only)",
        json_schema_extra={
            "default": "`signed` with `AGENT_REVIEWER_KEYS`, else `none` (refused with `AGENT_REVIEWERS`)"
        },
    )
    reviewer_keys: Path | None = Field(
        default=None,
        validation_alias="AGENT_REVIEWER_KEYS",
        description="the worker's trusted reviewer and issuer public keys (JSON; see docs/review.md)",
    )
    reviewer_key: Path | None = Field(
        default=None,
        validation_alias="AGENT_REVIEWER_KEY",
        description="the reviewer's own private key (PEM, mode 0600) the CLI and `AgentClient` sign decisions with",
    )
    allow_self_approval: bool = Field(
        default=False,
        validation_alias="AGENT_ALLOW_SELF_APPROVAL",
        description="let a request's requester approve its own checkpoints (four-eyes off)",
    )
    principal: str | None = Field(
        default=None,
        validation_alias="AGENT_PRINCIPAL",
        max_length=128,
        description="who the CLI and `AgentClient` start requests for (`requested_by`), as the service authenticated them",
    )
    temporal_identity: str | None = Field(
        default=None,
        validation_alias="TEMPORAL_IDENTITY",
        description="the identity this process presents to Temporal (what `server-identity` review verification reads)",
        json_schema_extra={"default": "`pid@host`"},
    )
    checkpoint_expiry_seconds: float = Field(
        default=24 * 3600.0,
        gt=0,
        le=MAX_CHECKPOINT_EXPIRY_SECONDS,
        validation_alias="AGENT_CHECKPOINT_EXPIRY_SECONDS",
        description="how long a checkpoint waits for a reviewer before it fails closed",
    )
    hooks_file: Path | None = Field(
        default=None, validation_alias="AGENT_HOOKS_FILE", description="declared hooks (JSON or TOML)"
    )
    hook_store: Path | None = Field(
        default=None,
        validation_alias="AGENT_HOOK_STORE",
        description="declared hooks' audit rows, breakers, prompt cache and budgets (ignored with a database)",
        json_schema_extra={"default": "`$AGENT_STATE_DIR/hooks.sqlite3`"},
    )
    hook_secret_key: SecretStr | None = Field(
        default=None,
        validation_alias="AGENT_HOOK_SECRET_KEY",
        description="base64 32-byte AES-256-GCM key: header secrets of hooks and MCP servers, audit error details",
    )
    hook_allow_loopback: bool = Field(
        default=False,
        validation_alias="AGENT_HOOK_ALLOW_LOOPBACK",
        description="let HTTP and prompt hooks and the reviewers' webhook reach loopback (tests only)",
    )
    hook_edition: Literal["lite", "standard"] = Field(
        default="lite",
        validation_alias="AGENT_HOOK_EDITION",
        description="the declared hooks' edition: `lite` allows every handler; `standard` refuses `command` handlers at load and at dispatch",
    )
    hook_chain_budget_seconds: float = Field(
        default=10.0,
        gt=0,
        le=10.0,
        validation_alias="AGENT_HOOK_CHAIN_BUDGET_SECONDS",
        description="the time the declared hooks of one blocking event share at each occurrence (at most 10 s)",
    )
    # Large payloads by reference (see storage.payloads): the store file, or "off" (with database_url the
    # store is in the database).
    payload_store: str | None = Field(
        default=None,
        validation_alias="AGENT_PAYLOAD_STORE",
        description="where large activity payloads are kept by reference (a file); `off` keeps them inline",
        json_schema_extra={"default": "`$AGENT_STATE_DIR/payloads.sqlite3`"},
    )
    # Run the workflows in Temporal's sandbox (see worker.build_worker for why the default is not to).
    workflow_sandbox: bool = Field(
        default=False, validation_alias="AGENT_WORKFLOW_SANDBOX", description="run the workflows in Temporal's sandbox"
    )
    database_url: SecretStr | None = Field(
        default=None,
        validation_alias="AGENT_DATABASE_URL",
        description="`postgresql://…`: every store on PostgreSQL, shared by workers on several machines",
        json_schema_extra={"default": "none: SQLite files"},
    )
    database_pool_size: int = Field(
        default=10,
        ge=1,
        le=1000,
        validation_alias="AGENT_DATABASE_POOL_SIZE",
        description="connections per worker process",
    )
    # A secret: a Slack webhook URL is its own credential.
    review_webhook: SecretStr | None = Field(
        default=None,
        validation_alias="AGENT_REVIEW_WEBHOOK",
        description="an `http(s)://` URL told of every checkpoint that opens (Slack-compatible)",
        json_schema_extra={"default": "none: nobody is told"},
    )
    mcp_servers_file: Path | None = Field(
        default=None,
        validation_alias="AGENT_MCP_SERVERS",
        description="the MCP servers whose tools the worker offers (JSON or TOML)",
    )
    mcp_allow_loopback: bool = Field(
        default=False,
        validation_alias="AGENT_MCP_ALLOW_LOOPBACK",
        description="let streamable-HTTP MCP servers be on loopback (tests only)",
    )
    temporal_wait_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        validation_alias="AGENT_TEMPORAL_WAIT_SECONDS",
        description="how long a starting process waits for a Temporal server it cannot reach yet",
    )
    conversation_idle_seconds: float = Field(
        default=900.0,
        gt=0,
        le=31_536_000,
        validation_alias="AGENT_CONVERSATION_IDLE_SECONDS",
        description="how long a conversation with no turn queued stays running; the next turn starts it again",
    )
    conversation_turns_per_run: int = Field(
        default=100,
        ge=1,
        le=10_000,
        validation_alias="AGENT_CONVERSATION_TURNS_PER_RUN",
        description="turns a conversation runs before it continues as new (keeps its history bounded)",
    )
    stage_listing_delay_seconds: float = Field(
        default=2.0,
        ge=0,
        le=3600,
        validation_alias="AGENT_STAGE_LISTING_DELAY_SECONDS",
        description="how long a request waits in a stage before `AgentLifecycleStage` lists it (`0`: at once, "
        "a visibility write per stage; a checkpoint and its end are always listed at once, and a request started "
        "by `AgentClient` is listed from its start)",
    )
    # One worker's capacity. Nothing holds a slot for a request's whole life (waiting is timers, signals and
    # updates), so requests beyond these numbers queue on the server and are served as slots free up.
    worker_max_activities: int = Field(
        default=100,
        ge=1,
        le=10_000,
        validation_alias="AGENT_WORKER_MAX_ACTIVITIES",
        description="activities running at once (hooks run as activities, tools, planning, synthesis)",
    )
    worker_max_local_activities: int = Field(
        default=100,
        ge=1,
        le=10_000,
        validation_alias="AGENT_WORKER_MAX_LOCAL_ACTIVITIES",
        description="local activities running at once (in-process hooks, the record)",
    )
    worker_max_workflow_tasks: int = Field(
        default=100,
        ge=2,
        le=10_000,
        validation_alias="AGENT_WORKER_MAX_WORKFLOW_TASKS",
        description="workflow tasks at once",
    )
    worker_workflow_pollers: int = Field(
        default=5,
        ge=2,
        le=100,
        validation_alias="AGENT_WORKER_WORKFLOW_POLLERS",
        description="pollers of workflow tasks",
    )
    worker_activity_pollers: int = Field(
        default=5,
        ge=1,
        le=100,
        validation_alias="AGENT_WORKER_ACTIVITY_POLLERS",
        description="pollers of activity tasks",
    )
    worker_max_cached_workflows: int = Field(
        default=2000,
        ge=0,
        le=100_000,
        validation_alias="AGENT_WORKER_MAX_CACHED_WORKFLOWS",
        description="workflows kept in memory between their tasks (one evicted is replayed when it next runs)",
    )
    worker_sticky_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        le=60,
        validation_alias="AGENT_WORKER_STICKY_TIMEOUT_SECONDS",
        description="how long a workflow task waits for the worker that has it cached before any worker may "
        "take it (after a crash, the dead worker's requests resume that much later)",
    )
    worker_replay_batches: int = Field(
        default=2,
        ge=1,
        le=64,
        validation_alias="AGENT_WORKER_REPLAY_BATCHES",
        description="policy-replay batches one worker runs at once, on their own task queue (CPU work: a "
        "replay spreads over the workers)",
    )
    worker_threads: int = Field(
        default=64,
        ge=1,
        le=1024,
        validation_alias="AGENT_WORKER_THREADS",
        description="threads for blocking work: plain `def` hook methods and the stores' synchronous side",
    )
    model: ModelSettings = Field(default_factory=ModelSettings, description="the model (`ModelSettings`)")
    memory: MemoryOptions = Field(default_factory=MemoryOptions, description="the memory hooks (`MemoryOptions`)")
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings, description="traces and metrics")
    temporal_security: TemporalSecurity = Field(
        default_factory=TemporalSecurity, description="TLS and the API key to the Temporal cluster"
    )
    protection: DataProtection = Field(
        default_factory=DataProtection, description="payload encryption and what the UI shows without a codec"
    )
    codec_server: CodecServerSettings = Field(default_factory=CodecServerSettings, description="the codec server")

    @field_validator(
        "state_dir", "execution_store", "hook_store", "hooks_file", "mcp_servers_file", "reviewer_keys", "reviewer_key"
    )
    @classmethod
    def _resolved(cls, value: Path | None) -> Path | None:
        return _absolute(value)

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value

    @field_validator("review_webhook")
    @classmethod
    def _webhook_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        parsed = urlsplit(value.get_secret_value().strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        try:
            parsed.port  # noqa: B018 - a port that does not parse raises here
        except ValueError as err:
            raise ValueError(f"bad port: {err}") from None
        return SecretStr(value.get_secret_value().strip())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """The settings ``env`` (the process environment by default) holds, with ``overrides`` (by field
        name) on top.

        Raises:
            SettingsError: variables without a valid value, each named (secrets are never shown).
        """
        env = os.environ if env is None else env
        values = environment_values(cls, env)
        unknown = unknown_variables(cls, env)
        if unknown:
            raise SettingsError(unknown)
        if "AGENT_STATE_DIR" not in values and "state_dir" not in overrides:
            values["state_dir"] = default_state_dir(env)
        for name in overrides:  # an override replaces what the environment says of its field
            info = cls.model_fields.get(name)
            for variable in variables(info) if info is not None else ():
                values.pop(variable, None)
        try:
            settings = cls.model_validate({**values, **overrides})
        except ValidationError as err:
            raise SettingsError.from_validation(cls, err, env) from None
        if "AGENT_STATE_DIR" not in values and "state_dir" not in overrides:
            settings.__pydantic_fields_set__.discard("state_dir")  # the default, not a choice
        return settings

    def worker_options(self) -> dict[str, Any]:
        """The ``temporalio.worker.Worker`` options these settings size."""
        from temporalio.worker import PollerBehaviorSimpleMaximum  # only a worker needs it (the CLI starts faster)

        return {
            "max_concurrent_activities": self.worker_max_activities,
            "max_concurrent_local_activities": self.worker_max_local_activities,
            "max_concurrent_workflow_tasks": self.worker_max_workflow_tasks,
            "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(self.worker_workflow_pollers),
            "activity_task_poller_behavior": PollerBehaviorSimpleMaximum(self.worker_activity_pollers),
            "max_cached_workflows": self.worker_max_cached_workflows,
            "sticky_queue_schedule_to_start_timeout": timedelta(seconds=self.worker_sticky_timeout_seconds),
        }

    @property
    def hook_store_path(self) -> Path:
        return self.hook_store or self.state_dir / "hooks.sqlite3"

    @property
    def payload_store_path(self) -> Path | None:
        if self.payload_store == "off":
            return None
        return _absolute(Path(self.payload_store)) if self.payload_store else self.state_dir / "payloads.sqlite3"

    @property
    def execution_store_path(self) -> Path:
        return self.execution_store or self.state_dir / "executions.sqlite3"

    @property
    def ui_url(self) -> str:
        host = self.temporal_address.rsplit(":", 1)[0] or "localhost"
        return f"http://{host}:{self.ui_port}/namespaces/{self.temporal_namespace}"

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable that sets ``field`` (for error messages)."""
        info = cls.model_fields.get(field)
        names = variables(info) if info is not None else []
        return names[0] if names else field


# --------------------------------------------------------------------------------------------------
# The loader: every declared variable, read once
# --------------------------------------------------------------------------------------------------


class SettingsError(ValueError):
    """Variables that hold no valid value. ``problems`` pairs each variable (or, for a rule over several
    variables, an empty string) with what is wrong; the message is one line naming each."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{variable}: {problem}" if variable else problem for variable, problem in problems))

    @property
    def variables(self) -> list[str]:
        return [variable for variable, _ in self.problems if variable]

    @classmethod
    def from_validation(cls, model: type[BaseModel], err: ValidationError, env: Mapping[str, str]) -> SettingsError:
        problems = []
        for error in err.errors(include_url=False):
            variable, secret = _variable_at(model, error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            value = env.get(variable) if variable and not secret else None
            if isinstance(value, str) and repr(value.strip()) not in message:
                message += f" (got {value.strip()!r})"
            problems.append((variable, message))
        return cls(problems)


# ``AGENT_*`` variables read by something other than the settings: docker-compose.yml's substitution of the
# codec server's public URL, the fault-injection benchmark pipeline, and the test suite's worker pipelines.
READ_ELSEWHERE = frozenset(
    {
        "AGENT_CODEC_PUBLIC_URL",
        "AGENT_FAULT_DIR",
        "AGENT_FAULT_DELAY_SECONDS",
        "AGENT_TEST_CRASHES",
        "AGENT_TEST_FULL_SCALE",
        "AGENT_TEST_GATE_ATTEMPTS",
        "AGENT_TEST_GATE_FAILURES",
        "AGENT_TEST_GATE_OPTION",
        "AGENT_TEST_PLAN",
        "AGENT_TEST_TOOL_SECONDS",
        "AGENT_TEST_WORKER_LOSSES",
    }
)


def unknown_variables(model: type[BaseModel], env: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each ``AGENT_*`` variable of ``env`` that no setting declares, with the fix: a misspelt setting is
    otherwise silently ignored (a reviewer list that allows anyone, a model endpoint left at its default).
    ``AGENT_OTHER_VARIABLES`` names those that belong to another program."""
    known = {variable for variable, _ in declared(model)} | READ_ELSEWHERE
    others = set(_comma_separated(env.get("AGENT_OTHER_VARIABLES", "")))
    problems = []
    for name in sorted(env):
        if not name.startswith("AGENT_") or name in known or name in others:
            continue
        closest = difflib.get_close_matches(name, sorted(known - READ_ELSEWHERE), n=1, cutoff=0.75)
        fix = f"did you mean {closest[0]}?" if closest else "docs/configuration.md lists the settings"
        problems.append((name, f"not a setting; {fix} (another program's variable: list it in AGENT_OTHER_VARIABLES)"))
    return problems


def _variable_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[str, bool]:
    """The variable an error's location names (its first variable where the location is a field name),
    and whether it holds a secret; ("", False) for a rule over a whole model."""
    for part in loc:
        for name, info in model.model_fields.items():
            if part != name and part not in variables(info):
                continue
            nested = section(info)
            if nested is not None:
                model = nested
                break
            names = variables(info)
            return (str(part) if part in names else names[0] if names else name), _is_secret(info.annotation)
        else:
            break
    return "", False


def variables(info: FieldInfo) -> list[str]:
    """The environment variables of a field, in the order they are honoured (none: not read from the
    environment)."""
    alias = info.validation_alias
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    return []


def section(info: FieldInfo) -> type[BaseModel] | None:
    """The model of a settings section (a field holding a model of its own variables), or None."""
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def declared(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    """Every variable ``model`` and its sections declare, with its field, in declaration order."""
    for info in model.model_fields.values():
        nested = section(info)
        if nested is not None:
            yield from declared(nested)
            continue
        for variable in variables(info):
            yield variable, info


def environment_values(model: type[BaseModel], env: Mapping[str, str]) -> dict[str, Any]:
    """What ``env`` sets of ``model``'s variables, keyed by variable (by field for a section), ready for
    ``model_validate``. A blank variable is unset, except a list (the empty list); of a field's
    alternatives the first set one wins."""
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        nested = section(info)
        if nested is not None:
            found = environment_values(nested, env)
            if found:
                values[name] = found
            continue
        for variable in variables(info):
            raw = env.get(variable)
            if raw is not None and (raw.strip() or _is_list(info.annotation)):
                values[variable] = raw.strip()
                break
    return values


def _parts(annotation: Any) -> Iterator[Any]:
    yield annotation
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        yield from _parts(typing.get_args(annotation)[0])
    elif origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _parts(arg)


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(part) is list for part in _parts(annotation))


def _is_secret(annotation: Any) -> bool:
    return any(part is SecretStr for part in _parts(annotation))
