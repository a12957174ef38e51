"""NVML access: the real ``pynvml`` module or the simulated one, behind one interface.

:class:`Nvml` lists exactly the pynvml functions discovery calls. ``load("system")``
returns the real module (importing it loads nothing: the C library is opened at
``nvmlInit``); ``load("simulated", profile=...)`` returns a
:class:`driver.nvml.simulated.SimulatedNvml`. Both raise pynvml's exception classes.

A *sysfs root* is the directory that holds ``sys/`` (``/`` on a host); simulated
nodes write theirs under a temporary directory, see
:class:`driver.nvml.simulated.SimulatedNode`.
"""

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from driver.errors import PermanentError

if TYPE_CHECKING:
    from driver.nvml.simulated import SimulatedNvml

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


def load(
    kind: Literal["system", "simulated"],
    *,
    profile: str | Path | None = None,
    node_name: str = "node",
    state_file: Path | None = None,
) -> Nvml:
    """The NVML to discover with.

    For ``"simulated"``, ``profile`` names a shipped profile or a profile file, and
    ``state_file`` (default: ``$GPU_DRA_SIM_STATE``) is the fault file re-read at
    every ``nvmlInit``.
    """
    if kind == "system":
        import pynvml

        return cast(Nvml, pynvml)
    if kind == "simulated":
        return _simulated(profile, node_name=node_name, state_file=state_file)
    raise ValueError(f"unknown NVML kind {kind!r}: expected 'system' or 'simulated'")


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
        yield load("system"), sysfs_root
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


def _simulated(
    profile: str | Path | None, *, node_name: str = "node", state_file: Path | None = None
) -> "SimulatedNvml":
    from driver.nvml.profile import load_profile
    from driver.nvml.simulated import SimulatedNvml, state_file_from_env

    if profile is None:
        raise ValueError("a simulated NVML needs a hardware profile")
    return SimulatedNvml(
        load_profile(profile),
        node_name=node_name,
        state_file=state_file if state_file is not None else state_file_from_env(),
    )
