"""Evaluation configs (orchestrator/control/eval_config.py): the YAML a `run --config` runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.control import eval_config
from orchestrator.control.eval_config import EvalConfig, load_eval_config
from orchestrator.errors import ConfigError
from orchestrator.settings import (
    COMPACTION_KEEP_RECENT_TOKENS,
    MODEL_MAX_RETRIES,
    SANDBOX_CPUS,
    CompactionSettings,
    ModelConfig,
    SandboxSettings,
    Settings,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "eval" / "fix-tests.yaml"

FULL = """\
name: full-run
task_file: tasks/task.md
cwd: project
model:
  name: openai/my-model
  api_base: http://127.0.0.1:9/v1
  api_key_env: MY_KEY
  context_window: 32768
  input_cost_per_mtok: 0.5
  output_cost_per_mtok: 1.5
  tool_protocol: fenced
backend: local
sandbox:
  image: rust
  workspace: copy
  memory_mib: 1024
  cpus: 2
compaction:
  enabled: false
  reserve_tokens: 4096
  keep_recent_tokens: 8000
refine:
  enabled: false
retry:
  max_retries: 5
  base_delay_s: 0.5
autonomous:
  gates:
    - python -m pytest -q
    - ruff check .
  max_turns: 4
  max_tokens: 50000
  timeout_ms: 60000
  gate_timeout_s: 30
goal:
  objective: make the tests pass
  token_budget: 40000
limits:
  session_token_budget: 120000
  max_depth: 2
output: out/full.json
"""

MINIMAL = """\
task: say hello
model:
  name: openai/gpt-4o-mini
"""


def write(tmp_path: Path, text: str, name: str = "eval.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def full(tmp_path: Path) -> Path:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "task.md").write_text("Fix the bug.\n", encoding="utf-8")
    (tmp_path / "project").mkdir()
    return write(tmp_path, FULL)


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_eval_config(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_full_config_loads_every_section(full: Path, tmp_path: Path) -> None:
    config = load_eval_config(full)
    assert config.name == "full-run" and config.run_name == "full-run"
    assert config.prompt == "Fix the bug.\n"
    assert config.task_path == tmp_path / "tasks" / "task.md"
    assert config.source == full and config.base_dir == tmp_path
    assert config.workdir == tmp_path / "project"
    assert config.output_path == tmp_path / "out" / "full.json"
    assert config.model.name == "openai/my-model" and config.model.tool_protocol == "fenced"
    assert config.backend == "local"
    assert config.autonomous is not None and config.autonomous_mode
    assert config.autonomous.gates == ["python -m pytest -q", "ruff check ."]
    assert config.autonomous.max_turns == 4 and config.autonomous.timeout_ms == 60000
    assert config.goal is not None and config.goal.token_budget == 40000
    assert config.sandbox is not None and config.sandbox.cpus == 2.0


def test_minimal_config_defaults(tmp_path: Path) -> None:
    config = load_eval_config(write(tmp_path, MINIMAL))
    assert config.prompt == "say hello" and config.task_path is None
    assert config.run_name == "eval"  # the file's stem
    assert config.workdir == tmp_path
    assert config.output_path == tmp_path / "eval.result.json"
    assert config.backend is None and not config.autonomous_mode and config.goal is None
    for section in ("sandbox", "compaction", "refine", "retry", "limits"):
        assert getattr(config, section) is None


def test_empty_autonomous_section_means_autonomous_mode(tmp_path: Path) -> None:
    config = load_eval_config(write(tmp_path, MINIMAL + "autonomous:\n"))
    assert config.autonomous_mode and config.autonomous is not None
    assert config.autonomous.gates == [] and config.autonomous.max_turns is None


def test_example_config_is_valid() -> None:
    config = load_eval_config(EXAMPLE)
    assert config.autonomous is not None and config.autonomous.gates
    assert (config.workdir / "calc.py").is_file() and (config.workdir / "test_calc.py").is_file()
    assert config.output_path == EXAMPLE.parent / "fix-tests.result.json"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            MINIMAL + "autonomous:\n  max_turns: 0\n",
            "eval.yaml: autonomous.max_turns: must be >= 1",
        ),
        (MINIMAL + "extra: 1\n", "eval.yaml: extra: unknown field"),
        (MINIMAL + "retry:\n  max_retires: 1\n", "eval.yaml: retry.max_retires: unknown field"),
        ("task: x\n", "eval.yaml: model: is required"),
        ("model: {name: openai/m}\n", "eval.yaml: task: give exactly one of task"),
        (
            "task: x\ntask_file: t.md\nmodel: {name: openai/m}\n",
            "eval.yaml: task: give exactly one of task",
        ),
        ("task: '  '\nmodel: {name: openai/m}\n", "eval.yaml: task: must not be empty"),
        ("task: x\nmodel: {name: gpt-4o}\n", "eval.yaml: model.name: must be provider/name"),
        (
            "task: x\nmodel: {name: openai/m, api_key_env: sk-123}\n",
            "eval.yaml: model.api_key_env: must be the name of an environment variable",
        ),
        (MINIMAL + "backend: podman\n", "eval.yaml: backend: must be 'auto', 'docker'"),
        (MINIMAL + "sandbox:\n  memory_mib: 1\n", "eval.yaml: sandbox.memory_mib: must be >= 128"),
        (MINIMAL + "sandbox:\n  cpus: 0\n", "eval.yaml: sandbox.cpus: must be > 0"),
        (MINIMAL + "compaction: yes\n", "eval.yaml: compaction: must be a mapping"),
        (
            MINIMAL + "autonomous:\n  gates: ['pytest', '']\n",
            "eval.yaml: autonomous.gates: gate 1 is an empty command",
        ),
        (
            MINIMAL + "autonomous:\n  gates: [1]\n",
            "eval.yaml: autonomous.gates[0]: must be a string",
        ),
        (MINIMAL + "goal:\n  token_budget: 5\n", "eval.yaml: goal.objective: is required"),
        (MINIMAL + "limits:\n  max_depth: -1\n", "eval.yaml: limits.max_depth: must be >= 0"),
        (MINIMAL + "name: a/b\n", "eval.yaml: name: must be 1-64 letters"),
        ("- a\n- b\n", "eval.yaml: must be a mapping of settings, not a list"),
        ("", "eval.yaml: is empty"),
        ("task: [unclosed\n", "eval.yaml: not valid YAML at line 2"),
        (MINIMAL + "task: again\n", "eval.yaml: not valid YAML at line 4, column 1: duplicate key"),
        (MINIMAL + "cwd: nowhere\n", "eval.yaml: cwd: no such directory"),
        ("task_file: missing.md\nmodel: {name: openai/m}\n", "eval.yaml: task_file: no such file"),
    ],
)
def test_each_error_is_one_line_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "eval.yaml"
    path.write_text(text, encoding="utf-8")
    message = error_of(Path("eval.yaml"))  # the file is named as the user gave it
    assert message.startswith(expected), message


def test_several_errors_report_the_first_and_a_count(tmp_path: Path) -> None:
    text = MINIMAL + "limits:\n  max_depth: -1\n  session_token_budget: 0\n"
    message = error_of(write(tmp_path, text))
    # In the model's field order, whatever the order in the file.
    assert message.endswith("limits.session_token_budget: must be > 0 (and 1 more)")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert error_of(tmp_path / "nope.yaml") == f"{tmp_path / 'nope.yaml'}: no such file"
    assert "is a directory" in error_of(tmp_path)


def test_empty_task_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.md").write_text("\n", encoding="utf-8")
    message = error_of(write(tmp_path, "task_file: t.md\nmodel: {name: openai/m}\n"))
    assert "task_file:" in message and "is empty" in message


def test_relative_paths_resolve_against_the_config_not_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "conf"
    (conf_dir / "work" / "sub").mkdir(parents=True)
    (conf_dir / "prompts").mkdir()
    (conf_dir / "prompts" / "p.md").write_text("from a file", encoding="utf-8")
    text = "task_file: prompts/p.md\ncwd: work/sub\nmodel: {name: openai/m}\noutput: r.json\n"
    write(conf_dir, text, "run.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_eval_config(Path("../conf/run.yaml"))
    assert config.prompt == "from a file"
    assert config.workdir == conf_dir / "work" / "sub"
    assert config.output_path == conf_dir / "r.json"
    assert config.run_name == "run"
    assert config.normalised()["cwd"] == "work/sub"


def test_settings_overrides_land_in_their_fields_and_leave_the_rest(full: Path) -> None:
    base = Settings(
        default_model="anthropic/other",
        models={
            "openai/my-model": ModelConfig(max_output_tokens=1234, context_window=1000),
            "anthropic/other": ModelConfig(context_window=5000),
        },
        sandbox=SandboxSettings(pids_limit=99),
        compaction=CompactionSettings(drop_large_variables=False),
        cell_timeout_s=42.0,
        max_live_children=3,
    )
    settings = load_eval_config(full).settings(base)
    assert settings.default_model == "openai/my-model"
    model = settings.models["openai/my-model"]
    assert model.api_base == "http://127.0.0.1:9/v1" and model.api_key_env == "MY_KEY"
    assert model.context_window == 32768 and model.tool_protocol == "fenced"
    assert model.input_cost_per_mtok == 0.5 and model.output_cost_per_mtok == 1.5
    assert model.max_output_tokens == 1234  # kept from the user's entry
    assert settings.models["anthropic/other"] == base.models["anthropic/other"]
    assert settings.sandbox == SandboxSettings(
        image="rust", workspace="copy", memory_mib=1024, cpus=2.0, pids_limit=99
    )
    assert settings.compaction == CompactionSettings(
        enabled=False, reserve_tokens=4096, keep_recent_tokens=8000, drop_large_variables=False
    )
    assert settings.harness.refine_enabled is False
    assert settings.harness.outcome_turns == base.harness.outcome_turns
    assert settings.model_max_retries == 5 and settings.retry_base_delay_s == 0.5
    assert settings.session_token_budget == 120000 and settings.max_depth == 2
    assert settings.cell_timeout_s == 42.0 and settings.max_live_children == 3
    assert settings.embedded == base.embedded and settings.nats == base.nats
    assert base.default_model == "anthropic/other"  # the base is not changed


def test_minimal_settings_only_choose_the_model(tmp_path: Path) -> None:
    base = Settings(model_max_retries=7, max_depth=3)
    settings = load_eval_config(write(tmp_path, MINIMAL)).settings(base)
    # No model fields: no models entry, which would hide what litellm knows (window, prices).
    assert settings.models == {}
    assert (
        settings.model_dump()
        == base.model_copy(update={"default_model": "openai/gpt-4o-mini"}).model_dump()
    )


def test_partial_sections_keep_unset_fields(tmp_path: Path) -> None:
    text = MINIMAL + "compaction:\n  reserve_tokens: 10\nsandbox:\n  image: cuda\nretry: {}\n"
    settings = load_eval_config(write(tmp_path, text)).settings(Settings())
    assert settings.compaction.reserve_tokens == 10
    assert settings.compaction.keep_recent_tokens == COMPACTION_KEEP_RECENT_TOKENS
    assert settings.sandbox.image == "cuda" and settings.sandbox.cpus == SANDBOX_CPUS
    assert settings.model_max_retries == MODEL_MAX_RETRIES


def test_fingerprint_is_stable_under_key_order_and_task_source(tmp_path: Path) -> None:
    inline = FULL.replace("task_file: tasks/task.md", 'task: "Fix the bug.\\n"')
    a = write(tmp_path, inline, "a.yaml")
    (tmp_path / "project").mkdir()
    # The same config: sections and keys in another order, the task in a file, cwd spelled
    # differently, the result elsewhere.
    b = write(
        tmp_path,
        """\
        output: elsewhere/b.json
        limits: {max_depth: 2, session_token_budget: 120000}
        goal: {token_budget: 40000, objective: make the tests pass}
        autonomous:
          gate_timeout_s: 30
          timeout_ms: 60000
          max_tokens: 50000
          max_turns: 4
          gates: [python -m pytest -q, ruff check .]
        retry: {base_delay_s: 0.5, max_retries: 5}
        refine: {enabled: false}
        compaction: {keep_recent_tokens: 8000, reserve_tokens: 4096, enabled: false}
        sandbox: {cpus: 2.0, memory_mib: 1024, workspace: copy, image: rust}
        backend: local
        model:
          tool_protocol: fenced
          output_cost_per_mtok: 1.5
          input_cost_per_mtok: 0.5
          context_window: 32768
          api_key_env: MY_KEY
          api_base: http://127.0.0.1:9/v1
          name: openai/my-model
        cwd: ./project
        task_file: t.md
        name: full-run
        """,
        "b.yaml",
    )
    (tmp_path / "t.md").write_text("Fix the bug.\n", encoding="utf-8")
    ca, cb = load_eval_config(a), load_eval_config(b)
    assert ca.output_path != cb.output_path  # where the result goes is not the run
    assert ca.fingerprint() == cb.fingerprint()
    assert len(ca.fingerprint()) == 64 and ca.fingerprint() == load_eval_config(a).fingerprint()
    # Anything that changes the run changes the hash.
    c = write(tmp_path, a.read_text().replace("max_turns: 4", "max_turns: 5"), "c.yaml")
    assert load_eval_config(c).fingerprint() != ca.fingerprint()
    record = ca.record()
    assert record["fingerprint"] == ca.fingerprint() and record["task"] == "Fix the bug.\n"
    assert "task_file" not in record and record["cwd"] == "project"


def test_config_built_in_code_resolves_against_the_process_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = EvalConfig.model_validate({"task": "t", "model": {"name": "openai/m"}})
    assert config.source is None and config.workdir == tmp_path and config.run_name == "eval"
    assert config.model_copy().prompt == "t"


def test_public_surface() -> None:
    for name in eval_config.__all__:
        assert hasattr(eval_config, name), name
