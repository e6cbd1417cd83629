"""Harbor / Terminal-Bench task directories as sweep tasks (issue 19, bullet 7): reading a
task or a dataset, what its content hash covers, the images its Dockerfile needs, and the
verifier's reward files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.sweeps.harbor_env import Environment, TrialDirs, base_images, read_reward
from orchestrator.sweeps.scoring import score
from orchestrator.sweeps.spec import load_sweep
from orchestrator.sweeps.suites import generate
from orchestrator.sweeps.suites.harbor import (
    AGENT_TIMEOUT_DEFAULT_S,
    VERIFIER_TIMEOUT_DEFAULT_S,
    harbor_spec,
    load_task_dir,
)

DATASET = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    copy = tmp_path / "hello-world"
    shutil.copytree(DATASET / "hello-world", copy)
    return copy


def test_a_task_directory_is_a_task_with_its_instruction_timeouts_and_resources(
    task_dir: Path,
) -> None:
    task = load_task_dir(task_dir)
    assert task.id == "harbor/hello-world"
    assert task.scoring == "verifier"
    assert task.question.startswith("Read the name in /app/name.txt")
    spec = harbor_spec(task)
    assert spec is not None
    assert (spec.agent_timeout_s, spec.verifier_timeout_s) == (120.0, 60.0)
    assert (spec.cpus, spec.memory_mb, spec.docker_image) == (1.0, 1024, None)
    assert spec.tests == task_dir.resolve() / "tests"


def test_timeouts_default_to_harbors_and_unknown_keys_are_left_alone(task_dir: Path) -> None:
    (task_dir / "task.toml").write_text('version = "1.0"\n[metadata]\nanything = [1, 2]\n')
    spec = harbor_spec(load_task_dir(task_dir))
    assert spec is not None
    assert spec.agent_timeout_s == AGENT_TIMEOUT_DEFAULT_S
    assert spec.verifier_timeout_s == VERIFIER_TIMEOUT_DEFAULT_S


def test_the_content_hash_covers_every_file_but_not_where_the_task_lies(
    task_dir: Path, tmp_path: Path
) -> None:
    first = load_task_dir(task_dir).content_hash
    moved = tmp_path / "elsewhere" / "hello-world"
    shutil.copytree(task_dir, moved)
    assert load_task_dir(moved).content_hash == first
    (task_dir / "tests" / "test_outputs.py").write_text("def test_x():\n    pass\n")
    assert load_task_dir(task_dir).content_hash != first
    (moved / "environment" / "name.txt").write_text("Grace\n")
    assert load_task_dir(moved).content_hash != first


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda d: (d / "task.toml").unlink(), "no task.toml"),
        (lambda d: (d / "task.toml").write_text("[agent\n"), "task.toml"),
        (lambda d: (d / "instruction.md").write_text("  \n"), "instruction.md is empty"),
        (lambda d: (d / "tests" / "test.sh").unlink(), "no tests/test.sh"),
        (lambda d: (d / "environment" / "Dockerfile").unlink(), "no environment/Dockerfile"),
        (lambda d: (d / "task.toml").write_text("[agent]\ntimeout_sec = -1\n"), "positive"),
        (lambda d: (d / "task.toml").write_text("agent = 3\n"), "[agent] must be a table"),
    ],
)
def test_a_broken_task_directory_is_one_line(task_dir: Path, damage: object, said: str) -> None:
    damage(task_dir)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=said.replace("[", r"\[")) as caught:
        load_task_dir(task_dir)
    assert "\n" not in str(caught.value)


def test_a_dataset_is_its_task_directories_by_name_and_tasks_caps_it() -> None:
    every = generate("harbor", None, None, 0, str(DATASET))
    assert [t.id for t in every] == ["harbor/hello-world", "harbor/remote-base"]
    assert [t.id for t in generate("harbor", 1, None, 0, str(DATASET))] == ["harbor/hello-world"]
    one = generate("harbor", None, None, 0, str(DATASET / "remote-base"))
    assert [t.id for t in one] == ["harbor/remote-base"]
    with pytest.raises(ConfigError, match="neither a Harbor task nor a directory of tasks"):
        generate("harbor", None, None, 0, str(DATASET.parent / "jsonl"))


def test_a_sweep_file_names_a_dataset_relative_to_itself(tmp_path: Path) -> None:
    shutil.copytree(DATASET, tmp_path / "tasks")
    path = tmp_path / "sub" / "sweep.yaml"
    path.parent.mkdir()
    path.write_text("name: h\nsuites: [{suite: harbor, path: ../tasks}]\nmodels: [openai/x]\n")
    spec = load_sweep(path)
    assert spec.suites[0].path == str((tmp_path / "tasks").resolve())
    path.write_text("name: h\nsuites: [{suite: harbor}]\nmodels: [openai/x]\n")
    with pytest.raises(ConfigError, match="suite harbor needs a path"):
        load_sweep(path)
    path.write_text("name: h\nsuites: [{suite: s-niah, path: x}]\nmodels: [openai/x]\n")
    with pytest.raises(ConfigError, match="takes no path"):
        load_sweep(path)


def test_the_images_a_dockerfile_needs_are_its_bases_not_its_stages() -> None:
    dockerfile = """
ARG BASE=python:3.11-slim
ARG TAG
FROM ${BASE} AS build
RUN make
FROM --platform=linux/amd64 debian:bookworm$TAG
COPY --from=build /out /out
FROM build AS test
FROM scratch
"""
    assert base_images(dockerfile) == ["python:3.11-slim", "debian:bookworm"]


@pytest.mark.parametrize(
    ("name", "text", "reward"),
    [
        ("reward.txt", "1\n", 1.0),
        ("reward.txt", "0.25", 0.25),
        ("reward.txt", "nan", None),
        ("reward.txt", "passed", None),
        ("reward.json", '{"reward": 0.5, "tests": 4}', 0.5),
        ("reward.json", '{"accuracy": 0.75}', 0.75),
        ("reward.json", '{"a": 1, "b": 0}', None),
        ("reward.json", "true", None),
        ("reward.json", "{", None),
    ],
)
def test_the_reward_is_what_the_verifier_wrote(
    tmp_path: Path, name: str, text: str, reward: float | None
) -> None:
    (tmp_path / "verifier").mkdir()
    assert read_reward(tmp_path) is None
    (tmp_path / "verifier" / name).write_text(text)
    assert read_reward(tmp_path) == reward


def test_a_verified_task_scores_its_reward_clamped() -> None:
    task = load_task_dir(DATASET / "hello-world")
    assert score(task, "anything", "done", 1.0) == 1.0
    assert score(task, "", "done", 0.4) == 0.4
    assert score(task, "", "done", 3.0) == 1.0
    assert score(task, "", "done", -1.0) == 0.0
    assert score(task, "", "done", None) == 0.0


def test_a_trials_directories_show_the_workdir_tests_read_only_and_logs(tmp_path: Path) -> None:
    dirs = TrialDirs(tmp_path / "cell")
    environment = Environment(image="x", workdir="/app")
    assert dirs.mounts(environment) == [
        {"source": str(dirs.workdir), "target": "/app"},
        {"source": str(dirs.tests), "target": "/tests", "read_only": True},
        {"source": str(dirs.logs), "target": "/logs"},
    ]
    # An image without a WORKDIR: the agent works in its workspace alone.
    assert [m["target"] for m in dirs.mounts(Environment("x", "/"))] == ["/tests", "/logs"]
