"""R1 through the daemon with 200 seeded SIGKILLs (not in CI): `make test-stress`."""

from __future__ import annotations

import pytest

from orchestrator.testing import FakeModelServer
from tests.integration.test_r1_daemon import SCRIPT, run_iterations

pytestmark = pytest.mark.stress

STRESS_ITERATIONS = 200
STRESS_SEED = 1130
STRESS_TIMEOUT_S = 4 * 3600


@pytest.mark.timeout(STRESS_TIMEOUT_S)
def test_daemon_sigkill_stress() -> None:
    print(f"seed {STRESS_SEED}")
    with FakeModelServer(SCRIPT) as model:
        assert run_iterations(model, STRESS_ITERATIONS, STRESS_SEED) > 0
