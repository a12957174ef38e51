"""The ComputeDomain node driver in the node process: a real plugin process serving both
drivers over real gRPC sockets, against the local API server (ComputeDomains, cliques,
Nodes), on a simulated GB200 node whose /proc/devices and IMEX capability lie under its
simulated driver root."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from drivers.computedomain import names
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests import cdnode
from tests.cdnode import CD_UID, NODE, OTHER_UID
from tests.computedomains import DRIVER_NAMESPACE
from tests.pluginharness import NodeDirs, PluginProcess, create_claim, wait_for
from tests.test_cdi import assert_valid_spec

VENDOR = "k8s.compute-domain.nvidia.com"


def spec(dirs: NodeDirs, claim_uid: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((dirs.cdi / f"{VENDOR}-claim_{claim_uid}.json").read_text())
    return loaded


def device_edits(dirs: NodeDirs, claim_uid: str) -> dict[str, Any]:
    """The one device's edits of a claim's spec, which CDI accepts: they are on the device
    (the library refuses a device without edits), none at the spec's level here (NVML is
    simulated: no toolkit edits)."""
    written = spec(dirs, claim_uid)
    assert_valid_spec(written)
    assert not any(written["containerEdits"].values()), written["containerEdits"]
    (device,) = written["devices"]
    edits: dict[str, Any] = device["containerEdits"]
    return edits


def plugin_dir(dirs: NodeDirs) -> Path:
    return dirs.plugins / names.DRIVER_NAME


async def status_entry(apiserver: LocalApiServer, claim: Any) -> dict[str, Any]:
    """The claim's one ``status.devices`` entry, once the plugin's writer has written it."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        (stored,) = [
            c for c in apiserver.objects("resourceclaims", claim.namespace)
            if c["metadata"]["name"] == claim.name
        ]  # fmt: skip
        found[:] = (stored.get("status") or {}).get("devices") or []
        return len(found) == 1

    await wait_for(written, f"the status entry of claim {claim}")
    return found[0]


@pytest.fixture
async def served(
    apiserver: LocalApiServer, kube: tuple[Any, Path], dirs: NodeDirs, processes: list[Any]
) -> AsyncIterator[tuple[Any, KubeletSim, PluginProcess]]:
    cdnode.seed(apiserver)
    api, kubeconfig = kube
    plugin = cdnode.start(dirs, kubeconfig)
    processes.append(plugin)
    await plugin.wait_log("ComputeDomain driver ready", 60)
    async with await KubeletSim.register(cdnode.cd_paths(dirs).registration) as kubelet:
        yield api, kubelet, plugin


async def test_publishes_channel_and_daemon_as_nvidias(
    apiserver: LocalApiServer, served: tuple[Any, KubeletSim, PluginProcess]
) -> None:
    def cd_slices() -> list[Any]:
        return [
            s
            for s in apiserver.objects("resourceslices")
            if s["spec"]["driver"] == names.DRIVER_NAME
        ]

    # The node's clique label, as NVIDIA's --gpu-clique-label-enabled sets it.
    await wait_for(
        lambda: cdnode.clique_label(apiserver) == cdnode.clique_id("rack-a"), "the clique label"
    )
    await wait_for(lambda: bool(cd_slices()), "the ComputeDomain driver's slice")
    (only,) = cd_slices()
    assert only["spec"]["pool"]["name"] == NODE and only["spec"]["nodeName"] == NODE
    assert only["spec"]["devices"] == [
        {"name": "channel-0", "attributes": {"id": {"int": 0}, "type": {"string": "channel"}}},
        {"name": "daemon-0", "attributes": {"id": {"int": 0}, "type": {"string": "daemon"}}},
    ]
    # The GPU driver serves beside it, from the same process.
    await wait_for(
        lambda: any(
            s["spec"]["driver"] == "gpu.nvidia.com" for s in apiserver.objects("resourceslices")
        ),
        "the GPU driver's slice",
    )


async def test_channel_waits_for_the_daemon_then_gets_channel_0(
    apiserver: LocalApiServer, served: tuple[Any, KubeletSim, PluginProcess], dirs: NodeDirs
) -> None:
    api, kubelet, _ = served
    claim = await cdnode.channel_claim(api)
    prepare = asyncio.create_task(kubelet.prepare([claim]))
    # The label comes first: it is what brings the domain's daemon to this node.
    await wait_for(lambda: cdnode.node_label(apiserver) == CD_UID, "the node's domain label")
    assert not prepare.done()
    cdnode.ready(apiserver)
    result = (await prepare).claims[claim.uid]
    assert result.error == ""
    assert [list(d.cdi_device_ids) for d in result.devices] == [
        [f"{VENDOR}/claim={claim.uid}-channel-0"]
    ]
    written = spec(dirs, claim.uid)
    assert written["kind"] == f"{VENDOR}/claim"
    edits = device_edits(dirs, claim.uid)
    assert [{k: v for k, v in n.items() if k != "hostPath"} for n in edits["deviceNodes"]] == [
        {
            "path": "/dev/nvidia-caps-imex-channels/channel0",
            "type": "c",
            "major": cdnode.IMEX_CHANNELS_MAJOR,
            "minor": 0,
            "fileMode": 0o666,
        }
    ]
    assert edits["env"] == ["GPU_DRA_IMEX_CHANNELS=0"]
    assert set(edits) == {"env", "deviceNodes"}  # no driver libraries: a channel is a node
    assert (plugin_dir(dirs) / "devices" / "channel-0").is_symlink()
    # The claim says which domain and clique its channel is of.
    entry = await status_entry(apiserver, claim)
    assert (entry["driver"], entry["pool"], entry["device"]) == (
        names.DRIVER_NAME,
        NODE,
        "channel-0",
    )
    assert entry["data"]["computeDomain"] == {"namespace": "default", "name": "cd1", "uid": CD_UID}
    assert entry["data"]["cliqueID"] == cdnode.clique_id("rack-a")
    assert entry["data"]["sharing"]["domainID"] == CD_UID
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
    # The domain is looked for in the claim's namespace, not across the cluster (the status
    # entry's name comes from the prepare's lookup).
    lists = [r for r in apiserver.requests.snapshot() if r.verb == "list"]
    domain_lists = [r.namespace for r in lists if r.resource.endswith(names.COMPUTE_DOMAINS)]
    assert domain_lists and set(domain_lists) == {claim.namespace}, domain_lists

    # A second channel claim waits for the first (NVIDIA: channel 0 already allocated).
    other = await cdnode.channel_claim(api, "work2")
    busy = (await kubelet.prepare([other])).claims[other.uid].error
    assert "already prepared for claim default/work" in busy

    assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert cdnode.node_label(apiserver) is None
    assert not (dirs.cdi / f"{VENDOR}-claim_{claim.uid}.json").exists()
    assert list((plugin_dir(dirs) / "claims").iterdir()) == []
    assert list((plugin_dir(dirs) / "devices").iterdir()) == []


async def test_all_channels(
    apiserver: LocalApiServer, served: tuple[Any, KubeletSim, PluginProcess], dirs: NodeDirs
) -> None:
    api, kubelet, _ = served
    cdnode.ready(apiserver)
    claim = await cdnode.channel_claim(api, allocationMode="All")
    assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    edits = device_edits(dirs, claim.uid)
    assert edits["env"] == ["GPU_DRA_IMEX_CHANNELS=0-2047"]
    nodes = edits["deviceNodes"]
    assert len(nodes) == names.IMEX_CHANNEL_COUNT == 2048
    assert [n["minor"] for n in nodes] == list(range(2048))
    assert nodes[-1]["path"] == "/dev/nvidia-caps-imex-channels/channel2047"


async def test_channel_refusals(
    apiserver: LocalApiServer, served: tuple[Any, KubeletSim, PluginProcess], dirs: NodeDirs
) -> None:
    api, kubelet, _ = served
    cdnode.ready(apiserver)
    # A domain of another namespace: permanent, nothing left.
    foreign = await cdnode.channel_claim(api, "foreign", namespace="team-b")
    error = (await kubelet.prepare([foreign])).claims[foreign.uid].error
    assert "namespace (team-b) is different than the ComputeDomain's namespace (default)" in error
    assert cdnode.node_label(apiserver) is None
    # No such domain.
    lost = await cdnode.channel_claim(api, "lost", uid=OTHER_UID)
    error = (await kubelet.prepare([lost])).claims[lost.uid].error
    assert f"ComputeDomain not found: {OTHER_UID}" in error
    # A daemon config on a channel: refused by name.
    wrong = await create_claim(
        api,
        "wrong",
        node=NODE,
        devices=[names.CHANNEL_DEVICE],
        driver=names.DRIVER_NAME,
        config=cdnode.config(names.DAEMON_CONFIG_KIND),
    )
    error = (await kubelet.prepare([wrong])).claims[wrong.uid].error
    assert "cannot apply ComputeDomainDaemonConfig to request: gpu" in error
    assert list((plugin_dir(dirs) / "claims").iterdir()) == []
    # Another domain's label: this one's claim waits; the other's label is never removed.
    node = next(n for n in apiserver.objects("nodes") if n["metadata"]["name"] == NODE)
    node["metadata"]["labels"] = {names.COMPUTE_DOMAIN_LABEL: OTHER_UID}
    apiserver.put(node)
    claim = await cdnode.channel_claim(api)
    error = (await kubelet.prepare([claim])).claims[claim.uid].error
    assert "already exists for a different ComputeDomain" in error
    assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert cdnode.node_label(apiserver) == OTHER_UID


async def test_daemon_claim_and_a_domain_deleted_before_its_daemon(
    apiserver: LocalApiServer, served: tuple[Any, KubeletSim, PluginProcess], dirs: NodeDirs
) -> None:
    api, kubelet, _ = served
    claim = await cdnode.daemon_claim(api)
    result = (await kubelet.prepare([claim])).claims[claim.uid]
    assert result.error == ""
    assert list(result.devices[0].cdi_device_ids) == [f"{VENDOR}/claim={claim.uid}-daemon-0"]
    domain_dir = plugin_dir(dirs) / "domains" / CD_UID
    assert domain_dir.is_dir() and domain_dir.stat().st_mode & 0o777 == 0o755
    edits = device_edits(dirs, claim.uid)
    assert sorted(edits["env"]) == sorted(
        [
            "NVIDIA_VISIBLE_DEVICES=void",
            f"CLIQUE_ID={cdnode.clique_id('rack-a')}",
            f"COMPUTE_DOMAIN_UUID={CD_UID}",
            "COMPUTE_DOMAIN_NAME=cd1",
            "COMPUTE_DOMAIN_NAMESPACE=default",
        ]
    )
    assert edits["mounts"] == [
        {
            "hostPath": str(domain_dir),
            "containerPath": "/imexd",
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
    ]
    assert [{k: v for k, v in n.items() if k != "hostPath"} for n in edits["deviceNodes"]] == [
        {
            "path": "/dev/nvidia-caps/nvidia-cap1",
            "type": "c",
            "major": cdnode.CAPS_MAJOR,
            "minor": 1,
            "fileMode": 256,
        }
    ]
    # The daemon's claim, in the driver's namespace, names the domain of the team's.
    entry = await status_entry(apiserver, claim)
    assert entry["data"]["computeDomain"] == {"namespace": "default", "name": "cd1", "uid": CD_UID}
    assert entry["data"]["cliqueID"] == cdnode.clique_id("rack-a")
    apiserver.delete(names.COMPUTE_DOMAINS, "cd1", "default")
    assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert not domain_dir.exists()
    assert list((plugin_dir(dirs) / "claims").iterdir()) == []


async def test_a_daemon_claim_outside_the_drivers_namespace_is_refused_and_takes_nothing(
    apiserver: LocalApiServer, served: tuple[Any, KubeletSim, PluginProcess], dirs: NodeDirs
) -> None:
    """A tenant's claim for the daemon device, naming another namespace's domain (issue #38):
    no /imexd, no capability node, no daemon-0 held from the domain's own daemon."""
    api, kubelet, _ = served
    foreign = await cdnode.daemon_claim(api, "steal", namespace="team-b")
    error = (await kubelet.prepare([foreign])).claims[foreign.uid].error
    assert (
        "claim team-b/steal: a ComputeDomain daemon claim must be in the driver's namespace "
        f"({DRIVER_NAMESPACE}), not team-b" in error
    )
    assert not (plugin_dir(dirs) / "domains" / CD_UID).exists()
    assert list((plugin_dir(dirs) / "claims").iterdir()) == []
    # The domain's own daemon gets the slot.
    own = await cdnode.daemon_claim(api)
    assert (await kubelet.prepare([own])).claims[own.uid].error == ""
    assert (plugin_dir(dirs) / "domains" / CD_UID).is_dir()


async def test_no_clique_gives_no_channel(
    apiserver: LocalApiServer, kube: tuple[Any, Path], dirs: NodeDirs, processes: list[Any]
) -> None:
    cdnode.seed(apiserver)
    # A clique label from before (the node's fabric was partitioned away): removed.
    node = next(n for n in apiserver.objects("nodes") if n["metadata"]["name"] == NODE)
    node["metadata"]["labels"] = {names.GPU_CLIQUE_NODE_LABEL: cdnode.clique_id("rack-a")}
    apiserver.put(node)
    api, kubeconfig = kube
    plugin = cdnode.start(dirs, kubeconfig, rack=None)
    processes.append(plugin)
    await plugin.wait_log("ComputeDomain driver ready.*clique_id=none", 60)
    await wait_for(lambda: cdnode.clique_label(apiserver) is None, "the clique label removed")
    # Without a clique the daemon is Ready in the domain's status only (NVIDIA's rule).
    cd = next(o for o in apiserver.objects(names.COMPUTE_DOMAINS) if o["metadata"]["uid"] == CD_UID)
    cd["status"] = {
        "status": names.READY,
        "nodes": [{"name": NODE, "ipAddress": "", "cliqueID": "", "index": -1, "status": "Ready"}],
    }
    apiserver.put(cd)
    claim = await cdnode.channel_claim(api)
    async with await KubeletSim.register(cdnode.cd_paths(dirs).registration) as kubelet:
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
    assert device_edits(dirs, claim.uid) == {"env": ["GPU_DRA_IMEX_CHANNELS="]}
    assert cdnode.node_label(apiserver) == CD_UID


async def test_an_old_driver_refuses_the_compute_domain_driver_in_one_line(
    apiserver: LocalApiServer, kube: tuple[Any, Path], dirs: NodeDirs, processes: list[Any]
) -> None:
    cdnode.seed(apiserver)
    _, kubeconfig = kube
    old = dirs.root / "old-driver.yaml"
    old.write_text(f"extends: {cdnode.PROFILE}\ndriverVersion: 565.57.01\n")
    plugin = cdnode.start(dirs, kubeconfig, profile=str(old))
    processes.append(plugin)
    await plugin.wait_ready(60)  # the GPU driver serves
    refusals = [line for line in plugin.log().splitlines() if "not serving driver" in line]
    assert len(refusals) == 1
    assert names.DRIVER_NAME in refusals[0]
    assert "565.57.01 is older than 570.158.01" in refusals[0]
    assert not cdnode.cd_paths(dirs).registration.exists()
    assert await plugin.terminate() == 0
