"""The pure core of the controller: which ResourceSlice writes bring a node's pools in line.

It follows upstream's resourceslice controller
(k8s.io/dynamic-resource-allocation/resourceslice) rule for rule, because the
scheduler and other drivers' tooling read pools the way that controller writes them:

* every desired slice becomes exactly one ResourceSlice, named
  ``<index as %0Nx, N = max(5, hex digits)>-<driver>-<node>``: upstream's
  ``generateName`` prefix without the random suffix
  (:func:`driver.slices.model.slice_name`,
  which ``gpu-dra discover`` prints too). A fixed name lets the API server
  refuse a second slice for one index (409 AlreadyExists), so neither a create whose
  response got lost nor two instances starting at once can put a device twice into
  the pool. Only a name longer than 253 characters falls back to ``generateName``;
* existing slices are matched to desired ones by that index prefix; a slice with a
  lower generation than the pool's highest, an unparsable name, an index beyond the
  desired count or a second slice for one index is obsolete;
* the generation stays when at most one matched slice changes and nothing is created,
  otherwise it is bumped and every matched slice is rewritten;
* writes go delete, then update, then create.

Comparison is semantic: quantities by value (the server stores ``85520318464`` as
``81559Mi``), absent and empty fields alike, taint ``timeAdded`` within a second, so
an unchanged pool plans zero writes.
"""

import copy
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.common.errors import PermanentError
from driver.common.quantity import Quantity
from driver.common.wire import Obj as _Obj
from driver.common.wire import parse_time
from driver.slices.model import index_length, slice_metadata


class InvalidPoolError(PermanentError):
    """The desired pool breaks a rule the scheduler relies on; retrying cannot fix it."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Writes in the order they must be sent: ``deletes``, ``updates``, ``creates``.

    ``deletes`` are observed objects (delete with UID and resourceVersion
    preconditions); ``updates`` are full bodies for PUT, carrying the observed
    resourceVersion; ``creates`` are bodies for POST, with a fixed ``name``.
    ``generations`` is the generation each desired pool ends up with.
    """

    deletes: tuple[_Obj, ...] = ()
    updates: tuple[_Obj, ...] = ()
    creates: tuple[_Obj, ...] = ()
    generations: Mapping[str, int] = field(default_factory=dict)

    @property
    def writes(self) -> int:
        return len(self.deletes) + len(self.updates) + len(self.creates)


def decode_index(name: str, expected_length: int) -> int | None:
    """The index encoded in a slice name, or None when the name doesn't carry one."""
    prefix, sep, _ = name.partition("-")
    if not sep or len(prefix) != expected_length:
        return None
    try:
        return int(prefix, 16)
    except ValueError:
        return None


def validate_pools(desired: Iterable[_Obj]) -> None:
    """Reject pools upstream rejects: duplicate devices or counter sets, dangling counters."""
    devices: dict[str, set[str]] = defaultdict(set)
    counters: dict[str, dict[str, set[str]]] = defaultdict(dict)
    consumers: list[tuple[str, str, Mapping[str, Any]]] = []
    for obj in desired:
        spec = obj["spec"]
        pool = spec["pool"]["name"]
        for device in spec.get("devices") or ():
            name = device["name"]
            if name in devices[pool]:
                raise InvalidPoolError(f"pool {pool!r}: device {name!r} appears more than once")
            devices[pool].add(name)
            consumers.extend((pool, name, c) for c in device.get("consumesCounters") or ())
        for counter_set in spec.get("sharedCounters") or ():
            name = counter_set["name"]
            if name in counters[pool]:
                raise InvalidPoolError(
                    f"pool {pool!r}: counter set {name!r} appears more than once"
                )
            counters[pool][name] = set(counter_set.get("counters") or {})
    for pool, device_name, consumption in consumers:
        set_name = consumption["counterSet"]
        known = counters[pool].get(set_name)
        if known is None:
            raise InvalidPoolError(
                f"pool {pool!r}: device {device_name!r} consumes from unknown counter set "
                f"{set_name!r}"
            )
        missing = sorted(set(consumption.get("counters") or {}) - known)
        if missing:
            raise InvalidPoolError(
                f"pool {pool!r}: device {device_name!r} consumes unknown counters {missing} "
                f"of counter set {set_name!r}"
            )


def plan(
    desired: list[_Obj],
    observed: Iterable[_Obj],
    *,
    driver_name: str,
    node_name: str,
    node_uid: str,
) -> Plan:
    """The writes that turn ``observed`` into ``desired`` (both ResourceSlice dicts).

    ``desired`` is what the ResourceSlice model builds, in slice order; only its
    ``spec`` (and labels) are used. ``observed`` are the node's slices of this driver as
    the server returns them. Raises :class:`InvalidPoolError` for an invalid pool.
    """
    validate_pools(desired)
    wanted: dict[str, list[_Obj]] = {}
    for obj in desired:
        wanted.setdefault(obj["spec"]["pool"]["name"], []).append(obj)
    existing: dict[str, list[_Obj]] = defaultdict(list)
    for obj in observed:
        existing[obj["spec"]["pool"]["name"]].append(obj)

    deletes: list[_Obj] = []
    updates: list[_Obj] = []
    creates: list[_Obj] = []
    generations: dict[str, int] = {}
    for pool_name in sorted(existing.keys() - wanted.keys()):
        deletes.extend(existing[pool_name])  # the pool is gone: every slice is obsolete
    owner = _Owner(driver_name, node_name, node_uid)
    for pool_name, pool_slices in wanted.items():
        gen, pool_deletes, pool_updates, pool_creates = _plan_pool(
            pool_name, pool_slices, existing.get(pool_name, []), owner
        )
        generations[pool_name] = gen
        deletes.extend(pool_deletes)
        updates.extend(pool_updates)
        creates.extend(pool_creates)
    return Plan(tuple(deletes), tuple(updates), tuple(creates), generations)


@dataclass(frozen=True, slots=True)
class _Owner:
    driver_name: str
    node_name: str
    node_uid: str


def _plan_pool(
    pool_name: str, wanted: list[_Obj], existing: list[_Obj], owner: _Owner
) -> tuple[int, list[_Obj], list[_Obj], list[_Obj]]:
    count = len(wanted)
    generation = max((_generation(s) for s in existing), default=0)
    prefix_length = index_length(count)

    matched: dict[int, _Obj] = {}
    obsolete: list[_Obj] = []
    for current in sorted(existing, key=_name):
        index = decode_index(_name(current), prefix_length)
        if _generation(current) < generation or index is None or index >= count or index in matched:
            obsolete.append(current)
        else:
            matched[index] = current

    pool = {"name": pool_name, "generation": generation, "resourceSliceCount": count}
    changed = {
        index
        for index, current in matched.items()
        if not _same_slice(current["spec"], wanted[index]["spec"], pool)
    }
    requested = max((_generation(s) for s in wanted), default=0)
    new = count - len(matched)
    if requested > generation:
        generation, bumped = requested, True
    elif new == 0 and len(changed) <= 1:
        bumped = False
    else:
        generation, bumped = generation + 1, True
    pool["generation"] = generation

    updates = [
        _updated(matched[index], wanted[index]["spec"], pool)
        for index in sorted(matched)
        if bumped or index in changed
    ]
    creates = [
        _created(index, wanted[index], pool, owner)
        for index in range(count)
        if index not in matched
    ]
    return generation, obsolete, updates, creates


_COPIED_SPEC_FIELDS = (
    "nodeSelector",
    "allNodes",
    "devices",
    "sharedCounters",
    "perDeviceNodeSelection",
    "partitionTypeAttribute",
)


def _updated(current: _Obj, spec: _Obj, pool: _Obj) -> _Obj:
    body = copy.deepcopy(current)
    new_spec = body["spec"]
    new_spec["pool"] = dict(pool)
    for key in _COPIED_SPEC_FIELDS:
        if spec.get(key):  # upstream leaves false/empty fields unset
            new_spec[key] = copy.deepcopy(spec[key])
        else:
            new_spec.pop(key, None)
    if "devices" in new_spec:
        _keep_taint_times(current["spec"].get("devices"), new_spec["devices"])
    return body


def _created(index: int, desired: _Obj, pool: _Obj, owner: _Owner) -> _Obj:
    spec = copy.deepcopy(desired["spec"])
    spec["pool"] = dict(pool)
    spec["driver"] = owner.driver_name
    spec["nodeName"] = owner.node_name
    count = pool["resourceSliceCount"]
    metadata: _Obj = {
        **slice_metadata(index, count, owner.driver_name, owner.node_name),
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": owner.node_name,
                "uid": owner.node_uid,
                "controller": True,
            }
        ],
    }
    labels = (desired.get("metadata") or {}).get("labels")
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": spec,
    }


def _same_slice(current: _Obj, desired: _Obj, pool: _Obj) -> bool:
    current_pool = current.get("pool") or {}
    if (
        current_pool.get("name") != pool["name"]
        or int(current_pool.get("generation", 0)) != pool["generation"]
        or int(current_pool.get("resourceSliceCount", 0)) != pool["resourceSliceCount"]
    ):
        return False
    # Unset and false are one state for these flags; updates leave false ones unset.
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if bool(current.get(flag)) != bool(desired.get(flag)):
            return False
    for key in ("nodeSelector", "sharedCounters", "partitionTypeAttribute"):
        # "or None": an empty list or map is the same as none at all.
        if _canonical(current.get(key) or None, key) != _canonical(desired.get(key) or None, key):
            return False
    return _same_devices(current.get("devices") or [], desired.get("devices") or [])


def _same_devices(current: list[_Obj], desired: list[_Obj]) -> bool:
    if len(current) != len(desired):
        return False
    for have, want in zip(current, desired, strict=True):
        have_taints, want_taints = have.get("taints") or [], want.get("taints") or []
        if len(have_taints) != len(want_taints):
            return False
        if not all(_same_taint(a, b) for a, b in zip(have_taints, want_taints, strict=True)):
            return False
        strip = {k: v for k, v in have.items() if k != "taints"}
        wish = {k: v for k, v in want.items() if k != "taints"}
        if _canonical(strip, "device") != _canonical(wish, "device"):
            return False
    return True


def _same_taint(a: _Obj, b: _Obj) -> bool:
    if any(a.get(k) != b.get(k) for k in ("key", "value", "effect")):
        return False
    # The server stamps timeAdded and stores whole seconds; only a real difference counts.
    ta, tb = a.get("timeAdded"), b.get("timeAdded")
    if ta and tb:
        at, bt = parse_time(ta), parse_time(tb)
        if at is None or bt is None:
            return bool(ta == tb)
        return abs((at - bt).total_seconds()) <= 1.0
    return True


def _keep_taint_times(current: list[_Obj] | None, desired: list[_Obj]) -> None:
    """Carry the server's ``timeAdded`` onto desired taints that lack one (upstream does)."""
    if not current:
        return
    by_name = {d["name"]: d for d in current}
    for device in desired:
        old = by_name.get(device["name"])
        if old is None:
            continue
        for taint in device.get("taints") or ():
            if taint.get("timeAdded"):
                continue
            for old_taint in old.get("taints") or ():
                if all(old_taint.get(k) == taint.get(k) for k in ("key", "value", "effect")):
                    if old_taint.get("timeAdded"):
                        taint["timeAdded"] = old_taint["timeAdded"]
                    break


# A quantity's spelling is the server's business (it canonicalizes), its value is ours;
# the contexts below say where in a slice spec quantities sit.
def _canonical(value: Any, context: str) -> Any:
    """A comparable form: empty things dropped, quantities parsed to values."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            child = _child_context(context, key)
            if child == "quantity":
                canon: Any = _quantity(item)
            else:
                canon = _canonical(item, child)
            if canon is None or canon == [] or canon == {}:
                continue
            out[key] = canon
        return out
    if isinstance(value, list):
        return [_quantity(v) if context == "quantities" else _canonical(v, context) for v in value]
    return value


def _child_context(context: str, key: str) -> str:
    if context == "device":
        if key == "capacity":
            return "capacity-map"
        if key == "consumesCounters":
            return "consumption"
        return "other"
    if context == "capacity-map":
        return "capacity"
    if context == "capacity":
        if key == "value":
            return "quantity"
        if key == "requestPolicy":
            return "policy"
        return "other"
    if context == "policy":
        if key == "default":
            return "quantity"
        if key == "validValues":
            return "quantities"
        if key == "validRange":
            return "range"
        return "other"
    if context == "range":
        return "quantity" if key in ("min", "max", "step") else "other"
    if context in ("consumption", "sharedCounters"):
        return "counter-map" if key == "counters" else context
    if context == "counter-map":
        return "counter"
    if context == "counter":
        return "quantity" if key == "value" else "other"
    return "other"


def _quantity(value: Any) -> Any:
    if isinstance(value, str | int | float):
        try:
            return Quantity.parse(str(value))
        except (ValueError, ArithmeticError):
            return value
    return value


def _generation(obj: _Obj) -> int:
    return int(obj["spec"]["pool"].get("generation", 0))


def _name(obj: _Obj) -> str:
    name: str = obj["metadata"].get("name", "")
    return name
