"""A test-only "kubelet": runs a session Pod that orchestrator/sandbox/k8s_manifests.py built
on the local Docker Engine, as a node would: the pod's image, command, user and groups,
read-only root, dropped capabilities, no privilege escalation, CPU and memory limits, its
emptyDirs (in memory as tmpfs, on disk as a host directory) and its Secret as read-only files.
No cluster is involved; the translation covers the fields our builder writes and refuses any
volume kind it does not know.

The image's ``orchestrator`` package is replaced by this checkout's (bound read-only over it),
so the pod runs the gateway of the code under test whichever source the shared session image
was last built from (docs/kubernetes.md, "Tests")."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.sandbox.k8s_pod_info import quantity as parse_quantity

__all__ = ["RunningPod", "quantity", "run_pod"]

SOURCE_PACKAGE: Final = Path(__file__).resolve().parents[1] / "orchestrator"
IMAGE_PACKAGE: Final = "/opt/prime-agent/lib/python3.11/site-packages/orchestrator"
TEST_LABEL: Final = "prime-agent.test"
TEST_LABEL_VALUE: Final = "k8s-pod"
NANO_CPUS_PER_CPU: Final = 1_000_000_000
LOOPBACK: Final = "127.0.0.1"
# Kubernetes quantities our builder writes: plain integers, millicores, binary suffixes.
SETGID_DIR_MODE: Final = 0o2777  # what a kubelet gives an emptyDir under fsGroup (group rw)


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number (``1500m`` -> 1.5, ``512Mi`` -> 536870912), read as
    the backend reads one (``k8s_pod_info.quantity``); one it cannot read stops the pod."""
    value = parse_quantity(text)
    if value is None:
        raise ValueError(f"quantity {text!r} is not one the test kubelet reads")
    return value


@dataclass
class RunningPod:
    container: Any  # docker's Container
    ports: dict[str, int]  # container port name -> host port on 127.0.0.1


def _give_group(path: Path, gid: int, mode: int) -> None:
    if os.getuid() == 0:
        os.chown(path, 0, gid)
        path.chmod(mode)
    else:  # not root: the group cannot be given away, so others get what the group would
        path.chmod(mode | ((mode & 0o070) >> 3))


@contextlib.contextmanager
def run_pod(docker: Any, pod: Mapping[str, Any], secret: Mapping[str, Any]) -> Iterator[RunningPod]:
    """Run ``pod`` (with ``secret`` as its Secret) until the block ends; then remove it."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    pod_context = spec["securityContext"]
    context = {**pod_context, **container["securityContext"]}
    fs_group = int(pod_context["fsGroup"])
    limits = container["resources"]["limits"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    tmpfs: dict[str, str] = {}
    binds: dict[str, dict[str, str]] = {str(SOURCE_PACKAGE): {"bind": IMAGE_PACKAGE, "mode": "ro"}}
    with tempfile.TemporaryDirectory(prefix="prime-agent-k8s-pod-") as host_dir:
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            mode = "ro" if mount.get("readOnly") else "rw"
            if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
                size = int(quantity(volume["emptyDir"]["sizeLimit"]))
                # A kubelet mounts a fresh 0777 tmpfs; this engine gives a tmpfs over an image
                # directory that directory's owner and mode, so the pod's user is made its owner.
                owner = f"uid={context['runAsUser']},gid={fs_group}"
                tmpfs[mount["mountPath"]] = f"size={size},mode=1777,{owner}"
            elif "emptyDir" in volume:
                directory = Path(host_dir) / mount["name"]
                directory.mkdir()
                _give_group(directory, fs_group, SETGID_DIR_MODE)
                binds[str(directory)] = {"bind": mount["mountPath"], "mode": mode}
            elif "secret" in volume:
                assert volume["secret"]["secretName"] == secret["metadata"]["name"]
                directory = Path(host_dir) / mount["name"]
                directory.mkdir()
                for key, value in secret["stringData"].items():
                    (directory / key).write_text(value)
                    _give_group(directory / key, fs_group, volume["secret"]["defaultMode"])
                _give_group(directory, fs_group, 0o755)
                binds[str(directory)] = {"bind": mount["mountPath"], "mode": mode}
            else:
                raise ValueError(f"volume {mount['name']}: a kind the test kubelet lacks")
        ports = {
            f"{port['containerPort']}/{port['protocol'].lower()}": (LOOPBACK, None)
            for port in container["ports"]
        }
        name = f"{pod['metadata']['name']}-{secrets.token_hex(3)}"
        started = docker.containers.run(
            container["image"],
            container["command"],
            name=name,
            detach=True,
            labels={TEST_LABEL: TEST_LABEL_VALUE},
            user=f"{context['runAsUser']}:{context['runAsGroup']}",
            group_add=[str(fs_group)],
            environment={e["name"]: e["value"] for e in container["env"]},
            working_dir=container["workingDir"],
            read_only=context["readOnlyRootFilesystem"],
            cap_drop=context["capabilities"]["drop"],
            security_opt=[] if context["allowPrivilegeEscalation"] else ["no-new-privileges"],
            privileged=context["privileged"],
            mem_limit=int(quantity(limits["memory"])),
            memswap_limit=int(quantity(limits["memory"])),
            nano_cpus=int(quantity(limits["cpu"]) * NANO_CPUS_PER_CPU),
            tmpfs=tmpfs,
            volumes=binds,
            ports=ports,
            hostname=spec["hostname"],
            init=True,
        )
        try:
            started.reload()
            published = started.attrs["NetworkSettings"]["Ports"]
            by_name = {
                port["name"]: int(
                    published[f"{port['containerPort']}/{port['protocol'].lower()}"][0]["HostPort"]
                )
                for port in container["ports"]
            }
            yield RunningPod(started, by_name)
        finally:
            started.remove(force=True)
