"""The rendered ValidatingAdmissionPolicies, evaluated with the official CEL runtime.

cel-expr-python (the C++ CEL implementation) compiles and runs the policy's own expressions
the way the API server's admission plugin does: variables in order, then the match condition,
then every validation. Request and objects are dynamic maps, as the API server presents them.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cel_expr_python import cel

from driver.kube.lease import lease_name
from drivers.computedomain import names
from drivers.gpu.kinds.mps import default_control
from drivers.gpu.kinds.mpspod import DaemonSpec, MpsPodConfig, daemon_pod
from drivers.gpu.resourceslice import build_resource_slices
from tests.chart_render import render

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"

_ENV = cel.NewEnv(
    variables={name: cel.Type.DYN for name in ("request", "object", "oldObject", "variables")}
)


def _eval(expression: str, data: dict[str, Any]) -> Any:
    return _ENV.compile(expression).eval(data=data).plain_value()


@dataclass(frozen=True)
class Policy:
    spec: dict[str, Any]
    plugin_user: str  # the username of the chart's service account


def _policy(resource: str, *sets: str) -> Policy:
    objects = render((), sets)
    (found,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == [resource]
    ]
    (plugin,) = [o for o in objects if o["kind"] == "DaemonSet"]
    account = plugin["spec"]["template"]["spec"]["serviceAccountName"]
    return Policy(
        found["spec"], f"system:serviceaccount:{plugin['metadata']['namespace']}:{account}"
    )


@pytest.fixture(scope="module")
def policy() -> Policy:
    return _policy("resourceslices")


@pytest.fixture(scope="module")
def lease_policy() -> Policy:
    return _policy("leases")


def admit(
    policy: Policy,
    *,
    operation: str,
    slice_node: str | None,
    user_node: str | None,
    driver: str = "gpu.nvidia.com",
    user: str | None = None,
    pool: str | None = None,
    name: str | None = None,
) -> list[str]:
    """The denial messages for one request; [] when admitted (or when the policy does not match).

    The slice's pool is named after its node unless ``pool`` says otherwise, and the slice
    as the controller names it unless ``name`` says otherwise.
    """
    spec: dict[str, Any] = {"driver": driver, "pool": {"name": pool or slice_node or "p"}}
    if slice_node is not None:
        spec["nodeName"] = slice_node
    name = name or f"00000-{driver}-{slice_node or 'p'}"
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }
    return evaluate(policy, operation=operation, obj=obj, user_node=user_node, user=user)


def evaluate(
    policy: Policy,
    *,
    operation: str,
    obj: dict[str, Any],
    user_node: str | None,
    user: str | None = None,
    request_name: str | None = None,
    old: dict[str, Any] | None = None,
) -> list[str]:
    """``request_name``: the request's ``name``, by default the object's; the API server
    gives "" for a CREATE whose name it generates (from ``generateName``). ``old``: the
    object before an UPDATE, by default the object itself."""
    extra = {NODE_NAME_KEY: [user_node]} if user_node is not None else {}
    if request_name is None:
        request_name = str(obj.get("metadata", {}).get("name", ""))
    data: dict[str, Any] = {
        "request": {
            "operation": operation,
            "name": request_name,
            "userInfo": {"username": user or policy.plugin_user, "extra": extra},
        },
        "object": None if operation == "DELETE" else obj,
        "oldObject": (old or obj) if operation in ("DELETE", "UPDATE") else None,
        "variables": {},
    }
    spec_ = policy.spec
    for variable in spec_["variables"]:
        data["variables"][variable["name"]] = _eval(variable["expression"], data)
    if not all(_eval(c["expression"], data) for c in spec_["matchConditions"]):
        return []
    denials = []
    for validation in spec_["validations"]:
        if _eval(validation["expression"], data) is not True:
            if "messageExpression" in validation:
                denials.append(str(_eval(validation["messageExpression"], data)))
            else:
                denials.append(" ".join(validation["message"].split()))
    return denials


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_own_node_is_admitted(policy: Policy, operation: str) -> None:
    assert admit(policy, operation=operation, slice_node="node-a", user_node="node-a") == []


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_other_node_is_denied(policy: Policy, operation: str) -> None:
    assert admit(policy, operation=operation, slice_node="node-b", user_node="node-a") == [
        "the kubelet plugin on node node-a may not modify ResourceSlices of node node-b"
    ]


def test_cluster_scoped_slice_is_denied(policy: Policy) -> None:
    (denial,) = admit(
        policy, operation="CREATE", slice_node=None, user_node="node-a", pool="node-a"
    )
    assert "ResourceSlices without spec.nodeName" in denial


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_a_slice_on_its_own_node_naming_another_nodes_pool_is_denied(
    policy: Policy, operation: str
) -> None:
    denials = admit(
        policy, operation=operation, slice_node="node-a", user_node="node-a", pool="node-b"
    )
    assert denials == [
        "the kubelet plugin on node node-a may not modify ResourceSlices of pool node-b"
    ]


def test_other_driver_is_denied(policy: Policy) -> None:
    denials = admit(
        policy, operation="CREATE", slice_node="node-a", user_node="node-a", driver="x.example.com"
    )
    assert denials == [
        "the kubelet plugin of gpu.nvidia.com may not modify ResourceSlices of driver x.example.com"
    ]


def test_token_without_node_is_denied(policy: Policy) -> None:
    denials = admit(policy, operation="CREATE", slice_node="node-a", user_node=None)
    assert denials[0].startswith("the service account token carries no node name")


def test_other_users_are_not_matched(policy: Policy) -> None:
    # The kubelet itself deletes a node's slices when the plugin is gone: not our business.
    assert (
        admit(
            policy,
            operation="DELETE",
            slice_node="node-b",
            user_node="node-a",
            user="system:node:node-a",
        )
        == []
    )


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
@pytest.mark.parametrize(
    "name",
    [
        "00000-gpu.nvidia.com-node-b",  # node-b's first slice: squatted, node-b's create 409s
        "00000-gpu.nvidia.com-node-a-b",
        "intruder-node-a",
        "0000g-gpu.nvidia.com-node-a",
        "x00000-gpu.nvidia.com-node-a",
        "gpu.nvidia.com-node-a",
    ],
)
def test_a_slice_on_its_own_node_under_another_name_is_denied(
    policy: Policy, operation: str, name: str
) -> None:
    assert admit(
        policy, operation=operation, slice_node="node-a", user_node="node-a", name=name
    ) == [
        f"the kubelet plugin on node node-a may not modify ResourceSlice {name}: its slices "
        "are named <hex index>-gpu.nvidia.com-node-a"
    ]


def test_every_name_the_controller_writes_is_admitted(tmp_path: Path) -> None:
    """The policy's name rule and driver.slices.model must agree, or every write is
    denied."""
    from driver.slices.model import slice_name

    for count in (1, 3, 20, 70000):
        for index in {0, 1, count - 1}:
            name = slice_name(index, count, "gpu.nvidia.com", "ip-10-0-0-1.ec2.internal")
            assert name is not None
            assert (
                admit(
                    policy_for_names(),
                    operation="CREATE",
                    slice_node="ip-10-0-0-1.ec2.internal",
                    user_node="ip-10-0-0-1.ec2.internal",
                    name=name,
                )
                == []
            )
    # A node name so long that the controller falls back to generateName.
    long_node = "n" * 240
    assert slice_name(0, 1, "gpu.nvidia.com", long_node) is None
    for operation in ("CREATE", "UPDATE", "DELETE"):
        body = generated_slice(0, 1, long_node, long_node)
        assert generated_request(policy_for_names(), operation, body, long_node) == []


def _long_node(length: int) -> str:
    """A valid node name (a DNS subdomain: labels of at most 63) of ``length`` characters."""
    labels, rest = divmod(length, 62)
    return ".".join(["n" * 61] * labels + ["m" * rest] if rest else ["n" * 61] * labels)


def generated_slice(index: int, count: int, node: str, own_node: str) -> dict[str, Any]:
    """A slice of ``node`` as the controller sends it for a long name, with the name the API
    server gives it (the generateName cut to 248 characters, five random ones after)."""
    from driver.slices.model import slice_metadata

    metadata = slice_metadata(index, count, "gpu.nvidia.com", node)
    assert set(metadata) == {"generateName"}, metadata
    name = metadata["generateName"][:248] + "x7k2p"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "generateName": metadata["generateName"]},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": own_node, "pool": {"name": own_node}},
    }


def generated_request(policy: Policy, operation: str, body: dict[str, Any], node: str) -> list[str]:
    # On CREATE the request's name is "": the server generates it after the request.
    request_name = "" if operation == "CREATE" else body["metadata"]["name"]
    return evaluate(
        policy, operation=operation, obj=body, user_node=node, request_name=request_name
    )


@pytest.mark.parametrize("length", [233, 240, 253])
def test_a_long_named_nodes_slices_are_admitted(tmp_path: Path, length: int) -> None:
    """Every slice the controller writes for a long-named node, and its probes, pass."""
    from driver.nvml.simulated import SimulatedNode
    from driver.slices.capabilities import probe_slices
    from drivers.gpu.model.discovery import discover

    node = _long_node(length)
    assert len(node) == length
    simulated = SimulatedNode("p5.48xlarge", "n", tmp_path, state_file=tmp_path / "none")
    inventory = discover(simulated.nvml, sysfs_root=simulated.sysfs_root)
    slices = build_resource_slices(inventory, driver_name="gpu.nvidia.com", node_name=node)
    assert slices and all("generateName" in s["metadata"] for s in slices)
    for index in range(len(slices)):
        body = generated_slice(index, len(slices), node, node)
        assert body["spec"]["pool"]["name"] == slices[index]["spec"]["pool"]["name"]
        for operation in ("CREATE", "UPDATE", "DELETE"):
            assert generated_request(policy_for_names(), operation, body, node) == []
    for probe in probe_slices("gpu.nvidia.com", node).values():
        assert "generateName" in probe["metadata"]
        assert (
            evaluate(
                policy_for_names(), operation="CREATE", obj=probe, user_node=node, request_name=""
            )
            == []
        )


@pytest.mark.parametrize("length", [233, 253])
@pytest.mark.parametrize(
    "victim",
    ["node-b", "n" * 232],  # a short name, and the longest with a fixed name
)
def test_a_long_named_node_may_not_create_another_nodes_fixed_name(
    length: int, victim: str
) -> None:
    from driver.slices.model import slice_name

    node = _long_node(length)
    fixed = slice_name(0, 1, "gpu.nvidia.com", victim)
    assert fixed is not None
    squat = generated_slice(0, 1, node, node)
    squat["metadata"]["name"] = fixed  # chosen, not generated: the request names it
    (denial,) = evaluate(policy_for_names(), operation="CREATE", obj=squat, user_node=node)
    assert f"may not create ResourceSlice {fixed}" in denial
    del squat["metadata"]["generateName"]  # a plain create under the other node's name
    denials = evaluate(policy_for_names(), operation="CREATE", obj=squat, user_node=node)
    assert len(denials) == 2 and all(fixed in d for d in denials), denials


def test_a_long_named_node_may_not_generate_under_another_nodes_prefix() -> None:
    node, other = _long_node(253), _long_node(240)
    body = generated_slice(0, 1, other, node)  # its own nodeName and pool, another's prefix
    denials = generated_request(policy_for_names(), "CREATE", body, node)
    assert len(denials) == 1 and "generateName" in denials[0], denials


def test_the_capability_probes_are_admitted() -> None:
    """The publisher's dry-run probes are slices of the plugin's own too."""
    from driver.slices.capabilities import probe_slices

    for body in probe_slices("gpu.nvidia.com", "node-a").values():
        assert evaluate(policy_for_names(), operation="CREATE", obj=body, user_node="node-a") == []


def policy_for_names() -> Policy:
    return _policy("resourceslices")


def test_the_pool_the_policy_allows_is_the_one_the_node_publishes(tmp_path: Path) -> None:
    """The policy's pool rule and driver.slices.model must agree, or every write is
    denied."""
    from driver.nvml.simulated import SimulatedNode
    from drivers.gpu.model.discovery import discover

    simulated = SimulatedNode("p5.48xlarge", "node-a", tmp_path, state_file=tmp_path / "none")
    inventory = discover(simulated.nvml, sysfs_root=simulated.sysfs_root)
    slices = build_resource_slices(inventory, driver_name="gpu.nvidia.com", node_name="node-a")
    assert {s["spec"]["pool"]["name"] for s in slices} == {"node-a"}


def lease_request(
    lease_policy: Policy,
    *,
    operation: str,
    name: str,
    user_node: str | None,
    user: str | None = None,
) -> list[str]:
    obj = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "gpu-dra-driver"},
        "spec": {"holderIdentity": "pod-x"},
    }
    return evaluate(lease_policy, operation=operation, obj=obj, user_node=user_node, user=user)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_a_node_may_write_its_own_lease(lease_policy: Policy, operation: str) -> None:
    assert (
        lease_request(
            lease_policy, operation=operation, name="gpu.nvidia.com-node-a", user_node="node-a"
        )
        == []
    )


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
@pytest.mark.parametrize("name", ["gpu.nvidia.com-node-b", "gpu.nvidia.com-node-a2", "other"])
def test_a_node_may_not_write_another_nodes_lease(
    lease_policy: Policy, operation: str, name: str
) -> None:
    assert lease_request(lease_policy, operation=operation, name=name, user_node="node-a") == [
        "the kubelet plugin on node node-a may only modify the Lease gpu.nvidia.com-node-a, "
        f"not {name}"
    ]


def test_a_lease_write_without_a_node_in_the_token_is_denied(lease_policy: Policy) -> None:
    denials = lease_request(
        lease_policy, operation="CREATE", name="gpu.nvidia.com-node-a", user_node=None
    )
    assert denials[0].startswith("the service account token carries no node name")


def test_the_lease_policy_leaves_other_users_alone(lease_policy: Policy) -> None:
    assert (
        lease_request(
            lease_policy,
            operation="UPDATE",
            name="gpu.nvidia.com-node-b",
            user_node="node-a",
            user="system:serviceaccount:kube-system:leader-election",
        )
        == []
    )


def test_the_lease_name_the_policy_allows_is_the_controllers() -> None:
    """The policy and the controller must agree on the name, or every node would be denied."""
    assert lease_name("gpu.nvidia.com", "node-a") == "gpu.nvidia.com-node-a"


# -- the MPS control daemon pods ----------------------------------------------------------


@pytest.fixture(scope="module")
def pod_policy() -> Policy:
    return _policy("pods")


def _container_driver_root(*sets: str) -> Path:
    """Where the chart's DaemonSet tells the plugin its driver root is mounted."""
    (plugin,) = [o for o in render((), sets) if o["kind"] == "DaemonSet"]
    (container,) = plugin["spec"]["template"]["spec"]["containers"]
    (root,) = [a for a in container["args"] if a.startswith("--container-driver-root=")]
    return Path(root.partition("=")[2])


def _daemon(
    node: str, image: str = "gpu-dra-driver:0.2.0", control: Path | None = None
) -> dict[str, Any]:
    """The pod the plugin sends (drivers.gpu.kinds.mpspod), as the chart's flags configure it:
    the control binary where the plugin looks for it by default (or ``control``)."""
    config = MpsPodConfig(namespace="gpu-dra-driver", image=image, pull_policy="IfNotPresent")
    spec = DaemonSpec(node, "GPU-9b7e2a4c-1111-2222-3333-444455556666",
                      control or default_control(_container_driver_root()),
                      Path("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/9b7e2a4c1111"),
                      Path("/var/lib/kubelet/plugins/gpu.nvidia.com/kinds/gpu/mps/GPU-9b7e/log"),
                      Path("/"), Path("/driver-root"))  # fmt: skip
    return daemon_pod(config, spec)


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_a_plugin_makes_and_deletes_the_daemon_pods_of_its_own_node(
    pod_policy: Policy, operation: str
) -> None:
    assert (
        evaluate(pod_policy, operation=operation, obj=_daemon("node-a"), user_node="node-a") == []
    )


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_another_nodes_pod_or_another_pod_is_denied(pod_policy: Policy, operation: str) -> None:
    name = _daemon("node-b")["metadata"]["name"]
    assert evaluate(pod_policy, operation=operation, obj=_daemon("node-b"), user_node="node-a") == [
        "the kubelet plugin on node node-a may only create and delete MPS control daemon pods "
        f"(app.kubernetes.io/component=mps-control-daemon) of its own node, not pod {name} "
        "of node node-b"
    ]
    other = _daemon("node-a")
    other["metadata"]["labels"] = {"app.kubernetes.io/component": "compute-domain-controller"}
    assert evaluate(pod_policy, operation=operation, obj=other, user_node="node-a")


def _denied(pod: dict[str, Any]) -> list[str]:
    return evaluate(_policy("pods"), operation="CREATE", obj=pod, user_node="node-a")


def test_a_daemon_pod_that_could_reach_more_than_its_node_is_denied() -> None:
    """Another image, a service account's token, a secret by volume or environment, an init
    container: each would give the plugin more than its node's root."""
    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda p: p["spec"]["containers"][0].update(image="busybox"),
        lambda p: p["spec"].pop("automountServiceAccountToken"),
        lambda p: p["spec"].update(serviceAccountName="x", automountServiceAccountToken=True),
        lambda p: p["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "x"}}),
        lambda p: p["spec"]["containers"][0]["env"][0].update(
            value=None, valueFrom={"secretKeyRef": {"name": "x", "key": "t"}}),
        lambda p: p["spec"]["containers"][0].update(envFrom=[{"secretRef": {"name": "x"}}]),
        lambda p: p["spec"].update(initContainers=[{"name": "i", "image": "busybox"}]),
    ]  # fmt: skip
    for change in changes:
        pod = _daemon("node-a")
        change(pod)
        assert _denied(pod) == [
            "an MPS control daemon pod runs the chart's image, with no service account token, "
            "no init or ephemeral container, no value from another object and hostPath volumes "
            "only"
        ], pod


ONLY_THE_DAEMON = (
    "an MPS control daemon pod is the one the kubelet plugin makes: the labels "
    "app.kubernetes.io/component=mps-control-daemon and app.kubernetes.io/part-of=gpu.nvidia.com "
    "and no other, no owner, in the host's PID namespace and not its network or IPC, one "
    "container running {control} -f with no other argument and only the variables "
    "CUDA_VISIBLE_DEVICES, CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY"
)


def test_a_daemon_pod_that_is_more_than_the_daemon_is_denied(pod_policy: Policy) -> None:
    """Only what daemon_pod makes: a ComputeDomain daemon's label would count the node into
    that domain's status; another command, argument or variable runs something else as root
    on the node, under the daemon's name."""
    control = str(default_control(_container_driver_root()))
    assert evaluate(pod_policy, operation="CREATE", obj=_daemon("node-a"), user_node="node-a") == []

    def env(pod: dict[str, Any], name: str) -> None:
        pod["spec"]["containers"][0]["env"].append({"name": name, "value": "x"})

    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda p: p["metadata"]["labels"].update({names.COMPUTE_DOMAIN_LABEL: "9b1c"}),
        lambda p: p["metadata"]["labels"].update({names.CLIQUE_LABEL: ""}),
        lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/part-of": "x.example.com"}),
        lambda p: p["metadata"].update(ownerReferences=[
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u",
             "controller": True}]),
        lambda p: p["spec"]["containers"][0].update(command=["/bin/sh", "-c", "id"]),
        lambda p: p["spec"]["containers"][0].update(command=["/tmp/nvidia-cuda-mps-control", "-f"]),
        lambda p: p["spec"]["containers"][0].pop("command"),
        lambda p: p["spec"]["containers"][0].update(args=["--x"]),
        lambda p: env(p, "LD_PRELOAD"),
        lambda p: p["spec"].update(hostNetwork=True),
        lambda p: p["spec"].update(hostIPC=True),
        lambda p: p["spec"].update(hostPID=False),
        lambda p: p["spec"]["containers"].append(dict(p["spec"]["containers"][0], name="two")),
    ]  # fmt: skip
    for change in changes:
        pod = _daemon("node-a")
        change(pod)
        assert evaluate(pod_policy, operation="CREATE", obj=pod, user_node="node-a") == [
            ONLY_THE_DAEMON.format(control=control)
        ], pod
    # Its delete is left to the node rule: a pod the plugin could not make may still go.
    pod = _daemon("node-a")
    pod["metadata"]["labels"][names.COMPUTE_DOMAIN_LABEL] = "9b1c"
    assert evaluate(pod_policy, operation="DELETE", obj=pod, user_node="node-a") == []


@pytest.mark.parametrize(
    ("sets", "control"),
    [
        (("kubeletPlugin.extraArgs={--mps-control=/opt/mps/nvidia-cuda-mps-control}",),
         "/opt/mps/nvidia-cuda-mps-control"),
        (("kubeletPlugin.extraEnv[0].name=GPU_DRA_MPS_CONTROL",
          "kubeletPlugin.extraEnv[0].value=/opt/env/nvidia-cuda-mps-control"),
         "/opt/env/nvidia-cuda-mps-control"),
        (("kubeletPlugin.extraArgs={--container-driver-root=/host/}",),
         "/host/usr/bin/nvidia-cuda-mps-control"),
    ],
)  # fmt: skip
def test_the_daemons_binary_is_where_the_plugin_is_told_it_is(
    sets: tuple[str, ...], control: str
) -> None:
    """--mps-control (what `gpu-dra doctor` tells to set when the binary is not under the
    driver root) or another driver root, through the chart's extraArgs or extraEnv: the
    policy admits the binary the plugin then runs, and no longer the default one."""
    policy = _policy("pods", *sets)
    pod = _daemon("node-a", control=Path(control))
    assert evaluate(policy, operation="CREATE", obj=pod, user_node="node-a") == []
    default = _daemon("node-a")
    assert evaluate(policy, operation="CREATE", obj=default, user_node="node-a") == [
        ONLY_THE_DAEMON.format(control=control)
    ]


def test_the_pod_policy_leaves_other_users_alone(pod_policy: Policy) -> None:
    user = "system:serviceaccount:gpu-dra-driver:compute-domain-controller"
    pod = _daemon("node-b", image="other")
    assert evaluate(pod_policy, operation="CREATE", obj=pod, user_node=None, user=user) == []


CD = ("computeDomains.enabled=true",)  # the plugin also serves compute-domain.nvidia.com


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
@pytest.mark.parametrize("driver", ["gpu.nvidia.com", "compute-domain.nvidia.com"])
def test_with_compute_domains_both_drivers_slices_and_leases_of_its_node_are_admitted(
    operation: str, driver: str
) -> None:
    slices, leases = _policy("resourceslices", *CD), _policy("leases", *CD)
    assert (
        admit(slices, operation=operation, slice_node="node-a", user_node="node-a", driver=driver)
        == []
    )
    assert (
        lease_request(leases, operation=operation, name=f"{driver}-node-a", user_node="node-a")
        == []
    )


def test_with_compute_domains_other_drivers_and_nodes_stay_denied() -> None:
    slices, leases = _policy("resourceslices", *CD), _policy("leases", *CD)
    assert admit(
        slices, operation="CREATE", slice_node="node-a", user_node="node-a", driver="x.example.com"
    ) == [
        "the kubelet plugin of gpu.nvidia.com, compute-domain.nvidia.com may not modify "
        "ResourceSlices of driver x.example.com"
    ]
    assert admit(
        slices,
        operation="CREATE",
        slice_node="node-b",
        user_node="node-a",
        driver="compute-domain.nvidia.com",
    ) == ["the kubelet plugin on node node-a may not modify ResourceSlices of node node-b"]
    name = "compute-domain.nvidia.com-node-b"
    assert lease_request(leases, operation="UPDATE", name=name, user_node="node-a") == [
        "the kubelet plugin on node node-a may only modify the Lease gpu.nvidia.com-node-a or "
        f"compute-domain.nvidia.com-node-a, not {name}"
    ]
