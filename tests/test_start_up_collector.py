"""The node daemon's start-up runs with the cyclic collector paused (``gpu-dra
kubelet-plugin`` pauses it before its imports) and resumes it once the node's slices are
first published, or a bounded time after ready when the API server refuses them, or as
soon as the start has to wait and retry."""

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.common import gcpause
from drivers.gpu import node
from sandbox.apiserver import LocalApiServer
from tests.pluginharness import NodeDirs, create_node, wait_for

NODE = "node-gc"


@pytest.fixture
def paused() -> Iterator[None]:
    gcpause.pause_start_up()
    try:
        yield
    finally:
        gc.enable()


@contextlib.asynccontextmanager
async def _node(
    kube: tuple[Any, Path], dirs: NodeDirs, capacity: dict[str, str] | None = None
) -> AsyncIterator[None]:
    api, kubeconfig = kube
    await create_node(api, NODE, capacity=capacity)
    config = dirs.node_config(kubeconfig, node_name=NODE, profile="p5.48xlarge")
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(config, stop))
    try:
        yield
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


@pytest.mark.usefixtures("paused")
async def test_the_collector_stays_paused_until_the_slices_are_published(
    apiserver: LocalApiServer,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node, "_SETTLE_S", 3600.0)
    # 403, not 503: after a 503 the controller waits out the request timeout (the create
    # may still commit) before it looks again.
    apiserver.faults.fail("create", "resourceslices", code=403, times=-1)
    async with _node(kube, dirs):
        await wait_for(
            lambda: apiserver.requests.count("create", "resourceslices") >= 1, "a refused create"
        )
        await wait_for(lambda: dirs.paths().registration.exists(), "the plugin serving")
        assert not gc.isenabled()
        apiserver.faults.clear()
        await wait_for(gc.isenabled, "the collector resumed")
        assert apiserver.objects("resourceslices")


@pytest.mark.usefixtures("paused")
async def test_a_refused_publish_keeps_the_pause_no_longer_than_the_bound(
    apiserver: LocalApiServer,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node, "_SETTLE_S", 0.2)
    apiserver.faults.fail("create", "resourceslices", code=503, times=-1)
    async with _node(kube, dirs):
        await wait_for(gc.isenabled, "the collector resumed after the bound")
        assert apiserver.requests.count("create", "resourceslices") >= 1
        assert apiserver.objects("resourceslices") == []


@pytest.mark.usefixtures("paused")
async def test_a_start_that_retries_resumes_the_collector(
    kube: tuple[Any, Path], dirs: NodeDirs
) -> None:
    async with _node(kube, dirs, capacity={"nvidia.com/gpu": "8"}):  # the guard waits
        await wait_for(gc.isenabled, "the collector resumed")
        assert not dirs.paths().registration.exists()  # still waiting, not serving
