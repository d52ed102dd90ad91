"""The pipeline a worker runs, with every worker setting applied to it.

A pipeline factory (``AGENT_PIPELINE=module:function``) takes the process :class:`~client.settings.Settings`
and returns the :class:`~activities.LifecycleActivities` the worker registers. :func:`build_pipeline` is
the way to build them: it takes the application's own parts — hooks, tools, planner, synthesizer — and
applies every setting around them (declared hooks, MCP servers, the model, reviewers, checkpoint expiry,
the reviewers' webhook, the execution store, the token budget).

Whatever a factory returns, the worker hands it to :func:`apply_settings` before it serves anything: a
setting the pipeline did not take into account is applied to it there, and one that cannot be — a model
for a pipeline that brings a planner of its own, reviewers that differ from the pipeline's — stops the
worker at start-up (:class:`PipelineSettingsError`, exit 2, naming the variable and why). A worker
setting never silently does nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from temporalio.exceptions import ApplicationError

from activities import LifecycleActivities, Tool, ToolRegistry
from activities.conversations import ConversationOptions
from activities.mcp import McpServerConfig, is_mcp_tool
from activities.memory import ConversationMemory
from activities.planning import Planner, PromptBuilder, ReadableSynthesizer, Synthesizer, build_planning_prompt
from hooks import HookRegistry
from hooks.declarative import DeclaredHook, check_edition
from storage.executions import ExecutionStore, SQLiteExecutionStore
from workflows import callers
from workflows.extras import require
from workflows.models import ReviewSettings, StageSettings

from . import database, execution_store, review_webhook
from .declared_hooks import settings_declared_hooks
from .mcp_servers import settings_mcp_tools
from .reviewer_keys import ReviewerKeyError, load_trust_file
from .settings import Settings

if TYPE_CHECKING:
    from activities.models import ModelSettings

# The variables that shape a pipeline (the rest shape the process: where Temporal is, the task queue, the
# payload store, ...). ``build_pipeline`` applies all of them; ``apply_settings`` applies or refuses each.
PIPELINE_VARIABLES = (
    "AGENT_REVIEWERS",
    "AGENT_REVIEW_VERIFICATION",
    "AGENT_REVIEWER_KEYS",
    "AGENT_ALLOW_SELF_APPROVAL",
    "AGENT_CHECKPOINT_EXPIRY_SECONDS",
    "AGENT_REVIEW_WEBHOOK",
    "AGENT_HOOKS_FILE",
    "AGENT_MCP_SERVERS",
    "AGENT_MODEL",
    "AGENT_MODEL_MAX_TOKENS_PER_REQUEST",
    "AGENT_EXECUTION_STORE",
    "AGENT_DATABASE_URL",
    "AGENT_RECORD_RETENTION_DAYS",
    "AGENT_ERROR_RETENTION_DAYS",
)


class PipelineSettingsError(ValueError):
    """A worker setting that cannot be applied to the pipeline the worker loaded."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


class NoPlanner:
    """The planner of a pipeline built without one and without a model: every request fails at planning
    with a message that says how to give it one (a worker still starts, so ``--check`` can show the rest)."""

    name = "no-planner"

    async def plan(self, request: Any) -> Any:
        raise ApplicationError(
            "this pipeline has no planner: set AGENT_MODEL, or pass planner= to build_pipeline",
            type="NoPlanner",
            non_retryable=True,
        )


class PipelineRefused(ValueError):
    """A pipeline a worker must not serve: no way to plan, or tools that run with no required gate."""


def servable_problems(activities: LifecycleActivities) -> list[str]:
    """What keeps a worker from serving ``activities``, each with its fix (empty: nothing)."""
    problems = []
    if isinstance(activities.planner, NoPlanner):
        problems.append(
            "the pipeline has no planner and no model: set AGENT_MODEL (with AGENT_MODEL_API_KEY), or pass "
            "planner= to build_pipeline"
        )
    gated = any(entry.required for entry in activities.registry.entries)
    if activities.tools.specs() and not gated and not activities.ungated:
        problems.append(
            "the pipeline runs tools with no required after-planning gate: add one (e.g. AllowedOperationsHook, "
            "or a RequiredAfterPlanningHook of your own), or say it runs ungated: build_pipeline(..., ungated=True)"
        )
    return problems


def check_servable(activities: LifecycleActivities) -> None:
    """Refuse, on one line naming each fix, a pipeline a worker must not serve (see :func:`servable_problems`).

    Raises:
        PipelineRefused: the pipeline has no planner and no model, or runs tools with no required gate
            and was not built ``ungated``.
    """
    problems = servable_problems(activities)
    if problems:
        raise PipelineRefused("; ".join(problems))


def build_pipeline(
    settings: Settings,
    *,
    hooks: Sequence[Any] = (),
    tools: Sequence[Tool] = (),
    planner: Planner | None = None,
    synthesizer: Synthesizer | None = None,
    name: str = "default",
    stage_settings: StageSettings | None = None,
    memory: ConversationMemory | None = None,
    prompt_builder: PromptBuilder = build_planning_prompt,
    cache_variation: Mapping[str, str] | None = None,
    reserved_metadata_dimensions: Sequence[str] = (),
    mcp_servers: Sequence[McpServerConfig] = (),
    store: ExecutionStore | None = None,
    model: ModelSettings | str | None = None,
    instructions: str = "",
    on_reject: Literal["fail", "tell_model"] = "fail",
    ungated: bool = False,
) -> LifecycleActivities:
    """The activities of a pipeline: the application's parts, with every setting applied.

    Args:
        settings: The process settings (what the factory receives).
        hooks: The pipeline's hooks, in execution order; the declared hooks of ``AGENT_HOOKS_FILE`` follow
            them (ordered with them by priority).
        tools: The Python tools; the tools of ``mcp_servers`` and of ``AGENT_MCP_SERVERS`` join them.
        planner: Chooses tools. Default: the model planner on ``AGENT_MODEL`` (or ``AGENT_PLANNER_MODEL``).
        synthesizer: Writes the answer. Default: the model synthesizer on the configured model.
        name: The pipeline's name, as records and the UI show it.
        stage_settings: Timeouts and limits; ``AGENT_MODEL_MAX_TOKENS_PER_REQUEST`` fills the token budget
            where it is not set here.
        memory: Conversation memory (completed runs are remembered).
        prompt_builder: Renders the planning prompt.
        cache_variation: Extra cache dimensions the pipeline owns.
        reserved_metadata_dimensions: Request-metadata keys that are cache dimensions.
        mcp_servers: MCP servers of the pipeline's own, beside those of ``AGENT_MCP_SERVERS``.
        store: Where records are kept; default: the store the settings name.
        model: The model, chosen in code: a model name (on the endpoint of the ``AGENT_MODEL_*`` settings)
            or a whole :class:`~activities.models.ModelSettings`; default: ``settings.model`` (the
            ``AGENT_MODEL*`` variables). A model variable set to another model stops the worker
            (:class:`PipelineSettingsError`): the model is chosen in one place.
        instructions: What the model is told on every request of this pipeline (its system prompt). A
            request's own instructions follow them; before_run hooks see both and may rewrite them.
        on_reject: What a reviewer's rejection of a checkpoint does: ``fail`` ends the request with
            ``CheckpointRejected``; ``tell_model`` runs none of its calls, gives each a result saying who
            rejected it and why, and lets the planner go on (a model may answer from that).
        ungated: The pipeline runs its tools with no required after-planning gate, deliberately. Without
            it a worker refuses a pipeline that has tools and no required gate (:func:`check_servable`).

    Raises:
        DeclaredHookConfigError, McpStartupError, InvalidPipelineConfigError, ValueError: a part or a
            setting that cannot be used (the worker exits 2 with the reason).
    """
    model = pipeline_model(settings, model)
    registry = ToolRegistry([*tools, *settings_mcp_tools(settings, mcp_servers)])
    if planner is None:
        planner = _model_planner(model, registry) if model.configured("planner") else NoPlanner()
    if synthesizer is None:
        synthesizer = _model_synthesizer(model) if model.configured("synthesizer") else ReadableSynthesizer()
    stage_settings = stage_settings or StageSettings()
    if stage_settings.max_model_tokens_per_request is None and model.max_tokens_per_request is not None:
        stage_settings = stage_settings.model_copy(
            update={"max_model_tokens_per_request": model.max_tokens_per_request}
        )
    _check_declared_hooks(hooks, settings)
    activities = LifecycleActivities(
        registry=HookRegistry([*hooks, *settings_declared_hooks(settings)], pipeline=name),
        tools=registry,
        planner=planner,
        synthesizer=synthesizer,
        store=sealed(store, settings) if store is not None else execution_store(settings),
        settings=stage_settings,
        cache_variation=cache_variation,
        reserved_metadata_dimensions=reserved_metadata_dimensions,
        prompt_builder=prompt_builder,
        review=review_settings(settings).model_copy(update={"on_reject": on_reject}),
        memory=memory,
        review_webhook=review_webhook(settings),
        instructions=instructions,
    )
    activities.applied_settings = frozenset(PIPELINE_VARIABLES)
    activities.ungated = ungated
    return activities


MODEL_VARIABLES = (
    ("model", "AGENT_MODEL"),
    ("planner_model", "AGENT_PLANNER_MODEL"),
    ("synthesizer_model", "AGENT_SYNTHESIZER_MODEL"),
)


def pipeline_model(settings: Settings, model: ModelSettings | str | None) -> ModelSettings:
    """The model a pipeline runs with: the one chosen in code (a name on the settings' endpoint, or whole
    settings), else the settings' own.

    Raises:
        PipelineSettingsError: a model variable set to another model than the code chooses (a worker
            setting never silently does nothing: the model is chosen in one place).
    """
    if model is None:
        return settings.model
    if isinstance(model, str):
        if not model.strip():
            raise ValueError("build_pipeline(model=...) names no model")
        model = settings.model.model_copy(update={"model": model, "planner_model": None, "synthesizer_model": None})
    for field, variable in MODEL_VARIABLES:
        wanted = getattr(settings.model, field)
        if field in settings.model.model_fields_set and wanted and wanted != getattr(model, field):
            own = getattr(model, field) or model.model
            raise PipelineSettingsError(
                variable,
                f"the pipeline chooses its model in code ({own!r}), not {wanted!r}; choose it in one place: "
                f"unset {variable}, or build the pipeline without model=",
            )
    return model


def sealed(store: ExecutionStore, settings: Settings) -> ExecutionStore:
    """``store``, its records sealed where payloads are encrypted."""
    from .sealed_stores import SealedExecutionStore

    keyring = settings.protection.keyring()
    if keyring is None or isinstance(store, SealedExecutionStore):
        return store
    return SealedExecutionStore(store, keyring)


def apply_settings(activities: LifecycleActivities, settings: Settings, model: ModelSettings | None = None) -> None:
    """Apply to ``activities`` every pipeline setting it has not taken into account (a pipeline built
    without :func:`build_pipeline`), or refuse the ones that cannot be applied.

    Raises:
        PipelineSettingsError: a setting that conflicts with the pipeline, naming its variable.
        DeclaredHookConfigError, McpStartupError, InvalidPipelineConfigError: a declared-hooks or MCP
            servers file that cannot be used, or declared hooks that do not fit the pipeline's.
    """
    activities.conversations.options = ConversationOptions(
        idle_seconds=settings.conversation_idle_seconds, turns_per_run=settings.conversation_turns_per_run
    )
    if activities.memory_context_window is None:
        activities.memory_context_window = (model or settings.model).context_window
    missing = [v for v in PIPELINE_VARIABLES if v not in activities.applied_settings]
    if not missing:
        return
    given = {Settings.variable(field) for field in settings.model_fields_set}
    model = model or settings.model
    _apply_review(activities, settings, given)
    _check_declared_hooks(activities.registry.hooks, settings)
    hooks, tools = list(activities.registry.hooks), []
    if settings.hooks_file is not None and not any(isinstance(h, DeclaredHook) for h in hooks):
        hooks += settings_declared_hooks(settings)
    if settings.mcp_servers_file is not None and not any(
        is_mcp_tool(activities.tools.get(spec.key)) for spec in activities.tools.specs()
    ):
        tools = settings_mcp_tools(settings)
    _check_model(activities, model)
    _check_store(activities.store, settings, given)
    budget = model.max_tokens_per_request
    if budget is not None and activities.settings.max_model_tokens_per_request is None:
        activities.settings = activities.settings.model_copy(update={"max_model_tokens_per_request": budget})
    grown = len(hooks) > len(activities.registry.hooks)
    activities.rebuild(
        registry=HookRegistry(hooks, pipeline=activities.registry.pipeline) if grown else None, add_tools=tools
    )
    activities.applied_settings = frozenset(PIPELINE_VARIABLES)


def _check_declared_hooks(hooks: Sequence[Any], settings: Settings) -> None:
    """Hold declared hooks a pipeline built with a runtime of its own to the worker's declared-hook
    settings: its edition (a refused handler stops the worker) and its chain budget."""
    declared = [hook for hook in hooks if isinstance(hook, DeclaredHook)]
    check_edition([hook.spec for hook in declared], settings.hook_edition, source="the pipeline's declared hooks")
    budget = settings.hook_chain_budget_seconds
    if "hook_chain_budget_seconds" in settings.model_fields_set:
        for hook in declared:
            if hook.runtime.chain_budget_seconds != budget:
                raise PipelineSettingsError(
                    "AGENT_HOOK_CHAIN_BUDGET_SECONDS",
                    f"the pipeline's declared hook {hook.name!r} has a chain budget of its own "
                    f"({hook.runtime.chain_budget_seconds:g} s), not {budget:g} s",
                )


def review_settings(settings: Settings) -> ReviewSettings:
    """The checkpoints' settings: who may decide, how the workflow knows who decided, and the expiry.

    Raises:
        PipelineSettingsError: reviewers named with nothing to verify them, a verification without what it
            needs, or a trust file that cannot be used.
    """
    keys = []
    if settings.reviewer_keys is not None:
        try:
            keys = load_trust_file(settings.reviewer_keys)
        except ReviewerKeyError as err:
            raise PipelineSettingsError("AGENT_REVIEWER_KEYS", str(err)) from None
    mode = settings.review_verification or ("signed" if keys else "none")
    if mode == "signed" and not keys:
        raise PipelineSettingsError(
            "AGENT_REVIEW_VERIFICATION", "signed decisions need the reviewers' public keys: set AGENT_REVIEWER_KEYS"
        )
    if mode != "signed" and keys:
        raise PipelineSettingsError(
            "AGENT_REVIEWER_KEYS", f"reviewer keys are given but AGENT_REVIEW_VERIFICATION is {mode}: unset one"
        )
    if mode == "none" and settings.reviewers and settings.review_verification is None:
        raise PipelineSettingsError(
            "AGENT_REVIEWERS",
            "names reviewers, but nothing verifies who is speaking: give their public keys (AGENT_REVIEWER_KEYS), "
            "trust the server's identity (AGENT_REVIEW_VERIFICATION=server-identity), or accept typed names with "
            "AGENT_REVIEW_VERIFICATION=none (development only)",
        )
    if mode == "server-identity":
        try:
            callers.install()
        except callers.CallerIdentityUnavailable as err:
            raise PipelineSettingsError("AGENT_REVIEW_VERIFICATION", str(err)) from None
    return ReviewSettings(
        reviewers=settings.reviewers,
        checkpoint_expiry_seconds=settings.checkpoint_expiry_seconds,
        verification="server_identity" if mode == "server-identity" else mode,
        keys=keys,
        allow_self_approval=settings.allow_self_approval,
    )


VERIFICATION_VARIABLES = ("AGENT_REVIEW_VERIFICATION", "AGENT_REVIEWER_KEYS", "AGENT_ALLOW_SELF_APPROVAL")


def _apply_review(activities: LifecycleActivities, settings: Settings, given: set[str]) -> None:
    review = activities.manifest.review
    if given & {*VERIFICATION_VARIABLES, "AGENT_REVIEWERS"}:
        wanted = review_settings(settings)
        own = (review.verification, review.keys, review.allow_self_approval)
        if review.verification != "none" and own != (wanted.verification, wanted.keys, wanted.allow_self_approval):
            raise PipelineSettingsError(
                next(v for v in (*VERIFICATION_VARIABLES, "AGENT_REVIEWERS") if v in given),
                f"the pipeline verifies its reviewers its own way ({review.verification}); set it in one place",
            )
        review = review.model_copy(
            update={
                "verification": wanted.verification,
                "keys": wanted.keys,
                "allow_self_approval": wanted.allow_self_approval,
            }
        )
    if settings.reviewers:
        if review.reviewers and set(review.reviewers) != set(settings.reviewers):
            raise PipelineSettingsError(
                "AGENT_REVIEWERS",
                f"the pipeline names its own reviewers {review.reviewers}, not {settings.reviewers}; "
                "set them in one place",
            )
        review = review.model_copy(update={"reviewers": list(settings.reviewers)})
    if "AGENT_CHECKPOINT_EXPIRY_SECONDS" in given:
        default = ReviewSettings.model_fields["checkpoint_expiry_seconds"].default
        own = review.checkpoint_expiry_seconds
        if own != default and own != settings.checkpoint_expiry_seconds:
            raise PipelineSettingsError(
                "AGENT_CHECKPOINT_EXPIRY_SECONDS",
                f"the pipeline sets its own checkpoint expiry ({own:g} s), not {settings.checkpoint_expiry_seconds:g} s",
            )
        review = review.model_copy(update={"checkpoint_expiry_seconds": settings.checkpoint_expiry_seconds})
    webhook = review_webhook(settings)
    if webhook is not None:
        own_hook = activities.review_webhook
        if own_hook is not None and own_hook.url != webhook.url:
            raise PipelineSettingsError("AGENT_REVIEW_WEBHOOK", "the pipeline tells a reviewers' webhook of its own")
        activities.review_webhook = own_hook or webhook
        review = review.model_copy(update={"notify": True})
    activities.manifest.review = review


def _model_planner(model: ModelSettings, registry: ToolRegistry) -> Planner:
    require("openai", "a model planner (AGENT_MODEL)")
    from activities.models import OpenAIPlanner

    return OpenAIPlanner(model, registry)


def _model_synthesizer(model: ModelSettings) -> Synthesizer:
    require("openai", "a model synthesizer (AGENT_MODEL)")
    from activities.models import OpenAISynthesizer

    return OpenAISynthesizer(model)


def _check_model(activities: LifecycleActivities, model: ModelSettings) -> None:
    """A configured model applies to a pipeline whose planner and synthesizer call one; any other is the
    pipeline's own choice, which the worker cannot override."""
    roles: tuple[tuple[Literal["planner", "synthesizer"], Any, str, str | None], ...] = (
        ("planner", activities.planner, "OpenAIPlanner", model.planner_model),
        ("synthesizer", activities.synthesizer, "OpenAISynthesizer", model.synthesizer_model),
    )
    for role, part, kind, own_model in roles:
        # a part that calls the model is an instance of a class loaded only where a model is used
        models = sys.modules.get(f"activities.models.{role}")
        if model.configured(role) and not (models is not None and isinstance(part, getattr(models, kind))):
            variable = f"AGENT_{role.upper()}_MODEL" if own_model else "AGENT_MODEL"
            name = getattr(part, "name", type(part).__name__)
            raise PipelineSettingsError(
                variable,
                f"a model is set for the {role}, but this pipeline's {role} is {name!r}, which calls no model; "
                f"build the pipeline with build_pipeline() and no {role}=, or unset {variable}",
            )


def _check_store(store: ExecutionStore, settings: Settings, given: set[str]) -> None:
    """The execution store the settings name is the one the pipeline writes to (sealed where payloads are
    encrypted)."""
    from .sealed_stores import SealedExecutionStore

    if settings.protection.encrypts and not isinstance(store, SealedExecutionStore):
        raise PipelineSettingsError(
            "AGENT_ENCRYPTION_KEYS_FILE",
            "payloads are encrypted, but the pipeline's execution store keeps its records in plaintext: build it "
            "with client.execution_store(settings) (or client.sealed_stores.SealedExecutionStore)",
        )
    store = store.inner if isinstance(store, SealedExecutionStore) else store
    db = database(settings)
    if db is not None:
        if getattr(store, "database", None) is not db:
            raise PipelineSettingsError(
                "AGENT_DATABASE_URL", f"the pipeline keeps its records in {type(store).__name__}, not in the database"
            )
    elif "AGENT_EXECUTION_STORE" in given and not (
        isinstance(store, SQLiteExecutionStore) and store.path.resolve() == settings.execution_store_path.resolve()
    ):
        raise PipelineSettingsError(
            "AGENT_EXECUTION_STORE", f"the pipeline keeps its records elsewhere ({type(store).__name__})"
        )
    for variable, attribute, days in (
        ("AGENT_RECORD_RETENTION_DAYS", "retention", settings.record_retention_days),
        ("AGENT_ERROR_RETENTION_DAYS", "error_retention", settings.error_retention_days),
    ):
        own = getattr(store, attribute, None)
        if variable in given and own is not None and abs(own.total_seconds() - days * 86400) > 1:
            raise PipelineSettingsError(
                variable, f"the pipeline's store keeps records for {own.total_seconds() / 86400:g} days, not {days:g}"
            )
