"""The read-only NVML questions asked of a real H200 on 2026-12-04, as one function.

``probe()`` asks them through pynvml of whatever libnvidia-ml.so.1 is loaded (the real one
on a GPU machine, the simulated one in a test) and answers in the recorded form of
``tests/data/nvml-probe-real-h200.json``: a value, or ``{"error": <NVML's text>}`` for a call
that fails. Nothing is changed on the GPU. ``python -m tests.nvml_probe`` prints it, for a
new recording on a real machine.
"""

import ctypes
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import pynvml

NVLINKS = (0, 6, 12)  # a few links: enough to tell "no NVLink" from "wired"
GI_PROFILE_INDICES = range(10)  # NVML_GPU_INSTANCE_PROFILE_1_SLICE .. _1_SLICE_REV2


def _ask(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except pynvml.NVMLError as exc:
        return {"error": str(exc)}


def _fields(struct: Any, names: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(struct, name)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, ctypes.Array):
            value = list(value)
        out[name] = value
    return out


def _placements(gpu: Any, profile_id: int) -> list[list[int]]:
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, profile_id, array, ctypes.byref(count))
    return [[p.start, p.size] for p in array[: count.value]]


_GI_FIELDS = (
    "version", "id", "isP2pSupported", "sliceCount", "instanceCount", "multiprocessorCount",
    "copyEngineCount", "decoderCount", "encoderCount", "jpegCount", "ofaCount",
    "memorySizeMB", "name",
)  # fmt: skip


def _gi_profile(gpu: Any, index: int) -> dict[str, Any]:
    info = _ask(lambda: pynvml.nvmlDeviceGetGpuInstanceProfileInfoV(gpu, index))
    if isinstance(info, dict):
        return {"info": info, "placements": None, "remaining": None}
    return {
        "info": _fields(info, _GI_FIELDS),
        "placements": _ask(lambda: _placements(gpu, info.id)),
        "remaining": _ask(lambda: pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, info.id)),
    }


def _fabric(gpu: Any) -> Any:
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    info.version = pynvml.nvmlGpuFabricInfo_v2
    pynvml.nvmlDeviceGetGpuFabricInfoV(gpu, ctypes.byref(info))
    names = ("version", "clusterUuid", "status", "cliqueId", "state", "healthMask")
    return _fields(info, names)


def _device(gpu: Any) -> dict[str, Any]:
    ask = _ask
    memory = ("total", "free", "used")
    pci = ("busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId")
    memory_v2 = ("version", "total", "reserved", "free", "used")
    return {
        "Name": ask(lambda: pynvml.nvmlDeviceGetName(gpu)),
        "UUID": ask(lambda: pynvml.nvmlDeviceGetUUID(gpu)),
        "Brand": ask(lambda: pynvml.nvmlDeviceGetBrand(gpu)),
        "Architecture": ask(lambda: pynvml.nvmlDeviceGetArchitecture(gpu)),
        "MinorNumber": ask(lambda: pynvml.nvmlDeviceGetMinorNumber(gpu)),
        "CudaComputeCapability": ask(lambda: list(pynvml.nvmlDeviceGetCudaComputeCapability(gpu))),
        "MemoryInfo": ask(lambda: _fields(pynvml.nvmlDeviceGetMemoryInfo(gpu), memory)),
        "PciInfo_v3": ask(lambda: _fields(pynvml.nvmlDeviceGetPciInfo_v3(gpu), pci)),
        "MigMode": ask(lambda: pynvml.nvmlDeviceGetMigMode(gpu)),
        "MaxMigDeviceCount": ask(lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)),
        "SupportedEventTypes": ask(lambda: pynvml.nvmlDeviceGetSupportedEventTypes(gpu)),
        "ComputeMode": ask(lambda: pynvml.nvmlDeviceGetComputeMode(gpu)),
        "BoardPartNumber": ask(lambda: pynvml.nvmlDeviceGetBoardPartNumber(gpu)),
        "Serial": ask(lambda: pynvml.nvmlDeviceGetSerial(gpu)),
        "NumaNodeId": ask(lambda: pynvml.nvmlDeviceGetNumaNodeId(gpu)),
        "PersistenceMode": ask(lambda: pynvml.nvmlDeviceGetPersistenceMode(gpu)),
        "MemoryInfo_v2": ask(
            lambda: _fields(
                pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2), memory_v2
            )
        ),
        "GpuFabricInfoV": ask(lambda: _fabric(gpu)),
        "IsMigDeviceHandle": ask(lambda: repr(pynvml.nvmlDeviceIsMigDeviceHandle(gpu))),
        "NvLinkState": {
            str(link): ask(partial(pynvml.nvmlDeviceGetNvLinkState, gpu, link)) for link in NVLINKS
        },
        "GpuInstanceProfiles": {str(i): _gi_profile(gpu, i) for i in GI_PROFILE_INDICES},
        "GpuInstanceProfileInfoV_0": ask(
            lambda: _fields(pynvml.nvmlDeviceGetGpuInstanceProfileInfoV(gpu, 0), _GI_FIELDS)
        ),
    }


def probe() -> dict[str, Any]:
    """The answers of the loaded NVML (initialized by the caller), every GPU."""
    count = pynvml.nvmlDeviceGetCount()
    return {
        "driver": _ask(pynvml.nvmlSystemGetDriverVersion),
        "cuda": _ask(pynvml.nvmlSystemGetCudaDriverVersion),
        "nvml": _ask(pynvml.nvmlSystemGetNVMLVersion),
        "count": count,
        "devices": [_device(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)],
    }


if __name__ == "__main__":
    pynvml.nvmlInit()
    try:
        print(json.dumps(probe(), indent=1))
    finally:
        pynvml.nvmlShutdown()
