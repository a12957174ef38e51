"""Feature gates of the ResourceSlice fields: what a server with a gate off drops.

The real API server's strategy for ResourceSlices (``dropDisabledFields``) clears each
gated field when its gate is off, silently: the write succeeds and the answer simply
lacks the field. A publisher that does not notice rewrites the slice forever.

Differences from the real server: it keeps a disabled field on update when the stored
object already used it (so objects written before a downgrade survive); this one drops
it on every write.
"""

from collections.abc import Mapping
from typing import Any

# gate -> (fields of a device, fields of the slice's spec) that it switches.
GATED_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "DRADeviceTaints": (("taints",), ()),
    "DRAPartitionableDevices": (
        ("consumesCounters", "nodeName", "nodeSelector", "allNodes"),
        ("sharedCounters", "perDeviceNodeSelection"),
    ),
    "DRAConsumableCapacity": (("allowMultipleAllocations",), ()),
    "DRADeviceBindingConditions": (
        ("bindsToNode", "bindingConditions", "bindingFailureConditions"),
        (),
    ),
}


def disabled_gates(feature_gates: Mapping[str, bool] | None) -> frozenset[str]:
    """The gates switched off; every gate not named is on (so every field is kept)."""
    gates = dict(feature_gates or {})
    unknown = sorted(set(gates) - set(GATED_FIELDS))
    if unknown:
        known = ", ".join(sorted(GATED_FIELDS))
        raise ValueError(f"unknown feature gate(s) {', '.join(unknown)}; known: {known}")
    return frozenset(gate for gate, enabled in gates.items() if not enabled)


def drop_disabled_fields(obj: dict[str, Any], disabled: frozenset[str]) -> None:
    """Clear, in a ResourceSlice, every field whose gate is off."""
    spec = obj.get("spec")
    if not disabled or not isinstance(spec, dict):
        return
    for gate in disabled:
        device_fields, spec_fields = GATED_FIELDS[gate]
        for field in spec_fields:
            spec.pop(field, None)
        for device in spec.get("devices") or ():
            if not isinstance(device, dict):
                continue
            for field in device_fields:
                device.pop(field, None)
            if gate == "DRAConsumableCapacity":
                for capacity in (device.get("capacity") or {}).values():
                    if isinstance(capacity, dict):
                        capacity.pop("requestPolicy", None)
