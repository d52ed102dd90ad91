"""The state of one ``RequestLifecycle`` run, in one typed place: what every part of the workflow reads and
changes (the hook runner, the step executor, the reviews, the record keeper). Workflow code only."""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import JsonValue

    from . import search_attributes as sa
    from .leases import ManagedLeases
    from .models import (
        METADATA_MAX_MODEL_TOKENS,
        ExecutionRecord,
        FallbackRequest,
        GateState,
        HookEntry,
        HookRequestView,
        ModelDraft,
        PipelineManifest,
        PriorTurn,
        RequestInput,
        RunErrorView,
        RunView,
        StepResult,
        StepSummary,
        subagent_depth,
    )
    from .snapshots import EndAttempt


@dataclass
class RunState:
    """One request as it runs. ``ask``, ``instructions`` and ``facts`` are what before_run left;
    ``enrichments`` what before_planning left; ``results`` every step's result so far, by step id."""

    input: RequestInput
    request_id: str
    record: ExecutionRecord
    leases: ManagedLeases
    # Until resolve_pipeline answers, the UI is shown no text: whether it may be is the manifest's to say.
    manifest: PipelineManifest = field(
        default_factory=lambda: PipelineManifest(pipeline="unresolved", ui_shows_text=False)
    )
    ask: str = ""
    instructions: str = ""
    facts: dict[str, JsonValue] = field(default_factory=dict)
    enrichments: dict[str, JsonValue] = field(default_factory=dict)
    gate: GateState = field(default_factory=GateState)
    phase: int = 1
    hook_state: dict[str, dict[str, JsonValue]] = field(default_factory=dict)  # each hook's private state
    detached_tokens: dict[str, str] = field(default_factory=dict)  # effect id -> the token its child sends back
    results: dict[str, StepResult] = field(default_factory=dict)
    synthesized: str | None = None  # the answer after after_synthesis (what a cache may store)
    # Which model answers: the primary, until a failing primary hands the run to the fallback model, which
    # then answers the rest of it, asked what before_fallback left (``fallback_request``).
    route: str = "primary"
    fallback_request: FallbackRequest | None = None
    model_turns: list[PriorTurn] = field(default_factory=list)  # the model's own planning turns, by phase
    # The last planning turn's text answer as the record keeps a draft (None: that turn called tools).
    planner_draft: ModelDraft | None = None
    recovered: list[RunErrorView] = field(default_factory=list)  # errors the run recovered from, for on_error
    # The after_planning hook that marked each step (by step id) as needing a reviewer, as checkpoints show it.
    approval_required_by: dict[str, str] = field(default_factory=dict)
    # The terminal snapshot the activity of the run's last hooks was handed (a local batch's ``end``, or
    # the planning activity's that answered): the record keeper writes none of its own at the end when the
    # record is that snapshot.
    end_attempt: EndAttempt | None = None

    def recover(self, origin: str, type: str, message: str, details: dict[str, JsonValue] | None = None) -> None:
        """Keep an error the run recovers from (a failed memory save, a tool failure the planner saw, ...)
        for on_error, which observes it before the run's end."""
        self.recovered.append(
            RunErrorView.model_validate(
                {
                    "origin": origin,
                    "type": type,
                    "message": message,
                    "details": details or {},
                    "steps": self.step_summaries(),
                    "recovered": True,
                }
            )
        )

    def view(self, hook: HookEntry, plan_phase: int | None = None) -> HookRequestView:
        """The request as ``hook`` sees it now."""
        return HookRequestView(
            request=self.ask,
            metadata=self.input.metadata,
            request_id=self.request_id,
            workflow_id=self.record.workflow_id,
            enrichments=self.enrichments,
            gate=self.gate,
            plan_phase=plan_phase,
            instructions=self.instructions,
            facts=self.facts,
            state=self.hook_state.get(hook.name, {}),
            leases=self.leases.ids,
            conversation_id=self.conversation_id,
            model_tokens_left=self.model_tokens_left(),
        )

    def model_tokens_left(self) -> int | None:
        """The request's model token budget — the pipeline's, or lower where the request's metadata asks —
        less what every model call in its record spent: the planner's, the synthesizer's, its hooks' and
        its memory's (None: no budget)."""
        budgets = [
            self.manifest.settings.max_model_tokens_per_request,
            self.input.metadata.get(METADATA_MAX_MODEL_TOKENS),
        ]
        limits = [budget for budget in budgets if type(budget) is int]
        return min(limits) - self.record.model_usage.total_tokens if limits else None

    def run_view(self) -> RunView:
        return RunView(ask=self.ask, instructions=self.instructions, facts=self.facts)

    def apply_run(self, run: RunView) -> None:
        """Take a before_run rewrite: the state and the record both."""
        self.ask, self.instructions, self.facts = run.ask, run.instructions, dict(run.facts)
        self.record.ask = self.ask if self.ask != self.input.request else None
        self.record.instructions = self.instructions
        self.record.facts = dict(self.facts)

    @property
    def conversation_id(self) -> str | None:
        """The request's conversation (``metadata.conversation_id``), if it names one."""
        value = self.input.metadata.get("conversation_id")
        return value if isinstance(value, str) and value else None

    def step_summaries(self) -> list[StepSummary]:
        """Every step in the record, in plan order."""
        return [StepSummary(step_id=s.step_id, tool=s.tool, status=s.status.value) for s in self.record.steps]

    def steps_so_far(self) -> list[StepSummary]:
        """Every step of the request that has finished, in the order they finished."""
        return [StepSummary(step_id=r.step_id, tool=r.tool, status=r.status.value) for r in self.results.values()]

    def kind(self) -> str:
        """``AgentWorkflowKind`` of this run: a request, or a sub-agent's."""
        return sa.KIND_SUBAGENT if subagent_depth(self.input.metadata) > 0 else sa.KIND_REQUEST
