"""Workload pods of ``charts/examples/`` on a real node, as levels 2 and 3 run them.

Each container runs busybox in place of its CUDA command and prints what it got (the env
var naming its GPU UUIDs, ``NVIDIA_VISIBLE_DEVICES``, the MIG UUIDs and cap nodes, the MPS
pipe, the ``/dev/nvidia*`` nodes of the CDI spec) into its termination message, which the
test reads from the pod status.
"""

from __future__ import annotations

import copy
import json
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import ControlPlane
from tests.e2e.kube import await_until
from tests.e2e.node import RealNode

EXAMPLES = Path(__file__).resolve().parents[2] / "charts" / "examples"
# What each container prints into its termination message.
REPORT = (
    'echo "uuids=$GPU_DRA_VISIBLE_GPU_UUIDS visible=$NVIDIA_VISIBLE_DEVICES'
    ' migs=$GPU_DRA_VISIBLE_MIG_UUIDS caps=$(ls /dev/nvidia-caps 2>/dev/null | sort | tr "\\n" ",")'
    " mps=$CUDA_MPS_PIPE_DIRECTORY:$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
    ':$(ls ${CUDA_MPS_PIPE_DIRECTORY:-/none} 2>/dev/null | tr "\\n" ",")'
    ' devices=$(ls /dev | grep nvidia | sort | tr "\\n" " ")" > /dev/termination-log'
)


def example_docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def runnable(pod: dict[str, Any], *, host_network: bool = True) -> dict[str, Any]:
    """The example pod, running our report instead of its CUDA command (on the host's
    network where the node has no pod network)."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    if host_network:
        spec["hostNetwork"] = True
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = 1
    for c in spec["containers"]:
        c["command"] = ["sh", "-c", REPORT]
        c.pop("args", None)
        c["imagePullPolicy"] = "IfNotPresent"
    return pod


def get_pod(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return cp.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def finished_pod(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    pod = get_pod(cp, ns, name)
    return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None


async def wait_finished(
    cp: ControlPlane, ns: str, name: str, wait_s: float = 180
) -> dict[str, Any]:
    try:
        done: dict[str, Any] = await await_until(
            f"pod {ns}/{name} finished", partial(finished_pod, cp, ns, name), wait_s
        )
    except TimeoutError as exc:
        status = get_pod(cp, ns, name).get("status")
        events = cp.call("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        said = [f"{e.get('reason')}: {e.get('message')}" for e in events]
        raise TimeoutError(f"{exc}: status {json.dumps(status)}; events {said}") from exc
    return done


def reports(pod: dict[str, Any]) -> dict[str, dict[str, str]]:
    """container -> what it printed: uuids, visible, migs, caps, mps, devices."""
    out = {}
    for status in pod["status"]["containerStatuses"]:
        message = status["state"]["terminated"].get("message", "")
        fields = dict(part.split("=", 1) for part in message.strip().split(" ", 5))
        out[status["name"]] = fields
    return out


async def run_example(
    cp: ControlPlane, ns: str, example: str, *, host_network: bool = True
) -> list[dict[str, Any]]:
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    await await_until(
        f"default SA in {ns}",
        lambda: cp.raw("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200,
    )
    pods = []
    for doc in example_docs(example):
        if doc["kind"] == "Pod":
            pods.append(cp.create(runnable(doc, host_network=host_network), ns))
        else:
            cp.create(doc, ns)
    done = []
    for pod in pods:
        name = pod["metadata"]["name"]
        finished = await wait_finished(cp, ns, name)
        assert finished["status"]["phase"] == "Succeeded", json.dumps(finished["status"])
        done.append(finished)
    return done


def spec_files(node: RealNode) -> list[Path]:
    """The CDI specs on the node (every driver's: the tier runs ours alone)."""
    return sorted(node.cdi_root.glob("*.json"))


async def delete_namespace_claims(cp: ControlPlane, ns: str) -> None:
    cp.raw("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    await await_until(f"pods of {ns} gone", lambda: not cp.call(
        "GET", f"/api/v1/namespaces/{ns}/pods")["items"], 120)  # fmt: skip
    claims = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
    for c in claims:
        cp.raw("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
               f"{c['metadata']['name']}")  # fmt: skip
    await await_until(f"claims of {ns} gone", lambda: not cp.call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"],
        120)  # fmt: skip
