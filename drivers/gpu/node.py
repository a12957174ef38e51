"""The node process: kubelet plugin, slice controller and probe service in one event loop.

Order matters. The probe service comes up first (NOT_SERVING), so probes get
an answer while setup runs. Setup (device-plugin guard, NVML, discovery, then the
driver served by the framework, :func:`kubeletplugin.serve.serve`: claim state, the DRA
socket, the registration socket, the publisher and the loops) retries instead of exiting:
a crash-looping pod helps no one, a NOT_SERVING one with a clear log line does. SIGTERM
undoes it in reverse, removing only this process's sockets; slices stay for the next
instance.
"""

import asyncio
import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry

from driver import DEFAULT_DRIVER_NAME
from driver.common import gcpause
from driver.common.driverversion import DriverTooOld
from driver.common.errors import DriverError, PermanentError
from driver.common.logs import kv
from driver.kube import client as kubeclient
from driver.kube.resources import NODES
from driver.kube.rest import Client
from driver.nvml import library
from driver.slices import SliceController
from drivers.gpu import flavor
from drivers.gpu.healthmonitor import HealthMonitor, Recovery, Watched, read_state
from drivers.gpu.kinds import GpuNode, KindTable, gpu_kinds, mpspaths, node_devices
from drivers.gpu.kinds.mpspod import MpsPodConfig, MpsPods
from drivers.gpu.metrics import Metrics
from drivers.gpu.model import clique
from drivers.gpu.model.devicehealth import DEFAULT_IGNORED_XIDS, DEFAULT_RECOVERABLE_XIDS, Taint
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Inventory
from drivers.gpu.model.migmake import Maker
from kubeletplugin import healthstream as health
from kubeletplugin.cohost import Guest, Host, NodeFacts
from kubeletplugin.containertoolkit import Toolkit
from kubeletplugin.devices import NodeDevices
from kubeletplugin.metrics import MetricsServer
from kubeletplugin.probes import ProbeServer
from kubeletplugin.serve import NodeDriver, Published, Served, serve
from kubeletplugin.sockets import SocketPaths, socket_paths
from kubeletplugin.state import StateConfig

if TYPE_CHECKING:
    import ctypes

    from driver.kube.session import Session
    from driver.nvml import Nvml
    from drivers.gpu.model.events import EventWatcher

log = logging.getLogger(__name__)

# The extended resource the NVIDIA device plugin advertises.
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodeConfig:
    node_name: str
    driver_name: str = DEFAULT_DRIVER_NAME
    kubeconfig: Path | None = None
    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/run/cdi")
    nvidia_driver_root: Path = Path("/")
    container_driver_root: Path = Path("/driver-root")
    # Holds the sys/ and proc/driver/ discovery reads: the host's, as every container sees
    # them; a simulated node's own tree elsewhere.
    sysfs_root: Path = Path("/")
    nvidia_smi: Path | None = None
    mps_control: Path | None = None
    # MPS control daemons as pods of their own (the chart's way); None: plugin processes.
    mps_pod: MpsPodConfig | None = None
    # Publish GPUs for consumable capacity (drivers.gpu.kinds.capacity).
    consumable_capacity: bool = False
    # Publish GPUs in MIG mode as partitions, made at prepare (drivers.gpu.kinds.dynmig).
    dynamic_mig: bool = False
    pod_uid: str | None = None
    nvml: str = "system"
    profile: str | None = None
    sim_state: Path | None = None
    healthcheck_port: int = 51515
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    # Automatic recovery of devices tainted for recoverable XIDs: after this many
    # consecutive healthy probes, recovery_period apart; 0: off (an admin clears them).
    recovery_probes: int = 0
    recoverable_xids: frozenset[int] = DEFAULT_RECOVERABLE_XIDS
    recovery_period: float = 10.0
    # Prometheus metrics on this TCP port (0: a free one); None: not served.
    metrics_port: int | None = None
    # ... on this address: the chart gives the pod's IP; loopback unless one is given.
    metrics_address: str = "127.0.0.1"
    slice_resync_period: float = 600.0
    reconcile_period: float = 600.0
    # How often an MPS daemon that died is looked for, and restarted.
    watch_period: float = 5.0
    # How long to wait before retrying a failed setup or re-checking the guard.
    retry_period: float = 30.0


async def main(config: NodeConfig, guests: Sequence[Guest] = ()) -> int:
    """Run until SIGTERM or SIGINT; SIGHUP rediscovers (and so re-reads NVML) and relists.
    ``guests``: other drivers served from this process once the GPU driver serves."""
    import signal

    stop, hup = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hup.set)
    return await run(config, stop, hup=hup, guests=guests)


async def run(
    config: NodeConfig,
    stop: asyncio.Event,
    *,
    hup: asyncio.Event | None = None,
    guests: Sequence[Guest] = (),
) -> int:
    try:
        paths = socket_paths(
            registrar_dir=config.registrar_dir,
            plugins_dir=config.plugins_dir,
            driver_name=config.driver_name,
            pod_uid=config.pod_uid,
        )
        # Any claim may ask for MPS: a node whose daemon could never bind its sockets
        # (sun_path) is refused here, in one line, not at each claim's prepare.
        mpspaths.check(config.plugins_dir.absolute() / config.driver_name)
    except PermanentError as exc:
        log.error("invalid configuration", extra=kv(error=exc))
        return 2
    probes = ProbeServer(paths, port=config.healthcheck_port)
    try:
        await probes.start()
    except OSError as exc:
        log.error("cannot serve the probe service", extra=kv(error=exc))
        return 2
    try:
        api_client = await kubeclient.api_client(config.kubeconfig, component="kubelet-plugin")
    except Exception as exc:
        await probes.stop()
        log.error("cannot configure the Kubernetes client", extra=kv(error=exc))
        return 2
    try:
        return await _Node(config, paths, probes, api_client, hup, guests).run(stop)
    finally:
        await kubeclient.close(api_client)
        await probes.stop()


def host_facts(inventory: Inventory | None) -> NodeFacts | None:
    """What a guest driver is told of the node's last discovery; raises CliqueError when
    its GPUs disagree on their NVLink clique."""
    if inventory is None:
        return None
    return NodeFacts(inventory.driver_version, clique.clique_id(inventory))


# What _start_guest returns for a refusal no retry can change.
_FINAL = "final"


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; True when asked to stop meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def _on_hup(hup: asyncio.Event, controller: SliceController) -> None:
    while True:
        await hup.wait()
        hup.clear()
        log.info("SIGHUP: rediscovering and relisting")
        controller.trigger(relist=True)


class _Node:
    def __init__(
        self,
        config: NodeConfig,
        paths: SocketPaths,
        probes: ProbeServer,
        api_client: "Session",
        hup: asyncio.Event | None = None,
        guests: Sequence[Guest] = (),
    ) -> None:
        self._config = config
        self._guests = list(guests)
        self._serving: list[Guest] = []
        # Starts of guests that failed, retried apart from the served driver's loops: they end by
        # succeeding.
        self._guest_tasks: list[asyncio.Task[None]] = []
        self._hup = hup
        self._paths = paths
        self._probes = probes
        self._api = api_client
        self._served: Served[Metrics] | None = None
        # Owns the NVML backend (a simulated node's sysfs tree) for the process's life.
        self._exit_stack = contextlib.ExitStack()
        self._backend: tuple[Nvml, Path] | None = None
        self._devices: NodeDevices[Inventory] | None = None
        # The one table of kinds, made with the node (setup), for the devices and claim state.
        self._kinds: tuple[GpuNode, KindTable] | None = None
        # The kubelet's health stream reads it; the NVML watcher writes it.
        self._health = health.HealthBoard()
        self._watcher: tuple[threading.Thread, EventWatcher] | None = None
        self._metrics: MetricsServer | None = None
        self._registry: CollectorRegistry | None = None
        self._taints: Mapping[str, tuple[Taint, ...]] = {}  # health.json, read in setup
        self._node_uid = ""  # the guard's read of the Node, for the slices' owner

    async def run(self, stop: asyncio.Event) -> int:
        try:
            served = await self._setup(stop)
            if served is None:
                return 0
            self._served = served
            self._registry = served.metrics.registry  # guests' families join it
            await self._start_guests(stop)
            self._probes.set_ready()
            log.info(
                "kubelet plugin ready",
                extra=kv(node=self._config.node_name, driver=self._config.driver_name),
            )
            settling = asyncio.create_task(
                _settle(served.publisher.published), name="start-up-settle"
            )
            try:
                return await self._wait_for_stop(stop, served)
            finally:
                settling.cancel()
        finally:
            await self._shutdown()

    async def _setup(self, stop: asyncio.Event) -> "Served[Metrics] | None":
        """Guard, discovery, then the driver served (claim state first), retried until they
        succeed or we are stopped."""
        last = ""
        while not stop.is_set():
            try:
                # The guard's read and NVML discovery at once: discovery has no side
                # effect, and a joining node's first publish waits on both.
                guard, found = await asyncio.gather(
                    self._device_plugin_present(), self._discover(), return_exceptions=True
                )
                for outcome in (guard, found):
                    if isinstance(outcome, BaseException):
                        raise outcome
                reason = cast("str | None", guard)
                if reason is None:
                    return await serve(self._driver(), self._api)
            except (DriverError, OSError) as exc:
                reason = f"setup failed, retrying in {self._config.retry_period:g}s: {exc}"
            except Exception as exc:  # API errors of the kubernetes client, NVML errors
                reason = f"setup failed, retrying in {self._config.retry_period:g}s: {exc!r}"
            self._probes.set_not_ready(reason)
            gcpause.start_up_over()  # a start that waits is no quick start: collect as usual
            if reason != last:  # one line per distinct problem, not one per retry
                log.error(reason, extra=kv(node=self._config.node_name))
                last = reason
            if await _wait(stop, self._config.retry_period):
                break
        return None

    async def _device_plugin_present(self) -> str | None:
        # Raw JSON: importing CoreV1Api and its models costs 24 MiB of RSS.
        node = await Client(self._api).get(NODES, self._config.node_name)
        self._node_uid = str((node.get("metadata") or {}).get("uid") or "")
        capacity = (node.get("status") or {}).get("capacity") or {}
        count = capacity.get(DEVICE_PLUGIN_RESOURCE)
        if count is None or str(count) == "0":
            return None
        return (
            f"node {self._config.node_name} already advertises {DEVICE_PLUGIN_RESOURCE}={count} "
            "from a device plugin: not registering and not publishing ResourceSlices, since "
            "both would hand out the same GPUs; remove the NVIDIA device plugin from this node"
        )

    async def _discover(self) -> None:
        """health.json, NVML and the first discovery: reads only, so they need not wait
        for the guard."""
        cfg = self._config
        # In setup, so a health.json it cannot understand keeps the node not ready with
        # one line, as an unreadable claim record does, instead of crashing the process.
        self._taints = await asyncio.to_thread(read_state, cfg.plugins_dir / cfg.driver_name)
        backend, sysfs_root = await asyncio.to_thread(self._load_nvml)

        reported: set[str] = set()  # skipped GPUs warned about once, not every resync

        async def rediscover() -> Inventory:
            return await asyncio.to_thread(
                discover,
                backend,
                sysfs_root=sysfs_root,
                reported=reported,
                dynamic_mig=cfg.dynamic_mig,
            )

        # One inventory and one table of kinds for the publisher and the claim state, for
        # the process's life.
        kinds_node = await self._kinds_node(backend, sysfs_root)
        table = gpu_kinds(kinds_node)
        self._kinds = (kinds_node, table)
        self._devices = node_devices(rediscover, node_name=cfg.node_name, kinds=table)
        found = await self._devices.refresh()
        log.info("GPUs discovered", extra=kv(node=cfg.node_name, devices=len(found)))

    async def _kinds_node(self, backend: "Nvml", sysfs_root: Path) -> GpuNode:
        """What the kinds are given of the node: its driver roots, tools, NVML, MPS pods."""
        cfg = self._config
        mps_pods = None
        if cfg.mps_pod is not None:
            loop = asyncio.get_running_loop()
            mps_pods = MpsPods(Client(self._api), loop, cfg.mps_pod, cfg.node_name)
        return GpuNode(
            container_driver_root=cfg.container_driver_root,
            nvidia_driver_root=cfg.nvidia_driver_root,
            nvidia_smi=cfg.nvidia_smi,
            mps_control=cfg.mps_control,
            nvml_library=await asyncio.to_thread(library.find, cfg.container_driver_root),
            mig_maker=Maker(backend, sysfs_root),
            mps_pods=mps_pods,
            consumable_capacity=cfg.consumable_capacity,
        )

    def _driver(self) -> NodeDriver[Inventory, Metrics]:
        """The GPU driver as the framework serves it, with a health monitor of its own."""
        cfg = self._config
        assert self._devices is not None and self._kinds is not None, "_discover first"
        kinds_node, table = self._kinds
        devices = self._devices
        # Health first: the first slice already carries what the last instance persisted.
        monitor = HealthMonitor(
            cfg.plugins_dir / cfg.driver_name,
            self._health,
            pool=cfg.node_name,
            ignored=cfg.ignored_xids,
            recovery=self._recovery(),
            taints=self._taints,
        )
        watched = self._watched()
        monitor.set_devices(watched.devices, watched.migs)

        def metrics(publisher: SliceController) -> Metrics:
            return Metrics(
                kinds=table,
                board=self._health,
                events_by_xid=lambda: monitor.events_by_xid,
                slice_writes=lambda: publisher.stats.writes,
                slice_write_failures=lambda: publisher.stats.failures,
                api_errors=lambda: self._api.errors,
            )

        async def opened() -> None:
            # Recovery may have destroyed the instances a crash left, which the first
            # discovery took for out of band: their placements are free again.
            await devices.refresh()

        async def started(served: Served[Metrics]) -> None:
            await self._started(served, monitor)

        return NodeDriver(
            state=StateConfig(
                plugin_dir=cfg.plugins_dir / cfg.driver_name,
                cdi_root=cfg.cdi_root,
                driver_name=cfg.driver_name,
                node_name=cfg.node_name,
                host=self._toolkit(),
                pod_uid=cfg.pod_uid,
                flavor=flavor.gpu(kinds_node, table),
            ),
            paths=self._paths,
            devices=devices,
            metrics=metrics,
            publish=monitor.tainted(self._published(monitor, watched)),
            board=self._health,
            node_uid=self._node_uid,
            slice_resync_period=cfg.slice_resync_period,
            reconcile_period=cfg.reconcile_period,
            watch_period=cfg.watch_period,
            opened=opened if cfg.dynamic_mig else None,
            started=started,
        )

    def _toolkit(self) -> Toolkit:
        cfg = self._config
        return flavor.toolkit(
            cfg.container_driver_root, cfg.nvidia_driver_root, simulated=cfg.nvml == "simulated"
        )

    def _load_nvml(self) -> "tuple[Nvml, Path]":
        from driver import nvml

        cfg = self._config
        if self._backend is None:  # setup retries reuse the backend
            self._backend = self._exit_stack.enter_context(
                nvml.backend(
                    cfg.nvml,
                    profile=cfg.profile,
                    node_name=cfg.node_name,
                    state_file=cfg.sim_state,
                    driver_root=cfg.container_driver_root,
                    sysfs_root=cfg.sysfs_root,
                )
            )
            if cfg.nvml == "system":
                # Which copy serves this node: the first thing to know when discovery looks
                # wrong (load is idempotent: the path of the copy already loaded).
                path = library.load(cfg.container_driver_root)
                log.info("NVML library loaded", extra=kv(node=cfg.node_name, path=str(path)))
        return self._backend

    def _published(self, monitor: HealthMonitor, watched: Watched) -> Published:
        """What the publisher writes: the devices, each resync rediscovered but the first
        (setup discovered a moment ago); devices that came or went change what is watched."""
        cfg = self._config
        assert self._devices is not None
        devices_of = self._devices
        first = True

        async def published() -> list[dict[str, Any]]:
            nonlocal watched, first
            devices = devices_of.discovered() if first else await devices_of.published()
            first = False
            now = self._watched()
            if now != watched:
                log.info(
                    "GPU inventory changed: following it with the health watcher",
                    extra=kv(
                        node=cfg.node_name,
                        added=len(now.devices.keys() - watched.devices.keys()),
                        removed=len(watched.devices.keys() - now.devices.keys()),
                    ),
                )
                if self._watcher is not None and now.gpus != watched.gpus:
                    self._watcher[1].watch(now.gpus)
                watched = now
                monitor.set_devices(now.devices, now.migs)
            return devices

        return published

    async def _started(self, served: "Served[Metrics]", monitor: HealthMonitor) -> None:
        """The GPU driver's own parts, once it serves: metrics, health, SIGHUP."""
        cfg = self._config
        monitor.on_change = served.publisher.trigger
        if cfg.metrics_port is not None:  # after the publisher: its counts are scraped
            self._metrics = MetricsServer(
                served.metrics, port=cfg.metrics_port, host=cfg.metrics_address
            )
            await self._metrics.start()
        served.spawn(monitor.run(), "health-monitor")
        if cfg.recovery_probes > 0:
            served.spawn(monitor.run_recovery(), "health-recovery")
        if self._hup is not None:
            served.spawn(_on_hup(self._hup, served.publisher), "sighup")
        self._start_watcher(monitor)

    async def _start_guests(self, stop: asyncio.Event) -> None:
        """Each other driver of this process, on this one's NVML and inventory; one that
        refuses says why in one line and the GPU driver serves on. A refusal is retried as
        the GPU driver's setup is, every ``retry_period`` and logged again only when its
        reason changes, until it serves or the process stops; but not an NVIDIA driver
        below the floor, which only a driver upgrade (and so a restart) changes."""
        assert self._devices is not None and self._backend is not None
        devices = self._devices

        async def rediscover() -> None:
            await devices.refresh()

        host = Host(
            api_client=self._api,
            facts=lambda: host_facts(devices.inventory),
            rediscover=rediscover,
            proc_root=self._backend[1],
            registry=self._registry,
            host_edits=self._toolkit(),
        )
        for guest in self._guests:
            reason = await self._start_guest(guest, host, "")
            if reason is not None and reason != _FINAL:
                self._guest_tasks.append(
                    asyncio.create_task(
                        self._retry_guest(guest, host, stop, reason), name=f"start-{guest.name}"
                    )
                )

    async def _start_guest(self, guest: Guest, host: Host, last: str) -> str | None:
        """One start of ``guest``: None when it serves, else why not (logged unless it is
        ``last``), or _FINAL when no retry can help."""
        try:
            await guest.start(host)
        except asyncio.CancelledError:
            await guest.stop()  # stopped mid-start: what it started so far goes too
            raise
        except Exception as exc:  # a guest's failure is its own: the GPU driver serves on
            final = isinstance(exc, DriverTooOld)
            reason = f"{type(exc).__name__}: {exc}"
            if reason != last:
                log.error(
                    "not serving driver",
                    exc_info=not isinstance(exc, DriverError | OSError),
                    extra=kv(
                        driver=guest.name,
                        error=str(exc),
                        retry_in="never" if final else f"{self._config.retry_period:g}s",
                    ),
                )
            await guest.stop()
            return _FINAL if final else reason
        self._serving.append(guest)
        return None

    async def _retry_guest(self, guest: Guest, host: Host, stop: asyncio.Event, last: str) -> None:
        while not await _wait(stop, self._config.retry_period):
            reason = await self._start_guest(guest, host, last)
            if reason is None:
                log.info("serving driver after a failed start", extra=kv(driver=guest.name))
                return
            if reason == _FINAL:
                return
            last = reason

    def _recovery(self) -> Recovery | None:
        from drivers.gpu.model.events import EventNvml, probe

        cfg = self._config
        if cfg.recovery_probes <= 0:
            return None
        assert self._backend is not None
        nvml = cast(EventNvml, self._backend[0])
        return Recovery(
            probes=cfg.recovery_probes,
            period=cfg.recovery_period,
            xids=cfg.recoverable_xids,
            probe=lambda uuid: probe(nvml, uuid),
        )

    def _watched(self) -> Watched:
        assert self._devices is not None
        assert self._kinds is not None
        return Watched.of(self._devices.current, self._devices.inventory, self._kinds[1])

    def _start_watcher(self, monitor: HealthMonitor) -> None:
        from drivers.gpu.model.events import EventNvml, EventWatcher

        assert self._backend is not None
        nvml = cast(EventNvml, self._backend[0])
        watcher = EventWatcher(nvml, self._watched().gpus, monitor.submit)
        # A thread of its own: the wait blocks in C for up to 5 s at a time.
        thread = threading.Thread(target=watcher.run, name="nvml-events", daemon=True)
        thread.start()
        self._watcher = (thread, watcher)

    async def _wait_for_stop(self, stop: asyncio.Event, served: "Served[Metrics]") -> int:
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopping, *served.tasks], return_when=asyncio.FIRST_COMPLETED)
        if stopping in done:
            log.info("stopping on signal")
            return 0
        stopping.cancel()
        for task in done:
            # A background loop only ends by failing: restart the whole process.
            exc = task.exception()
            log.error("background task ended", extra=kv(task=task.get_name(), error=repr(exc)))
        self._probes.set_not_ready("a background task failed")
        return 1

    async def _shutdown(self) -> None:
        for task in self._guest_tasks:  # a start in flight stops what it started
            task.cancel()
        await asyncio.gather(*self._guest_tasks, return_exceptions=True)
        self._guest_tasks.clear()
        for guest in reversed(self._serving):
            await guest.stop()
        self._serving.clear()
        if self._served is not None:  # registration first, then its loops
            await self._served.stop()
            self._served = None
        if self._metrics is not None:
            await self._metrics.stop()
            self._metrics = None
        if self._watcher is not None:  # before NVML goes away with the exit stack
            thread, watcher = self._watcher
            watcher.stop()
            await asyncio.to_thread(thread.join, 10)
            self._watcher = None
        await asyncio.to_thread(self._exit_stack.close)


_M_ARENA_MAX = -8  # glibc's mallopt parameter


def _libc() -> "ctypes.CDLL | None":
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): its allocator has neither knob
        return None


def limit_malloc_arenas() -> None:
    """One glibc heap per thread (gRPC's pollers, the executor, the NVML watcher) keeps
    freed memory per thread; the daemon's threads mostly wait, so two heaps serve them."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, 2)


# How long after ready the start-up may wait on its first publish (an API server that
# refuses it) before the collector resumes anyway.
_SETTLE_S = 10.0


async def _settle(published: asyncio.Event) -> None:
    """End start-up once the node's slices are first published (a joining node's pool waits
    on that, nothing waits on this), or ``_SETTLE_S`` after ready."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(published.wait(), _SETTLE_S)
    _return_freed_memory()


def _return_freed_memory() -> None:
    """Start-up (imports, discovery, the first slice write) frees much of what it allocated,
    but glibc keeps freed heap pages mapped: hand them back, so the node's resting RSS is
    what the daemon holds, not what it once touched. The collector resumes here, after one
    full collection (:func:`gcpause.pause_start_up`)."""
    gcpause.start_up_over()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
