"""What the e2e levels share: waits, Node objects, the chart installed, plugin tokens."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.chart_render import NAMESPACE, render
from tests.e2e.cluster import ControlPlane, kubeconfig
from tests.pluginharness import NodeDirs

DRIVER = "gpu.nvidia.com"
# The image of the stand-in plugin Pod a token is bound to (built locally for a real node).
PLUGIN_POD_IMAGE = "gpu-dra-driver:e2e"


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout:.0f} s")
        time.sleep(0.1)


async def await_until(what: str, check: Callable[[], Any], wait_s: float = 60) -> Any:
    return await asyncio.to_thread(wait_until, what, check, wait_s)


def node_object(name: str, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": profile,
                "nvidia.com/gpu.present": "true",
            },
        },
    }


def node_status() -> dict[str, Any]:
    resources = {"cpu": "96", "memory": "1000Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "e2e: a Node without a kubelet, heartbeats off",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        }
    }


# Kubernetes minors that serve DeviceClass.spec.extendedResourceName (DRAExtendedResource
# is beta and on from 1.36; alpha and off before).
EXTENDED_RESOURCE_MINORS = frozenset({"1.36", "1.37", "1.38"})


def chart_objects(minor: str | None = None) -> list[dict[str, Any]]:
    """The chart's objects but the DaemonSet; legacy pods served where ``minor`` can."""
    sets = ["deviceClasses.gpu.extendedResourceName.enabled=true"]
    return [
        o
        for o in render((), sets if minor in EXTENDED_RESOURCE_MINORS else ())
        if o["kind"] != "DaemonSet"
    ]


# The chart's ServiceAccount: the plugin's identity.
(SA,) = [o["metadata"]["name"] for o in chart_objects() if o["kind"] == "ServiceAccount"]


def plugin_token(cp: ControlPlane, node: str, pod_name: str = "") -> str:
    """A token for the chart's ServiceAccount bound to a Pod on ``node`` (``pod_name``, by
    default ``gpu-dra-plugin-<node>``), as the kubelet gets."""
    pod = cp.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name or f"gpu-dra-plugin-{node}", "namespace": NAMESPACE},
        # On a real node its kubelet runs it: host network, an image it has, idle.
        "spec": {"serviceAccountName": SA, "nodeName": node, "hostNetwork": True,
                 "containers": [{"name": "plugin", "image": PLUGIN_POD_IMAGE,
                                 "imagePullPolicy": "IfNotPresent",
                                 "command": ["sleep", "86400"]}]},
    })  # fmt: skip
    return service_account_token(cp, SA, pod)


def service_account_token(cp: ControlPlane, account: str, pod: dict[str, Any] | None = None) -> str:
    """A token of ``account`` in the driver's namespace, bound to ``pod`` when given (as the
    kubelet gets a pod's)."""
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": 3600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1",
                                  "name": meta["name"], "uid": meta["uid"]}  # fmt: skip
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token"
    token: str = cp.call("POST", path, request)["status"]["token"]
    return token


def plugin_dirs(cp: ControlPlane, node: str, token: str) -> tuple[NodeDirs, Path]:
    """The host directories of ``node``'s plugin process, and its kubeconfig (``token``)."""
    dirs = NodeDirs(cp.root / "nodes" / node)
    dirs.root.mkdir(parents=True, exist_ok=True)
    config = dirs.root / "kubeconfig"
    config.write_text(kubeconfig(cp.server, cp.pki / "ca.crt", token=token))
    return dirs, config


def add_node(cp: ControlPlane, node: str, instance_type: str) -> tuple[NodeDirs, Path]:
    """A Ready Node of ``instance_type``; its plugin's directories and kubeconfig."""
    cp.create(node_object(node, instance_type))
    patch_node_ready(cp, node)
    return plugin_dirs(cp, node, plugin_token(cp, node))


def patch_node_ready(cp: ControlPlane, node: str) -> None:
    code, out = cp.raw(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        node_status(),
        content_type="application/merge-patch+json",
    )
    assert code == 200, out
    # The TaintNodesByCondition admission plugin taints every new Node not-ready; the
    # node-lifecycle controller (off here) would lift it once the Node reports Ready.
    code, out = cp.raw(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"spec": {"taints": None}},
        content_type="application/merge-patch+json",
    )
    assert code == 200, out


def install_chart(cp: ControlPlane) -> None:
    """The chart's namespace, RBAC, admission policies and DeviceClasses (no DaemonSet)."""
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for obj in chart_objects(cp.minor):
        if obj["kind"] != "Namespace":
            cp.create(obj, NAMESPACE)


WORKLOADS = ("Job", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")


def as_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """A workload's pod, as its controller would create it (no controller is needed here)."""
    if obj["kind"] not in WORKLOADS:
        return obj
    template = obj["spec"]["template"]
    spec = copy.deepcopy(template["spec"])
    spec.setdefault("restartPolicy", "Never")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": obj["metadata"]["name"]},
            "spec": spec}  # fmt: skip


# ---- DeviceTaintRule: the drain recipe of docs/operations.md ----------------------------------

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
TAINT_RULES = "/apis/resource.k8s.io/v1/devicetaintrules"


def recipe_rule(node: str, device: str, effect: str) -> dict[str, Any]:
    """The DeviceTaintRule of the drain recipe in docs/operations.md, for this device."""
    section = OPERATIONS.read_text().split("## Draining a GPU or a node", 1)[1]
    rule: dict[str, Any] = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    rule["metadata"]["name"] = f"drain-{node}-{device}-{effect.lower()}"
    rule["spec"]["deviceSelector"].update(pool=node, device=device)
    rule["spec"]["taint"]["effect"] = effect
    return rule


async def explain_cluster(cp: ControlPlane, claim: dict[str, Any], node: str) -> dict[str, Any]:
    """`gpu-dra explain --cluster -o json` limited to one node, as an admin runs it."""
    path = cp.root / f"explain-{claim['metadata']['name']}.json"
    path.write_text(json.dumps(claim))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "explain", "--cluster", "--kubeconfig",
        str(cp.admin_kubeconfig), "-f", str(path), "--node", node, "-o", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode in (0, 1), err.decode()
    body: dict[str, Any] = json.loads(out)
    return body
