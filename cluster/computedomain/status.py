"""A ComputeDomain's status from its daemons: pure.

NVIDIA's rules (``cmd/compute-domain-controller/cdstatus.go`` and ``computedomain.go``, with the
gate ComputeDomainCliques on, its default since v0.3):

* ``status.nodes`` is every daemon of the domain's cliques (the daemons write themselves there:
  node name, IP, clique, DNS index, Ready when their pod is), plus one entry per daemon pod
  whose clique label is explicitly empty (a node without a clique: no IMEX runs there), with
  index -1 and Ready when the pod's Ready condition is True; such a pod without a node or an IP
  is left out;
* ``status.status`` is NotReady while fewer nodes are listed than ``spec.numNodes`` or any listed
  node is NotReady, else Ready: a domain with ``numNodes: 0`` and no daemons is Ready.

Two differences, both so that a status once written reads back equal and is not written again:
a daemon entry without a status is taken as NotReady (the CRD's default, which the API server
writes into it anyway; NVIDIA counts it Ready), and the nodes are sorted by name (a list-map
keyed by name; NVIDIA compares them as a map too). A third: a pod counts only when the domain's
DaemonSet controls it (:func:`of_daemon_set`), not by its label alone, which anyone who may
create a pod in the driver's namespace can set (a node's kubelet plugin, for its MPS daemons).
"""

from collections.abc import Iterable, Mapping

from driver.common.wire import Obj
from drivers.computedomain import names


def has_clique_label(pod: Obj) -> bool:
    """A pod that labelled itself with a clique, or has not labelled itself yet (NVIDIA counts
    both as fabric-attached); False only for the explicit empty clique."""
    labels = pod.get("metadata", {}).get("labels") or {}
    return labels.get(names.CLIQUE_LABEL) != ""


def of_daemon_set(pods: Iterable[Obj], daemon_set: Obj | None) -> list[Obj]:
    """The pods ``daemon_set`` controls (their controller owner reference names it, UID
    included: one of the same name made again is another); none without a DaemonSet."""
    if daemon_set is None:
        return []
    meta = daemon_set["metadata"]
    uid, namespace = meta.get("uid"), meta.get("namespace")
    return [
        pod
        for pod in pods
        if pod.get("metadata", {}).get("namespace") == namespace
        and any(
            ref.get("controller") is True
            and ref.get("kind") == "DaemonSet"
            and str(ref.get("apiVersion") or "").startswith("apps/")
            and ref.get("uid") == uid
            for ref in pod.get("metadata", {}).get("ownerReferences") or ()
        )
    ]


def pod_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _entry(daemon: Mapping[str, object]) -> Obj:
    return {
        "name": str(daemon.get("nodeName") or ""),
        "ipAddress": str(daemon.get("ipAddress") or ""),
        "cliqueID": str(daemon.get("cliqueID") or ""),
        "index": daemon.get("index", 0),
        "status": str(daemon.get("status") or names.NOT_READY),
    }


def nodes(cliques: Iterable[Obj], pods: Iterable[Obj], stale: Mapping[str, set[str]]) -> list[Obj]:
    """``status.nodes``; ``pods``: the DaemonSet's (:func:`of_daemon_set`); ``stale``: clique
    name -> node names whose entries are about to be removed (:func:`stale_daemons`), left out
    here already."""
    found: dict[str, Obj] = {}
    for clique in cliques:
        gone = stale.get(clique["metadata"]["name"], set())
        for daemon in clique.get("daemons") or ():
            if daemon.get("nodeName") and daemon["nodeName"] not in gone:
                found[str(daemon["nodeName"])] = _entry(daemon)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        ip = (pod.get("status") or {}).get("podIP")
        if has_clique_label(pod) or not node or not ip:
            continue
        status = names.READY if pod_ready(pod) else names.NOT_READY
        found[str(node)] = {
            "name": str(node),
            "ipAddress": str(ip),
            "cliqueID": "",
            "index": -1,
            "status": status,
        }
    return [found[name] for name in sorted(found)]


def overall(listed: list[Obj], num_nodes: int) -> str:
    """``status.status`` from ``status.nodes`` and ``spec.numNodes`` (NVIDIA's
    calculateGlobalStatus)."""
    if len(listed) < num_nodes:
        return names.NOT_READY
    if any(n.get("status") == names.NOT_READY for n in listed):
        return names.NOT_READY
    return names.READY


def num_nodes(domain: Obj) -> int:
    value = (domain.get("spec") or {}).get("numNodes") or 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def stale_daemons(clique: Obj, pods: Iterable[Obj], pods_seen: int) -> set[str]:
    """Node names of the clique's daemons that no daemon pod of the domain runs on (NVIDIA's
    cleanupClique): a daemon that died without removing its entry.

    Only when the pod watch has seen at least as far as the clique's own resourceVersion: a
    daemon writes its entry after its pod exists, so a pod watch behind the clique watch could
    miss a live pod and take its fresh entry for a dead one (NVIDIA's controller has that race;
    the daemon then adds itself again, one write each way).
    """
    version = resource_version(clique)
    if version < 0 or pods_seen < version:
        return set()
    running = {
        str(p.get("spec", {}).get("nodeName")) for p in pods if p.get("spec", {}).get("nodeName")
    }
    listed = {str(d.get("nodeName") or "") for d in clique.get("daemons") or ()}
    return listed - running


def resource_version(obj: Obj) -> int:
    """The object's resourceVersion as an integer, -1 when it is not one. Opaque to clients in
    principle; etcd's are integers, one counter across resources, which client-go's mutation
    cache relies on as well."""
    text = str(obj.get("metadata", {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else -1


def same_nodes(observed: Iterable[Obj], wanted: Iterable[Obj]) -> bool:
    """Equal as a map by name (the list-map's key), as NVIDIA compares them."""
    return {n.get("name"): n for n in observed} == {n.get("name"): n for n in wanted}
