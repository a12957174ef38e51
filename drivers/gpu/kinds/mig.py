"""Static MIG: one device per MIG device a GPU in MIG mode has, ``type: mig``.

The instances are made before the plugin starts (by mig-parted, or by hand); the plugin
only publishes them, and never changes MIG mode. A GPU in MIG mode is published only as
its MIG devices (:mod:`drivers.gpu.kinds.gpu` leaves it out). Names are NVIDIA's:
``gpu-<parent minor>-mig-<profile without dots>-<profile ID>-<placement start>``, so a
name stays with its placement when instance IDs are renumbered.

Published with the parent GPU's attributes (``parentUUID``, ``index``, model, versions,
PCI and NUMA placement), the ``profile`` and the MIG device's ``uuid``; capacities with
the names NVIDIA's driver uses (``multiprocessors``, ``copyEngines``, ``decoders``,
``encoders``, ``jpegEngines``, ``ofaEngines``, ``memory``, ``memorySlice<i>`` for each
memory slice it occupies). A container gets the parent's device node and the two
``nvidia-cap`` nodes of its GPU and compute instance, the control nodes, and
``GPU_DRA_VISIBLE_MIG_UUIDS``.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any

from api.config import MIG_TYPE, refused_on
from driver.common.errors import PermanentError
from driver.devicekind import NodeDevice, PreparedClaim
from drivers.gpu.kinds.base import GpuKindContext, GpuNode, HealthTarget
from drivers.gpu.kinds.gpu import CONTROL_NODES, physical_attributes
from drivers.gpu.model.inventory import Gpu, Inventory, MigDevice

NAME = "mig"
UUID_KEY = "mig-uuid"
PARENT_KEY = "parent-uuid"
VISIBLE_UUIDS_ENV = "GPU_DRA_VISIBLE_MIG_UUIDS"
CAPS_DIR = "/dev/nvidia-caps"


class MigSharingError(PermanentError):
    """A claim asks to share a MIG device, which this driver does not do (yet)."""


def device_name(gpu: Gpu, mig: MigDevice) -> str:
    profile = re.sub(r"[^a-z0-9-]", "-", mig.profile.lower().replace(".", "")).strip("-")
    name = f"gpu-{gpu.minor}-mig-{profile}-{mig.profile_id}-{mig.placement_start}"
    return name if mig.spans_gpu_instance else f"{name}-ci{mig.ci_id}"


def build_device(gpu: Gpu, mig: MigDevice, inventory: Inventory) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": mig.profile},
        **physical_attributes(gpu, inventory),
    }
    capacity = {
        "multiprocessors": mig.multiprocessors,
        "copyEngines": mig.copy_engines,
        "decoders": mig.decoders,
        "encoders": mig.encoders,
        "jpegEngines": mig.jpeg_engines,
        "ofaEngines": mig.ofa_engines,
        "memory": mig.memory_bytes,
    }
    for i in range(mig.placement_start, mig.placement_start + mig.placement_size):
        capacity[f"memorySlice{i}"] = 1
    return {
        "name": device_name(gpu, mig),
        "attributes": dict(sorted(attributes.items())),
        "capacity": {k: {"value": str(v)} for k, v in sorted(capacity.items())},
    }


def node_device(gpu: Gpu, mig: MigDevice, inventory: Inventory) -> NodeDevice:
    nodes = [
        f"/dev/nvidia{gpu.minor}",
        f"{CAPS_DIR}/nvidia-cap{mig.gi_access_minor}",
        f"{CAPS_DIR}/nvidia-cap{mig.ci_access_minor}",
    ]
    return NodeDevice(
        kind=NAME,
        name=device_name(gpu, mig),
        published=build_device(gpu, mig, inventory),
        edits={"deviceNodes": [{"path": path} for path in nodes]},
        identity={UUID_KEY: mig.uuid, PARENT_KEY: gpu.uuid},
    )


def _shared(claim: PreparedClaim, kind: str = NAME) -> list[str]:
    """The claim's devices of ``kind`` (a MIG kind) whose config the MIG type refuses."""
    return [
        d.device_name
        for d in claim.devices
        if d.kind == kind and refused_on(MIG_TYPE, d.sharing) is not None
    ]


def refuse_sharing(claim: PreparedClaim, kind: str = NAME) -> None:
    """Refuse a claim whose config asks to share a MIG device (api.config.refused_on, the
    rule ``gpu-dra validate`` judges a request's config with)."""
    shared = _shared(claim, kind)
    if shared:
        device = next(d for d in claim.devices if d.device_name == shared[0])
        raise MigSharingError(
            f"claim {claim}: {refused_on(MIG_TYPE, device.sharing)} ({', '.join(shared)})"
        )


class MigKind:
    """MIG devices made before the plugin started: nothing to do on the node to prepare."""

    name = NAME
    identity_keys = (UUID_KEY, PARENT_KEY)

    def __init__(self, node: GpuNode | None = None) -> None:
        pass  # it needs nothing of the node

    def physical_gpu(self, identity: Mapping[str, str]) -> str:
        return identity.get(PARENT_KEY, "")

    def devices(self, inventory: Inventory, *, node_name: str) -> Sequence[NodeDevice]:
        """By parent minor, then placement (the allocation order)."""
        return [
            node_device(gpu, mig, inventory)
            for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
            if gpu.mig_enabled and not gpu.mig_partitions  # else dynamic MIG publishes it
            for mig in gpu.mig_devices
        ]

    def health_target(self, device: NodeDevice, inventory: Inventory) -> HealthTarget | None:
        uuid = device.identity.get(UUID_KEY)
        for gpu in inventory.gpus:
            for mig in gpu.mig_devices:
                if mig.uuid == uuid:
                    return HealthTarget(gpu.uuid, uuid, part=True, gi=mig.gi_id, ci=mig.ci_id)
        return None

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        uuids = [d.identity[UUID_KEY] for d in sorted(devices, key=lambda d: d.name)]
        return {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"{VISIBLE_UUIDS_ENV}={','.join(uuids)}"],
            "deviceNodes": [{"path": path} for path in CONTROL_NODES],
        }

    def attach(self, context: GpuKindContext) -> None:
        pass

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        # Only so that prepare runs, and refuses, when a claim's config asks for sharing.
        return bool(_shared(claim))

    def prepare(self, claim: PreparedClaim) -> None:
        refuse_sharing(claim)

    def unprepare(self, claim: PreparedClaim) -> None:
        pass

    def recover(self, claim: PreparedClaim) -> None:
        pass

    def watch(self) -> None:
        pass  # a static MIG device relies on nothing the plugin started
