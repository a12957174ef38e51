"""Our slices against NVIDIA's own plugin's, for what users' selectors read (issue #40).

``tests/data/nvidia-plugin/slices-<profile>.json`` holds the ResourceSlices NVIDIA's GPU
kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1, built and run by hand on the
simulated NVML: ``tests/e2e/nvidia_plugin.py``; its README says how) published for each
simulated profile. Ours for the same profile and node name come from our pure slice code
(``drivers.gpu.resourceslice``, what ``gpu-dra discover`` prints).

Held equal: the devices' names, and every attribute and capacity NVIDIA's publishes, by
name, type and value (a capacity as a quantity: NVIDIA writes ``143771Mi`` where we write
``150754820096``, one value to CEL's ``quantity`` and ``compareTo``). What only ours
publishes is :data:`ONLY_OURS`, each with why; a selector written for NVIDIA's driver never
reads it, so it works on ours. Then every example claim of NVIDIA's that we hold
(``tests/data/nvidia/``) is allocated by ``explain``'s allocator on NVIDIA's slices and on
ours: the same devices on each node, or a difference in :data:`EXPLAIN_DIFFERS`.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from driver.common.quantity import Quantity
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices
from tools.allocation import explain_claim
from tools.allocation.inputs import load_file
from tools.validation import chart_device_classes

DATA: Final = Path(__file__).parent / "data"
RECORDS: Final = DATA / "nvidia-plugin"
EXAMPLES: Final = DATA / "nvidia"
PROFILES: Final = ("p5e.48xlarge", "p4d.24xlarge-mig")
DRIVER: Final = "gpu.nvidia.com"

_OLD_SELECTORS = (
    "NVIDIA's plugin published it until 36fc80ab (2025-09, first in v25.8.0); ours keeps it, "
    "so selectors written for NVIDIA's earlier releases (its own quickstart gpu-test6.yaml "
    "still selects on index) keep working"
)
# Attributes only ours publishes (NVIDIA's has none that ours lacks): name -> why.
ONLY_OURS: Final[dict[str, str]] = {
    "index": f"the GPU's NVML index; {_OLD_SELECTORS}",
    "minor": f"the GPU's device-node minor (/dev/nvidia<minor>); {_OLD_SELECTORS}",
    "memory": (
        "the full GPU's memory in MiB as an int, for selectors that compare numbers "
        "(memory >= 80000); the capacity NVIDIA's has too is the quantity"
    ),
    "model": (
        "the product name as a label-safe string (NVIDIA-H200), what node labels and GPU "
        "Feature Discovery call the product; productName is NVIDIA's own, also published"
    ),
    "numaNode": "the GPU's NUMA node from sysfs, for placing CPUs and NICs beside it",
    "resource.kubernetes.io/numaNode": (
        "the same, under the standard name that other drivers' devices match on "
        "(matchAttribute across drivers)"
    ),
    "nvlinkDomain": (
        "GPUs joined by NVLink (NVSwitch) share a domain: matchAttribute for tensor "
        "parallelism; NVIDIA's plugin publishes no NVLink topology for full GPUs"
    ),
}

# (example file, claim name) -> why the allocations differ; every other claim lands on the
# same devices on each node.
EXPLAIN_DIFFERS: Final[dict[tuple[str, str], str]] = {
    ("gpu-test6.yaml", "a100"): (
        "its selector reads the index attribute, which NVIDIA's plugin no longer publishes: "
        "on NVIDIA's slices the A100 node stops at a CEL runtime error (no such key: index); "
        "on ours the claim gets GPU 0 of the A100 node, as the example means (see ONLY_OURS)"
    ),
}


def _ours(profile: str, root: Path) -> list[dict[str, Any]]:
    node = f"sim-{profile}"
    sim = SimulatedNode(profile, node, root / node)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    return build_resource_slices(inventory, driver_name=DRIVER, node_name=node)


def _theirs(profile: str) -> list[dict[str, Any]]:
    body = json.loads((RECORDS / f"slices-{profile}.json").read_text())
    assert body["source"]["tag"] == "v0.4.1" and body["source"]["profile"] == profile
    slices: list[dict[str, Any]] = body["slices"]
    return slices


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Any], list[Any]]]:
    """Per profile: (ours, NVIDIA's) slices."""
    root = tmp_path_factory.mktemp("nodes")
    return {p: (_ours(p, root), _theirs(p)) for p in PROFILES}


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(section, name) of every attribute or capacity of one device that a selector would
    read differently, and of every other device field that differs."""
    a, b = ours.get("attributes", {}), theirs.get("attributes", {})
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):  # {"string": ...} vs {"version": ...}: the type too
            yield "attributes", name
    a, b = ours.get("capacity", {}), theirs.get("capacity", {})
    for name in sorted(a.keys() | b.keys()):
        if name not in a or name not in b:
            yield "capacity", name
            continue
        if Quantity.parse(a[name]["value"]) != Quantity.parse(b[name]["value"]):
            yield "capacity", name
        if {k: v for k, v in a[name].items() if k != "value"} != {
            k: v for k, v in b[name].items() if k != "value"
        }:
            yield "capacity", f"{name} (requestPolicy)"
    for field in sorted((ours.keys() | theirs.keys()) - {"name", "attributes", "capacity"}):
        if ours.get(field) != theirs.get(field):
            yield "device", field


@pytest.mark.parametrize("profile", PROFILES)
def test_same_pool_and_device_names(
    pairs: dict[str, tuple[list[Any], list[Any]]], profile: str
) -> None:
    ours, theirs = pairs[profile]

    def pool(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in s["spec"].items() if k != "devices"} for s in slices]

    assert pool(ours) == pool(theirs)
    assert sorted(_devices(ours)) == sorted(_devices(theirs))
    expected = 8 if profile == "p5e.48xlarge" else 4 + 4 * 3
    assert len(_devices(theirs)) == expected


@pytest.mark.parametrize("profile", PROFILES)
def test_every_attribute_and_capacity_of_nvidias_reads_the_same_on_ours(
    pairs: dict[str, tuple[list[Any], list[Any]]], profile: str
) -> None:
    ours, theirs = pairs[profile]
    mine, nvidia = _devices(ours), _devices(theirs)
    for name, device in nvidia.items():
        for section, key in _differences(mine[name], device):
            # Only what ours adds may differ: nothing of NVIDIA's is missing or changed.
            assert section == "attributes" and key in ONLY_OURS, (name, section, key)
            assert key not in device.get("attributes", {}), (name, key)


def test_the_table_lists_exactly_what_differs(
    pairs: dict[str, tuple[list[Any], list[Any]]],
) -> None:
    """No stale entry: each attribute of ONLY_OURS is published by ours on some device."""
    seen = {
        key
        for ours, theirs in pairs.values()
        for name, device in _devices(theirs).items()
        for _, key in _differences(_devices(ours)[name], device)
    }
    assert seen == set(ONLY_OURS)


def _outcomes(claim: dict[str, Any], slices: list[dict[str, Any]]) -> dict[str | None, Any]:
    """Per node: the (request, device) pairs allocated, or the first reason it cannot."""
    explanation = explain_claim(claim, slices=slices, classes=chart_device_classes())
    return {
        n.node: sorted((r.request, r.device) for r in n.results)
        if n.allocatable
        else ("unallocatable", n.reasons[0] if n.reasons else "")
        for n in explanation.nodes
    }


def _in_our_order(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[Any]:
    """NVIDIA's slices with each pool's devices in our order. Its plugin lists them in Go
    map order, another each run (deterministic order is NVIDIA's open draft NV#1358), and
    the allocator takes the first fit in slice order: one order compares which devices
    fit, not where a map put them."""
    order = {
        (s["spec"]["pool"]["name"], d["name"]): i
        for s in ours
        for i, d in enumerate(s["spec"]["devices"])
    }
    out = []
    for s in theirs:
        pool = s["spec"]["pool"]["name"]
        devices = sorted(s["spec"]["devices"], key=lambda d: order[(pool, d["name"])])
        out.append({**s, "spec": {**s["spec"], "devices": devices}})
    return out


def test_nvidias_examples_land_on_the_same_devices(
    pairs: dict[str, tuple[list[Any], list[Any]]],
) -> None:
    ours = [s for o, _ in pairs.values() for s in o]
    theirs = _in_our_order(ours, [s for _, t in pairs.values() for s in t])
    differ: dict[tuple[str, str], tuple[Any, Any]] = {}
    allocated = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for obj in load_file(path):
            if obj.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
                continue
            mine, nvidia = _outcomes(obj, ours), _outcomes(obj, theirs)
            allocated += sum(isinstance(v, list) for v in nvidia.values())
            if mine != nvidia:
                differ[(path.name, obj["metadata"]["name"])] = (mine, nvidia)
    assert set(differ) == set(EXPLAIN_DIFFERS)
    # Not a comparison of two refusals: 17 (claim, node) pairs fit NVIDIA's slices (the
    # others: MIG profiles neither node has, NVIDIA's VFIO and IMEX classes, not published).
    assert allocated == 17
    mine, nvidia = differ[("gpu-test6.yaml", "a100")]
    assert mine["sim-p4d.24xlarge-mig"] == [("gpu", "gpu-4")]  # the first whole A100
    assert "no such key: index" in nvidia["sim-p4d.24xlarge-mig"][1]
