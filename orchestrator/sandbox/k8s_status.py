"""Whether the kubernetes backend is usable here: the status check ``sandbox/choice.py`` asks
before it picks ``kubernetes`` (print mode, the daemon, import, ``doctor``).

Usable means: ``k8s_api.api_client`` finds a cluster configuration for ``[kubernetes]``
(in-cluster, or the kubeconfig and its context), AND that cluster's API server answers a list
of the pods of ``[kubernetes] namespace`` (the first call the backend's own work needs, and one
its Role allows) within ``STATUS_TIMEOUT_S``. Otherwise ``(False, why)``, why in one line. The
official client is imported only when this is called: choosing docker never loads it.
"""

from __future__ import annotations

from typing import Any, Final

from orchestrator.errors import SandboxError
from orchestrator.settings import KubernetesSettings

__all__ = ["STATUS_TIMEOUT_S", "kubernetes_usable"]

# An API server that does not answer a list within this long is not usable (a status check
# must not hang a session's creation or ``doctor``).
STATUS_TIMEOUT_S: Final = 5.0
STATUS_LIST_LIMIT: Final = 1


def kubernetes_usable(settings: KubernetesSettings) -> tuple[bool, str]:
    """``(True, "")`` when the cluster of ``settings`` answers, else ``(False, why)``."""
    from kubernetes import client as typed_client
    from urllib3.exceptions import HTTPError as Urllib3Error

    from orchestrator.sandbox.k8s_api import api_client

    k8s: Any = typed_client  # the client carries no annotations
    try:
        client = api_client(settings)
    except SandboxError as exc:
        return False, str(exc).removeprefix("kubernetes: ")
    try:
        k8s.CoreV1Api(client).list_namespaced_pod(
            settings.namespace, limit=STATUS_LIST_LIMIT, _request_timeout=STATUS_TIMEOUT_S
        )
    except k8s.exceptions.ApiException as exc:
        return False, (
            f"the API server at {client.configuration.host} refused to list pods in namespace "
            f"{settings.namespace} ({exc.status}: {exc.reason})"
        )
    except (Urllib3Error, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return False, f"the API server at {client.configuration.host} did not answer ({reason})"
    finally:
        client.close()
    return True, ""
