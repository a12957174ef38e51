"""Level 3: the pod shows its GPU's health (KEP-4680, ``ResourceHealthStatus``, beta and on from
1.36), through the real kubelet.

An XID on the simulated GPU a running pod holds becomes, through the plugin's
``DRAResourceHealth`` stream, ``Unhealthy`` for that device in the pod's
``containerStatuses[].allocatedResourcesStatus``; the plugin's recovery probes clear it and
the pod says ``Healthy`` again. The time from the event to each pod status is printed.
Runs inside :mod:`tests.e2e.netns` (``make e2e`` does that); elsewhere it is skipped.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from driver.nvml.faults import Faults, XidEvent, gpu_lost
from driver.nvml.profile import load_profile
from driver.nvml.simulated import SimulatedNvml
from tests.e2e.cluster import ControlPlane
from tests.e2e.installed import LEVEL3, MINOR, Installed, create_namespace, simulated_node
from tests.e2e.kube import as_pod, await_until, wait_until
from tests.e2e.node import commands
from tests.e2e.workloads import example_docs, get_pod, runnable
from tests.simroot import NODE as SIM_NODE

pytestmark = [
    *LEVEL3,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        tuple(map(int, MINOR.split("."))) < (1, 36),
        reason="ResourceHealthStatus is alpha and off before 1.36: the kubelet writes no health",
    ),
]

PROFILE = "p4d.24xlarge"
RECOVERABLE_XID = 8  # in the chart's health.autoRecover.xids by default
NS = "health"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def release() -> AsyncIterator[Installed]:
    async with simulated_node(f"l3h-{MINOR}", PROFILE) as node:
        create_namespace(node.cp)
        await node.install(
            "--set", "health.autoRecover.probes=2", "--set", "health.autoRecover.periodSeconds=1"
        )
        yield node


_CLAIMS = ("ResourceClaim", "ResourceClaimTemplate")


def _holder(cp: ControlPlane) -> dict[str, Any]:
    """The single-GPU example's pod, kept running; its claim once the pod runs."""
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    wait_until(f"default SA in {NS}", lambda: cp.raw(
        "GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200)  # fmt: skip
    for claim in (d for d in example_docs("single-gpu.yaml") if d["kind"] in _CLAIMS):
        cp.create(claim, NS)
    _run_example_pod(cp, "holder")
    (claim,) = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]
    return dict(claim)


def _run_example_pod(cp: ControlPlane, name: str) -> None:
    """One more of the single-GPU example's pods (its claims made), kept running."""
    docs = example_docs("single-gpu.yaml")
    pod = runnable(as_pod(next(d for d in docs if d["kind"] not in _CLAIMS)), host_network=False)
    pod["metadata"] = {"name": name}
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", "exec sleep 3600"]
    cp.create(pod, NS)
    wait_until(f"{name} running", lambda: get_pod(cp, NS, name).get("status", {}).get(
        "phase") == "Running", 120)  # fmt: skip


def _health(cp: ControlPlane) -> dict[str, str]:
    """resourceID -> health, as the kubelet wrote the holder's container status."""
    statuses = get_pod(cp, NS, "holder").get("status", {}).get("containerStatuses") or []
    return {
        r["resourceID"]: r.get("health", "")
        for s in statuses
        for a in s.get("allocatedResourcesStatus") or []
        for r in a.get("resources") or []
    }


def _minor(cp: ControlPlane, device: str) -> int:
    slices = cp.call("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    (found,) = [d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == device]
    return int(found["attributes"]["minor"]["int"])


def _plugin_pids() -> list[int]:
    return [pid for pid, argv in commands()
            if b"kubelet-plugin" in argv and any(a.endswith(b"gpu-dra") for a in argv)]  # fmt: skip


def _render(driver_root: Path, *xids: XidEvent, lost: int | None = None) -> None:
    """The node's hardware file with ``xids`` and GPU ``lost`` (a minor) fallen off the bus, as
    fake_root laid it out (its node name seeds the GPUs' UUIDs); the plugin's rediscovery
    (SIGHUP) re-reads it, and its event set then sees each new XID once."""
    gone = () if lost is None else gpu_lost(lost)
    nvml = SimulatedNvml(load_profile(PROFILE), driver_root, node_name=SIM_NODE,
                         faults=Faults(xid_events=xids, failing_queries=gone))  # fmt: skip
    nvml.render()
    for pid in _plugin_pids():
        os.kill(pid, signal.SIGHUP)


async def test_an_xid_shows_in_the_pods_status_and_clears_on_recovery(
    release: Installed,
) -> None:
    cp = release.cp
    claim = _holder(cp)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    # The kubelet names a device by its CDI ID there (seen at 1.37), not driver/pool/device.
    resource_id = f"k8s.{result['driver']}/claim={claim['metadata']['uid']}-{result['device']}"
    try:
        await await_until(
            "the pod's device health reported",
            lambda: _health(cp).get(resource_id) == "Healthy" or None,
            90,
        )
    except TimeoutError as exc:  # what the kubelet did write, for the next reader
        statuses = get_pod(cp, NS, "holder").get("status", {}).get("containerStatuses")
        raise TimeoutError(f"{exc}: {resource_id} not Healthy in {json.dumps(statuses)}") from exc
    injected = time.monotonic()
    _render(release.driver_root, XidEvent(gpu=_minor(cp, result["device"]), xid=RECOVERABLE_XID))
    await await_until(
        "Unhealthy in the pod status",
        lambda: _health(cp).get(resource_id) == "Unhealthy" or None,
        90,
    )
    to_unhealthy = time.monotonic() - injected
    _render(release.driver_root)  # the XID gone from the file: the probes find the GPU well
    await await_until(
        "Healthy again in the pod status",
        lambda: _health(cp).get(resource_id) == "Healthy" or None,
        90,
    )
    to_healthy = time.monotonic() - injected
    print(
        "\npod health through the real kubelet: "
        + json.dumps(
            {
                "resourceID": resource_id,
                "xid": RECOVERABLE_XID,
                "event_to_unhealthy_s": round(to_unhealthy, 2),
                "event_to_healthy_again_s": round(to_healthy, 2),
            }
        )
    )


async def test_a_plugin_restarted_while_a_gpu_is_lost_serves_the_others(
    release: Installed,
) -> None:
    """A GPU off the bus when the plugin (re)starts: NVIDIA's plugin, and ours before, exited on
    the toolkit's GPU_IS_LOST and served none; ours publishes the rest and prepares them."""
    cp = release.cp
    if get_pod(cp, NS, "holder").get("status", {}).get("phase") != "Running":
        _holder(cp)
    held = {_minor(cp, r["device"]) for c in cp.call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]
        for r in c["status"]["allocation"]["devices"]["results"]}  # fmt: skip
    lost = next(m for m in range(8) if m not in held)
    _render(release.driver_root, lost=lost)  # the running plugin withdraws it
    (old,) = release.ready_pods()
    cp.raw("DELETE", f"/api/v1/namespaces/{old['metadata']['namespace']}/pods/"
           f"{old['metadata']['name']}")  # fmt: skip
    try:
        await await_until("a new plugin pod Ready", lambda: [
            p for p in release.ready_pods() if p["metadata"]["uid"] != old["metadata"]["uid"]
        ] or None, 120)  # fmt: skip
        await await_until("7 GPUs published", lambda: release.published() == 7 or None, 60)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {release.diagnose(release.pods())}") from exc
    _run_example_pod(cp, "after-restart")  # prepared by the restarted plugin
    _render(release.driver_root)  # and the plugin rediscovers
    await await_until("the GPU back in the slice", lambda: release.published() == 8 or None, 60)
