"""Device health from NVML events: pure functions and one value type, no I/O.

Each GPU (by UUID) carries at most one taint per key, with NVIDIA's keys: a
fatal XID is ``gpu.nvidia.com/xid=<n>`` NoSchedule, an XID NVIDIA documents as
an application error the same key with effect None (informational), a lost GPU
``gpu.nvidia.com/gpu-lost`` NoSchedule, and a GPU whose events cannot be
registered ``gpu.nvidia.com/unmonitored`` None. A later event never weakens a
taint: an application XID after XID 79 leaves the NoSchedule taint as it is.

NVML reports events per physical GPU. On a GPU in MIG mode, whose published devices are
its MIG devices, :func:`placed` moves each event onto the MIG devices it concerns (keyed
by MIG UUID from then on): an XID naming a GPU instance (and compute instance) hits the
MIG devices of that instance only; one naming none, a lost GPU, or a GPU that cannot be
monitored hits every MIG device of the GPU.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

XID_KEY = "gpu.nvidia.com/xid"
GPU_LOST_KEY = "gpu.nvidia.com/gpu-lost"
UNMONITORED_KEY = "gpu.nvidia.com/unmonitored"
# NVIDIA's "application errors; GPU should still be healthy" (the k8s-device-plugin
# list, docs.nvidia.com/deploy/xid-errors): 13 graphics engine exception, 31 memory
# page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
# exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# A double-bit ECC event is what XID 48 reports; it gets that XID's taint.
DOUBLE_BIT_ECC_XID = 48
# Automatic recovery (off by default) may clear only these: XIDs whose immediate action in
# NVIDIA's XID catalog is RESTART_APP (the GPU itself needs nothing) and that the ignore list
# does not already make informational: 8 GPU stopped processing (idle timeout), 11 invalid
# or corrupted push buffer stream.
DEFAULT_RECOVERABLE_XIDS = frozenset({8, 11})
# Never cleared automatically, whatever is configured: 79 (fallen off the bus) and 48
# (double-bit ECC) need a reset or a repair. A lost GPU has no XID and is never recovered.
NEVER_RECOVERABLE_XIDS = frozenset({DOUBLE_BIT_ECC_XID, 79})

Effect = Literal["NoSchedule", "None"]
Health = Literal["Healthy", "Unhealthy", "Unknown"]


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: Effect

    def published(self) -> dict[str, str]:
        # No timeAdded: the server stamps it, and the publisher keeps the stamp.
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True, slots=True)
class Xid:
    uuid: str
    xid: int
    # On a MIG-mode GPU, the GPU and compute instance NVML names; None: the whole GPU
    # (NVML's 0xFFFFFFFF), or the whole GPU instance for ``ci``.
    gi: int | None = None
    ci: int | None = None


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """A published MIG device: its UUID and the GPU and compute instance it is."""

    uuid: str  # what its taints are kept by
    # None: a dynamic MIG placement with no instance yet, which only whole-GPU events hit.
    gi: int | None
    ci: int | None


@dataclass(frozen=True, slots=True)
class GpuLost:
    uuid: str


@dataclass(frozen=True, slots=True)
class Unmonitored:
    uuid: str
    reason: str


Event = Xid | GpuLost | Unmonitored
Taints = Mapping[str, tuple[Taint, ...]]
# Parent GPU UUID -> its MIG devices, for the GPUs in MIG mode only.
Placements = Mapping[str, Sequence[MigPlacement]]


def placed(events: Iterable[Event], migs: Placements) -> tuple[list[Event], list[Xid]]:
    """``events`` on the devices they concern, and the XIDs naming an instance that is
    not published (created after discovery, or gone): those taint nothing."""
    out: list[Event] = []
    unplaced: list[Xid] = []
    for event in events:
        devices = migs.get(event.uuid)
        if not devices:  # a whole GPU: it is the device, whatever the event names
            out.append(event)
            continue
        hit = list(devices)
        if isinstance(event, Xid) and event.gi is not None:
            hit = [m for m in devices if m.gi == event.gi and event.ci in (None, m.ci)]
            if not hit:
                unplaced.append(event)
        out.extend(replace(event, uuid=m.uuid) for m in hit)
    return out, unplaced


def parse_xids(text: str) -> frozenset[int]:
    """``"13,31, 43"`` as a set; raises ValueError naming a malformed entry."""
    out = set()
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            value = int(item.strip(), 10)
        except ValueError:
            raise ValueError(f"not an XID number: {item.strip()!r}") from None
        if value < 0:
            raise ValueError(f"not an XID number: {value}")
        out.add(value)
    return frozenset(out)


def taint_of(event: Event, ignored: frozenset[int]) -> Taint:
    if isinstance(event, Xid):
        effect: Effect = "None" if event.xid in ignored else "NoSchedule"
        return Taint(XID_KEY, str(event.xid), effect)
    if isinstance(event, GpuLost):
        return Taint(GPU_LOST_KEY, "", "NoSchedule")
    return Taint(UNMONITORED_KEY, "", "None")


def apply(
    taints: Taints, events: Iterable[Event], ignored: frozenset[int]
) -> dict[str, tuple[Taint, ...]]:
    """``taints`` after ``events``, in order; equal to ``taints`` when nothing changed."""
    out = {uuid: tuple(ts) for uuid, ts in taints.items()}
    for event in events:
        new = taint_of(event, ignored)
        current = {t.key: t for t in out.get(event.uuid, ())}
        old = current.get(new.key)
        if old is not None and old.effect == "NoSchedule" and new.effect == "None":
            continue  # never weaken
        current[new.key] = new
        out[event.uuid] = tuple(sorted(current.values(), key=lambda t: t.key))
    return out


def health_of(taints: Iterable[Taint]) -> tuple[Health, str]:
    """The kubelet's view of a GPU with ``taints``, and why."""
    ts = list(taints)
    fatal = [t for t in ts if t.effect == "NoSchedule"]
    if fatal:
        return "Unhealthy", "; ".join(_describe(t) for t in fatal)
    if any(t.key == UNMONITORED_KEY for t in ts):
        return "Unknown", "NVML events cannot be registered for this GPU"
    return "Healthy", "; ".join(_describe(t) for t in ts)


def _describe(taint: Taint) -> str:
    if taint.key == XID_KEY:
        return f"XID {taint.value} reported by NVML"
    if taint.key == GPU_LOST_KEY:
        return "GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    return taint.key


def parse_recoverable_xids(text: str) -> frozenset[int]:
    """As :func:`parse_xids`; ValueError for an XID that is never recovered automatically."""
    xids = parse_xids(text)
    never = sorted(xids & NEVER_RECOVERABLE_XIDS)
    if never:
        raise ValueError(f"XIDs {never} are never recovered automatically (a reset is needed)")
    return xids


def recoverable(taints: Iterable[Taint], xids: frozenset[int]) -> bool:
    """True when the device is unschedulable only for XIDs of ``xids``: healthy probes may
    then clear it. Never for a lost GPU, nor for an XID of NEVER_RECOVERABLE_XIDS."""
    fatal = [t for t in taints if t.effect == "NoSchedule"]
    allowed = {str(x) for x in xids - NEVER_RECOVERABLE_XIDS}
    return bool(fatal) and all(t.key == XID_KEY and t.value in allowed for t in fatal)


def recovered(taints: Taints, uuids: Iterable[str]) -> dict[str, tuple[Taint, ...]]:
    """Without the NoSchedule taints of ``uuids`` (which :func:`recoverable` allowed);
    informational taints stay, they never made the device unschedulable."""
    drop = set(uuids)
    out: dict[str, tuple[Taint, ...]] = {}
    for uuid, ts in taints.items():
        if uuid in drop:
            ts = tuple(t for t in ts if t.effect != "NoSchedule")
        if ts:
            out[uuid] = ts
    return out


def cleared(taints: Taints, uuids: Iterable[str] | None) -> dict[str, tuple[Taint, ...]]:
    """Without the taints of ``uuids`` (all when None); unmonitored marks stay, they are
    re-derived at every registration rather than set by an event an admin saw."""
    drop = None if uuids is None else set(uuids)
    out: dict[str, tuple[Taint, ...]] = {}
    for uuid, ts in taints.items():
        if drop is None or uuid in drop:
            ts = tuple(t for t in ts if t.key == UNMONITORED_KEY)
        if ts:
            out[uuid] = ts
    return out


def dumps(taints: Taints) -> str:
    """The persisted form. Unmonitored marks are left out: each start registers again
    and finds out afresh, so a GPU that became monitorable is not stuck Unknown."""
    body = {
        uuid: kept
        for uuid, ts in sorted(taints.items())
        if (kept := [t.published() for t in ts if t.key != UNMONITORED_KEY])
    }
    return json.dumps({"version": 1, "taints": body}, indent=1, sort_keys=True)


def loads(text: str) -> dict[str, tuple[Taint, ...]]:
    """The taints of :func:`dumps`; ValueError for anything else, a torn or truncated
    file included: none of it may be read as "no taints"."""
    data: Any = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise ValueError("not a health state file of version 1")
    body = data.get("taints")
    if not isinstance(body, dict):
        raise ValueError(f"taints: an object of GPU UUIDs expected, not {type(body).__name__}")
    out: dict[str, tuple[Taint, ...]] = {}
    for uuid, items in body.items():
        if not isinstance(items, list):
            raise ValueError(f"{uuid}: a list of taints expected, not {type(items).__name__}")
        taints = []
        for item in items:
            if not isinstance(item, dict):
                raise ValueError(f"{uuid}: a taint object expected, not {type(item).__name__}")
            key, value, effect = item.get("key"), item.get("value"), item.get("effect")
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise ValueError(f"{uuid}: a taint needs a string key and value: {item!r}")
            if effect not in ("NoSchedule", "None"):
                raise ValueError(f"{uuid}: unknown taint effect {effect!r}")
            taints.append(Taint(key, value, effect))
        out[uuid] = tuple(taints)
    return out
