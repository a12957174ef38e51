"""ResourceSlices indexed for allocation: devices, pools, and which node sees which pool.

Follows the scheduler's pool gathering (k8s.io/dynamic-resource-allocation
structured/internal/stable/pools_stable.go, ``GatherPools``): per node, a slice
counts when its ``nodeName`` is that node, it has ``allNodes``, or its
``nodeSelector`` matches; per pool only the slices of the highest generation
count; a pool with fewer slices than ``resourceSliceCount`` is incomplete and a
pool with a duplicate device name is invalid. Both are skipped by allocation.

Partitionable devices (KEP-4815): a pool's ``sharedCounters`` are gathered from all its
slices (in the device slices on 1.34, in counter-only slices from 1.35), and a device's
``consumesCounters`` must name counters the pool has; a pool that repeats a counter set or
lacks one a device consumes is invalid.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.common.errors import PermanentError
from driver.common.quantity import Quantity
from tools.allocation.capacity import (
    CapacityProblem,
    DeviceCapacity,
    device_capacities,
    parse_quantity,
)
from tools.cel import CelDevice

# A device's identity across the cluster, as allocation results name it.
DeviceKey = tuple[str, str, str]  # (driver, pool, device)
# An attribute value as ("string"|"int"|"bool"|"version", value).
AttributeValue = tuple[str, Any]
# Counter amounts by (counter set, counter).
Counters = dict[tuple[str, str], Quantity]

# The value kinds constraints compare, in the order a device's value is read.
VALUE_KINDS = ("string", "int", "bool", "version")
_ZERO = Quantity.parse("0")


@dataclass(slots=True, eq=False)
class Device:
    """One published device with what allocation needs to know about where it lives."""

    # Position in Cluster.devices, which a device joins when first used: the key of every
    # per-device cache.
    index: int
    driver: str
    pool: str
    name: str
    data: Mapping[str, Any]  # the v1 Device JSON
    slice_name: str
    node_name: str | None = None
    node_selector: Mapping[str, Any] | None = None
    _cel: CelDevice | None = field(default=None, repr=False)
    _capacities: dict[str, DeviceCapacity] | None = field(default=None, repr=False)
    _consumes: Counters | None = field(default=None, repr=False)

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    @property
    def shared(self) -> bool:
        """``allowMultipleAllocations``: several claims (and requests) may each take a share."""
        return bool(self.data.get("allowMultipleAllocations"))

    def capacities(self) -> dict[str, DeviceCapacity]:
        """Its capacities, parsed once; none when one does not parse (the API server
        refuses such a device, so only a hand-written slice has one)."""
        if self._capacities is None:
            try:
                self._capacities = device_capacities(self.data)
            except CapacityProblem:
                self._capacities = {}
        return self._capacities

    @property
    def taints(self) -> Sequence[Mapping[str, Any]]:
        taints: Sequence[Mapping[str, Any]] = self.data.get("taints") or ()
        return taints

    def consumes(self) -> Counters:
        """What this device takes of its pool's shared counters, by (set, counter)."""
        if self._consumes is not None:
            return self._consumes
        out: Counters = {}
        for entry in self.data.get("consumesCounters") or ():
            for counter, amount in (entry.get("counters") or {}).items():
                key = (str(entry.get("counterSet", "")), str(counter))
                out[key] = out.get(key, _ZERO) + parse_quantity(str(amount["value"]))
        self._consumes = out
        return out

    def cel(self) -> CelDevice:
        """The CEL view of this device, built once on first use."""
        if self._cel is None:
            self._cel = CelDevice.from_api(self.driver, self.data)
        return self._cel

    def attribute(self, qualified_name: str) -> AttributeValue | None:
        """Look an attribute up the way constraints do (:func:`attribute_value`)."""
        return attribute_value(self.data.get("attributes") or {}, self.driver, qualified_name)


def attribute_value(
    attributes: Mapping[str, Any], driver: str, qualified_name: str
) -> AttributeValue | None:
    """A device's attribute as constraints compare it.

    The fully qualified name first, then, when its domain is the driver's,
    the bare identifier (stable allocator, ``lookupAttribute``).
    """
    raw = attributes.get(qualified_name)
    if raw is None:
        domain, sep, ident = qualified_name.partition("/")
        if not sep or domain != driver:
            return None
        raw = attributes.get(ident)
        if raw is None:
            return None
    if isinstance(raw, Mapping):
        for kind in VALUE_KINDS:
            if kind in raw:
                return (kind, raw[kind])
    return None  # an unknown value type cannot satisfy a constraint


@dataclass(slots=True)
class _Slice:
    name: str
    driver: str
    pool: str
    generation: int
    count: int
    node_name: str | None
    all_nodes: bool
    node_selector: Mapping[str, Any] | None
    per_device: bool
    # The v1 Device dicts, first read when a node that sees the slice is, and their Device
    # objects made on first use: most nodes of a large cluster get their outcome from a
    # node of the same shape without any, and a device read then is still in the cache.
    raw: Sequence[Mapping[str, Any]]
    every: list[Device]  # the cluster's, which a device made here joins
    counter_sets: list[Mapping[str, Any]] = field(default_factory=list)
    _names: list[str] | None = None
    # Learnt while its devices are read, so that a pool of this slice alone needs no pass
    # over them again for every node that sees it.
    _duplicate: str | None = None  # a device name that appears twice
    _consuming: bool = False  # whether a device consumes counters
    _dicts: bool = True
    _made: list[Device | None] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return self._names if self._names is not None else self._read()

    @property
    def duplicate(self) -> str | None:
        """A device name that appears twice."""
        if self._names is None:
            self._read()
        return self._duplicate

    @property
    def consuming(self) -> bool:
        """Whether a device consumes counters."""
        if self._names is None:
            self._read()
        return self._consuming

    @property
    def dicts(self) -> bool:
        """Whether every device is a dict: what a node's shape reads them as."""
        if self._names is None:
            self._read()
        return self._dicts

    def _read(self) -> list[str]:
        raw = self.raw
        try:
            names = list(map(str, [d.get("name", "") for d in raw]))
        except (AttributeError, TypeError) as exc:
            raise InvalidSliceError(f"ResourceSlice {self.name}: malformed: {exc}") from exc
        if len(set(names)) != len(names):
            seen: set[str] = set()
            for name in names:
                if name in seen:
                    self._duplicate = name
                seen.add(name)
        self._consuming = any(["consumesCounters" in d for d in raw])
        self._dicts = not set(map(type, raw)) - {dict}
        self._names = names
        return names

    @property
    def devices(self) -> list[Device]:
        return [self.device(i) for i in range(len(self.names))]

    def device(self, position: int) -> Device:
        made = self._made
        if not made:
            made.extend([None] * len(self.names))
        device = made[position]
        if device is None:
            raw = self.raw[position]
            where, selected = self.node_name, self.node_selector
            if self.per_device:
                where, selected = raw.get("nodeName") or None, raw.get("nodeSelector")
            every = self.every
            device = Device(
                len(every), self.driver, self.pool, self.names[position], raw, self.name, where,
                selected,
            )  # fmt: skip
            every.append(device)
            made[position] = device
        return device


@dataclass(slots=True)
class Pool:
    """One pool as one node sees it: only its newest generation."""

    driver: str
    name: str
    generation: int
    expected_slices: int
    slices: list[_Slice]
    invalid: str | None = None  # why the pool is invalid, e.g. a duplicate device name
    counters: Counters = field(default_factory=dict)  # the shared counters' totals

    @property
    def incomplete(self) -> bool:
        return len(self.slices) != self.expected_slices

    @property
    def usable(self) -> bool:
        return not self.incomplete and self.invalid is None

    def devices(self, node: str | None, labels: Mapping[str, str] | None) -> Iterable[Device]:
        for s in self.slices:
            if not s.per_device:
                yield from s.devices
                continue
            for device in s.devices:
                if _device_targets(device, node, labels):
                    yield device

    def evaluated(self) -> Iterable[Device]:
        """The devices the scheduler runs selectors on, in its order, whatever the node.

        That is every device of the pool's slices: for a slice with per-device node
        selection the scheduler (incubating allocator, ``isSelectable``) evaluates the
        selectors before it checks where the device is, so a selector that fails on a
        device of another node still stops allocation here.
        """
        for s in self.slices:
            yield from s.devices

    def describe(self) -> str:
        return f"{self.driver}/{self.name}"


def _device_targets(device: Device, node: str | None, labels: Mapping[str, str] | None) -> bool:
    if device.node_name is not None:
        return node is None or device.node_name == node
    if device.node_selector is not None:
        return node_selector_matches(device.node_selector, node, labels)
    return bool(device.data.get("allNodes"))


class InvalidSliceError(PermanentError):
    """A ResourceSlice without the fields allocation needs."""


class Cluster:
    """The given ResourceSlices, grouped so a node's pools are cheap to gather."""

    def __init__(
        self,
        slices: Iterable[Mapping[str, Any]],
        *,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.devices: list[Device] = []
        self._local: dict[str, list[_Slice]] = {}
        self._shared: list[_Slice] = []
        self._node_labels = node_labels
        names: set[str] = set(node_labels or ())
        for index, obj in enumerate(slices):
            try:
                parsed = self._parse(obj, index)
                # Made now: their nodes are among the cluster's nodes.
                placed = parsed.devices if parsed is not None and parsed.per_device else []
            except (AttributeError, TypeError, ValueError) as exc:
                name = (obj.get("metadata") or {}).get("name") if isinstance(obj, Mapping) else None
                raise InvalidSliceError(
                    f"ResourceSlice {name or f'#{index}'}: malformed: {exc}"
                ) from exc
            if parsed is None:
                continue
            if parsed.node_name is not None:
                self._local.setdefault(parsed.node_name, []).append(parsed)
                names.add(parsed.node_name)
            else:
                self._shared.append(parsed)
                names.update(d.node_name for d in placed if d.node_name)
        for group in self._local.values():
            group.sort(key=lambda s: s.name)
        self._shared.sort(key=lambda s: s.name)
        self.node_names: list[str] = sorted(names)

    def _parse(self, obj: Mapping[str, Any], index: int) -> _Slice | None:
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise InvalidSliceError(f"ResourceSlice #{index}: no spec")
        name = str((obj.get("metadata") or {}).get("name") or f"#{index}")
        pool = spec.get("pool")
        driver = spec.get("driver")
        if not isinstance(pool, Mapping) or not pool.get("name") or not driver:
            raise InvalidSliceError(
                f"ResourceSlice {name}: spec.driver and spec.pool.name required"
            )
        per_device = bool(spec.get("perDeviceNodeSelection"))
        node_name = spec.get("nodeName") or None
        all_nodes = bool(spec.get("allNodes"))
        selector = spec.get("nodeSelector")
        if node_name is None and not all_nodes and selector is None and not per_device:
            return None  # an unknown future way of node selection: the scheduler skips it too
        return _Slice(
            name=name,
            driver=str(driver),
            pool=str(pool["name"]),
            generation=int(pool.get("generation") or 0),
            count=int(pool.get("resourceSliceCount") or 1),
            node_name=node_name,
            all_nodes=all_nodes,
            node_selector=selector,
            per_device=per_device,
            raw=spec.get("devices") or (),
            every=self.devices,
            counter_sets=list(spec.get("sharedCounters") or ()),
        )

    def labels(self, node: str | None) -> Mapping[str, str] | None:
        if node is None or self._node_labels is None:
            return None
        return self._node_labels.get(node)

    def pools(self, node: str | None) -> list[Pool]:
        """The pools a node sees, sorted by driver and name (the order allocation tries)."""
        labels = self.labels(node)
        candidates: list[_Slice] = list(self._local.get(node, ())) if node is not None else []
        for s in self._shared:
            if s.per_device:
                if any(_device_targets(d, node, labels) for d in s.devices):
                    candidates.append(s)
            elif s.all_nodes or (
                s.node_selector is not None and node_selector_matches(s.node_selector, node, labels)
            ):
                candidates.append(s)
        by_id: dict[tuple[str, str], Pool] = {}
        for s in candidates:
            pool = by_id.get((s.driver, s.pool))
            if pool is None or s.generation > pool.generation:
                by_id[(s.driver, s.pool)] = Pool(s.driver, s.pool, s.generation, s.count, [s])
            elif s.generation == pool.generation:
                pool.slices.append(s)
        result = [by_id[k] for k in sorted(by_id)]
        for pool in result:
            # The newest slice decides how many slices make the pool complete.
            pool.expected_slices = pool.slices[0].count
            duplicate = pool.slices[0].duplicate
            if len(pool.slices) > 1:
                seen: set[str] = set()
                for s in pool.slices:
                    for device_name in s.names:
                        if device_name in seen:
                            duplicate = device_name
                        seen.add(device_name)
            if duplicate is not None:
                pool.invalid = f"duplicate device name {duplicate}"
            if any(s.counter_sets or s.consuming for s in pool.slices):
                _gather_counters(pool)
        return result


def _gather_counters(pool: Pool) -> None:
    sets: set[str] = set()
    for s in pool.slices:
        for counter_set in s.counter_sets:
            name = str(counter_set.get("name", ""))
            if name in sets:
                pool.invalid = pool.invalid or f"duplicate counter set {name}"
            sets.add(name)
            for counter, amount in (counter_set.get("counters") or {}).items():
                pool.counters[(name, str(counter))] = parse_quantity(str(amount["value"]))
    for s in pool.slices:
        for d in s.devices:
            for key in d.consumes():
                if key not in pool.counters:
                    pool.invalid = pool.invalid or (
                        f"device {d.name} consumes counter {key[1]} of counter set {key[0]}, "
                        "which the pool does not have"
                    )


def node_selector_matches(
    selector: Mapping[str, Any], node: str | None, labels: Mapping[str, str] | None
) -> bool:
    """A v1 NodeSelector against a node: terms are ORed, requirements in a term ANDed.

    Without the node's labels (no Node objects given) label requirements are
    assumed to hold; ``matchFields`` on ``metadata.name`` is always checked.
    """
    for term in selector.get("nodeSelectorTerms") or ():
        expressions = term.get("matchExpressions") or ()
        fields = term.get("matchFields") or ()
        if not expressions and not fields:
            continue  # an empty term matches no node
        if labels is not None and not all(_requirement(r, labels) for r in expressions):
            continue
        if node is not None and not all(_requirement(r, {"metadata.name": node}) for r in fields):
            continue
        return True
    return False


def _requirement(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key = req.get("key", "")
    op = req.get("operator", "")
    wanted = [str(v) for v in req.get("values") or ()]
    present = key in values
    value = values.get(key, "")
    if op == "In":
        return present and value in wanted
    if op == "NotIn":
        return not present or value not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > limit if op == "Gt" else have < limit
    return False
