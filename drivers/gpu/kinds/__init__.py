"""Device kinds: the one table of them, and the node's devices of every kind.

A new kind is one module implementing :class:`~drivers.gpu.kinds.base.GpuDeviceKind` (the
seam of ``driver.devicekind`` over the GPU inventory, and its devices' health) and one entry
in :data:`KINDS`; nothing else names a kind but the readers of release 0.1.0's
records (``kubeletplugin/recovery.py``, ``kubeletplugin/cdi.py``), which know that release had
only the full GPU.
"""

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from driver.devicekind import DeviceKind, NodeDevice
from drivers.gpu.kinds import capacity, dynmig, gpu, mig
from drivers.gpu.kinds.base import GpuDeviceKind, GpuKindContext, GpuNode, HealthTarget
from drivers.gpu.model.inventory import Inventory

__all__ = [
    "KINDS",
    "GpuDeviceKind",
    "GpuKindContext",
    "GpuNode",
    "HealthTarget",
    "NodeDevices",
    "by_name",
    "counter_sets",
    "gpu_uuid",
    "node_devices",
]

KINDS: tuple[GpuDeviceKind, ...] = (gpu.KIND, mig.KIND, dynmig.KIND)

# Another driver's kinds whose devices the GPU inventory is handed to (they may ignore it).
InventoryKind = DeviceKind[Inventory, Any]

_index: tuple[tuple[GpuDeviceKind, ...], Mapping[str, GpuDeviceKind]] = ((), {})


def by_name() -> Mapping[str, GpuDeviceKind]:
    """The table by kind name; rebuilt only when the table is replaced (a test's kind)."""
    global _index
    if _index[0] is not KINDS:
        _index = (KINDS, MappingProxyType({kind.name: kind for kind in KINDS}))
    return _index[1]


def node_devices(
    inventory: Inventory,
    *,
    node_name: str,
    consumable_capacity: bool = False,
    kinds: Sequence[InventoryKind] | None = None,
) -> list[NodeDevice]:
    """Every kind's devices on the node, kind by kind in table order (``kinds``: another
    driver's table instead of this one); with ``consumable_capacity``, published for
    sharing (:mod:`drivers.gpu.kinds.capacity`)."""
    out: list[NodeDevice] = []
    for kind in KINDS if kinds is None else kinds:
        devices = kind.devices(inventory, node_name=node_name)
        if consumable_capacity and kind is gpu.KIND:  # a MIG device is a partition already
            devices = [
                dataclasses.replace(d, published=capacity.shareable(d.published)) for d in devices
            ]
        out.extend(devices)
    return out


def gpu_uuid(identity: Mapping[str, str]) -> str:
    """The physical GPU of a device by its recorded identity: a whole GPU's UUID, or the
    parent of a MIG device (static or dynamic); "" for a device of no GPU."""
    return (
        identity.get(gpu.UUID_KEY)
        or identity.get(mig.PARENT_KEY)
        or identity.get(dynmig.PARENT_KEY, "")
    )


def counter_sets(inventory: Inventory) -> list[dict[str, Any]]:
    """The node's shared counter sets (``ResourceSliceSpec.sharedCounters``) that its
    devices consume: dynamic MIG's, one per GPU it publishes."""
    return dynmig.counter_sets(inventory)


class NodeDevices:
    """The node's devices, one discovery for the slice publisher and the claim state.

    ``refresh`` rediscovers (the publisher calls it on every resync) and ``current``
    is what the last discovery found, which prepare plans against: both sides see
    one inventory with one lifetime, the process's.
    """

    def __init__(
        self,
        discover: Callable[[], Awaitable[Inventory]],
        *,
        node_name: str,
        consumable_capacity: bool = False,
        kinds: Sequence[InventoryKind] | None = None,
    ) -> None:
        # None: the GPU table (and its counter sets); another driver's kinds share the one
        # inventory and publish no counters.
        self._kinds = kinds
        self._discover = discover
        self._node = node_name
        self._consumable = consumable_capacity
        self._current: Mapping[str, NodeDevice] = MappingProxyType({})
        self._published: list[dict[str, Any]] = []
        self._inventory: Inventory | None = None
        self._counter_sets: list[dict[str, Any]] = []

    @classmethod
    def of(
        cls, inventory: Inventory, *, node_name: str, consumable_capacity: bool = False
    ) -> "NodeDevices":
        """Devices that are already discovered (tests, one-shot tools): no refresh needed."""

        async def same() -> Inventory:
            return inventory

        devices = cls(same, node_name=node_name, consumable_capacity=consumable_capacity)
        devices._set(
            inventory,
            node_devices(inventory, node_name=node_name, consumable_capacity=consumable_capacity),
        )
        return devices

    def _set(self, inventory: Inventory, devices: Sequence[NodeDevice]) -> None:
        self._inventory = inventory
        self._counter_sets = counter_sets(inventory) if self._kinds is None else []
        self._current = MappingProxyType({d.name: d for d in devices})
        self._published = [dict(d.published) for d in devices]

    @property
    def current(self) -> Mapping[str, NodeDevice]:
        return self._current

    @property
    def inventory(self) -> Inventory | None:
        """What the last discovery found; None before the first."""
        return self._inventory

    async def refresh(self) -> Sequence[NodeDevice]:
        """Rediscover; raises what discovery raises and then keeps the last result."""
        inventory = await self._discover()
        devices = node_devices(
            inventory,
            node_name=self._node,
            consumable_capacity=self._consumable,
            kinds=self._kinds,
        )
        self._set(inventory, devices)
        return devices

    async def published(self) -> list[dict[str, Any]]:
        """The publisher's source of desired devices: rediscover, then what to publish."""
        await self.refresh()
        return list(self._published)

    def discovered(self) -> list[dict[str, Any]]:
        """What :meth:`published` last returned (or :meth:`refresh` last found), without
        discovering again: for a first publish right after a discovery."""
        return list(self._published)

    def counter_sets(self) -> list[dict[str, Any]]:
        """The counter sets of what :meth:`published` last returned (none without
        partitionable devices)."""
        return list(self._counter_sets)
