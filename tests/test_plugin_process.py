"""``gpu-dra kubelet-plugin`` as a real process: SIGKILL mid-prepare, SIGTERM, surge siblings.

One process start per step of a scenario; every wait is a condition with a
deadline (socket answers, health SERVING, process exit).
"""

import asyncio
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from driver.nvml.library import candidates
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, PluginProcess, create_claim, create_node
from tests.simroot import ctk_binary, fake_root, host_has_nvml, install_driver_files

NODE = "node-p"


@pytest.fixture
async def kube(kube: tuple[Any, Path]) -> tuple[Any, Path]:
    await create_node(kube[0], NODE)  # the plugin reads its Node at start
    return kube


def _start(
    started: list[PluginProcess], dirs: NodeDirs, kubeconfig: Path, **kwargs: Any
) -> PluginProcess:
    proc = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, **kwargs)
    started.append(proc)
    return proc


def _reservations(dirs: NodeDirs) -> dict[str, str]:
    """device -> uid of the claim it is reserved for."""
    devices = dirs.plugin_data / "devices"
    return {p.name: str(p.readlink()).split(":")[0] for p in devices.iterdir()}


def _temp_files(dirs: NodeDirs) -> list[str]:
    return [p.name for root in (dirs.cdi, dirs.plugin_data) for p in root.rglob("*.tmp")]


async def _slice_count(api: Any) -> int:
    from kubernetes.aio import client

    slices = await client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={NODE}"
    )
    return len(slices.items)


async def _wait_for_slices(api: Any) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while await _slice_count(api) == 0:
        assert asyncio.get_running_loop().time() < deadline, "no ResourceSlice published"
        await asyncio.sleep(0.05)


def _specs(dirs: NodeDirs) -> list[str]:
    return sorted(p.read_text() for p in dirs.cdi.iterdir()) if dirs.cdi.exists() else []


@pytest.mark.parametrize("crashpoint", ["after-reserve", "after-cdi-write"])
async def test_sigkill_during_prepare_then_kubelet_retry(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess], crashpoint: str
) -> None:
    api, kubeconfig = kube
    claim = await create_claim(api, "victim", node=NODE, devices=["gpu-0"])
    rival = await create_claim(api, "rival", node=NODE, devices=["gpu-0"])

    doomed = _start(processes, dirs, kubeconfig, crashpoint=crashpoint)
    await doomed.wait_ready()
    async with await KubeletSim.register(doomed.paths.registration) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.prepare([claim])
    assert await doomed.wait_exit() == -signal.SIGKILL

    plugin = _start(processes, dirs, kubeconfig)
    await plugin.wait_ready()  # over the dead instance's stale sockets
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        response = await kubelet.prepare([claim])
        entry = response.claims[claim.uid]
        assert entry.error == ""
        assert [d.device_name for d in entry.devices] == ["gpu-0"]
        assert list(entry.devices[0].cdi_device_ids) == [
            f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-0"
        ]
        # Exactly one spec, this claim's, and its device reserved for it.
        specs = _specs(dirs)
        assert len(specs) == 1
        assert claim.uid in specs[0]
        assert _reservations(dirs) == {"gpu-0": claim.uid}
        assert _temp_files(dirs) == []
        # The reservation survived the crash: gpu-0 is not handed out twice.
        refused = await kubelet.prepare([rival])
        assert "gpu-0" in refused.claims[rival.uid].error

        out = await kubelet.unprepare([claim])
        assert out.claims[claim.uid].error == ""
        assert _specs(dirs) == []
        assert _reservations(dirs) == {}
        assert (await kubelet.prepare([rival])).claims[rival.uid].error == ""
    await _wait_for_slices(api)
    assert await plugin.terminate() == 0
    assert not plugin.paths.registration.exists()
    assert not plugin.paths.dra.exists()
    # A clean stop leaves the node's slices for the next instance to take over.
    assert await _slice_count(api) > 0


async def test_sigkill_during_unprepare_then_kubelet_retry(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    claim = await create_claim(api, "leaving", node=NODE, devices=["gpu-1"])
    rival = await create_claim(api, "next", node=NODE, devices=["gpu-1"])

    doomed = _start(processes, dirs, kubeconfig, crashpoint="after-spec-removed")
    await doomed.wait_ready()
    async with await KubeletSim.register(doomed.paths.registration) as kubelet:
        assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.unprepare([claim])
    assert await doomed.wait_exit() == -signal.SIGKILL
    # The spec went first: no container gets the GPU, which stays reserved.
    assert _specs(dirs) == []
    assert _reservations(dirs) == {"gpu-1": claim.uid}

    plugin = _start(processes, dirs, kubeconfig)
    await plugin.wait_ready()
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        assert "gpu-1" in (await kubelet.prepare([rival])).claims[rival.uid].error
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert _reservations(dirs) == {}
        assert (await kubelet.prepare([rival])).claims[rival.uid].error == ""
    assert await plugin.terminate() == 0


async def test_two_pod_uids_serve_one_node(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    first = await create_claim(api, "first", node=NODE, devices=["gpu-0"])
    same_gpu = await create_claim(api, "same-gpu", node=NODE, devices=["gpu-0"])
    other_gpu = await create_claim(api, "other-gpu", node=NODE, devices=["gpu-1"])

    old = _start(processes, dirs, kubeconfig, pod_uid="0ld-pod")
    new = _start(processes, dirs, kubeconfig, pod_uid="n3w-pod")
    await old.wait_ready()
    await new.wait_ready()
    assert old.paths.registration != new.paths.registration
    assert old.paths.dra != new.paths.dra

    async with (
        await KubeletSim.register(old.paths.registration) as via_old,
        await KubeletSim.register(new.paths.registration) as via_new,
    ):
        assert via_old.registration.info.endpoint == str(old.paths.dra)
        assert via_new.registration.info.endpoint == str(new.paths.dra)
        assert (await via_old.prepare([first])).claims[first.uid].error == ""
        # The sibling sees the device reservations on disk, not a stale copy of its own.
        refused = await via_new.prepare([same_gpu])
        assert "gpu-0" in refused.claims[same_gpu.uid].error
        assert (await via_new.prepare([other_gpu])).claims[other_gpu.uid].error == ""
        assert (await via_new.unprepare([first])).claims[first.uid].error == ""
        assert len(_specs(dirs)) == 1

        # The old pod goes away cleanly; only its own sockets go with it.
        assert await old.terminate() == 0
        assert not old.paths.registration.exists()
        assert not old.paths.dra.exists()
        assert new.paths.registration.is_socket()
        assert (await via_new.prepare([same_gpu])).claims[same_gpu.uid].error == ""
        assert (await via_new.unprepare([same_gpu, other_gpu])).claims[other_gpu.uid].error == ""
    assert await new.terminate() == 0
    assert _specs(dirs) == []


async def test_system_nvml_under_the_driver_root_registers_and_publishes(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    # The library is only under the driver root, as in the DaemonSet's container.
    api, kubeconfig = kube
    ctk = ctk_binary()
    if ctk is None:
        pytest.skip("nvidia-ctk is not built: run python -m tests.e2e.build nvidia-ctk")
    if host_has_nvml():
        pytest.skip("this machine has an NVIDIA driver on the default library path")
    root = dirs.root / "host"
    node, env = fake_root(root, "g6e.12xlarge")
    install_driver_files(root, node.profile.driver_version, ctk)
    plugin = _start(processes, dirs, kubeconfig, driver_root=root, extra_env=env)
    await plugin.wait_ready()
    async with await KubeletSim.register(plugin.paths.registration) as kubelet:
        assert kubelet.registration.info.name == "gpu.nvidia.com"
    await _wait_for_slices(api)
    from kubernetes.aio import client

    slices = await client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={NODE}"
    )
    devices = [d for s in slices.items for d in s.spec.devices or []]
    assert sorted(d.name for d in devices) == [f"gpu-{i}" for i in range(4)]
    uuids = {(d.attributes or {})["uuid"].string for d in devices}
    assert uuids == {g.uuid for g in node.nvml.gpus}
    assert await plugin.terminate() == 0


async def test_system_nvml_without_the_library_says_where_it_looked_and_stays_unready(
    kube: tuple[Any, Path], dirs: NodeDirs, processes: list[PluginProcess]
) -> None:
    api, kubeconfig = kube
    if host_has_nvml():
        pytest.skip("this machine has an NVIDIA driver on the default library path")
    root = dirs.root / "empty-root"
    root.mkdir()
    plugin = _start(processes, dirs, kubeconfig, driver_root=root)
    line = (await plugin.wait_log(r".*not found under the driver root.*")).group(0)
    for path in candidates(root):
        assert str(path) in line
    assert "--container-driver-root" in line
    assert await plugin.health() == health_pb2.HealthCheckResponse.NOT_SERVING
    assert plugin.proc.poll() is None  # retrying in place, not crash-looping
    assert not plugin.paths.registration.exists()
    assert await _slice_count(api) == 0
    assert await plugin.terminate() == 0


def test_flags_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from cli import build_parser

    monkeypatch.setenv("NODE_NAME", "from-env")
    monkeypatch.setenv("POD_UID", "pod-1")
    monkeypatch.setenv("GPU_DRA_HEALTHCHECK_PORT", "6000")
    args = build_parser().parse_args(["kubelet-plugin", "--cdi-root=/x"])
    assert (args.node_name, args.pod_uid, args.healthcheck_port) == ("from-env", "pod-1", 6000)
    assert args.cdi_root == "/x"
    monkeypatch.setenv("GPU_DRA_NODE_NAME", "ours-first")
    assert build_parser().parse_args(["kubelet-plugin"]).node_name == "ours-first"
    assert args.kubelet_registrar_directory_path == "/var/lib/kubelet/plugins_registry"
    assert args.kubelet_plugins_directory_path == "/var/lib/kubelet/plugins"
    assert (args.driver_name, args.nvml, args.container_driver_root) == (
        "gpu.nvidia.com",
        "system",
        "/driver-root",
    )
