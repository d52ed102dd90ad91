"""The framework's optional parts and the packages each needs (the ``pyproject.toml`` extras).

The core — the lifecycle, hooks, tools, the rule planner, SQLite stores, signed reviews, encryption —
needs none of them. An optional part is asked for where it is first needed (``AGENT_DATABASE_URL``, a
model, an MCP server, a declared hook's ``if`` filter); if its packages are missing, that place raises
:class:`MissingExtraError`, whose one line names the extra to install, instead of an ``ImportError`` from
deep inside a module.
"""

from __future__ import annotations

import importlib

# extra -> the modules it installs (the first missing one is named in the error)
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool"),
    "mcp": ("mcp", "jsonschema"),
    "cel": ("cel",),
    "openai": ("openai",),
}


class MissingExtraError(ImportError, ValueError):
    """An optional part was asked for, but the packages of its extra are not installed.

    A ``ValueError`` too, so start-up code that reports a bad configuration in one line reports this one
    the same way: what asked for the part, and the ``pip install`` that provides it."""

    def __init__(self, extra: str, needed_for: str, module: str) -> None:
        super().__init__(
            f"{needed_for} needs the {extra!r} extra ({module} is not installed): "
            f"pip install 'agent-lifecycle[{extra}]'",
            name=module,
        )
        self.extra = extra
        self.needed_for = needed_for


def missing_extra(extra: str, needed_for: str, err: ImportError) -> ImportError:
    """What a module that imports an optional part's packages raises when the import failed: a
    :class:`MissingExtraError` when the missing module is one of ``extra``'s, else ``err`` itself.

        try:
            import psycopg
        except ImportError as err:
            raise missing_extra("postgres", "stores on PostgreSQL", err) from err
    """
    missing = (err.name or "").partition(".")[0]
    return MissingExtraError(extra, needed_for, missing) if missing in EXTRAS[extra] else err


def require(extra: str, needed_for: str) -> None:
    """Import the packages of ``extra``, or raise :class:`MissingExtraError` naming ``needed_for`` (the
    setting or the part that asked for it) and the extra to install."""
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtraError(extra, needed_for, module) from None
