"""Shards of a sweep (sweeps/shards.py): a partition of the cells by their fingerprints, the
same on every machine and in any order; ``--shard`` refused in one line when it is not i/N."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.errors import UserError
from orchestrator.sweeps.grid import expand
from orchestrator.sweeps.shards import MAX_SHARDS, Shard, parse_shard, shard_of
from orchestrator.sweeps.spec import load_sweep
from tests.helpers import cli

SWEEP = """
name: parts
suites: [{suite: s-niah, tasks: 5, context_tokens: [600, 1200]}, {suite: oolong-synth, tasks: 3}]
models: [openai/a, openai/b]
variants: [{name: rlm}, {name: vanilla, rlm: false}]
seeds: [1, 2]
"""


def _cells(tmp_path: Path) -> list[str]:
    path = tmp_path / "parts.yaml"
    path.write_text(SWEEP)
    return [c.fingerprint for c in expand(load_sweep(path))]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 16])
def test_the_shards_of_a_sweep_are_a_partition_in_any_order(tmp_path: Path, count: int) -> None:
    cells = expand(load_sweep(_write(tmp_path)))
    parts = [Shard(i, count).take(cells) for i in range(count)]
    taken = [c.fingerprint for part in parts for c in part]
    assert sorted(taken) == sorted(c.fingerprint for c in cells)  # each cell exactly once
    shuffled = list(cells)
    random.Random(count).shuffle(shuffled)
    for i, part in enumerate(parts):
        # Found in another order, a shard holds the same cells (kept in the order given).
        again = Shard(i, count).take(shuffled)
        assert {c.fingerprint for c in again} == {c.fingerprint for c in part}
        assert [c.fingerprint for c in part] == [c.fingerprint for c in cells if c in part]
    if count > 1:
        assert all(parts), "every shard of a 104-cell sweep has cells"


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "parts.yaml"
    path.write_text(SWEEP)
    return path


def test_a_cells_shard_is_its_fingerprint_as_a_number(tmp_path: Path) -> None:
    # Pinned: the rule must not change between versions, or shards of one sweep run on two
    # versions would overlap and miss cells.
    assert shard_of("0" * 31 + "5", 4) == 1
    assert shard_of("ff", 10) == 255 % 10
    for fingerprint in _cells(tmp_path):
        assert shard_of(fingerprint, 5) == int(fingerprint, 16) % 5


@given(st.lists(st.binary(min_size=1), min_size=1, max_size=50), st.integers(1, 50))
def test_any_fingerprints_fall_in_exactly_one_shard(keys: list[bytes], count: int) -> None:
    prints = [hashlib.sha256(k).hexdigest()[:32] for k in keys]
    owners = [[i for i in range(count) if Shard(i, count).owns(p)] for p in prints]
    assert all(len(o) == 1 for o in owners)


def test_shard_text_is_i_of_n_counted_from_zero() -> None:
    assert parse_shard("0/4") == Shard(0, 4)
    assert parse_shard(" 3 / 4 ") == Shard(3, 4)
    assert str(parse_shard("2/3")) == "2/3"
    assert Shard(1, 3).stem("niah") == "niah.shard-1-of-3"


@pytest.mark.parametrize(
    "text",
    ["3/2", "2/2", "0/0", "garbage", "-1/2", "1/2/3", "", "1/", "a/b", f"0/{MAX_SHARDS + 1}"],
)
def test_a_bad_shard_is_one_line(text: str) -> None:
    with pytest.raises(UserError) as raised:
        parse_shard(text)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"--shard {text}")
    assert "i/N" in message


def test_sweep_run_refuses_a_bad_shard_before_anything_runs(tmp_path: Path) -> None:
    path = _write(tmp_path)
    for text in ("3/2", "0/0", "garbage"):
        ran = cli(["sweep", "run", str(path), "--shard", text])
        assert ran.returncode == 2, ran.stderr
        (line,) = ran.stderr.splitlines()
        assert line.startswith(f"prime-agent: error: --shard {text}: use i/N")
