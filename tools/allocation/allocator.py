"""Allocate one claim against ResourceSlices, node by node, and explain the outcome.

Pure: objects in (v1 JSON dicts), an :class:`Explanation` out. Class selectors
are evaluated at most once per kind of device for the whole call, whatever the number
of requests and nodes (see :mod:`tools.allocation.selectors`), and the search
runs once per node shape (:mod:`tools.allocation.shapes`): a node of a shape
already searched gets that outcome with its own devices.
"""

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from driver.common.gcpause import gc_paused
from driver.common.quantity import Quantity
from tools.allocation.capacity import CapacityProblem, Use, quantity
from tools.allocation.claims import (
    ClaimProblem,
    ParsedClaim,
    Request,
    claim_spec,
    parse_claim,
)
from tools.allocation.model import (
    ClaimRef,
    ClassListing,
    DeviceResult,
    DeviceVerdict,
    Explanation,
    NodeExplanation,
)
from tools.allocation.pools import Cluster, DeviceKey, Pool
from tools.allocation.reasons import advice, failure_reasons
from tools.allocation.search import DEFAULT_BUDGET, BudgetExceeded, NodeSearch, SearchAborted
from tools.allocation.selectors import SelectorProblem, Selectors, selector_refs
from tools.allocation.shapes import Key, Shapes
from tools.allocation.status import Placement, allocation_json
from tools.allocation.taintrules import apply_taint_rules, parse_rules, taint_text


def explain_claim(
    claim: Mapping[str, Any],
    *,
    slices: Iterable[Mapping[str, Any]] | Cluster,
    classes: Iterable[Mapping[str, Any]],
    allocated: Iterable[Mapping[str, Any]] = (),
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    budget: int = DEFAULT_BUDGET,
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> Explanation:
    """Try to allocate ``claim`` on every node the slices name.

    ``claim`` is a ResourceClaim, a ResourceClaimTemplate or a bare
    ResourceClaimSpec; ``classes`` are DeviceClass objects; ``allocated`` are
    ResourceClaims whose ``status.allocation`` devices are taken (results with
    adminAccess do not take a device, and the claim itself is ignored).
    ``node_labels`` (node name -> labels) lets nodeSelector pools be matched;
    without it label requirements are assumed to hold. ``budget`` bounds the
    search steps per node. ``taint_rules`` are DeviceTaintRules, whose taints the devices
    they select get (:mod:`tools.allocation.taintrules`).
    """
    slices = _tainted(slices, taint_rules)
    # The search makes many short-lived objects and no cycles; with tens of thousands of
    # slice dicts alive, the collector's passes cost up to a third of a large explain.
    with gc_paused():
        return _explain_claim(claim, slices, classes, allocated, node_labels, budget)


def _explain_claim(
    claim: Mapping[str, Any],
    slices: Iterable[Mapping[str, Any]] | Cluster,
    classes: Iterable[Mapping[str, Any]],
    allocated: Iterable[Mapping[str, Any]],
    node_labels: Mapping[str, Mapping[str, str]] | None,
    budget: int,
) -> Explanation:
    ref = claim_ref(claim)
    cluster = slices if isinstance(slices, Cluster) else Cluster(slices, node_labels=node_labels)
    nodes: list[str | None] = list(cluster.node_names) or [None]
    selectors = Selectors()
    try:
        parsed = parse_claim(claim_spec(claim), _by_name(classes))
        for group in parsed.groups:
            for request in group.alternatives:
                for selector in request.selectors:
                    selectors.check(selector)
    except (ClaimProblem, SelectorProblem) as exc:
        problem = str(exc)
        return Explanation(
            ref,
            tuple(NodeExplanation(n, False, reasons=(problem,), error=problem) for n in nodes),
            problems=(problem,),
            advice="fix the claim first: `gpu-dra validate` shows every problem in it",
        )
    allocated = list(allocated)
    in_use = device_holders(allocated, exclude=claim)
    shared = share_holders(allocated, exclude=claim)
    seed = _share_seed(claim)
    shapes = Shapes(parsed, in_use, shared)
    found: dict[Key, _Found | None] = {}  # search shape -> the solution, None for none
    unfit: dict[bytes, NodeExplanation] = {}  # exact shape -> why not
    results: list[NodeExplanation] = []
    for n in nodes:
        pools = cluster.pools(n)
        shape = shapes.of(n, pools)
        # One lookup: a key's == compares the node's devices with those of its shape.
        solution = _UNSEEN if shape is None else found.get(shape.search, _UNSEEN)
        if shape is not None and solution is not _UNSEEN:
            if solution is not None:
                results.append(solution.on(n, pools, parsed, seed))
                continue
            exact = shape.exact()
            known = None if exact is None else unfit.get(exact)
            if known is not None:
                results.append(replace(known, node=n))
                continue
        outcome, solution = _node(
            n, pools, cluster, parsed, selectors, in_use, shared, budget, seed
        )
        results.append(outcome)
        if shape is not None:
            found[shape.search] = solution
            exact = None if solution is not None else shape.exact()
            if exact is not None:
                unfit[exact] = outcome
    outcomes = tuple(results)
    if any(o.allocatable for o in outcomes):
        return Explanation(ref, outcomes)
    return Explanation(ref, outcomes, advice=advice(o.reasons for o in outcomes))


@dataclass(frozen=True, slots=True)
class _Found:
    """A solution by the positions of its devices among the node's, to be given to a node
    of the same shape."""

    positions: tuple[int, ...]
    requests: tuple[Request, ...]
    shares: tuple[dict[str, Quantity] | None, ...]
    chosen: Mapping[str, Request]
    steps: int

    def on(
        self, node: str | None, pools: list[Pool], parsed: ParsedClaim, seed: str
    ) -> NodeExplanation:
        # A node of a shape has no slices with per-device node selection: its devices are
        # those of its pools' slices, in order, all on the node. Only their names are read.
        slices = [s for pool in pools for s in pool.slices]
        picked: list[tuple[Request, Placement]] = []
        for request, position in zip(self.requests, self.positions, strict=True):
            for s in slices:
                if position < len(s.raw):
                    picked.append((request, _Placed(s.driver, s.pool, s.names[position], node)))
                    break
                position -= len(s.raw)
        return _allocatable(node, parsed, picked, self.shares, self.chosen, self.steps, seed)


class _Placed(NamedTuple):
    driver: str
    pool: str
    name: str
    node_name: str | None
    node_selector: Mapping[str, Any] | None = None


_UNSEEN = _Found((), (), (), {}, 0)  # a shape no node has had yet


def _node(
    node: str | None,
    pools: list[Pool],
    cluster: Cluster,
    parsed: ParsedClaim,
    selectors: Selectors,
    in_use: Mapping[DeviceKey, str],
    shared: Mapping[DeviceKey, Use],
    budget: int,
    seed: str,
) -> tuple[NodeExplanation, _Found | None]:
    search = NodeSearch(node, cluster, parsed, selectors, in_use, budget, shared, pools=pools)
    problem: str | None = None
    error: str | None = None
    try:
        found = search.run()
    except SearchAborted as exc:
        found, problem = False, str(exc)
        error = problem
    except BudgetExceeded as exc:
        found, problem = False, str(exc)
    if found:
        position = {d.index: i for i, d in enumerate(search.every)}
        solution = _Found(
            positions=tuple(position[d.index] for _, d in search.results),
            requests=tuple(r for r, _ in search.results),
            shares=tuple(search.shares),
            chosen=dict(search.chosen),
            steps=search.steps,
        )
        picked = list(search.results)
        explained = _allocatable(
            node, parsed, picked, solution.shares, solution.chosen, search.steps, seed
        )
        return explained, solution
    return NodeExplanation(
        node,
        False,
        reasons=tuple(failure_reasons(search, problem)),
        steps=search.steps,
        error=error,
    ), None


def _allocatable(
    node: str | None,
    parsed: ParsedClaim,
    picked: Sequence[tuple[Request, Placement]],
    shares: Sequence[dict[str, Quantity] | None],
    chosen: Mapping[str, Request],
    steps: int,
    seed: str,
) -> NodeExplanation:
    return NodeExplanation(
        node,
        True,
        results=tuple(
            DeviceResult(r.name, d.driver, d.pool, d.name, _strings(share))
            for (r, d), share in zip(picked, shares, strict=True)
        ),
        allocation=allocation_json(parsed, picked, chosen, shares=shares, seed=seed),
        steps=steps,
    )


def _tainted(
    slices: Iterable[Mapping[str, Any]] | Cluster, taint_rules: Iterable[Mapping[str, Any]]
) -> Iterable[Mapping[str, Any]] | Cluster:
    rules = parse_rules(taint_rules)
    if not rules:
        return slices
    if isinstance(slices, Cluster):
        raise TypeError("taint rules apply to slices, not to a Cluster already built")
    return apply_taint_rules(slices, rules)


def explain_class(
    device_class: Mapping[str, Any],
    *,
    slices: Iterable[Mapping[str, Any]] | Cluster,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> ClassListing:
    """Judge every published device (newest pool generation) against one class's selectors;
    a selected device a NoSchedule or NoExecute taint keeps from claims that do not tolerate
    it says so in its reason."""
    slices = _tainted(slices, taint_rules)
    name = str((device_class.get("metadata") or {}).get("name") or "")
    cluster = slices if isinstance(slices, Cluster) else Cluster(slices, node_labels=node_labels)
    selectors = Selectors()
    try:
        refs = selector_refs(f"class {name}", (device_class.get("spec") or {}).get("selectors"))
        for ref in refs:
            selectors.check(ref)
    except SelectorProblem as exc:
        return ClassListing(name, (), problems=(str(exc),))
    seen: set[int] = set()
    verdicts: list[DeviceVerdict] = []
    nodes: list[str | None] = list(cluster.node_names) or [None]
    for node in nodes:
        labels = cluster.labels(node)
        for pool in cluster.pools(node):
            for device in pool.devices(node, labels):
                if device.index in seen:
                    continue
                seen.add(device.index)
                rejection = selectors.first_rejection(refs, device)
                reason = None if rejection is None else rejection.describe()
                if reason is None:
                    reason = _untolerated(device.taints)
                verdicts.append(
                    DeviceVerdict(
                        node=device.node_name,
                        driver=device.driver,
                        pool=device.pool,
                        device=device.name,
                        selected=rejection is None,
                        reason=reason,
                    )
                )
    return ClassListing(name, tuple(verdicts))


def _untolerated(taints: Iterable[Mapping[str, Any]]) -> str | None:
    """What keeps a selected device from a claim without tolerations: its blocking taints."""
    blocking = [taint_text(t) for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    return f"tainted {', '.join(blocking)}" if blocking else None


def allocated_devices(
    claims: Iterable[Mapping[str, Any]], *, exclude: Mapping[str, Any] | None = None
) -> frozenset[DeviceKey]:
    """Devices the allocation results of ``claims`` take whole: not admin-access results,
    not shares of a device (:func:`share_holders`).

    ``exclude`` (the claim being explained) is skipped, matched by UID or by
    namespace and name, so re-explaining an allocated claim does not count its
    own devices as taken.
    """
    return frozenset(device_holders(claims, exclude=exclude))


def device_holders(
    claims: Iterable[Mapping[str, Any]], *, exclude: Mapping[str, Any] | None = None
) -> dict[DeviceKey, str]:
    """:func:`allocated_devices` with the claim holding each: ``namespace/name``.

    Shares of a device (results with a ``shareID``) do not take it whole:
    :func:`share_holders` has them.
    """
    return {
        key: holder
        for holder, key, result in _results(claims, exclude)
        if result.get("shareID") is None
    }


def share_holders(
    claims: Iterable[Mapping[str, Any]], *, exclude: Mapping[str, Any] | None = None
) -> dict[DeviceKey, Use]:
    """Per shared device, the capacity its shares consume and the claims holding them
    (as the scheduler's allocated-device tracker sums ``consumedCapacity``)."""
    shared: dict[DeviceKey, Use] = {}
    for holder, key, result in _results(claims, exclude):
        if result.get("shareID") is None:
            continue
        use = shared.setdefault(key, Use())
        amounts: dict[str, Quantity] = {}
        for name, raw in (result.get("consumedCapacity") or {}).items():
            with contextlib.suppress(CapacityProblem):
                amounts[str(name)] = quantity(raw, f"{holder} consumedCapacity {name}")
        use.add(amounts)
        if holder not in use.holders:
            use.holders.append(holder)
    return shared


def _results(
    claims: Iterable[Mapping[str, Any]], exclude: Mapping[str, Any] | None
) -> Iterator[tuple[str, DeviceKey, Mapping[str, Any]]]:
    """(holder ``namespace/name``, device, result) of every result that takes a device."""
    skip_uid = skip_name = None
    if exclude is not None and exclude.get("kind") == "ResourceClaim":
        meta = exclude.get("metadata") or {}
        skip_uid = meta.get("uid")
        skip_name = (meta.get("namespace") or "default", meta.get("name"))
    for claim in claims:
        meta = claim.get("metadata") or {}
        if skip_uid and meta.get("uid") == skip_uid:
            continue
        name = (meta.get("namespace") or "default", meta.get("name"))
        if skip_name is not None and name == skip_name:
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("adminAccess"):
                # Shared with other claims (scheduler plugin foreachAllocatedDevice).
                continue
            key = (str(result["driver"]), str(result["pool"]), str(result["device"]))
            yield f"{name[0]}/{name[1]}", key, result


def _share_seed(claim: Mapping[str, Any]) -> str:
    """What makes this claim's share IDs its own (the scheduler draws random ones)."""
    meta = claim.get("metadata") or {}
    return "/".join(str(meta.get(k) or "") for k in ("uid", "namespace", "name", "generateName"))


def _strings(share: Mapping[str, Quantity] | None) -> dict[str, str] | None:
    return None if share is None else {k: str(v) for k, v in sorted(share.items())}


def claim_ref(obj: Mapping[str, Any]) -> ClaimRef:
    meta = obj.get("metadata") or {}
    kind = str(obj.get("kind") or "")
    namespace = meta.get("namespace") or ("default" if kind else None)
    return ClaimRef(kind, namespace, meta.get("name"))


def _by_name(classes: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str((c.get("metadata") or {}).get("name")): c for c in classes}
