"""The framework's one entry point: a driver handed to serve() is registered, prepares,
publishes, and stops in reverse order; a start that fails leaves nothing running."""

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.kube.session import Session
from driver.slices import SliceController
from drivers.gpu.model.inventory import Inventory
from kubeletplugin import healthstream as health
from kubeletplugin.metrics import ClaimMetrics
from kubeletplugin.serve import NodeDriver, Served, serve
from kubeletplugin.sockets import socket_paths
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests.test_state import DRIVER, NODE, _config, _inventory, create_claim, devices_of


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Socket paths must stay within MAX_SOCKET_PATH: pytest's tmp_path may be longer.
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dra") as name:
        yield Path(name)


def _driver(root: Path, **hooks: object) -> NodeDriver[Inventory, ClaimMetrics]:
    config = _config(root)
    seen: list[SliceController] = []

    def metrics(publisher: SliceController) -> ClaimMetrics:
        seen.append(publisher)
        return ClaimMetrics("test_serve")

    return NodeDriver(
        state=config,
        paths=socket_paths(
            registrar_dir=root / "registry",
            plugins_dir=root / "plugins",
            driver_name=DRIVER,
            pod_uid=None,
        ),
        devices=devices_of(_inventory("p5.48xlarge", root), config),
        metrics=metrics,
        board=health.HealthBoard(),
        **hooks,  # type: ignore[arg-type]
    )


def _ours() -> set[str]:
    return {
        t.get_name() for t in asyncio.all_tasks() if t.get_name().endswith(DRIVER) and not t.done()
    }


async def test_a_served_driver_registers_prepares_publishes_and_stops_in_reverse(
    short_dir: Path, apiserver: LocalApiServer, api_client: Session
) -> None:
    sockets_at_start: list[bool] = []

    async def started(served: Served[ClaimMetrics]) -> None:
        # The driver's own part comes last, with both sockets serving.
        paths = driver.paths
        sockets_at_start.append(paths.dra.is_socket() and paths.registration.is_socket())

    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    driver = _driver(short_dir, started=started)
    served = await serve(driver, api_client)
    assert sockets_at_start == [True]
    try:
        await _serving(driver, served, apiserver, api_client)
    finally:
        await served.stop()
    assert not driver.paths.registration.exists() and not driver.paths.dra.exists()
    assert _ours() == set()


async def _serving(
    driver: NodeDriver[Inventory, ClaimMetrics],
    served: Served[ClaimMetrics],
    apiserver: LocalApiServer,
    api_client: Session,
) -> None:
    assert _ours() == {
        f"slice-controller-{DRIVER}",
        f"reconciler-{DRIVER}",
        f"claim-status-{DRIVER}",
        f"claim-status-health-{DRIVER}",
    }
    async with await KubeletSim.register(driver.paths.registration) as kubelet:
        assert kubelet.registration.info.name == DRIVER
        assert kubelet.watch_health() is not None  # the board given: the health service too
        ref = await create_claim(api_client, "one", ["gpu-0"])
        answer = await kubelet.prepare([ref])
        assert answer.claims[ref.uid].error == ""
        assert [d.device_name for d in answer.claims[ref.uid].devices] == ["gpu-0"]
    await asyncio.wait_for(served.publisher.published.wait(), 20)
    names = {
        d["name"]
        for s in apiserver.objects("resourceslices")
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"]["devices"]
    }
    assert names == set(driver.devices.current)


async def test_a_start_that_fails_leaves_no_socket_and_no_loop(
    short_dir: Path, api_client: Session
) -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def started(served: Served[ClaimMetrics]) -> None:
        served.spawn(forever(), f"own-loop-{DRIVER}")
        raise OSError("metrics port taken")

    driver = _driver(short_dir, started=started)
    with pytest.raises(OSError, match="metrics port taken"):
        await serve(driver, api_client)
    assert not driver.paths.registration.exists() and not driver.paths.dra.exists()
    assert _ours() == set()
    # A retry of the same driver serves: the failed try left nothing in its way.
    served = await serve(_driver(short_dir), api_client)
    await served.stop()
