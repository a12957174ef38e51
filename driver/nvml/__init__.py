"""NVML access: the real ``pynvml`` bindings over a ``libnvidia-ml.so.1``, behind one interface.

:class:`Nvml` lists exactly the pynvml functions discovery calls. :func:`backend` loads
the library of a driver root (:mod:`driver.nvml.library`) and gives the pynvml module, or,
for simulated hardware, a fake driver root whose library is the simulated C one
(:class:`driver.nvml.simulated.SimulatedNode`): one code path either way.

A *sysfs root* is the directory that holds ``sys/`` (``/`` on a host); simulated
nodes write theirs into their fake driver root.
"""

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, cast

from driver.errors import PermanentError

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

    with tempfile.TemporaryDirectory(prefix="gpu-dra-sim-root-") as root:
        node = SimulatedNode(profile, node_name, Path(root), state_file=state_file)
        yield cast(Nvml, node.nvml), node.sysfs_root
