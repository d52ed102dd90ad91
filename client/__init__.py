"""Wiring for processes that talk to Temporal: settings, the client, the embedded dev server, the CLI."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from workflows.converter import data_converter

from .settings import Settings

__all__ = ["Settings", "connect", "exit_process"]


def exit_process(code: int) -> NoReturn:
    """Flush and exit without interpreter finalization, during which the SDK's native threads can abort
    a process that used a client (temporalio/sdk-python#300) and turn a success into exit code -6."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def connect(settings: Settings, *, tracing: bool = True) -> Client:
    """A client with the project's data converter; with ``tracing`` the OTel interceptor, which workers
    built from this client inherit."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=data_converter,
        interceptors=[TracingInterceptor()] if tracing else [],
    )
