"""NVML access: the real ``pynvml`` bindings over a ``libnvidia-ml.so.1``, behind one interface.

:class:`Nvml` lists exactly the pynvml functions discovery calls. :func:`backend` loads
the library of a driver root (:mod:`driver.nvml.library`) and gives the pynvml module, or,
for simulated hardware, a fake driver root whose library is the simulated C one
(:class:`driver.nvml.simulated.SimulatedNode`): one code path either way.

A *sysfs root* is the directory that holds ``sys/`` (``/`` on a host); simulated
nodes write theirs into their fake driver root.
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, cast

from driver.common.errors import PermanentError

SysfsRoot = Path
HOST_SYSFS_ROOT: SysfsRoot = Path("/")


class Nvml(Protocol):
    """The NVML functions discovery uses, with pynvml's names and arguments."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...
    def nvmlDeviceGetMinorNumber(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str: ...
    def nvmlDeviceGetName(self, handle: Any, /) -> str: ...
    def nvmlDeviceGetBrand(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetArchitecture(self, device: Any, /) -> int: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, /) -> tuple[int, int]: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetPciInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetMigMode(self, device: Any, /) -> list[int]: ...
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int, /) -> int: ...
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int, /) -> int: ...
    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int, /) -> Any: ...
    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any, /) -> int: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceId(self, device: Any, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, device: Any, /) -> int: ...
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, /) -> Any: ...
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int, /) -> Any: ...
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any, /) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, computeInstanceId: int, /) -> Any: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: Any, profile: int, engProfile: int, /
    ) -> Any: ...
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any, /) -> Any: ...
    # Dynamic MIG (drivers.gpu.model.migmake): placements, and making and removing instances there.
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placements: Any, count: Any, /
    ) -> int: ...
    def nvmlDeviceGetHandleByUUID(self, uuid: str, /) -> Any: ...
    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, instances: Any, count: Any, /
    ) -> int: ...
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, instances: Any, count: Any, /
    ) -> int: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any, /
    ) -> Any: ...
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int, /) -> Any: ...
    def nvmlComputeInstanceDestroy(self, computeInstance: Any, /) -> int: ...
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any, /) -> int: ...


# The simulated node's root directory, kept across restarts of the process (as a real node
# keeps its driver's state): where a test restarts a plugin over the same MIG instances.
SIM_ROOT_ENV = "GPU_DRA_SIM_ROOT"


@contextmanager
def backend(
    kind: str,
    *,
    profile: str | Path | None = None,
    node_name: str = "node",
    state_file: Path | None = None,
    sysfs_root: SysfsRoot = HOST_SYSFS_ROOT,
    driver_root: Path = Path("/"),
) -> Iterator[tuple[Nvml, SysfsRoot]]:
    """The NVML and sysfs root discovery reads, for as long as the block runs.

    ``"system"`` is the NVML library under ``driver_root`` (else on the default loader
    path) over ``sysfs_root``. ``"simulated"`` brings its own driver root and sysfs tree
    in a temporary directory, removed on exit. Raises :class:`PermanentError` when no
    usable library is found, or for a simulated backend without a profile.
    """
    if kind == "system":
        import pynvml

        from driver.nvml import library

        library.load(driver_root)
        yield cast(Nvml, pynvml), sysfs_root
        return
    if kind != "simulated":
        raise PermanentError(f"unknown NVML backend {kind!r}: expected 'system' or 'simulated'")
    if not profile:
        raise PermanentError(
            "--nvml simulated needs --profile NAME (gpu-dra discover --list-profiles)"
        )
    from driver.nvml.simulated import SimulatedNode

    kept = os.environ.get(SIM_ROOT_ENV)
    if kept:  # a node whose driver state (MIG instances made) outlives this process
        Path(kept).mkdir(parents=True, exist_ok=True)
        node = SimulatedNode(profile, node_name, Path(kept), state_file=state_file)
        yield cast(Nvml, node.nvml), node.sysfs_root
        return
    with tempfile.TemporaryDirectory(prefix="gpu-dra-sim-root-") as root:
        node = SimulatedNode(profile, node_name, Path(root), state_file=state_file)
        yield cast(Nvml, node.nvml), node.sysfs_root
