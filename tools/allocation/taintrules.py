"""DeviceTaintRules applied to ResourceSlices, as the scheduler sees the devices.

A DeviceTaintRule (KEP-5055; ``resource.k8s.io/v1`` from 1.37) adds its one taint to every
device its ``deviceSelector`` matches, "the same effect as if the taint was specified
directly in the ResourceSlice" (the API's words): the scheduler's ResourceSlice tracker
(k8s.io/dynamic-resource-allocation resourceslice/tracker ``applyPatches``) appends it to
the device's ``taints``, after the driver's own. So does
:func:`apply_taint_rules`, on copies of the slices it changes, marking each added taint
with the rule's name under :data:`RULE`, a key the API has not, so that a reason can say
which rule to delete.

Selector semantics (``DeviceTaintSelector``): every criterion given (``driver``,
``pool``, ``device``) must match, an empty selector matches every device, a rule without
one matches none. ``deviceClassName`` and CEL ``selectors`` (the 1.33/1.34 v1alpha3 API)
were tombstoned in 1.35 because the eviction controller cannot evaluate them; a rule that
still carries them is refused here rather than applied too widely.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.common.errors import PermanentError

KIND = "DeviceTaintRule"
# The name of the rule a taint came from, in the taint dicts apply_taint_rules adds.
RULE = "gpu-dra.explain/deviceTaintRule"
EFFECTS = ("NoSchedule", "NoExecute", "None")


class TaintRuleError(PermanentError):
    """A DeviceTaintRule that cannot be applied: no taint key, an unknown effect, a
    tombstoned selector field."""


@dataclass(frozen=True, slots=True)
class TaintRule:
    name: str
    driver: str | None
    pool: str | None
    device: str | None
    matches_nothing: bool
    taint: Mapping[str, Any]  # the taint as the device gets it, RULE included

    def matches_pool(self, driver: str, pool: str) -> bool:
        if self.matches_nothing:
            return False
        return self.driver in (None, driver) and self.pool in (None, pool)


def parse_rule(obj: Mapping[str, Any]) -> TaintRule:
    name = str((obj.get("metadata") or {}).get("name") or "?")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise TaintRuleError(f"DeviceTaintRule {name}: no spec")
    taint = spec.get("taint")
    if not isinstance(taint, Mapping) or not taint.get("key"):
        raise TaintRuleError(f"DeviceTaintRule {name}: spec.taint.key is required")
    if taint.get("effect") not in EFFECTS:
        raise TaintRuleError(
            f"DeviceTaintRule {name}: spec.taint.effect {taint.get('effect')!r} is not one of "
            f"{', '.join(EFFECTS)}"
        )
    selector = spec.get("deviceSelector")
    if selector is not None and not isinstance(selector, Mapping):
        raise TaintRuleError(f"DeviceTaintRule {name}: spec.deviceSelector is not an object")
    for field in ("deviceClassName", "selectors"):
        if selector and selector.get(field):
            raise TaintRuleError(
                f"DeviceTaintRule {name}: deviceSelector.{field} was removed in Kubernetes "
                "1.35; select by driver, pool and device"
            )

    def criterion(field: str) -> str | None:
        # As the tracker compares pointers: only an absent field matches every value.
        value = (selector or {}).get(field)
        return None if value is None else str(value)

    kept = {k: taint[k] for k in ("key", "value", "effect", "timeAdded") if taint.get(k)}
    return TaintRule(
        name=name,
        driver=criterion("driver"),
        pool=criterion("pool"),
        device=criterion("device"),
        matches_nothing=selector is None,
        taint={**kept, RULE: name},
    )


def parse_rules(objects: Iterable[Mapping[str, Any]]) -> list[TaintRule]:
    # The tracker adds them in its informer's order, which no reader can know: by name, so
    # that the same rules give the same reasons whatever order they were listed in.
    return sorted((parse_rule(o) for o in objects), key=lambda r: r.name)


def apply_taint_rules(
    slices: Iterable[Mapping[str, Any]], rules: Sequence[TaintRule]
) -> list[Mapping[str, Any]]:
    """The slices with each rule's taint added to the devices it matches.

    Slices no rule touches are the same objects: a cluster of thousands of slices is not
    copied for a rule on one node.
    """
    out: list[Mapping[str, Any]] = []
    for obj in slices:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        pool = (spec or {}).get("pool") if isinstance(spec, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(pool, Mapping):
            out.append(obj)  # malformed: the allocator says how
            continue
        driver, pool_name = str(spec.get("driver") or ""), str(pool.get("name") or "")
        applying = [r for r in rules if r.matches_pool(driver, pool_name)]
        devices = spec.get("devices")
        if not applying or not isinstance(devices, list):
            out.append(obj)
            continue
        new_devices: list[Any] = []
        changed = False
        for device in devices:
            name = str(device.get("name") or "") if isinstance(device, Mapping) else None
            added = [
                dict(r.taint) for r in applying if name is not None and r.device in (None, name)
            ]
            if added:
                device = {**device, "taints": [*(device.get("taints") or ()), *added]}
                changed = True
            new_devices.append(device)
        out.append({**obj, "spec": {**spec, "devices": new_devices}} if changed else obj)
    return out


def taint_text(taint: Mapping[str, Any]) -> str:
    """``key=value:Effect``, and the rule that added it, as a reason names a taint."""
    value = taint.get("value")
    key = f"{taint.get('key', '')}={value}" if value else str(taint.get("key", ""))
    text = f"{key}:{taint.get('effect', '')}"
    rule = taint.get(RULE)
    return f"{text} by DeviceTaintRule {rule}" if rule else text
