"""Child processes of the benchmarks: the Temporal dev server on a database file, and helpers to start,
stop and measure processes. Everything listens on 127.0.0.1 only."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

from client.devserver import temporal_cli_path
from workflows import search_attributes

ROOT = Path(__file__).resolve().parent.parent  # where worker.py is

# What makes the dev server measure like a deployed one:
# - the transfer-queue poller's default rate (20 per second) makes every workflow task wait for it, tens of
#   milliseconds, which would hide what the workflow itself costs;
# - unless told otherwise, the dev server keeps no cache of the namespace's search attributes: it reads
#   their definitions from its database each time it checks or maps one (a start that lists a request,
#   an upsert, each visibility write — 14 metadata reads per benchmark request of the lifecycle, 8 of the
#   peer). A deployed server caches them. Every attribute is registered as the server starts (below), so
#   the cache never misses one.
SERVER_DYNAMIC_CONFIG = (
    "history.transferProcessorMaxPollRPS=1000",
    "system.forceSearchAttributesCacheRefreshOnRead=false",
)


def _search_attribute_flag(key: SearchAttributeKey) -> str:
    """``Name=Type`` as ``temporal server start-dev --search-attribute`` takes it (``KEYWORD_LIST``:
    ``KeywordList``)."""
    kind = IndexedValueType.Name(IndexedValueType.ValueType(key.indexed_value_type)).removeprefix("INDEXED_VALUE_TYPE_")
    return f"{key.name}={''.join(part.capitalize() for part in kind.split('_'))}"


# Every search attribute a lifecycle worker or client uses.
SEARCH_ATTRIBUTES = tuple(_search_attribute_flag(key) for key in search_attributes.ALL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: list[str], log_path: Path, **options: Any) -> subprocess.Popen:
    """A child in its own session, so a signal to its group never reaches the caller; its output goes to ``log_path``."""
    with open(log_path, "w") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **options
        )


async def start_worker(tmp: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    """Start ``worker.py`` with ``env`` (its output in ``<tmp>/<name>.log``) and wait until it polls."""
    path = tmp / f"{name}.log"
    proc = spawn([sys.executable, "worker.py"], path, cwd=ROOT, env=env)
    for _ in range(600):
        if "worker polling" in path.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            raise RuntimeError(path.read_text(errors="replace")[-2000:])
        await asyncio.sleep(0.1)
    raise RuntimeError(f"worker {name} did not start")


def stop_all(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM every process group at once, then SIGKILL what is left after ``grace``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in (p for p in procs if p.poll() is None):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)


class Server:
    """The dev server as a subprocess: one port and one database file, so a restart resumes every workflow
    (or, ``in_memory``, no file: what ``WorkflowEnvironment.start_local`` runs)."""

    def __init__(self, tmp: Path, *, in_memory: bool = False) -> None:
        self.tmp, self.port, self.ui_port = tmp, free_port(), free_port()
        self.in_memory = in_memory
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    async def start(self, timeout: float = 60.0) -> None:
        log_path = self.tmp / f"server-{len(self.procs) + 1}.log"
        args = [
            temporal_cli_path(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port),
            "--ui-port", str(self.ui_port), "--headless", "--namespace", "default", "--log-level", "error",
        ]  # fmt: skip
        if not self.in_memory:
            args += ["--db-filename", str(self.tmp / "temporal.db")]
        for attribute in SEARCH_ATTRIBUTES:
            args += ["--search-attribute", attribute]
        for value in SERVER_DYNAMIC_CONFIG:
            args += ["--dynamic-config-value", value]
        proc = spawn(
            args,
            log_path,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            try:
                probe = await Client.connect(self.address)
                await probe.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))
                return
            except (RuntimeError, RPCError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the dev server did not answer on {self.address} within {timeout:g} s"
                    ) from None
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the dev server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")

    @property
    def pid(self) -> int:
        """The running server's process id."""
        return self.procs[-1].pid


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
