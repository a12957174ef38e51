"""The MIG devices of a GPU in MIG mode, as NVML and the driver's capability files say.

Read-only: the plugin never changes MIG mode nor creates instances (on Ampere a mode change
needs a GPU reset, which loops on cloud VMs). MIG devices are walked by handle, as
NVIDIA's own tools do: each handle names its GPU and compute instance, whose profiles give
the name, placement, memory and engines. A container on a MIG device needs the two
``nvidia-cap`` device nodes behind the instances' ``access`` files under
``/proc/driver/nvidia/capabilities``.

Every failure raises: a half-read MIG layout is never published. NVML errors stay
``pynvml.NVMLError``; what the driver's files lack is :class:`MigStateError`.
"""

import ctypes
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml

from driver.common.errors import PermanentError
from driver.nvml import Nvml
from drivers.gpu.model.inventory import MigDevice, MigPartition

_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


class MigStateError(PermanentError):
    """A GPU's MIG state cannot be published: a mode change pending a reset, or the
    driver's capability files missing for an instance."""


class AccessFileGoneError(MigStateError):
    """An instance's capability file is not there: its instance was destroyed since it was
    listed, or the host's /proc/driver/nvidia is not visible."""


# An instance destroyed between its listing and its queries (NVML answers its stale handles
# NOT_FOUND or INVALID_ARGUMENT, the driver removes its access files) makes the read of the
# GPU start over, up to this many reads in all.
_LAYOUT_READS = 3
_LAYOUT_CHANGED = (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument, AccessFileGoneError)


def mig_mode(nvml: Nvml, handle: Any) -> tuple[bool, bool]:
    """(current, pending) MIG mode; both False on a GPU without MIG."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        return False, False
    return current == pynvml.NVML_DEVICE_MIG_ENABLE, pending == pynvml.NVML_DEVICE_MIG_ENABLE


def check_not_pending(current: bool, pending: bool) -> None:
    if current != pending:
        state = {True: "enabled", False: "disabled"}
        raise MigStateError(
            f"MIG mode is {state[current]} but {state[pending]} after the next GPU reset: "
            "not published until the GPU is reset (the plugin never resets GPUs or changes "
            "MIG mode; reset it, or revert the pending change, then restart the plugin)"
        )


def read_mig_devices(nvml: Nvml, handle: Any, minor: int, proc_root: Path) -> tuple[MigDevice, ...]:
    """Every MIG device of the GPU ``handle`` (MIG mode on), ordered by placement.

    Instances come and go while the GPU is read: dynamic MIG's prepares and unprepares,
    this process's or, during a surge upgrade, the sibling plugin instance's. A read that
    an instance vanished under is done again (a few times, then its error stands): a GPU
    skipped for it would take every device on it away from the claims until the next
    rediscovery."""
    reads = 1
    while True:
        try:
            return _read_mig_devices(nvml, handle, minor, proc_root)
        except _LAYOUT_CHANGED:
            if reads == _LAYOUT_READS:
                raise
            reads += 1


def _read_mig_devices(
    nvml: Nvml, handle: Any, minor: int, proc_root: Path
) -> tuple[MigDevice, ...]:
    profiles = gi_profiles(nvml, handle)
    devices = []
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError_NotFound:
            continue  # indices of destroyed instances stay free
        devices.append(_mig_device(nvml, handle, mig, minor, profiles, proc_root))
    return tuple(sorted(devices, key=lambda d: (d.placement_start, d.profile_id, d.ci_id)))


def read_partitions(nvml: Nvml, handle: Any) -> tuple[MigPartition, ...]:
    """Every GPU instance profile at every placement NVML says is possible on the GPU
    ``handle`` (MIG mode on), whatever is created now; ordered small to large, as the
    scheduler picks first fit."""
    partitions = []
    for index, info in _gi_profiles_by_index(nvml, handle):
        for start, size in possible_placements(nvml, handle, int(info.id)):
            partitions.append(
                MigPartition(
                    profile=_text(info.name).removeprefix("MIG "),
                    profile_index=index,
                    profile_id=int(info.id),
                    placement_start=start,
                    placement_size=size,
                    memory_bytes=int(info.memorySizeMB) << 20,
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                )
            )
    return tuple(
        sorted(partitions, key=lambda p: (p.placement_size, p.memory_bytes, p.multiprocessors,
                                          p.ofa_engines, p.profile_id, p.placement_start))
    )  # fmt: skip


def possible_placements(nvml: Nvml, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    """(start, size) of each placement of the profile, asked twice as NVML wants: the count
    first, then into an array of that size."""
    count = ctypes.c_uint(0)
    fn = nvml.nvmlDeviceGetGpuInstancePossiblePlacements
    fn(handle, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    fn(handle, profile_id, array, ctypes.byref(count))
    return [(int(p.start), int(p.size)) for p in array[: count.value]]


def _gi_profiles_by_index(nvml: Nvml, handle: Any) -> list[tuple[int, Any]]:
    found = []
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except pynvml.NVMLError_NotSupported:
            continue
        except pynvml.NVMLError_InvalidArgument:
            break
        found.append((index, info))
    return found


def gi_profiles(nvml: Nvml, handle: Any) -> dict[int, Any]:
    """GPU instance profile infos by profile ID, found by index until NVML says no more."""
    return {int(info.id): info for _, info in _gi_profiles_by_index(nvml, handle)}


def _mig_device(
    nvml: Nvml, handle: Any, mig: Any, minor: int, profiles: dict[int, Any], proc_root: Path
) -> MigDevice:
    gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
    ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
    gi_profile = profiles.get(int(gi_info.profileId))
    if gi_profile is None:
        raise MigStateError(f"GPU instance {gi_id} has profile ID {gi_info.profileId}, "
                            "which NVML does not list")  # fmt: skip
    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
    ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
    ci_profile = _ci_profile(nvml, gi, int(ci_info.profileId))
    name = _text(gi_profile.name).removeprefix("MIG ")
    spans = int(ci_profile.sliceCount) == int(gi_profile.sliceCount)
    if not spans:
        name = f"{ci_profile.sliceCount}c.{name}"
    gi_dir = proc_root / "proc" / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig"
    gi_dir = gi_dir / f"gi{gi_id}"
    return MigDevice(
        uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
        profile=name,
        profile_id=int(gi_info.profileId),
        gi_id=gi_id,
        ci_id=ci_id,
        placement_start=int(gi_info.placement.start),
        placement_size=int(gi_info.placement.size),
        spans_gpu_instance=spans,
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
        multiprocessors=int(ci_profile.multiprocessorCount),
        copy_engines=int(gi_profile.copyEngineCount),
        decoders=int(gi_profile.decoderCount),
        encoders=int(gi_profile.encoderCount),
        jpeg_engines=int(gi_profile.jpegCount),
        ofa_engines=int(gi_profile.ofaCount),
        gi_access_minor=access_minor(gi_dir / "access"),
        ci_access_minor=access_minor(gi_dir / f"ci{ci_id}" / "access"),
    )


def ci_profiles(nvml: Nvml, gi: Any) -> Iterator[Any]:
    """The compute-instance profiles (shared engines) the GPU instance ``gi`` offers."""
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            yield nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue


def _ci_profile(nvml: Nvml, gi: Any, profile_id: int) -> Any:
    for info in ci_profiles(nvml, gi):
        if int(info.id) == profile_id:
            return info
    raise MigStateError(f"compute instance profile ID {profile_id} is not one NVML lists")


def access_minor(path: Path) -> int:
    """The ``DeviceFileMinor`` of a capability ``access`` file."""
    try:
        found = _MINOR.search(path.read_text())
    except OSError as exc:
        error = AccessFileGoneError if isinstance(exc, FileNotFoundError) else MigStateError
        raise error(
            f"cannot read {path} ({exc.strerror}): the driver keeps one per MIG instance; "
            "is the host's /proc/driver/nvidia visible to the plugin?"
        ) from exc
    if found is None:
        raise MigStateError(f"{path} has no DeviceFileMinor line")
    return int(found.group(1))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
