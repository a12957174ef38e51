"""The attributes Karpenter simulates for gpu.nvidia.com are the ones we publish.

Karpenter's AWS provider provisions GPU nodes for pending DRA claims before any node
exists, by evaluating the claim against built-in per-instance-type templates of the
gpu.nvidia.com driver's devices. Selectable there: productName, architecture, brand,
cudaComputeCapability, type; usable in matchAttribute: driverVersion, cudaDriverVersion,
resource.kubernetes.io/pcieRoot; capacity memory. A claim Karpenter provisions for must then
fit the slices we really publish on that node, so each name must exist with the same type
and value format (architecture as NVML names it, "Hopper"; versions as semver). Pool and
device names differ (Karpenter's template pool is "gpus"; ours is the node) and do not
matter to a claim.
"""

import re
from pathlib import Path
from typing import Any

import pytest

from driver.common.quantity import Quantity
from driver.nvml.profile import profile_names
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices
from tests.chart_render import render
from tools.allocation import explain_claim

DRIVER = "gpu.nvidia.com"
# name -> (kind, value format) of Karpenter's simulated gpu.nvidia.com devices.
KARPENTER: dict[str, tuple[str, re.Pattern[str]]] = {
    "productName": ("string", re.compile(r"^NVIDIA [A-Z]\w*")),
    "architecture": ("string", re.compile(r"^(Turing|Ampere|Ada Lovelace|Hopper|Blackwell)$")),
    "brand": ("string", re.compile(r"^Nvidia$")),
    "cudaComputeCapability": ("version", re.compile(r"^\d+\.\d+\.0$")),
    "type": ("string", re.compile(r"^gpu$")),
    "driverVersion": ("version", re.compile(r"^\d+\.\d+\.\d+$")),
    "cudaDriverVersion": ("version", re.compile(r"^\d+\.\d+\.0$")),
    "resource.kubernetes.io/pcieRoot": ("string", re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")),
}
REAL_PROFILES = [p for p in profile_names() if not p.startswith("synthetic")]


def _devices(tmp_path: Path, profile: str) -> list[dict[str, Any]]:
    sim = SimulatedNode(profile, "node-a", tmp_path / profile)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    slices = build_resource_slices(inventory, driver_name=DRIVER, node_name="node-a")
    return [d for s in slices for d in s["spec"]["devices"]]


@pytest.mark.parametrize("profile", REAL_PROFILES)
def test_every_attribute_karpenter_simulates_is_published_alike(
    profile: str, tmp_path: Path
) -> None:
    devices = _devices(tmp_path, profile)
    assert devices
    for device in devices:
        if device["attributes"]["type"] == {"string": "mig"}:
            continue  # Karpenter's templates have whole GPUs only: MIG nodes are made by hand
        for name, (kind, fmt) in KARPENTER.items():
            value = device["attributes"].get(name)
            assert value is not None, (profile, name)
            assert list(value) == [kind], (profile, name, value)
            assert fmt.match(str(value[kind])), (profile, name, value)
        memory = device["capacity"]["memory"]["value"]
        assert Quantity.parse(memory) == Quantity.parse(f"{int(memory) // 2**20}Mi"), memory


def test_a_claim_karpenter_provisions_a_p5_for_fits_our_p5(tmp_path: Path) -> None:
    sim = SimulatedNode("p5.48xlarge", "p5-a", tmp_path / "p5")
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    slices = build_resource_slices(inventory, driver_name=DRIVER, node_name="p5-a")
    attrs = 'device.attributes["gpu.nvidia.com"]'
    selectors = [
        f'{attrs}.productName == "NVIDIA H100 80GB HBM3"',
        f'{attrs}.architecture == "Hopper" && {attrs}.brand == "Nvidia" && {attrs}.type == "gpu"',
        f'{attrs}.cudaComputeCapability.compareTo(semver("9.0.0")) >= 0',
        # NVML reports 81559 MiB for an "80GB" H100: a floor of 80Gi would exclude it here,
        # so what Karpenter's template says for memory decides whether such a claim fits.
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("79Gi")) >= 0',
    ]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "karpenter-style", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "count": 2,
                            "selectors": [{"cel": {"expression": e}} for e in selectors],
                        },
                    }
                ],
                "constraints": [
                    {"requests": ["gpus"], "matchAttribute": f"{DRIVER}/driverVersion"},
                    {"requests": ["gpus"], "matchAttribute": f"{DRIVER}/cudaDriverVersion"},
                ],
            }
        },
    }
    classes = [o for o in render() if o["kind"] == "DeviceClass"]
    result = explain_claim(claim, slices=slices, classes=classes)
    assert result.allocatable_nodes == ["p5-a"], result.node("p5-a").reasons
