"""What nodes with the same devices and the same allocation state have in common.

Most nodes of an instance type publish the same devices but for the node's own name (the
pool's, the slices') and values unique to each device: UUIDs, an NVLink domain named after
the node. A claim's selectors mostly read neither. A node's shape is everything allocating
the claim there reads, with those left out, so the search runs once per shape:

- its pools, when each is the node's own (named after the node, node-local slices,
  complete and valid: a reason about another pool, or about an incomplete one, names it):
  driver, generation, slice count, counters;
- per device, in order: the device JSON with only the attributes the claim's selectors read
  (every attribute when the reads of one selector cannot be bounded:
  :func:`driver.tools.cel.selector_reads`), its capacities where the claim can read or
  consume them, the values of the claim's constraint attributes numbered by their first
  appearance on the node (the search compares them only for equality);
- which devices other claims hold whole, and what their shares of a device add up to.

Two nodes of one search shape get the same devices, by position, in the same steps, with
the same shares. Why a node cannot take the claim says more: the claims holding its devices
and the constraint values themselves. That is the exact shape, which the reasons are
reused by.
"""

import marshal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.common.quantity import Quantity
from driver.tools.allocation.capacity import Use
from driver.tools.allocation.claims import ParsedClaim
from driver.tools.allocation.pools import DeviceKey, Pool
from driver.tools.cel import Read, selector_reads


@dataclass(frozen=True, slots=True)
class Shape:
    # marshal's bytes: written in C, several times faster than repr, and equal bytes read
    # back as equal values. Two equal shapes may still differ in bytes, by marshal's
    # references to an object met earlier in the same dump: that costs a search, never a
    # wrong answer.
    search: bytes
    exact: bytes


class Shapes:
    """The shape of any node for one claim, next to the same other claims."""

    def __init__(
        self,
        claim: ParsedClaim,
        in_use: Mapping[DeviceKey, str],
        shared: Mapping[DeviceKey, Use],
    ) -> None:
        requests = [r for g in claim.groups for r in g.alternatives]
        reads: set[Read] | None = set()
        for request in requests:
            for ref in request.selectors:
                found = selector_reads(ref.expression)
                if found is None or reads is None:
                    reads = None
                else:
                    reads |= found
        self._reads = None if reads is None else sorted(reads)
        self._attributes: dict[str, tuple[str, ...] | None] = {}
        self._constraints = sorted({c.attribute for c in claim.constraints})
        self._capacity = (
            self._reads is None
            or any(field == "capacity" for field, _, _ in self._reads)
            or any(r.capacity for r in requests)
        )
        self._held: dict[tuple[str, str], dict[str, str]] = {}
        for (driver, pool, device), holder in in_use.items():
            self._held.setdefault((driver, pool), {})[device] = holder
        self._shares: dict[tuple[str, str], dict[str, Use]] = {}
        for (driver, pool, device), use in shared.items():
            self._shares.setdefault((driver, pool), {})[device] = use

    def _kept(self, driver: str) -> tuple[str, ...] | None:
        """The attribute keys of a device of ``driver`` that the selectors can read, as a
        device spells them (bare in the driver's domain, or qualified); None for all."""
        if self._reads is None:
            return None
        kept = self._attributes.get(driver)
        if kept is None:
            names: list[str] = []
            for field, domain, name in self._reads:
                if field == "attributes":
                    if domain == driver:
                        names.append(name)
                    names.append(f"{domain}/{name}")
            kept = self._attributes[driver] = tuple(names)
        return kept

    def of(self, node: str | None, pools: Sequence[Pool]) -> Shape | None:
        """The node's shape; None when it has a part no other node can share."""
        if node is None:
            return None
        search: list[Any] = []
        exact: list[Any] = []
        try:
            for pool in pools:
                if pool.name != node or not pool.usable:
                    return None
                if any(s.node_name != node or s.per_device for s in pool.slices):
                    return None
                part = self._pool(pool)
                if part is None:
                    return None
                search.append(part[0])
                exact.append(part[1])
            key = marshal.dumps(search)
            return Shape(key, key + marshal.dumps(exact))
        except TypeError:
            return None  # an unhashable constraint value: judged on its own
        except ValueError:
            return None  # a value marshal cannot write (a YAML timestamp): judged on its own

    def _pool(self, pool: Pool) -> tuple[Any, Any] | None:
        held = self._held.get((pool.driver, pool.name)) or {}
        shares = self._shares.get((pool.driver, pool.name)) or {}
        kept = self._kept(pool.driver)
        capacity = self._capacity or bool(shares)
        constraints = self._constraints
        numbers: dict[str, dict[Any, int]] = {a: {} for a in constraints}
        rows: list[Any] = []
        numbered: list[int | None] = []
        values: list[Any] = []
        for s in pool.slices:
            for device in s.devices:
                data = device.data
                attributes = data.get("attributes")
                if kept is not None:
                    if type(attributes) is not dict:  # decoded JSON or YAML; else judged alone
                        return None
                    attributes = {k: attributes[k] for k in kept if k in attributes}
                row = {**data, "attributes": attributes}
                if not capacity and not data.get("allowMultipleAllocations"):
                    row.pop("capacity", None)
                rows.append(row)
                for attribute in constraints:
                    value = device.attribute(attribute)
                    values.append(value)
                    if value is None:
                        numbered.append(None)
                    else:
                        seen = numbers[attribute]
                        numbered.append(seen.setdefault(value, len(seen)))
        search = (
            pool.driver,
            pool.generation,
            pool.expected_slices,
            len(pool.slices),
            sorted((k, _exact(v)) for k, v in pool.counters.items()),
            rows,
            numbered,
            sorted(held),
            sorted(
                (name, sorted((k, _exact(v)) for k, v in use.amounts.items()))
                for name, use in shares.items()
            ),
        )
        exact = (values, sorted(held.items()), sorted((n, u.holders) for n, u in shares.items()))
        return search, exact


def _exact(q: Quantity) -> tuple[int, int]:
    return q.value.numerator, q.value.denominator
