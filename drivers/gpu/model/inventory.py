"""What discovery found on a node: plain, immutable data shared by every layer.

One ``Gpu`` travels from discovery to the ResourceSlice model, the kubelet
plugin's device table and the CDI spec; nothing re-derives these facts.
"""

import re
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a GPU instance and one compute instance of it) of a GPU in MIG mode."""

    uuid: str  # "MIG-..."
    profile: str  # "1g.10gb", or "1c.3g.20gb" for a compute instance smaller than its GI
    profile_id: int  # the GPU instance profile's unique ID (nvidia-smi's), not its index
    gi_id: int
    ci_id: int
    placement_start: int  # in memory slices
    placement_size: int
    spans_gpu_instance: bool  # the compute instance has all the GI's compute slices
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    gi_access_minor: int  # /dev/nvidia-caps/nvidia-cap<minor> of the GI's access file
    ci_access_minor: int


@dataclass(frozen=True, slots=True)
class MigPartition:
    """One GPU instance profile at one placement NVML says is possible (dynamic MIG):
    what a MIG device made there would be, before it exists."""

    profile: str  # "1g.10gb", NVML's profile name
    profile_index: int  # NVML_GPU_INSTANCE_PROFILE_* (what GetGpuInstanceProfileInfo takes)
    profile_id: int  # the profile's unique ID (what placements and create take)
    placement_start: int  # in memory slices
    placement_size: int
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


# NVML writes GPU UUIDs as GPU-<hex groups>; anything else never becomes a path.
_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]{1,64}")


def is_gpu_uuid(value: str) -> bool:
    """The one rule for a GPU UUID that names a file or a directory."""
    return _GPU_UUID.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    minor: int
    uuid: str
    product_name: str  # NVML's name, e.g. "NVIDIA H100 80GB HBM3"
    brand: str  # e.g. "Nvidia", "Tesla"
    architecture: str  # e.g. "Hopper"
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    pci_bus_id: str  # upstream form, lowercase: "0000:53:00.0"
    pcie_root: str | None  # "pci0000:50", from the sysfs device symlink
    numa_node: int | None
    mig_enabled: bool
    # Index of the NVLink clique this GPU belongs to on this node (every pair in one
    # clique is NVLink-connected); None without active NVLinks.
    nvlink_clique: int | None = None
    # Multi-node NVLink fabric identity, only when NVML reports it supported,
    # complete and with a non-zero cluster UUID.
    fabric_cluster_uuid: str | None = None
    fabric_clique_id: int | None = None
    # With MIG mode on: the MIG devices configured on it (the GPU is then published only
    # as these).
    mig_devices: tuple[MigDevice, ...] = ()
    # With MIG mode on and dynamic MIG asked for: every profile at every possible placement,
    # by placement (the GPU is then published only as these).
    mig_partitions: tuple[MigPartition, ...] = ()

    @property
    def device_name(self) -> str:
        """The DRA device name, stable across reboots: ``gpu-<minor>``."""
        return f"gpu-{self.minor}"


@dataclass(frozen=True, slots=True)
class SkippedGpu:
    """A GPU whose queries failed; reported, not published."""

    index: int
    pci_bus_id: str | None
    error: str


@dataclass(frozen=True, slots=True)
class Inventory:
    driver_version: str  # as NVML prints it: "580.95.05"
    cuda_driver_version: tuple[int, int]  # (13, 0)
    gpus: tuple[Gpu, ...]
    skipped: tuple[SkippedGpu, ...] = field(default=())

    def by_device_name(self) -> dict[str, Gpu]:
        return {gpu.device_name: gpu for gpu in self.gpus}
