"""The NVML backend flags that ``discover`` and ``controller`` share.

The parsed values go straight to :func:`driver.nvml.backend`.
"""

import argparse
from pathlib import Path


def add_nvml_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nvml``, ``--profile``, ``--sim-state``, ``--sysfs-root``, ``--container-driver-root``."""
    parser.add_argument(
        "--nvml",
        choices=("system", "simulated"),
        default="system",
        help="NVML to use: the node's driver library (default) or simulated hardware",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="simulated hardware profile, by name (e.g. p5.48xlarge) or path to a profile "
        "YAML file; required with --nvml simulated (gpu-dra discover --list-profiles "
        "lists the names)",
    )
    parser.add_argument(
        "--sim-state",
        type=Path,
        metavar="FILE",
        default=None,
        help="simulated NVML fault file (YAML), re-read at every NVML init "
        "(default: $GPU_DRA_SIM_STATE)",
    )
    parser.add_argument(
        "--sysfs-root",
        type=Path,
        metavar="DIR",
        default=Path("/"),
        help="directory holding sys/ for PCIe root and NUMA lookups (default: /; "
        "simulated hardware brings its own)",
    )
    parser.add_argument(
        "--container-driver-root",
        type=Path,
        metavar="DIR",
        default=Path("/"),
        help="where the NVIDIA driver root is (mounted) here; libnvidia-ml.so.1 is looked "
        "for in its library directories, then on the default library path (default: /)",
    )
