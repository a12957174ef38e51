"""GPU discovery: one code path over NVML (real or simulated) plus sysfs.

Synchronous on purpose: NVML calls block, so async callers run
``await asyncio.to_thread(discover, nvml, sysfs_root=...)``.

What can go wrong, and how it surfaces:

- NVML cannot be used at all (library missing, no permission): :class:`NvmlMissingError`,
  permanent, one line that says what to check.
- The driver is not loaded *yet* (a driver container still installing at boot) or NVML
  is busy: :class:`NvmlNotReadyError`, retryable; never reported as "zero GPUs".
- One GPU's queries fail: that GPU lands in ``Inventory.skipped`` with a warning naming
  its index, PCI bus ID and the NVML error; the others are published.
- A GPU in MIG mode is read with its MIG devices (:mod:`drivers.gpu.model.migdiscovery`); one whose
  MIG mode change waits for a reset, or whose MIG state cannot be read whole, is skipped
  the same way, with what to do.
"""

import ctypes
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pynvml

from driver.common.errors import PermanentError, RetryableError
from driver.common.logs import kv
from driver.nvml import Nvml
from drivers.gpu.model import topology
from drivers.gpu.model.inventory import Gpu, Inventory, SkippedGpu
from drivers.gpu.model.migdiscovery import (
    MigStateError,
    check_not_pending,
    mig_mode,
    read_mig_devices,
    read_partitions,
)

log = logging.getLogger(__name__)

_ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
    pynvml.NVML_DEVICE_ARCH_RUBIN: "Rubin",
}
# The spellings of go-nvlib's GetBrandAsString, which the upstream driver publishes.
_BRANDS = {
    pynvml.NVML_BRAND_UNKNOWN: "Unknown",
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "Grid",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    pynvml.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC",
    pynvml.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    pynvml.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS",
    pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    pynvml.NVML_BRAND_QUADRO_RTX: "QuadroRTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia",
    pynvml.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    pynvml.NVML_BRAND_TITAN_RTX: "TitanRTX",
}
# Readings of the GPUs one discovery makes at most while their count keeps changing.
_ENUMERATIONS = 3
# Conditions that pass on their own: a driver still loading, a driver upgrade in flight.
_NOT_READY = frozenset(
    {
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NOT_READY,
        pynvml.NVML_ERROR_TIMEOUT,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_IN_USE,
        pynvml.NVML_ERROR_RESET_REQUIRED,
    }
)
# A link slot that does not exist or is not wired: not an error for the GPU.
_NO_LINK = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})


class NvmlMissingError(PermanentError):
    """NVML cannot be used on this node (no library, no permission)."""


class NvmlNotReadyError(RetryableError):
    """NVML is there but not ready (driver still loading): retry, don't publish zero GPUs."""


@dataclass(frozen=True, slots=True)
class _Links:
    gpu_peers: frozenset[str]  # PCI bus IDs of directly linked GPUs
    to_switch: bool


def discover(
    nvml: Nvml,
    *,
    sysfs_root: Path = Path("/"),
    reported: set[str] | None = None,
    dynamic_mig: bool = False,
) -> Inventory:
    """Everything this node's GPUs tell NVML and sysfs, as one immutable Inventory.

    ``reported`` (a daemon keeps one across its rediscoveries) holds the skips already
    warned about: a GPU that stays skipped for the same reason is warned about once, and
    again only after it recovered and failed anew. With ``dynamic_mig``, a GPU in MIG mode
    is also read with every profile's possible placements (``Gpu.mig_partitions``).
    """
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _init_error(exc) from exc
    try:
        return _discover(nvml, sysfs_root, reported, dynamic_mig)
    finally:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown failed", extra=kv(error=str(exc)))


def _init_error(exc: Any) -> Exception:
    code = getattr(exc, "value", None)
    if code in _NOT_READY:
        return NvmlNotReadyError(
            f"NVML is not ready ({exc}): the NVIDIA driver is not loaded yet; retrying later"
        )
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return NvmlMissingError(
            "NVML library libnvidia-ml.so.1 not found: install the NVIDIA driver on this node "
            "(or mount the driver root into the container), or use --nvml simulated"
        )
    return NvmlMissingError(f"NVML cannot be initialized: {exc}")


def _system(call: str, fn: Any) -> Any:
    try:
        return fn()
    except pynvml.NVMLError as exc:
        raise NvmlNotReadyError(f"NVML {call} failed: {exc}") from exc


def _discover(
    nvml: Nvml, sysfs_root: Path, reported: set[str] | None, dynamic_mig: bool = False
) -> Inventory:
    driver_version = _text(_system("nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion))
    cuda = int(_system("nvmlSystemGetCudaDriverVersion", nvml.nvmlSystemGetCudaDriverVersion))
    count = int(_system("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount))
    for _ in range(_ENUMERATIONS):
        found = _enumerate(nvml, count, sysfs_root, dynamic_mig)
        try:
            now = int(nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError:
            now = count  # the pass stands; the next discovery counts again
        if now == count:
            break
        # A GPU came or went while we read them, and the indices after it moved: what
        # this pass read past that point is off by one (a healthy GPU would be missed).
        log.warning(
            "the GPU count changed during discovery; reading the GPUs again",
            extra=kv(was=count, now=now),
        )
        count = now
    gpus, links, failed = found
    skipped = [skip for skip, _ in failed]
    skips: set[str] = set()
    for skip, reason in failed:  # warned about once the pass that counts is known
        key = f"{skip.index}/{skip.pci_bus_id}/{skip.error}"
        skips.add(key)
        level = logging.DEBUG if reported is not None and key in reported else logging.WARNING
        log.log(
            level,
            f"skipping GPU: {reason}",
            extra=kv(index=skip.index, pci_bus_id=skip.pci_bus_id or "unknown", error=skip.error),
        )
    if reported is not None:
        reported.clear()
        reported.update(skips)

    return Inventory(
        driver_version=driver_version,
        cuda_driver_version=(cuda // 1000, cuda % 1000 // 10),
        gpus=tuple(sorted(_with_cliques(gpus, links), key=lambda g: g.index)),
        skipped=tuple(skipped),
    )


def _enumerate(
    nvml: Nvml, count: int, sysfs_root: Path, dynamic_mig: bool
) -> tuple[list[Gpu], dict[str, _Links], list[tuple[SkippedGpu, str]]]:
    """Every GPU of indices 0 to ``count``, read; those that fail, with the reason."""
    gpus: list[Gpu] = []
    links: dict[str, _Links] = {}
    failed: list[tuple[SkippedGpu, str]] = []
    for index in range(count):
        bus_id: str | None = None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus_id = normalize_pci_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            gpu = _read_gpu(nvml, handle, index, bus_id, sysfs_root, dynamic_mig)
            links[bus_id] = _read_links(nvml, handle)
        except (pynvml.NVMLError, MigStateError) as exc:
            reason = "MIG state" if isinstance(exc, MigStateError) else "NVML query failed"
            failed.append((SkippedGpu(index=index, pci_bus_id=bus_id, error=str(exc)), reason))
            continue
        gpus.append(gpu)
    return gpus, links, failed


def _read_gpu(
    nvml: Nvml, handle: Any, index: int, bus_id: str, sysfs_root: Path, dynamic_mig: bool
) -> Gpu:
    major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    brand = nvml.nvmlDeviceGetBrand(handle)
    arch = nvml.nvmlDeviceGetArchitecture(handle)
    cluster_uuid, clique_id = _fabric(nvml, handle)
    pci_dir = sysfs_root / "sys" / "bus" / "pci" / "devices" / bus_id
    minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
    mig_current, mig_pending = mig_mode(nvml, handle)
    check_not_pending(mig_current, mig_pending)
    # The driver's /proc is the host's in every container, as sysfs is.
    mig = read_mig_devices(nvml, handle, minor, sysfs_root) if mig_current else ()
    partitions = read_partitions(nvml, handle) if mig_current and dynamic_mig else ()
    return Gpu(
        index=index,
        minor=minor,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        product_name=_text(nvml.nvmlDeviceGetName(handle)),
        brand=_BRANDS.get(brand, "Unknown"),
        architecture=_ARCHITECTURES.get(arch, "Unknown"),
        cuda_compute_capability=(int(major), int(minor_cc)),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        pci_bus_id=bus_id,
        pcie_root=pcie_root(sysfs_root, bus_id),
        numa_node=_numa_node(pci_dir),
        mig_enabled=mig_current,
        fabric_cluster_uuid=cluster_uuid,
        fabric_clique_id=clique_id,
        mig_devices=mig,
        mig_partitions=partitions,
    )


def _fabric(nvml: Nvml, handle: Any) -> tuple[str | None, int | None]:
    """Cluster UUID and clique ID, only when supported, complete and non-zero."""
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.pointer(info))
    except (
        pynvml.NVMLError_NotSupported,
        pynvml.NVMLError_FunctionNotFound,  # driver older than the V call
        pynvml.NVMLError_ArgumentVersionMismatch,  # driver older than this struct version
    ):
        return None, None
    raw = bytes(info.clusterUuid)
    if (
        info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        or info.status != pynvml.NVML_SUCCESS
        or not any(raw)
    ):
        return None, None
    hexed = raw.hex()
    uuid = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
    return uuid, int(info.cliqueId)


def _read_links(nvml: Nvml, handle: Any) -> _Links:
    peers: set[str] = set()
    to_switch = False
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) in _NO_LINK:
                continue
            raise
        remote = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        if remote == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            to_switch = True
        elif remote == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            pci = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            peers.add(normalize_pci_bus_id(_text(pci.busId)))
    return _Links(gpu_peers=frozenset(peers), to_switch=to_switch)


def _with_cliques(gpus: list[Gpu], links: dict[str, _Links]) -> list[Gpu]:
    index_of = {gpu.pci_bus_id: gpu.index for gpu in gpus}
    direct = {
        gpu.index: [index_of[p] for p in links[gpu.pci_bus_id].gpu_peers if p in index_of]
        for gpu in gpus
    }
    switched = [gpu.index for gpu in gpus if links[gpu.pci_bus_id].to_switch]
    groups = topology.cliques(topology.connectivity(direct, switched))
    clique_of = {member: number for number, group in enumerate(groups) for member in group}
    return [replace(gpu, nvlink_clique=clique_of.get(gpu.index)) for gpu in gpus]


def normalize_pci_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:53:00.0`` -> upstream's ``0000:53:00.0`` (lowercase, 4-digit domain)."""
    domain, bus, rest = bus_id.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{rest}"


def pcie_root(sysfs_root: Path, bus_id: str) -> str | None:
    """``pci<domain>:<bus>`` from the ``sys/bus/pci/devices/<bdf>`` symlink, as upstream does."""
    link = sysfs_root / "sys" / "bus" / "pci" / "devices" / bus_id
    try:
        target = link.readlink()
    except OSError as exc:
        log.warning("no PCIe root for GPU", extra=kv(pci_bus_id=bus_id, error=str(exc)))
        return None
    devices = Path(os.path.normpath(sysfs_root / "sys" / "devices"))
    # normpath, not resolve(): the link may point outside a simulated root's real path.
    resolved = Path(os.path.normpath(link.parent / target))
    parts = resolved.relative_to(devices).parts if resolved.is_relative_to(devices) else ()
    if not parts or not parts[0].startswith("pci") or resolved.name != bus_id:
        log.warning(
            "unexpected sysfs link for GPU", extra=kv(pci_bus_id=bus_id, target=str(target))
        )
        return None
    return parts[0]


def _numa_node(pci_dir: Path) -> int | None:
    try:
        value = int(pci_dir.joinpath("numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
