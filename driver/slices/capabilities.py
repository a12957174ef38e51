"""What the API server keeps of a ResourceSlice: the fields behind feature gates.

A server whose gate is off does not refuse a gated field: it drops it, and the write
succeeds. A publisher that does not notice compares what it wants (with the field)
with what it reads back (without), finds a difference, and rewrites the slice on every
event, forever. EKS 1.34 and 1.35 cannot enable alpha gates, so this is the normal
case there, for every device kind that needs device taints, shared counters, multiple
allocations or binding conditions.

:class:`CapabilityGuard` is shared by every device kind. The first time the desired
slices use a gated field, it learns the server's version (``/version``) and which
fields survive a server-side dry-run create of a probe slice using them (one GET and
one dry-run POST per gate, all at once, once per process; a GPU node that uses none
costs nothing).
For each dropped field a kind uses it logs one line and falls back: a field that only
relaxes allocation (``allowMultipleAllocations``) is published without it; a device
that would be unsafe without its field (a taint keeps it from being scheduled, counters
keep partitions from overlapping, binding conditions delay its use) is left out.

Taint effect ``None`` (informational: an application XID, an unmonitored GPU) is a
value, not a field: Kubernetes 1.35 added it, and a 1.34 server with device taints
on refuses the whole slice that carries one. Where taints are kept, one more dry-run
learns whether ``None`` is accepted; where it is not, informational taints are left
off (they change no allocation) with one line saying so.
"""

import asyncio
import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from driver.common.errors import RetryableError
from driver.common.logs import kv
from driver.common.wire import Obj as _Obj
from driver.kube.resources import RESOURCE_SLICES
from driver.kube.rest import ApiError, Client
from driver.slices.model import generate_name, slice_name

log = logging.getLogger(__name__)

_PROBE = "gpu-dra.io/capability-probe"


@dataclass(frozen=True, slots=True)
class GatedField:
    """Fields one feature gate switches, and what a kind gets when the gate is off."""

    feature: str
    gate: str
    device_fields: tuple[str, ...] = ()
    spec_fields: tuple[str, ...] = ()
    leave_out: bool = True  # the fallback: leave the device out (else: drop the field)

    def used_by_device(self, device: _Obj) -> bool:
        if any(device.get(f) for f in self.device_fields):
            return True
        return self.gate == "DRAConsumableCapacity" and any(
            isinstance(c, dict) and c.get("requestPolicy")
            for c in (device.get("capacity") or {}).values()
        )

    def used_by(self, spec: _Obj) -> bool:
        return any(spec.get(f) for f in self.spec_fields) or any(
            self.used_by_device(d) for d in spec.get("devices") or ()
        )


GATED_FIELDS = (
    GatedField("device taints", "DRADeviceTaints", device_fields=("taints",)),
    GatedField(
        "shared counters",
        "DRAPartitionableDevices",
        device_fields=("consumesCounters", "nodeName", "nodeSelector", "allNodes"),
        spec_fields=("sharedCounters", "perDeviceNodeSelection"),
    ),
    GatedField(
        "multiple allocations",
        "DRAConsumableCapacity",
        device_fields=("allowMultipleAllocations",),
        leave_out=False,
    ),
    GatedField(
        "binding conditions",
        "DRADeviceBindingConditions",
        device_fields=("bindsToNode", "bindingConditions", "bindingFailureConditions"),
    ),
)


_DEVICE_FIELDS = frozenset(f for g in GATED_FIELDS for f in g.device_fields)
_SPEC_FIELDS = frozenset(f for g in GATED_FIELDS for f in g.spec_fields)


def uses_gated_fields(slices: Iterable[_Obj]) -> bool:
    """Whether any slice sets a gated field (the check every resync of every node pays)."""
    for obj in slices:
        spec = obj.get("spec") or {}
        if any(spec.get(f) for f in _SPEC_FIELDS):
            return True
        for device in spec.get("devices") or ():
            if not _DEVICE_FIELDS.isdisjoint(device) and any(device.get(f) for f in _DEVICE_FIELDS):
                return True
            if any(
                isinstance(c, dict) and c.get("requestPolicy")
                for c in (device.get("capacity") or {}).values()
            ):
                return True
    return False


# Not a gate: a value of a gated field. The key under which fit() counts what it drops.
EFFECT_NONE = "DeviceTaintEffectNone"


@dataclass(frozen=True, slots=True)
class Capabilities:
    version: str  # the server's gitVersion
    dropped: frozenset[str]  # gates whose fields the server drops
    effect_none: bool = True  # whether taints with effect None are accepted (1.35+)


# Per gate, the smallest valid slice spec that uses its fields: one probe per gate, so a
# server that refuses one probe (a validation rule of its version) costs only that gate.
_PROBES: dict[str, _Obj] = {
    "DRADeviceTaints": {
        "devices": [
            {"name": "probe", "taints": [{"key": _PROBE, "value": "probe", "effect": "NoSchedule"}]}
        ]
    },
    "DRAPartitionableDevices": {
        "sharedCounters": [{"name": "probe", "counters": {"probe": {"value": "1"}}}]
    },
    "DRAConsumableCapacity": {"devices": [{"name": "probe", "allowMultipleAllocations": True}]},
    "DRADeviceBindingConditions": {
        "devices": [
            {
                "name": "probe",
                "bindsToNode": True,
                "bindingConditions": [_PROBE],
                "bindingFailureConditions": [f"{_PROBE}-failed"],
            }
        ]
    },
}


_EFFECT_NONE_PROBE: _Obj = {
    "devices": [{"name": "probe", "taints": [{"key": _PROBE, "value": "probe", "effect": "None"}]}]
}


# The probes' slice index: named by the one naming rule (the slice admission policy lets a
# plugin write only such names), with an index no real slice reaches. Dry runs store
# nothing, so two instances probing at once do not collide.
_PROBE_INDEX = 0xFFFFF


def probe_slices(driver_name: str, node_name: str) -> dict[str, _Obj]:
    """Per gate (and for effect None), a slice of this driver and node using its fields."""
    name = slice_name(_PROBE_INDEX, 1, driver_name, node_name)
    metadata = (
        {"name": name}
        if name is not None
        else {"generateName": generate_name(_PROBE_INDEX, 1, driver_name, node_name)}
    )
    return {
        gate: {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": dict(metadata),
            "spec": {
                "driver": driver_name,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                **copy.deepcopy(spec),
            },
        }
        for gate, spec in {**_PROBES, EFFECT_NONE: _EFFECT_NONE_PROBE}.items()
    }


async def probe(client: Client, *, driver_name: str, node_name: str) -> Capabilities:
    """The server's version and the gates whose fields a dry-run create drops.

    A probe the server refuses (a 4xx: its validation, an admission policy) counts as
    dropped, with one line saying why. Raises what :class:`driver.kube.rest.Client`
    raises for the rest (no answer, 5xx: worth a retry).
    """
    probes = probe_slices(driver_name, node_name)
    # All at once: dry runs store nothing, so none depends on another, and a node whose
    # kinds use gated fields waits on them before its first publish. The effect None
    # probe is sent beside the taints' one and counts only where taints are kept.
    version, answers = await asyncio.gather(
        client.get_json("/version", resource="/version"),
        asyncio.gather(
            *(_probe_answer(client, probes[g.gate]) for g in GATED_FIELDS),
            _probe_answer(client, probes[EFFECT_NONE]),
        ),
    )
    dropped: set[str] = set()
    for gated, answer in zip(GATED_FIELDS, answers, strict=False):
        if isinstance(answer, ApiError):
            log.warning(
                f"the API server refused the dry-run probe for {gated.feature}; "
                "taking them as not kept",
                extra=kv(node=node_name, gate=gated.gate, error=str(answer)),
            )
            dropped.add(gated.gate)
        elif not gated.used_by(answer.get("spec") or {}):
            dropped.add(gated.gate)
    none_answer = answers[-1]
    # A 1.34 server refuses it ("Unsupported value: "None""); the guard says so when it
    # matters.
    effect_none = (
        "DRADeviceTaints" not in dropped
        and not isinstance(none_answer, ApiError)
        and GATED_FIELDS[0].used_by(none_answer.get("spec") or {})
    )
    return Capabilities(
        version=str(version.get("gitVersion") or "unknown"),
        dropped=frozenset(dropped),
        effect_none=effect_none,
    )


async def _probe_answer(client: Client, body: _Obj) -> "_Obj | ApiError":
    """The dry run's answer, or the error of a refused probe (a 4xx: permanent); raises
    what is worth a retry."""
    try:
        return await _dry_run(client, body)
    except ApiError as exc:
        if isinstance(exc, RetryableError):
            raise
        return exc


async def _dry_run(client: Client, body: _Obj) -> _Obj:
    return await client.create(RESOURCE_SLICES, body, query=[("dryRun", "All")])


def fit(
    desired: Iterable[_Obj], dropped: frozenset[str], *, effect_none: bool = True
) -> tuple[list[_Obj], dict[str, int]]:
    """Pure: the desired slices without what the server drops, and per gate the
    number of devices left out (or stripped of the field); without ``effect_none``,
    the devices' informational taints are left off (counted under EFFECT_NONE)."""
    gated = [g for g in GATED_FIELDS if g.gate in dropped]
    counts = {g.gate: 0 for g in gated}
    strip_none = not effect_none and "DRADeviceTaints" not in dropped
    if strip_none:
        counts[EFFECT_NONE] = 0
    out: list[_Obj] = []
    for obj in desired:
        spec = obj.get("spec") or {}
        informational = strip_none and any(_informational(d) for d in spec.get("devices") or ())
        if not informational and not any(g.used_by(spec) for g in gated):
            out.append(obj)
            continue
        fitted = copy.deepcopy(obj)
        new_spec = fitted["spec"]
        for g in gated:
            for field in g.spec_fields:
                new_spec.pop(field, None)
        devices = []
        for device in new_spec.get("devices") or ():
            hits = [g for g in gated if g.used_by_device(device)]
            for g in hits:
                counts[g.gate] += 1
            if any(_needed(g, device) for g in hits):
                continue
            for g in hits:
                for field in g.device_fields:
                    device.pop(field, None)
                for capacity in (device.get("capacity") or {}).values():
                    if isinstance(capacity, dict):
                        capacity.pop("requestPolicy", None)
            if strip_none and _informational(device):
                counts[EFFECT_NONE] += 1
                kept = [t for t in device["taints"] if t.get("effect") != "None"]
                if kept:
                    device["taints"] = kept
                else:
                    device.pop("taints")
            devices.append(device)
        if "devices" in new_spec or not new_spec.get("sharedCounters"):
            new_spec["devices"] = devices
        out.append(fitted)
    return _without_empty(out), counts


def _needed(gated: GatedField, device: _Obj) -> bool:
    """Whether ``device`` is unsafe to publish without ``gated``'s fields."""
    if gated.gate == "DRADeviceTaints":
        # Informational taints (effect None: an application XID, an unmonitored GPU)
        # change no allocation; the device stays, published without them.
        return any(t.get("effect") != "None" for t in device.get("taints") or ())
    return gated.leave_out


def _informational(device: _Obj) -> bool:
    return any(t.get("effect") == "None" for t in device.get("taints") or ())


def _without_empty(slices: list[_Obj]) -> list[_Obj]:
    """Slices left with nothing (a counters slice of a server without counters) go, but a
    pool keeps at least one slice, so it is published (empty) rather than left stale."""
    kept = [s for s in slices if s["spec"].get("devices") or s["spec"].get("sharedCounters")]
    pools = {s["spec"]["pool"]["name"] for s in kept}
    for s in slices:
        pool = s["spec"]["pool"]["name"]
        if pool not in pools:
            kept.append(s)
            pools.add(pool)
    return kept


class CapabilityGuard:
    """Learns the server's capabilities on first need and fits desired slices to them."""

    def __init__(self, client: Client, *, driver_name: str, node_name: str) -> None:
        self._client = client
        self._driver = driver_name
        self._node = node_name
        self._capabilities: Capabilities | None = None
        self._reported: set[str] = set()

    @property
    def capabilities(self) -> Capabilities | None:
        return self._capabilities

    async def learn(self) -> Capabilities:
        """The server's capabilities, probed on the first call; raises what the probe raises."""
        if self._capabilities is None:
            self._capabilities = await probe(
                self._client, driver_name=self._driver, node_name=self._node
            )
            log.info(
                "learned the API server's capabilities",
                extra=kv(
                    node=self._node,
                    server_version=self._capabilities.version,
                    gates_off=",".join(sorted(self._capabilities.dropped)) or "none",
                    taint_effect_none=self._capabilities.effect_none,
                ),
            )
        return self._capabilities

    async def recheck(self) -> bool:
        """True when the server's version is no longer the one learned, which is then
        forgotten (a control-plane upgrade or rollback; the next fit learns again).

        For after a reconnect: an upgrade restarts the API server, which ends every watch.
        Raises what the version read raises.
        """
        if self._capabilities is None:
            return False
        found = await self._client.get_json("/version", resource="/version")
        version = str(found.get("gitVersion") or "unknown")
        if version == self._capabilities.version:
            return False
        log.info(
            "the API server's version changed; learning its capabilities again",
            extra=kv(node=self._node, was=self._capabilities.version, server_version=version),
        )
        self._capabilities = None
        self._reported.clear()
        return True

    async def fit(self, desired: list[_Obj]) -> list[_Obj]:
        """``desired`` as this server will keep it; raises what the probe raises."""
        if not uses_gated_fields(desired):
            return desired
        caps = await self.learn()
        fitted, counts = fit(desired, caps.dropped, effect_none=caps.effect_none)
        if counts.get(EFFECT_NONE) and EFFECT_NONE not in self._reported:
            self._reported.add(EFFECT_NONE)
            log.warning(
                "the API server does not accept taint effect None (Kubernetes 1.35 adds it): "
                "informational taints are left off; the devices are published without them",
                extra=kv(node=self._node, server_version=caps.version, devices=counts[EFFECT_NONE]),
            )
        for g in GATED_FIELDS:
            if counts.get(g.gate) and g.gate not in self._reported:
                self._reported.add(g.gate)
                fallback = "left out" if g.leave_out else f"published without {g.feature}"
                log.warning(
                    f"the API server drops {g.feature} (feature gate {g.gate} is off): "
                    f"devices that need them are {fallback}",
                    extra=kv(
                        node=self._node,
                        server_version=caps.version,
                        gate=g.gate,
                        devices=counts[g.gate],
                    ),
                )
        return fitted
