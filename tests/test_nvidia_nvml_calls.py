"""Every NVML call NVIDIA's own plugin made on the simulated NVML, and what holds each answer.

``tests/data/nvidia-plugin/nvml-calls.json`` lists the calls NVIDIA's GPU kubelet plugin
(v0.4.1, through go-nvml and its toolkit's CDI library) made on our stand-in
(``driver/nvml/sim``), from the stand-in's call trace, with the codes it answered: at start
(discovery, the CDI cache) on a p5e.48xlarge (also with its DynamicMIG gate on, in and out
of MIG mode) and a p4d.24xlarge in static MIG, and at prepare and unprepare (MPS's too)
(``tests/e2e/nvidia_plugin.py``). Each call is either one whose answer
``tests/test_nvml_real_h200.py`` holds to the recorded real H200 (:data:`REAL`, with the
record's field it is held by), or one the real record does not cover (:data:`UNCOVERED`,
with what holds it instead).
"""

import ctypes
import json
from pathlib import Path
from typing import Final

from driver.nvml.sim.build import library

DATA: Final = Path(__file__).parent / "data"
CALLS: Final = DATA / "nvidia-plugin" / "nvml-calls.json"
REAL_H200: Final = DATA / "nvml-probe-real-h200.json"
SUCCESS, NOT_SUPPORTED, NOT_FOUND = 0, 3, 6

# Call -> the real H200 record's field whose answer tests/test_nvml_real_h200.py holds it to
# ("devices.0.X" a GPU's, else the record's top level).
REAL: Final[dict[str, str]] = {
    "nvmlSystemGetDriverVersion": "driver",
    "nvmlSystemGetCudaDriverVersion": "cuda",
    "nvmlDeviceGetCount_v2": "count",
    "nvmlDeviceGetName": "devices.0.Name",
    "nvmlDeviceGetUUID": "devices.0.UUID",
    "nvmlDeviceGetBrand": "devices.0.Brand",
    "nvmlDeviceGetArchitecture": "devices.0.Architecture",
    "nvmlDeviceGetMinorNumber": "devices.0.MinorNumber",
    "nvmlDeviceGetCudaComputeCapability": "devices.0.CudaComputeCapability",
    "nvmlDeviceGetMemoryInfo": "devices.0.MemoryInfo",
    "nvmlDeviceGetPciInfo_v3": "devices.0.PciInfo_v3",
    "nvmlDeviceGetMigMode": "devices.0.MigMode",
    "nvmlDeviceGetMaxMigDeviceCount": "devices.0.MaxMigDeviceCount",
    "nvmlDeviceIsMigDeviceHandle": "devices.0.IsMigDeviceHandle",
    # profiles 0-9: the seven an H200 has, and "Not Supported" for 5, 6 and 8
    "nvmlDeviceGetGpuInstanceProfileInfo": "devices.0.GpuInstanceProfiles",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2": "devices.0.GpuInstanceProfiles",
}
_MIG_ON = (
    "a GPU in MIG mode, which the real H200 (MIG off) could not answer; our own MIG "
    "discovery makes the same call (drivers/gpu/model/migdiscovery.py), held by "
    "tests/test_nvml_mig.py and tests/test_discovery_mig.py to NVML's documented behaviour"
)
# Call -> why the real record does not cover it, and what holds it instead.
UNCOVERED: Final[dict[str, str]] = {
    "nvmlInitWithFlags": "init (NVIDIA asks INIT_FLAG_NO_GPUS); tests/test_discovery.py",
    "nvmlInit_v2": "init; tests/test_nvml_library.py",
    "nvmlShutdown": "the reference count of inits; tests/test_nvml_library.py",
    "nvmlDeviceGetHandleByIndex_v2": "a handle, no answer of the GPU's own",
    "nvmlDeviceGetHandleByUUID": "a handle by the UUID the stand-in gave; tests/test_nvml_mig.py",
    "nvmlDeviceGetIndex": (
        "learnt for NVIDIA's plugin (its toolkit names CDI devices by it; the plugin died "
        "on the missing symbol): a GPU's place on the bus, a MIG device's among its GPU's, "
        "as NVML's header documents; tests/test_nvml_library.py, and GPU 0's index equals "
        "its minor as on the real H200 (tests/test_nvml_real_h200.py)"
    ),
    "nvmlDeviceGetVirtualizationMode": (
        "learnt for NVIDIA's plugin with its DynamicMIG gate (it skips vGPU guests; the "
        "plugin died on the missing symbol): PASSTHROUGH, as the real H200's nvidia-smi -q "
        "says ('Pass-Through'); tests/test_nvml_real_h200.py"
    ),
    "nvmlDeviceGetMigDeviceHandleByIndex": _MIG_ON,
    "nvmlDeviceGetGpuInstanceId": _MIG_ON,
    "nvmlDeviceGetComputeInstanceId": _MIG_ON,
    "nvmlDeviceGetGpuInstanceById": _MIG_ON,
    "nvmlGpuInstanceGetInfo": _MIG_ON,
    "nvmlGpuInstanceGetComputeInstanceById": _MIG_ON,
    "nvmlGpuInstanceGetComputeInstanceProfileInfo": _MIG_ON,
    "nvmlComputeInstanceGetInfo_v2": _MIG_ON,
}
# Call -> the codes other than SUCCESS it may answer NVIDIA's plugin, and why.
REFUSALS: Final[dict[str, set[int]]] = {
    # profile indices a GPU lacks: 5, 6, 8 as the real H200 answered, and those past 9 that
    # go-nvml's profile count covers (NVIDIA's plugin skips NOT_SUPPORTED and INVALID_ARGUMENT)
    "nvmlDeviceGetGpuInstanceProfileInfo": {NOT_SUPPORTED},
    "nvmlGpuInstanceGetComputeInstanceProfileInfo": {NOT_SUPPORTED},
    "nvmlDeviceGetMigDeviceHandleByIndex": {NOT_FOUND},  # past a GPU's last MIG device
}


def _calls() -> dict[str, set[int]]:
    body = json.loads(CALLS.read_text())
    assert body["source"]["tag"] == "v0.4.1"
    out: dict[str, set[int]] = {}
    for calls in body["calls"].values():
        for name, code, count in calls:
            assert count > 0
            out.setdefault(name, set()).add(code)
    return out


def test_every_call_is_held_by_the_real_record_or_listed() -> None:
    calls = _calls()
    assert len(calls) == 31
    assert set(calls) == set(REAL) | set(UNCOVERED)
    assert not set(REAL) & set(UNCOVERED)
    real = json.loads(REAL_H200.read_text())
    for field in REAL.values():
        node = real
        for part in field.split("."):
            node = node[int(part)] if part.isdigit() else node[part]
        assert node is not None, field


def test_the_stand_in_refuses_only_as_listed() -> None:
    for name, codes in _calls().items():
        assert codes - {SUCCESS} <= REFUSALS.get(name, set()), (name, codes)
    real = json.loads(REAL_H200.read_text())["devices"][0]["GpuInstanceProfiles"]
    refused = {i for i, p in real.items() if p["info"] == {"error": "Not Supported"}}
    assert refused == {"5", "6", "8"}  # what the real H200 answered NOT_SUPPORTED to


def test_the_stand_in_exports_every_call() -> None:
    """A symbol missing is the plugin's death ("undefined symbol", go-nvml binds lazily)."""
    lib = ctypes.CDLL(str(library()))
    missing = [name for name in _calls() if not hasattr(lib, name)]
    assert missing == []
