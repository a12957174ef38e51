"""Our GpuConfigs checked where the user writes them: the chart's ValidatingAdmissionPolicy
on the real API server, held against the plugin's own decoder (api/config.py).

The policy and the decoder are two spellings of one set of rules, so a seeded generator
feeds both the same configs (every field of GpuConfig hit by valid and invalid values:
every enum value and near misses, numbers in and out of range, wrong types, nulls, unknown
fields and kinds) and every verdict must agree: the server admits exactly what the decoder
parses, and refuses the rest with the field's path. No driver pod runs here: the policy needs
none, which is the point of a policy over a webhook.

Also the MPS daemon pod policy, as the API server applies it to a node's kubelet plugin (the
chart's service account, with a token bound to a pod on that node): the pod daemon_pod makes
is admitted, one more label or another command refused, and so is a delete of another node's.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from api.config import API_VERSION, ConfigError, parse_gpu_config
from cluster.computedomain.objects import daemon_set, daemon_template
from driver.kube.rest import error_for
from drivers.computedomain import names as cd_names
from drivers.gpu.kinds.mps import default_control
from drivers.gpu.kinds.mpspod import DaemonSpec, MpsPodConfig, daemon_pod
from tests.chart_render import NAMESPACE, render
from tests.computedomains import domain
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, run_root
from tests.e2e.kube import chart_objects, node_object, plugin_token, service_account_token
from tests.test_chart_policy_computedomain_controller import chart_settings, served

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
DRIVER = "gpu.nvidia.com"
POLICY = "gpu-dra-driver-gpuconfig"
CASES = 2400
DAEMON_CLASS = "-compute-domain-daemon-class"  # the IMEX daemon class policy's name suffix
SEED = 20261201

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-admission-{MINOR}", MINOR) as cp:
        for obj in chart_objects(cp.minor):
            if obj["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                cp.create(obj)
        await cp.wait_for("the config policy type-checked", lambda: _checked(cp), 60)
        # The policy is active once the API server refuses what it must.
        await cp.wait_for("the config policy enforced", lambda: _verdict(cp, {}) != 201, 60)
        yield cp


def _checked(cp: ControlPlane, policy: str = POLICY) -> bool:
    path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{policy}"
    status = cp.call("GET", path).get("status", {})
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status
    return bool(status.get("observedGeneration"))


def _claim(params: Any, name: str = "c", template: bool = False) -> dict[str, Any]:
    spec = {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": params}}],
        }
    }
    if template:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name}, "spec": {"spec": spec}}  # fmt: skip
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def _post(cp: ControlPlane, obj: dict[str, Any]) -> tuple[int, str]:
    plural = (
        "resourceclaimtemplates" if obj["kind"] == "ResourceClaimTemplate" else "resourceclaims"
    )
    path = f"/apis/resource.k8s.io/v1/namespaces/default/{plural}?dryRun=All"
    code, body = cp.raw("POST", path, obj)
    return code, body.decode(errors="replace")


def _verdict(cp: ControlPlane, params: Any, template: bool = False) -> int:
    return _post(cp, _claim(params, template=template))[0]


def _decoder_admits(params: Any) -> bool:
    try:
        parse_gpu_config(params, source="opaque config #1")
    except ConfigError:
        return False
    return True


# ---- the generator --------------------------------------------------------------------

NEAR_STRATEGIES = ["TimeSlicing", "MPS", "TimeSlice", "timeslicing", "Mps", "mps", "MIG", "",
                   " MPS", "TimeSlicing ", None, 1, True, ["MPS"], {"name": "MPS"}]  # fmt: skip
INTERVALS = ["Default", "Short", "Medium", "Long", "default", "short", "Longer", "", None, 5,
             ["Short"]]  # fmt: skip
PERCENTAGES = [0, 1, 50, 99, 100, 101, -1, 150, 2**40, 50.0, 0.5, "50", True, None, [50]]
ARABIC_DIGITS = "\u0661\u0660Gi"  # digits to Python's \\d, not to Kubernetes' quantity parser
QUANTITIES = ["10Gi", "1G", "512Mi", "1.5Gi", ".5Gi", "1e3", "1E3", "+1Gi", "-1Gi", "0",
              "10GiB", "10 Gi", "Gi", "1.Gi", "1ki", "1Ki", ARABIC_DIGITS, "", None, 10, 1.5,
              ["1Gi"]]  # fmt: skip
DEVICE_KEYS = ["0", "1", "GPU-4f9a8c1e-1111-2222-3333-444455556666", "x"]
VERSIONS = [API_VERSION, "resource.nvidia.com/v1", "resource.nvidia.com/v1beta2",
            "gpu.nvidia.com/v1beta1", "", None, 1]  # fmt: skip
KINDS = ["GpuConfig", "GPUConfig", "gpuconfig", "MigDeviceConfig", "ComputeDomainChannelConfig",
         "", None, 3]  # fmt: skip
FIELDS = ("apiVersion", "kind", "sharing", "sharing.strategy", "sharing.timeSlicingConfig",
          "sharing.timeSlicingConfig.interval", "sharing.mpsConfig",
          "sharing.mpsConfig.defaultActiveThreadPercentage",
          "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
          "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
          "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.<key>")  # fmt: skip
JUNK = ["extra", "Sharing", "strategyy", "interval", "mps_config", "apiversion"]


def _mps(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return rng.choice([None, "MPS", [], 7])
    mps: dict[str, Any] = {}
    if rng.random() < 0.6:
        mps["defaultActiveThreadPercentage"] = rng.choice(PERCENTAGES)
    if rng.random() < 0.5:
        mps["defaultPinnedDeviceMemoryLimit"] = rng.choice(QUANTITIES)
    if rng.random() < 0.4:
        if rng.random() < 0.1:
            mps["defaultPerDevicePinnedMemoryLimit"] = rng.choice([None, "1Gi", ["1Gi"], 3])
        else:
            keys = rng.sample(DEVICE_KEYS, rng.randint(0, 3))
            mps["defaultPerDevicePinnedMemoryLimit"] = {k: rng.choice(QUANTITIES) for k in keys}
    if rng.random() < 0.08:
        mps[rng.choice(JUNK)] = 1
    return mps


def _time_slicing(rng: random.Random) -> Any:
    if rng.random() < 0.05:
        return rng.choice([None, "Short", [], 7])
    config: dict[str, Any] = {}
    if rng.random() < 0.85:
        config["interval"] = rng.choice(INTERVALS)
    if rng.random() < 0.08:
        config[rng.choice(JUNK)] = "x"
    return config


def _sharing(rng: random.Random) -> Any:
    if rng.random() < 0.04:
        return rng.choice([None, "MPS", [], 0])
    sharing: dict[str, Any] = {}
    if rng.random() < 0.95:
        # Valid strategies most of the time, so the nested fields get reached.
        good = rng.random() < 0.7
        sharing["strategy"] = (
            rng.choice(["TimeSlicing", "MPS"]) if good else rng.choice(NEAR_STRATEGIES)
        )
    if rng.random() < 0.5:
        sharing["timeSlicingConfig"] = _time_slicing(rng)
    if rng.random() < 0.5:
        sharing["mpsConfig"] = _mps(rng)
    if rng.random() < 0.06:
        sharing[rng.choice(JUNK)] = {}
    return sharing


def generate(rng: random.Random) -> Any:
    if rng.random() < 0.02:
        return rng.choice([[], "GpuConfig", 1, {}])
    params: dict[str, Any] = {}
    if rng.random() < 0.96:
        params["apiVersion"] = API_VERSION if rng.random() < 0.9 else rng.choice(VERSIONS)
    if rng.random() < 0.96:
        params["kind"] = "GpuConfig" if rng.random() < 0.9 else rng.choice(KINDS)
    if rng.random() < 0.85:
        params["sharing"] = _sharing(rng)
    if rng.random() < 0.05:
        params[rng.choice(JUNK)] = "x"
    return params


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{key}" if path else key)


def _coverage(cases: list[Any], admitted: list[bool]) -> dict[str, tuple[int, int]]:
    """Per field path: how many cases set it in an admitted config, and in a refused one."""
    counts: dict[str, list[int]] = {}
    for params, ok in zip(cases, admitted, strict=True):
        for path, _ in _walk(params):
            if not path:
                continue
            key = path if not path.startswith("sharing.mpsConfig.defaultPerDevice") else (
                "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.<key>"
                if path.count(".") > 2 else path
            )  # fmt: skip
            counts.setdefault(key, [0, 0])[0 if ok else 1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(counts.items())}


# ---- the tests ------------------------------------------------------------------------


async def test_a_bad_config_is_refused_on_create_with_its_field(cluster: ControlPlane) -> None:
    bad = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlice"}}
    code, body = _post(cluster, _claim(bad))
    assert code == 422, body
    message = json.loads(body)["message"]
    assert POLICY in message
    assert 'spec.devices.config[].opaque.parameters: field "sharing.strategy"' in message
    assert "is TimeSlice" in message
    over = {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
    }
    code, body = _post(cluster, _claim(over, template=True))
    assert code == 422
    assert "spec.spec.devices.config[]" in body and "from 0 to 100, is 150" in body
    good = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    assert _verdict(cluster, good) == 201
    assert _verdict(cluster, good, template=True) == 201


def _daemon_claim(cp: ControlPlane, namespace: str) -> tuple[int, str]:
    """A dry-run claim for the IMEX daemon DeviceClass in ``namespace``."""
    request = {"name": "daemon", "exactly": {"deviceClassName": cd_names.DAEMON_CLASS}}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "daemon"},
        "spec": {"devices": {"requests": [request]}},
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims?dryRun=All"
    code, body = cp.raw("POST", path, claim)
    return code, body.decode(errors="replace")


async def test_the_imex_daemon_class_is_refused_outside_the_drivers_namespace(
    cluster: ControlPlane,
) -> None:
    """A tenant's claim for a node's IMEX daemon slot (issue #38) is refused by the API
    server; the driver's namespace, where the controller's daemon template lives, is not."""
    for obj in render((), ("computeDomains.enabled=true",)):
        name = obj["metadata"]["name"]
        if obj["kind"].startswith("ValidatingAdmissionPolicy") and name.endswith(DAEMON_CLASS):
            cluster.create(obj)
    for namespace in (NAMESPACE, "team-b"):
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        assert cluster.raw("POST", "/api/v1/namespaces", body)[0] in (201, 409)
    await cluster.wait_for(
        "the daemon class policy enforced", lambda: _daemon_claim(cluster, "team-b")[0] == 422, 60
    )
    code, refusal = _daemon_claim(cluster, "team-b")
    assert code == 422
    assert "only a claim in the driver's namespace" in json.loads(refusal)["message"]
    assert _daemon_claim(cluster, NAMESPACE)[0] == 201


CONTROLLER_POLICIES = "-compute-domain-controller-"  # the controller's policies' name infix
MERGE = "application/merge-patch+json"


def _as_controller(cp: ControlPlane) -> str:
    """The chart's ComputeDomain controller account, its RBAC and policies; its token."""
    for namespace in (NAMESPACE, "team-b"):
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        assert cp.raw("POST", "/api/v1/namespaces", body)[0] in (201, 409)
    account = ""
    for obj in render((), ("computeDomains.enabled=true",)):
        name = obj["metadata"]["name"]
        if CONTROLLER_POLICIES in name or (
            name.endswith("-compute-domain-controller")
            and obj["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                "RoleBinding")
        ):  # fmt: skip
            cp.create(obj, NAMESPACE)
            account = name if obj["kind"] == "ServiceAccount" else account
    return service_account_token(cp, account)


async def test_the_controllers_daemonset_node_and_template_writes_are_bounded(
    cluster: ControlPlane,
) -> None:
    """What a stolen ComputeDomain controller token could do (issue #38): run a DaemonSet of
    another image, or a privileged hostPath one, in the driver's namespace, take a template
    for GPUs, lift a Node's taint or label it. The API server refuses each with the chart's
    policy; what the controller's own builders make is admitted."""
    token = _as_controller(cluster)
    for suffix in ("daemonsets", "nodes", "templates"):
        name = f"gpu-dra-driver{CONTROLLER_POLICIES}{suffix}"
        await cluster.wait_for(f"{name} type-checked", lambda n=name: _checked(cluster, n), 60)
    settings = chart_settings()
    uid = "3b1c6a4e-8f2d-4c1a-9e7b-5d0f2a6c8e11"
    sent = daemon_set(domain(uid=uid), settings)
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"
    ds_path = f"{path}/{sent['metadata']['name']}"

    def post(ds: dict[str, Any], dry: bool = True) -> tuple[int, str]:
        code, body = cluster.raw("POST", path + ("?dryRun=All" if dry else ""), ds, token=token)
        return code, body.decode(errors="replace")

    privileged = json.loads(json.dumps(sent))
    pod = privileged["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "root", "mountPath": "/host"}]
    pod["containers"][0]["securityContext"] = {"privileged": True}
    # RBAC and the policy both take a moment: refused by the policy, not by RBAC (403).
    await cluster.wait_for("the controller's DaemonSet policy enforced",
                           lambda: post(privileged)[0] == 422, 60)  # fmt: skip
    refusals = {}
    code, refusals["hostPath"] = post(privileged)
    assert "has no volume, host network" in json.loads(refusals["hostPath"])["message"]
    other = json.loads(json.dumps(sent))
    other["spec"]["template"]["spec"]["containers"][0]["image"] = "attacker/root:1"
    code, refusals["image"] = post(other)
    assert code == 422 and "runs one container: gpu-dra compute-domain-daemon" in refusals["image"]
    plugin = json.loads(json.dumps(sent))
    plugin["spec"]["template"]["spec"]["serviceAccountName"] = "gpu-dra-driver-kubelet-plugin"
    code, refusals["account"] = post(plugin)
    assert code == 422 and "runs as the IMEX daemons' ServiceAccount" in refusals["account"]
    # What the controller sends, stored: the policy sees it after the server's defaulting.
    assert post(sent, dry=False)[0] == 201, post(sent)
    # The unit tests' model of the server's defaulting is the server's (what the policy sees).
    stored = cluster.call("GET", ds_path)
    assert stored["spec"]["template"] == served(sent)["spec"]["template"]
    patched = cluster.raw("PATCH", ds_path, {"spec": sent["spec"]}, token=token, content_type=MERGE)
    assert patched[0] == 200, patched
    hosted = {"spec": {"template": {"spec": {"hostPID": True}}}}
    code, raw = cluster.raw("PATCH", ds_path, hosted, token=token, content_type=MERGE)
    refusals["hostPID patched in"] = raw.decode(errors="replace")
    assert code == 422 and "has no volume, host network, PID" in refusals["hostPID patched in"]
    # A DaemonSet of another image (an older chart's, set here by the admin) still has its
    # metadata patched: its domain's deletion releases it.
    container = {**sent["spec"]["template"]["spec"]["containers"][0], "image": "x:0.1.0"}
    older = {"spec": {"template": {"spec": {"containers": [container]}}}}
    assert cluster.raw("PATCH", ds_path, older, content_type=MERGE)[0] == 200
    release = {"metadata": {"finalizers": None}}
    code, raw = cluster.raw("PATCH", ds_path, release, token=token, content_type=MERGE)
    assert code == 200, raw
    templates = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates"
    template = daemon_template(domain(uid=uid), settings)
    code, raw = cluster.raw("POST", templates + "?dryRun=All", template, token=token)
    assert code == 201, raw
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = DRIVER

    def post_template() -> tuple[int, bytes]:
        return cluster.raw("POST", templates + "?dryRun=All", template, token=token)

    await cluster.wait_for("the template policy enforced", lambda: post_template()[0] == 422, 60)
    refusals["template"] = post_template()[1].decode(errors="replace")
    assert "request exactly one device of" in refusals["template"]
    # A Node with the domain label and a taint: the label goes, the taint stays.
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gb-x", "labels": {cd_names.COMPUTE_DOMAIN_LABEL: uid}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}}  # fmt: skip
    cluster.create(node)
    nodes = "/api/v1/nodes/gb-x"
    # Probed with a dry run, which changes nothing either way.
    untaint = {"spec": {"taints": None}}
    await cluster.wait_for("the Node policy enforced", lambda: cluster.raw(
        "PATCH", nodes + "?dryRun=All", untaint, token=token, content_type=MERGE)[0] == 422,
        60)  # fmt: skip
    for name, patch in (
        ("taint", untaint),
        ("label", {"metadata": {"labels": {"team": "ml"}}}),
    ):
        code, raw = cluster.raw("PATCH", nodes, patch, token=token, content_type=MERGE)
        refusals[name] = raw.decode(errors="replace")
        assert code == 422 and "may only remove the label" in refusals[name], (code, raw)
    removal = {"metadata": {"labels": {cd_names.COMPUTE_DOMAIN_LABEL: None}}}
    code, raw = cluster.raw("PATCH", nodes, removal, token=token, content_type=MERGE)
    assert code == 200, raw
    stored = cluster.call("GET", nodes)
    assert cd_names.COMPUTE_DOMAIN_LABEL not in stored["metadata"].get("labels", {})
    # (The TaintNodesByCondition admission plugin adds its not-ready taint beside ours.)
    assert node["spec"]["taints"][0] in stored["spec"]["taints"]
    for name, body in refusals.items():
        print(f"\nrefused ({name}): {json.loads(body)['message']}")


async def test_another_drivers_config_is_not_ours_to_check(cluster: ControlPlane) -> None:
    claim = _claim({"anything": True})
    claim["spec"]["devices"]["config"][0]["opaque"]["driver"] = "example.com"
    assert _post(cluster, claim)[0] == 201


async def test_the_server_and_the_decoder_agree_on_every_generated_config(
    cluster: ControlPlane,
) -> None:
    rng = random.Random(SEED)
    cases = [generate(rng) for _ in range(CASES)]
    verdicts: Counter[str] = Counter()
    disagreements = []
    admitted = []
    for i, params in enumerate(cases):
        ours = _decoder_admits(params)
        code, body = _post(cluster, _claim(params, name=f"c{i}", template=i % 5 == 0))
        if code not in (201, 422):
            raise AssertionError(f"case {i}: {code} {body[:500]}")
        # What the API server's own validation refuses (a non-object) never reaches either.
        if code == 422 and POLICY not in body:
            verdicts["refused by the API server's own validation"] += 1
            admitted.append(False)
            continue
        server = code == 201
        verdicts[f"{'admitted' if server else 'refused'} by both" if server == ours
                 else "disagreed"] += 1  # fmt: skip
        admitted.append(ours)
        if server != ours:
            disagreements.append((i, params, code, body[:300]))
    coverage = _coverage(cases, admitted)
    print(f"\n{CASES} configs at {MINOR}: {dict(verdicts)}")
    for path, (ok, bad) in coverage.items():
        print(f"  {path}: {ok} admitted, {bad} refused")
    assert not disagreements, disagreements[:5]
    # Every field of GpuConfig was hit by at least one admitted and one refused config; an
    # unknown field never passes.
    assert set(FIELDS) <= set(coverage), set(FIELDS) - set(coverage)
    assert all(coverage[f][0] and coverage[f][1] for f in FIELDS), coverage
    assert all(ok == 0 for f, (ok, _) in coverage.items() if f not in FIELDS), coverage
    assert verdicts["admitted by both"] > CASES // 5
    assert verdicts["refused by both"] > CASES // 5


# -- the MPS control daemon pods: what a node's kubelet plugin may make -----------------------

MPS_NODE = "mps-node-a"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plugin_token_of_a_node(cluster: ControlPlane) -> str:
    """The chart's ServiceAccount and its pod RBAC, a Node, and a token bound to a pod there:
    the kubelet plugin of that node, as the API server authenticates it."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    assert cluster.raw("POST", "/api/v1/namespaces", namespace)[0] in (201, 409)
    for obj in chart_objects(cluster.minor):
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            cluster.create(obj, NAMESPACE)
    cluster.create(node_object(MPS_NODE, "p5.48xlarge"))
    return plugin_token(cluster, MPS_NODE)


def _plugins_daemon_pod() -> dict[str, Any]:
    """What daemon_pod makes, with the flags the chart's DaemonSet gives the plugin."""
    (plugin,) = [o for o in render((), ()) if o["kind"] == "DaemonSet"]
    (container,) = plugin["spec"]["template"]["spec"]["containers"]
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in container["args"][1:])
    config = MpsPodConfig(namespace=NAMESPACE, image=flags["image"],
                          pull_policy=flags["image-pull-policy"],
                          driver_name=flags["driver-name"])  # fmt: skip
    pipes = Path(flags["kubelet-plugins-directory-path"]) / flags["driver-name"] / "mps"
    root = Path(flags["container-driver-root"])
    spec = DaemonSpec(MPS_NODE, "GPU-9b7e2a4c-1111-2222-3333-444455556666",
                      default_control(root), pipes / "9b7e2a4c1111", pipes / "log",
                      Path(flags["nvidia-driver-root"]), root)  # fmt: skip
    return daemon_pod(config, spec)


def _create_pod(cp: ControlPlane, pod: dict[str, Any], token: str) -> tuple[int, str]:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All"
    code, body = cp.raw("POST", path, pod, token=token)
    return code, body.decode(errors="replace")


async def test_a_plugin_may_make_its_mps_daemon_pod_and_nothing_more(
    cluster: ControlPlane, plugin_token_of_a_node: str
) -> None:
    """A pod with a ComputeDomain daemon's label would count the node Ready in that domain's
    status: the chart's policy refuses it, and any pod but the one daemon_pod makes."""
    token = plugin_token_of_a_node
    labelled = _plugins_daemon_pod()
    labelled["metadata"]["labels"][cd_names.COMPUTE_DOMAIN_LABEL] = "0c9f5bb1"
    labelled["metadata"]["labels"][cd_names.CLIQUE_LABEL] = ""
    # The policy is active once the API server refuses what it must.
    await cluster.wait_for(
        "the MPS pod policy enforced", lambda: _create_pod(cluster, labelled, token)[0] != 201, 60
    )
    code, body = _create_pod(cluster, labelled, token)
    message = json.loads(body)["message"]
    print(f"\nrefused at {MINOR}: {code} {message}")
    assert code == 422, message  # a policy's refusal is Invalid unless it says otherwise
    assert "ValidatingAdmissionPolicy 'gpu-dra-driver-mps-daemon-pods'" in message, message
    assert "an MPS control daemon pod is the one the kubelet plugin makes" in message, message
    assert _create_pod(cluster, _plugins_daemon_pod(), token)[0] == 201
    path = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
    checked = cluster.call("GET", path + "gpu-dra-driver-mps-daemon-pods").get("status", {})
    assert not checked.get("typeChecking", {}).get("expressionWarnings"), checked
    command = _plugins_daemon_pod()
    command["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "id"]
    extra = _plugins_daemon_pod()
    extra["spec"]["containers"][0]["env"].append({"name": "LD_PRELOAD", "value": "/x.so"})
    for pod in (command, extra):
        code, body = _create_pod(cluster, pod, token)
        assert code == 422 and "the kubelet plugin makes" in body, body


async def test_a_delete_of_another_nodes_pod_is_refused_and_said_to_be_admissions(
    cluster: ControlPlane, plugin_token_of_a_node: str
) -> None:
    """The chart's refusal of a delete of another node's pod, as the real server words it:
    what the plugin's client makes of it quotes the policy, and does not send the operator
    to the ClusterRole."""
    other = copy.deepcopy(_plugins_daemon_pod())
    other["spec"]["nodeName"] = "mps-node-b"
    created = cluster.create(other, NAMESPACE)  # as an admin: the policy is the plugin's
    name = created["metadata"]["name"]
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}?dryRun=All"
    code, body = cluster.raw("DELETE", path, token=plugin_token_of_a_node)
    message = json.loads(body)["message"]
    print(f"\nrefused at {MINOR}: {code} {message}")
    assert code == 422, message
    assert f"not pod {name} of node mps-node-b" in message, message
    assert str(error_for(code, "delete", "pods", message)) == f"delete pods: HTTP 422: {message}"
    # The same refusal as a 403 (a policy whose validation sets reason: Forbidden, a webhook):
    # an admission's still, not RBAC's.
    error = str(error_for(403, "delete", "pods", message))
    assert error == f"refused by admission: cannot delete pods: {message}"
    cluster.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
