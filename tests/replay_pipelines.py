"""Pipeline factories for the policy replay tests (``tests.replay_pipelines:<name>``): the demo's hooks,
tools, planner and synthesizer (without its MCP server), and candidates derived from it."""

from __future__ import annotations

import asyncio

from activities import LifecycleActivities
from client import database
from client.pipeline import build_pipeline
from client.settings import Settings
from demo.agent import RulePlanner, TemplateSynthesizer
from demo.pipeline import DEMO_TOOL_ALLOW_LIST, demo_hooks, demo_memory
from demo.tools import demo_tools
from hooks import PipelineHook, allow_list
from hooks.declarative import DeclaredHookRuntime, HookStore
from hooks.declarative.config import HttpHook
from hooks.declarative.dispatch import declared_hook
from workflows.models import StageSettings

# The URL of the test's counting HTTP server (set by the test before it replays ``with_http_hook``).
HTTP_HOOK_URL = "http://127.0.0.1:9/"


def _pipeline(settings: Settings, hooks: list) -> LifecycleActivities:
    return build_pipeline(
        settings,
        name="demo",
        hooks=hooks,
        tools=demo_tools(settings.state_dir),
        planner=RulePlanner(),
        synthesizer=TemplateSynthesizer(),
        stage_settings=StageSettings(answer_streaming=False),
    )


def recorded(settings: Settings) -> LifecycleActivities:
    """The demo's pipeline: what the traffic was recorded with."""
    return _pipeline(settings, demo_hooks(settings, demo_memory(settings)))


def same(settings: Settings) -> LifecycleActivities:
    """The recorded pipeline again (a replay of it finds no decision change)."""
    return recorded(settings)


def stricter(settings: Settings) -> LifecycleActivities:
    """The demo's pipeline with a tighter tool allow-list: quotes are no longer offered."""
    hooks = demo_hooks(settings, demo_memory(settings))
    tighter = [tool for tool in DEMO_TOOL_ALLOW_LIST if tool != "stock-service/stock_quote"]
    return _pipeline(settings, [allow_list(tighter), *hooks[1:]])


class Slow(PipelineHook):
    """A before_tool hook that takes its time (a replay of it is long enough to cancel)."""

    name = "slow-policy"

    async def before_tool(self, ctx, call):
        await asyncio.sleep(2.0)


def slow(settings: Settings) -> LifecycleActivities:
    return _pipeline(settings, [*demo_hooks(settings, demo_memory(settings)), Slow()])


def with_http_hook(settings: Settings) -> LifecycleActivities:
    """The demo's pipeline and a declared HTTP pre_tool_use hook that is not marked shadow-safe."""
    db = database(settings)
    store = HookStore(db if db is not None else settings.state_dir / "hooks.sqlite3")
    runtime = DeclaredHookRuntime(store=store, allow_loopback=True)
    spec = HttpHook.model_validate(
        {"id": "remote-policy", "event": "pre_tool_use", "handler_type": "http", "config": {"url": HTTP_HOOK_URL}}
    )
    return _pipeline(settings, [*demo_hooks(settings, demo_memory(settings)), declared_hook(spec, runtime)])
