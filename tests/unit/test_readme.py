"""The README's code runs against the current code: its Python snippets, executed in order in one
namespace (as a reader pastes them into one module), build a pipeline the registry accepts."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import agent_lifecycle
from activities import LifecycleActivities
from client.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def snippets(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_the_readme_snippets_build_the_guide_agent(tmp_path):
    from examples.first_agent.planner import NotesPlanner  # the guide points to it rather than print it

    namespace: dict = {"NotesPlanner": NotesPlanner, "__name__": "readme"}
    code = snippets(ROOT / "README.md")
    assert len(code) >= 4
    for snippet in code:
        exec(compile(snippet, "README.md", "exec"), namespace)
    activities = namespace["build"](Settings(state_dir=tmp_path))
    assert isinstance(activities, LifecycleActivities)
    assert [entry.name for entry in activities.registry.entries] == ["no-secrets", "disclaimer", "only-notes-tools"]
    assert [spec.key for spec in activities.tools.specs()] == ["notes/notes-service/write_note"]
    assert callable(namespace["main"])  # the service snippet: defined, connects when called


def test_the_smallest_factory_with_a_model_is_one_call(tmp_path):
    from client.pipeline import build_pipeline

    namespace: dict = {"__name__": "readme"}
    [tool] = [snippet for snippet in snippets(ROOT / "README.md") if "class WriteNote(Tool)" in snippet]
    exec(compile(tool, "README.md", "exec"), namespace)
    settings = Settings.from_env(
        {"AGENT_STATE_DIR": str(tmp_path), "AGENT_MODEL": "m", "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1"}
    )
    activities = build_pipeline(settings, tools=[namespace["WriteNote"]()])
    assert type(activities.planner).__name__ == "OpenAIPlanner"
    assert type(activities.synthesizer).__name__ == "OpenAISynthesizer"


def test_the_configuration_reference_snippet_reads_the_settings():
    namespace: dict = {}
    exec(compile(snippets(ROOT / "docs" / "configuration.md")[0], "configuration.md", "exec"), namespace)
    assert isinstance(namespace["settings"], Settings)


def test_the_first_agent_is_the_example_and_its_test_is_the_suites():
    """The README's first agent is ``examples/expenses/agent.py`` word for word, uses at most eight names
    from the front door and nothing else of the framework, and its test is one the suite runs."""
    first, test = snippets(ROOT / "README.md")[:2]
    example = (ROOT / "examples" / "expenses" / "agent.py").read_text()
    assert example.endswith(first) and first.startswith("from pydantic import")
    imports = [node for node in ast.parse(first).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [getattr(node, "module", None) for node in imports] == ["pydantic", "agent_lifecycle"]
    names = [alias.name for alias in imports[1].names]
    assert 0 < len(names) <= 8 and set(names) <= set(agent_lifecycle.__all__), names
    function = test[test.index("async def test_") :]
    assert function in (ROOT / "tests" / "test_testing_kit.py").read_text()
    assert test.startswith("from agent_lifecycle.testing import ")
