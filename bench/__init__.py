"""Benchmarks of Prime Agent, run by ``make bench`` (``python -m bench``); see docs/benchmarks.md.

Not tests: nothing here asserts on a timing. Each benchmark module has ``run(quick=False)``
returning ``{"rows": [...], "notes": [...]}`` (see ``bench.common.row``); the runner in
``bench.__main__`` prints medians, p90s and ratios against the reference figures, and writes
``bench/results/latest.json``.
"""
