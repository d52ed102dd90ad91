"""``application-audit``: an after_execution hook whose write is detached and outlives the request.

The hook announces the effect ``audit-write`` as pending, then submits the record to the writer's
admission check. If admission refuses, the invocation fails (fail open) and the effect is recorded as
failed. Otherwise the write runs later in a child workflow (``<request>/effect/audit-write``) that
outlives the request and brings the same effect to ``succeeded`` or ``failed``:

    submission accepted, write running   invocation succeeded   effect pending
    writer reports success               still succeeded        succeeded
    writer reports failure               still succeeded        failed, with the writer's error
    submission refused                   failed (fail open)     failed

The effect records what the writer reported; it does not prove the audit store committed anything.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from storage.sqlite import private_directory, private_opener
from workflows.models import DetachedWorkResult, ExecutionResult, json_size

from ..contracts import DetachedContext, PipelineContext, PipelineHook

EFFECT_ID = "audit-write"


class AuditWriter(Protocol):
    def admit(self, record: dict[str, Any]) -> None:
        """Accept the record for writing or raise (bounded admission: size, capacity, shutdown)."""
        ...

    async def write(self, record: dict[str, Any], *, key: str) -> bool:
        """Write once per ``key`` (retries must not duplicate); returns False if it was already written."""
        ...


class JsonlAuditWriter:
    """Append-only JSON-lines audit log, unique by key, safe across worker processes."""

    def __init__(self, path: str | Path, *, max_record_bytes: int = 16 * 1024) -> None:
        self.path = Path(path)
        self.max_record_bytes = max_record_bytes

    def admit(self, record: dict[str, Any]) -> None:
        size = json_size(record)
        if size > self.max_record_bytes:
            raise ValueError(f"audit record is {size} bytes; the writer admits at most {self.max_record_bytes}")

    def _write(self, record: dict[str, Any], key: str) -> bool:
        private_directory(self.path.parent)
        with open(self.path, "a+", encoding="utf-8", opener=private_opener) as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                if any(json.loads(line).get("key") == key for line in f if line.strip()):
                    return False
                f.write(json.dumps({"key": key, "written_at": time.time(), **record}) + "\n")
                f.flush()
                return True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    async def write(self, record: dict[str, Any], *, key: str) -> bool:
        return await asyncio.to_thread(self._write, record, key)


class AuditHook(PipelineHook):
    """Audit every executed request without making the request wait for the audit store.

    Args:
        writer: Where audit records go; see :class:`AuditWriter`.
    """

    name = "application-audit"

    def __init__(self, writer: AuditWriter) -> None:
        self.writer = writer

    def after_execution(self, ctx: PipelineContext, execution: ExecutionResult) -> None:
        # Copy what the writer needs now: the detached work never sees this invocation's objects.
        record = {
            "request_id": ctx.request_id,
            "workflow_id": ctx.workflow_id,
            "step_count": len(execution.steps),
            "statuses": dict(Counter(step.status.value for step in execution.steps)),
            "tools": sorted({step.tool for step in execution.steps}),
        }
        # Announce before submitting: if admission refuses, this same effect is recorded as failed.
        ctx.detach(EFFECT_ID, name="Application audit write", payload=record, data={"step_count": record["step_count"]})
        self.writer.admit(record)

    async def run_detached(self, work: DetachedContext) -> DetachedWorkResult:
        # Once per request run: a retried write is not duplicated, a new run under the same id writes anew.
        written = await self.writer.write(work.payload, key=f"{work.workflow_id}:{work.run_id}:{work.effect_id}")
        return DetachedWorkResult(
            data={**work.payload, "written": written},
            summary="Audit writer acknowledged completion" if written else "Audit record was already written",
        )
