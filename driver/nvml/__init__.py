"""NVML access: the real ``pynvml`` module or the simulated one, behind one interface.

:class:`Nvml` lists exactly the pynvml functions discovery calls. :func:`backend`
gives the real module (importing it loads nothing: the C library is opened at
``nvmlInit``) or a :class:`driver.nvml.simulated.SimulatedNvml`. Both raise pynvml's
exception classes.

A *sysfs root* is the directory that holds ``sys/`` (``/`` on a host); simulated
nodes write theirs under a temporary directory, see
:class:`driver.nvml.simulated.SimulatedNode`.
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
) -> Iterator[tuple[Nvml, SysfsRoot]]:
    """The NVML and sysfs root discovery reads, for as long as the block runs.

    ``"system"`` is the host's NVML over ``sysfs_root``. ``"simulated"`` brings
    its own generated sysfs tree in a temporary directory, removed on exit.
    Raises :class:`PermanentError` for a simulated backend without a profile.
    """
    if kind == "system":
        import pynvml

        yield cast(Nvml, pynvml), sysfs_root
        return
    if kind != "simulated":
        raise PermanentError(f"unknown NVML backend {kind!r}: expected 'system' or 'simulated'")
    if not profile:
        raise PermanentError(
            "--nvml simulated needs --profile NAME (gpu-dra discover --list-profiles)"
        )
    from driver.nvml.simulated import SimulatedNode

    with tempfile.TemporaryDirectory(prefix="gpu-dra-sysfs-") as root:
        node = SimulatedNode(profile, node_name, Path(root), state_file=state_file)
        yield node.nvml, node.sysfs_root
