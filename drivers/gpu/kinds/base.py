"""What the GPU driver's kinds share beyond the generic seam (``driver.devicekind``): the
context they are given of the node (its driver roots, the tools they run, the NVML that
makes MIG instances, the MPS daemons as pods), and where a device's health comes from.
Kinds are registered in :data:`drivers.gpu.kinds.KIND_TYPES`.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from driver.devicekind import DeviceKind, KindContext, NodeDevice
from drivers.gpu.kinds.mpspod import MpsPods
from drivers.gpu.model import nvidiasmi
from drivers.gpu.model.inventory import Inventory
from drivers.gpu.model.nvidiasmi import NvidiaSmi

if TYPE_CHECKING:
    from drivers.gpu.model.migmake import MadeMig


class MigMaker(Protocol):
    """What makes and removes MIG instances for the dynamic MIG kind, which imports no NVML
    code (``drivers.gpu.model.migmake.Maker`` over the node's NVML)."""

    def make(self, parent_uuid: str, profile_id: int, start: int, size: int) -> "MadeMig": ...

    def unmake(self, parent_uuid: str, profile_id: int, start: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class HealthTarget:
    """Where a device's health comes from: NVML reports events per physical GPU."""

    gpu_uuid: str  # the physical GPU whose events are registered for the device
    key: str  # what its taints are kept by, in health.json too: stable across restarts
    # A part of its GPU (a MIG device): only events naming its instance, or none, hit it.
    part: bool = False
    # The GPU and compute instance the part is now; None: no instance (not made yet).
    gi: int | None = None
    ci: int | None = None


@dataclass(frozen=True, slots=True)
class GpuNode:
    """What the GPU kinds are given of the node beside their own directory: the GPU node
    wiring (``drivers/gpu/node.py``) fills it from its flags and its NVML, and the
    GPU flavor hands it to each kind at attach (:meth:`context`)."""

    container_driver_root: Path = Path("/driver-root")
    nvidia_driver_root: Path = Path("/")  # the host's, which a daemon pod mounts
    nvidia_smi: Path | None = None  # None: under the driver root
    mps_control: Path | None = None  # nvidia-cuda-mps-control; None: under the driver root
    nvml_library: Path | None = None  # the driver root's libnvidia-ml, for the tools it runs
    # What makes and removes MIG instances; None where no NVML is loaded.
    mig_maker: MigMaker | None = None
    # The MPS control daemons as pods (``drivers.gpu.kinds.mpspod.MpsPods``); None: each a
    # process of the plugin's own (a plugin run on the host: tests, e2e levels 1 and 2).
    mps_pods: MpsPods | None = None
    # Full GPUs published for consumable capacity (drivers.gpu.kinds.capacity).
    consumable_capacity: bool = False

    def context(self, given: KindContext) -> "GpuKindContext":
        return GpuKindContext(given.state_dir, given.boot_id, self)


@dataclass(frozen=True, slots=True)
class GpuKindContext(KindContext):
    """What a GPU kind is given at attach: its directory and the boot, and the node's."""

    node: GpuNode = GpuNode()

    def nvidia_smi_tool(self) -> NvidiaSmi:
        """The driver root's nvidia-smi (or the one named), with the driver root's NVML."""
        node = self.node
        path = node.nvidia_smi or nvidiasmi.default_path(node.container_driver_root)
        return NvidiaSmi(path, node.nvml_library)


class GpuDeviceKind(DeviceKind[Inventory, GpuKindContext], Protocol):
    """A kind of the GPU driver: the seam over the GPU inventory and context, and where each
    of its devices' health comes from, which the health monitor watches."""

    def health_target(self, device: NodeDevice, inventory: Inventory) -> HealthTarget | None:
        """The physical GPU whose NVML events concern ``device`` (one of this kind's, as
        :meth:`devices` built it from ``inventory``), and where on it; None: not watched
        (no GPU behind it, or a MIG device discovery no longer lists)."""

    def physical_gpu(self, identity: Mapping[str, str]) -> str:
        """The UUID of the physical GPU a device of this kind is, or is part of, by its
        recorded identity; "" for a device of no GPU."""
