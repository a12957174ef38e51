"""Where a node driver is assembled: one entry point, :func:`serve`, for every driver.

A driver supplies a :class:`NodeDriver`: its names and claim state settings (its
``Flavor`` among them), its devices, its metric families, and hooks for what only it
does. :func:`serve` owns the rest, in the order the kubelet needs it: the claim state
opened (records checked and recovered), the DRA socket, then the registration socket (the
kubelet calls the DRA socket as soon as it sees the registration one), then the slice
publisher, the reconciler, the claim status writer and the driver's own loops. The
:class:`Served` it returns stops them in reverse order: registration first, so the kubelet
stops choosing this instance, then every loop; slices stay for the next instance.

A driver never builds a claim state, a socket server or a publisher itself; a fourth
driver is one more package under ``drivers/`` that calls :func:`serve`.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from api.gen import pluginregistration_v1_pb2_grpc as reg_grpc
from driver.common.logs import kv
from driver.kube.rest import Client
from driver.kube.session import Session
from driver.slices import SliceController
from kubeletplugin import draservice
from kubeletplugin import healthstream as health
from kubeletplugin.claimstatus import ClaimStatusWriter, Describe
from kubeletplugin.devices import NodeDevices
from kubeletplugin.metrics import ClaimMetrics
from kubeletplugin.registration import RegistrationServicer
from kubeletplugin.sockets import SocketPaths, SocketServer
from kubeletplugin.state import DeviceState, StateConfig

log = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - the driver's inventory, as the seam names it
M = TypeVar("M", bound=ClaimMetrics)

Published = Callable[[], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True)
class NodeDriver(Generic[I, M]):
    """One node driver, as :func:`serve` needs it.

    ``metrics`` makes the driver's metric families; it is given the publisher, whose counts
    a driver may export. ``publish`` is what the publisher writes (default: the devices'
    own; the GPU driver adds its health taints). ``opened`` runs once the claim state has
    recovered, before anything serves. ``started`` runs last, with everything serving: a
    driver starts its own loops there with :meth:`Served.spawn`, so that they stop with it.
    ``watch_period``: how often the claim state looks for side effects that died (MPS
    daemons); None, never.
    """

    state: StateConfig
    paths: SocketPaths
    devices: NodeDevices[I]
    metrics: Callable[[SliceController], M]
    publish: Published | None = None
    board: health.HealthBoard | None = None
    describe: Describe | None = None  # more of a device's claim status entry (its domain)
    node_uid: str = ""  # the Node's, for the slices' owner reference; "": none
    slice_resync_period: float = 600.0
    reconcile_period: float = 600.0
    watch_period: float | None = None
    opened: Callable[[], Awaitable[None]] | None = None
    started: Callable[["Served[M]"], Awaitable[None]] | None = None

    @property
    def name(self) -> str:
        return self.state.driver_name


@dataclass(eq=False)
class Served(Generic[M]):
    """A driver serving: its claim state, publisher and metrics, and what :meth:`stop` ends."""

    name: str
    state: DeviceState
    publisher: SliceController
    metrics: M
    _servers: list[SocketServer] = field(default_factory=list)
    _tasks: list["asyncio.Task[None]"] = field(default_factory=list)

    def spawn(self, loop: Coroutine[Any, Any, None], name: str) -> "asyncio.Task[None]":
        """Run ``loop`` until :meth:`stop`; a loop that ends by itself has failed."""
        task = asyncio.create_task(loop, name=name)
        self._tasks.append(task)
        return task

    @property
    def tasks(self) -> tuple["asyncio.Task[None]", ...]:
        return tuple(self._tasks)

    async def stop(self) -> None:
        """Registration first, then the DRA socket, then every loop, newest first."""
        for server in reversed(self._servers):
            await server.stop()
        self._servers.clear()
        tasks, self._tasks = self._tasks, []
        for task in reversed(tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)


async def serve(driver: NodeDriver[I, M], api_client: Session) -> Served[M]:
    """Open ``driver``'s claim state and serve it; what fails here leaves nothing running.

    Raises what :meth:`DeviceState.open` raises (a record this release cannot read, another
    driver's state, no driver libraries), and OSError when a socket cannot be bound."""
    cfg = driver.state
    state = await DeviceState.open(cfg, api_client, driver.devices)
    if driver.opened is not None:
        await driver.opened()
    devices = driver.devices
    publisher = SliceController(
        api_client,
        node_name=cfg.node_name,
        driver_name=cfg.driver_name,
        devices=driver.publish or devices.published,
        counter_sets=devices.counter_sets,
        resync_period=driver.slice_resync_period,
        node_uid=driver.node_uid,
    )
    served = Served(cfg.driver_name, state, publisher, driver.metrics(publisher))
    try:
        await _serve(driver, served, api_client)
    except BaseException:
        await served.stop()
        raise
    log.info("driver serving", extra=kv(node=cfg.node_name, driver=cfg.driver_name))
    return served


async def _serve(driver: NodeDriver[I, M], served: Served[M], api_client: Session) -> None:
    cfg, paths, devices = driver.state, driver.paths, driver.devices
    status = ClaimStatusWriter(
        Client(api_client),
        driver=cfg.driver_name,
        pool=cfg.pool_name or cfg.node_name,
        devices=lambda: devices.current,
        board=driver.board,
        describe=driver.describe,
    )
    await served.state.observe(served.metrics, status)  # recovered claims first
    dra = grpc.aio.server()
    draservice.add_to_server(dra, served.state, served.metrics)
    versions: tuple[str, ...] = draservice.SUPPORTED_VERSIONS
    if driver.board is not None:
        health.add_to_server(dra, driver.board)
        versions += health.SERVICE_NAMES
    registration = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(
        RegistrationServicer(
            driver_name=cfg.driver_name, endpoint=str(paths.dra), versions=versions
        ),
        registration,
    )
    for path, server in ((paths.dra, dra), (paths.registration, registration)):
        socket_server = SocketServer(path, server, stale=paths.others(path))
        await socket_server.start()
        served._servers.append(socket_server)
    # First of the loops: a joining node's pool waits on it, nothing else does.
    served.spawn(served.publisher.run(), f"slice-controller-{cfg.driver_name}")
    served.spawn(
        served.state.run_reconciler(driver.reconcile_period), f"reconciler-{cfg.driver_name}"
    )
    served._tasks += status.start()
    if driver.watch_period is not None:
        served.spawn(served.state.run_watchdog(driver.watch_period), f"watchdog-{cfg.driver_name}")
    if driver.started is not None:
        await driver.started(served)
