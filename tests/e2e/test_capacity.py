"""Consumable capacity against the real control plane: shares of one GPU's memory.

One simulated g6.xlarge (one L4 of 23034 MiB, shares of up to 22Gi) whose plugin runs with
``--consumable-capacity``; the chart applied as in level 1. The real kube-scheduler
allocates three claims of 10Gi each, one pod each, in turn: the first two share the GPU
(``shareID``, ``consumedCapacity``), the third does not fit, and ``gpu-dra explain``, given
the claims the scheduler allocated, predicts every one of those outcomes. The tier's 1.34
control plane turns the alpha gate DRAConsumableCapacity on (tests/e2e/cluster.py); a server
without it is tests/test_capabilities.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import pytest_asyncio

from tests.chart_render import NAMESPACE
from tests.e2e.cluster import ControlPlane, run_root
from tests.e2e.kube import DRIVER, add_node, await_until, install_chart
from tests.e2e.test_level1 import MINOR, _claim_pod, _pin, _pod_outcome, _slices
from tests.pluginharness import PluginProcess
from tools.allocation import explain_claim

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

NODE = "g6"
NS = "capacity"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-capacity-{MINOR}", MINOR) as cp:
        yield cp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plugin(cluster: ControlPlane) -> AsyncIterator[PluginProcess]:
    install_chart(cluster)
    dirs, config = add_node(cluster, NODE, "g6.xlarge")
    proc = PluginProcess(
        dirs,
        kubeconfig=config,
        node_name=NODE,
        profile="g6.xlarge",
        extra_env={"POD_NAMESPACE": NAMESPACE, "GPU_DRA_CONSUMABLE_CAPACITY": "true"},
    )
    try:
        await proc.wait_ready(120)
        await await_until("the GPU published", partial(_device, cluster), 60)
        yield proc
    finally:
        await proc.terminate()


def _device(cp: ControlPlane) -> dict[str, Any] | None:
    devices = [d for s in _slices(cp, NODE) for d in s["spec"].get("devices") or []]
    return devices[0] if devices else None


def _claim(name: str, memory: str) -> dict[str, Any]:
    request = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": memory}}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def _live(cp: ControlPlane, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}"
    )
    return found


async def test_three_claims_of_10gi_on_one_l4_the_third_does_not_fit(
    cluster: ControlPlane, plugin: PluginProcess
) -> None:
    cp = cluster
    device = _device(cp)
    assert device is not None
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["max"] == "22Gi"
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await await_until(
        "default SA",
        lambda: cp.raw("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200,
        60,
    )
    classes = cp.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    allocated: list[dict[str, Any]] = []
    for name, fits in (("a", True), ("b", True), ("c", False)):
        claim = _claim(name, "10Gi")
        predicted = explain_claim(
            claim, slices=_slices(cp), classes=classes, allocated=allocated
        ).node(NODE)
        assert predicted.allocatable is fits, predicted.reasons
        cp.create(claim, NS)
        cp.create(_pin(_claim_pod(claim), NODE), NS)
        outcome = await await_until(
            f"pod {name} scheduled or unschedulable", partial(_pod_outcome, cp, NS, name), 90
        )
        assert (outcome[0] == "scheduled") is fits, outcome
        if not fits:
            assert (
                "needs 10Gi of memory, 2554Mi free on gpu-0, used by claims capacity/a, capacity/b"
                in ("\n".join(predicted.reasons))
            )
            continue
        live = _live(cp, name)
        (result,) = live["status"]["allocation"]["devices"]["results"]
        (ours,) = predicted.results
        assert (result["device"], result["consumedCapacity"]) == (
            ours.device,
            ours.consumed_capacity,
        )
        assert result["shareID"]
        allocated.append(live)
    shares = {
        r["shareID"] for c in allocated for r in c["status"]["allocation"]["devices"]["results"]
    }
    assert len(shares) == 2
