"""The node's devices of one driver's kinds: one discovery for the slice publisher and the
claim state.

``refresh`` rediscovers (the publisher calls it on every resync) and ``current`` is what
the last discovery found, which prepare plans against: both sides see one inventory with
one lifetime, the process's. The driver gives its kinds (the same table its claim state
holds, so a kind's devices may read what its claims recorded) and, where its devices
consume shared counters, how the inventory names them.
"""

from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from driver.devicekind import DeviceKind, NodeDevice

I = TypeVar("I")  # noqa: E741 - the driver's inventory, as the seam names it

CounterSets = Callable[[I], list[dict[str, Any]]]


def devices_of(
    kinds: Sequence[DeviceKind[I, Any]], inventory: I, *, node_name: str
) -> list[NodeDevice]:
    """Every kind's devices on the node, kind by kind in table order."""
    out: list[NodeDevice] = []
    for kind in kinds:
        out.extend(kind.devices(inventory, node_name=node_name))
    return out


class NodeDevices(Generic[I]):
    """The node's devices of ``kinds`` as ``discover`` last found them."""

    def __init__(
        self,
        discover: Callable[[], Awaitable[I]],
        *,
        node_name: str,
        kinds: Sequence[DeviceKind[I, Any]],
        counter_sets: CounterSets[I] | None = None,
    ) -> None:
        self._kinds = tuple(kinds)
        self._sets_of = counter_sets
        self._discover = discover
        self._node = node_name
        self._current: Mapping[str, NodeDevice] = MappingProxyType({})
        self._published: list[dict[str, Any]] = []
        self._inventory: I | None = None
        self._counter_sets: list[dict[str, Any]] = []

    @classmethod
    def of(
        cls,
        inventory: I,
        *,
        node_name: str,
        kinds: Sequence[DeviceKind[I, Any]],
        counter_sets: CounterSets[I] | None = None,
    ) -> "NodeDevices[I]":
        """Devices that are already discovered (tests, one-shot tools): no refresh needed."""

        async def same() -> I:
            return inventory

        devices = cls(same, node_name=node_name, kinds=kinds, counter_sets=counter_sets)
        devices._set(inventory, devices_of(devices._kinds, inventory, node_name=node_name))
        return devices

    def _set(self, inventory: I, devices: Sequence[NodeDevice]) -> None:
        self._inventory = inventory
        self._counter_sets = self._sets_of(inventory) if self._sets_of is not None else []
        self._current = MappingProxyType({d.name: d for d in devices})
        self._published = [dict(d.published) for d in devices]

    @property
    def current(self) -> Mapping[str, NodeDevice]:
        return self._current

    @property
    def inventory(self) -> I | None:
        """What the last discovery found; None before the first."""
        return self._inventory

    async def refresh(self) -> Sequence[NodeDevice]:
        """Rediscover; raises what discovery raises and then keeps the last result."""
        inventory = await self._discover()
        devices = devices_of(self._kinds, inventory, node_name=self._node)
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
