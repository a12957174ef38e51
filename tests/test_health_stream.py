"""The kubelet's health stream over real unix sockets, in v1alpha1 and v1, with its timing."""

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from api.gen import pluginregistration_v1_pb2_grpc as reg_grpc
from kubeletplugin import draservice
from kubeletplugin import healthstream as health
from kubeletplugin.healthstream import DeviceHealth, Health, HealthBoard
from kubeletplugin.registration import RegistrationServicer
from kubeletplugin.sockets import SocketPaths, SocketServer, socket_paths
from sandbox.kubeletsim import HealthWatch, KubeletSim, choose_health_service, watching

DRIVER = "gpu.nvidia.com"
POOL = "node-a"
VERSIONS = ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="drah") as name:
        yield Path(name)


def _devices(states: dict[str, Health]) -> list[DeviceHealth]:
    return [DeviceHealth(pool=POOL, device=name, health=h) for name, h in states.items()]


@contextlib.asynccontextmanager
async def _serve(root: Path, board: HealthBoard, resend: float) -> AsyncIterator[SocketPaths]:
    paths = socket_paths(
        registrar_dir=root / "registry",
        plugins_dir=root / "plugins",
        driver_name=DRIVER,
        pod_uid=None,
    )
    dra = grpc.aio.server()
    health.add_to_server(dra, board, resend_period=resend)
    reg = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(
        RegistrationServicer(
            driver_name=DRIVER,
            endpoint=str(paths.dra),
            versions=draservice.SUPPORTED_VERSIONS + health.SERVICE_NAMES,
        ),
        reg,
    )
    servers = [SocketServer(paths.dra, dra), SocketServer(paths.registration, reg)]
    for server in servers:
        await server.start()
    try:
        yield paths
    finally:
        for server in reversed(servers):
            await server.stop(0)


def test_the_kubelet_prefers_v1_and_falls_back_to_v1alpha1() -> None:
    assert choose_health_service(list(reversed(VERSIONS))) == "v1.DRAResourceHealth"
    assert choose_health_service(["v1.DRAPlugin"]) is None
    older = ("v1alpha1.DRAResourceHealth",)  # a 1.36 kubelet
    assert choose_health_service(VERSIONS, older) == "v1alpha1.DRAResourceHealth"


async def test_registration_advertises_the_health_service(short_dir: Path) -> None:
    async with (
        _serve(short_dir, HealthBoard(), resend=10) as paths,
        await KubeletSim.register(paths.registration) as kubelet,
    ):
        offered = list(kubelet.registration.info.supported_versions)
        assert offered == ["v1.DRAPlugin", "v1beta1.DRAPlugin", *VERSIONS]
        assert kubelet.registration.version == "v1.DRAPlugin"
        assert kubelet.watch_health().service == "v1.DRAResourceHealth"


@pytest.mark.parametrize("service", VERSIONS)
async def test_complete_list_then_every_change(short_dir: Path, service: str) -> None:
    board = HealthBoard(_devices({"gpu-0": "Healthy", "gpu-1": "Healthy"}))
    # No periodic resend within the test: what arrives is the first list and the change.
    async with (
        _serve(short_dir, board, resend=600) as paths,
        watching(HealthWatch(str(paths.dra), service)) as watch,
    ):
        view = await watch.wait_for(lambda v: len(v) == 2)
        assert view == {(POOL, "gpu-0"): "Healthy", (POOL, "gpu-1"): "Healthy"}
        assert board.replace(_devices({"gpu-0": "Unhealthy", "gpu-1": "Healthy"}))
        view = await watch.wait_for(lambda v: v.get((POOL, "gpu-0")) == "Unhealthy")
        assert view[(POOL, "gpu-1")] == "Healthy"
        assert watch.messages == 2
        # An unchanged list wakes no stream.
        assert not board.replace(board.snapshot()[1])


@pytest.mark.parametrize("service", VERSIONS)
async def test_a_silent_plugin_makes_devices_unknown(short_dir: Path, service: str) -> None:
    board = HealthBoard(_devices({"gpu-0": "Healthy"}))
    async with (
        _serve(short_dir, board, resend=600) as paths,
        # 2 s, not 1: last_updated_time is in whole seconds, so a 1 s timeout left the
        # device Healthy for anywhere between 0 and 1 s after the message (a flake).
        watching(HealthWatch(str(paths.dra), service, timeout=2)) as watch,
    ):
        await watch.wait_for(lambda v: v == {(POOL, "gpu-0"): "Healthy"})
        await watch.wait_for(lambda v: v == {(POOL, "gpu-0"): "Unknown"}, within=5)
        assert watch.messages == 1


async def test_resends_keep_a_quiet_device_known(short_dir: Path) -> None:
    board = HealthBoard(_devices({"gpu-0": "Healthy"}))
    async with (
        _serve(short_dir, board, resend=0.2) as paths,
        watching(HealthWatch(str(paths.dra), VERSIONS[0], timeout=2)) as watch,
    ):
        await watch.wait_for(lambda v: watch.messages >= 15, within=10)
        # Three seconds of resends, each inside the 2 s timeout: never Unknown.
        assert watch.view() == {(POOL, "gpu-0"): "Healthy"}


async def test_the_kubelet_redials_a_restarted_plugin(short_dir: Path) -> None:
    board = HealthBoard(_devices({"gpu-0": "Healthy"}))
    watch = HealthWatch(str(short_dir / "plugins" / DRIVER / "dra.sock"), VERSIONS[1], redial=0.1)
    async with watching(watch):
        async with _serve(short_dir, board, resend=600):
            await watch.wait_for(lambda v: watch.messages == 1)
        # The plugin is gone; the stream fails and is dialled again until it is back.
        await watch.wait_for(lambda v: watch.dials >= 3)
        board.replace(_devices({"gpu-0": "Unhealthy"}))
        async with _serve(short_dir, board, resend=600):
            view = await watch.wait_for(lambda v: v == {(POOL, "gpu-0"): "Unhealthy"})
            assert view and watch.messages == 2
