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
  :func:`tools.cel.selector_reads`), its capacities where the claim can read or
  consume them, the values of the claim's constraint attributes numbered by their first
  appearance on the node (the search compares them only for equality);
- which devices other claims hold whole, and what their shares of a device add up to.

Two nodes of one search shape get the same devices, by position, in the same steps, with
the same shares. Why a node cannot take the claim says more: the claims holding its devices
and the constraint values themselves. That is the exact shape, which the reasons are
reused by.
"""

import marshal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import count
from operator import itemgetter
from typing import Any, cast

from driver.common.quantity import Quantity
from tools.allocation.capacity import Use
from tools.allocation.claims import ParsedClaim
from tools.allocation.pools import VALUE_KINDS, DeviceKey, Pool, attribute_value
from tools.cel import Read, selector_reads


class Key:
    """What a search reads of a node: its small parts as marshal's bytes (written in C,
    equal bytes read back as equal values of equal types), and its devices' fields but
    attributes, compared with ``==``.

    Those fields are most of a node's bytes (capacities, counters), the same on every node
    of an instance type: comparing them costs a fraction of writing them. ``==`` does not
    tell the order of a dict's keys, which no search outcome depends on, nor 1 from 1.0 or
    true: quantities, the numbers there, are strings or numbers, and the API server refuses
    a true for one. The reasons (which name the first capacity short, in the device's
    order) are reused by the exact shape, which marshal writes.
    """

    __slots__ = ("_hash", "fields", "small")

    def __init__(self, small: bytes, fields: list[Any]) -> None:
        self.small = small
        self.fields = fields
        self._hash = hash(small)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self.small == other.small and self.fields == other.fields


@dataclass(frozen=True, slots=True)
class Shape:
    # Two equal shapes may still differ in marshal's bytes, by its references to an object
    # met earlier in the same dump: that costs a search, never a wrong answer.
    search: Key
    _exact: list[Any]

    def exact(self) -> bytes | None:
        """The search shape with what the reasons say besides, or None where marshal cannot
        write a value (a YAML timestamp). Written only for a node the claim does not fit:
        most nodes' outcomes need only the search shape."""
        try:
            return self.search.small + marshal.dumps((self.search.fields, self._exact))
        except ValueError:
            return None


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
        small: list[Any] = []
        fields: list[Any] = []
        exact: list[Any] = []
        try:
            for pool in pools:
                if pool.name != node or not pool.usable:
                    return None
                if any(s.node_name != node or s.per_device for s in pool.slices):
                    return None
                part = self._pool(pool, fields)
                if part is None:
                    return None
                small.append(part[0])
                exact.append(part[1])
            return Shape(Key(marshal.dumps(small), fields), exact)
        except TypeError:
            return None  # an unhashable constraint value: judged on its own
        except ValueError:
            return None  # a value marshal cannot write (a YAML timestamp): judged on its own

    def _pool(self, pool: Pool, fields: list[Any]) -> tuple[Any, Any] | None:
        """The pool's part of the search shape and of the exact one; its devices' fields
        but attributes go to ``fields``."""
        held = self._held.get((pool.driver, pool.name)) or {}
        shares = self._shares.get((pool.driver, pool.name)) or {}
        kept = self._kept(pool.driver)
        capacity = self._capacity or bool(shares)
        constraints = self._constraints
        columns: list[Any] = []
        attributes: list[Mapping[str, Any]] = []
        for s in pool.slices:
            if not s.dicts:
                return None  # read as Mappings: judged on its own
            part = _columns(cast("list[dict[str, Any]]", s.raw), kept, capacity, fields)
            if part is None:
                return None
            columns.append(part)
            if constraints:
                attributes += [d.get("attributes") or {} for d in s.raw]
        # The search compares constraint values only for equality: numbered by where each
        # first appears on the node. The reasons say them.
        numbered: list[list[Any]] = []
        values: list[list[Any]] = []
        for attribute in constraints:
            column = _constraint_values(attributes, pool.driver, attribute)
            first: dict[Any, Any] = {None: None}
            numbered.append(list(map(first.setdefault, column, count())))
            values.append(column)
        search = (
            pool.driver,
            pool.generation,
            pool.expected_slices,
            len(pool.slices),
            sorted((k, _exact(v)) for k, v in pool.counters.items()),
            columns,
            numbered,
            sorted(held),
            sorted(
                (name, sorted((k, _exact(v)) for k, v in use.amounts.items()))
                for name, use in shares.items()
            ),
        )
        exact = (values, sorted(held.items()), sorted((n, u.holders) for n, u in shares.items()))
        return search, exact


# Where a device lacks a field or attribute: no decoded JSON or YAML value is an Ellipsis.
_ABSENT = ...


def _columns(
    devices: Sequence[dict[str, Any]],
    kept: tuple[str, ...] | None,
    capacity: bool,
    fields: list[Any],
) -> list[Any] | None:
    """What a search reads of a slice's devices: the attributes in ``kept`` (every one when
    None), a column each; their other fields to ``fields``, a row per device, capacities
    only with ``capacity`` or on a slice with a device that allows multiple allocations.
    None when the attributes cannot be read so.

    No Python call per device: nodes of a shape cost only what reading them takes.
    """
    present = set().union(*map(dict.keys, devices))
    present.discard("attributes")
    if not capacity and not any([d.get("allowMultipleAllocations") for d in devices]):
        present.discard("capacity")
    names = tuple(sorted(present))
    try:
        rows = list(map(_getter(names), devices))
    except KeyError:  # a field some devices lack
        rows = [tuple([d.get(f, _ABSENT) for f in names]) for d in devices]
    fields.append(rows)
    attributes: list[Any] = [d.get("attributes") for d in devices]
    if kept is None:
        return [names, attributes]
    if set(map(type, attributes)) - {dict}:
        return None  # no attributes, or not a dict: judged on its own
    columns: list[Any] = [names]
    columns.extend([a.get(name, _ABSENT) for a in attributes] for name in kept)
    return columns


def _constraint_values(
    attributes: list[Mapping[str, Any]], driver: str, attribute: str
) -> list[Any]:
    """Per device, its value of a constraint's attribute, equal where
    :func:`~tools.allocation.pools.attribute_value`'s are: in the common case (one
    value of a kind constraints compare, per device) its one (kind, value) item, read
    without a Python call per device."""
    domain, sep, bare = attribute.partition("/")
    raws = [a.get(attribute) for a in attributes]
    if sep and domain == driver and None in raws:
        raws = [a.get(bare) if r is None else r for r, a in zip(raws, attributes, strict=True)]
    present = [r for r in raws if r is not None]
    if (
        not set(map(type, present)) - {dict}
        and not set(map(len, present)) - {1}
        and not set().union(*present).difference(VALUE_KINDS)
    ):
        return [None if r is None else (*r.items(),) for r in raws]
    return [attribute_value(a, driver, attribute) for a in attributes]


@lru_cache(maxsize=64)
def _getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
    return itemgetter(*names) if names else _nothing


def _nothing(_: dict[str, Any]) -> None:
    return None


def _exact(q: Quantity) -> tuple[int, int]:
    return q.value.numerator, q.value.denominator
