"""The ComputeDomain driver in this process, on a simulated GB200 inventory: the readiness
gate's bound (PreparePending keeps the label), the driver floor, the clique's rules, its
periodic re-read and node label, and the node process's retry of a start that failed. The
node-process tests (test_computedomain_node*.py) cover the rest."""

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.common.driverversion import DriverTooOld
from driver.devicekind import PreparedClaim, PreparedDevice
from driver.kube.backoff import Backoff
from driver.kube.rest import Client
from driver.nvml import backend
from drivers.computedomain import kinds, names, nvcaps
from drivers.computedomain.domains import Domain, Domains, NotReadyError
from drivers.computedomain.node import ComputeDomainDriver, DomainConfig
from drivers.gpu import node
from drivers.gpu.model import clique
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from kubeletplugin.cohost import Host
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests import cdnode
from tests.cdnode import CD_UID, NODE
from tests.computedomains import DRIVER_NAMESPACE
from tests.pluginharness import NodeDirs, wait_for
from tests.test_metrics import _scrape_served


@pytest.fixture(scope="module")
def gb200() -> Iterator[tuple[Inventory, Path]]:
    with backend("simulated", profile=cdnode.PROFILE, node_name=NODE) as (nvml, root):
        yield discover(nvml, sysfs_root=root), root


def _with_cluster(inventory: Inventory, cluster: str, *, gpus: int | None = None) -> Inventory:
    changed = [
        dataclasses.replace(g, fabric_cluster_uuid=cluster) if gpus is None or i < gpus else g
        for i, g in enumerate(inventory.gpus)
    ]
    return dataclasses.replace(inventory, gpus=tuple(changed))


def _domain_driver(dirs: NodeDirs, **settings: float) -> ComputeDomainDriver:
    """The ComputeDomain driver of this test's node, in its directories."""
    return ComputeDomainDriver(
        DomainConfig(
            node_name=NODE,
            namespace=DRIVER_NAMESPACE,
            registrar_dir=dirs.registry,
            plugins_dir=dirs.plugins,
            cdi_root=dirs.cdi,
            **settings,  # type: ignore[arg-type]
        )
    )


class _Host:
    def __init__(self, api: Any, inventory: Inventory, root: Path) -> None:
        self.now = inventory
        self.next = inventory
        self.rounds = 0
        self.host = Host(
            api_client=api,
            facts=lambda: node.host_facts(self.now),
            rediscover=self._rediscover,
            proc_root=root,
        )

    async def _rediscover(self) -> None:
        self.now = self.next
        self.rounds += 1


@pytest.fixture
async def driver(
    apiserver: LocalApiServer, kube: tuple[Any, Path], dirs: NodeDirs, gb200: Any
) -> AsyncIterator[tuple[ComputeDomainDriver, _Host]]:
    cdnode.seed(apiserver)
    api, _ = kube
    inventory, root = gb200
    host = _Host(api, inventory, root)
    cd = _domain_driver(dirs, gate_timeout=0.5, clique_period=0.05)
    await cd.start(host.host)
    try:
        yield cd, host
    finally:
        await cd.stop()


def test_the_clique_is_every_gpus_or_an_error(gb200: Any) -> None:
    inventory, _ = gb200
    assert clique.clique_id(inventory) == cdnode.clique_id(NODE)  # the seed: the node's name
    assert clique.clique_id(dataclasses.replace(inventory, gpus=())) == ""
    nofabric = [dataclasses.replace(g, fabric_cluster_uuid=None) for g in inventory.gpus]
    assert clique.clique_id(dataclasses.replace(inventory, gpus=tuple(nofabric))) == ""
    split = _with_cluster(inventory, "00000000-0000-0000-0000-000000000009", gpus=2)
    with pytest.raises(clique.CliqueError, match="different NVLink cliques"):
        clique.clique_id(split)


def test_proc_devices_is_read_as_nvidias_parser_reads_it() -> None:
    text = "Character devices:\n195 nvidia\n507 nvidia-caps-imex-channels\n\nBlock devices:\n"
    assert nvcaps.major(text, nvcaps.IMEX_CHANNELS) == 507
    with pytest.raises(nvcaps.NvCapsError, match="no character device 'nvidia-caps'"):
        nvcaps.major(text, nvcaps.CAPS)
    # A block device of that name, or no Block devices: line, is not the character device.
    with pytest.raises(nvcaps.NvCapsError):
        nvcaps.major("Character devices:\n\nBlock devices:\n508 nvidia-caps\n", nvcaps.CAPS)
    with pytest.raises(nvcaps.NvCapsError, match="Block devices"):
        nvcaps.major("Character devices:\n508 nvidia-caps\n", nvcaps.CAPS)
    cap = nvcaps.capability("DeviceFileMinor: 3\nDeviceFileMode: 438\nDeviceFileModify: 1\n")
    assert (cap.minor, cap.mode) == (3, 0o666)
    with pytest.raises(nvcaps.NvCapsError):
        nvcaps.capability("DeviceFileMode: 438\n")


async def test_the_wait_for_the_daemon_is_bounded(
    apiserver: LocalApiServer, kube: tuple[Any, Path]
) -> None:
    cdnode.seed(apiserver)
    api, _ = kube
    domains = Domains(Client(api), node_name=NODE, namespace=DRIVER_NAMESPACE)
    domain = Domain(CD_UID, "default", "cd1")
    with pytest.raises(NotReadyError, match="not ready in ComputeDomain"):
        await domains.wait_ready(domain, "c.0", within=0.3, backoff=Backoff(base=0.05, cap=0.1))
    cdnode.ready(apiserver, rack=NODE)
    assert await domains.node_ready(domain, cdnode.clique_id(NODE))
    assert not await domains.node_ready(domain, "")  # status.nodes does not list it yet


async def test_a_status_entry_names_the_domain_once_found_and_its_uid_once_gone(
    apiserver: LocalApiServer, kube: tuple[Any, Path]
) -> None:
    """What a channel's status entry adds: found once (the prepare's lookup serves the
    writer's), its UID alone for a domain deleted before it was found, and the clique."""
    cdnode.seed(apiserver)
    api, _ = kube
    domains = Domains(Client(api), node_name=NODE, namespace=DRIVER_NAMESPACE)
    channel = PreparedDevice(
        ("channel",), NODE, "channel-0", (), kind=names.CHANNEL_TYPE,
        sharing=((kinds.DOMAIN_ID, CD_UID),),
    )  # fmt: skip
    claim = PreparedClaim("u", "default", "work", (channel,))
    await domains.check_namespace(CD_UID, "default")
    lists = apiserver.requests.count("list", names.COMPUTE_DOMAINS)
    assert lists == 1  # the prepare's, in the claim's namespace
    data = await kinds.status_data(domains, "c.0", claim, channel)
    assert data == {
        "computeDomain": {"namespace": "default", "name": "cd1", "uid": CD_UID},
        "cliqueID": "c.0",
    }
    assert apiserver.requests.count("list", names.COMPUTE_DOMAINS) == lists
    gone = dataclasses.replace(channel, sharing=((kinds.DOMAIN_ID, cdnode.OTHER_UID),))
    assert await kinds.status_data(domains, "", claim, gone) == {
        "computeDomain": {"uid": cdnode.OTHER_UID},
        "cliqueID": "",
    }


async def test_a_prepare_that_waits_too_long_keeps_the_label_and_finishes_on_retry(
    apiserver: LocalApiServer,
    driver: tuple[ComputeDomainDriver, _Host],
    kube: tuple[Any, Path],
    dirs: NodeDirs,
) -> None:
    api, _ = kube
    claim = await cdnode.channel_claim(api)
    async with await KubeletSim.register(cdnode.cd_paths(dirs).registration) as kubelet:
        error = (await kubelet.prepare([claim])).claims[claim.uid].error
        assert "not ready in ComputeDomain" in error
        # Kept: the label (it brings the daemon), the record, the reservation; no spec.
        assert cdnode.node_label(apiserver) == CD_UID
        data = dirs.plugins / names.DRIVER_NAME
        assert (data / "devices" / "channel-0").is_symlink()
        assert (data / "claims" / f"{claim.uid}.json").exists()
        assert not list(dirs.cdi.glob("*.json"))
        cdnode.ready(apiserver, rack=NODE)
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
    assert cdnode.node_label(apiserver) is None


async def test_the_clique_is_read_again_and_a_change_is_used_by_new_prepares(
    apiserver: LocalApiServer,
    driver: tuple[ComputeDomainDriver, _Host],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cd, host = driver
    assert cd.clique_id == cdnode.clique_id(NODE)
    await wait_for(lambda: cdnode.clique_label(apiserver) == cd.clique_id, "the clique label")
    other = "00000000-0000-0000-0000-000000000042"
    host.next = _with_cluster(host.now, other)
    with caplog.at_level(logging.WARNING):
        await wait_for(lambda: cd.clique_id.startswith(other), "the new clique")
    assert any("clique changed" in r.getMessage() for r in caplog.records)
    # The label follows, and a re-read that changes nothing writes nothing.
    await wait_for(lambda: cdnode.clique_label(apiserver) == cd.clique_id, "the new label")
    writes = apiserver.requests.count("patch", "nodes")
    # A fabric read that finds none does not replace a known clique (NVIDIA's rule).
    host.next = dataclasses.replace(host.now, gpus=())
    seen = host.rounds
    await wait_for(lambda: host.rounds >= seen + 3, "three more re-reads")
    assert cd.clique_id.startswith(other)
    assert cdnode.clique_label(apiserver) == cd.clique_id
    assert apiserver.requests.count("patch", "nodes") == writes


async def test_a_refused_label_write_is_retried(
    apiserver: LocalApiServer, driver: tuple[ComputeDomainDriver, _Host]
) -> None:
    cd, host = driver
    await wait_for(lambda: cdnode.clique_label(apiserver) == cd.clique_id, "the clique label")
    apiserver.faults.fail("patch", "nodes", code=503, times=3)
    other = "00000000-0000-0000-0000-000000000043"
    host.next = _with_cluster(host.now, other)
    await wait_for(lambda: cd.clique_id.startswith(other), "the new clique")
    await wait_for(
        lambda: cdnode.clique_label(apiserver) == cd.clique_id, "the label after 3 refusals", 15
    )


async def test_an_old_driver_is_refused_in_one_line(
    apiserver: LocalApiServer, kube: tuple[Any, Path], dirs: NodeDirs, gb200: Any
) -> None:
    api, _ = kube
    inventory, root = gb200
    old = dataclasses.replace(inventory, driver_version="565.57.01")
    cd = ComputeDomainDriver(DomainConfig(node_name=NODE, namespace=DRIVER_NAMESPACE))
    with pytest.raises(DriverTooOld, match=r"565\.57\.01 is older than 570\.158\.01"):
        await cd.start(_Host(api, old, root).host)
    await cd.stop()


async def test_a_start_the_api_server_refuses_is_retried_while_the_gpu_driver_serves(
    apiserver: LocalApiServer,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The node process serves the GPU driver; the ComputeDomain driver's start (its clique
    label) fails while the API server refuses Node patches, is retried every retry_period
    and logged once, and serves once the server takes them."""
    cdnode.seed(apiserver)
    _, kubeconfig = kube
    config = dirs.node_config(kubeconfig, node_name=NODE, profile=cdnode.PROFILE)
    cd = _domain_driver(dirs)
    apiserver.faults.fail("patch", "nodes", code=503, times=-1)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(node.run(config, stop, guests=[cd]))
    try:
        await wait_for(lambda: dirs.paths().registration.exists(), "the GPU driver's socket")
        await wait_for(
            lambda: apiserver.requests.count("patch", "nodes") >= 3, "three refused starts"
        )
        refusals = [r for r in caplog.records if r.getMessage() == "not serving driver"]
        assert len(refusals) == 1
        assert "503" in str(refusals[0].__dict__.get("error"))
        assert not cdnode.cd_paths(dirs).registration.exists()
        assert cdnode.clique_label(apiserver) is None
        apiserver.faults.clear()
        await wait_for(
            lambda: cdnode.cd_paths(dirs).registration.exists(), "the ComputeDomain socket"
        )
        assert cdnode.clique_label(apiserver) == cdnode.clique_id(NODE)
        # The socket is up inside the start, the line comes once the start has returned.
        await wait_for(
            lambda: any("after a failed start" in r.getMessage() for r in caplog.records),
            "the line that says the driver serves after a failed start",
        )
        assert not running.done()
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert not cdnode.cd_paths(dirs).registration.exists()


async def test_a_stop_during_the_retries_leaves_nothing_served(
    apiserver: LocalApiServer, kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    cdnode.seed(apiserver)
    _, kubeconfig = kube
    config = dirs.node_config(kubeconfig, node_name=NODE, profile=cdnode.PROFILE)
    cd = _domain_driver(dirs)
    apiserver.faults.fail("patch", "nodes", code=503, times=-1)
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(config, stop, guests=[cd]))
    await wait_for(lambda: apiserver.requests.count("patch", "nodes") >= 2, "two refused starts")
    stop.set()
    assert await asyncio.wait_for(running, 30) == 0
    assert not cdnode.cd_paths(dirs).registration.exists()
    assert not dirs.paths().registration.exists()


async def test_its_prepares_are_counted_beside_the_gpu_drivers_on_one_port(
    apiserver: LocalApiServer,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cdnode.seed(apiserver)
    api, kubeconfig = kube
    config = dirs.node_config(kubeconfig, node_name=NODE, profile=cdnode.PROFILE, metrics_port=0)
    cd = _domain_driver(dirs)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(node.run(config, stop, guests=[cd]))
    prefix = "gpu_dra_compute_domain_node"

    def series(got: dict[str, Any], name: str) -> dict[str, float]:
        return {s.get("outcome", ""): v for s, v in got.get(name, [])}

    try:
        await wait_for(lambda: cdnode.cd_paths(dirs).registration.exists(), "the CD socket")
        cdnode.ready(apiserver, rack=NODE)
        claim = await cdnode.channel_claim(api)
        foreign = await cdnode.channel_claim(api, "foreign", namespace="team-b")
        async with await KubeletSim.register(cdnode.cd_paths(dirs).registration) as kubelet:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
            assert (await kubelet.prepare([foreign])).claims[foreign.uid].error
            got = await _scrape_served(caplog)
            assert series(got, f"{prefix}_prepare_requests") == {"success": 1.0, "error": 1.0}
            assert series(got, f"{prefix}_prepared_claims") == {"": 1.0}
            # The GPU driver's families are its own: nothing of these claims in them.
            assert series(got, "gpu_dra_prepare_requests") == {}
            assert series(got, "gpu_dra_prepared_claims") == {"": 0.0}
            assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        got = await _scrape_served(caplog)
        assert series(got, f"{prefix}_unprepare_requests") == {"success": 1.0}
        assert series(got, f"{prefix}_prepared_claims") == {"": 0.0}
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
