"""Skills: folders of instructions, optionally with Python, that an agent can pick up.

A skill is a directory holding ``SKILL.md`` whose YAML frontmatter names it and says when to use
it (the Agent Skills format; docs/harness.md, "Skills"). Only that metadata goes into the system
prompt; the model reads the rest of ``SKILL.md`` through ipython when a task calls for it, so the
prompt stays small however many skills are installed. A skill whose directory also holds a
Python package or module named after its import name is *Python-backed*: the sandbox puts that
directory on the kernel's import path (``SandboxSpec.skill_dirs``; the docker backend mounts it
read-only), and ``import <name>`` works in the REPL.

Why discovery never raises: skills are files anyone can drop into a folder, and one broken
``SKILL.md`` must not keep a session from starting. It is skipped, and the reason comes back as
a one-line warning for the caller to show.

Precedence: the project's skills (``<cwd>/.prime-agent/skills``), then the user's
(``Paths.skills_dir``), then directories the caller adds. A name found in an earlier root hides
the same name in a later one (with a warning), so a project can pin its own version of a skill.

Ordering: skills are sorted by name, so the same skills always render the same prompt section,
byte for byte (a provider's prompt cache survives new sessions and daemon restarts).
"""

from __future__ import annotations

import keyword
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from orchestrator.paths import Paths

__all__ = [
    "FRONTMATTER_MAX_BYTES",
    "MAX_SKILL_DIRS_PER_ROOT",
    "PROJECT_SKILLS_DIR",
    "PROMPT_MAX_SKILLS",
    "RESERVED_IMPORT_NAMES",
    "SKILLS_SECTION_INTRO",
    "SKILLS_SECTION_TITLE",
    "SKILL_DESCRIPTION_MAX_CHARS",
    "SKILL_FILE_NAME",
    "SKILL_NAME_MAX_CHARS",
    "SKILL_NAME_PATTERN",
    "Skill",
    "SkillDiscovery",
    "SkillFrontmatter",
    "discover_in",
    "discover_skills",
    "skill_roots",
    "skills_prompt_section",
]

SKILL_FILE_NAME = "SKILL.md"
PROJECT_SKILLS_DIR = Path(".prime-agent") / "skills"  # below a session's cwd
SKILL_NAME_MAX_CHARS = 64
SKILL_DESCRIPTION_MAX_CHARS = 1024
# A slug: lower-case letters and digits in runs joined by single hyphens.
SKILL_NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
FRONTMATTER_DELIMITER = b"---"
UTF8_BOM = b"\xef\xbb\xbf"
# Only the frontmatter is read, never the whole file: name and description fit in ~1.1 KiB, the
# rest is room for the optional fields of the standard (license, metadata, ...).
FRONTMATTER_MAX_BYTES = 16 * 1024
# Directories looked at in one root (by name); a root with more is reported once.
MAX_SKILL_DIRS_PER_ROOT = 512
PROMPT_MAX_SKILLS = 32  # skills listed in the prompt section; the rest are counted
PACKAGE_INIT = "__init__.py"
MODULE_SUFFIX = ".py"
# Import names a Python-backed skill may not take: its directory comes first on the kernel's
# import path, so it would shadow the kernel's own machinery (ipykernel fails to start, or the
# runtime vanishes). The standard library is refused as well (``sys.stdlib_module_names``).
RESERVED_IMPORT_NAMES = frozenset(
    {
        "IPython",
        "dill",
        "ipykernel",
        "jupyter_client",
        "jupyter_core",
        "kernel_gateway",
        "nats",
        "orchestrator",
        "tornado",
        "traitlets",
        "zmq",
    }
)

SKILLS_SECTION_TITLE = "# Skills"
SKILLS_SECTION_INTRO = (
    "Skills are instructions for recurring tasks, each in a SKILL.md file. When a task matches "
    "a skill's description, read its SKILL.md with ipython before you start, and follow it. A "
    "skill with a Python import is already on the kernel's import path: import it and use "
    "help() on it to see its API."
)


class SkillFrontmatter(BaseModel):
    """The fields of a ``SKILL.md`` frontmatter that Prime Agent reads; the standard's other
    fields (license, compatibility, metadata, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    name: Annotated[str, StringConstraints(max_length=SKILL_NAME_MAX_CHARS)] = Field(
        pattern=SKILL_NAME_PATTERN
    )
    description: Annotated[
        str,
        StringConstraints(
            strip_whitespace=True, min_length=1, max_length=SKILL_DESCRIPTION_MAX_CHARS
        ),
    ]
    # The Python import name of a Python-backed skill; default: the name with "-" -> "_".
    import_name: str | None = Field(default=None, alias="import")

    @field_validator("import_name")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not _is_identifier(value):
            raise ValueError("must be a Python identifier (a top-level import name)")
        return value


@dataclass(frozen=True)
class Skill:
    """One discovered skill."""

    name: str
    description: str
    directory: Path  # resolved; the kernel's import path entry when Python-backed
    root: Path  # the skills root it was found in
    import_name: str | None  # set only when the directory holds that package or module

    @property
    def skill_file(self) -> Path:
        return self.directory / SKILL_FILE_NAME

    @property
    def python_backed(self) -> bool:
        return self.import_name is not None


@dataclass(frozen=True)
class SkillDiscovery:
    """What ``discover_skills`` found: skills by name, and one line per thing it skipped."""

    skills: tuple[Skill, ...]
    warnings: tuple[str, ...]

    def get(self, name: str) -> Skill | None:
        return next((skill for skill in self.skills if skill.name == name), None)

    def python_dirs(self) -> tuple[Path, ...]:
        """Directories of the Python-backed skills, by name: ``SandboxSpec.skill_dirs``."""
        return tuple(skill.directory for skill in self.skills if skill.python_backed)


class _Skipped(Exception):
    """A skill directory that is not loaded; the message is its warning line."""


def skill_roots(
    cwd: Path, *, paths: Paths | None = None, extra_dirs: Sequence[Path] = ()
) -> tuple[Path, ...]:
    """The skills roots of a session in ``cwd``, in precedence order."""
    user = (paths or Paths.from_env()).skills_dir
    return (cwd / PROJECT_SKILLS_DIR, user, *extra_dirs)


def discover_skills(
    cwd: Path, *, paths: Paths | None = None, extra_dirs: Sequence[Path] = ()
) -> SkillDiscovery:
    """The skills a session in ``cwd`` sees (``skill_roots``); never raises for bad files."""
    return discover_in(skill_roots(cwd, paths=paths, extra_dirs=extra_dirs))


def discover_in(roots: Sequence[Path]) -> SkillDiscovery:
    """The skills in ``roots`` (earlier roots win a name); a missing root is not an error."""
    found: dict[str, Skill] = {}
    warnings: list[str] = []
    seen: set[Path] = set()
    for given in roots:
        try:
            root = given.expanduser().resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop
            warnings.append(_line(f"skills root {given}: {exc}"))
            continue
        if root in seen:
            continue
        seen.add(root)
        for directory in _candidates(root, warnings):
            try:
                skill = _read_skill(directory, root, warnings)
            except _Skipped as exc:
                warnings.append(_line(str(exc)))
                continue
            earlier = found.get(skill.name)
            if earlier is not None:
                warnings.append(
                    f"skill {skill.name!r} in {root} is hidden by the one in {earlier.root}"
                )
                continue
            found[skill.name] = skill
    skills = tuple(sorted(found.values(), key=lambda skill: skill.name))
    return SkillDiscovery(skills=skills, warnings=tuple(warnings))


def _candidates(root: Path, warnings: list[str]) -> list[Path]:
    """The directories directly in ``root`` that hold a SKILL.md, by name; ``root`` itself
    when it is one skill (``--skill PATH`` names a skill's own directory)."""
    try:
        if not root.exists():
            return []
        if not root.is_dir():
            warnings.append(f"skills root {root} is not a directory")
            return []
        if _is_file(root / SKILL_FILE_NAME):
            return [root]
        with os.scandir(root) as entries:
            names = sorted(entry.name for entry in entries if not entry.name.startswith("."))
    except OSError as exc:
        warnings.append(_line(f"skills root {root}: {exc.strerror or exc}"))
        return []
    found = [root / name for name in names if _is_file(root / name / SKILL_FILE_NAME)]
    if len(found) > MAX_SKILL_DIRS_PER_ROOT:
        warnings.append(
            f"skills root {root} holds {len(found)} skills; only the first "
            f"{MAX_SKILL_DIRS_PER_ROOT} by name are read"
        )
        found = found[:MAX_SKILL_DIRS_PER_ROOT]
    return found


def _is_file(path: Path) -> bool:
    # An unreadable directory on the way (EACCES) counts as "no such file", as a missing one.
    try:
        return path.is_file()
    except OSError:
        return False


def _read_skill(directory: Path, root: Path, warnings: list[str]) -> Skill:
    skill_file = directory / SKILL_FILE_NAME
    try:
        meta = SkillFrontmatter.model_validate(_frontmatter(skill_file))
    except ValidationError as exc:
        raise _Skipped(f"{skill_file}: {_first_error(exc)}") from exc
    if meta.name != directory.name:
        raise _Skipped(
            f"{skill_file}: name {meta.name!r} differs from its directory {directory.name!r}"
        )
    import_name = meta.import_name or meta.name.replace("-", "_")
    backed = _is_identifier(import_name) and _holds_python(directory, import_name)
    if backed and _shadows(import_name):
        warnings.append(
            f"{skill_file}: import name {import_name!r} would shadow a module the kernel "
            "needs; its Python part is not loaded"
        )
        backed = False
    elif not backed and meta.import_name is not None:  # asked for, so say why it is missing
        warnings.append(
            f"{skill_file}: import {import_name!r} names no package {import_name}/ or module "
            f"{import_name}{MODULE_SUFFIX} in its directory; its Python part is not loaded"
        )
    return Skill(
        name=meta.name,
        description=meta.description,
        directory=directory,
        root=root,
        import_name=import_name if backed else None,
    )


def _frontmatter(skill_file: Path) -> dict[str, Any]:
    """The YAML mapping between the leading ``---`` line and the next one."""
    try:
        with open(skill_file, "rb") as fh:
            head = fh.read(FRONTMATTER_MAX_BYTES + 1)
    except OSError as exc:
        raise _Skipped(f"{skill_file}: {exc.strerror or exc}") from exc
    lines = head.removeprefix(UTF8_BOM).split(b"\n")
    if lines[0].rstrip() != FRONTMATTER_DELIMITER:
        raise _Skipped(f"{skill_file}: no YAML frontmatter (the first line must be ---)")
    end = next(
        (i for i, line in enumerate(lines[1:], 1) if line.rstrip() == FRONTMATTER_DELIMITER),
        None,
    )
    if end is None:
        if len(head) > FRONTMATTER_MAX_BYTES:
            raise _Skipped(f"{skill_file}: frontmatter longer than {FRONTMATTER_MAX_BYTES} bytes")
        raise _Skipped(f"{skill_file}: frontmatter has no closing --- line")
    try:
        data = yaml.safe_load(b"\n".join(lines[1:end]).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Skipped(f"{skill_file}: frontmatter is not UTF-8") from exc
    except yaml.YAMLError as exc:
        raise _Skipped(f"{skill_file}: bad YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise _Skipped(f"{skill_file}: frontmatter is not a mapping of fields")
    return data


def _is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _shadows(import_name: str) -> bool:
    return import_name in sys.stdlib_module_names or import_name in RESERVED_IMPORT_NAMES


def _holds_python(directory: Path, import_name: str) -> bool:
    return _is_file(directory / import_name / PACKAGE_INIT) or _is_file(
        directory / f"{import_name}{MODULE_SUFFIX}"
    )


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "frontmatter"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _line(text: str) -> str:
    """One warning line, whatever the message (YAML errors span several)."""
    return " ".join(text.split())


def skills_prompt_section(
    skills: Sequence[Skill], *, locations: Mapping[str, str] | None = None
) -> str:
    """The system prompt's skills section: metadata only, at most ``PROMPT_MAX_SKILLS`` skills
    (the rest counted), sorted by name; "" when there are none.

    ``locations`` maps a skill name to its SKILL.md path as the kernel sees it (the caller knows
    the backend: a docker kernel sees a Python-backed skill under its mount point); a skill
    without one is listed without a path.
    """
    if not skills:
        return ""
    ordered = sorted(skills, key=lambda skill: skill.name)
    listed = ordered[:PROMPT_MAX_SKILLS]
    lines = [SKILLS_SECTION_TITLE, "", SKILLS_SECTION_INTRO, ""]
    for skill in listed:
        lines.append(f"- {skill.name}: {_line(skill.description)}")
        if skill.import_name is not None:
            lines.append(f"  Python: import {skill.import_name}")
        location = (locations or {}).get(skill.name)
        if location:
            lines.append(f"  SKILL.md: {location}")
    hidden = len(ordered) - len(listed)
    if hidden:
        lines.append(f"({hidden} more skill{'s' if hidden != 1 else ''} installed, not listed.)")
    return "\n".join(lines) + "\n"
