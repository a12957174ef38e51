"""One node process, more than one driver: what the GPU driver's process gives another
driver it also serves (the ComputeDomain driver), so that both stand on one NVML load, one
discovery and one API client, each with its own sockets, claim state and slices.

The host hands a guest plain data of what it discovered (:class:`NodeFacts`), never its
inventory type. The command line composes them (``cli/plugin.py``): the two drivers never
import each other.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from driver.kube.session import Session
from kubeletplugin.state import HostEdits


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the host's last discovery found of the node that a guest needs."""

    driver_version: str  # the NVIDIA driver's, as NVML reports it ("580.95.05")
    clique_id: str  # the NVLink clique "<cluster UUID>.<clique ID>"; "": none


@dataclass(frozen=True, slots=True)
class Host:
    api_client: Session
    # The host's last discovery (None before the first; raises a DriverError when the node
    # cannot be described, GPUs that disagree on their clique), and a new one.
    facts: Callable[[], NodeFacts | None]
    rediscover: Callable[[], Awaitable[None]]
    proc_root: Path  # where the driver's proc/ lies: "/" on a node, a simulated node's root
    # The host's metrics registry, served on its port: a guest forwards its families into it.
    registry: CollectorRegistry | None = None
    # The host's driver install, for the specs of a guest's toolkit kinds; None: none.
    host_edits: HostEdits | None = None


class Guest(Protocol):
    """A second driver in the host's process. ``start`` serves it (an error: it refuses, in
    one line, the host serves on without it and retries the start as it retries its own
    setup); ``stop`` ends it, also after a failed or cancelled start."""

    name: str

    async def start(self, host: Host) -> None: ...

    async def stop(self) -> None: ...
