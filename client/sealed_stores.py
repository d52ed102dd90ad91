"""The framework's stores with their contents sealed (``client.encryption.Sealer``), for a deployment that
encrypts its payloads: what a request carried must not lie in plaintext in a store file either.

* :class:`SealedExecutionStore` keeps each execution record as a stub the store can still index — ids,
  status, stage, revision, times, the lifecycle evidence and the ``tenant_id`` / ``agent_id`` a policy
  replay selects by — with the whole record sealed beside them; an effect update keeps its id and status
  and seals the rest. Readers get the record as it was saved, effect updates merged.
* :class:`SealedResponseCache` seals each cached answer.

Records and answers written before encryption was on still read. The memory stores are not sealed: their
hooks search what they keep (see docs/data-protection.md).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from storage.executions import ExecutionStore
from storage.executions.base import merge_effects
from storage.responses import CachedResponse, ResponseCacheStore
from workflows.models import ExecutionRecord, PipelineHookEffect

from .encryption import Keyring, Sealer

SEALED_FIELD = "agent_sealed"  # where a stub keeps its sealed record (in its metadata) or effect (its data)
_INDEXED_METADATA = ("tenant_id", "agent_id")  # ids a window selects records by


class SealedExecutionStore:
    """An :class:`~storage.executions.ExecutionStore` that seals what ``inner`` keeps (see the module)."""

    def __init__(self, inner: ExecutionStore, keyring: Keyring) -> None:
        self.inner = inner
        self._records = Sealer(keyring, "execution record")
        self._effects = Sealer(keyring, "effect")

    def __getattr__(self, name: str) -> Any:  # the inner store's path, database, retention, ...
        return getattr(self.inner, name)

    def _stub(self, record: ExecutionRecord) -> ExecutionRecord:
        indexed = {k: v for k, v in record.metadata.items() if k in _INDEXED_METADATA and isinstance(v, str)}
        return ExecutionRecord(
            request_id=record.request_id,
            workflow_id=record.workflow_id,
            run_id=record.run_id,
            pipeline=record.pipeline,
            request="",
            metadata={**indexed, SEALED_FIELD: self._records.seal(record.model_dump_json())},
            status=record.status,
            lifecycle_stage=record.lifecycle_stage,
            record_revision=record.record_revision,
            started_at=record.started_at,
            completed_at=record.completed_at,
            lifecycle=record.lifecycle,
        )

    def _sealed_effect(self, effect: PipelineHookEffect) -> PipelineHookEffect:
        return PipelineHookEffect(
            effect_id=effect.effect_id,
            name="",
            status=effect.status,
            data={SEALED_FIELD: self._effects.seal(effect.model_dump_json())},
        )

    def _opened_effect(self, effect: PipelineHookEffect) -> PipelineHookEffect:
        sealed = effect.data.get(SEALED_FIELD) if isinstance(effect.data, dict) else None
        if not isinstance(sealed, str):
            return effect
        return PipelineHookEffect.model_validate_json(self._effects.open(sealed))

    def _opened(self, stored: ExecutionRecord | None) -> ExecutionRecord | None:
        if stored is None:
            return None
        sealed = stored.metadata.get(SEALED_FIELD)
        if not isinstance(sealed, str):
            return stored  # written before encryption was on
        record = ExecutionRecord.model_validate_json(self._records.open(sealed))
        # The inner store appended the effect updates to the stub (it had no effects of its own).
        return merge_effects(record, [self._opened_effect(e) for e in stored.effects])

    async def save(self, record: ExecutionRecord) -> tuple[int, bool]:
        return await self.inner.save(self._stub(record))

    async def update_effect(self, workflow_id: str, run_id: str, effect: PipelineHookEffect) -> tuple[int, bool]:
        return await self.inner.update_effect(workflow_id, run_id, self._sealed_effect(effect))

    async def get(self, key: str) -> ExecutionRecord | None:
        return self._opened(await self.inner.get(key))

    async def get_run(self, workflow_id: str, run_id: str) -> ExecutionRecord | None:
        return self._opened(await self.inner.get_run(workflow_id, run_id))

    async def recent(self, limit: int = 20) -> list[ExecutionRecord]:
        return [r for r in (self._opened(s) for s in await self.inner.recent(limit)) if r is not None]

    async def window(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        *,
        tenant: str | None = None,
        agent: str | None = None,
        limit: int | None = None,
    ) -> list[tuple[str, str]]:
        return await self.inner.window(since, until, tenant=tenant, agent=agent, limit=limit)


class SealedResponseCache:
    """A :class:`~storage.responses.ResponseCacheStore` whose entries' answers and variations are sealed."""

    def __init__(self, inner: ResponseCacheStore, keyring: Keyring) -> None:
        self.inner = inner
        self._sealer = Sealer(keyring, "cached response")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: str) -> CachedResponse | None:
        entry = await self.inner.get(key)
        if entry is None or SEALED_FIELD not in entry.variation:
            return entry
        opened = json.loads(self._sealer.open(entry.variation[SEALED_FIELD]))
        return CachedResponse(
            response=opened["response"],
            variation=opened["variation"],
            written_at=entry.written_at,
            request_id=entry.request_id,
        )

    async def put(self, key: str, entry: CachedResponse) -> None:
        sealed = self._sealer.seal(json.dumps({"response": entry.response, "variation": entry.variation}))
        await self.inner.put(
            key,
            CachedResponse(
                response="", variation={SEALED_FIELD: sealed}, written_at=entry.written_at, request_id=entry.request_id
            ),
        )
