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
more), and a plain claim fits only on a GPU no share uses.
"""

from collections.abc import Mapping
from typing import Any

from driver.common.quantity import Quantity
from driver.gpu.published import GIB
from driver.gpu.published import MEMORY_MIN as MIN
from driver.gpu.published import MEMORY_STEP as STEP


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


def share_problem(published: Mapping[str, Any], consumed: Mapping[str, str]) -> str | None:
    """Why a share with ``consumed`` (its allocation result's ``consumedCapacity``) is not
    one this device, as published, hands out; None when it is. The scheduler only writes
    shares that fit; this catches an allocation written by hand, or by a scheduler that
    saw another policy than this plugin publishes."""
    if not published.get("allowMultipleAllocations"):
        return (
            'field "shareID": the device is not published for sharing '
            "(the plugin runs without --consumable-capacity)"
        )
    capacity: Mapping[str, Any] = published.get("capacity") or {}
    for name, text in consumed.items():
        field = f'field "consumedCapacity.{name}"'
        if name not in capacity:
            return f"{field}: the device has no capacity {name}"
        try:
            amount = Quantity.parse(text).value
        except ValueError as exc:
            return f"{field}: {exc}"
        policy = capacity[name].get("requestPolicy") or {}
        valid_range = policy.get("validRange")
        if valid_range is not None:
            low = Quantity.parse(str(valid_range["min"])).value
            high = valid_range.get("max")
            step = valid_range.get("step")
            if amount < low or (high is not None and amount > Quantity.parse(str(high)).value):
                return f"{field}: {text} is outside the device's valid range"
            if step is not None and (amount - low) % Quantity.parse(str(step)).value:
                low_text = valid_range["min"]
                return f"{field}: {text} is not on the device's step of {step} from {low_text}"
        values = policy.get("validValues")
        if values and amount not in {Quantity.parse(str(v)).value for v in values}:
            return f"{field}: {text} is not one of the device's valid values"
    return None
