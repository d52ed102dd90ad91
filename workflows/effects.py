"""Helpers the request workflow, its lease keeper and its detached children share: how an effect enters
the record (one card per effect id; a terminal state is final) and how long something took in workflow
time. Workflow code only (``workflow.now()``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from .models import EffectStatus, ExecutionRecord, PipelineHookEffect


def record_effects(record: ExecutionRecord, effects: Iterable[PipelineHookEffect]) -> None:
    """Add effects to ``record``; one whose id is already recorded replaces it unless that one is terminal."""
    for effect in effects:
        index = next((i for i, e in enumerate(record.effects) if e.effect_id == effect.effect_id), None)
        if index is None:
            record.effects.append(effect)
        elif record.effects[index].status is EffectStatus.PENDING:
            record.effects[index] = effect


def elapsed_ms(started: datetime) -> float:
    """Milliseconds of workflow time since ``started`` (never negative)."""
    return max(0.0, (workflow.now() - started).total_seconds() * 1000.0)
