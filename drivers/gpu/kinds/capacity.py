"""Consumable capacity (KEP-5075): a device several claims share, each taking part of it.

Pure. With the plugin's ``--consumable-capacity`` switch, every published device that has
a capacity gets ``allowMultipleAllocations: true`` and a ``requestPolicy`` on each of its
capacities, so the scheduler can hand one GPU to several claims as long as the memory
they request (``exactly.capacity.requests.memory``) fits.

The policy of a memory capacity: ``validRange {min: 1Gi, step: 1Gi, max: <the capacity
rounded down to whole GiB>}``, ``default`` = that max. A request is rounded up to whole
GiB (``20.5Gi`` takes 21Gi); more than the max never fits. The default is the whole GPU
on purpose: a claim that asks for no memory (every claim written before sharing) keeps
getting a GPU of its own, as without the switch, instead of silently sharing one with
no limit enforced. So two claims of ``20Gi`` fit on one 80 GB GPU (with room for two
more), and a plain claim fits only on a GPU no share uses. A prepare checks each share
against the published policy (``kubeletplugin.claims.share_problem``, any driver's).
"""

from collections.abc import Mapping
from typing import Any

from driver.common.quantity import Quantity
from drivers.gpu.model.published import GIB
from drivers.gpu.model.published import MEMORY_MIN as MIN
from drivers.gpu.model.published import MEMORY_STEP as STEP


def request_policy(value: int) -> dict[str, Any] | None:
    """The policy of one capacity of ``value`` bytes; None when it cannot hold two steps
    (the API server refuses a range whose min + step exceeds the capacity)."""
    top = value // STEP * STEP
    if top < MIN + STEP:
        return None
    return {
        "default": _gib(top),
        "validRange": {"min": _gib(MIN), "max": _gib(top), "step": _gib(STEP)},
    }


def _gib(value: int) -> str:
    # The canonical form the API server writes back, so a read-back compares equal.
    return f"{value // GIB}Gi"


def shareable(device: Mapping[str, Any]) -> dict[str, Any]:
    """``device`` (v1 JSON) published for consumable capacity; unchanged when any of its
    capacities has no policy that fits (it then stays a device of one claim)."""
    capacity: Mapping[str, Any] = device.get("capacity") or {}
    if not capacity:
        return dict(device)
    shared: dict[str, Any] = {}
    for name, entry in capacity.items():
        value = Quantity.parse(str(entry["value"]))
        policy = request_policy(int(value.value)) if value.value.denominator == 1 else None
        if policy is None:
            return dict(device)
        shared[name] = {**entry, "requestPolicy": policy}
    return {**device, "allowMultipleAllocations": True, "capacity": shared}
