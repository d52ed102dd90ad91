"""A throwaway PostgreSQL cluster for the tests: ``initdb`` into a temporary directory, ``pg_ctl start`` on a
free port of 127.0.0.1 (trust authentication, fsync off), stopped and deleted when the session ends.

The server binaries come from Debian's ``postgresql`` package (``.ci/run`` installs it when missing):
``pg_config --bindir`` or ``/usr/lib/postgresql/<version>/bin``. PostgreSQL refuses to run as root, so
under root the cluster belongs to the ``postgres`` system user and its commands run through ``runuser``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

USER = "agent"


def server_bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (bindir / "initdb").exists():
            return bindir
    raise RuntimeError("no PostgreSQL server binaries (initdb): install Debian's postgresql package")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``start()`` a cluster; ``database()`` a fresh empty database on it (its URL); ``stop()``. Its server
    alone stops and starts again with ``stop_server()`` and ``start_server()``."""

    def __init__(self) -> None:
        self.bindir = server_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="agent-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        self._serving = False

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> None:
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start_server()

    def start_server(self) -> None:
        """Start the server on the cluster's port (again, after :meth:`stop_server`)."""
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -F -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start")
        self._serving = True

    def stop_server(self) -> None:
        """Stop the server as an operator would (fast shutdown), keeping the cluster's data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        self._serving = False

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]  # a name this method made
        return self.url(name)

    def stop(self) -> None:
        try:
            if self._serving:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
