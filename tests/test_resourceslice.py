import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from driver.common.limits import validate_resource_slice
from driver.nvml.faults import Faults
from driver.nvml.profile import profile_names
from driver.nvml.simulated import SimulatedNode
from driver.slices.model import split_devices
from drivers.gpu.kinds.gpu import nvlink_domain, semver
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Gpu, Inventory
from drivers.gpu.resourceslice import build_devices, build_resource_slices

DRIVER = "gpu.nvidia.com"
KUBERNETES_VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
LONG_NODE = "ip-10-0-101-23.us-west-2.compute.internal"


def _inventory(tmp_path: Path, profile: str, node: str, faults: Faults | None = None) -> Inventory:
    sim = SimulatedNode(profile, node, tmp_path / node, faults=faults)
    return discover(sim.nvml, sysfs_root=sim.sysfs_root)


def _slices(tmp_path: Path, profile: str, node: str = "node-a") -> list[dict[str, Any]]:
    return build_resource_slices(
        _inventory(tmp_path, profile, node), driver_name=DRIVER, node_name=node
    )


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"]["devices"]]


def _attr(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name)
    return None if value is None else next(iter(value.values()))


def test_installed_validator_knows_every_version() -> None:
    known = set(kubernetes_validate.utils.all_versions())
    assert set(KUBERNETES_VERSIONS) <= known


@pytest.mark.parametrize("profile", profile_names())
def test_every_slice_passes_strict_schema_and_limits(tmp_path: Path, profile: str) -> None:
    for slice_ in _slices(tmp_path, profile, LONG_NODE):
        assert validate_resource_slice(slice_) == []
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(slice_, version, strict=True)


def test_strict_schema_check_does_reject_unknown_fields(tmp_path: Path) -> None:
    bad = copy.deepcopy(_slices(tmp_path, "g6.xlarge")[0])
    bad["spec"]["devices"][0]["basic"] = {}  # the v1beta1 shape, not v1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.34.0", strict=True)


def test_p5_devices(tmp_path: Path) -> None:
    slices = _slices(tmp_path, "p5.48xlarge", "demo-node")
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "demo-node"
    assert spec["pool"] == {"name": "demo-node", "generation": 1, "resourceSliceCount": 1}
    devices = spec["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert {_attr(d, "memory") for d in devices} == {81559}
    assert {d["capacity"]["memory"]["value"] for d in devices} == {str(81559 * 1024 * 1024)}
    assert [_attr(d, "numaNode") for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({_attr(d, "nvlinkDomain") for d in devices}) == 1
    first = devices[0]
    assert _attr(first, "type") == "gpu"
    assert _attr(first, "productName") == "NVIDIA H100 80GB HBM3"
    assert _attr(first, "model") == "NVIDIA-H100-80GB-HBM3"
    assert _attr(first, "architecture") == "Hopper"
    assert _attr(first, "cudaComputeCapability") == "9.0.0"
    assert _attr(first, "driverVersion") == "580.95.5"
    assert _attr(first, "cudaDriverVersion") == "13.0.0"
    assert _attr(first, "resource.kubernetes.io/pciBusID") == "0000:53:00.0"
    assert _attr(first, "resource.kubernetes.io/pcieRoot") == "pci0000:44"
    assert first["attributes"]["index"] == {"int": 0}
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", _attr(first, "uuid"))


def test_two_p5_nodes_have_different_nvlink_domains(tmp_path: Path) -> None:
    a = {_attr(d, "nvlinkDomain") for d in _devices(_slices(tmp_path, "p5.48xlarge", "a"))}
    b = {_attr(d, "nvlinkDomain") for d in _devices(_slices(tmp_path, "p5.48xlarge", "b"))}
    assert len(a) == len(b) == 1 and a != b


def test_pcie_only_node_has_no_nvlink_domain(tmp_path: Path) -> None:
    devices = _devices(_slices(tmp_path, "g6e.12xlarge"))
    assert len(devices) == 4
    assert all("nvlinkDomain" not in d["attributes"] for d in devices)
    assert {_attr(d, "model") for d in devices} == {"NVIDIA-L40S"}


def test_bridged_pairs_have_two_domains(tmp_path: Path) -> None:
    domains = [
        _attr(d, "nvlinkDomain") for d in _devices(_slices(tmp_path, "synthetic-bridged-pairs"))
    ]
    assert domains[0] == domains[1] != domains[2] == domains[3]


def test_fabric_domain_is_shared_across_nodes_of_one_fabric(tmp_path: Path) -> None:
    rack = Faults(fabric_cluster="rack-1")
    domains = set()
    for node in ("gb-a", "gb-b"):
        inventory = _inventory(tmp_path, "p6e-gb200.36xlarge", node, rack)
        devices = build_devices(inventory, node_name=node)
        domains |= {_attr(d, "nvlinkDomain") for d in devices}
    (domain,) = domains
    assert domain.endswith(".32766") and len(domain) <= 64


def test_large_pool_splits_deterministically(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, "synthetic-200gpu", "big")
    slices = build_resource_slices(inventory, driver_name=DRIVER, node_name="big", generation=7)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 72]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {7}
    names = [d["name"] for d in _devices(slices)]
    assert len(set(names)) == 200 and names[:2] == ["gpu-0", "gpu-1"]
    assert len({s["metadata"]["name"] for s in slices}) == 2
    again = build_resource_slices(inventory, driver_name=DRIVER, node_name="big", generation=7)
    assert again == slices
    assert len({_attr(d, "nvlinkDomain") for d in _devices(slices)}) == 100


def test_split_uses_64_once_a_device_has_taints() -> None:
    devices: list[dict[str, Any]] = [{"name": f"gpu-{i}"} for i in range(130)]
    assert [len(c) for c in split_devices(devices)] == [128, 2]
    devices[5]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert [len(c) for c in split_devices(devices)] == [64, 64, 2]
    assert split_devices([]) == [[]]


def test_node_without_gpus_publishes_an_empty_pool(tmp_path: Path) -> None:
    inventory = Inventory(driver_version="580.95.05", cuda_driver_version=(13, 0), gpus=())
    (slice_,) = build_resource_slices(inventory, driver_name=DRIVER, node_name="n")
    assert slice_["spec"]["devices"] == [] and validate_resource_slice(slice_) == []
    kubernetes_validate.validate(slice_, "1.34.0", strict=True)


def test_semver_of_driver_versions() -> None:
    assert semver("580.95.05") == "580.95.5"
    assert semver("13.0") == "13.0.0"
    assert semver("535") == "535.0.0"
    assert semver("rc-1") is None


def test_long_node_name_keeps_domain_within_64_and_unique() -> None:
    gpu = Gpu(
        index=0, minor=0, uuid="GPU-x", product_name="p", brand="Nvidia", architecture="Hopper",
        cuda_compute_capability=(9, 0), memory_bytes=1, pci_bus_id="0000:01:00.0",
        pcie_root=None, numa_node=None, mig_enabled=False, nvlink_clique=1,
    )  # fmt: skip
    a = nvlink_domain(gpu, node_name="n" * 200)
    b = nvlink_domain(gpu, node_name="n" * 199)
    assert a is not None and b is not None and a != b
    assert len(a) <= 64 and len(b) <= 64
    assert nvlink_domain(gpu, node_name="short") == "short.nvlink-1"


def test_every_published_attribute_is_in_the_table_validate_checks_against(
    tmp_path: Path,
) -> None:
    from drivers.gpu.model.published import (
        DRIVER_ATTRIBUTES,
        DRIVER_CAPACITIES,
        STANDARD_ATTRIBUTES,
        STANDARD_DOMAIN,
    )

    seen: set[str] = set()
    capacities: set[str] = set()
    for profile in profile_names():
        for device in _devices(_slices(tmp_path / profile, profile)):
            for name, value in device["attributes"].items():
                (kind,) = value
                domain, _, ident = name.rpartition("/")
                table = STANDARD_ATTRIBUTES if domain == STANDARD_DOMAIN else DRIVER_ATTRIBUTES
                assert domain in ("", STANDARD_DOMAIN), name
                assert table.get(ident) == kind, (profile, name, kind)
                seen.add(name)
            if device["attributes"]["type"] == {"string": "gpu"}:
                assert set(device["capacity"]) == {"memory"}
            assert "memory" in device["capacity"]
            assert set(device["capacity"]) <= DRIVER_CAPACITIES
            capacities |= set(device["capacity"])
    expected = set(DRIVER_ATTRIBUTES) | {f"{STANDARD_DOMAIN}/{n}" for n in STANDARD_ATTRIBUTES}
    assert seen == expected  # no table entry that no profile ever publishes
    assert capacities == DRIVER_CAPACITIES


def test_numa_node_is_published_under_the_standard_name_too(tmp_path: Path) -> None:
    for device in _devices(_slices(tmp_path, "p5.48xlarge")):
        attrs = device["attributes"]
        assert attrs["resource.kubernetes.io/numaNode"] == attrs["numaNode"]
        assert attrs["numaNode"]["int"] in (0, 1)
