"""One stage of a candidate pipeline run in shadow: each hook's call built, checked and folded by its
stage's own ``StageSpec`` — as the lifecycle runs it — with ``ctx.shadow`` set and whatever the hook
reports, detaches or leases dropped. A hook that calls out runs only when it is ``shadow_safe``; one that
is not, or that raises ``NotReplayed``, is listed as not replayed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from hooks.contracts import HookRejection, NotReplayed, PipelineContext, hook_option
from workflows import decisions
from workflows.models import (
    HookCall,
    HookDecision,
    HookEntry,
    HookOutcome,
    HookRequestView,
    RunMode,
    ShortCircuitProposal,
    Stage,
    ToolCall,
)
from workflows.stages import STAGES, ResultRejected, StageSpec

from ..hook_stages import _Checks, call_hook

if TYPE_CHECKING:
    from ..lifecycle import LifecycleActivities


@dataclass
class StageRun:
    """What one stage's chain decided in shadow."""

    subject: Any
    ended_by: HookEntry | None = None  # the hook whose outcome ended the stage (deny, stop, short-circuit)
    outcome: HookOutcome | None = None
    failed: HookEntry | None = None  # a hook whose failure ends the stage (its failure policy is closed)
    failure: str = ""
    failure_category: str = ""
    not_replayed: list[tuple[HookEntry, str]] = field(default_factory=list)
    open_failures: list[tuple[HookEntry, str]] = field(default_factory=list)  # failed, the chain went on
    modified_by: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every hook of the chain was replayed: an allow can be claimed."""
        return not self.not_replayed


class _ShadowChecks(_Checks):
    """What a stage's judge asks of the candidate worker (``workflows.stages.Checks``): the worker's own
    checks, but a short-circuit judged in shadow is neither measured nor spanned."""

    def __init__(self, pipeline: LifecycleActivities) -> None:
        super().__init__(pipeline, trace.INVALID_SPAN)

    def short_circuit_judged(self, call: HookCall, proposal: ShortCircuitProposal, decision: HookDecision) -> None:
        return None


def calls_out(hook: Any) -> bool:
    """Whether ``hook`` calls something outside the worker: it runs as its own activity, or says so."""
    return hook_option(hook, "run_mode") == RunMode.ACTIVITY or bool(hook_option(hook, "calls_service"))


class ShadowStages:
    """Runs one stage's hooks of a candidate pipeline in shadow (see the module docstring)."""

    def __init__(self, pipeline: LifecycleActivities) -> None:
        self.pipeline = pipeline
        self._checks = _ShadowChecks(pipeline)

    async def run_stage(
        self,
        stage: Stage,
        entries: list[HookEntry],
        view: HookRequestView,
        subject: Any,
        *,
        tool_call: ToolCall | None = None,
        **extras: Any,
    ) -> StageRun:
        spec = STAGES[stage]
        result = StageRun(subject=subject)
        for entry in entries:
            if not entry.implements(stage):
                continue
            if spec.tool_stage and tool_call is not None and not entry.applies_to_tool(tool_call):
                continue
            hook = self.pipeline.registry.hook(entry.name)
            if calls_out(hook) and not hook_option(hook, "shadow_safe"):
                result.not_replayed.append((entry, "calls out and is not marked shadow_safe"))
                continue
            call = spec.build(entry, view, result.subject, **extras)
            try:
                outcome = await self._invoke(spec, entry, hook, call)
            except NotReplayed as err:
                result.not_replayed.append((entry, str(err) or "the hook opted out of replay"))
                continue
            except _Failed as failure:
                decision = spec.failure(entry, failure.category)
                if decision.action.ends_request:
                    result.failed, result.failure, result.failure_category = entry, failure.message, failure.category
                    return result
                result.open_failures.append((entry, failure.message))
                continue
            folded = spec.fold(result.subject, outcome)
            if folded.subject != result.subject:
                result.modified_by.append(entry.name)
            result.subject = folded.subject
            if folded.ends:
                result.ended_by, result.outcome = entry, outcome
                return result
        return result

    async def _invoke(self, spec: StageSpec, entry: HookEntry, hook: Any, call: HookCall) -> HookOutcome:
        ctx = PipelineContext.of_view(call.view, stage=spec.stage, hook_name=entry.name, hook=hook, shadow=True)
        try:
            prepared = spec.prepare(call, self._checks)
            async with asyncio.timeout(entry.timeout_seconds):
                value = await call_hook(getattr(hook, spec.method(entry)), ctx, *spec.arguments(prepared, ctx))
            return spec.judge(prepared, value, ctx, self._checks)
        except NotReplayed:
            raise
        except ResultRejected as err:
            raise _Failed(err.category, str(err)) from None
        except TimeoutError:
            raise _Failed(decisions.HOOK_TIMEOUT, f"did not finish within {entry.timeout_seconds:g}s") from None
        except HookRejection as err:
            raise _Failed(decisions.HOOK_ERROR, str(err), deliberate=True) from None
        except Exception as err:  # noqa: BLE001 - the hook raised: its stage's failure policy decides
            raise _Failed(decisions.HOOK_ERROR, f"{type(err).__name__}: {err}") from None


class _Failed(Exception):
    def __init__(self, category: str, message: str, *, deliberate: bool = False) -> None:
        super().__init__(message)
        self.category, self.message, self.deliberate = category, message, deliberate
