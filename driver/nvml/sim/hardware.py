"""A profile's GPUs and their faults, as the line file the simulated library reads.

Pure: the YAML parsing, validation and layering of faults stay in Python (profile.py,
faults.py), so that the C side parses only ``key value`` lines of numbers and short text.
"""

from collections.abc import Iterable
from pathlib import Path

import pynvml

from driver.nvml.faults import Faults, SimulationConfigError, cuda_version_number
from driver.nvml.profile import Profile, SimGpu

# Fabric state and status per FabricState, as NVML reports them; None: the call itself
# answers NOT_SUPPORTED (Ampere). "none" is a GPU that answers it with no fabric, as a real
# H200 without NVSwitch did (state 0, status 0).
_FABRIC: dict[str, tuple[int, int] | None] = {
    "not-supported": None,
    "none": (pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_SUCCESS),
    "zero": (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS),
    "in-progress": (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_ERROR_NOT_READY),
    "completed": (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS),
}
_INIT = {
    "ok": "ok",
    "missing": str(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
    "not-loaded": str(pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
}
MAX_GPUS = 512  # the C library's table


def _one_line(text: str) -> str:
    return " ".join(text.split())


def hardware_text(
    profile: Profile,
    gpus: Iterable[SimGpu],
    faults: Faults,
    fabric_cluster: bytes,
    root: Path | None = None,
) -> str:
    """The file for ``gpus`` of ``profile`` with ``faults`` (already layered) applied;
    instances created at run time get their access files under ``root``."""
    fabric = faults.fabric or profile.fabric
    answer = _FABRIC[fabric]
    lines = [
        f"# simulated NVML hardware: profile {_one_line(profile.name)}",
        f"init {_INIT[faults.nvml or 'ok']}",
        f"driver {_one_line(faults.driver_version or profile.driver_version)}",
        f"cuda {cuda_version_number(faults.cuda_driver_version or profile.cuda_driver_version)}",
        "fabric none" if answer is None else f"fabric {answer[0]} {answer[1]}",
        f"events {profile.event_types}",
    ]
    if fabric == "completed":
        lines += [f"clique {profile.fabric_clique_id}", f"cluster {fabric_cluster.hex()}"]
    removed = faults.removed_gpus or frozenset()
    gpus = tuple(gpus)
    if len(gpus) > MAX_GPUS:
        raise SimulationConfigError(f"profile {profile.name}: more than {MAX_GPUS} GPUs")
    minors = {gpu.minor for gpu in gpus}
    if root is not None:
        lines.append(f"root {root}")
    if profile.mig_capable:
        for m in profile.mig_profiles:
            lines.append(
                f"migprofile {m.index} {m.id} {_one_line(m.name).replace(' ', '')} "
                f"{m.compute_slices} {m.memory_slices} {m.instances} {m.multiprocessors} "
                f"{m.copy_engines} {m.decoders} {m.encoders} {m.jpeg_engines} "
                f"{m.ofa_engines} {m.memory_mib} {','.join(str(s) for s in m.starts)}"
            )
    for gpu in gpus:
        major, minor = gpu.compute_capability
        lines += [
            f"gpu {gpu.minor}",
            f"uuid {gpu.uuid}",
            f"name {_one_line(gpu.name)}",
            f"brand {gpu.brand}",
            f"arch {gpu.architecture}",
            f"cc {major} {minor}",
            f"memory {gpu.memory_bytes}",
            f"pci {gpu.pci_bus_id}",
            f"pcidevid {profile.pci_device_id:#x}",
            f"mig {int(gpu.mig_capable)} {int(gpu.mig_enabled)} {int(gpu.mig_pending)}",
            f"present {int(gpu.minor not in removed)}",
        ]
        for mig in gpu.mig_instances:
            lines.append(f"gi {mig.gi_id} {mig.profile.index} {mig.start} {mig.ci_id} {mig.uuid}")
        for link in gpu.nvlinks:
            remote = f" {link.remote_pci_bus_id}" if link.remote_pci_bus_id else ""
            lines.append(f"link {link.remote_type}{remote}")
    # A fault of a GPU the node does not have changes nothing.
    for fault in faults.failing_queries or ():
        if fault.gpu in minors:
            lines.append(f"fail {fault.gpu} {fault.call} {fault.code()}")
    for event in faults.xid_events or ():
        if event.gpu in minors:
            placed = ""
            if event.gi is not None:  # NVML's "none" for an ID is 0xffffffff
                placed = f" {event.gi} {0xFFFFFFFF if event.ci is None else event.ci}"
            lines.append(f"xid {event.gpu} {event.xid}{placed}")
    return "\n".join(lines) + "\n"
