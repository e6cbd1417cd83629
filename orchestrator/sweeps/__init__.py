"""Sweeps: benchmark grids of suites × models × variants × seeds (issue 19, docs/sweeps.md).

This package is what a sweep *is* — the file (``spec``), its built-in suites (``suites``), its
cells and their fingerprints (``grid``), what a trial's session is given (``trial``) and how an
answer scores (``scoring``). Running one is the CLI's (``cli/sweep_runner.py``, through the
daemon, which keeps the tables: ``store/sweeps.py``).
"""
