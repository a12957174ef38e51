"""The node and the NVML backend that ``discover`` and ``controller``'s parsed flags name
(the flags themselves are in :mod:`cli.flagtable`)."""

import argparse
import contextlib
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from driver.nvml import Nvml, SysfsRoot

FLAG_NAMES = ("--nvml", "--profile", "--sim-state", "--sysfs-root", "--container-driver-root")


def node_name(args: argparse.Namespace, *, per_profile: bool = False) -> str:
    """``--node-name``, else $NODE_NAME, else the host name lowercased, as the kubelet names it.

    ``per_profile``: simulated hardware is no host's, so its node is ``sim-<profile>``; two
    profiles' slice files then name two pools, not one pool twice.
    """
    given = args.node_name or os.environ.get("NODE_NAME")
    if given:
        return str(given)
    if per_profile and args.nvml == "simulated" and args.profile:
        stem = Path(args.profile).name.removesuffix(".yaml").removesuffix(".yml").lower()
        return "sim-" + (re.sub(r"[^a-z0-9.-]+", "-", stem).strip(".-") or "node")
    return socket.gethostname().lower()


@contextlib.contextmanager
def open_backend(args: argparse.Namespace, node: str) -> Iterator[tuple["Nvml", "SysfsRoot"]]:
    """The NVML backend and sysfs root the parsed flags name, for as long as the block runs."""
    from driver import nvml

    with nvml.backend(
        args.nvml,
        profile=args.profile,
        node_name=node,
        state_file=Path(args.sim_state) if args.sim_state else None,
        sysfs_root=Path(args.sysfs_root),
        driver_root=Path(args.container_driver_root),
    ) as opened:
        yield opened
