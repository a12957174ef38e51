"""The scheduler's part, played with the allocator behind ``gpu-dra explain``.

For one pod: read the live slices, classes and allocated claims, try each of the
pod's unallocated claims on every node, pick a node where all of them fit (the one
with the largest share of free devices, as a least-allocated score would), and
write ``status.allocation`` plus ``reservedFor`` through the claim's status
subresource. A claim that is already allocated (shared by several pods) pins the
pod to its node and only gains a ``reservedFor`` entry.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.allocation import Cluster, Explanation, explain_claim
from tools.allocation.inputs import Inputs, read_cluster


@dataclass
class ClaimOutcome:
    claim: dict[str, Any]
    # None when the claim was already allocated before this pod (a shared claim).
    explanation: Explanation | None
    allocation: dict[str, Any] | None = None
    devices: list[str] = field(default_factory=list)


@dataclass
class PodOutcome:
    pod: str
    node: str | None
    claims: list[ClaimOutcome]
    reason: str = ""  # why the pod cannot be scheduled, when node is None


def claim_key(claim: Mapping[str, Any]) -> str:
    meta = claim["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def allocated_node(claim: Mapping[str, Any]) -> str | None:
    """The node a node-local allocation pins the claim to."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for requirement in term.get("matchFields") or ():
            values: list[Any] = requirement.get("values") or []
            if requirement.get("key") == "metadata.name" and len(values) == 1:
                return str(values[0])
    return None


def free_share(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
) -> dict[str, float]:
    """Node -> the fraction of its node-local devices that no claim holds (pure)."""
    owner: dict[tuple[str, str, str], str] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            continue
        for device in spec.get("devices") or ():
            owner[(spec["driver"], spec["pool"]["name"], device["name"])] = node
    total: dict[str, int] = {}
    for node in owner.values():
        total[node] = total.get(node, 0) + 1
    used: dict[str, int] = dict.fromkeys(total, 0)
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            node = owner.get((result["driver"], result["pool"], result["device"]))
            if node is not None and not result.get("adminAccess"):
                used[node] += 1
    return {node: 1 - used[node] / count for node, count in total.items()}


def rank(nodes: Iterable[str], free: Mapping[str, float]) -> list[str]:
    """Most free share first, then by name, so the outcome is reproducible."""
    return sorted(nodes, key=lambda n: (-free.get(n, 0.0), n))


def _reserved_for(pod: Mapping[str, Any]) -> dict[str, str]:
    # Core-group resources leave apiGroup empty.
    return {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


def _explain(
    claim: Mapping[str, Any],
    inputs: Inputs,
    cluster: Cluster,
    allocated: Sequence[Mapping[str, Any]],
) -> Explanation:
    return explain_claim(claim, slices=cluster, classes=inputs.classes, allocated=allocated)


def _devices(allocation: Mapping[str, Any]) -> list[str]:
    return [str(r["device"]) for r in (allocation.get("devices") or {}).get("results") or ()]


def place(pod: Mapping[str, Any], claims: Sequence[dict[str, Any]], inputs: Inputs) -> PodOutcome:
    """Choose a node and the allocations for ``pod``'s claims (pure: nothing is modified)."""
    name = pod["metadata"]["name"]
    cluster = Cluster(inputs.slices, node_labels=inputs.node_labels)
    existing = {claim_key(c): (c.get("status") or {}).get("allocation") for c in claims}
    pinned = {n for c in claims if existing[claim_key(c)] for n in [allocated_node(c)] if n}
    first = {
        claim_key(c): _explain(c, inputs, cluster, inputs.claims)
        for c in claims
        if not existing[claim_key(c)]
    }
    candidates = set(cluster.node_names)
    for explanation in first.values():
        candidates &= {n for n in explanation.allocatable_nodes if n is not None}
    if pinned:
        candidates &= pinned
    for node in rank(candidates, free_share(inputs.slices, inputs.claims)):
        allocated = list(inputs.claims)
        outcomes: list[ClaimOutcome] = []
        for claim in claims:
            key = claim_key(claim)
            allocation = existing[key]
            if allocation:
                outcomes.append(ClaimOutcome(claim, None, allocation, _devices(allocation)))
                continue
            explanation = first[key]
            if len(allocated) > len(inputs.claims):
                # A later claim of the same pod must fit next to what the earlier ones took.
                explanation = _explain(claim, inputs, cluster, allocated)
            verdict = explanation.node(node)
            if not verdict.allocatable or verdict.allocation is None:
                break
            allocated.append({**claim, "status": {"allocation": verdict.allocation}})
            outcomes.append(
                ClaimOutcome(claim, first[key], verdict.allocation, _devices(verdict.allocation))
            )
        else:
            return PodOutcome(name, node, outcomes)
    reason = "no node fits all of its claims"
    if pinned and not candidates:
        reason = f"its shared claim is allocated on {', '.join(sorted(pinned))}"
    return PodOutcome(
        name, None, [ClaimOutcome(c, first.get(claim_key(c))) for c in claims], reason
    )


async def schedule(
    api: Any, pod: Mapping[str, Any], claims: Sequence[dict[str, Any]]
) -> PodOutcome:
    """Place the pod and, if it fits, write each claim's allocation and reservation."""
    from kubernetes.aio import client

    outcome = place(pod, claims, await read_cluster(api))
    if outcome.node is None:
        return outcome
    resource: Any = client.ResourceV1Api(api)
    for entry in outcome.claims:
        claim = dict(entry.claim)
        status = dict(claim.get("status") or {})
        status["allocation"] = entry.allocation
        status["reservedFor"] = [*(status.get("reservedFor") or ()), _reserved_for(pod)]
        claim["status"] = status
        meta = claim["metadata"]
        written = await resource.replace_namespaced_resource_claim_status(
            meta["name"], meta["namespace"], claim
        )
        entry.claim = api.sanitize_for_serialization(written)
    return outcome
