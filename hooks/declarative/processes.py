"""A command hook's process: its output read under a cap while it arrives, its whole tree killed when it
is done with.

Output is never buffered whole: each pipe keeps at most what it may use (stdout up to the cap, stderr a
short head), and a stream that passes the cap stops the process at once — a flood is misbehaviour, not
output. The process's exit is observed by itself (the protocol's ``process_exited``), never by waiting
for its pipes to close, so a leftover that holds them cannot hold the hook past its decision or its
timeout.

Each invocation is marked with a unique value of :data:`INVOCATION_VARIABLE` in its environment, which
every process it starts inherits. Its tree is: its process group and session, every process carrying
the mark, and every descendant of those (a ppid walk), among the processes started since it was — so a
child that left the group with ``setsid`` is found by its mark, and one that also cleared its
environment is found as long as its parent is. The limit: a process that clears its environment *and*
detaches from every process of the tree (a double fork out of a new session) is out of reach; so is
one that changes its user. On systems without ``/proc`` only the process group is killed.

Processes of the tree the worker inherits (when it runs as PID 1, orphans are re-parented to it) are
reaped after they are killed, so they do not pile up as zombies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOCATION_VARIABLE = "AGENT_HOOK_INVOCATION"
# How long a process that has exited may keep its pipes open before its decision is taken without them.
EOF_GRACE_SECONDS = 0.3
# How long to wait for killed processes to be reaped: death by SIGKILL is immediate, and a hook cut off
# by its chain's budget has only the time kept back for its audit row left.
EXIT_WAIT_SECONDS = 0.2
KILL_ROUNDS = 50
_PROC = Path("/proc")


@dataclass
class ProcessOutput:
    """What a command hook's process left: its exit status and what it wrote, capped.

    ``over_cap`` names the stream that passed the cap (the process was stopped there); ``eof`` says
    whether both pipes closed before the decision was taken; ``left_processes`` counts the processes it
    left running after it exited, ``killed`` every process of its tree that was killed."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    stdout_len: int
    stderr_len: int
    over_cap: str | None = None
    eof: bool = True
    left_processes: int = 0
    killed: int = 0


@dataclass
class _Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    zombie: bool
    start_ticks: int


class _Capture(asyncio.SubprocessProtocol):
    """Keeps at most ``keep[fd]`` bytes of each pipe, counts the rest, and flags the first stream to pass
    ``cap``; its futures resolve on exit, on each pipe's EOF and on the cap."""

    NAMES = {1: "stdout", 2: "stderr"}

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int, keep: Mapping[int, int]) -> None:
        self.cap = cap
        self.keep = dict(keep)
        self.buffers = {fd: bytearray() for fd in self.NAMES}
        self.received = dict.fromkeys(self.NAMES, 0)
        self.closed = {fd: loop.create_future() for fd in self.NAMES}
        self.exited: asyncio.Future[None] = loop.create_future()
        self.over_cap: asyncio.Future[str] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        if fd not in self.buffers:
            return
        self.received[fd] += len(data)
        room = self.keep[fd] - len(self.buffers[fd])
        if room > 0:
            self.buffers[fd] += data[:room]
        if self.received[fd] > self.cap and not self.over_cap.done():
            self.over_cap.set_result(self.NAMES[fd])
            self._pause()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in self.closed and not self.closed[fd].done():
            self.closed[fd].set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def _pause(self) -> None:
        """Stop reading the pipes: nothing more is kept once a stream is over the cap."""
        if self.transport is None:
            return
        for fd in self.NAMES:
            pipe = self.transport.get_pipe_transport(fd)
            if isinstance(pipe, asyncio.ReadTransport) and pipe.is_reading():
                pipe.pause_reading()


async def run_capped(
    argv: Sequence[str],
    *,
    stdin: bytes,
    env: Mapping[str, str],
    cwd: Path | None,
    cap: int,
    stderr_keep: int,
    report: dict[str, Any],
) -> ProcessOutput:
    """Run ``argv`` with ``stdin`` and return its capped output. Whatever ends it — exit, a stream over
    ``cap``, a cancellation (its timeout) — every process of its tree is killed before this returns or
    raises, and ``report`` says how many (``killed_processes``) and how much it wrote (``stdout_len``,
    ``stderr_len``), so a caller that times it out can still record them.

    Raises:
        OSError: the process could not be started.
    """
    loop = asyncio.get_running_loop()
    mark = secrets.token_hex(16)
    since = _boot_ticks() - 1
    keep = {1: cap, 2: min(stderr_keep, cap)}
    transport, protocol = await loop.subprocess_exec(
        lambda: _Capture(loop, cap, keep),
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, INVOCATION_VARIABLE: mark},
        cwd=cwd,
        start_new_session=True,
    )
    tree = ProcessTree(transport.get_pid(), mark, since)
    eof = False
    try:
        pipe = transport.get_pipe_transport(0)
        if isinstance(pipe, asyncio.WriteTransport):
            pipe.write(stdin)
            pipe.close()  # after the buffered event is written: the hook sees EOF on stdin
        await asyncio.wait([protocol.exited, protocol.over_cap], return_when=asyncio.FIRST_COMPLETED)
        deadline = loop.time() + EOF_GRACE_SECONDS
        while not protocol.over_cap.done():
            pending = [f for f in protocol.closed.values() if not f.done()]
            if not pending or loop.time() >= deadline:
                break
            await asyncio.wait(
                [*pending, protocol.over_cap], timeout=deadline - loop.time(), return_when=asyncio.FIRST_COMPLETED
            )
        eof = all(f.done() for f in protocol.closed.values())
    finally:
        killed = tree.kill()
        report.update(killed_processes=len(killed), stdout_len=protocol.received[1], stderr_len=protocol.received[2])
        try:
            if not protocol.exited.done():
                await asyncio.wait([protocol.exited], timeout=EXIT_WAIT_SECONDS)
            await _reap(killed | tree.adopted, root=tree.root)
        finally:
            transport.close()
    over = protocol.over_cap.result() if protocol.over_cap.done() else None
    return ProcessOutput(
        returncode=transport.get_returncode(),
        stdout=bytes(protocol.buffers[1]),
        stderr=bytes(protocol.buffers[2]),
        stdout_len=protocol.received[1],
        stderr_len=protocol.received[2],
        over_cap=over,
        eof=eof,
        left_processes=len(killed - {tree.root}) if over is None else 0,
        killed=len(killed),
    )


@dataclass
class ProcessTree:
    """The processes of one hook invocation: ``root`` (the hook, leader of its own session), its group
    and session, every process marked with ``mark`` and their descendants, started since ``since``
    (clock ticks since boot)."""

    root: int
    mark: str
    since: int
    # Processes of the tree whose parent is the worker (it inherits orphans as PID 1 or a subreaper), dead
    # or alive: the worker reaps them. The root is not among them (asyncio reaps it).
    adopted: set[int] = field(default_factory=set)
    _needle: bytes = field(init=False)

    def __post_init__(self) -> None:
        self._needle = f"{INVOCATION_VARIABLE}={self.mark}".encode()

    def members(self) -> set[int]:
        """The live processes of the tree now. Zombies are dead already, but their children are still
        theirs until they are reaped, so the walk goes through them."""
        procs = _snapshot(self.since)
        if procs is None:
            return set()
        me = os.getpid()
        found = {
            p.pid
            for p in procs.values()
            if p.pid != me and (p.pid == self.root or p.pgid == self.root or p.sid == self.root or self._marked(p.pid))
        }
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        stack = list(found)
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in found and child != me:
                    found.add(child)
                    stack.append(child)
        self.adopted |= {pid for pid in found if procs[pid].ppid == me and pid != self.root}
        return {pid for pid in found if not procs[pid].zombie}

    def kill(self) -> set[int]:
        """SIGKILL every process of the tree, looking again until a look finds none it has not already
        killed (a process may fork between a look and the kill). The first look comes before any kill,
        while every parent is alive to walk from. Returns every pid killed."""
        killed: set[int] = set()
        for round in range(KILL_ROUNDS):
            found = self.members()
            if round == 0:  # the group, also where /proc cannot be read
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.root, signal.SIGKILL)
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if found <= killed:
                break
            killed |= found
        return killed

    def _marked(self, pid: int) -> bool:
        try:
            environ = (_PROC / str(pid) / "environ").read_bytes()
        except OSError:  # gone, or another user's
            return False
        return any(entry == self._needle for entry in environ.split(b"\0"))


def _boot_ticks() -> int:
    """Now, in the clock ticks since boot that /proc/<pid>/stat counts a process's start in."""
    try:
        return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
    except (AttributeError, OSError, ValueError):
        return 0


def _snapshot(since: int) -> dict[int, _Proc] | None:
    """Every process started at or after ``since`` (None without /proc)."""
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return None
    procs: dict[int, _Proc] = {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            raw = (_PROC / name / "stat").read_bytes()
        except OSError:
            continue
        # The command name is in parentheses and may itself hold spaces or parentheses.
        fields = raw[raw.rfind(b")") + 2 :].split()
        try:
            proc = _Proc(
                pid=int(name),
                ppid=int(fields[1]),
                pgid=int(fields[2]),
                sid=int(fields[3]),
                zombie=fields[0] in (b"Z", b"X"),
                start_ticks=int(fields[19]),
            )
        except (IndexError, ValueError):
            continue
        if proc.start_ticks >= since:
            procs[proc.pid] = proc
    return procs


async def _reap(pids: set[int], *, root: int) -> None:
    """Collect the exit status of the tree's processes the worker inherits (it is their parent when it
    runs as PID 1 or a subreaper) — including those whose parent was killed with them, re-parented a
    moment later. One whose parent is some other process is that process's to reap; the root, asyncio's."""
    me = os.getpid()
    tree = pids | {root}
    pending = pids - {root}
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while pending:
        for pid in list(pending):
            parent = _parent(pid)
            if parent == me:
                try:
                    reaped, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    reaped = pid
                if reaped:
                    pending.discard(pid)
            elif parent is None or parent not in tree:  # gone, or another process's child
                pending.discard(pid)
        if not pending or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.01)


def _parent(pid: int) -> int | None:
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
        return int(raw[raw.rfind(b")") + 2 :].split()[1])
    except (OSError, IndexError, ValueError):
        return None
