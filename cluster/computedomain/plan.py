"""The pure core of the controller: which writes bring one ComputeDomain's objects in line.

:func:`plan` takes a domain's UID, what the controller's watches show of it (:class:`Observed`)
and the daemon settings, and returns the writes to send, in order. It is called again after
every write lands in the cache and on every change a watch brings, so each call plans only the
next step: a domain whose objects are as desired plans nothing, which is how the controller
sends no write at rest.

A live domain (NVIDIA's ``onAddOrUpdateDriverManaged``): its finalizer; the daemon template,
then the DaemonSet, then the workload template, each created when missing, its labels and
finalizer restored, a DaemonSet's drifted spec patched (one whose selector drifted, and a
template whose spec differs, immutable fields both, deleted to be made again); an object of the
domain's that someone is deleting loses its finalizer, so it goes and comes back as desired;
the status from the daemons (:mod:`cluster.computedomain.status`), written before the workload
template, whose create may fail for good (its name taken by a template not the domain's, or
refused): then the status is NotReady with a ChannelTemplate condition saying why; clique
entries of daemons that no pod runs any more removed.

A domain being deleted, step by step, each after the last is seen done (NVIDIA's order):

1. delete the workload template, the daemon template and the DaemonSet; remove the domain's
   label from every Node that carries it with this UID (never another domain's: #518);
2. remove the finalizer from the workload templates; once they are gone,
3. from the daemon template and the DaemonSet; once they and the labels are gone,
4. delete the domain's cliques whose daemon pods are gone, and remove the domain's finalizer.

The domain is released without waiting for its daemon pods: they, and through them their
claims and cliques, go with the DaemonSet by garbage collection, and nothing on the node needs
the domain to unprepare them (NVIDIA's #380: pods stuck terminating because their unprepare
looked the domain up). An object labelled with the UID of a domain that no longer exists (its
finalizer removed by hand, or left by an older controller) is deleted the same way, but for a
workload template, whose namespace the gone domain no longer tells: it is only let go.

Only the domain's namespace (its workload template) and the driver's (the daemon template,
DaemonSet, cliques) count: a template elsewhere labelled with the UID is a tenant's, neither
deleted nor waited for.

Every update is a JSON merge patch carrying the observed ``resourceVersion``, so a stale cache
gets a 409 instead of overwriting someone's change; deletes carry UID and resourceVersion
preconditions. The status is the one field this controller alone writes, so its patch carries
no version.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cluster.computedomain import objects, status
from cluster.computedomain.objects import DaemonSettings
from driver.common.wire import Obj
from drivers.computedomain import names

DOMAIN = names.COMPUTE_DOMAINS
DOMAIN_STATUS = f"{names.COMPUTE_DOMAINS}/status"
DAEMON_SETS = "daemonsets"
TEMPLATES = "resourceclaimtemplates"
CLIQUES = names.CLIQUES
NODES = "nodes"
CHANNEL_CONDITION = "ChannelTemplate"  # False while the workload template cannot be made


@dataclass(frozen=True, slots=True)
class Write:
    """One request. ``body``: the object to create, or the merge patch; ``preconditions``: a
    delete's UID and resourceVersion. ``why`` says what it is for, in the log."""

    verb: str  # create, patch or delete
    resource: str  # one of the constants above
    namespace: str  # "" for Nodes
    name: str
    why: str
    body: Obj | None = None
    preconditions: Obj | None = None


@dataclass(frozen=True, slots=True)
class Observed:
    """What the watches show of one domain UID: the domain (None when it does not exist) and
    every object labelled with its UID. ``pods_seen``: the resourceVersion the daemon-pod watch
    has seen up to (see :func:`status.stale_daemons`)."""

    domain: Obj | None
    daemon_sets: tuple[Obj, ...] = ()
    templates: tuple[Obj, ...] = ()
    pods: tuple[Obj, ...] = ()
    cliques: tuple[Obj, ...] = ()
    nodes: tuple[Obj, ...] = ()
    pods_seen: int = 0
    # Why the workload template's last create failed for good, as (reason, message); the
    # shell knows it, the watches cannot show it (the name may be taken by an object that is
    # not the domain's, so not in the view).
    channel_problem: tuple[str, str] | None = None


def plan(uid: str, observed: Observed, settings: DaemonSettings) -> tuple[Write, ...]:
    """The writes for ``uid`` now, in the order to send them; () when nothing is to do."""
    domain = observed.domain
    if domain is None or _deleting(domain):
        return _teardown(uid, observed, settings)
    return _live(uid, domain, observed, settings)


def _templates(
    observed: Observed, settings: DaemonSettings
) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """The domain's workload templates (in its namespace) and daemon templates (in the
    driver's); then the workload templates of a domain that is gone, whose namespace is not
    known any more. A label is anyone's to set: a template elsewhere that carries the UID is a
    tenant's, and counts for nothing (it would hold the domain's deletion, or be deleted)."""
    domain = observed.domain
    home = str(domain["metadata"].get("namespace") or "") if domain is not None else None
    workload, daemon, orphans = [], [], []
    for template in observed.templates:
        namespace = _key(template)[0]
        if _target(template) == names.TARGET_DAEMON:
            if namespace == settings.namespace:
                daemon.append(template)
        elif namespace == home:
            workload.append(template)
        elif home is None:
            orphans.append(template)
    return workload, daemon, orphans


# -- a live domain ---------------------------------------------------------------------------


def _live(uid: str, domain: Obj, observed: Observed, settings: DaemonSettings) -> tuple[Write, ...]:
    writes: list[Write] = []
    meta = domain["metadata"]
    if names.FINALIZER not in (meta.get("finalizers") or ()):
        writes.append(
            _patch(
                DOMAIN,
                domain,
                {"finalizers": [*(meta.get("finalizers") or ()), names.FINALIZER]},
                "add the domain's finalizer",
            )
        )
    workload_templates, daemon_templates, _ = _templates(observed, settings)
    writes += _converge(
        TEMPLATES, objects.daemon_template(domain, settings), daemon_templates, "daemon template"
    )
    desired_set = objects.daemon_set(domain, settings)
    writes += _converge(DAEMON_SETS, desired_set, observed.daemon_sets, "DaemonSet")
    stale = {
        c["metadata"]["name"]: status.stale_daemons(c, observed.pods, observed.pods_seen)
        for c in observed.cliques
    }
    problem = observed.channel_problem
    if problem is not None and any(
        _key(t) == (meta["namespace"], objects.workload_template_name(domain))
        for t in workload_templates
    ):
        problem = None  # it is there now: the failure was a view behind the server
    # The status before the workload template: a create that keeps failing must not keep
    # the user from seeing why.
    daemon_set = next((d for d in observed.daemon_sets if _key(d) == _key(desired_set)), None)
    pods = status.of_daemon_set(observed.pods, daemon_set)
    writes += _status(domain, observed, pods, stale, problem)
    if objects.workload_template_name(domain):
        writes += _converge(
            TEMPLATES, objects.workload_template(domain), workload_templates, "workload template"
        )
    writes += _clique_cleanup(observed.cliques, stale)
    return tuple(writes)


def _converge(resource: str, desired: Obj, found: Iterable[Obj], what: str) -> list[Write]:
    """Writes that leave exactly ``desired`` (by namespace and name) among ``found``."""
    meta = desired["metadata"]
    key = (meta["namespace"], meta["name"])
    writes: list[Write] = []
    current: Obj | None = None
    for obj in found:
        if _key(obj) == key:
            current = obj
        else:  # ours by its label, but not the one wanted (a renamed or moved object)
            writes += _remove(resource, obj, f"stray {what}")
    if current is None:
        writes.append(Write("create", resource, key[0], key[1], f"create the {what}", body=desired))
        return writes
    if _deleting(current):
        # Someone deletes it: let it go, and make it again once it is gone.
        writes += _release(resource, current, f"{what} being deleted")
        return writes
    if not _immutable_fits(resource, current, desired):
        writes.append(_delete(resource, current, f"the {what}'s immutable fields drifted"))
        return writes
    patch: Obj = {}
    labels = current["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in meta["labels"].items()):
        patch["labels"] = dict(meta["labels"])
    finalizers = current["metadata"].get("finalizers") or []
    if names.FINALIZER not in finalizers:
        patch["finalizers"] = [*finalizers, names.FINALIZER]
    spec = None
    if resource == DAEMON_SETS and not covers(current.get("spec"), desired["spec"]):
        spec = desired["spec"]
    if patch or spec is not None:
        writes.append(_patch(resource, current, patch, f"restore the {what}", spec=spec))
    return writes


def _immutable_fits(resource: str, current: Obj, desired: Obj) -> bool:
    if resource == DAEMON_SETS:  # the server adds nothing to a selector: equal, not covered
        return bool((current.get("spec") or {}).get("selector") == desired["spec"]["selector"])
    return covers(current.get("spec"), desired["spec"])  # a template's spec is immutable


def _status(
    domain: Obj,
    observed: Observed,
    pods: list[Obj],
    stale: dict[str, set[str]],
    problem: tuple[str, str] | None,
) -> list[Write]:
    listed = status.nodes(observed.cliques, pods, stale)
    overall = names.NOT_READY if problem else status.overall(listed, status.num_nodes(domain))
    conditions = []
    if problem:
        reason, message = problem
        conditions = [
            {"type": CHANNEL_CONDITION, "status": "False", "reason": reason, "message": message}
        ]
    current = domain.get("status") or {}
    if (
        current.get("status") == overall
        and status.same_nodes(current.get("nodes") or (), listed)
        and (current.get("conditions") or []) == conditions
    ):
        return []
    body: Obj = {"status": overall}
    if listed or current.get("nodes"):
        body["nodes"] = listed or None  # null removes the field: the list is a list-map
    if conditions or current.get("conditions"):
        body["conditions"] = conditions or None
    meta = domain["metadata"]
    return [
        Write(
            "patch",
            DOMAIN_STATUS,
            meta["namespace"],
            meta["name"],
            f"status {overall}, {len(listed)} nodes",
            body={"status": body},
        )
    ]


def _clique_cleanup(cliques: Iterable[Obj], stale: dict[str, set[str]]) -> list[Write]:
    writes = []
    for clique in cliques:
        gone = stale.get(clique["metadata"]["name"]) or set()
        if not gone:
            continue
        kept = [d for d in clique.get("daemons") or () if d.get("nodeName") not in gone]
        writes.append(
            _patch(
                CLIQUES,
                clique,
                {},
                f"remove the entries of {len(gone)} daemons that no pod runs",
                top={"daemons": kept or None},
            )
        )
    return writes


# -- a domain being deleted, or gone ------------------------------------------------------------


def _teardown(uid: str, observed: Observed, settings: DaemonSettings) -> tuple[Write, ...]:
    workload, daemon, orphans = _templates(observed, settings)
    writes: list[Write] = []
    # A gone domain's workload template may be a tenant's: only our finalizer is let go, once
    # someone deletes it, and it holds nothing.
    for obj in orphans:
        if _deleting(obj):
            writes += _release(TEMPLATES, obj, "workload template of a gone domain")
    for obj in workload:
        writes += _remove(TEMPLATES, obj, "workload template of a deleted domain")
    for resource, found in ((TEMPLATES, daemon), (DAEMON_SETS, observed.daemon_sets)):
        for obj in found:
            if not _deleting(obj):
                writes.append(_delete(resource, obj, "daemon object of a deleted domain"))
            elif not workload:  # NVIDIA's order: the workload templates go first
                writes += _release(resource, obj, "daemon object of a deleted domain")
    labelled = [n for n in observed.nodes if _labels(n).get(names.COMPUTE_DOMAIN_LABEL) == uid]
    for node in labelled:
        writes.append(
            _patch(
                NODES,
                node,
                {"labels": {names.COMPUTE_DOMAIN_LABEL: None}},
                "remove the domain's label from a node",
            )
        )
    if workload or daemon or observed.daemon_sets or labelled:
        return tuple(writes)
    running = {str(p.get("spec", {}).get("nodeName")) for p in observed.pods}
    for clique in observed.cliques:
        if not _deleting(clique) and not running & {
            str(d.get("nodeName")) for d in clique.get("daemons") or ()
        }:
            writes.append(_delete(CLIQUES, clique, "clique of a deleted domain"))
    domain = observed.domain
    if domain is not None and names.FINALIZER in (domain["metadata"].get("finalizers") or ()):
        others = [f for f in domain["metadata"]["finalizers"] if f != names.FINALIZER]
        writes.append(
            _patch(DOMAIN, domain, {"finalizers": others or None}, "release the deleted domain")
        )
    return tuple(writes)


def _remove(resource: str, obj: Obj, what: str) -> list[Write]:
    """Delete it, or once it is being deleted, release it."""
    if _deleting(obj):
        return _release(resource, obj, what)
    return [_delete(resource, obj, f"delete the {what}")]


def _release(resource: str, obj: Obj, what: str) -> list[Write]:
    finalizers = obj["metadata"].get("finalizers") or []
    if names.FINALIZER not in finalizers:
        return []  # nothing of ours holds it
    others = [f for f in finalizers if f != names.FINALIZER]
    return [_patch(resource, obj, {"finalizers": others or None}, f"release the {what}")]


# -- helpers -------------------------------------------------------------------------------------


def _delete(resource: str, obj: Obj, why: str) -> Write:
    meta = obj["metadata"]
    return Write(
        "delete",
        resource,
        str(meta.get("namespace") or ""),
        meta["name"],
        why,
        preconditions={"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
    )


def _patch(
    resource: str,
    obj: Obj,
    metadata: Obj,
    why: str,
    *,
    spec: Obj | None = None,
    top: Obj | None = None,
) -> Write:
    meta = obj["metadata"]
    body: Obj = {"metadata": {**metadata, "resourceVersion": meta["resourceVersion"]}}
    if spec is not None:
        body["spec"] = spec
    body.update(top or {})
    return Write("patch", resource, str(meta.get("namespace") or ""), meta["name"], why, body=body)


def _deleting(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _labels(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def _target(template: Obj) -> str:
    return _labels(template).get(names.TARGET_LABEL, "")


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


def covers(observed: Any, desired: Any) -> bool:
    """Whether ``observed`` has every field of ``desired`` with its value.

    Fields only ``observed`` has are the server's defaults (a DaemonSet comes back with
    ``revisionHistoryLimit``, an update strategy, a DNS policy...) and are not drift; lists
    match element by element; an empty or zero desired value matches an absent one, as the
    server omits them.
    """
    if isinstance(desired, dict):
        if observed is None:
            return not any(desired.values())
        if not isinstance(observed, dict):
            return False
        return all(covers(observed.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        if observed is None:
            return not desired
        if not isinstance(observed, list) or len(observed) != len(desired):
            return False
        return all(covers(o, d) for o, d in zip(observed, desired, strict=True))
    if observed is None:
        return desired in ("", 0, False, None)
    return bool(observed == desired)
