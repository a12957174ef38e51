"""The node process in-process, against the local API server: the kubelet's view.

The kubelet simulator registers through the registration socket and then
drives NodePrepareResources / NodeUnprepareResources over v1 and v1beta1; the
claims live in the local API server with a status.allocation as the scheduler
writes it, and the plugin's real DeviceState, CDI writer and claim records do the work.
"""

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from drivers.gpu import node
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import (
    NodeDirs,
    create_claim,
    create_node,
    health_status,
    logged_health_port,
    wait_for,
)

NODE = "node-a"


def _config(dirs: NodeDirs, kubeconfig: Path) -> node.NodeConfig:
    return dirs.node_config(kubeconfig, node_name=NODE, profile="p5.48xlarge")


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
async def test_kubelet_registers_then_prepares_and_unprepares(
    kube: tuple[Any, Path], dirs: NodeDirs, version: str
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    one = await create_claim(api, "one", node=NODE, devices=["gpu-0"])
    two = await create_claim(api, "two", node=NODE, devices=["gpu-1", "gpu-2"])
    taken = await create_claim(api, "taken", node=NODE, devices=["gpu-0"])
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(_config(dirs, kubeconfig), stop))
    paths = dirs.paths()
    try:
        await wait_for(paths.registration.is_socket, "registration socket")
        async with await KubeletSim.register(
            paths.registration, known_versions=[version]
        ) as kubelet:
            assert kubelet.registration.version == version
            response = await kubelet.prepare([one, two])
            assert {uid: r.error for uid, r in response.claims.items()} == {
                one.uid: "",
                two.uid: "",
            }
            devices = response.claims[two.uid].devices
            assert sorted(d.device_name for d in devices) == ["gpu-1", "gpu-2"]
            assert {d.pool_name for d in devices} == {NODE}
            assert {tuple(d.request_names) for d in devices} == {("gpu",)}
            assert sorted(id for d in devices for id in d.cdi_device_ids) == [
                f"k8s.gpu.nvidia.com/claim={two.uid}-gpu-1",
                f"k8s.gpu.nvidia.com/claim={two.uid}-gpu-2",
            ]
            assert len(list(dirs.cdi.iterdir())) == 2  # one spec per claim

            # The kubelet retries: the same answer again.
            again = await kubelet.prepare([two])
            assert again.claims[two.uid] == response.claims[two.uid]
            # gpu-0 is prepared for "one": a second claim for it is refused, alone.
            refused = await kubelet.prepare([taken])
            assert "gpu-0" in refused.claims[taken.uid].error

            out = await kubelet.unprepare([one, two, taken])
            assert {uid: r.error for uid, r in out.claims.items()} == {
                one.uid: "",
                two.uid: "",
                taken.uid: "",
            }
            assert not list(dirs.cdi.iterdir())
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert not paths.registration.exists()
    assert not paths.dra.exists()


def _node_reads(apiserver: Any) -> int:
    return int(apiserver.requests.count("get", "nodes"))


async def test_device_plugin_guard_keeps_the_plugin_unregistered(
    apiserver: Any, kube: tuple[Any, Path], dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE, capacity={"nvidia.com/gpu": "8"})
    stop = asyncio.Event()
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(node.run(_config(dirs, kubeconfig), stop))
    try:
        await wait_for(
            lambda: any("device plugin" in r.getMessage() for r in caplog.records),
            "the guard's log line",
        )
        assert (
            await health_status(logged_health_port(caplog.records))
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        # The guard rechecks the Node (every 0.2 s here) and logs nothing new: one line.
        await wait_for(lambda: _node_reads(apiserver) >= 3, "three guard checks")
        assert sum("device plugin" in r.getMessage() for r in caplog.records) == 1
        assert not running.done()
        assert not dirs.registry.exists() or not list(dirs.registry.iterdir())
        assert not dirs.paths().dra.exists()
        from kubernetes.aio import client

        slices = await client.ResourceV1Api(api).list_resource_slice()
        assert slices.items == []
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
    assert [
        r for r in caplog.records if "device plugin" in r.getMessage() and r.levelname == "ERROR"
    ]


async def test_setup_error_stays_up_not_ready(
    kube: tuple[Any, Path], dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    config = dataclasses.replace(_config(dirs, kubeconfig), profile="no-such-instance-type")
    stop = asyncio.Event()
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(node.run(config, stop))
    try:
        await wait_for(
            lambda: any("setup failed" in r.getMessage() for r in caplog.records),
            "the setup error's log line",
        )
        assert "no-such-instance-type" in next(
            r.getMessage() for r in caplog.records if "setup failed" in r.getMessage()
        )
        assert (
            await health_status(logged_health_port(caplog.records))
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert not running.done()  # no crash loop
        assert not dirs.paths().registration.exists()
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
