"""The ResourceSlice model: a pure function from an Inventory to the node's pool.

One device per GPU, named ``gpu-<minor>``, in ``resource.k8s.io/v1`` JSON form
(camelCase, attribute values as ``{"string": ...}``, ``{"int": ...}``,
``{"version": ...}``). The pool is named after the node. Pools larger than one
slice holds are split deterministically; the generation is the caller's (the
controller's) business, passed through.
"""

import hashlib
from collections.abc import Sequence
from typing import Any

from driver.inventory import Gpu, Inventory
from driver.limits import MAX_VALUE_LENGTH, max_devices
from driver.semver import Semver, SemverError

API_VERSION = "resource.k8s.io/v1"
STANDARD_DOMAIN = "resource.kubernetes.io"

# Every attribute a GPU device may carry, by domain, with its value type (the key of the
# v1 DeviceAttribute: "string", "int", "bool", "version"). Unqualified names belong to the
# driver's domain. `gpu-dra validate` checks selectors and constraints against this table,
# and a test checks every device this module builds against it.
DRIVER_ATTRIBUTES: dict[str, str] = {
    "architecture": "string",
    "brand": "string",
    "cudaComputeCapability": "version",
    "cudaDriverVersion": "version",
    "driverVersion": "version",
    "index": "int",
    "memory": "int",
    "minor": "int",
    "model": "string",
    "numaNode": "int",
    "nvlinkDomain": "string",
    "productName": "string",
    "type": "string",
    "uuid": "string",
}
STANDARD_ATTRIBUTES: dict[str, str] = {
    "numaNode": "int",
    "pciBusID": "string",
    "pcieRoot": "string",
}
DRIVER_CAPACITIES = frozenset({"memory"})
# Absent on hardware without them (no NUMA information, no PCIe root, no NVLink peer): a
# selector that reads one fails on such a GPU unless it guards with `in` or has().
OPTIONAL_ATTRIBUTES = frozenset({"numaNode", "pcieRoot", "nvlinkDomain"})


def semver(version: str) -> str | None:
    """A driver-style version as semver: ``580.95.05`` -> ``580.95.5``, ``13.0`` -> ``13.0.0``.

    Normalized as CEL's ``semver(text, true)`` does; None when even that is no version.
    """
    try:
        return str(Semver.parse(version.strip(), normalize=True))
    except SemverError:
        return None


def model_name(product_name: str) -> str:
    """GPU Feature Discovery's spelling: ``NVIDIA L40S``/``NVIDIA H100 80GB HBM3`` -> dashes."""
    return "-".join(product_name.split())


def nvlink_domain(gpu: Gpu, *, node_name: str) -> str | None:
    """The ``nvlinkDomain`` value: equal on every GPU of one NVLink clique, unique cluster-wide.

    A multi-node fabric (cluster UUID and clique ID from NVML) names itself, so GPUs
    of one NVL72 partition on different nodes agree. Otherwise the domain is the
    node name plus the node-local clique number, hashed when that would exceed
    64 characters. GPUs without NVLink peers get none.
    """
    if gpu.fabric_cluster_uuid is not None and gpu.fabric_clique_id is not None:
        return f"{gpu.fabric_cluster_uuid}.{gpu.fabric_clique_id}"
    if gpu.nvlink_clique is None:
        return None
    value = f"{node_name}.nvlink-{gpu.nvlink_clique}"
    if len(value) > MAX_VALUE_LENGTH:
        digest = hashlib.sha256(node_name.encode()).hexdigest()[:32]
        value = f"node-{digest}.nvlink-{gpu.nvlink_clique}"
    return value


def build_device(gpu: Gpu, inventory: Inventory, *, node_name: str) -> dict[str, Any]:
    """The v1 Device of one GPU."""
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "productName": {"string": gpu.product_name},
        "model": {"string": model_name(gpu.product_name)},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "memory": {"int": gpu.memory_bytes // (1024 * 1024)},
        "cudaComputeCapability": {"version": "{}.{}.0".format(*gpu.cuda_compute_capability)},
        "cudaDriverVersion": {"version": "{}.{}.0".format(*inventory.cuda_driver_version)},
        f"{STANDARD_DOMAIN}/pciBusID": {"string": gpu.pci_bus_id},
    }
    driver_version = semver(inventory.driver_version)
    if driver_version is not None:
        attributes["driverVersion"] = {"version": driver_version}
    if gpu.numa_node is not None:
        # Ours, and the standard name (GA in Kubernetes 1.37) that other drivers' devices
        # (EFA adapters, NICs) carry too, so one matchAttribute aligns them all.
        attributes["numaNode"] = {"int": gpu.numa_node}
        attributes[f"{STANDARD_DOMAIN}/numaNode"] = {"int": gpu.numa_node}
    if gpu.pcie_root is not None:
        attributes[f"{STANDARD_DOMAIN}/pcieRoot"] = {"string": gpu.pcie_root}
    domain = nvlink_domain(gpu, node_name=node_name)
    if domain is not None:
        attributes["nvlinkDomain"] = {"string": domain}
    return {
        "name": gpu.device_name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {"memory": {"value": str(gpu.memory_bytes)}},
    }


def build_devices(inventory: Inventory, *, node_name: str) -> list[dict[str, Any]]:
    """One device per GPU, ordered by minor number (the allocation order).

    A device does not spell the driver: unqualified attribute names belong to its domain.
    """
    gpus = sorted(inventory.gpus, key=lambda g: g.minor)
    return [build_device(gpu, inventory, node_name=node_name) for gpu in gpus]


def split_devices(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive chunks of at most :func:`~driver.limits.max_devices`; one empty for none."""
    limit = max_devices(devices)
    chunks = [list(devices[i : i + limit]) for i in range(0, len(devices), limit)]
    return chunks or [[]]


def slice_name(node_name: str, driver_name: str, index: int) -> str:
    """``<node>-<driver>-<index>``, hashed down to stay a DNS subdomain of <= 253 characters."""
    name = f"{node_name}-{driver_name}-{index}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver_name}".encode()).hexdigest()[:16]
    return f"slice-{digest}-{index}"


def build_resource_slices(
    inventory: Inventory, *, driver_name: str, node_name: str, generation: int = 1
) -> list[dict[str, Any]]:
    """The node's complete pool: ``resource.k8s.io/v1`` ResourceSlice objects."""
    chunks = split_devices(build_devices(inventory, node_name=node_name))
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, driver_name, i)},
            "spec": {
                "driver": driver_name,
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
