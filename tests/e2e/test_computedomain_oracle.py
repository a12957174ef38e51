"""NVIDIA's ComputeDomain controller as the oracle for ours, on a real control plane.

Our ``gpu-dra compute-domain-controller`` runs as a process against a real kube-apiserver
(with the garbage collector, the DaemonSet and resourceclaim controllers) and is given the
domains NVIDIA's controller was given when tests/data/nvidia-computedomain-objects.json was
recorded (its header says how). It must create exactly the objects NVIDIA's created, equal on
every field tests/computedomain_oracle.py compares but for the differences listed there with
their reasons, and deleting each domain must leave nothing that names it: no template, no
DaemonSet, no daemon pod or claim, no Node label.

A real server is the point: it holds a template's opaque parameters as the bytes it was sent
(a spaced copy refused the finalizer's release, and the domain never went), and its watch events
may come before a write's answer (a template whose last finalizer our patch removed came back
into the cache as a ghost, and the domain never went).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from drivers.computedomain import names
from tests import computedomain_oracle as oracle
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, run_root

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
CRDS = Path(__file__).resolve().parents[2] / "charts" / "gpu-dra-driver" / "crds"
FIXTURE = oracle.load()
RECORDED = FIXTURE["header"]["inputs"]
NAMESPACE = RECORDED["driverNamespace"]
CD_API = "/apis/resource.nvidia.com/v1beta1"
# Every collection the controller writes or whose objects name a domain: cluster-wide lists.
LISTS = {
    "ComputeDomain": f"{CD_API}/computedomains",
    "ComputeDomainClique": f"{CD_API}/computedomaincliques",
    "DaemonSet": "/apis/apps/v1/daemonsets",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "Pod": "/api/v1/pods",
    "Node": "/api/v1/nodes",
}
NODE = "node-a"  # labelled for the domain "two", as when the fixture was recorded

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]


def _items(cp: ControlPlane, kind: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.call("GET", LISTS[kind])["items"]
    for item in items:  # a list's items of built-in kinds carry no kind
        item.setdefault("kind", kind)
    return items


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-cdoracle-{MINOR}", MINOR) as cp:
        for path in sorted(CRDS.glob("*.yaml")):
            cp.create(yaml.safe_load(path.read_text()))
        await cp.wait_for(
            "ComputeDomains served",
            lambda: cp.get(f"{CD_API}/namespaces/default/computedomains")[0] == 200,
            60,
        )
        for ns in (NAMESPACE, "team"):
            cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        cp.create({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": names.DAEMON_SERVICE_ACCOUNT, "namespace": NAMESPACE},
        })  # fmt: skip
        cp.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        await cp.spawn("compute-domain-controller", [
            sys.executable, "-m", "cli", "compute-domain-controller",
            f"--kubeconfig={cp.admin_kubeconfig}", f"--driver-namespace={NAMESPACE}",
            f"--image={RECORDED['image']}", "--leader-elect=false",
        ])  # fmt: skip
        yield cp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def uids(cluster: ControlPlane) -> dict[str, str]:
    """The recorded domains, created; name -> UID."""
    out = {}
    for domain in RECORDED["domains"]:
        created = cluster.create({
            "apiVersion": names.API_VERSION, "kind": names.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": domain["name"], "namespace": domain["namespace"]},
            "spec": domain["spec"],
        })  # fmt: skip
        out[domain["name"]] = created["metadata"]["uid"]
    return out


def _ours(cp: ControlPlane, uids: dict[str, str]) -> dict[str, dict[str, Any]]:
    objects = [
        oracle.normalize(o, uids=uids, namespace=NAMESPACE, image=RECORDED["image"])
        for kind in ("ComputeDomain", "DaemonSet", "ResourceClaimTemplate")
        for o in _items(cp, kind)
    ]
    return {oracle.key(o): o for o in objects}


def _settled(cp: ControlPlane, uids: dict[str, str]) -> bool:
    """Every recorded object there, and every domain's status written."""
    ours = _ours(cp, uids)
    return set(ours) == set(FIXTURE["created"]) and all(
        o.get("status") for k, o in ours.items() if k.startswith("ComputeDomain/")
    )


async def test_a_domain_gets_exactly_nvidias_objects(
    cluster: ControlPlane, uids: dict[str, str]
) -> None:
    await cluster.wait_for("the domains' objects", lambda: _settled(cluster, uids), 60)
    ours = _ours(cluster, uids)
    assert sorted(ours) == sorted(FIXTURE["created"])
    for key, nvidia in FIXTURE["created"].items():
        assert oracle.compared(ours[key]) == oracle.expected_ours(nvidia), key


def _names(cp: ControlPlane, uid: str) -> list[str]:
    """Every object that names ``uid`` (a label, a name, a node selector)."""
    return sorted(
        f"{kind}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
        for kind in LISTS
        for o in _items(cp, kind)
        if uid in yaml.safe_dump(o)
    )


async def test_deleting_each_domain_leaves_nothing_of_it(
    cluster: ControlPlane, uids: dict[str, str]
) -> None:
    await cluster.wait_for("the domains' objects", lambda: _settled(cluster, uids), 60)
    # What a daemon needs exists: the node label brings a daemon pod and its claim, made by
    # the real controllers from our DaemonSet and daemon template.
    node = cluster.call("GET", f"/api/v1/nodes/{NODE}")
    node["metadata"].setdefault("labels", {})[names.COMPUTE_DOMAIN_LABEL] = uids["two"]
    cluster.call("PUT", f"/api/v1/nodes/{NODE}", node)
    kinds = ("Pod", "ResourceClaim")
    await cluster.wait_for(
        "a daemon pod and its claim",
        lambda: all(any(k in n for n in _names(cluster, uids["two"])) for k in kinds),
        60,
    )
    left = {}
    for domain in RECORDED["domains"]:
        path = f"{CD_API}/namespaces/{domain['namespace']}/computedomains/{domain['name']}"
        cluster.call("DELETE", path)
        uid = uids[domain["name"]]
        await cluster.wait_for(
            f"{domain['name']} and its objects gone",
            lambda p=path, u=uid: cluster.get(p)[0] == 404 and not _names(cluster, u),
            60,
        )
        left[domain["name"]] = _names(cluster, uid)
    assert left == FIXTURE["afterDelete"]
    labels = cluster.call("GET", f"/api/v1/nodes/{NODE}")["metadata"].get("labels") or {}
    assert names.COMPUTE_DOMAIN_LABEL not in labels
