"""The chart's RBAC, held against use rather than against itself.

The node process (``gpu-dra kubelet-plugin``, in-process here) runs through
everything it does in a cluster's life: publish a pool, tidy an obsolete slice,
restore a slice someone deleted, follow a GPU that disappears, fetch claims to
prepare them, run an MPS claim's daemon as a pod, and notice a claim deleted behind its
back. The local API server
logs every request with its User-Agent; the set of (verb, group, resource) the
node process sent must equal what the rendered ClusterRole and Role grant:
nothing used without a grant, nothing granted without use.
"""

import asyncio
from typing import Any

from kubernetes.aio import client as kclient

from driver.kube.client import user_agent
from driver.nvml.faults import write_state_file
from drivers.gpu import node
from drivers.gpu.kinds.mpspod import MpsPodConfig
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests.chart_render import NAMESPACE, rbac_grants, render
from tests.pluginharness import NodeDirs, api_client, create_claim, create_node, wait_for
from tests.podrunner import PodRunner
from tests.test_mps import Control, mps
from tests.test_timeslicing import Smi

NODE = "node-rbac"
DRIVER = "gpu.nvidia.com"
SLICES = "resource.k8s.io/resourceslices"
CLAIMS = "resource.k8s.io/resourceclaims"


def _node_slices(apiserver: LocalApiServer) -> list[dict[str, Any]]:
    return [
        s
        for s in apiserver.objects(SLICES)
        if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == DRIVER
    ]


def _devices(apiserver: LocalApiServer) -> set[str]:
    return {d["name"] for s in _node_slices(apiserver) for d in s["spec"].get("devices", [])}


def _status_devices(apiserver: LocalApiServer, name: str) -> list[str]:
    """The devices the claim's status.devices names (the plugin's claim status writer)."""
    (claim,) = (c for c in apiserver.objects(CLAIMS) if c["metadata"]["name"] == name)
    return [d["device"] for d in (claim.get("status") or {}).get("devices") or []]


def _used(apiserver: LocalApiServer, agent: str) -> set[tuple[str, str, str]]:
    """(verb, group, resource) of the node process's resource requests; discovery excluded."""
    used = set()
    for record in apiserver.requests:
        if record.user_agent != agent or record.resource.startswith("/"):
            continue
        head, _, rest = record.resource.partition("/")
        group, resource = (head, rest) if "." in head else ("", record.resource)
        used.add((record.verb, group, resource))
        if (record.verb, resource) == ("update", "resourceclaims/status"):
            # The real API server (1.36+) authorizes a change of status.devices a second
            # time, per driver, against this synthetic subresource; the local one does not.
            used.add(("associated-node:update", group, "resourceclaims/driver"))
    return used


async def test_node_process_uses_exactly_what_the_chart_grants(
    apiserver: LocalApiServer, dirs: NodeDirs
) -> None:
    kubeconfig = dirs.root / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig)
    state_file = dirs.root / "sim-state.yaml"
    write_state_file(state_file, {})
    api = await api_client(kubeconfig)
    await create_node(api, NODE)
    # A slice an older release left under a name the controller does not recognise: obsolete.
    apiserver.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-legacy"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        }
    )
    claim = await create_claim(api, "train", node=NODE, devices=["gpu-0"])
    # An MPS claim: its daemon a pod in the driver's namespace (the chart's default).
    shared = await create_claim(api, "shared", node=NODE, devices=["gpu-1"], config=[mps()])
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    config = dirs.node_config(
        kubeconfig,
        node_name=NODE,
        profile="p5.48xlarge",
        sim_state=state_file,
        slice_resync_period=0.2,
        reconcile_period=0.2,
        nvidia_smi=Smi(dirs.root / "smi").path,
        mps_control=Control(dirs.root / "mps").path,
        mps_pod=MpsPodConfig(namespace=NAMESPACE, image="gpu-dra-driver:test"),
    )
    stop, hup = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(node.run(config, stop, hup=hup))
    pods = PodRunner(apiserver, NODE)
    await pods.__aenter__()
    try:
        full = {f"gpu-{i}" for i in range(8)}
        await wait_for(lambda: _devices(apiserver) == full, "the pool published")
        await wait_for(lambda: len(_node_slices(apiserver)) == 1, "the legacy slice deleted")

        # The kubelet wipes a driver's slices when it restarts: they come back.
        (published,) = _node_slices(apiserver)
        apiserver.delete(SLICES, published["metadata"]["name"], None)
        await wait_for(lambda: _devices(apiserver) == full, "the pool restored")

        # A GPU falls off the bus: the slice is updated in place.
        write_state_file(state_file, {"removedGpus": [7]})
        await wait_for(lambda: _devices(apiserver) == full - {"gpu-7"}, "gpu-7 unpublished")

        # The kubelet prepares a claim (the plugin fetches it) ...
        await wait_for(dirs.paths().registration.is_socket, "registration socket")
        async with await KubeletSim.register(dirs.paths().registration) as kubelet:
            response = await kubelet.prepare([claim, shared])
            assert [response.claims[c.uid].error for c in (claim, shared)] == ["", ""]
            await wait_for(lambda: _status_devices(apiserver, "train") == ["gpu-0"], "status")
            assert len(pods.pods()) == 1
            assert (await kubelet.unprepare([shared])).claims[shared.uid].error == ""
            assert pods.pods() == []
        assert len(list(dirs.cdi.iterdir())) == 1
        # ... whose ResourceClaim is then deleted without an unprepare: the reconciler
        # sees the 404 and cleans up.
        claims: Any = kclient.ResourceV1Api(api)
        await claims.delete_namespaced_resource_claim("train", "default")
        await wait_for(lambda: not list(dirs.cdi.iterdir()), "the orphaned claim unprepared")

        # An operator's SIGHUP relists; where the server fails the watch list, a list.
        apiserver.faults.fail("watch", SLICES, code=500, times=1)
        hup.set()
        await wait_for(
            lambda: any(r.verb == "list" and r.resource == SLICES for r in apiserver.requests),
            "the relist's fallback list",
        )
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
        await pods.__aexit__()
        await api.close()

    objects = render()
    granted = rbac_grants(objects, "ClusterRole") | rbac_grants(objects, "Role")
    used = _used(apiserver, user_agent("kubelet-plugin"))
    assert used, "no request carried the node process's User-Agent"
    assert used - granted == set(), "used without a grant"
    assert granted - used == set(), "granted without use"


async def test_the_compute_domain_driver_uses_exactly_what_its_values_add(
    apiserver: LocalApiServer, dirs: NodeDirs
) -> None:
    """computeDomains.enabled adds grants for the ComputeDomain driver in the same process:
    each is used, and nothing the process sends lacks a grant."""
    from drivers.computedomain.node import ComputeDomainDriver, DomainConfig
    from tests import cdnode
    from tests.computedomains import DRIVER_NAMESPACE

    kubeconfig = dirs.root / "kubeconfig"
    apiserver.write_kubeconfig(kubeconfig)
    api = await api_client(kubeconfig)
    cdnode.seed(apiserver)
    config = dirs.node_config(kubeconfig, node_name=cdnode.NODE, profile=cdnode.PROFILE)
    guest = ComputeDomainDriver(
        DomainConfig(
            node_name=cdnode.NODE,
            namespace=DRIVER_NAMESPACE,
            registrar_dir=dirs.registry,
            plugins_dir=dirs.plugins,
            cdi_root=dirs.cdi,
            gate_timeout=0.3,
        )
    )
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(config, stop, guests=[guest]))
    try:
        channel = await cdnode.channel_claim(api)
        daemon = await cdnode.daemon_claim(api)
        registration = cdnode.cd_paths(dirs).registration
        await wait_for(registration.is_socket, "the ComputeDomain registration socket", 60)
        async with await KubeletSim.register(registration) as kubelet:
            # Not ready yet: the clique is missing, the domain's status read instead.
            assert "not ready" in (await kubelet.prepare([channel])).claims[channel.uid].error
            cdnode.ready(apiserver, rack=cdnode.NODE)
            assert (await kubelet.prepare([channel, daemon])).claims[channel.uid].error == ""
            response = await kubelet.unprepare([channel, daemon])
            assert all(r.error == "" for r in response.claims.values())
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
        await api.close()

    def grants(*values: str) -> set[tuple[str, str, str]]:
        plugin = [
            o
            for o in render(set_values=values)
            if o["metadata"]["name"].endswith("-kubelet-plugin")
        ]
        return rbac_grants(plugin, "ClusterRole") | rbac_grants(plugin, "Role")

    enabled = grants("computeDomains.enabled=true")
    added = enabled - grants()
    used = _used(apiserver, user_agent("kubelet-plugin"))
    assert added == {
        ("patch", "", "nodes"),
        ("get", "resource.nvidia.com", "computedomains"),
        ("list", "resource.nvidia.com", "computedomains"),
        ("get", "resource.nvidia.com", "computedomaincliques"),
    }
    assert used - enabled == set(), "used without a grant"
    assert added - used == set(), "granted without use"


def test_every_service_account_the_chart_grants_to_has_a_use_test() -> None:
    """Each identity's grants are held to what its code sends by one test: the node process
    (the two above), the ComputeDomain controller
    (test_chart_computedomain_controller.test_rbac_is_exactly_what_the_controller_sends) and
    the IMEX daemon (test_imex_cliquesource.test_the_charts_daemon_role_is_exactly_what_a_
    daemon_sends). A new identity with grants fails here until it has one."""
    objects = render(set_values=["computeDomains.enabled=true", "metrics.enabled=true"])
    bound = {
        subject["name"]
        for o in objects
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for subject in o.get("subjects") or ()
        if subject.get("kind") == "ServiceAccount"
    }
    assert bound == {
        "gpu-dra-driver-kubelet-plugin",
        "gpu-dra-driver-compute-domain-controller",
        "compute-domain-daemon-service-account",
    }
