"""The names a package loads on first use: its ``__getattr__`` imports the module a name lives in only
when the name is first read, so importing the package does not import every module (nor the optional
packages some of them need)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(namespace: dict[str, Any], where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of the package whose globals are ``namespace``: a name of ``where`` is
    imported from its module there (relative to the package) and kept in the package, so later reads
    find it without a call; any other name is an ``AttributeError``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(where[name], package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
