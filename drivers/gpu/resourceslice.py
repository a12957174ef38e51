"""The GPU driver's ResourceSlices: its kinds' devices on the node, laid out by the
driver-neutral model (``driver.slices.model``), as the publisher and ``gpu-dra discover``
build them.

The devices come from the device kinds (``drivers.gpu.kinds``: one per GPU, named
``gpu-<minor>``, for the full GPU; MIG devices; dynamic MIG's partitions and counter sets).
"""

from typing import Any

from driver.slices.model import build_slices
from drivers.gpu.kinds import GpuNode, counter_sets, gpu_kinds
from drivers.gpu.model.inventory import Inventory
from kubeletplugin.devices import devices_of


def build_devices(
    inventory: Inventory, *, node_name: str, consumable_capacity: bool = False
) -> list[dict[str, Any]]:
    """Every device kind's devices on the node, each kind building its own."""
    kinds = gpu_kinds(GpuNode(consumable_capacity=consumable_capacity))
    return [
        dict(d.published) for d in devices_of(tuple(kinds.values()), inventory, node_name=node_name)
    ]


def build_resource_slices(
    inventory: Inventory,
    *,
    driver_name: str,
    node_name: str,
    generation: int = 1,
    consumable_capacity: bool = False,
    counters_apart: bool = True,
) -> list[dict[str, Any]]:
    """The node's complete pool: ``resource.k8s.io/v1`` ResourceSlice objects."""
    devices = build_devices(inventory, node_name=node_name, consumable_capacity=consumable_capacity)
    return build_slices(
        devices,
        driver_name=driver_name,
        node_name=node_name,
        generation=generation,
        counter_sets=counter_sets(inventory),
        counters_apart=counters_apart,
    )
