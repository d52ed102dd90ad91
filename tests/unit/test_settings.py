"""The one settings model: every variable read once, typed and bounded, each error naming its variable,
the state directory resolved at load time, and the reference in ``docs/configuration.md`` generated from
the same declarations."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from activities.models import ModelSettings
from client.settings import Settings, SettingsError, declared, default_state_dir
from client.settings_reference import BEGIN, END, rewrite
from hooks.builtin import MemoryOptions

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------


def test_every_section_is_read_from_one_environment():
    settings = Settings.from_env(
        {
            "TEMPORAL_TASK_QUEUE": "q",
            "AGENT_WORKER_THREADS": "8",
            "AGENT_MODEL": "m",
            "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1",
            "AGENT_MODEL_TIMEOUT_SECONDS": "5",
            "AGENT_MEMORY_SUMMARIZER_TIMEOUT_SECONDS": "7",
            "OTEL_TRACES_EXPORTER": "console",
            "AGENT_PROMETHEUS_BIND": "127.0.0.1:9464",
        }
    )
    assert (settings.task_queue, settings.worker_threads) == ("q", 8)
    assert settings.model.configured("planner") and settings.model.timeout_seconds == 5.0
    assert settings.memory.summarizer_timeout_seconds == 7.0 and settings.memory.activity_ttl_seconds == 120.0
    assert settings.telemetry.traces_exporter == ["console"]
    assert settings.telemetry.prometheus_bind == "127.0.0.1:9464"


def test_defaults_carry_no_demo_values():
    settings = Settings.from_env({"HOME": "/home/u"})
    assert settings.pipeline_factory is None
    assert settings.allowed_operations is None and settings.tool_allow_list is None
    assert settings.reviewers == [] and not settings.model.configured()
    assert "demo" not in str(settings.state_dir)


def test_blank_is_unset_except_for_a_list_and_lists_are_comma_separated():
    settings = Settings.from_env(
        {"TEMPORAL_ADDRESS": "  ", "AGENT_REVIEWERS": " alice, ,bob ", "AGENT_TOOL_ALLOW_LIST": ""}
    )
    assert settings.temporal_address == "localhost:7233"
    assert settings.reviewers == ["alice", "bob"]
    assert settings.tool_allow_list == []  # set, and empty: allow nothing (unset is the pipeline's own list)
    assert Settings.from_env({}).tool_allow_list is None


def test_the_first_set_alternative_wins_and_a_secret_never_shows():
    preferred = Settings.from_env({"AGENT_MODEL_API_KEY": "sk-a", "OPENAI_API_KEY": "sk-b", "AGENT_MODEL": "m"})
    assert preferred.model.api_key is not None and preferred.model.api_key.get_secret_value() == "sk-a"
    fallback = Settings.from_env({"OPENAI_API_KEY": "sk-b", "AGENT_MODEL": "m", "AGENT_MODEL_BASE_URL": " "})
    assert fallback.model.api_key is not None and fallback.model.api_key.get_secret_value() == "sk-b"
    assert "sk-a" not in repr(preferred) and "sk-a" not in str(preferred.model_dump())


def test_overrides_by_field_name_go_on_top():
    settings = Settings.from_env({"TEMPORAL_TASK_QUEUE": "env"}, task_queue="code")
    assert settings.task_queue == "code"


# --------------------------------------------------------------------------------------------------
# Errors name the variable
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"AGENT_STAGE_LISTING_DELAY_SECONDS": "-1"}, "AGENT_STAGE_LISTING_DELAY_SECONDS: Input should be greater"),
        ({"AGENT_WORKER_THREADS": "many"}, "AGENT_WORKER_THREADS: Input should be a valid integer"),
        ({"AGENT_HOOK_ALLOW_LOOPBACK": "maybe"}, "AGENT_HOOK_ALLOW_LOOPBACK: Input should be a valid boolean"),
        ({"AGENT_MODEL_TIMEOUT_SECONDS": "3600"}, "AGENT_MODEL_TIMEOUT_SECONDS: Input should be less than 3600"),
        ({"AGENT_MODEL_TEMPERATURE": "3"}, "AGENT_MODEL_TEMPERATURE: Input should be less than or equal to 2"),
        ({"AGENT_MODEL_TOKEN_LIMIT_PARAMETER": "max"}, "AGENT_MODEL_TOKEN_LIMIT_PARAMETER: Input should be"),
        ({"OPENAI_BASE_URL": "localhost:11434"}, "OPENAI_BASE_URL: must be an http:// or https:// URL"),
        ({"AGENT_MEMORY_ACTIVITY_TTL_SECONDS": "0"}, "AGENT_MEMORY_ACTIVITY_TTL_SECONDS: Input should be greater"),
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER: unknown exporter 'jaeger'"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable_and_value(env, expected):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    message = str(caught.value)
    assert message.startswith(expected) and "\n" not in message
    [(variable, value)] = env.items()
    assert caught.value.variables == [variable] and repr(value) in message


def test_every_bad_variable_is_named_at_once_and_a_secret_value_is_not_shown():
    env = {
        "AGENT_DATABASE_URL": "mysql://agent:hunter2@db/agent",
        "AGENT_REVIEW_WEBHOOK": "ftp://hooks.example/hunter2",
        "AGENT_DATABASE_POOL_SIZE": "0",
    }
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    assert caught.value.variables == ["AGENT_DATABASE_URL", "AGENT_DATABASE_POOL_SIZE", "AGENT_REVIEW_WEBHOOK"]
    assert "hunter2" not in str(caught.value) and "(got '0')" in str(caught.value)


def test_a_rule_over_several_variables_names_them_in_its_message():
    with pytest.raises(SettingsError, match="AGENT_MODEL_API_KEY \\(or OPENAI_API_KEY\\) is required") as caught:
        Settings.from_env({"AGENT_MODEL": "gpt-test"})
    assert caught.value.variables == []


def test_the_old_entry_points_read_through_the_one_loader():
    env = {"AGENT_MODEL": "m", "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1", "AGENT_MODEL_MAX_OUTPUT_TOKENS": "9"}
    assert ModelSettings.from_env(env) == Settings.from_env(env).model
    options = MemoryOptions.from_env({"AGENT_MEMORY_ACTIVITY_TTL_SECONDS": "30"}, agent_domain="ops")
    assert (options.activity_ttl_seconds, options.agent_domain) == (30.0, "ops")
    with pytest.raises(SettingsError, match="AGENT_MODEL_MAX_OUTPUT_TOKENS"):
        ModelSettings.from_env({"AGENT_MODEL_MAX_OUTPUT_TOKENS": "-1"})


# --------------------------------------------------------------------------------------------------
# The state directory
# --------------------------------------------------------------------------------------------------


def test_the_state_directory_defaults_to_the_xdg_state_home_wherever_the_process_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({"XDG_STATE_HOME": "/var/state"}).state_dir == Path("/var/state/agent-lifecycle")
    assert Settings.from_env({"HOME": "/home/u"}).state_dir == Path("/home/u/.local/state/agent-lifecycle")
    # a relative XDG_STATE_HOME is ignored, as the XDG convention says
    assert default_state_dir({"XDG_STATE_HOME": "rel", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/agent-lifecycle"
    )
    settings = Settings.from_env({"HOME": "/home/u"})
    assert "state_dir" not in settings.model_fields_set  # the default: the demo may choose its own
    assert settings.execution_store_path == Path("/home/u/.local/state/agent-lifecycle/executions.sqlite3")


def test_a_relative_state_directory_is_resolved_once_when_the_settings_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = Settings.from_env({"AGENT_STATE_DIR": "state", "AGENT_HOOKS_FILE": "hooks.json"})
    assert settings.state_dir == tmp_path / "state" and "state_dir" in settings.model_fields_set
    assert settings.hooks_file == tmp_path / "hooks.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert settings.execution_store_path == tmp_path / "state" / "executions.sqlite3"
    assert settings.payload_store_path == tmp_path / "state" / "payloads.sqlite3"
    assert Settings.from_env({"AGENT_STATE_DIR": "~/s", "HOME": "/h"}).state_dir == Path("~/s").expanduser()


def test_the_demo_keeps_its_state_in_the_repository_unless_told_otherwise(tmp_path):
    from demo.pipeline import DEMO_PIPELINE, DEMO_STATE_DIR, demo_settings

    assert DEMO_STATE_DIR == ROOT / ".agent-state"
    chosen = demo_settings(Settings.from_env({}))
    assert (chosen.state_dir, chosen.pipeline_factory) == (DEMO_STATE_DIR, DEMO_PIPELINE)
    told = demo_settings(Settings.from_env({"AGENT_STATE_DIR": str(tmp_path)}))
    assert told.state_dir == tmp_path


# --------------------------------------------------------------------------------------------------
# One declaration, one reference
# --------------------------------------------------------------------------------------------------


def _documented() -> set[str]:
    """The variables the reference's tables list (first column, alternatives included)."""
    text = REFERENCE.read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    names: set[str] = set()
    for line in block.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split(" | ")[0]))
    return names


def test_every_declared_variable_is_documented_and_every_documented_one_declared():
    declared_names = {name for name, _ in declared(Settings)}
    documented = _documented()
    assert not declared_names - documented, (
        f"declared but not in docs/configuration.md: {sorted(declared_names - documented)}; "
        "run: python -m client.settings_reference --write docs/configuration.md"
    )
    assert not documented - declared_names, (
        f"in docs/configuration.md but declared nowhere: {sorted(documented - declared_names)}"
    )


def test_the_reference_is_what_the_declarations_generate():
    text = REFERENCE.read_text()
    assert rewrite(text) == text, "run: python -m client.settings_reference --write docs/configuration.md"


def test_every_variable_has_a_meaning_and_is_declared_once():
    names = [name for name, _ in declared(Settings)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(info.description for _, info in declared(Settings))


def test_the_readme_points_to_the_one_reference():
    readme = (ROOT / "README.md").read_text()
    assert "docs/configuration.md" in readme


# Where the framework may read the process environment: the settings loader itself; the environment a
# declared command hook and an MCP server over stdio receive (passed through, not read as a setting).
_ENVIRONMENT_READERS = {"client/settings.py", "hooks/declarative/dispatch.py", "activities/mcp/connection.py"}


def test_no_part_of_the_framework_reads_the_environment_for_a_setting_of_its_own():
    readers = set()
    for package in ("workflows", "activities", "hooks", "storage", "client"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv"):
                    if isinstance(node.value, ast.Name) and node.value.id == "os":
                        readers.add(str(path.relative_to(ROOT)))
    assert readers <= _ENVIRONMENT_READERS, sorted(readers - _ENVIRONMENT_READERS)


# --------------------------------------------------------------------------------------------------
# Unknown variables
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "closest"),
    [
        ({"AGENT_REVIEWER": "carol"}, "AGENT_REVIEWERS"),
        ({"AGENT_MODEL_BASEURL": "http://127.0.0.1:9/v1"}, "AGENT_MODEL_BASE_URL"),
        ({"AGENT_STATEDIR": "/tmp/x"}, "AGENT_STATE_DIR"),
    ],
)
def test_a_misspelt_variable_is_an_error_naming_the_closest_setting(env, closest):
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    [variable] = env
    message = str(caught.value)
    assert caught.value.variables == [variable] and "\n" not in message
    assert message.startswith(f"{variable}: not a setting; did you mean {closest}?")


def test_an_unknown_variable_far_from_every_setting_points_to_the_reference():
    with pytest.raises(SettingsError, match="AGENT_JOBSTATUS: not a setting; docs/configuration.md lists"):
        Settings.from_env({"AGENT_JOBSTATUS": "Succeeded"})


def test_a_correct_environment_and_another_programs_named_variables_are_accepted():
    env = {
        "AGENT_REVIEWERS": "carol",
        "AGENT_MODEL": "m",
        "AGENT_MODEL_API_KEY": "k",
        "AGENT_MODEL_BASE_URL": "http://127.0.0.1:9/v1",
        "AGENT_JOBSTATUS": "Succeeded",
        "AGENT_OTHER_VARIABLES": "AGENT_JOBSTATUS",
        "AGENT_TEST_PLAN": "[]",
        "OTHER_REVIEWER": "x",
    }
    settings = Settings.from_env(env)
    assert settings.reviewers == ["carol"] and settings.model.base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(SettingsError, match="AGENT_REVIEWER: not a setting"):
        Settings.from_env({**env, "AGENT_REVIEWER": "carol"})  # naming one other variable does not open the rest


# Where the project reads an ``AGENT_*`` variable outside the settings: it must be known, or the loader
# would refuse the environment that sets it.
_READS = re.compile(
    r"""(?:environ(?:\.get)?\s*[\[(]\s*|getenv\(\s*|_ENV\s*=\s*|\$\{)["']?(AGENT_[A-Z0-9_]+)""",
)


def test_every_agent_variable_the_project_reads_is_known():
    from client.settings import READ_ELSEWHERE

    known = {variable for variable, _ in declared(Settings)} | READ_ELSEWHERE
    read = set()
    for pattern in ("**/*.py", "**/*.sh", "**/*.yml", "**/*.yaml", "**/Dockerfile"):
        for path in ROOT.glob(pattern):
            if ".venv" in path.parts or "node_modules" in path.parts:
                continue
            read |= set(_READS.findall(path.read_text(errors="replace")))
    assert read, "the pattern finds the project's reads"
    assert read <= known, sorted(read - known)
