"""The chart's ComputeDomain controller: rendered only with computeDomains.enabled, two replicas
leading by a Lease, its command line parsed by gpu-dra's own parser, and its RBAC equal to what
the controller sends through a whole domain's life against the local API server: every request
granted, every grant used, and the namespaced grants in the driver's namespace only."""

import asyncio
import re
from typing import Any

from cli import build_parser
from sandbox.apiserver import LocalApiServer
from tests.chart_render import NAMESPACE, render
from tests.computedomains import DRIVER_NAMESPACE, clique, daemon, daemon_pod, domain
from tests.test_computedomain_controller import Running, one, settled

ENABLED = ("computeDomains.enabled=true",)
NAME = "gpu-dra-driver-compute-domain-controller"


def objects(*sets: str) -> list[dict[str, Any]]:
    return render((), (*ENABLED, *sets))


def by_kind(found: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in found if o["kind"] == kind}


def grants(found: list[dict[str, Any]], kind: str, name: str) -> set[tuple[str, str, str]]:
    rules = by_kind(found, kind)[name]["rules"]
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_nothing_is_rendered_unless_enabled() -> None:
    assert not [o for o in render() if "compute-domain" in o["metadata"]["name"]]


def test_a_deployment_of_two_replicas_in_the_plugins_image() -> None:
    found = objects()
    deployment = by_kind(found, "Deployment")[NAME]
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    [container] = pod["containers"]
    daemonset = by_kind(found, "DaemonSet")["gpu-dra-driver-kubelet-plugin"]
    plugin_image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["image"] == plugin_image
    assert f"--image={plugin_image}" in container["args"]
    assert by_kind(found, "ServiceAccount").keys() >= {
        NAME,
        "compute-domain-daemon-service-account",
    }


def test_the_rendered_command_line_parses() -> None:
    found = objects("metrics.enabled=true", "imagePullSecrets[0].name=ecr")
    [container] = by_kind(found, "Deployment")[NAME]["spec"]["template"]["spec"]["containers"]
    env = {"POD_IP": "10.0.0.5"}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]
    parsed = build_parser().parse_args(argv)
    assert parsed.command == "compute-domain-controller"
    assert parsed.leader_elect is True
    assert parsed.image_pull_secrets == ("ecr",)
    assert (parsed.metrics_port, parsed.metrics_address) == (8081, "10.0.0.5")
    assert {e["name"] for e in container["env"]} >= {"POD_NAME", "POD_NAMESPACE"}


async def test_rbac_is_exactly_what_the_controller_sends(
    apiserver: LocalApiServer, api_client: Any
) -> None:
    apiserver.seed(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NAMESPACE}}
    )
    running = Running(api_client)
    ctl = running.start()
    try:
        [cd] = apiserver.seed(domain(num_nodes=1))
        uid = cd["metadata"]["uid"]
        await settled(ctl, lambda: apiserver.objects("daemonsets"))
        ds = one(apiserver, "daemonsets")
        [pod] = apiserver.seed(daemon_pod(uid, "n1", ip="10.0.0.1", owner=ds))
        apiserver.seed(
            clique(
                uid,
                "c1.0",
                [daemon("n1", "10.0.0.1", 0), daemon("gone", "10.0.0.2", 1)],
                owners=(pod,),
            ),
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "n1", "labels": {"resource.nvidia.com/computeDomain": uid}},
            },
        )
        await settled(ctl, lambda: len(one(apiserver, "computedomaincliques")["daemons"]) == 1)
        apiserver.delete("computedomains", "cd1", "default")
        await settled(ctl, lambda: not apiserver.objects("computedomains"))
        # Orphans: a clique whose domain is gone, deleted once its pods are.
        apiserver.seed(clique("gone-uid", "c1.0", []))
        await settled(ctl, lambda: not apiserver.objects("computedomaincliques"))
    finally:
        await running.stop()
    await asyncio.sleep(0)
    found = objects()
    cluster = grants(found, "ClusterRole", NAME)
    namespaced = grants(found, "Role", NAME)
    used = {
        (group, resource, verb)
        for group, resource, verb in apiserver.requests.permissions()
        if resource != "namespaces"
    }
    assert used == cluster | namespaced
    # The namespaced grants are used in the driver's namespace only.
    for record in apiserver.requests:
        group_resource = record.resource.rpartition("/")[2]
        if any(group_resource == r for _, r, _ in namespaced):
            assert record.namespace == DRIVER_NAMESPACE, record
