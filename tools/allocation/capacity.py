"""Consumable capacity (KEP-5075) as the scheduler's allocator computes it (pure).

Follows k8s.io/dynamic-resource-allocation structured/internal/incubating
consumable_capacity.go: a request's amount is rounded to the capacity's
``requestPolicy`` (``validRange``: up to ``min``, then up to ``min + n*step``;
``validValues``: up to the next valid value), a capacity the request does not name
consumes the policy's ``default`` (the whole value without a policy), a rounded amount
that breaks the policy (over ``max``, past the last valid value) never fits, and the
amounts of every share of a device (other claims' ``consumedCapacity`` and this claim's
earlier results) must stay within its value. Every device is checked this way, shared
or not: on a device of one claim a request is just a floor on its capacity.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from driver.common.quantity import Format, Quantity


class CapacityProblem(ValueError):
    """A quantity that does not parse, in a claim or a device."""


@dataclass(frozen=True, slots=True)
class Policy:
    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    minimum: Quantity | None = None  # validRange is set exactly when minimum is
    maximum: Quantity | None = None
    step: Quantity | None = None


@dataclass(frozen=True, slots=True)
class DeviceCapacity:
    value: Quantity
    policy: Policy | None = None


# Quantities are immutable and a cluster repeats the same few amounts on every device of a
# profile: parsed once per process, as the CEL device's are.
parse_quantity = lru_cache(maxsize=8192)(Quantity.parse)


def quantity(raw: Any, where: str) -> Quantity:
    try:
        return parse_quantity(str(raw))
    except ValueError as exc:
        raise CapacityProblem(f"{where}: {exc}") from exc


def _policy(raw: Mapping[str, Any], where: str) -> Policy:
    valid_range = raw.get("validRange") or {}
    default = raw.get("default")
    return Policy(
        default=None if default is None else quantity(default, f"{where}.default"),
        valid_values=tuple(
            quantity(v, f"{where}.validValues") for v in raw.get("validValues") or ()
        ),
        minimum=_optional(valid_range.get("min"), f"{where}.validRange.min"),
        maximum=_optional(valid_range.get("max"), f"{where}.validRange.max"),
        step=_optional(valid_range.get("step"), f"{where}.validRange.step"),
    )


def _optional(raw: Any, where: str) -> Quantity | None:
    return None if raw is None else quantity(raw, where)


def device_capacities(device: Mapping[str, Any]) -> dict[str, DeviceCapacity]:
    """A v1 Device's capacities; raises CapacityProblem for a malformed quantity."""
    out: dict[str, DeviceCapacity] = {}
    for name, raw in (device.get("capacity") or {}).items():
        where = f"device {device.get('name')} capacity {name}"
        policy = raw.get("requestPolicy")
        out[str(name)] = DeviceCapacity(
            quantity(raw.get("value"), f"{where}.value"),
            None if policy is None else _policy(policy, f"{where}.requestPolicy"),
        )
    return out


def _whole(q: Quantity) -> int:
    # Upstream's Value(): rounded up to an integer.
    return -((-q.value.numerator) // q.value.denominator)


def consumed_amount(requested: Quantity | None, capacity: DeviceCapacity) -> Quantity:
    """What one share takes of ``capacity`` for ``requested`` (None: not requested)."""
    policy = capacity.policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.minimum is not None:
        if requested < policy.minimum:
            return policy.minimum
        if policy.step is None:
            return requested
        low, step = _whole(policy.minimum), _whole(policy.step)
        steps = -((low - _whole(requested)) // step)
        return Quantity(Fraction(low + step * steps), Format.BINARY_SI)
    for valid in policy.valid_values:
        if not valid < requested:
            return valid
    return requested


def violates(amount: Quantity, policy: Policy | None) -> bool:
    if policy is None or (policy.default is not None and amount == policy.default):
        return False
    if policy.minimum is not None:
        if policy.maximum is not None and policy.maximum < amount:
            return True
        if policy.step is not None:
            return (_whole(amount) - _whole(policy.minimum)) % _whole(policy.step) != 0
        return False
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


@dataclass(slots=True)
class Use:
    """What the shares of one device already hold, and which claims hold them."""

    amounts: dict[str, Quantity] = field(default_factory=dict)
    holders: list[str] = field(default_factory=list)

    def add(self, amounts: Mapping[str, Quantity]) -> None:
        for name, amount in amounts.items():
            held = self.amounts.get(name)
            self.amounts[name] = amount if held is None else held + amount

    def subtract(self, amounts: Mapping[str, Quantity]) -> None:
        for name, amount in amounts.items():
            self.amounts[name] = self.amounts[name] - amount


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a request does not fit a device's capacity."""

    capacity: str
    needed: Quantity | None  # None: the device has no such capacity
    free: Quantity | None = None
    over_policy: bool = False


def consumption(
    requests: Mapping[str, Quantity], capacities: Mapping[str, DeviceCapacity]
) -> dict[str, Quantity]:
    """Per capacity of the device, what one share for ``requests`` takes."""
    return {name: consumed_amount(requests.get(name), c) for name, c in capacities.items()}


def shortfall(
    requests: Mapping[str, Quantity],
    capacities: Mapping[str, DeviceCapacity],
    held: Sequence[Mapping[str, Quantity]],
) -> Shortfall | None:
    """None when a share for ``requests`` fits next to the amounts ``held``
    (upstream ``CmpRequestOverCapacity``)."""
    for name in requests:
        if name not in capacities:
            return Shortfall(name, None)
    for name, capacity in capacities.items():
        amount = consumed_amount(requests.get(name), capacity)
        if violates(amount, capacity.policy):
            return Shortfall(name, amount, over_policy=True)
        total = amount
        for amounts in held:
            if name in amounts:
                total = total + amounts[name]
        if capacity.value < total:
            free = capacity.value - (total - amount)
            return Shortfall(name, amount, free)
    return None


def format_quantity(q: Quantity) -> str:
    """Bytes-like quantities in the largest binary unit that keeps them whole."""
    value = q.value
    if value.denominator == 1 and value > 0:
        for unit, suffix in ((1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")):
            if value % unit == 0:
                return f"{value // unit}{suffix}"
        if value >= 1 << 30:
            return f"{float(value) / (1 << 30):.1f}Gi"
    return str(q)
