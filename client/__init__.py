"""Wiring for processes that talk to Temporal: settings, the client, the embedded dev server, the CLI.

What each function needs is imported when it is called, so a process imports only what it uses: the CLI
answers ``--help`` without loading the SDK, and a client never loads the model or store libraries.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.converter import DataConverter

    from activities.review_webhook import ReviewWebhook
    from storage.executions import ExecutionStore
    from storage.postgres import Database
    from storage.responses import ResponseCacheStore

    from .settings import Settings

__all__ = ["Settings", "TemporalUnreachable", "connect", "connect_options", "connect_when_reachable", "exit_process"]


def __getattr__(name: str) -> Any:
    if name == "Settings":  # loaded on first use: ``--help`` reads no settings
        from .settings import Settings

        return Settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TemporalUnreachable(RuntimeError):
    """No Temporal server answers at the address the settings name; the message says how to start one."""

    def __init__(self, address: str, detail: str = "") -> None:
        self.address, self.detail = address, detail
        super().__init__(
            f"no Temporal server at {address}; start one with `python worker.py --dev` (or set TEMPORAL_ADDRESS)"
        )


def unreachable(err: BaseException) -> bool:
    """Whether a connection error says nothing answered (refused, unresolvable, timed out), as the SDK
    raises it (a ``RuntimeError`` with the transport's text)."""
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        sign in text for sign in ("tcp connect error", "dns error", "ConnectionRefused", "timed out")
    )


def exit_process(code: int) -> NoReturn:
    """Flush and exit without interpreter finalization, during which the SDK's native threads can abort
    a process that used a client (temporalio/sdk-python#300) and turn a success into exit code -6."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def process_data_converter(settings: Settings) -> DataConverter:
    """The project's data converter with this deployment's payload store (large payloads by reference):
    in the database with ``AGENT_DATABASE_URL`` (every machine reads what any other wrote), else the
    SQLite file; none with ``AGENT_PAYLOAD_STORE=off``. With ``AGENT_ENCRYPTION_KEYS_FILE`` (or
    ``AGENT_ENCRYPTION_KEYS``) every payload is encrypted before it leaves the process — the ones kept in
    the payload store too — and failures keep their messages encrypted (``client.encryption``)."""
    from storage.payloads import PayloadStore, SQLitePayloadStore, external_storage
    from workflows.converter import EncryptingFailureConverter, data_converter

    converter = data_converter
    keyring = settings.protection.keyring()
    if keyring is not None:
        from .encryption import EncryptionCodec

        converter = dataclasses.replace(
            converter, payload_codec=EncryptionCodec(keyring), failure_converter_class=EncryptingFailureConverter
        )
    path = settings.payload_store_path
    if path is None:
        return converter
    db = database(settings)
    driver: PayloadStore
    if db is not None:
        from storage.payloads.postgres import PostgresPayloadStore

        driver = PostgresPayloadStore(db)
    else:
        driver = SQLitePayloadStore(path)
    return dataclasses.replace(converter, external_storage=external_storage(driver))


def connect_options(settings: Settings) -> dict[str, Any]:
    """How ``Client.connect`` reaches the cluster ``settings`` name: ``tls`` (a ``TLSConfig`` with the
    server's CA, the client certificate and key, the server name; ``True`` for TLS with the system's
    roots; ``False`` for none) and ``api_key``. Every process of the project connects through this.

    Raises:
        ValueError: a certificate or key file that cannot be read.
    """
    from temporalio.service import TLSConfig

    security = settings.temporal_security

    def read(path: Any, variable: str) -> bytes | None:
        if path is None:
            return None
        try:
            return path.read_bytes()
        except OSError as err:
            raise ValueError(f"{variable}: cannot read {path}: {err.strerror or err}") from None

    tls: TLSConfig | bool = False
    if security.uses_tls:
        ca = read(security.server_ca_cert, "TEMPORAL_TLS_SERVER_CA_CERT_PATH")
        cert = read(security.client_cert, "TEMPORAL_TLS_CLIENT_CERT_PATH")
        key = read(security.client_key, "TEMPORAL_TLS_CLIENT_KEY_PATH")
        if ca is None and cert is None and security.server_name is None:
            tls = True
        else:
            tls = TLSConfig(
                server_root_ca_cert=ca, domain=security.server_name, client_cert=cert, client_private_key=key
            )
    api_key = security.api_key.get_secret_value() if security.api_key is not None else None
    return {"tls": tls, "api_key": api_key}


async def connect(settings: Settings, *, tracing: bool = True) -> Client:
    """A client with the project's data converter (payload store, encryption) on the connection the
    settings describe (TLS, API key: :func:`connect_options`); with ``tracing`` the OTel interceptor.
    Workers built from this client inherit all of it.

    Raises:
        TemporalUnreachable: nothing answers at the settings' address.
    """
    from temporalio.client import Client, Interceptor

    interceptors: list[Interceptor] = []
    if tracing:
        from workflows.tracing import RequestTracing

        # Every request one trace, even one started without a client span (the Temporal CLI, a schedule).
        interceptors.append(RequestTracing())
    try:
        return await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            data_converter=process_data_converter(settings),
            identity=settings.temporal_identity,
            interceptors=interceptors,
            **connect_options(settings),
        )
    except RuntimeError as err:
        if not unreachable(err):
            raise
        raise TemporalUnreachable(settings.temporal_address, str(err)) from None


async def connect_when_reachable(settings: Settings, *, tracing: bool = True) -> Client:
    """:func:`connect`, waiting up to ``settings.temporal_wait_seconds`` for a server that cannot be
    reached yet (restarting, or started after this process). Raises the last connection error after that."""
    from .retrying import retrying

    return await retrying(
        lambda: connect(settings, tracing=tracing),
        transient=lambda err: isinstance(err, RuntimeError),
        within=settings.temporal_wait_seconds,
        waiting=f"Temporal at {settings.temporal_address} is not reachable yet",
    )


_databases: dict[str, Database] = {}


def database(settings: Settings) -> Database | None:
    """This process's pool to ``AGENT_DATABASE_URL`` (one per URL, shared by every store), or None."""
    if settings.database_url is None:
        return None
    from workflows.extras import require

    require("postgres", "AGENT_DATABASE_URL")
    from storage.postgres import Database

    url = settings.database_url.get_secret_value()
    if url not in _databases:
        _databases[url] = Database(url, pool_size=settings.database_pool_size)
    return _databases[url]


async def close_databases() -> None:
    """Close this process's database pools (their threads and connections) and forget them."""
    while _databases:
        _, db = _databases.popitem()
        await db.close()


def response_cache_store(settings: Settings) -> ResponseCacheStore:
    """The response cache the settings name: PostgreSQL with ``AGENT_DATABASE_URL``, else a SQLite file
    in the state directory; its answers sealed where payloads are encrypted."""
    from storage.responses import SQLiteResponseCacheStore

    db = database(settings)
    store: ResponseCacheStore
    if db is not None:
        from storage.responses.postgres import PostgresResponseCacheStore

        store = PostgresResponseCacheStore(db)
    else:
        store = SQLiteResponseCacheStore(settings.state_dir / "response-cache.sqlite3")
    keyring = settings.protection.keyring()
    if keyring is not None:
        from .sealed_stores import SealedResponseCache

        return SealedResponseCache(store, keyring)
    return store


def review_webhook(settings: Settings) -> ReviewWebhook | None:
    """The reviewers' webhook ``AGENT_REVIEW_WEBHOOK`` names (guarded like HTTP hooks: loopback only with
    ``AGENT_HOOK_ALLOW_LOOPBACK``), or None: no checkpoint notifications."""
    if settings.review_webhook is None:
        return None
    from activities.review_webhook import ReviewWebhook

    return ReviewWebhook(settings.review_webhook.get_secret_value(), allow_loopback=settings.hook_allow_loopback)


def execution_store(settings: Settings) -> ExecutionStore:
    """The execution store the settings name: PostgreSQL with ``AGENT_DATABASE_URL``, else the SQLite file;
    its records sealed where payloads are encrypted (``client.sealed_stores``)."""
    from storage.executions import SQLiteExecutionStore

    retention = timedelta(days=settings.record_retention_days)
    error_retention = timedelta(days=settings.error_retention_days)
    db = database(settings)
    store: ExecutionStore
    if db is not None:
        from storage.executions.postgres import PostgresExecutionStore

        store = PostgresExecutionStore(db, retention=retention, error_retention=error_retention)
    else:
        store = SQLiteExecutionStore(
            settings.execution_store_path, retention=retention, error_retention=error_retention
        )
    keyring = settings.protection.keyring()
    if keyring is not None:
        from .sealed_stores import SealedExecutionStore

        return SealedExecutionStore(store, keyring)
    return store
