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
from driver.nvml.simulated import HARDWARE_ENV, SimulatedNode

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
        [sys.executable, "-m", "kubeletplugin.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def library_file(root: Path) -> Path:
    return root / "usr" / "lib64" / SONAME
