"""R1 with 200 seeded iterations (not in CI): `make test-stress`."""

from __future__ import annotations

import random

import pytest

from orchestrator.testing import FakeModelServer
from tests.integration.test_r1_durability import SCRIPT, kill_and_check

pytestmark = pytest.mark.stress

STRESS_ITERATIONS = 200
STRESS_SEED = 1129
# 200 runs of a few seconds each: the suite's default per-test timeout (120 s) cut it short.
STRESS_TIMEOUT_S = 4 * 3600


@pytest.mark.timeout(STRESS_TIMEOUT_S)
def test_sigkill_stress() -> None:
    rng = random.Random(STRESS_SEED)
    print(f"seed {STRESS_SEED}")
    with FakeModelServer(SCRIPT) as srv:
        for _ in range(STRESS_ITERATIONS):
            srv.load(SCRIPT)
            kill_and_check(srv.url, rng)
