"""Dynamic MIG against the real control plane: partitionable devices, overlapping placements.

One simulated p5.48xlarge with every GPU in MIG mode and no instance configured, whose plugin
runs with ``--dynamic-mig``: each GPU is published as a counter set plus one device per
profile and placement. The real API server must accept the layout the publisher picked for
its version (1.34: counters beside their devices; 1.35 and later: a counter-only slice), and
the real kube-scheduler must never hand out two placements that overlap on one GPU: a 4g
claim takes memory slices 0 to 3 of GPU 0, a 7g claim on that GPU then does not fit, a 3g
claim still does. ``gpu-dra explain``, given the claims the scheduler allocated, predicts
each outcome. The chart's MIG examples, written for static MIG devices, hold for these too:
the scheduler places each, and explain accepts what it chose. The tier's 1.34 control plane
turns DRAPartitionableDevices on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import pytest_asyncio

from tests.chart_render import NAMESPACE
from tests.e2e.cluster import ControlPlane, run_root
from tests.e2e.kube import add_node, await_until, install_chart
from tests.e2e.test_level1 import (
    MINOR,
    _claim_for,
    _claim_pod,
    _clean,
    _examples,
    _exists,
    _only,
    _pin,
    _pod_outcome,
    _slices,
)
from tests.pluginharness import PluginProcess
from tools.allocation import explain_claim

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

NODE = "p5"
NS = "dynamic-mig"
DEVICES = 8 * 25  # every profile x placement of 8 H100s


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-dynmig-{MINOR}", MINOR) as cp:
        yield cp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plugin(cluster: ControlPlane) -> AsyncIterator[PluginProcess]:
    install_chart(cluster)
    dirs, config = add_node(cluster, NODE, "p5.48xlarge")
    profile = dirs.root / "p5-mig.yaml"
    profile.write_text("extends: p5.48xlarge\nmig: {enabled: all}\n")
    proc = PluginProcess(
        dirs,
        kubeconfig=config,
        node_name=NODE,
        profile=str(profile),
        extra_env={"POD_NAMESPACE": NAMESPACE, "GPU_DRA_DYNAMIC_MIG": "true"},
    )
    try:
        await proc.wait_ready(120)
        await await_until(f"{DEVICES} devices published", lambda: _count(cluster) == DEVICES, 90)
        yield proc
    finally:
        await proc.terminate()


def _count(cp: ControlPlane) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in _slices(cp, NODE))


def _claim(name: str, profile: str) -> dict[str, Any]:
    selector = (
        f'device.attributes["gpu.nvidia.com"].profile == "{profile}"'
        ' && device.attributes["gpu.nvidia.com"].index == 0'
    )
    request = {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": selector}}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": request}]}},
    }


async def test_the_layout_fits_the_servers_version(
    cluster: ControlPlane, plugin: PluginProcess
) -> None:
    slices = _slices(cluster, NODE)
    counter_only = [
        s for s in slices if s["spec"].get("sharedCounters") and not s["spec"].get("devices")
    ]
    with_counters = [
        s for s in slices if s["spec"].get("sharedCounters") and s["spec"].get("devices")
    ]
    if MINOR == "1.34":  # counters in the slice of the devices that consume them
        assert (len(counter_only), len(with_counters)) == (0, 8)
    else:  # 1.35 on: counter-only slices, devices of at most 64 a slice
        assert len(counter_only) >= 1 and with_counters == []
        assert all(len(s["spec"].get("devices") or []) <= 64 for s in slices)
    consumed = [d for s in slices for d in s["spec"].get("devices") or []]
    assert all(d.get("consumesCounters") for d in consumed)  # every placement is counted


async def test_overlapping_placements_are_never_allocated_together(
    cluster: ControlPlane, plugin: PluginProcess
) -> None:
    cp = cluster
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await await_until(
        "default SA",
        lambda: cp.raw("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] == 200,
        60,
    )
    classes = cp.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    allocated: list[dict[str, Any]] = []
    for name, profile, fits in (
        ("four", "4g.40gb", True),
        ("seven", "7g.80gb", False),  # needs every memory slice: 0-3 are the 4g's
        ("three", "3g.40gb", True),  # slices 4-7 are free
    ):
        claim = _claim(name, profile)
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
            continue
        live = cp.call("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}")
        (result,) = live["status"]["allocation"]["devices"]["results"]
        assert result["device"].startswith("gpu-0-mig-"), result
        allocated.append(live)
    chosen = [c["status"]["allocation"]["devices"]["results"][0]["device"] for c in allocated]
    assert len(chosen) == 2 and chosen[0] != chosen[1]


MIG_EXAMPLES = ("mig-1g-10gb", "mig-3g", "mig-two-sizes")


@pytest.mark.parametrize("example", MIG_EXAMPLES)
async def test_the_mig_examples_hold_for_dynamic_devices(
    cluster: ControlPlane, plugin: PluginProcess, example: str
) -> None:
    cp = cluster
    docs = dict(_examples())[example]
    (claim,) = [d for d in docs if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    classes = cp.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    slices = _slices(cp)
    held = [  # what the other tests of this module left allocated
        c
        for c in cp.call("GET", "/apis/resource.k8s.io/v1/resourceclaims")["items"]
        if (c.get("status") or {}).get("allocation")
    ]
    predicted = explain_claim(claim, slices=slices, classes=classes, allocated=held).node(NODE)
    assert predicted.allocatable, predicted.reasons
    ns = f"dynamic-{example}"
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
    await await_until(f"default SA in {ns}", partial(_exists, cp, sa_path), 60)
    try:
        cp.create(claim, ns)
        cp.create(_pin(pod, NODE), ns)
        name = pod["metadata"]["name"]
        outcome = await await_until(
            f"{example} scheduled or unschedulable", partial(_pod_outcome, cp, ns, name), 90
        )
        assert outcome[0] == "scheduled", outcome
        live = _claim_for(cp, ns, pod)
        assert live is not None
        results = live["status"]["allocation"]["devices"]["results"]
        chosen = {r["device"] for r in results}
        assert all("-mig-" in device for device in chosen), chosen
        # The scheduler's answer is an answer of explain's, given only the devices it chose.
        again = explain_claim(
            claim, slices=_only(slices, NODE, chosen), classes=classes, allocated=held
        )
        assert again.node(NODE).allocatable, again.node(NODE).reasons
    finally:
        await _clean(cp, ns)
