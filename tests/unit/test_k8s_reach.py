"""``[kubernetes] reach`` (orchestrator/sandbox/k8s_port_forward.py): how the orchestrator
reaches a pod's gateway. ``auto`` is the pod's IP when the orchestrator runs in a pod
(``KUBERNETES_SERVICE_HOST`` set) and a port-forward through the API server otherwise; the
explicit choices hold either way; a bad value is one line naming the key. The port-forward
path itself runs in tests/integration/test_k8s_api_calls.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.sandbox.k8s_port_forward import uses_port_forward
from orchestrator.settings import KubernetesSettings, load_settings

IN_CLUSTER = "KUBERNETES_SERVICE_HOST"


@pytest.mark.parametrize(
    ("reach", "in_pod", "forwarded"),
    [
        ("auto", True, False),
        ("auto", False, True),
        ("pod-ip", False, False),
        ("port-forward", True, True),
    ],
)
def test_reach_picks_the_pod_ip_in_a_pod_and_port_forward_outside(
    monkeypatch: pytest.MonkeyPatch, reach: str, in_pod: bool, forwarded: bool
) -> None:
    if in_pod:
        monkeypatch.setenv(IN_CLUSTER, "10.96.0.1")
    else:
        monkeypatch.delenv(IN_CLUSTER, raising=False)
    settings = KubernetesSettings.model_validate({"reach": reach})
    assert uses_port_forward(settings) is forwarded


def test_the_default_reach_is_the_pod_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IN_CLUSTER, raising=False)
    assert KubernetesSettings().reach == "pod-ip"
    assert not uses_port_forward(KubernetesSettings())


def test_a_bad_reach_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[kubernetes]\nreach = "tunnel"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert "kubernetes.reach" in message and "\n" not in message
