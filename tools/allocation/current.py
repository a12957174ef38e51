"""What an allocated claim holds now, read from its status: which device each request got,
and what the node's plugin says of it (pure).

``status.allocation`` names the devices; ``status.devices`` (``AllocatedDeviceStatus``, GA in
1.37) is where the kubelet plugin that prepared one writes its ``data`` (this driver: the
device's kind and scalar attributes, the GPU's UUID, product name and PCI bus ID among them,
its sharing settings) and a ``Ready`` condition that turns False on an XID. A device without
an entry has not been prepared (no pod on the node started with it yet), or the cluster keeps
no entries (before 1.37 without the DRAResourceClaimDeviceStatus gate).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HeldDevice:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    data: Mapping[str, Any] | None = None  # the status.devices entry's data, if any
    ready: Mapping[str, Any] | None = None  # its Ready condition, if any

    @property
    def attributes(self) -> Mapping[str, Any]:
        attributes: Mapping[str, Any] = (self.data or {}).get("attributes") or {}
        return attributes

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.share_id:
            out["shareID"] = self.share_id
        out["data"] = dict(self.data) if self.data is not None else None
        out["ready"] = dict(self.ready) if self.ready is not None else None
        return out


@dataclass(frozen=True, slots=True)
class CurrentAllocation:
    """The allocation of the claim as it is in the cluster."""

    node: str | None  # the node its node selector names, or None (shared devices)
    devices: tuple[HeldDevice, ...]
    reserved_for: tuple[str, ...]  # "pods/<name>": the consumers status.reservedFor lists

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "devices": [d.to_json() for d in self.devices],
            "reservedFor": list(self.reserved_for),
        }


def current_allocation(claim: Mapping[str, Any]) -> CurrentAllocation | None:
    """The claim's allocation and device status, or None when it is not allocated."""
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        return None
    entries: dict[tuple[str, str, str, str], Mapping[str, Any]] = {}
    for entry in status.get("devices") or ():
        if isinstance(entry, Mapping):
            key = (
                str(entry.get("driver")),
                str(entry.get("pool")),
                str(entry.get("device")),
                str(entry.get("shareID") or ""),
            )
            entries[key] = entry
    held = []
    for result in (allocation.get("devices") or {}).get("results") or ():
        share = str(result.get("shareID") or "")
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")), share)
        entry = entries.get(key) or {}
        conditions = entry.get("conditions") or ()
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        held.append(
            HeldDevice(
                request=str(result.get("request")),
                driver=key[0],
                pool=key[1],
                device=key[2],
                share_id=share or None,
                data=entry.get("data") if entry else None,
                ready=ready,
            )
        )
    reserved = tuple(
        f"{r.get('resource')}/{r.get('name')}" for r in status.get("reservedFor") or ()
    )
    return CurrentAllocation(_node(allocation.get("nodeSelector")), tuple(held), reserved)


def _node(selector: Any) -> str | None:
    """The node of a ``metadata.name`` node selector, as the scheduler writes one for
    node-local devices."""
    if not isinstance(selector, Mapping):
        return None
    for term in selector.get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            values = field.get("values") or []
            named = field.get("key") == "metadata.name" and field.get("operator") == "In"
            if named and len(values) == 1:
                return str(values[0])
    return None
