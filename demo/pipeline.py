"""The demo's pipeline factory, ``demo.pipeline:build_activities`` (what ``python -m demo``, the tests and the
compose file name in ``AGENT_PIPELINE``), and the demo's own settings.

A pipeline factory takes the process :class:`~client.settings.Settings` and returns the
:class:`~activities.LifecycleActivities` the worker registers. Hook order is execution order.
"""

from __future__ import annotations

from pathlib import Path

from activities import LifecycleActivities
from activities.memory import MemoryStore
from client import database, response_cache_store
from client.pipeline import build_pipeline
from client.reviewer_keys import generate_key, trust_reviewer_key
from client.settings import Settings
from hooks import allow_list, redact
from hooks.builtin import (
    AllowedOperationsHook,
    AuditHook,
    JsonlAuditWriter,
    KnowledgeContextHook,
    ResponseCacheHook,
    SecretRedactionHook,
    build_memory_hooks,
)
from hooks.memory import MemoryBackends
from workflows.models import StageSettings

from .agent import RulePlanner, TemplateSynthesizer
from .tools import demo_mcp_servers, demo_tools

KNOWLEDGE_FILE = Path(__file__).with_name("knowledge.json")
# The demo keeps its state in the repository (its dev server's database included), wherever it is started
# from, so ``worker.py --dev`` with the same AGENT_STATE_DIR shows the demo's executions again.
DEMO_STATE_DIR = Path(__file__).resolve().parent.parent / ".agent-state"
AGENT_DOMAIN = "demo-agent"
DEMO_REVIEWER = "demo-reviewer"  # who approves the demo's checkpoints, with a key of its own
# The factory ``python -m demo``, the tests and the compose file run (the framework has no default).
DEMO_PIPELINE = "demo.pipeline:build_activities"
# The demo's allow-lists where AGENT_TOOL_ALLOW_LIST / AGENT_ALLOWED_OPERATIONS do not set them.
DEMO_TOOL_ALLOW_LIST = [
    "stock-service/stock_quote",
    "stock-service/execute_trade",
    "notify-service/send_message",
    "research-service/company_profile",
]
DEMO_ALLOWED_OPERATIONS = [
    "demo-tools/stock-service/stock_quote",
    "demo-tools/notify-service/send_message",
    "demo-tools/research-service/company_profile",
]


def demo_settings(settings: Settings | None = None) -> Settings:
    """``settings`` (from the environment by default) with the demo's own defaults where they name none: the
    demo's pipeline, the repository's ``.agent-state`` as the state directory, and signed reviews — the
    demo reviewer's key (made once, in the state directory) and a trust file with its public half."""
    settings = settings or Settings.from_env()
    update: dict = {}
    if not settings.pipeline_factory:
        update["pipeline_factory"] = DEMO_PIPELINE
    if "state_dir" not in settings.model_fields_set:
        update["state_dir"] = DEMO_STATE_DIR
    if settings.reviewer_keys is None and settings.review_verification is None:
        state = update.get("state_dir", settings.state_dir)
        key, trust = state / f"{DEMO_REVIEWER}.key", state / "reviewers.json"
        if not key.exists():
            trust_reviewer_key(trust, DEMO_REVIEWER, generate_key(key))
        update.update(reviewer_keys=trust, reviewer_key=key)
    return settings.model_copy(update=update) if update else settings


def demo_memory(settings: Settings) -> MemoryStore:
    """The demo's one memory file: conversation memory (``remember``) and shared memory (the hooks)."""
    return MemoryStore(database(settings) or settings.state_dir / "memory.sqlite3")


def demo_hooks(settings: Settings, memory: MemoryStore | None = None) -> list:
    """The default pipeline.

    ``secret-redaction`` fails closed at after_synthesis: if it cannot run, the request fails rather than
    answer unredacted. ``response-cache`` stores only answers the workflow declares cacheable (read-only
    steps, every hook succeeded), after every after_synthesis hook has run. ``allowed-operations`` is the required hook and the only after_planning participant.
    ``application-audit`` records every executed request with a detached write. The ``allow-list`` and
    ``redact`` plugins guard every tool call: the first denies tools this deployment does not offer, the
    second masks secrets in tool results before the planner or synthesizer reads them.

    With ``memory``, the shared-memory hooks of :func:`~hooks.builtin.build_memory_hooks` join after the
    cache (a cached answer skips their work): activity announcement, memory enrichment, memory record,
    knowledge extraction, activity cleanup.
    """
    memory_hooks: list = []
    if memory is not None:
        memory_hooks, _ = build_memory_hooks(
            MemoryBackends(episodic=memory, knowledge=memory, coordinator=memory),
            options=settings.memory.model_copy(update={"agent_domain": AGENT_DOMAIN}),
        )
    return [
        allow_list(settings.tool_allow_list if settings.tool_allow_list is not None else DEMO_TOOL_ALLOW_LIST),
        redact(),
        SecretRedactionHook(),
        ResponseCacheHook(response_cache_store(settings), ttl_seconds=settings.cache_ttl_seconds),
        KnowledgeContextHook(KNOWLEDGE_FILE),
        *memory_hooks,
        AllowedOperationsHook(
            settings.allowed_operations if settings.allowed_operations is not None else DEMO_ALLOWED_OPERATIONS
        ),
        AuditHook(JsonlAuditWriter(settings.state_dir / "audit.jsonl")),
    ]


def build_activities(settings: Settings) -> LifecycleActivities:
    """The demo's parts; :func:`~client.pipeline.build_pipeline` applies every worker setting around them
    (declared hooks, MCP servers, the model, reviewers, expiry, the reviewers' webhook, the stores)."""
    memory = demo_memory(settings)
    # A model where AGENT_MODEL (or a per-role model) is set; the rule planner and template otherwise.
    model = settings.model
    return build_pipeline(
        settings,
        name="demo",
        hooks=demo_hooks(settings, memory),
        # The Python tools, then the tools of the demo's MCP server (and of AGENT_MCP_SERVERS).
        tools=demo_tools(settings.state_dir),
        mcp_servers=demo_mcp_servers(),
        planner=None if model.configured("planner") else RulePlanner(),
        synthesizer=None if model.configured("synthesizer") else TemplateSynthesizer(),
        # secret-redaction protects the answer after synthesis: a streamed draft would bypass it.
        stage_settings=StageSettings(answer_streaming=False),
        memory=memory,
    )
