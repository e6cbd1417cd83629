"""Skill discovery and the skills prompt section (orchestrator/harness/skills.py), on real files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.harness import skills as skills_mod
from orchestrator.harness.skills import (
    FRONTMATTER_MAX_BYTES,
    PROJECT_SKILLS_DIR,
    PROMPT_MAX_SKILLS,
    SKILL_DESCRIPTION_MAX_CHARS,
    SKILL_NAME_MAX_CHARS,
    SKILLS_SECTION_TITLE,
    Skill,
    discover_in,
    discover_skills,
    skill_roots,
    skills_prompt_section,
)
from orchestrator.paths import Paths


def make_skill(
    root: Path,
    name: str,
    description: str = "Does a thing.",
    *,
    extra: str = "",
    dir_name: str | None = None,
    body: str = "# Instructions\n\nStep one.\n",
) -> Path:
    directory = root / (dir_name or name)
    directory.mkdir(parents=True, exist_ok=True)
    text = f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}"
    (directory / "SKILL.md").write_text(text)
    return directory


def add_package(directory: Path, import_name: str) -> None:
    package = directory / import_name
    package.mkdir()
    (package / "__init__.py").write_text("def run(x):\n    return x * 2\n")


def test_roots_are_project_then_user_then_extra(tmp_path: Path) -> None:
    paths = Paths.from_env()
    extra = tmp_path / "extra"
    roots = skill_roots(tmp_path, paths=paths, extra_dirs=[extra])
    assert roots == (tmp_path / PROJECT_SKILLS_DIR, paths.data_dir / "skills", extra)
    assert paths.skills_dir == paths.data_dir / "skills"


def test_discovers_skills_sorted_by_name_and_missing_roots_are_quiet(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    make_skill(root, "zeta", "Last one.")
    make_skill(root, "alpha", "First one.")
    (root / "notes").mkdir()  # no SKILL.md: not a skill, not a warning
    (root / ".hidden").mkdir()
    found = discover_in([tmp_path / "missing", root])
    assert [s.name for s in found.skills] == ["alpha", "zeta"]
    assert found.warnings == ()
    alpha = found.get("alpha")
    assert alpha is not None and alpha.description == "First one."
    assert alpha.directory == (root / "alpha").resolve()
    assert alpha.skill_file == alpha.directory / "SKILL.md"
    assert not alpha.python_backed and found.python_dirs() == ()


def test_project_skills_win_over_user_skills_over_extra_dirs(tmp_path: Path) -> None:
    paths = Paths.from_env()
    cwd = tmp_path / "project"
    project = cwd / PROJECT_SKILLS_DIR
    extra = tmp_path / "extra"
    make_skill(project, "shared", "Project version.")
    make_skill(paths.skills_dir, "shared", "User version.")
    make_skill(paths.skills_dir, "mine", "User only.")
    make_skill(extra, "mine", "Extra version.")
    make_skill(extra, "more", "Extra only.")
    found = discover_skills(cwd, paths=paths, extra_dirs=[extra])
    by_name = {s.name: s for s in found.skills}
    assert by_name["shared"].description == "Project version."
    assert by_name["shared"].root == project.resolve()
    assert by_name["mine"].description == "User only."
    assert by_name["more"].description == "Extra only."
    hidden = [w for w in found.warnings if "is hidden by" in w]
    assert len(hidden) == 2 and all("\n" not in w for w in hidden)


def test_the_same_root_twice_is_read_once(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    make_skill(root, "once")
    found = discover_in([root, tmp_path / "skills" / ".." / "skills"])
    assert [s.name for s in found.skills] == ["once"] and found.warnings == ()


@pytest.mark.parametrize(
    ("write", "reason"),
    [
        (lambda d: (d / "SKILL.md").write_text("# no frontmatter\n"), "no YAML frontmatter"),
        (lambda d: (d / "SKILL.md").write_text("---\nname: bad\n"), "no closing ---"),
        (lambda d: (d / "SKILL.md").write_text("---\nname: [unclosed\n---\n"), "bad YAML"),
        (lambda d: (d / "SKILL.md").write_text("---\n- a list\n---\n"), "not a mapping"),
        (lambda d: (d / "SKILL.md").write_text("---\nname: bad\n---\n"), "description"),
        (lambda d: (d / "SKILL.md").write_bytes(b"---\nname: \xff\n---\n"), "not UTF-8"),
        (
            lambda d: (d / "SKILL.md").write_text("---\nname: 12\ndescription: x\n---\n"),
            "name",
        ),
        (
            lambda d: (d / "SKILL.md").write_text("---\nname: bad\ndescription: '  '\n---\n"),
            "description",
        ),
        (
            lambda d: (d / "SKILL.md").write_text(
                "---\nname: bad\ndescription: x\nimport: not-an-identifier\n---\n"
            ),
            "import",
        ),
        (
            lambda d: (d / "SKILL.md").write_text(
                "---\n" + "x: " + "y" * FRONTMATTER_MAX_BYTES + "\n---\n"
            ),
            f"longer than {FRONTMATTER_MAX_BYTES} bytes",
        ),
    ],
)
def test_a_bad_skill_file_is_skipped_with_one_warning_line(
    tmp_path: Path, write: Callable[[Path], object], reason: str
) -> None:
    root = tmp_path / "skills"
    bad = root / "bad"
    bad.mkdir(parents=True)
    write(bad)
    make_skill(root, "good")
    found = discover_in([root])
    assert [s.name for s in found.skills] == ["good"]
    assert len(found.warnings) == 1, found.warnings
    (warning,) = found.warnings
    assert reason in warning and str(bad / "SKILL.md") in warning
    assert "\n" not in warning


@pytest.mark.parametrize(
    "name",
    [
        "Upper",
        "under_score",
        "-leading",
        "trailing-",
        "double--hyphen",
        "x" * (SKILL_NAME_MAX_CHARS + 1),
    ],
)
def test_bad_names_are_skipped(tmp_path: Path, name: str) -> None:
    root = tmp_path / "skills"
    make_skill(root, name)
    found = discover_in([root])
    assert found.skills == () and len(found.warnings) == 1
    assert "name" in found.warnings[0]


def test_limits_are_inclusive(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    longest = "x" * SKILL_NAME_MAX_CHARS
    make_skill(root, longest, "d" * SKILL_DESCRIPTION_MAX_CHARS)
    make_skill(root, "too-long", "d" * (SKILL_DESCRIPTION_MAX_CHARS + 1))
    found = discover_in([root])
    assert [s.name for s in found.skills] == [longest]
    assert len(found.warnings) == 1 and "description" in found.warnings[0]


def test_name_must_match_its_directory(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    make_skill(root, "declared", dir_name="elsewhere")
    found = discover_in([root])
    assert found.skills == ()
    assert "differs from its directory" in found.warnings[0]


def test_frontmatter_extras_bom_and_crlf_are_accepted(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    directory = root / "windows"
    directory.mkdir(parents=True)
    text = "---\r\nname: windows\r\ndescription: CRLF file.\r\nlicense: MIT\r\n---\r\nBody\r\n"
    (directory / "SKILL.md").write_bytes(b"\xef\xbb\xbf" + text.encode())
    found = discover_in([root])
    assert [s.description for s in found.skills] == ["CRLF file."] and found.warnings == ()


def test_a_root_that_is_a_file_is_reported(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "skills"
    not_a_dir.write_text("")
    found = discover_in([not_a_dir])
    assert found.skills == () and found.warnings == (f"skills root {not_a_dir} is not a directory",)


def test_too_many_skill_dirs_in_one_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(skills_mod, "MAX_SKILL_DIRS_PER_ROOT", 2)
    root = tmp_path / "skills"
    for name in ("c", "a", "b"):
        make_skill(root, name)
    found = discover_in([root])
    assert [s.name for s in found.skills] == ["a", "b"]
    assert found.warnings == (
        f"skills root {root} holds 3 skills; only the first 2 by name are read",
    )


def test_python_backed_package_module_and_declared_import(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    add_package(make_skill(root, "pdf-tools"), "pdf_tools")
    (make_skill(root, "single") / "single.py").write_text("def run():\n    return 1\n")
    add_package(make_skill(root, "renamed", extra="import: other_name\n"), "other_name")
    make_skill(root, "markdown-only")
    (make_skill(root, "stray") / "helper.py").write_text("")  # not its import name
    found = discover_in([root])
    imports = {s.name: s.import_name for s in found.skills}
    assert imports == {
        "markdown-only": None,
        "pdf-tools": "pdf_tools",
        "renamed": "other_name",
        "single": "single",
        "stray": None,
    }
    assert found.warnings == ()
    assert found.python_dirs() == tuple(
        (root / name).resolve() for name in ("pdf-tools", "renamed", "single")
    )


def test_a_declared_import_that_is_missing_warns_and_keeps_the_skill(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    make_skill(root, "promised", extra="import: promised_mod\n")
    found = discover_in([root])
    (skill,) = found.skills
    assert not skill.python_backed
    assert len(found.warnings) == 1 and "promised_mod" in found.warnings[0]


@pytest.mark.parametrize("name", ["json", "orchestrator", "zmq"])
def test_an_import_name_that_would_shadow_the_kernel_is_not_loaded(
    tmp_path: Path, name: str
) -> None:
    root = tmp_path / "skills"
    add_package(make_skill(root, name), name)
    found = discover_in([root])
    (skill,) = found.skills
    assert not skill.python_backed and found.python_dirs() == ()
    assert len(found.warnings) == 1 and "would shadow" in found.warnings[0]


def test_a_name_that_is_no_identifier_is_markdown_only(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    add_package(make_skill(root, "2fa"), "2fa")
    found = discover_in([root])
    assert [s.import_name for s in found.skills] == [None] and found.warnings == ()


def _skill(name: str, description: str = "Does it.", import_name: str | None = None) -> Skill:
    directory = Path("/skills") / name
    return Skill(name, description, directory, Path("/skills"), import_name)


def test_prompt_section_lists_metadata_only_and_is_stable() -> None:
    skills = [
        _skill("pdf-tools", "Read and\n  fill PDF forms.", "pdf_tools"),
        _skill("alpha", "First."),
    ]
    section = skills_prompt_section(skills)
    assert section == skills_prompt_section(list(reversed(skills)))  # byte-identical
    lines = section.splitlines()
    assert lines[0] == SKILLS_SECTION_TITLE
    body = section.split("\n\n", 2)[2]
    assert body == (
        "- alpha: First.\n- pdf-tools: Read and fill PDF forms.\n  Python: import pdf_tools\n"
    )
    assert "/skills" not in section  # no paths unless the caller gives them
    located = skills_prompt_section(skills, locations={"alpha": "/opt/x/alpha/SKILL.md"})
    assert "- alpha: First.\n  SKILL.md: /opt/x/alpha/SKILL.md\n" in located


def test_prompt_section_is_bounded_and_counts_the_rest() -> None:
    many = [_skill(f"s{i:03d}") for i in range(PROMPT_MAX_SKILLS + 5)]
    section = skills_prompt_section(many)
    listed = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(listed) == PROMPT_MAX_SKILLS
    assert listed[0].startswith("- s000:") and listed[-1].startswith(
        f"- s{PROMPT_MAX_SKILLS - 1:03d}:"
    )
    assert section.endswith("(5 more skills installed, not listed.)\n")
    one_more = skills_prompt_section(many[: PROMPT_MAX_SKILLS + 1])
    assert one_more.endswith("(1 more skill installed, not listed.)\n")
    assert skills_prompt_section([]) == ""


def test_discovered_skills_render_the_same_section_every_time(tmp_path: Path) -> None:
    root = tmp_path / "skills"
    for name in ("b-skill", "a-skill"):
        add_package(make_skill(root, name, f"Skill {name}."), name.replace("-", "_"))
    first = skills_prompt_section(discover_in([root]).skills)
    second = skills_prompt_section(discover_in([root]).skills)
    assert first == second and first.index("a-skill") < first.index("b-skill")


def test_public_surface() -> None:
    assert all(hasattr(skills_mod, name) for name in skills_mod.__all__)


# --- the sandbox side of skill_dirs (orchestrator/sandbox/base.py, docker_run.py) -----------


def test_import_path_puts_skill_dirs_first() -> None:
    from orchestrator.sandbox.base import PYTHONPATH_ENV, with_import_path

    env = {"A": "1"}
    assert with_import_path(env, []) == env
    assert with_import_path(env, ["/s/one", "/s/two"])[PYTHONPATH_ENV] == "/s/one:/s/two"
    kept = with_import_path({PYTHONPATH_ENV: "/mine"}, ["/s/one"])
    assert kept == {PYTHONPATH_ENV: "/s/one:/mine"}


def test_skill_dirs_are_checked_before_a_sandbox_starts(tmp_path: Path) -> None:
    from orchestrator.errors import SandboxStartError
    from orchestrator.sandbox.base import checked_skill_dirs

    real = tmp_path / "real"
    real.mkdir()
    assert checked_skill_dirs([tmp_path / "." / "real"]) == (real.resolve(),)
    with pytest.raises(SandboxStartError, match="does not exist"):
        checked_skill_dirs([tmp_path / "missing"])
    colon = tmp_path / "a:b"
    colon.mkdir()
    with pytest.raises(SandboxStartError, match="in its path"):
        checked_skill_dirs([colon])


def test_docker_mounts_each_skill_dir_once_by_name(tmp_path: Path) -> None:
    from orchestrator.errors import SandboxStartError
    from orchestrator.sandbox.base import PYTHONPATH_ENV, SandboxSpec
    from orchestrator.sandbox.docker_run import CONTAINER_SKILLS_DIR, session_env, skill_mounts

    first = tmp_path / "a" / "tool"
    second = tmp_path / "b" / "tool"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    assert skill_mounts((first,)) == {first.resolve(): f"{CONTAINER_SKILLS_DIR}/tool"}
    with pytest.raises(SandboxStartError, match="two skill directories are named tool"):
        skill_mounts((first, second))
    spec = SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path, skill_dirs=(first,))
    assert session_env(spec)[PYTHONPATH_ENV] == f"{CONTAINER_SKILLS_DIR}/tool"
    assert PYTHONPATH_ENV not in session_env(
        SandboxSpec(session_id="s", cwd=tmp_path, artifacts_dir=tmp_path)
    )
