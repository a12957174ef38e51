"""The sysfs tree of a simulated node, laid out as Linux lays out the real one.

Discovery reads two things NVML does not give: the PCIe root complex (from the
``/sys/bus/pci/devices/<bdf>`` symlink into ``/sys/devices/pci<dom>:<bus>/...``)
and the NUMA node (``numa_node`` in the device's directory). The tree is
written under a root directory; pass that directory to discovery as
``sysfs_root`` (the host's is ``/``).
"""

import os
from collections.abc import Iterable
from pathlib import Path

from driver.nvml.profile import SimGpu


def device_dir(root: Path, gpu: SimGpu) -> Path:
    """``<root>/sys/devices/pci<dom>:<bus>/<root port>/<bdf>`` of one GPU."""
    domain, root_bus = gpu.pcie_root.removeprefix("pci").split(":")
    # One root port per GPU, so that GPUs under one root complex are siblings.
    port = f"{domain}:{root_bus}:{gpu.position % 32:02x}.{gpu.position // 32 % 8:x}"
    return root / "sys" / "devices" / gpu.pcie_root / port / gpu.pci_bus_id


def write_sysfs(root: Path, gpus: Iterable[SimGpu]) -> None:
    """Create (or refresh) the PCI device directories and bus symlinks of ``gpus``.

    Another process may be reading the tree (a second plugin instance of one simulated
    node, which shares its root): what is already right is left alone, and what changes
    is replaced by a rename, so a reader never sees a file or link half written or gone."""
    bus_dir = root / "sys" / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        target = device_dir(root, gpu)
        target.mkdir(parents=True, exist_ok=True)
        write_if_changed(target / "numa_node", f"{gpu.numa_node}\n")
        write_if_changed(target / "vendor", "0x10de\n")
        write_if_changed(target / "class", "0x030200\n")
        link = bus_dir / gpu.pci_bus_id
        # Relative, like the kernel's: ../../../devices/pci0000:44/.../0000:53:00.0
        relative = os.path.relpath(target, bus_dir)
        if link.is_symlink() and str(link.readlink()) == relative:
            continue
        tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(relative)
        tmp.replace(link)


def write_if_changed(path: Path, text: str) -> None:
    """``text`` into ``path`` by a rename, unless it holds that already."""
    try:
        if path.read_text() == text:
            return
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
