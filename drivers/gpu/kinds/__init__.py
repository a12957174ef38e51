"""Device kinds: the one table of them, built afresh for each claim state.

A new kind is one module implementing :class:`~drivers.gpu.kinds.base.GpuDeviceKind` (the
seam of ``driver.devicekind`` over the GPU inventory, and its devices' health and physical
GPU) and one entry in :data:`KIND_TYPES`; nothing else names a kind but the readers of
release 0.1.0's records (``kubeletplugin/recovery.py``, ``kubeletplugin/cdi.py``), which know
that release had only the full GPU. :func:`gpu_kinds` makes the table: the node process
gives it to its publisher's devices (:func:`node_devices`) and its claim state (the flavor),
so both see the same kinds, and two claim states of one process share none.
"""

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from driver.devicekind import DeviceKind
from drivers.gpu.kinds import dynmig, gpu, mig
from drivers.gpu.kinds.base import (
    GpuDeviceKind,
    GpuKindContext,
    GpuNode,
    HealthTarget,
    MigMaker,
)
from drivers.gpu.model.inventory import Inventory
from kubeletplugin.devices import NodeDevices

__all__ = [
    "KIND_TYPES",
    "GpuDeviceKind",
    "GpuKindContext",
    "GpuNode",
    "HealthTarget",
    "KindTable",
    "MigMaker",
    "counter_sets",
    "discovered",
    "gpu_kinds",
    "node_devices",
]

# The one table: what makes each kind, given the node, in publishing order.
KIND_TYPES: tuple[Callable[[GpuNode], GpuDeviceKind], ...] = (
    gpu.GpuKind,
    mig.MigKind,
    dynmig.DynamicMigKind,
)

KindTable = Mapping[str, GpuDeviceKind]


def gpu_kinds(node: GpuNode | None = None) -> KindTable:
    """A new table of every kind, made for ``node`` (the defaults when None)."""
    made = [make(node or GpuNode()) for make in KIND_TYPES]
    return MappingProxyType({kind.name: kind for kind in made})


def counter_sets(inventory: Inventory) -> list[dict[str, Any]]:
    """The node's shared counter sets (``ResourceSliceSpec.sharedCounters``) that its
    devices consume: dynamic MIG's, one per GPU it publishes."""
    return dynmig.counter_sets(inventory)


def node_devices(
    discover: Callable[[], Awaitable[Inventory]],
    *,
    node_name: str,
    kinds: Mapping[str, DeviceKind[Inventory, Any]],
) -> NodeDevices[Inventory]:
    """The node's devices of ``kinds``, with the counter sets they consume."""
    return NodeDevices(
        discover, node_name=node_name, kinds=tuple(kinds.values()), counter_sets=counter_sets
    )


def discovered(
    inventory: Inventory,
    *,
    node_name: str,
    kinds: Mapping[str, DeviceKind[Inventory, Any]] | None = None,
) -> NodeDevices[Inventory]:
    """Devices already discovered (tests, one-shot tools), of ``kinds`` (a new table when
    None: for what only publishes)."""
    table: Mapping[str, DeviceKind[Inventory, Any]] = gpu_kinds() if kinds is None else kinds
    return NodeDevices.of(
        inventory, node_name=node_name, kinds=tuple(table.values()), counter_sets=counter_sets
    )
