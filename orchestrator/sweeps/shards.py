"""A sweep split into shards: ``sweep run FILE --shard i/N`` runs the cells of shard ``i``.

A cell belongs to the shard its fingerprint names: the fingerprint (``sweeps/grid.py``) is a
hash of what the cell is, so ``int(fingerprint, 16) % N`` is the same on every machine and in
every run, whatever order the cells are found in, and every cell is in exactly one shard.
Shards are counted from 0, as an Indexed Job's ``JOB_COMPLETION_INDEX`` is.

A shard's results go to ``<export dir>/<sweep>.shard-<i>-of-<N>.cells.parquet`` (and
``.trials.parquet``): the file names are fixed, so a retried shard replaces its own export.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from orchestrator.errors import UserError

if TYPE_CHECKING:
    from orchestrator.sweeps.grid import Cell

__all__ = [
    "CELLS_SUFFIX",
    "MAX_SHARDS",
    "TRIALS_SUFFIX",
    "Shard",
    "parse_shard",
    "shard_of",
]

# An Indexed Job's completions are at most 100,000; a sweep has at most as many cells.
MAX_SHARDS: Final = 100_000
CELLS_SUFFIX: Final = ".cells.parquet"
TRIALS_SUFFIX: Final = ".trials.parquet"
_SHARD_TEXT: Final = re.compile(r"^\s*(\d{1,6})\s*/\s*(\d{1,6})\s*$")
_FINGERPRINT_BASE: Final = 16


def shard_of(fingerprint: str, count: int) -> int:
    """The shard (0..count-1) that runs the cell of ``fingerprint``."""
    return int(fingerprint, _FINGERPRINT_BASE) % count


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS or not 0 <= self.index < self.count:
            raise UserError(
                f"--shard {self.index}/{self.count}: use i/N with 0 <= i < N <= {MAX_SHARDS} "
                "(shards count from 0)"
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, fingerprint: str) -> bool:
        return shard_of(fingerprint, self.count) == self.index

    def take(self, cells: Sequence[Cell]) -> list[Cell]:
        """This shard's cells, in the order given."""
        return [c for c in cells if self.owns(c.fingerprint)]

    def stem(self, sweep: str) -> str:
        """The name of this shard's export files, without their suffix."""
        return f"{sweep}.shard-{self.index}-of-{self.count}"


def parse_shard(text: str) -> Shard:
    """``"i/N"`` as a ``Shard``; anything else is one line saying what to write."""
    match = _SHARD_TEXT.match(text)
    if match is None:
        raise UserError(f"--shard {text}: use i/N, e.g. --shard 0/4 (shards count from 0)")
    return Shard(int(match.group(1)), int(match.group(2)))
