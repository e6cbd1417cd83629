"""What a sweep is, without running it: the file's rules, the suites' determinism, scoring,
the cells and their fingerprints, and what a trial's session is given."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.sweeps.grid import expand
from orchestrator.sweeps.scoring import score
from orchestrator.sweeps.spec import SweepFile, load_sweep
from orchestrator.sweeps.suites import SUITES, generate
from orchestrator.sweeps.suites.oolong_synth import CATEGORIES
from orchestrator.sweeps.tasks import CHARS_PER_TOKEN, Task
from orchestrator.sweeps.trial import CONTEXT_FILE, trial_input

ISSUE_EXAMPLE = """
name: niah-small
suites: [{suite: s-niah, tasks: 20, context_tokens: [8000, 64000]}]
models: [openai/gpt-4o-mini, {model: openai/qwen, api_base: "http://127.0.0.1:8000/v1"}]
variants: [{name: rlm}, {name: vanilla, rlm: false}]
seeds: [1, 2, 3]
budgets: {trial_tokens: 200000, sweep_cost_usd: 20}
concurrency: {trials: 8, sandboxes: 8}
providers: {openai: {connections: 4, requests_per_minute: 500}}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


def test_the_issues_example_loads(tmp_path: Path) -> None:
    spec = load_sweep(_write(tmp_path, ISSUE_EXAMPLE))
    assert spec.name == "niah-small"
    assert [m.label for m in spec.models] == [
        "openai/gpt-4o-mini",
        "openai/qwen@http://127.0.0.1:8000/v1",
    ]
    assert [(v.name, v.rlm) for v in spec.variants] == [("rlm", True), ("vanilla", False)]
    assert spec.concurrency.in_flight == 8 and spec.budgets.sweep_cost_usd == 20
    assert spec.providers["openai"].connections == 4


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("name: x\nsuites: [{suite: nosuch}]\nmodels: [openai/m]\n", "unknown suite 'nosuch'"),
        ("name: x\nsuites: [{suite: s-niah}]\nmodels: [gpt4]\n", "models[0]"),
        ("name: x\nsuites: [{suite: s-niah}]\nmodels: []\n", "models: must have at least 1"),
        ("name: x\nsuites: [{suite: s-niah}]\nmodels: [openai/m]\nbudget: {}\n", "unknown field"),
        ("name: x\nname: y\n", "duplicate key 'name'"),
        ("", "is empty"),
        (
            "name: x\nsuites: [{suite: s-niah}]\nmodels: [openai/m]\n"
            "variants: [{name: a}, {name: a, rlm: false}]\n",
            "each name must be used once",
        ),
        (
            "name: x\nsuites: [{suite: s-niah, context_tokens: [10]}]\nmodels: [openai/m]\n",
            "each length must be",
        ),
        (
            "name: x\nsuites: [{suite: s-niah}]\nmodels: [openai/m]\n"
            "providers: {openai: {connections: 0}}\n",
            "providers.openai.connections: must be >= 1",
        ),
        ("name: 'a b'\nsuites: [{suite: s-niah}]\nmodels: [openai/m]\n", "name: must be letters"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_sweep(_write(tmp_path, text))
    message = str(caught.value)
    assert needle in message and "\n" not in message and message.startswith(str(tmp_path))


# The gated suites have no long context (tests/unit/test_sweep_gpu_suites.py has the GPU ones).
GATED_SUITES = ("code-fix", "gpu-kernel", "nanogpt")
LONG_CONTEXT_SUITES = [s for s in SUITES if s not in GATED_SUITES]


@pytest.mark.parametrize("suite", LONG_CONTEXT_SUITES)
def test_suites_are_deterministic_and_sized(suite: str) -> None:
    first = generate(suite, 3, [1000, 4000], seed=7)
    again = generate(suite, 3, [1000, 4000], seed=7)
    other = generate(suite, 3, [1000, 4000], seed=8)
    assert [t.content_hash for t in first] == [t.content_hash for t in again]
    assert {t.content_hash for t in first}.isdisjoint(t.content_hash for t in other)
    assert len({t.id for t in first}) == 6
    for task in first:
        tokens = len(task.context) / CHARS_PER_TOKEN
        assert task.context_tokens is not None
        assert 0.9 * task.context_tokens <= tokens <= 1.1 * task.context_tokens + 50


def test_a_niah_haystack_holds_exactly_its_needle() -> None:
    for task in generate("s-niah", 5, [2000], seed=1):
        assert re.findall(r"\d+", task.context) == [task.expected]
        assert score(task, f"The special magic number is {task.expected}.") == 1.0
        assert score(task, f"It is {task.expected}9.") == 0.0


def test_oolong_answers_agree_with_the_records() -> None:
    for task in generate("oolong-synth", 8, [2000], seed=3):
        labels = re.findall(r"Category: (\w+)\.", task.context)
        counts = {c: labels.count(c) for c in CATEGORIES}
        if task.scoring == "numeric":
            (label,) = re.findall(r"category (\w+)\?", task.question)
            assert task.expected == counts[label]
        else:
            assert task.expected in CATEGORIES
            if "most frequent" in task.question:
                assert counts[task.expected] == max(counts.values())


def _task(scoring: str, expected: object) -> Task:
    return Task("t", "t/1", "q", "", expected, scoring)  # type: ignore[arg-type]


def test_scoring_rules() -> None:
    assert score(_task("numeric", 10), "There are 10 records.") == 1.0
    assert score(_task("numeric", 10), "I count 12") == pytest.approx(0.75**2)
    assert score(_task("numeric", 10), "no idea") == 0.0
    # A turn that stopped without an answer scores 0, whatever numbers its notice holds.
    notice = "stopped: 10 identical cells in a row (the model is stuck in a loop)"
    assert score(_task("numeric", 10), notice, "stuck") == 0.0
    assert score(_task("numeric", 10), "token budget of 10 spent", "budget_exceeded") == 0.0
    assert score(_task("numeric", 10), "There are 10 records.", "completed") == 1.0
    assert score(_task("exact", "billing"), "**Billing**") == 1.0
    assert score(_task("exact", "billing"), "Let me think.\nAnswer: billing.") == 1.0
    assert score(_task("exact", "billing"), "billing or shipping") == 0.0
    pairs = _task("pairs_f1", [["a", "b"], ["c", "d"]])
    assert score(pairs, "(b, a) and (c, d)") == 1.0
    assert score(pairs, "(a, b), (x, y)") == pytest.approx(0.5)


def _spec(**changes: object) -> SweepFile:
    base: dict[str, object] = {
        "name": "g",
        "suites": [{"suite": "s-niah", "tasks": 3, "context_tokens": [1000]}],
        "models": ["openai/a", "openai/b"],
        "variants": [{"name": "rlm"}, {"name": "vanilla", "rlm": False}],
        "seeds": [1, 2],
    }
    return SweepFile.model_validate({**base, **changes})


def test_cells_cross_everything_and_fingerprints_follow_what_changes_a_trial() -> None:
    cells = expand(_spec())
    assert len(cells) == 3 * 2 * 2 * 2
    assert len({c.fingerprint for c in cells}) == len(cells)
    same = expand(_spec(concurrency={"trials": 1}))  # how fast, not what: same cells
    assert [c.fingerprint for c in same] == [c.fingerprint for c in cells]
    budget = expand(_spec(budgets={"trial_tokens": 5000}))  # what a trial may do: new cells
    assert {c.fingerprint for c in budget}.isdisjoint(c.fingerprint for c in cells)
    more = expand(_spec(seeds=[1, 2, 3]))  # added seeds: the old cells are kept
    assert {c.fingerprint for c in cells} < {c.fingerprint for c in more}


def test_a_trial_gets_its_context_by_variant() -> None:
    rlm, vanilla = (c for c in expand(_spec(models=["openai/a"], seeds=[1]))[:2])
    given = trial_input(rlm, context_window=100_000)
    assert given.files == {CONTEXT_FILE: rlm.task.context}
    assert rlm.task.context not in given.prompt and CONTEXT_FILE in given.prompt
    full = trial_input(vanilla, context_window=100_000)
    assert vanilla.task.context in full.prompt and not full.truncated and not full.files
    cut = trial_input(vanilla, context_window=200)
    assert cut.truncated and len(cut.prompt) < len(vanilla.task.context)


def test_oolong_pairs_are_exactly_the_pairs_that_meet_the_condition() -> None:
    from itertools import combinations

    from orchestrator.sweeps.suites.oolong_pairs_synth import YEAR_WINDOW

    for task in generate("oolong-pairs-synth", 2, [1500], seed=5):
        people = re.findall(
            r"Record \d+: (.+?) lives in (\w+) and started working in (\d+)\.", task.context
        )
        assert len(people) == task.params["records"]
        truth = {
            frozenset((a[0], b[0]))
            for a, b in combinations(people, 2)
            if a[1] == b[1] and abs(int(a[2]) - int(b[2])) <= YEAR_WINDOW
        }
        assert {frozenset(p) for p in task.expected} == truth and truth
        answer = " ".join(f"({a}, {b})" for a, b in task.expected)
        assert score(task, answer) == 1.0
        assert 0 < score(task, answer.split(") (")[0] + ")") < 1


def test_the_example_sweep_file_loads() -> None:
    path = Path(__file__).parents[2] / "examples" / "sweeps" / "niah-small.yaml"
    spec = load_sweep(path)
    assert spec.name == "niah-small" and len(expand(spec)) == 20


EMBEDDED_SWEEP = Path(__file__).parents[2] / "examples" / "sweeps" / "embedded-small.yaml"


def test_the_embedded_sweep_names_both_variants_under_both_protocols() -> None:
    """The committed embedded sweep (docs/embedded-model.md): each entry reaches the daemon as
    the runner sends it (``settings.model``) and resolves to the embedded model of its variant
    under its own tool protocol; none needs a key (``check_models`` passes with no env)."""
    from orchestrator.api.protocol import SessionSettings
    from orchestrator.cli.sweep_runner import _session_settings, check_models
    from orchestrator.daemon.run_choices import model_settings
    from orchestrator.models.registry import resolve_model
    from orchestrator.settings import Settings

    spec = load_sweep(EMBEDDED_SWEEP)
    assert [m.label for m in spec.models] == [
        "embedded/0.5b+fenced",
        "embedded/0.5b+native",
        "embedded/1.5b+fenced",
        "embedded/1.5b+native",
    ]
    daemon_settings = Settings()
    check_models(spec, daemon_settings)
    seen = set()
    for cell in expand(spec):
        chosen = SessionSettings.model_validate(_session_settings(spec, cell))
        settings = model_settings(daemon_settings, cell.model.model, chosen)
        model = resolve_model(cell.model.model, settings, env={})
        assert model.embedded and model.selector == cell.model.model
        assert model.tool_protocol == cell.model.tool_protocol
        seen.add((model.embedded_variant, model.tool_protocol))
    assert seen == {(v, p) for v in ("0.5b", "1.5b") for p in ("fenced", "native")}
