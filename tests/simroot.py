"""Fake driver roots for ``--nvml system`` runs: a simulated node's root, as a GPU node's is.

Each run of the real path is its own process, because the loader keeps one
``libnvidia-ml.so.1`` per process and this test process has the simulated one loaded.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from driver.nvml.library import SONAME
from driver.nvml.sim.build import library
from driver.nvml.simulated import HARDWARE_ENV, HARDWARE_FILE, SimulatedNode

NODE = "sim-node"


def host_has_nvml() -> bool:
    """Whether a fresh process finds a ``libnvidia-ml.so.1`` on the default loader path."""
    code = "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def fake_root(
    root: Path, profile: str = "g6e.12xlarge", *, omit: tuple[str, ...] = ()
) -> tuple[SimulatedNode, dict[str, str]]:
    """A simulated node's driver root, and the environment that names its hardware file.

    ``omit`` swaps in a library built without those symbols, as an older driver's.
    """
    node = SimulatedNode(profile, NODE, root)
    if omit:
        real = root / "usr" / "lib64" / f"libnvidia-ml.so.{node.profile.driver_version}"
        real.unlink()
        shutil.copyfile(library(omit=omit), real)
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_DRA_SIM_STATE", "NODE_NAME")}
    env.pop("LD_LIBRARY_PATH", None)
    env[HARDWARE_ENV] = str(node.nvml.render())
    return node, env


def gpu_dra(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def library_file(root: Path) -> Path:
    return root / "usr" / "lib64" / SONAME


# Placeholder user-space driver files: tiny ELF libraries with the real sonames (the
# toolkit's symlink and ldcache hooks read ELF), and the binaries nvidia-ctk mounts.
DRIVER_LIBRARIES = {
    "libcuda": "libcuda.so.1",
    "libcudadebugger": "libcudadebugger.so.1",
    "libnvidia-cfg": "libnvidia-cfg.so.1",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
    "libnvidia-opencl": "libnvidia-opencl.so.1",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
}
DRIVER_BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")


def ctk_binary() -> Path | None:
    """The nvidia-ctk that ``python -m tests.e2e.build nvidia-ctk`` built, if it did."""
    from tests.e2e import build as e2e

    version = e2e.VERSIONS["nvidia-container-toolkit"]["version"]
    ctk = e2e.cache_root() / f"nvidia-container-toolkit-{version}" / "nvidia-ctk"
    return ctk if ctk.is_file() else None


def install_driver_files(root: Path, version: str, ctk: Path) -> None:
    """The rest of a driver install next to the simulated NVML, and nvidia-ctk in usr/bin."""
    lib_dir, bin_dir = root / "usr" / "lib64", root / "usr" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    empty = root / "empty.c"
    empty.write_text("int placeholder;\n")
    for name, soname in DRIVER_LIBRARIES.items():
        out = lib_dir / f"{name}.so.{version}"
        subprocess.run(
            ["cc", "-shared", f"-Wl,-soname,{soname}", "-o", str(out), str(empty)], check=True
        )
    empty.unlink()
    for name in DRIVER_BINARIES:
        binary = bin_dir / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
    firmware = root / "lib" / "firmware" / "nvidia" / version
    firmware.mkdir(parents=True, exist_ok=True)
    (firmware / "gsp_ga10x.bin").write_bytes(b"")
    # The simulated hardware reaches containers as a real node's reaches them through the
    # kernel: nvidia-ctk mounts every "*.so.<driver version>" of the library directory,
    # symlinks resolved, so this one puts the hardware file at the container's
    # /run/gpu-dra-sim/nvml-hardware, where the mounted library looks (sim/nvml.c).
    hardware = lib_dir / f"libgpu-dra-sim-hardware.so.{version}"
    hardware.symlink_to(os.path.relpath(root / HARDWARE_FILE, lib_dir))
    try:
        os.link(ctk, bin_dir / "nvidia-ctk")
    except OSError:
        shutil.copy2(ctk, bin_dir / "nvidia-ctk")
