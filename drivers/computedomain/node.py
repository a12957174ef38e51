"""The ComputeDomain driver (``compute-domain.nvidia.com``) served from the GPU node process.

Started after the host driver serves (``kubeletplugin.cohost``): its NVML, inventory and API
client are the host's. It refuses to start, in one line, on a driver older than 570.158.01
(NVIDIA's check) or on GPUs that disagree on their clique; the GPU driver serves on (and
retries the start, but for the driver floor). Then, as
the GPU driver, served by :func:`kubeletplugin.serve.serve`: claim state (records and
recovery under its own plugin directory and CDI vendor), the DRA socket, the registration
socket, the slice publisher, the reconciler.

The clique ID is read at start and again every ``clique_period`` (NVIDIA: 10 minutes; fabric
partitioning may change it). A new value is used by the next prepares: a channel or daemon
claim already prepared keeps its spec (its device nodes do not depend on the clique; the
domain's daemon re-reads its own clique when it restarts), and the change is logged. As
NVIDIA's, an empty new value (a fabric read that failed) does not replace a known one.

The clique is also the Node's label ``nvidia.com/gpu.clique`` (NVIDIA's
``--gpu-clique-label-enabled``; GPU Feature Discovery's label, which EKS nodes lack and
workloads' pod affinity keys on): written at start and on each change, removed when the node
reports no clique at start (a start that cannot write it fails, and the node process retries
it), and on a change by the refresh loop, which retries the write while it fails. Two
choices differ from NVIDIA's. It is on whenever this driver is (NVIDIA: a flag, off by
default, since GFD set it before): a node that runs this driver has no other writer on EKS,
and where GFD runs it writes the same value by the same rule. It is not removed on stop
(NVIDIA removes it): the clique is the hardware's, and a plugin restart or upgrade must not
make workloads' affinity unschedulable meanwhile.
"""

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from driver.common.driverversion import require_floor
from driver.common.errors import PermanentError
from driver.common.logs import kv
from driver.common.supervise import OnFailure, supervised
from driver.kube.rest import Client
from drivers.computedomain import kinds, names
from drivers.computedomain.domains import Domains
from kubeletplugin.cohost import Host, NodeFacts
from kubeletplugin.devices import NodeDevices
from kubeletplugin.metrics import ClaimMetrics, Forward
from kubeletplugin.serve import NodeDriver, Served, serve
from kubeletplugin.sockets import socket_paths
from kubeletplugin.state import StateConfig

log = logging.getLogger(__name__)

# This driver's metric families, in the kubelet plugin's with --compute-domains.
COMPUTE_DOMAIN_PREFIX = "gpu_dra_compute_domain_node"
COMPUTE_DOMAIN_WHAT = "ComputeDomain channel and daemon claims"


@dataclass(frozen=True)
class DomainConfig:
    node_name: str
    namespace: str  # the driver's: where the cliques are
    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/run/cdi")
    pod_uid: str | None = None
    slice_resync_period: float = 600.0
    reconcile_period: float = 600.0
    clique_period: float = 600.0
    gate_timeout: float = kinds.GATE_TIMEOUT_S


class ComputeDomainDriver:
    name = names.DRIVER_NAME

    def __init__(self, config: DomainConfig) -> None:
        self._config = config
        self._clique = ""
        self._labelled: str | None = None  # the node's clique label as last written or found
        self._served: Served[ClaimMetrics] | None = None
        self._forward: tuple[CollectorRegistry, Forward] | None = None

    @property
    def clique_id(self) -> str:
        return self._clique

    async def start(self, host: Host) -> None:
        cfg = self._config
        facts = host.facts()
        if facts is None:
            raise PermanentError("no GPU inventory: the host driver has not discovered yet")
        require_floor(facts.driver_version)
        self._clique = facts.clique_id
        paths = socket_paths(
            registrar_dir=cfg.registrar_dir,
            plugins_dir=cfg.plugins_dir,
            driver_name=self.name,
            pod_uid=cfg.pod_uid,
        )
        plugin_dir = cfg.plugins_dir / self.name
        domains = Domains(Client(host.api_client), node_name=cfg.node_name, namespace=cfg.namespace)
        # As NVIDIA's, at start: a node whose API server refuses it does not serve yet (the
        # node process retries the start).
        await self._label(domains)
        loop = asyncio.get_running_loop()
        channel = kinds.ChannelKind(
            loop=loop,
            domains=domains,
            clique=lambda: self._clique,
            proc_root=host.proc_root,
            plugin_dir=plugin_dir,
            gate_timeout=cfg.gate_timeout,
        )
        daemon = kinds.DaemonKind(
            loop=loop,
            domains=domains,
            clique=lambda: self._clique,
            proc_root=host.proc_root,
            plugin_dir=plugin_dir,
        )

        async def same() -> NodeFacts | None:
            # The host's last discovery: these devices do not depend on it.
            return facts

        devices: NodeDevices[object] = NodeDevices(
            same, node_name=cfg.node_name, kinds=(channel, daemon)
        )
        await devices.refresh()

        async def started(served: Served[ClaimMetrics]) -> None:
            served.spawn(self._follow_clique(host, domains), "cd-clique")

        self._served = await serve(
            NodeDriver(
                state=StateConfig(
                    plugin_dir=plugin_dir,
                    cdi_root=cfg.cdi_root,
                    driver_name=self.name,
                    node_name=cfg.node_name,
                    host=host.host_edits,
                    pod_uid=cfg.pod_uid,
                    flavor=kinds.flavor(channel, daemon),
                ),
                paths=paths,
                devices=devices,
                metrics=lambda _: ClaimMetrics(COMPUTE_DOMAIN_PREFIX, what=COMPUTE_DOMAIN_WHAT),
                slice_resync_period=cfg.slice_resync_period,
                reconcile_period=cfg.reconcile_period,
                # A channel's entry names its domain and the clique it gives channels of.
                describe=lambda claim, device: kinds.status_data(
                    domains, self._clique, claim, device
                ),
                started=started,
            ),
            host.api_client,
        )
        if host.registry is not None:  # last: a failed start registers nothing
            self._forward = (host.registry, Forward(self._served.metrics.registry))
            host.registry.register(self._forward[1])
        log.info(
            "ComputeDomain driver ready",
            extra=kv(node=cfg.node_name, driver=self.name, clique_id=self._clique or "none"),
        )

    async def _label(self, domains: Domains) -> None:
        now = self._clique
        if await domains.set_clique_label(now):
            log.info(
                "node label set" if now else "node label removed",
                extra=kv(
                    node=self._config.node_name,
                    label=names.GPU_CLIQUE_NODE_LABEL,
                    value=now or "none",
                ),
            )
        self._labelled = now

    async def _follow_clique(self, host: Host, domains: Domains) -> None:
        async def round_() -> None:
            if self._labelled != self._clique:  # changed, and the write not yet through
                await self._label(domains)
            await asyncio.sleep(self._config.clique_period)
            await host.rediscover()
            facts = host.facts()
            if facts is None:
                return
            now = facts.clique_id
            if now and now != self._clique:
                log.warning(
                    "the node's NVLink clique changed: new prepares use it, prepared claims "
                    "keep their specs",
                    extra=kv(node=self._config.node_name, was=self._clique or "none", now=now),
                )
                self._clique = now

        await supervised("clique refresh", round_, OnFailure.CONTINUE, pause=1.0)

    async def stop(self) -> None:
        if self._forward is not None:
            registry, forward = self._forward
            registry.unregister(forward)
            self._forward = None
        if self._served is not None:
            await self._served.stop()
            self._served = None
