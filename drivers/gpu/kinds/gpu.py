"""The full GPU: one device per GPU, ``gpu-<minor>``, no side effects to prepare it.

Published with its model, memory, NUMA node, PCIe root, NVLink domain, driver and
CUDA versions; a container gets its device node, the control nodes, and
``NVIDIA_VISIBLE_DEVICES=void`` (where the NVIDIA runtime is the default runtime,
CUDA images set ``NVIDIA_VISIBLE_DEVICES=all`` and it would otherwise inject every
GPU of the node) with ``GPU_DRA_VISIBLE_GPU_UUIDS``, the UUIDs of the claim's GPUs in
device name order, for workloads and tests that want to know what they got.
"""

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from driver.common.limits import MAX_VALUE_LENGTH
from driver.common.semver import Semver, SemverError
from driver.devicekind import NodeDevice, PreparedClaim
from drivers.gpu.kinds import capacity
from drivers.gpu.kinds.base import GpuKindContext, GpuNode, HealthTarget
from drivers.gpu.kinds.mps import Mps
from drivers.gpu.kinds.timeslicing import TimeSlicing
from drivers.gpu.model.inventory import Gpu, Inventory
from drivers.gpu.model.published import STANDARD_DOMAIN

NAME = "gpu"
UUID_KEY = "gpu-uuid"
VISIBLE_UUIDS_ENV = "GPU_DRA_VISIBLE_GPU_UUIDS"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
_GPU_NODE_PREFIX = "/dev/nvidia"


def own_node(path: str) -> bool:
    """A device node a GPU claim's spec adds itself (a GPU's, or a control node), which the
    container toolkit's spec-wide edits must not give every container."""
    return path in CONTROL_NODES or (
        path.startswith(_GPU_NODE_PREFIX) and path[len(_GPU_NODE_PREFIX) :].isdigit()
    )


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


def physical_attributes(gpu: Gpu, inventory: Inventory) -> dict[str, dict[str, Any]]:
    """What a GPU and every MIG device carved from it say alike: the board, its driver, and
    where it sits (PCIe, NUMA)."""
    attributes: dict[str, dict[str, Any]] = {
        "productName": {"string": gpu.product_name},
        "model": {"string": model_name(gpu.product_name)},
        "brand": {"string": gpu.brand},
        "architecture": {"string": gpu.architecture},
        "index": {"int": gpu.index},
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
    return attributes


def build_device(gpu: Gpu, inventory: Inventory, *, node_name: str) -> dict[str, Any]:
    """The v1 Device of one GPU.

    A device does not spell the driver: unqualified attribute names belong to its domain.
    """
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
        "minor": {"int": gpu.minor},
        "memory": {"int": gpu.memory_bytes // (1024 * 1024)},
        **physical_attributes(gpu, inventory),
    }
    domain = nvlink_domain(gpu, node_name=node_name)
    if domain is not None:
        attributes["nvlinkDomain"] = {"string": domain}
    return {
        "name": gpu.device_name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {"memory": {"value": str(gpu.memory_bytes)}},
    }


def node_device(gpu: Gpu, inventory: Inventory, *, node_name: str) -> NodeDevice:
    return NodeDevice(
        kind=NAME,
        name=gpu.device_name,
        published=build_device(gpu, inventory, node_name=node_name),
        edits={"deviceNodes": [{"path": f"/dev/nvidia{gpu.minor}"}]},
        identity={UUID_KEY: gpu.uuid},
    )


class GpuKind:
    """A full GPU; shared by time-slicing or MPS when the claim's config says so
    (:mod:`drivers.gpu.kinds.timeslicing`, :mod:`drivers.gpu.kinds.mps`), its only
    side effects. With the node's ``consumable_capacity``, published for sharing."""

    name = NAME
    identity_keys = (UUID_KEY,)

    def __init__(self, node: GpuNode) -> None:
        self.timeslicing = TimeSlicing(UUID_KEY)
        self.mps = Mps(UUID_KEY)
        self._shareable = node.consumable_capacity

    def devices(self, inventory: Inventory, *, node_name: str) -> Sequence[NodeDevice]:
        """Ordered by minor number (the allocation order). A GPU in MIG mode is published
        only as its MIG devices (:mod:`drivers.gpu.kinds.mig`: a partition already)."""
        gpus = sorted((g for g in inventory.gpus if not g.mig_enabled), key=lambda g: g.minor)
        devices = [node_device(gpu, inventory, node_name=node_name) for gpu in gpus]
        if self._shareable:
            devices = [
                dataclasses.replace(d, published=capacity.shareable(d.published)) for d in devices
            ]
        return devices

    def physical_gpu(self, identity: Mapping[str, str]) -> str:
        return identity.get(UUID_KEY, "")

    def health_target(self, device: NodeDevice, inventory: Inventory) -> HealthTarget | None:
        uuid = device.identity.get(UUID_KEY)
        return HealthTarget(gpu_uuid=uuid, key=uuid) if uuid else None

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        uuids = [d.identity[UUID_KEY] for d in sorted(devices, key=lambda d: d.name)]
        mps = self.mps.edits(claim)
        return {
            "env": [
                "NVIDIA_VISIBLE_DEVICES=void",
                f"{VISIBLE_UUIDS_ENV}={','.join(uuids)}",
                *mps.get("env", []),
            ],
            "deviceNodes": [{"path": path} for path in CONTROL_NODES],
            **({"mounts": mps["mounts"]} if "mounts" in mps else {}),
        }

    def attach(self, context: GpuKindContext) -> None:
        self.timeslicing.attach(context)
        self.mps.attach(context)

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        # An unshared GPU needs nothing on the node but its CDI spec.
        return self.timeslicing.has_side_effects(claim) or self.mps.has_side_effects(claim)

    def prepare(self, claim: PreparedClaim) -> None:
        self.timeslicing.prepare(claim)
        self.mps.prepare(claim)

    def unprepare(self, claim: PreparedClaim) -> None:
        self.mps.unprepare(claim)
        self.timeslicing.unprepare(claim)

    def recover(self, claim: PreparedClaim) -> None:
        self.mps.recover(claim)
        self.timeslicing.recover(claim)

    def watch(self) -> None:
        self.mps.watch()
