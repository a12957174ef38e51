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
        "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
    }
    driver_version = semver(inventory.driver_version)
    if driver_version is not None:
        attributes["driverVersion"] = {"version": driver_version}
    if gpu.numa_node is not None:
        attributes["numaNode"] = {"int": gpu.numa_node}
    if gpu.pcie_root is not None:
        attributes["resource.kubernetes.io/pcieRoot"] = {"string": gpu.pcie_root}
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


INDEX_MIN_LENGTH = 5
_MAX_NAME_LENGTH = 253  # a DNS subdomain, as every object name


def index_length(slice_count: int) -> int:
    """Hex digits of the name prefix: enough for ``slice_count - 1``, at least five."""
    return max(INDEX_MIN_LENGTH, len(f"{max(slice_count - 1, 0):x}"))


def generate_name(index: int, slice_count: int, driver_name: str, node_name: str) -> str:
    """Upstream's ``generateName`` prefix for slice ``index`` of a pool of ``slice_count``."""
    return f"{index:0{index_length(slice_count)}x}-{driver_name}-{node_name}-"


def slice_name(index: int, slice_count: int, driver_name: str, node_name: str) -> str | None:
    """The one naming rule: the fixed name of slice ``index``, as the controller writes it
    and ``gpu-dra discover`` prints it; None when it would exceed 253 characters (the
    object then gets :func:`generate_name` and the server's random suffix)."""
    name = generate_name(index, slice_count, driver_name, node_name)[:-1]
    return name if len(name) <= _MAX_NAME_LENGTH else None


def slice_metadata(
    index: int, slice_count: int, driver_name: str, node_name: str
) -> dict[str, str]:
    """``{"name": ...}``, or ``{"generateName": ...}`` when no fixed name fits."""
    name = slice_name(index, slice_count, driver_name, node_name)
    if name is not None:
        return {"name": name}
    return {"generateName": generate_name(index, slice_count, driver_name, node_name)}


def build_resource_slices(
    inventory: Inventory, *, driver_name: str, node_name: str, generation: int = 1
) -> list[dict[str, Any]]:
    """The node's complete pool: ``resource.k8s.io/v1`` ResourceSlice objects."""
    chunks = split_devices(build_devices(inventory, node_name=node_name))
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": slice_metadata(i, len(chunks), driver_name, node_name),
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
