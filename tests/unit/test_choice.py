"""The backend rule of ``orchestrator/sandbox/choice.py``, branch by branch: which backend, which
warning, which error, and which backends were even looked at (a probe costs a docker ping, a
bwrap start or a call to a cluster's API server)."""

from __future__ import annotations

import typing

import pytest

from orchestrator.cli.run import Backend
from orchestrator.control.eval_config import EvalConfig
from orchestrator.errors import UserError
from orchestrator.sandbox.choice import (
    BACKEND_CHOICES,
    KUBERNETES_FIX,
    LOCAL_WARNING,
    BackendChoice,
    BackendRequest,
    choose_backend,
)
from orchestrator.sessions.runner import RunOptions
from tests.helpers import CI_ENV, CI_VALUE, need


class Status:
    """A backend's ``(usable, why not)`` as a test sets it; counts how often it is asked."""

    def __init__(self, usable: bool, why: str = ""):
        self.usable = usable
        self.why = why
        self.calls = 0

    def __call__(self) -> tuple[bool, str]:
        self.calls += 1
        return self.usable, self.why


def unasked() -> tuple[bool, str]:
    raise AssertionError("the kubernetes status was asked for another backend")


def up() -> Status:
    return Status(True)


def down(why: str) -> Status:
    return Status(False, why)


def test_local_is_local_with_its_warning_and_probes_nothing() -> None:
    docker, bwrap = up(), up()
    choice = choose_backend("local", docker, bwrap, kubernetes_status=unasked)
    assert choice == BackendChoice("local", LOCAL_WARNING)
    assert "does not isolate" in choice.warning and "\n" not in choice.warning
    assert docker.calls == bwrap.calls == 0


def test_auto_is_docker_when_docker_is_usable_without_probing_bwrap() -> None:
    docker, bwrap = up(), up()
    assert choose_backend("auto", docker, bwrap, kubernetes_status=unasked) == BackendChoice(
        "docker"
    )
    assert docker.calls == 1 and bwrap.calls == 0


def test_auto_is_bwrap_without_docker_and_with_no_warning() -> None:
    docker, bwrap = down("no engine"), up()
    assert choose_backend("auto", docker, bwrap, kubernetes_status=unasked) == BackendChoice(
        "bwrap"
    )
    assert docker.calls == 1 and bwrap.calls == 1


def test_auto_refuses_in_one_line_naming_both_fixes_when_neither_works() -> None:
    with pytest.raises(UserError) as caught:
        choose_backend(
            "auto",
            down("no engine"),
            down("bubblewrap is not installed"),
            kubernetes_status=unasked,
        )
    text = str(caught.value)
    assert "\n" not in text
    assert "docker (no engine)" in text and "bwrap (bubblewrap is not installed)" in text
    assert "make images" in text and "install bubblewrap" in text
    assert "--backend local" in text  # the way to run anyway, unsandboxed


def test_docker_explicit_is_docker_or_an_error_and_never_another_backend() -> None:
    bwrap = up()
    assert choose_backend("docker", up(), bwrap, kubernetes_status=unasked) == BackendChoice(
        "docker"
    )
    with pytest.raises(UserError, match="the docker backend is not usable: no engine"):
        choose_backend("docker", down("no engine"), bwrap, kubernetes_status=unasked)
    assert bwrap.calls == 0


def test_bwrap_explicit_is_bwrap_or_an_error_and_never_asks_docker() -> None:
    docker = up()
    assert choose_backend("bwrap", docker, up(), kubernetes_status=unasked) == BackendChoice(
        "bwrap"
    )
    with pytest.raises(UserError, match="the bwrap backend is not usable: refused"):
        choose_backend("bwrap", docker, down("refused"), kubernetes_status=unasked)
    assert docker.calls == 0


def test_an_unknown_backend_is_refused_naming_the_choices() -> None:
    docker, bwrap = up(), up()
    with pytest.raises(
        UserError, match="unknown backend 'podman'; use auto, docker, bwrap, local, kubernetes"
    ):
        choose_backend("podman", docker, bwrap, kubernetes_status=unasked)
    assert docker.calls == bwrap.calls == 0


def test_kubernetes_is_chosen_only_by_name_and_only_when_its_cluster_answers() -> None:
    docker, bwrap, cluster = up(), up(), up()
    choice = choose_backend("kubernetes", docker, bwrap, kubernetes_status=cluster)
    assert choice == BackendChoice("kubernetes") and not choice.warning
    assert (docker.calls, bwrap.calls, cluster.calls) == (0, 0, 1)
    why = "no usable cluster configuration: Invalid kube-config file. No configuration found."
    with pytest.raises(UserError) as caught:
        choose_backend("kubernetes", docker, bwrap, kubernetes_status=down(why))
    text = str(caught.value)
    assert text.startswith(f"the kubernetes backend is not usable: {why}; ") and "\n" not in text
    assert text.endswith(KUBERNETES_FIX) and "$KUBECONFIG" in text  # what to do
    # auto never asks the cluster, even when nothing else works here.
    with pytest.raises(UserError, match="no sandbox backend is usable here"):
        choose_backend("auto", down("no engine"), down("refused"), kubernetes_status=cluster)
    assert cluster.calls == 1


def test_every_place_that_names_the_backends_names_the_same_ones() -> None:
    assert tuple(b.value for b in Backend) == BACKEND_CHOICES  # --backend of run and import
    assert typing.get_args(BackendRequest) == BACKEND_CHOICES
    assert typing.get_type_hints(RunOptions)["backend"] == BackendRequest
    field = EvalConfig.model_fields["backend"].annotation
    assert set(typing.get_args(typing.get_args(field)[0])) == set(BACKEND_CHOICES)


def test_need_skips_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CI_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="docker: no engine"):
        need("docker", "no engine")
    monkeypatch.setenv(CI_ENV, "false")
    with pytest.raises(pytest.skip.Exception):
        need("bwrap", "not installed")
    monkeypatch.setenv(CI_ENV, CI_VALUE)
    with pytest.raises(pytest.fail.Exception, match="bwrap is missing and CI=true"):
        need("bwrap", "not installed")
