"""The allocator on ResourceSlices of simulated EKS nodes, as the driver publishes them."""

from pathlib import Path
from typing import Any

import pytest

from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices
from tools.allocation import explain_claim, explain_class

DRIVER = "gpu.nvidia.com"
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.nvidia.com" && '
                    'device.attributes["gpu.nvidia.com"].type == "gpu"'
                }
            }
        ]
    },
}


def node_slices(profile: str, node: str, root: Path) -> list[dict[str, Any]]:
    sim = SimulatedNode(profile, node, root / node)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    return build_resource_slices(inventory, driver_name=DRIVER, node_name=node)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("nodes")
    return [
        *node_slices("p5.48xlarge", "p5-a", root),
        *node_slices("p5.48xlarge", "p5-b", root),
        *node_slices("g6e.48xlarge", "g6e-a", root),
    ]


def nvlink_claim(count: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "tp4", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": count}}
                ],
                "constraints": [
                    {"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}
                ],
            }
        },
    }


def test_four_nvlinked_gpus_fit_p5_but_not_g6e(cluster: list[dict[str, Any]]) -> None:
    out = explain_claim(nvlink_claim(), slices=cluster, classes=[GPU_CLASS])
    assert out.allocatable_nodes == ["p5-a", "p5-b"]
    p5 = out.node("p5-a")
    assert [r.device for r in p5.results] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    g6e = "\n".join(out.node("g6e-a").reasons)
    # L40S nodes publish no nvlinkDomain: the reason names the attribute.
    assert (
        "matchAttribute gpu.nvidia.com/nvlinkDomain (requests: gpus): 8 devices for request "
        "gpus lack attribute gpu.nvidia.com/nvlinkDomain"
    ) in g6e
    assert "request gpus: needed 4, found 0 matching" in g6e


def test_nine_nvlinked_gpus_fit_nowhere(cluster: list[dict[str, Any]]) -> None:
    out = explain_claim(nvlink_claim(9), slices=cluster, classes=[GPU_CLASS])
    assert out.allocatable_nodes == []
    assert "request gpus: needed 9, found 8 matching" in out.node("p5-a").reasons


def test_allocated_gpus_push_the_claim_to_the_other_p5(cluster: list[dict[str, Any]]) -> None:
    taken = {
        "kind": "ResourceClaim",
        "metadata": {"name": "busy", "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": "p5-a", "device": f"gpu-{i}"}
                        for i in range(5)
                    ]
                }
            }
        },
    }
    out = explain_claim(nvlink_claim(), slices=cluster, classes=[GPU_CLASS], allocated=[taken])
    assert out.allocatable_nodes == ["p5-b"]
    reasons = "\n".join(out.node("p5-a").reasons)
    assert "5 devices allocated to other claims" in reasons
    assert "needed 4, found 3 matching" in reasons


def test_class_selectors_on_product_memory_and_cuda_version(
    cluster: list[dict[str, Any]],
) -> None:
    expressions = (
        'device.attributes["gpu.nvidia.com"].architecture == "Hopper"',
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("64Gi")) >= 0',
        'device.attributes["gpu.nvidia.com"].cudaDriverVersion.isGreaterThan(semver("12.4.0"))',
    )
    cls = {
        "kind": "DeviceClass",
        "metadata": {"name": "big-hopper"},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }
    listing = explain_class(cls, slices=cluster)
    selected = {(d.node, d.device) for d in listing.devices if d.selected}
    assert len(selected) == 16 and all(node and node.startswith("p5-") for node, _ in selected)
    rejected = [d for d in listing.devices if not d.selected]
    assert len(rejected) == 8
    assert all(d.reason and "class big-hopper selector #0" in d.reason for d in rejected)
