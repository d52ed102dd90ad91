"""Wiring for processes that talk to Temporal: settings, the client, the embedded dev server, the CLI."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import NoReturn

from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DataConverter

from activities.payload_store import SQLitePayloadStore, external_storage
from workflows.converter import data_converter

from .settings import Settings

__all__ = ["Settings", "connect", "exit_process"]


def exit_process(code: int) -> NoReturn:
    """Flush and exit without interpreter finalization, during which the SDK's native threads can abort
    a process that used a client (temporalio/sdk-python#300) and turn a success into exit code -6."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def process_data_converter(settings: Settings) -> DataConverter:
    """The project's data converter with this deployment's payload store (large payloads by reference),
    unless ``AGENT_PAYLOAD_STORE=off``."""
    path = settings.payload_store_path
    if path is None:
        return data_converter
    return dataclasses.replace(data_converter, external_storage=external_storage(SQLitePayloadStore(path)))


async def connect(settings: Settings, *, tracing: bool = True) -> Client:
    """A client with the project's data converter and payload store; with ``tracing`` the OTel
    interceptor. Workers built from this client inherit both."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=process_data_converter(settings),
        interceptors=[TracingInterceptor()] if tracing else [],
    )
