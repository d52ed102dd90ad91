"""Which files the worker trusts to say what it runs: the declared-hooks file, and each command hook's
executable and interpreter script.

A file is trusted when it is owned by the worker's user or root, writable by neither group nor others,
and no directory on its way (through a symlink: on both ways) is writable by others without the sticky
bit. Anyone else who can write such a file, or replace it in its directory, could make the worker run
what they like, as the worker's user.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def untrusted(path: str | Path, what: str) -> str | None:
    """Why ``path`` (a ``what``: "hooks file", "command", "script") must not be trusted, with the fix;
    None when it may be. A file that cannot be read is the caller's concern (None)."""
    given = Path(path).absolute()
    try:
        real = given.resolve(strict=True)
        info = real.stat()
    except (OSError, RuntimeError):
        return None
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        return (
            f"{what} {real} is owned by {_user(info.st_uid)}, not by the worker's user ({_user(me)}) or root; "
            f"fix: chown {_user(me)} {real}"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{what} {real} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}); "
            f"fix: chmod go-w {real}"
        )
    for directory in dict.fromkeys([*given.parents, *real.parents]):
        try:
            mode = directory.stat().st_mode
        except OSError:
            continue
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            return (
                f"{what} {real} is in {directory}, which others can write without the sticky bit "
                f"(mode {stat.S_IMODE(mode):o}); fix: chmod o-w {directory}"
            )
    return None
