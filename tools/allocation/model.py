"""The explanation model: what the allocator decided for each node, and why.

Plain frozen data with a ``to_json`` each; the JSON shape is the stable output
of ``gpu-dra explain -o json`` (documented in :mod:`cli.explain`).
"""

from dataclasses import dataclass, field
from typing import Any

from tools.allocation.current import CurrentAllocation


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """One allocated device, as in ``status.allocation.devices.results[]``."""

    request: str  # "req" or "req/sub" for a firstAvailable subrequest
    driver: str
    pool: str
    device: str
    # A share of a device with allowMultipleAllocations: what it consumes, per capacity.
    consumed_capacity: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.consumed_capacity is not None:
            out["consumedCapacity"] = dict(self.consumed_capacity)
        return out


@dataclass(frozen=True, slots=True)
class NodeExplanation:
    """The outcome on one node: the devices it would get, or every reason it cannot."""

    node: str | None  # None: no node-local pools were given, only shared ones
    allocatable: bool
    results: tuple[DeviceResult, ...] = ()
    reasons: tuple[str, ...] = ()
    # status.allocation as the scheduler would write it; None when not allocatable.
    allocation: dict[str, Any] | None = None
    steps: int = 0  # search steps spent on this node
    # The error the scheduler's Allocate returns here (a CEL runtime error, an unknown
    # class, ...): it gives up on the claim instead of trying the node. None when the
    # claim merely does not fit. Not in to_json: the reasons already say it.
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.node,
            "allocatable": self.allocatable,
            "results": [r.to_json() for r in self.results],
            "reasons": list(self.reasons),
        }
        if self.allocation is not None:
            out["allocation"] = self.allocation
        return out


@dataclass(frozen=True, slots=True)
class ClaimRef:
    kind: str  # "ResourceClaim", "ResourceClaimTemplate" or "" for a bare spec
    namespace: str | None
    name: str | None

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name}

    def __str__(self) -> str:
        name = self.name or "<unnamed>"
        qualified = f"{self.namespace}/{name}" if self.namespace else name
        return f"{self.kind} {qualified}" if self.kind else qualified


@dataclass(frozen=True, slots=True)
class Explanation:
    """Per-node outcomes for one claim, nodes sorted by name."""

    claim: ClaimRef
    nodes: tuple[NodeExplanation, ...]
    # Claim-level problems (unknown class, selector that does not compile): they
    # also appear in every node's reasons, and here when there is no node at all.
    problems: tuple[str, ...] = ()
    # One line for the most common cause when no node can take the claim, else None.
    advice: str | None = None
    # What the claim of that name holds in the cluster (explain --cluster), else None.
    current: CurrentAllocation | None = None

    @property
    def allocatable_nodes(self) -> list[str | None]:
        return [n.node for n in self.nodes if n.allocatable]

    def node(self, name: str | None) -> NodeExplanation:
        for entry in self.nodes:
            if entry.node == name:
                return entry
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "claim": self.claim.to_json(),
            "problems": list(self.problems),
            "summary": {
                "nodes": len(self.nodes),
                "allocatable": sum(1 for n in self.nodes if n.allocatable),
            },
            "nodes": [n.to_json() for n in self.nodes],
            "advice": self.advice,
            "allocated": self.current.to_json() if self.current is not None else None,
        }


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    """Whether a DeviceClass selects one device, and if not, what decided it; for a selected
    device, the taints that keep it from a claim without tolerations (or None)."""

    node: str | None
    driver: str
    pool: str
    device: str
    selected: bool
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
            "selected": self.selected,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ClassListing:
    """Every published device, judged against one DeviceClass's selectors."""

    device_class: str
    devices: tuple[DeviceVerdict, ...]
    problems: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "deviceClass": self.device_class,
            "problems": list(self.problems),
            "summary": {
                "devices": len(self.devices),
                "selected": sum(1 for d in self.devices if d.selected),
            },
            "devices": [d.to_json() for d in self.devices],
        }
