"""Who sent the signal or update a workflow handler is running for: the identity the Temporal server
received it with (the client's ``identity``, recorded in the history with the message).

The Python SDK hands a handler the message's arguments and headers but not its sender's identity, though
both are in the activation it applies (and, on replay, in the history). :func:`install` wraps the two
places the SDK starts a signal's and an update's handler task so the task runs with the sender's identity
in a context variable that :func:`caller_identity` reads; the value comes from the history, so replay
reads the same. It is installed once per worker process (``worker.build_worker``); without it,
:func:`caller_identity` is None and whatever depends on it refuses (fails closed).

The identity is whatever the client declared unless the server's authorizer checks it: a pipeline that
trusts it (``ReviewSettings.verification = "server_identity"``) must run on such a server.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("agent_lifecycle_caller", default=None)
_installed = False


class CallerIdentityUnavailable(RuntimeError):
    """This version of the Temporal SDK does not start handlers where :func:`install` expects."""


def caller_identity() -> str | None:
    """The identity the running signal or update handler's message was sent with (None outside one, or
    when :func:`install` has not run)."""
    return _CALLER.get()


def install() -> None:
    """Make :func:`caller_identity` work in this process (idempotent).

    Raises:
        CallerIdentityUnavailable: the SDK's workflow instance is not shaped as expected.
    """
    global _installed
    if _installed:
        return
    from temporalio.worker import _workflow_instance

    instance = getattr(_workflow_instance, "_WorkflowInstanceImpl", None)
    apply_update = getattr(instance, "_apply_do_update", None)
    process_signal = getattr(instance, "_process_signal_job", None)
    if instance is None or apply_update is None or process_signal is None:
        raise CallerIdentityUnavailable(
            "this temporalio version does not expose where signal and update handlers start; "
            "a reviewer cannot be taken from the server's identity"
        )

    @functools.wraps(apply_update)
    def _apply_do_update(self: Any, job: Any) -> Any:
        return _with_caller(job.meta.identity, apply_update, self, job)

    @functools.wraps(process_signal)
    def _process_signal_job(self: Any, defn: Any, job: Any) -> Any:
        return _with_caller(job.identity, process_signal, self, defn, job)

    instance._apply_do_update = _apply_do_update
    instance._process_signal_job = _process_signal_job
    _installed = True


def _with_caller(identity: str, call: Any, *args: Any) -> Any:
    # The handler's task is created inside ``call`` and copies the context it was created in.
    token = _CALLER.set(identity or None)
    try:
        return call(*args)
    finally:
        _CALLER.reset(token)
