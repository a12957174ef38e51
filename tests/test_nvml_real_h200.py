"""The simulated p5e.48xlarge H200 answers NVML as a real H200 did.

``tests/data/nvml-probe-real-h200.json`` is the recorded answer of a real NVIDIA H200 141GB
(driver 580.159.04, CUDA 13.0, MIG off) on 2026-12-04 to the questions of
``tests.nvml_probe``, copied unchanged from the project's real-GPU run
(reference/wave4/realgpu/nvml-probe-real.json). The same questions go to the simulated
library through the real pynvml, and every answer not in ``PER_MACHINE`` must be equal.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from driver.nvml.simulated import SimulatedNode
from tests.nvml_probe import probe

REAL = Path(__file__).resolve().parent / "data" / "nvml-probe-real-h200.json"

# What differs between two real H200 machines, so a simulation cannot be held to one of them.
PER_MACHINE: dict[str, str] = {
    "driver": "the installed driver's version",
    "nvml": "the installed driver's version",
    "count": "GPUs in the machine: the probe's VM had one, a p5e.48xlarge has eight",
    "devices.0.UUID": "each GPU's own",
    "devices.0.Serial": "each board's own",
    "devices.0.BoardPartNumber": "the board's vendor and revision, not the GPU's",
    "devices.0.PciInfo_v3.busIdLegacy": "where the GPU sits on this machine's bus",
    "devices.0.PciInfo_v3.busId": "where the GPU sits on this machine's bus",
    "devices.0.PciInfo_v3.domain": "where the GPU sits on this machine's bus",
    "devices.0.PciInfo_v3.bus": "where the GPU sits on this machine's bus",
    "devices.0.PciInfo_v3.device": "where the GPU sits on this machine's bus",
    "devices.0.PciInfo_v3.pciSubSystemId": "the board vendor's ID, not NVIDIA's GPU ID",
    "devices.0.MemoryInfo.free": "what this machine's processes and driver hold now",
    "devices.0.MemoryInfo.used": "what this machine's processes and driver hold now",
    "devices.0.MemoryInfo_v2.free": "what this machine's processes and driver hold now",
    "devices.0.MemoryInfo_v2.used": "what this machine's processes and driver hold now",
    "devices.0.MemoryInfo_v2.reserved": "the installed driver's reservation",
    "devices.0.NvLinkState": "the machine's NVLink wiring: none in a one-GPU VM",
    "devices.0.NumaNodeId": "the machine: a VM shows no NUMA node, a p5e host two",
    "devices.0.ComputeMode": "an administrator's setting, which the driver itself changes",
    "devices.0.PersistenceMode": "an administrator's setting (nvidia-persistenced)",
}


def _leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every scalar, except paths under ``PER_MACHINE``."""
    if path in PER_MACHINE:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}.{i}" if path else str(i))
    else:
        yield path, value


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    node = SimulatedNode("p5e.48xlarge", "node", tmp_path_factory.mktemp("p5e"))
    node.nvml.nvmlInit()
    try:
        answers = probe()
    finally:
        pynvml.nvmlShutdown()
    answers["devices"] = answers["devices"][:1]  # the probe's VM had one GPU
    return answers


def test_the_simulated_h200_answers_as_the_real_one(simulated: dict[str, Any]) -> None:
    real = dict(_leaves(json.loads(REAL.read_text())))
    sim = dict(_leaves(simulated))
    assert sorted(sim) == sorted(real), "the two answer different questions"
    differences = {p: (real[p], sim[p]) for p in real if real[p] != sim[p]}
    assert differences == {}
    # Every question but the per-machine ones was compared: 207 answers.
    assert len(real) == 207


def test_every_per_machine_exception_names_a_recorded_answer() -> None:
    real = json.loads(REAL.read_text())
    for path in PER_MACHINE:
        node: Any = real
        for part in path.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]


def test_mig_memory_is_the_real_h200s(simulated: dict[str, Any]) -> None:
    """The numbers published MIG devices inherit, named, so a change shows which moved."""
    profiles = simulated["devices"][0]["GpuInstanceProfiles"].values()
    memory = {p["info"]["name"]: p["info"]["memorySizeMB"] for p in profiles if "id" in p["info"]}
    assert memory == {
        "MIG 1g.18gb": 16384, "MIG 1g.18gb+me": 16384, "MIG 1g.35gb": 33280,
        "MIG 2g.35gb": 33280, "MIG 3g.71gb": 71424, "MIG 4g.71gb": 71424,
        "MIG 7g.141gb": 143360,
    }  # fmt: skip


SMI_Q = Path(__file__).resolve().parent / "data" / "nvidia-smi-q-h200.txt"
# How nvidia-smi -q prints nvmlGpuVirtualizationMode_t.
_VIRTUALIZATION = {
    "None": pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE,
    "Pass-Through": pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH,
    "VGPU": pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU,
}


def _smi_q(field: str) -> str:
    (value,) = [
        line.split(":", 1)[1].strip()
        for line in SMI_Q.read_text().splitlines()
        if line.split(":", 1)[0].strip() == field
    ]
    return value


def test_answers_only_nvidia_smi_recorded_are_the_real_h200s(tmp_path: Path) -> None:
    """Questions NVIDIA's plugin asks that the probe did not record (its vGPU check before
    dynamic MIG, its device index), held to the real machine's ``nvidia-smi -q``."""
    node = SimulatedNode("p5e.48xlarge", "node", tmp_path)
    node.nvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mode = pynvml.nvmlDeviceGetVirtualizationMode(handle)
        minor = pynvml.nvmlDeviceGetMinorNumber(handle)
        index = pynvml.nvmlDeviceGetIndex(handle)
    finally:
        pynvml.nvmlShutdown()
    assert mode == _VIRTUALIZATION[_smi_q("Virtualization Mode")]  # EC2 passes GPUs through
    assert minor == int(_smi_q("Minor Number")) == index
