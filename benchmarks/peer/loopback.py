"""Refuse, and report, any connection a benchmark process tries to open beyond this machine.

:func:`guard` installs an audit hook (``sys.addaudithook``, which cannot be removed: call it only in a
process of the benchmark's own) on ``socket.getaddrinfo`` and ``socket.connect``: a name or address that
is not loopback makes the call raise, and one line starting with :data:`MARK` goes to stderr, which the
benchmark reads back from each process's log. The OpenAI Agents SDK exports its traces to OpenAI's API by
default; the benchmark removes that exporter, and this proves that nothing tried to reach out anyway.
(Temporal's client connects from its Rust core, not through Python's sockets; its one address is the
dev server's, on 127.0.0.1.)
"""

from __future__ import annotations

import ipaddress
import sys
from typing import Any

MARK = "OUTBOUND CONNECTION REFUSED"
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", ""}


def is_loopback(host: Any) -> bool:
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    host = host.strip("[]").lower()
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect":
        address = args[1]
        if not isinstance(address, tuple):  # a Unix socket path: local by definition
            return
        host = address[0]
    else:
        return
    if not is_loopback(host):
        print(f"{MARK}: {event} {host!r}", file=sys.stderr, flush=True)
        raise ConnectionRefusedError(f"the benchmark only talks to 127.0.0.1, not {host!r}")


def guard() -> None:
    sys.addaudithook(_hook)
