"""Wiring for processes that talk to Temporal: settings, the client, the embedded dev server, the CLI."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from workflows.converter import data_converter

from .settings import Settings

__all__ = ["Settings", "connect"]


async def connect(settings: Settings, *, tracing: bool = True) -> Client:
    """A client with the project's data converter; with ``tracing`` the OTel interceptor, which workers
    built from this client inherit."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=data_converter,
        interceptors=[TracingInterceptor()] if tracing else [],
    )
