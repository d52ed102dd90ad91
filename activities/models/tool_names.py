"""Tool keys as Chat Completions function names, and back.

A function name must match ``^[a-zA-Z0-9_-]{1,64}$``; a tool key is ``namespace/agent/capability``. The
name joins the three parts with ``__`` after replacing every other character by ``_``; a name longer
than 64 characters keeps 55 and ends with ``_`` and 8 hex digits of the key's sha256. The mapping is a
table built once from the registry, so a name always reads back as the key it came from; two keys that
map to one name are refused when the table is built (rename one), never resolved by guessing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from workflows.models import ToolSpec

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_DISALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
MAX_FUNCTION_NAME = 64


def function_name(key: str) -> str:
    """The function name of tool ``key`` (deterministic; not necessarily unique — see :class:`ToolNames`)."""
    name = "__".join(_DISALLOWED.sub("_", part) for part in key.split("/")) or "_"
    if len(name) > MAX_FUNCTION_NAME:
        name = name[:55] + "_" + hashlib.sha256(key.encode()).hexdigest()[:8]
    return name


class ToolNames:
    """The two-way table between tool keys and function names.

    Raises:
        ValueError: two tools map to the same function name.
    """

    def __init__(self, specs: Iterable[ToolSpec]) -> None:
        self._names: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        for spec in specs:
            name = function_name(spec.key)
            other = self._keys.get(name)
            if other is not None and other != spec.key:
                raise ValueError(
                    f"tools {other!r} and {spec.key!r} both become the function name {name!r} "
                    "(only letters, digits, '_' and '-' are allowed); rename one of them"
                )
            self._names[spec.key], self._keys[name] = name, spec.key

    def __contains__(self, key: object) -> bool:
        return key in self._names

    def name(self, key: str) -> str:
        return self._names[key]

    def key(self, name: str) -> str | None:
        """The tool key of function ``name``; ``None`` for a name no tool has."""
        return self._keys.get(name)
