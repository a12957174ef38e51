"""The ComputeDomain stack's admission policies, evaluated with the official CEL runtime as
tests/test_chart_policy.py does the plugin's: the IMEX daemon DeviceClass only from the driver's
namespace, and the IMEX daemons' own pod and clique entry as all a daemon may write."""

import random
from typing import Any

import pytest
from cel_expr_python import cel

from cluster.computedomain.objects import daemon_template, workload_template
from drivers.computedomain import names
from tests.chart_render import NAMESPACE, render
from tests.computedomains import SETTINGS, domain

UID = "3b1c6a4e-8f2d-4c1a-9e7b-5d0f2a6c8e11"
_ENV = cel.NewEnv(
    variables={name: cel.Type.DYN for name in ("request", "object", "oldObject", "variables")}
)


def policy(suffix: str) -> dict[str, Any]:
    (found,) = [
        o
        for o in render((), ("computeDomains.enabled=true",))
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith(suffix)
    ]
    spec: dict[str, Any] = found["spec"]
    return spec


def evaluate(
    spec: dict[str, Any],
    *,
    operation: str,
    resource: str,
    namespace: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    user: str = "system:serviceaccount:team-b:default",
    extra: dict[str, list[str]] | None = None,
) -> list[str]:
    """The denials of one request as the API server's admission plugin would give them;
    [] when admitted or not matched (the match constraints' resources are checked too)."""
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(resource in r["resources"] and operation in r["operations"] for r in rules):
        return []
    data: dict[str, Any] = {
        "request": {
            "operation": operation,
            "namespace": namespace,
            "name": str(((obj or old or {}).get("metadata") or {}).get("name", "")),
            "resource": {"resource": resource},
            "userInfo": {"username": user, "extra": extra or {}},
        },
        "object": obj,
        "oldObject": old,
        "variables": {},
    }

    def run(expression: str) -> Any:
        return _ENV.compile(expression).eval(data=data).plain_value()

    for variable in spec.get("variables", ()):
        data["variables"][variable["name"]] = run(variable["expression"])
    if not all(run(c["expression"]) for c in spec.get("matchConditions", ())):
        return []
    return [
        str(run(v["messageExpression"]))
        if "messageExpression" in v
        else " ".join(v["message"].split())
        for v in spec["validations"]
        if run(v["expression"]) is not True
    ]


# -- the IMEX daemon DeviceClass ---------------------------------------------------------


@pytest.fixture(scope="module")
def daemon_class() -> dict[str, Any]:
    return policy("-compute-domain-daemon-class")


def _in(template: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**template, "metadata": {**template["metadata"], "namespace": namespace}}


def _claim(request: dict[str, Any], namespace: str = "team-b") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "steal", "namespace": namespace},
        "spec": {"devices": {"requests": [request]}},
    }


def _class_denials(spec: dict[str, Any], obj: dict[str, Any], resource: str) -> list[str]:
    return evaluate(
        spec, operation="CREATE", resource=resource, namespace=obj["metadata"]["namespace"], obj=obj
    )


def test_the_controllers_daemon_template_and_claims_are_admitted(
    daemon_class: dict[str, Any],
) -> None:
    cd = domain(uid=UID)
    template = _in(daemon_template(cd, SETTINGS), NAMESPACE)
    assert _class_denials(daemon_class, template, "resourceclaimtemplates") == []
    claim = _claim(
        {"name": "daemon", "exactly": {"deviceClassName": names.DAEMON_CLASS}}, NAMESPACE
    )
    assert _class_denials(daemon_class, claim, "resourceclaims") == []
    # A workload's channel template, in the domain's namespace, is none of this policy's.
    assert _class_denials(daemon_class, workload_template(cd), "resourceclaimtemplates") == []


def test_a_tenants_claim_or_template_for_the_daemon_class_is_denied(
    daemon_class: dict[str, Any],
) -> None:
    cd = domain(uid=UID)
    message = (
        f"the DeviceClass {names.DAEMON_CLASS} is the IMEX daemons' own: only a claim in the "
        f"driver's namespace ({NAMESPACE}) may request it, not one in team-b"
    )
    template = _in(daemon_template(cd, SETTINGS), "team-b")
    assert _class_denials(daemon_class, template, "resourceclaimtemplates") == [message]
    exactly = {"name": "d", "exactly": {"deviceClassName": names.DAEMON_CLASS}}
    assert _class_denials(daemon_class, _claim(exactly), "resourceclaims") == [message]
    # Hidden among a request's alternatives.
    first = {
        "name": "d",
        "firstAvailable": [
            {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
            {"name": "imex", "deviceClassName": names.DAEMON_CLASS},
        ],
    }
    assert _class_denials(daemon_class, _claim(first), "resourceclaims") == [message]
    channel = {"name": "c", "exactly": {"deviceClassName": names.DEFAULT_CHANNEL_CLASS}}
    assert _class_denials(daemon_class, _claim(channel), "resourceclaims") == []


# -- the IMEX daemons' writes ------------------------------------------------------------

DAEMON_USER = f"system:serviceaccount:{NAMESPACE}:{names.DAEMON_SERVICE_ACCOUNT}"
POD = f"{names.daemon_name(UID)}-x7k2q"  # the DaemonSet's generated name
CLIQUE_ID = "00000000-0000-0000-0000-000000000001.0"
_ENTRY = "the IMEX daemon on node {node} may write only its own node's entry of clique"


def _token(pod: str = POD, node: str = "gb-a") -> dict[str, list[str]]:
    return {
        "authentication.kubernetes.io/pod-name": [pod],
        "authentication.kubernetes.io/node-name": [node],
    }


@pytest.fixture(scope="module")
def pods() -> dict[str, Any]:
    return policy("-compute-domain-daemon-pods")


@pytest.fixture(scope="module")
def cliques() -> dict[str, Any]:
    return policy("-compute-domain-daemon-cliques")


def _pod(name: str, image: str = "registry.example/gpu-dra:1", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "x", **labels}},
        "spec": {"nodeName": "gb-a", "containers": [{"name": "c", "image": image}]},
    }


def _patch(spec: dict[str, Any], old: dict[str, Any], new: dict[str, Any], **kw: Any) -> list[str]:
    return evaluate(
        spec,
        operation="UPDATE",
        resource="pods",
        namespace=NAMESPACE,
        obj=new,
        old=old,
        user=DAEMON_USER,
        extra=kw.pop("extra", _token()),
    )


def test_a_daemon_labels_its_own_pod_with_its_clique(pods: dict[str, Any]) -> None:
    # What cliquesource.label_pod sends, merged into the pod.
    labelled = _pod(POD, **{names.CLIQUE_LABEL: CLIQUE_ID})
    assert _patch(pods, _pod(POD), labelled) == []
    assert _patch(pods, labelled, _pod(POD, **{names.CLIQUE_LABEL: ""})) == []


def test_a_daemon_may_not_patch_another_pod_or_more_than_the_label(pods: dict[str, Any]) -> None:
    plugin = "gpu-dra-driver-kubelet-plugin-abcde"
    assert _patch(pods, _pod(plugin), _pod(plugin, image="attacker/root:1")) == [
        f"the IMEX daemon of pod {POD} may not modify pod {plugin}",
        f"an IMEX daemon may change only the label {names.CLIQUE_LABEL} of its own pod",
    ]
    only_label = [f"an IMEX daemon may change only the label {names.CLIQUE_LABEL} of its own pod"]
    assert _patch(pods, _pod(POD), _pod(POD, image="attacker/root:1")) == only_label
    assert _patch(pods, _pod(POD), _pod(POD, team="x")) == only_label
    annotated = _pod(POD)
    annotated["metadata"]["annotations"] = {"a": "b"}
    assert _patch(pods, _pod(POD), annotated) == only_label
    unbound = _patch(pods, _pod(POD), _pod(POD), extra={})
    assert unbound[0].startswith("the service account token carries no pod name")
    # Another user (the controller, an admin) is none of this policy's.
    other = evaluate(pods, operation="UPDATE", resource="pods", namespace=NAMESPACE,
                     obj=_pod(plugin, image="x"), old=_pod(plugin))  # fmt: skip
    assert other == []


def _member(node: str = "gb-a", pod: str = POD, ip: str = "10.0.0.1") -> Any:
    from cluster.imexdaemon.membership import Member

    return Member(NAMESPACE, UID, CLIQUE_ID, node, pod, f"uid-{pod}", ip)


def _write(
    spec: dict[str, Any], new: dict[str, Any], old: dict[str, Any] | None = None, **kw: Any
) -> list[str]:
    return evaluate(
        spec,
        operation="UPDATE" if old is not None else "CREATE",
        resource="computedomaincliques",
        namespace=NAMESPACE,
        obj=new,
        old=old,
        user=DAEMON_USER,
        extra=kw.pop("extra", _token()),
    )


def test_a_daemon_creates_joins_updates_and_leaves_its_clique(cliques: dict[str, Any]) -> None:
    from cluster.imexdaemon.membership import joined, left, new_clique

    b_pod = f"{names.daemon_name(UID)}-b0b0b"
    b_token = _token(b_pod, "gb-b")
    first = new_clique(_member(), ready=False)
    assert _write(cliques, first) == []
    both = joined(first, _member("gb-b", b_pod, "10.0.0.2"), ready=False)
    assert both is not None
    assert _write(cliques, both, first, extra=b_token) == []
    ready = joined(both, _member(), ready=True)
    assert ready is not None and _write(cliques, ready, both) == []
    gone = left(ready, _member())
    assert gone is not None and _write(cliques, gone, ready) == []


def test_a_daemon_may_not_write_another_nodes_entry_or_domain(cliques: dict[str, Any]) -> None:
    from cluster.imexdaemon.membership import joined, new_clique

    b_pod = f"{names.daemon_name(UID)}-b0b0b"
    first = new_clique(_member(), ready=True)
    both = joined(first, _member("gb-b", b_pod, "10.0.0.2"), ready=True)
    assert both is not None
    # gb-a rewrites gb-b's address (a peer's /etc/hosts line), or drops it.
    forged = {
        **both,
        "daemons": [both["daemons"][0], {**both["daemons"][1], "ipAddress": "6.6.6.6"}],
    }
    entry_denial = [f"{_ENTRY.format(node='gb-a')} {UID}.{CLIQUE_ID}"]
    assert _write(cliques, forged, both) == entry_denial
    assert _write(cliques, {**both, "daemons": both["daemons"][:1]}, both) == entry_denial
    # A clique created holding another node.
    assert _write(cliques, first, extra=_token(node="gb-z")) == [
        f"{_ENTRY.format(node='gb-z')} {UID}.{CLIQUE_ID}"
    ]
    # Another domain's clique: a daemon of one domain listing itself among another's peers.
    other = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
    foreign = new_clique(_member(), ready=True)
    foreign["metadata"] = {
        **foreign["metadata"],
        "name": f"{other}.{CLIQUE_ID}",
        "labels": {names.COMPUTE_DOMAIN_LABEL: other, names.CLIQUE_LABEL: CLIQUE_ID},
    }
    (denial,) = _write(cliques, foreign)
    assert denial.startswith(f"the IMEX daemon of pod {POD} may write only a clique of its own")
    # Its labels or another pod among the owners.
    relabelled = {**both, "metadata": {**both["metadata"], "labels": {"x": "y"}}}
    assert len(_write(cliques, relabelled, both)) == 2
    plugin = {"apiVersion": "v1", "kind": "Pod", "name": "gpu-dra-kubelet-plugin-x", "uid": "u"}
    owned = {**both, "metadata": {**both["metadata"], "ownerReferences": [plugin]}}
    (denial,) = _write(cliques, owned, both)
    assert "may add only its own pod to the owners" in denial


# -- the ComputeDomain driver's opaque configs -------------------------------------------


@pytest.fixture(scope="module")
def cd_configs() -> dict[str, Any]:
    return policy("-computedomainconfig")


def _config_claim(params: Any, driver: str = names.DRIVER_NAME) -> dict[str, Any]:
    request = {"name": "c", "exactly": {"deviceClassName": names.DEFAULT_CHANNEL_CLASS}}
    config = {"requests": ["c"], "opaque": {"driver": driver, "parameters": params}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team-b"},
        "spec": {"devices": {"requests": [request], "config": [config]}},
    }


def _config_denials(spec: dict[str, Any], params: Any, **kw: Any) -> list[str]:
    return evaluate(spec, operation="CREATE", resource="resourceclaims", namespace="team-b",
                    obj=_config_claim(params, **kw))  # fmt: skip


def _decoder_admits(params: Any) -> bool:
    from api.computedomain import parse_compute_domain_config
    from api.config import ConfigError

    try:
        parse_compute_domain_config(params, source="opaque config #1")
    except ConfigError:
        return False
    return True


def test_the_controllers_configs_are_admitted_and_a_bulky_unknown_kind_is_not(
    cd_configs: dict[str, Any],
) -> None:
    cd = domain(uid=UID)
    for template in (daemon_template(cd, SETTINGS), workload_template(cd)):
        params = template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        assert _config_denials(cd_configs, params) == []
    bulky = {"apiVersion": names.API_VERSION, "kind": "Anything",
             **{f"k{i}": "x" * 100 for i in range(2000)}}  # fmt: skip
    denials = _config_denials(cd_configs, bulky)
    assert "spec.devices.config[].opaque.parameters: a ComputeDomain config has at most 4 " \
        "fields, not 2002" in denials  # fmt: skip
    assert any('field "kind"' in d for d in denials)
    # Another driver's config is none of this policy's.
    assert _config_denials(cd_configs, bulky, driver="example.com") == []


_VALUES: dict[str, list[Any]] = {
    "apiVersion": [names.API_VERSION, "resource.nvidia.com/v1", "", None, 1],
    "kind": [names.CHANNEL_CONFIG_KIND, names.DAEMON_CONFIG_KIND, "GpuConfig",
             "computedomainchannelconfig", "", None, 3],
    "domainID": [UID, UID.upper(), UID[:-1], f"{UID}x", "", None, 7, [UID]],
    "allocationMode": ["All", "Single", "all", "", None, 1],
    "extra": ["x", None],
}  # fmt: skip


def test_the_policy_admits_exactly_what_the_decoder_parses(cd_configs: dict[str, Any]) -> None:
    """Generated configs, every field present or absent with valid and near-miss values: the
    chart's policy and api/computedomain.py give every one the same verdict."""
    rng = random.Random(20261204)
    verdicts = {True: 0, False: 0}
    for _ in range(600):
        # Each field present mostly, and mostly its first (valid) values.
        params: dict[str, Any] = {
            key: values[0] if rng.random() < 0.8 else rng.choice(values)
            for key, values in _VALUES.items()
            if rng.random() < (0.95 if key in ("apiVersion", "kind", "domainID") else 0.3)
        }
        if rng.random() < 0.5 and params.get("kind") == names.CHANNEL_CONFIG_KIND:
            params["kind"] = names.DAEMON_CONFIG_KIND
        ours = _decoder_admits(params)
        server = _config_denials(cd_configs, params) == []
        assert server == ours, (params, _config_denials(cd_configs, params))
        verdicts[ours] += 1
    shapes: list[Any] = [None, "text", [1], {}]
    for shape in shapes:
        assert _config_denials(cd_configs, shape) and not _decoder_admits(shape)
    assert verdicts[True] > 30 and verdicts[False] > 300, verdicts
