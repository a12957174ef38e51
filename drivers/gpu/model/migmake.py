"""Making and removing one MIG device at a placement (dynamic MIG), through NVML.

The only code that creates or destroys MIG instances; it never changes MIG mode. A GPU
instance is made at exactly the placement asked for (``CreateGpuInstanceWithPlacement``),
then one compute instance spanning it, in the order NVIDIA's driver uses; removal is the
compute instances first, then the GPU instance. Both are idempotent: an instance already
at the placement with the profile is taken as this one (a prepare retried after a crash),
and removing what is not there is done. A create that fails half-way removes what it made.

NVML errors stay ``pynvml.NVMLError``; the caller classes them for the claim.
"""

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from driver.common.crashpoints import crashpoint
from driver.nvml import Nvml
from drivers.gpu.model.migdiscovery import MigStateError, access_minor, ci_profiles, gi_profiles


@dataclass(frozen=True, slots=True)
class MadeMig:
    uuid: str  # the MIG device's "MIG-..."
    gi_id: int
    ci_id: int
    gi_access_minor: int  # /dev/nvidia-caps/nvidia-cap<minor>
    ci_access_minor: int


class Maker:
    """What the dynamic MIG kind is given to make and remove instances with (it imports no
    NVML code itself): this node's NVML, initialized around each call."""

    def __init__(self, nvml: Nvml, proc_root: Path) -> None:
        self._nvml = nvml
        self._proc_root = proc_root

    def make(self, parent_uuid: str, profile_id: int, start: int, size: int) -> MadeMig:
        with self._initialized():
            return make(self._nvml, parent_uuid, profile_id, start, size, self._proc_root)

    def unmake(self, parent_uuid: str, profile_id: int, start: int) -> bool:
        with self._initialized():
            return unmake(self._nvml, parent_uuid, profile_id, start)

    @contextlib.contextmanager
    def _initialized(self) -> Iterator[None]:
        self._nvml.nvmlInit()  # counted by the library: discovery's init and shutdown are apart
        try:
            yield
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                self._nvml.nvmlShutdown()


def make(
    nvml: Nvml, parent_uuid: str, profile_id: int, start: int, size: int, proc_root: Path
) -> MadeMig:
    """The MIG device of ``profile_id`` at ``start`` on the GPU ``parent_uuid``."""
    handle = nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
    profile = _gi_profile(nvml, handle, profile_id)
    gi = _gi_at(nvml, handle, profile_id, start)
    made_gi = gi is None
    if gi is None:
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, profile_id, ctypes.byref(placement)
        )
    try:
        crashpoint("after-gpu-instance")  # a GPU instance without its compute instance
        gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
        # NVML takes the CI profile's ID here (as NVIDIA's driver passes it), not its index.
        ci_profile_id = int(_spanning_ci_profile(nvml, gi, int(profile.sliceCount)).id)
        cis = _compute_instances(nvml, gi, ci_profile_id)
        ci = cis[0] if cis else nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile_id)
        ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
        minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        gi_dir = proc_root / "proc/driver/nvidia/capabilities" / f"gpu{minor}/mig/gi{gi_id}"
        return MadeMig(
            uuid=_mig_uuid(nvml, handle, gi_id, ci_id),
            gi_id=gi_id,
            ci_id=ci_id,
            gi_access_minor=access_minor(gi_dir / "access"),
            ci_access_minor=access_minor(gi_dir / f"ci{ci_id}" / "access"),
        )
    except BaseException:
        if made_gi:  # nothing of a failed create stays behind
            _destroy_gi(nvml, gi)
        raise


def unmake(nvml: Nvml, parent_uuid: str, profile_id: int, start: int) -> bool:
    """Remove the instances of ``profile_id`` at ``start``; False when there were none."""
    handle = nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
    gi = _gi_at(nvml, handle, profile_id, start)
    if gi is None:
        return False
    _destroy_gi(nvml, gi)
    return True


def _destroy_gi(nvml: Nvml, gi: Any) -> None:
    for info in ci_profiles(nvml, gi):
        for ci in _compute_instances(nvml, gi, int(info.id)):
            nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)


def _gi_profile(nvml: Nvml, handle: Any, profile_id: int) -> Any:
    profile = gi_profiles(nvml, handle).get(profile_id)
    if profile is None:
        raise MigStateError(f"GPU instance profile ID {profile_id} is not one NVML lists")
    return profile


# What NVML answers for the handle of an instance destroyed since it was listed: another
# claim's, on the same GPU, that its unprepare (in another thread, or in the sibling plugin
# instance during a surge upgrade) destroyed meanwhile. Passed over: this claim's own
# instance cannot go meanwhile (its placement is reserved to it, its calls serialized).
_DESTROYED_MEANWHILE = (pynvml.NVMLError_InvalidArgument, pynvml.NVMLError_NotFound)
_MIG_UUID_WALKS = 3


def _gi_at(nvml: Nvml, handle: Any, profile_id: int, start: int) -> Any | None:
    count = ctypes.c_uint(0)
    array = (pynvml.c_nvmlGpuInstance_t * 8)()
    nvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
    for gi in array[: count.value]:
        try:
            placed = int(nvml.nvmlGpuInstanceGetInfo(gi).placement.start)
        except _DESTROYED_MEANWHILE:
            continue
        if placed == start:
            return gi
    return None


def _spanning_ci_profile(nvml: Nvml, gi: Any, slices: int) -> Any:
    for info in ci_profiles(nvml, gi):
        if int(info.sliceCount) == slices:
            return info
    raise MigStateError(f"no compute instance profile spans a {slices}-slice GPU instance")


def _compute_instances(nvml: Nvml, gi: Any, profile_id: int) -> list[Any]:
    count = ctypes.c_uint(0)
    array = (pynvml.c_nvmlComputeInstance_t * 8)()
    nvml.nvmlGpuInstanceGetComputeInstances(gi, profile_id, array, ctypes.byref(count))
    return list(array[: count.value])


def _mig_uuid(nvml: Nvml, handle: Any, gi_id: int, ci_id: int) -> str:
    # Another instance's destroy during the walk may shift the indices (the simulated
    # library numbers MIG devices in order): the walk is taken again, a few times.
    for _ in range(_MIG_UUID_WALKS):
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
                ids = (
                    int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                    int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                )
            except _DESTROYED_MEANWHILE:  # NOT_FOUND also for an index no device has
                continue
            if ids == (gi_id, ci_id):
                uuid = nvml.nvmlDeviceGetUUID(mig)
                return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    raise MigStateError(f"no MIG device handle for GPU instance {gi_id}, compute instance {ci_id}")
