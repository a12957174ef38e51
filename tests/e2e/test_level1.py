"""Level 1: our plugin against a real control plane (no kubelet).

Simulated EKS nodes as Node objects; one ``gpu-dra kubelet-plugin`` process per node, each
authenticated as the chart's ServiceAccount with a token bound to a Pod on its node (what the
kubelet gives a DaemonSet pod), publishing through the real kube-apiserver. The chart's RBAC,
ValidatingAdmissionPolicies and DeviceClasses are applied; so is every example of
``charts/examples/``. The real kube-scheduler (with the real resourceclaim controller creating
claims from templates) schedules one pod per example and node, pinned by node affinity, and
each outcome is compared with what ``gpu-dra explain`` predicts from the same slices.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from driver.nvml.faults import write_state_file
from driver.nvml.profile import load_profile
from tests.chart_render import NAMESPACE
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, run_root
from tests.e2e.kube import (
    DRIVER,
    EXTENDED_RESOURCE_MINORS,
    SA,
    TAINT_RULES,
    as_pod,
    await_until,
    explain_cluster,
    install_chart,
    node_object,
    patch_node_ready,
    plugin_dirs,
    plugin_token,
    recipe_rule,
)
from tests.pluginharness import PluginProcess
from tools.allocation import explain_claim

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
EXAMPLES = Path(__file__).resolve().parents[2] / "charts" / "examples"
# node name -> simulated profile
NODES = {
    "p5": "p5.48xlarge",
    "g6e": "g6e.12xlarge",
    "p4d": "p4d.24xlarge-mig",  # static MIG on GPUs 0-3: the MIG examples fit here only
    "g6": "g6.xlarge",
}
# Devices published: p4d has four whole GPUs and three MIG devices on each of four more.
GPUS = {"p5": 8, "g6e": 4, "p4d": 4 + 4 * 3, "g6": 1}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-{MINOR}", MINOR) as cp:
        yield cp


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def installed(cluster: ControlPlane) -> dict[str, str]:
    """The chart applied, the Nodes created; returns node -> plugin token."""
    cp = cluster
    install_chart(cp)
    tokens = {}
    for node, profile in NODES.items():
        cp.create(node_object(node, load_profile(profile).name))
        patch_node_ready(cp, node)
        tokens[node] = plugin_token(cp, node)
    return tokens


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plugins(
    cluster: ControlPlane, installed: dict[str, str]
) -> AsyncIterator[dict[str, PluginProcess]]:
    started: dict[str, PluginProcess] = {}
    try:
        for node, profile in NODES.items():
            dirs, config = plugin_dirs(cluster, node, installed[node])
            # The simulated NVML's fault file: how the health test injects an XID.
            write_state_file(sim_state(cluster, node), {})
            started[node] = PluginProcess(
                dirs,
                kubeconfig=config,
                node_name=node,
                profile=profile,
                extra_env={
                    "POD_NAMESPACE": NAMESPACE,
                    "GPU_DRA_SIM_STATE": str(sim_state(cluster, node)),
                },
            )
        for node, proc in started.items():
            await proc.wait_ready(120)
            await await_until(
                f"slices of {node}", partial(_has_devices, cluster, node, GPUS[node]), 60
            )
        yield started
    finally:
        for proc in started.values():
            await proc.terminate()


def sim_state(cp: ControlPlane, node: str) -> Path:
    return cp.root / "nodes" / node / "sim-state.yaml"


def _slices(cp: ControlPlane, node: str | None = None) -> list[dict[str, Any]]:
    selector = f"?fieldSelector=spec.nodeName%3D{node}" if node else ""
    items: list[dict[str, Any]] = cp.call(
        "GET", f"/apis/resource.k8s.io/v1/resourceslices{selector}"
    )["items"]
    return items


def _has_devices(cp: ControlPlane, node: str, count: int) -> bool:
    return _device_count(cp, node) == count


def _exists(cp: ControlPlane, path: str) -> bool:
    return cp.raw("GET", path)[0] == 200


def _device_count(cp: ControlPlane, node: str) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in _slices(cp, node))


async def test_version_is_the_pinned_release(cluster: ControlPlane) -> None:
    version = cluster.version()
    assert version["gitVersion"] == build.k8s_version(MINOR)
    assert (version["major"], version["minor"]) == tuple(MINOR.split("."))


async def test_plugins_publish_through_the_real_api_server(
    cluster: ControlPlane, plugins: dict[str, PluginProcess]
) -> None:
    for node in NODES:
        slices = _slices(cluster, node)
        assert {s["spec"]["pool"]["name"] for s in slices} == {node}
        assert all(s["spec"]["driver"] == DRIVER for s in slices)
        assert _device_count(cluster, node) == GPUS[node]


# ---- examples x nodes: the real scheduler beside explain -----------------------------------


def _examples() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        docs = [as_pod(d) for d in yaml.safe_load_all(path.read_text()) if d]
        yield path.stem, docs


def _pin(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }
    return pod


def _pod_outcome(cp: ControlPlane, ns: str, name: str) -> tuple[str, str] | None:
    pod = cp.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    if pod["spec"].get("nodeName"):
        return ("scheduled", pod["spec"]["nodeName"])
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            claims = pod["status"].get("resourceClaimStatuses")
            wanted = pod["spec"].get("resourceClaims") or []
            # Only a verdict once every claim exists (the claim controller creates them).
            if len(claims or []) >= sum(1 for c in wanted if "resourceClaimTemplateName" in c):
                return ("unschedulable", str(cond.get("message", "")))
    return None


IMPLICIT = "ResourceClaim"  # the claim the scheduler makes for a legacy pod


def implicit_claim(pod: dict[str, Any], classes: list[dict[str, Any]]) -> dict[str, Any]:
    """What the scheduler creates for a pod asking an extended resource a class serves."""
    (limits,) = [c["resources"]["limits"] for c in pod["spec"]["containers"]]
    (name, count), *_ = limits.items()
    (served,) = [c for c in classes if c["spec"].get("extendedResourceName") == name]
    request = {"deviceClassName": served["metadata"]["name"], "count": int(count)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": IMPLICIT,
        "metadata": {"name": "implicit", "annotations": {"e2e/implicit": "true"}},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": request}]}},
    }


def _claim_for(cp: ControlPlane, ns: str, pod: dict[str, Any]) -> dict[str, Any] | None:
    live = cp.call("GET", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
    extended = live.get("status", {}).get("extendedResourceClaimStatus")
    if extended:
        found: dict[str, Any] = cp.call(
            "GET",
            f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
            f"{extended['resourceClaimName']}",
        )
        return found
    for ref in pod["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName")
        if not name:
            for status in live.get("status", {}).get("resourceClaimStatuses") or []:
                if status["name"] == ref["name"]:
                    name = status.get("resourceClaimName")
        if name:
            claim: dict[str, Any] = cp.call(
                "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
            )
            return claim
    return None


def _only(slices: list[dict[str, Any]], node: str, devices: set[str]) -> list[dict[str, Any]]:
    out = []
    for s in slices:
        if s["spec"].get("nodeName") != node:
            continue
        s = copy.deepcopy(s)
        s["spec"]["devices"] = [d for d in s["spec"].get("devices") or [] if d["name"] in devices]
        out.append(s)
    return out


def _claims(cp: ControlPlane, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    )["items"]
    return items


async def _clean(cp: ControlPlane, ns: str) -> None:
    """Pods gone (forced: no kubelet), then claims deleted and gone: their devices are free."""
    cp.raw("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    await await_until(f"pods of {ns} gone", lambda: not cp.call(
        "GET", f"/api/v1/namespaces/{ns}/pods")["items"], 60)  # fmt: skip
    for c in _claims(cp, ns):
        cp.raw("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
               f"{c['metadata']['name']}")  # fmt: skip
    await await_until(f"claims of {ns} gone", lambda: not _claims(cp, ns), 90)


RESULTS: dict[tuple[str, str], tuple[str, str]] = {}


def _scheduled_examples() -> list[Any]:
    """Every example; those with a ComputeDomain are skipped: their pods name the channel
    template its controller makes, and level 1 runs no controller."""
    out: list[Any] = []
    for name, docs in _examples():
        if any(d["kind"] == "ComputeDomain" for d in docs):
            reason = f"{name}: its channel claim template is made by the ComputeDomain controller"
            out.append(pytest.param(name, marks=pytest.mark.skip(reason=reason)))
        else:
            out.append(name)
    return out


@pytest.mark.parametrize("example", _scheduled_examples())
async def test_scheduler_agrees_with_explain(
    cluster: ControlPlane, plugins: dict[str, PluginProcess], example: str
) -> None:
    cp = cluster
    docs = dict(_examples())[example]
    classes = cp.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    slices = _slices(cp)
    claims = [d for d in docs if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate")]
    pods = [d for d in docs if d["kind"] == "Pod"]
    if not claims:
        if MINOR not in EXTENDED_RESOURCE_MINORS:
            pytest.skip(f"{example}: extendedResourceName needs DRAExtendedResource (1.36+)")
        claims = [implicit_claim(pods[0], classes)]
    (claim,) = claims
    predicted = explain_claim(claim, slices=slices, classes=classes)
    namespaces = {}
    for node in NODES:
        ns = f"{example}-{node}"[:63]
        namespaces[node] = ns
        cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
        await await_until(f"default SA in {ns}", partial(_exists, cp, sa_path), 60)
        if "e2e/implicit" not in (claim["metadata"].get("annotations") or {}):
            cp.create(claim, ns)
        cp.create(_pin(pods[0], node), ns)
    mismatches = []
    try:
        for node, ns in namespaces.items():
            name = pods[0]["metadata"]["name"]
            outcome = await await_until(
                f"{example} on {node} scheduled or unschedulable",
                partial(_pod_outcome, cp, ns, name),
                90,
            )
            ours = predicted.node(node)
            fits = outcome[0] == "scheduled"
            RESULTS[(example, node)] = (outcome[0], "fit" if ours.allocatable else "no fit")
            if fits != ours.allocatable:
                mismatches.append(
                    f"{node}: scheduler {outcome}, explain {ours.allocatable} {ours.reasons}"
                )
                continue
            if not fits:
                continue
            live = _claim_for(cp, ns, pods[0])
            assert live is not None
            results = live["status"]["allocation"]["devices"]["results"]
            chosen = {r["device"] for r in results}
            assert {r["pool"] for r in results} == {node}
            # The scheduler's answer is an answer of ours: with only its devices, explain fits.
            again = explain_claim(claim, slices=_only(slices, node, chosen), classes=classes)
            if not again.node(node).allocatable:
                mismatches.append(f"{node}: scheduler chose {sorted(chosen)}, explain refuses it")
            ours_chosen = {r.device for r in ours.results}
            if len(ours_chosen) == _device_count(cp, node):  # only one answer possible
                assert chosen == ours_chosen
    finally:
        for ns in namespaces.values():
            await _clean(cp, ns)
    assert mismatches == []


async def test_outcome_table(cluster: ControlPlane) -> None:
    """The example x node table, printed for the record (``-s`` shows it)."""
    if not RESULTS:
        pytest.skip("no example was scheduled in this run")
    rows = sorted(RESULTS.items())
    print("\nexample".ljust(34) + "".join(n.ljust(28) for n in NODES))
    for example in sorted({e for e, _ in RESULTS}):
        cells = [RESULTS.get((example, n), ("-", "-")) for n in NODES]
        print(example.ljust(33) + "".join(f"{s}/{o}".ljust(28) for s, o in cells))
    assert all((s == "scheduled") == (o == "fit") for _, (s, o) in rows)


# ---- RBAC and admission, from the real API server --------------------------------------------


def _slice_on(node: str, name: str | None = None) -> dict[str, Any]:
    # Named by the controller's rule, with an index no real slice of the node has.
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"fffff-{DRIVER}-{node}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-99"}],
        },
    }


async def test_a_plugin_cannot_write_another_nodes_slice(
    cluster: ControlPlane, installed: dict[str, str]
) -> None:
    # The API server enforces a new policy once its admission informer has it: wait for that
    # with dry runs (admission runs, nothing is stored), then write for real.
    path = "/apis/resource.k8s.io/v1/resourceslices"
    await await_until(
        "the admission policy in force",
        lambda: (
            cluster.raw("POST", f"{path}?dryRun=All", _slice_on("g6"), token=installed["p5"])[0]
            == 422
        ),
        60,
    )
    code, out = cluster.raw("POST", path, _slice_on("g6"), token=installed["p5"])
    body = json.loads(out)
    # A ValidatingAdmissionPolicy denial: 422 Invalid, naming the policy and its message.
    assert (code, body["reason"]) == (422, "Invalid"), body
    assert "ValidatingAdmissionPolicy 'gpu-dra-driver-resourceslices'" in body["message"]
    assert (
        "the kubelet plugin on node p5 may not modify ResourceSlices of node g6" in body["message"]
    )


async def test_a_plugin_may_write_its_own_nodes_slice(
    cluster: ControlPlane, installed: dict[str, str]
) -> None:
    code, out = cluster.raw(
        "POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun=All", _slice_on("g6"),
        token=installed["g6"],
    )  # fmt: skip
    assert code == 201, out


async def test_a_plugin_cannot_squat_another_nodes_slice_name(
    cluster: ControlPlane, installed: dict[str, str]
) -> None:
    """A slice on its own node under g6's first slice name would make g6's creates 409."""
    squat = _slice_on("p5", name=f"00000-{DRIVER}-g6")
    code, out = cluster.raw(
        "POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun=All", squat, token=installed["p5"]
    )
    body = json.loads(out)
    assert (code, body["reason"]) == (422, "Invalid"), body
    assert (
        f"may not modify ResourceSlice 00000-{DRIVER}-g6: its slices are named "
        f"<hex index>-{DRIVER}-p5" in body["message"]
    )


# Granular authorization of status.devices (resourceclaims/driver, associated-node), beta
# and on from 1.36; before it, the resourceclaims/status grant alone decides.
GRANULAR_STATUS_AUTHZ = tuple(map(int, MINOR.split("."))) >= (1, 36)


async def test_a_plugin_writes_device_status_of_its_own_nodes_claims_only(
    cluster: ControlPlane, plugins: dict[str, PluginProcess], installed: dict[str, str]
) -> None:
    """The claim status writer's grant, on the real API server: g6's plugin may write the
    status.devices entry of a claim allocated on g6; p5's, holding the same grants, may not:
    from 1.36 the API server refuses it (the token's node is not the claim's), before 1.36 the
    chart's admission policy (its entries are not of its own pool)."""
    cp, ns = cluster, "device-status"
    (template, pod) = dict(_examples())["single-gpu"]
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
    await await_until(f"default SA in {ns}", partial(_exists, cp, sa_path), 60)
    cp.create(template, ns)
    cp.create(_pin(pod, "g6"), ns)
    try:
        name = pod["metadata"]["name"]
        outcome = await await_until("scheduled", partial(_pod_outcome, cp, ns, name), 90)
        assert outcome == ("scheduled", "g6")
        live = _claim_for(cp, ns, pod)
        assert live is not None
        (result,) = live["status"]["allocation"]["devices"]["results"]
        entry = {
            "driver": DRIVER,
            "pool": result["pool"],
            "device": result["device"],
            "data": {"kind": "gpu"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                            "message": "prepared on the node",
                            "lastTransitionTime": "2026-12-05T00:00:00Z"}],
        }  # fmt: skip
        body = {**live, "status": {**live["status"], "devices": [entry]}}
        path = (f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/"
                f"{live['metadata']['name']}/status?dryRun=All")  # fmt: skip
        code, out = cp.raw("PUT", path, body, token=installed["g6"])
        assert code == 200, out
        code, out = cp.raw("PUT", path, body, token=installed["p5"])
        if GRANULAR_STATUS_AUTHZ:
            # The claim strategy's check (not the authorizer's 403): a forbidden field, 422.
            body = json.loads(out)
            assert (code, body["reason"]) == (422, "Invalid"), out
            causes = {(c.get("field"), c.get("reason")) for c in body["details"]["causes"]}
            assert causes == {("status.devices", "FieldValueForbidden")}, out
        else:
            # No per-node check in the API server: the chart's ValidatingAdmissionPolicy
            # refuses it (422, its default reason Invalid), on every version.
            body = json.loads(out)
            assert (code, body["reason"]) == (422, "Invalid"), out
            assert (
                "denied request: the kubelet plugin on node p5 may write only status.devices "
                "entries of "
                in body["message"]
                and body["message"].endswith(" in pool p5")
            ), out
    finally:
        await _clean(cp, ns)


async def test_a_plugin_cannot_read_secrets(
    cluster: ControlPlane, installed: dict[str, str]
) -> None:
    code, out = cluster.raw("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", token=installed["p5"])
    body = json.loads(out)
    assert code == 403, body
    assert body["reason"] == "Forbidden"
    assert (
        f'User "system:serviceaccount:{NAMESPACE}:{SA}" cannot list resource "secrets"'
        in body["message"]
    )


# ---- DeviceTaintRule: an admin drains a GPU, the docs' recipe on the real scheduler -----------


def _gpu_claim(name: str, uuid: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if uuid:
        expression = f'device.attributes["{DRIVER}"].uuid == "{uuid}"'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _evicted(cp: ControlPlane, ns: str, name: str) -> dict[str, Any] | None:
    """The pod once it is being deleted (no kubelet here finishes that), or None."""
    code, out = cp.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    pod: dict[str, Any] = json.loads(out)
    return pod if code == 200 and pod["metadata"].get("deletionTimestamp") else None


async def test_a_device_taint_rule_drains_a_gpu_on_the_real_scheduler(
    cluster: ControlPlane, plugins: dict[str, PluginProcess]
) -> None:
    """NoSchedule keeps new claims off the GPU (explain --cluster names the rule), NoExecute
    makes kube-controller-manager evict the pod using it."""
    cp, node, device = cluster, "g6e", "gpu-0"
    if not _exists(cp, TAINT_RULES):
        pytest.skip(f"{MINOR} does not serve DeviceTaintRule as resource.k8s.io/v1 (1.37+)")
    (uuid,) = [
        d["attributes"]["uuid"]["string"]
        for s in _slices(cp, node)
        for d in s["spec"]["devices"]
        if d["name"] == device
    ]
    ns = "drain"
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
    await await_until(f"default SA in {ns}", partial(_exists, cp, sa_path), 60)
    rules = [recipe_rule(node, device, "NoSchedule")]
    try:
        cp.create(rules[0])
        pinned, anyone = _gpu_claim("pinned", uuid), _gpu_claim("any-gpu")
        # explain reads the rule through the API server, as the scheduler does.
        (refused,) = (await explain_cluster(cp, pinned, node))["nodes"]
        assert refused["allocatable"] is False
        why = (f"{device} (gpu.nvidia.com/maintenance=drain:NoSchedule by DeviceTaintRule "
               f"{rules[0]['metadata']['name']})")  # fmt: skip
        assert any(why in r for r in refused["reasons"]), refused["reasons"]
        print(f"\nexplain --cluster: {refused['reasons']}")
        (predicted,) = (await explain_cluster(cp, anyone, node))["nodes"]
        assert predicted["allocatable"] and predicted["results"][0]["device"] != device
        created = time.monotonic()
        for claim in (pinned, anyone):
            cp.create(claim, ns)
            cp.create(_pin(_claim_pod(claim), node), ns)
        outcome = await await_until(
            "pinned unschedulable", partial(_pod_outcome, cp, ns, "pinned"), 90
        )
        assert outcome[0] == "unschedulable", outcome
        unschedulable, message = time.monotonic() - created, outcome[1]
        outcome = await await_until(
            "any-gpu scheduled", partial(_pod_outcome, cp, ns, "any-gpu"), 90
        )
        assert outcome == ("scheduled", node)
        live = _claim_for(cp, ns, _claim_pod(anyone))
        assert live is not None
        (result,) = live["status"]["allocation"]["devices"]["results"]
        assert result["device"] != device  # the drained GPU is not given
        # explain --cluster names what the claim holds; no kubelet here prepares it, so no
        # status.devices entry yet (level 2 has the plugin's).
        named = {**anyone, "metadata": {"name": "any-gpu", "namespace": ns}}
        allocated = (await explain_cluster(cp, named, node))["allocated"]
        assert allocated["node"] == node and allocated["reservedFor"] == ["pods/any-gpu"]
        assert [(d["device"], d["ready"]) for d in allocated["devices"]] == [
            (result["device"], None)
        ]
        # NoExecute on the GPU the running pod got: the eviction controller deletes it.
        rules.append(recipe_rule(node, result["device"], "NoExecute"))
        tainted = time.monotonic()
        cp.create(rules[1])
        pod = await await_until("any-gpu evicted", partial(_evicted, cp, ns, "any-gpu"), 60)
        evicted = time.monotonic() - tainted
        conditions = {c["type"]: c for c in pod["status"].get("conditions") or []}
        assert conditions["DisruptionTarget"]["reason"] == "DeletionByDeviceTaintManager"
        assert _evicted(cp, ns, "pinned") is None  # its device is not the one evicted from
        # What the kubelet does once the containers stopped; then the claim is deallocated.
        cp.raw("DELETE", f"/api/v1/namespaces/{ns}/pods/any-gpu?gracePeriodSeconds=0")
        claim_path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/any-gpu"
        await await_until(
            "any-gpu deallocated",
            lambda: "allocation" not in cp.call("GET", claim_path)["status"],
            60,
        )
        deallocated = time.monotonic() - tainted
        print(
            f"scheduler: {message}\nDeviceTaintRule NoSchedule: pod unschedulable "
            f"{unschedulable:.2f}s after creation; NoExecute: pod evicted {evicted:.2f}s after "
            f"the rule, claim deallocated {deallocated:.2f}s after it"
        )
    finally:
        for rule in rules:
            cp.raw("DELETE", f"{TAINT_RULES}/{rule['metadata']['name']}")
        await _clean(cp, ns)


# ---- device health: an XID becomes a taint the real scheduler honours -------------------------
# Last in the module: it taints a p5 GPU (and clears it again before it ends).

XID_KEY = "gpu.nvidia.com/xid"


def _tainted(cp: ControlPlane, node: str) -> dict[str, list[dict[str, Any]]]:
    return {
        d["name"]: d["taints"]
        for s in _slices(cp, node)
        for d in s["spec"].get("devices") or []
        if d.get("taints")
    }


def _pinned_claim(uuid: str, tolerate: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}],
    }
    if tolerate:
        exactly["tolerations"] = [{"key": XID_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    name = "tolerates-xid" if tolerate else "pinned-to-xid"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _claim_pod(claim: dict[str, Any]) -> dict[str, Any]:
    name = claim["metadata"]["name"]
    container = {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }


async def test_xid_79_taints_the_device_and_the_scheduler_honours_it(
    cluster: ControlPlane, plugins: dict[str, PluginProcess]
) -> None:
    cp, node = cluster, "p5"
    assert _tainted(cp, node) == {}
    generations = {s["metadata"]["name"]: s["metadata"]["generation"] for s in _slices(cp, node)}
    write_state_file(sim_state(cp, node), {"xidEvents": [{"gpu": 3, "xid": 79}]})
    injected = time.monotonic()
    plugins[node].proc.send_signal(signal.SIGHUP)  # rediscovery: nvmlInit re-reads the file
    tainted = await await_until("the XID 79 taint", lambda: _tainted(cp, node) or None, 30)
    to_taint = time.monotonic() - injected
    ((device, taints),) = tainted.items()
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [(XID_KEY, "79", "NoSchedule")]
    assert taints[0]["timeAdded"]  # stamped by the server
    after = {s["metadata"]["name"]: s["metadata"]["generation"] for s in _slices(cp, node)}
    # One write: one slice's spec changed once.
    assert sum(after[n] - generations[n] for n in generations) == 1, (generations, after)
    print(f"\nXID 79 to taint through the real API server: {to_taint:.2f}s")
    (uuid,) = [
        d["attributes"]["uuid"]["string"]
        for s in _slices(cp, node)
        for d in s["spec"]["devices"]
        if d["name"] == device
    ]
    classes = cp.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    ns = "health-xid"
    cp.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    sa_path = f"/api/v1/namespaces/{ns}/serviceaccounts/default"
    await await_until(f"default SA in {ns}", partial(_exists, cp, sa_path), 60)
    try:
        for tolerate in (False, True):
            claim = _pinned_claim(uuid, tolerate)
            predicted = explain_claim(claim, slices=_slices(cp), classes=classes).node(node)
            cp.create(claim, ns)
            pod = _pin(_claim_pod(claim), node)
            cp.create(pod, ns)
            outcome = await await_until(
                f"{claim['metadata']['name']} scheduled or unschedulable",
                partial(_pod_outcome, cp, ns, pod["metadata"]["name"]),
                90,
            )
            if tolerate:
                assert outcome == ("scheduled", node) and predicted.allocatable
                assert [r.device for r in predicted.results] == [device]
            else:
                assert outcome[0] == "unschedulable", outcome
                assert not predicted.allocatable
                assert f"{device} ({XID_KEY}=79:NoSchedule)" in " ".join(predicted.reasons)
        # An XID of the ignore list: informational, effect None, which only 1.35+ accepts.
        # (The simulated library's XID list is a log: a new event is appended to it.)
        xids = [{"gpu": 3, "xid": 79}, {"gpu": 2, "xid": 13}]
        write_state_file(sim_state(cp, node), {"xidEvents": xids})
        plugins[node].proc.send_signal(signal.SIGHUP)
        if MINOR == "1.34":
            # The real 1.34 server refuses effect None: the guard leaves the taint off.
            await plugins[node].wait_log("does not accept taint effect None")
            assert len(_tainted(cp, node)) == 1
        else:
            await await_until("the XID 13 taint", lambda: len(_tainted(cp, node)) == 2, 30)
            [informational] = [t for d, ts in _tainted(cp, node).items() if d != device for t in ts]
            assert (informational["value"], informational["effect"]) == ("13", "None")
    finally:
        await _clean(cp, ns)
        # The documented clear action: the taint goes, the GPU is allocatable again.
        (plugins[node].dirs.plugin_data / "health-clear").write_text("")
        await await_until("the taint cleared", lambda: not _tainted(cp, node), 30)
