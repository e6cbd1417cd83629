"""Writes the `make demo` task's file: DIR/notes.txt, 2,000 lines of prose of which exactly one
states a number (the kind of task a new user tries first; docs/embedded-model.md).

    python examples/demo/make_notes.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

LINES = 2000
NEEDLE_LINE = 1337  # 0-based
NEEDLE = "The delivery code for the spring order is 58271."
WORDS = (
    "the garden path runs past an old stone wall where ivy climbs slowly toward the light "
    "while sparrows argue over seeds and a cat watches from the shade of the pear tree"
).split()
WORDS_PER_LINE = 9


def notes() -> str:
    lines = []
    for i in range(LINES):
        if i == NEEDLE_LINE:
            lines.append(NEEDLE)
            continue
        start = (i * 7) % len(WORDS)
        words = [WORDS[(start + k) % len(WORDS)] for k in range(WORDS_PER_LINE)]
        lines.append(" ".join(words).capitalize() + ".")
    return "\n".join(lines) + "\n"


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "notes.txt").write_text(notes())


if __name__ == "__main__":
    main()
