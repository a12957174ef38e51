"""The ResourceSlice model: pure functions from the node's devices to the node's pool.

The devices come from the device kinds (``driver.devicekinds``: one per GPU, named
``gpu-<minor>``, for the full GPU), in ``resource.k8s.io/v1`` JSON form (camelCase,
attribute values as ``{"string": ...}``, ``{"int": ...}``, ``{"version": ...}``).
The pool is named after the node. Pools larger than one
slice holds are split deterministically; the generation is the caller's (the
controller's) business, passed through.
"""

import hashlib
from collections.abc import Sequence
from typing import Any

from driver.devicekinds import node_devices
from driver.inventory import Inventory
from driver.limits import max_devices

API_VERSION = "resource.k8s.io/v1"


def build_devices(inventory: Inventory, *, node_name: str) -> list[dict[str, Any]]:
    """Every device kind's devices on the node, each kind building its own."""
    return [dict(d.published) for d in node_devices(inventory, node_name=node_name)]


def split_devices(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive chunks of at most :func:`~driver.limits.max_devices`; one empty for none."""
    limit = max_devices(devices)
    chunks = [list(devices[i : i + limit]) for i in range(0, len(devices), limit)]
    return chunks or [[]]


def slice_name(node_name: str, driver_name: str, index: int) -> str:
    """``<node>-<driver>-<index>``, hashed down to stay a DNS subdomain of <= 253 characters."""
    name = f"{node_name}-{driver_name}-{index}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver_name}".encode()).hexdigest()[:16]
    return f"slice-{digest}-{index}"


def build_resource_slices(
    inventory: Inventory, *, driver_name: str, node_name: str, generation: int = 1
) -> list[dict[str, Any]]:
    """The node's complete pool: ``resource.k8s.io/v1`` ResourceSlice objects."""
    devices = build_devices(inventory, node_name=node_name)
    return build_slices(
        devices, driver_name=driver_name, node_name=node_name, generation=generation
    )


def build_slices(
    devices: Sequence[dict[str, Any]], *, driver_name: str, node_name: str, generation: int = 1
) -> list[dict[str, Any]]:
    """The pool of ``devices`` (in publishing order), split into as many slices as it needs."""
    chunks = split_devices(devices)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, driver_name, i)},
            "spec": {
                "driver": driver_name,
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]
