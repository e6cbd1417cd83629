"""``sweep submit FILE --shards N``: the sweep's Indexed Job and its ConfigMap, printed as YAML
(``--dry-run``) or created in the current kubeconfig context's namespace with the official
``kubernetes`` client. The manifests are ``sweeps/k8s_job.py``'s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from orchestrator.errors import UserError

__all__ = ["DEFAULT_NAMESPACE", "manifests_yaml", "submit"]

DEFAULT_NAMESPACE: Final = "default"
_NO_CLUSTER: Final = (
    "no Kubernetes cluster to submit to: no kubeconfig (set KUBECONFIG or write ~/.kube/config) "
    "and not running in a cluster; --dry-run prints the manifests instead"
)


def manifests_yaml(manifests: Sequence[dict[str, Any]]) -> str:
    """The manifests as one YAML stream; a text of several lines (the sweep file) as a block."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(list(manifests), Dumper=Dumper, sort_keys=False)


def _load_config(namespace: str | None) -> str:
    """Load the current kubeconfig context (or the in-cluster account); the namespace to use."""
    from kubernetes import config as loaded

    # The client's loaders carry no annotations: used through Any.
    config: Any = loaded
    try:
        config.load_kube_config()
    except (config.ConfigException, OSError, TypeError):
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise UserError(_NO_CLUSTER) from None
        return namespace or DEFAULT_NAMESPACE
    if namespace:
        return namespace
    _, current = config.list_kube_config_contexts()
    chosen = (current or {}).get("context", {}).get("namespace")
    return str(chosen or DEFAULT_NAMESPACE)


def submit(manifests: Sequence[dict[str, Any]], namespace: str | None) -> str:
    """Create the ConfigMap, then the Job; the namespace they went to."""
    from kubernetes import client as typed_client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    # The generated API classes want their model objects; they send plain dicts as they are.
    client: Any = typed_client
    where = _load_config(namespace)
    api = client.ApiClient()
    created: list[str] = []
    try:
        for manifest in manifests:
            kind = manifest["kind"]
            if kind == "ConfigMap":
                client.CoreV1Api(api).create_namespaced_config_map(where, manifest)
            elif kind == "Job":
                client.BatchV1Api(api).create_namespaced_job(where, manifest)
            else:
                raise AssertionError(f"unexpected manifest {kind}")
            created.append(f"{kind}/{manifest['metadata']['name']}")
    except ApiException as exc:
        done = f" (created: {', '.join(created)})" if created else ""
        reason = " ".join(str(exc.reason or exc.status).split())
        raise UserError(
            f"the cluster refused {manifest['kind']}/{manifest['metadata']['name']} in "
            f"namespace {where}: {exc.status} {reason}{done}"
        ) from None
    except (HTTPError, OSError) as exc:
        shown = " ".join(str(exc).split())
        raise UserError(f"cannot reach the cluster of the current context: {shown}") from None
    finally:
        api.close()
    return where
