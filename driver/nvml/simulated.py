"""Simulated NVML: the pynvml functions discovery calls, backed by a hardware profile.

Same names, same arguments, same return types (pynvml's own ctypes structures)
and pynvml's own exception classes, so discovery cannot tell it from the real
library. Faults (see :mod:`driver.nvml.faults`) come from the profile, from
``faults=`` (tests may also assign ``.faults`` later) and from the state file,
which is re-read at every ``nvmlInit()``.

:class:`SimulatedNode` bundles the NVML with its generated sysfs tree: what the
controller, the kubelet plugin, the demo and the tests call "a simulated node".
"""

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from driver.nvml.faults import Faults, cuda_version_number, read_state_file
from driver.nvml.profile import Profile, SimGpu, load_profile
from driver.nvml.sysfs import write_sysfs

STATE_FILE_ENV = "GPU_DRA_SIM_STATE"


def state_file_from_env() -> Path | None:
    value = os.environ.get(STATE_FILE_ENV)
    return Path(value) if value else None


@dataclass(frozen=True, slots=True)
class _Handle:
    """What nvmlDeviceGetHandleByIndex returns: stays tied to the GPU, not the index."""

    minor: int


@dataclass(frozen=True, slots=True)
class _Session:
    faults: Faults
    visible: tuple[SimGpu, ...]
    by_minor: dict[int, SimGpu]
    fabric_cluster: bytes


class SimulatedNvml:
    """One node's NVML. Thread-safe; ``nvmlInit``/``nvmlShutdown`` are reference-counted."""

    def __init__(
        self,
        profile: Profile,
        *,
        node_name: str = "node",
        faults: Faults | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.profile = profile
        self.node_name = node_name
        self.faults = faults or Faults()
        self.state_file = state_file
        self.gpus = profile.gpus(node_name)
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._refcount = 0

    def effective_faults(self) -> Faults:
        return read_state_file(self.state_file).over(self.faults.over(self.profile.faults))

    # -- library -------------------------------------------------------------

    def nvmlInit(self) -> None:
        faults = self.effective_faults()
        if faults.nvml == "missing":
            raise pynvml.NVMLError_LibraryNotFound()
        if faults.nvml == "not-loaded":
            raise pynvml.NVMLError_DriverNotLoaded()
        removed = faults.removed_gpus or frozenset()
        visible = tuple(g for g in self.gpus if g.minor not in removed)
        seed = faults.fabric_cluster or self.node_name
        with self._lock:
            self._session = _Session(
                faults=faults,
                visible=visible,
                by_minor={g.minor: g for g in visible},
                fabric_cluster=self.profile.fabric_cluster_uuid(seed),
            )
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            if self._refcount == 0:
                raise pynvml.NVMLError_Uninitialized()
            self._refcount -= 1
            if self._refcount == 0:
                self._session = None

    def _current(self) -> _Session:
        session = self._session
        if session is None:
            raise pynvml.NVMLError_Uninitialized()
        return session

    def _gpu(self, handle: Any, call: str) -> tuple[SimGpu, _Session]:
        session = self._current()
        if not isinstance(handle, _Handle):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = session.by_minor.get(handle.minor)
        if gpu is None:
            raise pynvml.NVMLError_GpuIsLost()
        failure = session.faults.failure(gpu.minor, call)
        if failure is not None:
            raise failure
        return gpu, session

    # -- system --------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._current().faults.driver_version or self.profile.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        faults = self._current().faults
        return cuda_version_number(faults.cuda_driver_version or self.profile.cuda_driver_version)

    def nvmlDeviceGetCount(self) -> int:
        return len(self._current().visible)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        session = self._current()
        if not 0 <= index < len(session.visible):
            raise pynvml.NVMLError_InvalidArgument()
        handle = _Handle(session.visible[index].minor)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    # -- device --------------------------------------------------------------

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMinorNumber")[0].minor

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID")[0].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName")[0].name

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetBrand")[0].brand

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        return self._gpu(device, "nvmlDeviceGetArchitecture")[0].architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability")[0].compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")[0]
        memory = pynvml.c_nvmlMemory_t()
        memory.total = gpu.memory_bytes
        memory.free = gpu.memory_bytes
        memory.used = 0
        return memory

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return _pci_info(self._gpu(handle, "nvmlDeviceGetPciInfo")[0].pci_bus_id)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")[0]
        if not gpu.mig_capable:
            raise pynvml.NVMLError_NotSupported()
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def _link(self, device: Any, link: int, call: str) -> Any:
        gpu = self._gpu(device, call)[0]
        if not gpu.nvlinks:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise pynvml.NVMLError_InvalidArgument()
        if link >= len(gpu.nvlinks):
            raise pynvml.NVMLError_NotSupported()
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        self._link(device, link, "nvmlDeviceGetNvLinkState")
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return int(self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        remote = self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if remote.remote_pci_bus_id is None:
            raise pynvml.NVMLError_NotSupported()
        return _pci_info(remote.remote_pci_bus_id)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        _, session = self._gpu(device, "nvmlDeviceGetGpuFabricInfoV")
        state = session.faults.fabric or self.profile.fabric
        if state == "not-supported":
            raise pynvml.NVMLError_NotSupported()
        info = gpuFabricInfo.contents  # callers pass ctypes.pointer(struct), as to the C library
        info.status = pynvml.NVML_SUCCESS
        info.cliqueId = 0
        info.clusterUuid[:] = bytes(pynvml.NVML_GPU_FABRIC_UUID_LEN)
        if state == "in-progress":
            info.state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
            info.status = pynvml.NVML_ERROR_NOT_READY
            return int(pynvml.NVML_SUCCESS)
        info.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        if state == "completed":
            info.clusterUuid[:] = session.fabric_cluster
            info.cliqueId = self.profile.fabric_clique_id
        return int(pynvml.NVML_SUCCESS)


def _pci_info(bus_id: str) -> Any:
    """pynvml's nvmlPciInfo_t for an upstream-form bus ID, spelled as NVML spells it."""
    domain_hex, bus_hex, rest = bus_id.split(":")
    device_hex, function_hex = rest.split(".")
    domain, bus, device = int(domain_hex, 16), int(bus_hex, 16), int(device_hex, 16)
    info = pynvml.nvmlPciInfo_t()
    info.busId = f"{domain:08X}:{bus:02X}:{device:02X}.{int(function_hex, 16):X}".encode()
    info.busIdLegacy = f"{domain:04X}:{bus:02X}:{device:02X}.{int(function_hex, 16):X}".encode()
    info.domain = domain
    info.bus = bus
    info.device = device
    info.pciDeviceId = 0x233010DE
    return info


class SimulatedNode:
    """A simulated node: NVML plus the sysfs tree under ``root_dir`` (pass as ``sysfs_root``)."""

    def __init__(
        self,
        profile: str | Path | Profile,
        node_name: str,
        root_dir: Path,
        *,
        faults: Faults | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile)
        self.node_name = node_name
        self.sysfs_root = root_dir
        self.nvml = SimulatedNvml(
            self.profile,
            node_name=node_name,
            faults=faults,
            state_file=state_file if state_file is not None else state_file_from_env(),
        )
        write_sysfs(root_dir, self.nvml.gpus)
