"""The NVML backend flags that ``discover`` and ``controller`` share, and the one way to
open the backend they name (:func:`driver.nvml.backend`).
"""

import argparse
import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from driver.nvml import Nvml, SysfsRoot


def node_name(args: argparse.Namespace) -> str:
    """``--node-name``, else $NODE_NAME, else the host name lowercased, as the kubelet names it."""
    return str(args.node_name or os.environ.get("NODE_NAME") or socket.gethostname().lower())


@contextlib.contextmanager
def open_backend(args: argparse.Namespace, node: str) -> Iterator[tuple["Nvml", "SysfsRoot"]]:
    """The NVML backend and sysfs root the parsed flags name, for as long as the block runs."""
    from driver import nvml

    with nvml.backend(
        args.nvml,
        profile=args.profile,
        node_name=node,
        state_file=args.sim_state,
        sysfs_root=args.sysfs_root,
        driver_root=args.container_driver_root,
    ) as opened:
        yield opened


CONSUMABLE_CAPACITY_HELP = (
    "publish every GPU for consumable capacity (allowMultipleAllocations, a request policy "
    "on its memory): several claims then share one GPU, each taking the memory it requests "
    "(Kubernetes 1.36, or 1.34/1.35 with the DRAConsumableCapacity gate on)"
)


def add_consumable_capacity(parser: argparse.ArgumentParser) -> None:
    """``--consumable-capacity``, shared by ``discover`` and ``controller``."""
    parser.add_argument("--consumable-capacity", action="store_true", help=CONSUMABLE_CAPACITY_HELP)


DYNAMIC_MIG_HELP = (
    "publish each GPU in MIG mode as partitionable devices (shared counters and one device "
    "per profile and placement) and create the MIG device a claim gets at prepare "
    "(Kubernetes 1.36, or 1.34/1.35 with the DRAPartitionableDevices gate on)"
)


def add_dynamic_mig(parser: argparse.ArgumentParser) -> None:
    """``--dynamic-mig`` of ``discover`` (``kubelet-plugin`` has its own, env-defaulted)."""
    parser.add_argument("--dynamic-mig", action="store_true", help=DYNAMIC_MIG_HELP)


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
