"""This daemon's entry in its domain's ComputeDomainClique: pure.

NVIDIA's clique manager (``cmd/compute-domain-daemon/cdclique.go``, gate ComputeDomainCliques):
each daemon of a domain writes itself into the clique object ``<cdUID>.<cliqueID>`` in the
driver's namespace, creating it when it is the first, and its peers read the clique to find each
other; the controller builds the domain's status from the same entries. An entry is keyed by
node name and holds the daemon's address, clique, DNS index and readiness (its pod's Ready
condition). The functions here give the clique as it should be after this daemon's change, or
None when it already is, so the shell writes only on a change.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.common.errors import RetryableError
from driver.common.wire import Obj
from drivers.computedomain import names


@dataclass(frozen=True, slots=True)
class Member:
    """Who this daemon is: the domain, the clique, and its own pod (downward API)."""

    namespace: str
    domain_uid: str
    clique_id: str
    node_name: str
    pod_name: str
    pod_uid: str
    pod_ip: str
    max_nodes: int = names.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN

    @property
    def clique_name(self) -> str:
        return names.clique_name(self.domain_uid, self.clique_id)


class NoIndexError(RetryableError):
    """Every DNS index below the domain's size is taken; one frees when a daemon leaves."""


def pod_ready(pod: Mapping[str, Any] | None) -> bool:
    """NVIDIA's rule for the entry's status: the pod Running with its Ready condition True."""
    status = (pod or {}).get("status") or {}
    if status.get("phase") != "Running":
        return False
    conditions = status.get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _owner(member: Member) -> Obj:
    # Each daemon pod owns the clique, so the garbage collector removes it once all are gone.
    return {"apiVersion": "v1", "kind": "Pod", "name": member.pod_name, "uid": member.pod_uid}


def new_clique(member: Member, ready: bool) -> Obj:
    """The clique as its first daemon creates it, holding that daemon alone at index 0."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.CLIQUE_KIND,
        "metadata": {
            "name": member.clique_name,
            "namespace": member.namespace,
            "labels": {
                names.COMPUTE_DOMAIN_LABEL: member.domain_uid,
                names.CLIQUE_LABEL: member.clique_id,
            },
            "ownerReferences": [_owner(member)],
        },
        "daemons": [_entry(member, 0, ready)],
    }


def _entry(member: Member, index: int, ready: bool) -> Obj:
    return {
        "nodeName": member.node_name,
        "ipAddress": member.pod_ip,
        "cliqueID": member.clique_id,
        "index": index,
        "status": names.READY if ready else names.NOT_READY,
    }


def _free_index(daemons: list[Obj], member: Member) -> int:
    taken = {d.get("index") for d in daemons if d.get("nodeName") != member.node_name}
    for index in range(member.max_nodes):
        if index not in taken:
            return index
    raise NoIndexError(
        f"no available indices within maxNodesPerIMEXDomain ({member.max_nodes}): "
        f"clique {member.clique_name} lists {len(taken)} other daemons"
    )


def joined(clique: Obj, member: Member, ready: bool) -> Obj | None:
    """``clique`` with this daemon's entry current (address, clique, status) and its pod among
    the owners; None when nothing changes. A daemon keeps its index across restarts and new
    pods on the same node; a new node takes the lowest free one."""
    daemons: list[Obj] = [dict(d) for d in clique.get("daemons") or ()]
    mine = next((d for d in daemons if d.get("nodeName") == member.node_name), None)
    if mine is None:
        wanted = _entry(member, _free_index(daemons, member), ready)
        daemons.append(wanted)
    else:
        index = mine.get("index")
        if not isinstance(index, int) or not 0 <= index < member.max_nodes:
            index = _free_index(daemons, member)
        mine.update(_entry(member, index, ready))
    meta = dict(clique.get("metadata") or {})
    owners = list(meta.get("ownerReferences") or ())
    if not any(o.get("uid") == member.pod_uid for o in owners):
        owners.append(_owner(member))
    if daemons == (clique.get("daemons") or []) and owners == (meta.get("ownerReferences") or []):
        return None
    meta["ownerReferences"] = owners
    return {**clique, "metadata": meta, "daemons": daemons}


def left(clique: Obj, member: Member) -> Obj | None:
    """``clique`` without this daemon's entries (NVIDIA removes those with its pod's address),
    of its own node only: the chart's admission policy lets a daemon write no other node's
    entry, and a stale one at a reused address is the controller's to remove. None when it
    holds none."""
    daemons = clique.get("daemons") or []
    kept = [
        d
        for d in daemons
        if d.get("ipAddress") != member.pod_ip or d.get("nodeName") != member.node_name
    ]
    if len(kept) == len(daemons):
        return None
    return {**clique, "daemons": kept}
