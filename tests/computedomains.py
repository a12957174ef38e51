"""ComputeDomain objects for the controller's tests: a domain, and what its daemons write."""

import uuid
from typing import Any

from cluster.computedomain.objects import DaemonSettings
from driver.common.wire import Obj
from drivers.computedomain import names

DRIVER_NAMESPACE = "gpu-dra"
SETTINGS = DaemonSettings(namespace=DRIVER_NAMESPACE, image="registry.example/gpu-dra:1")


def domain(
    name: str = "cd1",
    *,
    namespace: str = "default",
    num_nodes: int | None = 2,
    template: str = "cd1-channel",
    mode: str | None = None,
    uid: str | None = None,
    **meta: Any,
) -> Obj:
    channel: Obj = {"resourceClaimTemplate": {"name": template}}
    if mode is not None:
        channel["allocationMode"] = mode
    spec: Obj = {"channel": channel}
    if num_nodes is not None:
        spec["numNodes"] = num_nodes
    metadata: Obj = {"name": name, "namespace": namespace, **meta}
    if uid is not None:
        metadata["uid"] = uid
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.COMPUTE_DOMAIN_KIND,
        "metadata": metadata,
        "spec": spec,
    }


def daemon_pod(
    uid: str,
    node: str,
    *,
    ip: str = "",
    clique: str | None = "c1.0",
    ready: bool = True,
    owner: Obj | None = None,
) -> Obj:
    labels = {names.COMPUTE_DOMAIN_LABEL: uid}
    if clique is not None:
        labels[names.CLIQUE_LABEL] = clique
    meta: Obj = {"name": f"daemon-{node}", "namespace": DRIVER_NAMESPACE, "labels": labels}
    if owner is not None:  # as the DaemonSet controller makes its pods
        meta["ownerReferences"] = [
            {
                **_owner(owner, "apps/v1", "DaemonSet"),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    status: Obj = {"phase": "Running"}
    if ip:
        status["podIP"] = ip
    status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "d", "image": "i"}]},
        "status": status,
    }


def clique(uid: str, clique_id: str, daemons: list[Obj], *, owners: tuple[Obj, ...] = ()) -> Obj:
    meta: Obj = {
        "name": f"{uid}.{clique_id}",
        "namespace": DRIVER_NAMESPACE,
        "labels": {names.COMPUTE_DOMAIN_LABEL: uid, names.CLIQUE_LABEL: clique_id},
    }
    if owners:
        meta["ownerReferences"] = [_owner(p, "v1", "Pod") for p in owners]
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.CLIQUE_KIND,
        "metadata": meta,
        "daemons": daemons,
    }


def daemon(node: str, ip: str, index: int, *, clique_id: str = "c1.0", ready: bool = True) -> Obj:
    return {
        "nodeName": node,
        "ipAddress": ip,
        "cliqueID": clique_id,
        "index": index,
        "status": names.READY if ready else names.NOT_READY,
    }


def _owner(obj: Obj, api_version: str, kind: str) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
    }


def new_uid() -> str:
    return str(uuid.uuid4())
