"""Run ``gpu-dra kubelet-plugin`` as a real subprocess, for process tests and the bench.

Waits are conditions with deadlines (a socket answers, health says SERVING, a
log line appears, the process exits), never fixed sleeps.
"""

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from driver.kube import client as kubeclient
from kubeletplugin.sockets import SocketPaths, socket_paths
from kubeletplugin.state import ClaimRef

if TYPE_CHECKING:
    from drivers.gpu.node import NodeConfig

DRIVER = "gpu.nvidia.com"
_POLL = 0.02
# The crashpoints of a prepare with side effects, then of its unprepare, in order.
PREPARE_STEPS = ["after-claim-record", "after-side-effects", "after-cdi-write"]
UNPREPARE_STEPS = ["after-spec-removed", "after-side-effects-undone"]


async def health_status(port: int) -> int:
    """What the plugin's grpc.health.v1 service on ``port`` answers (SERVING, NOT_SERVING)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return int(response.status)


def logged_health_port(records: Sequence[logging.LogRecord]) -> int:
    """The port an in-process node's health service last logged it listens on."""
    ports = [getattr(r, "port", 0) for r in records if r.getMessage() == "health service listening"]
    return int(ports[-1])


@dataclass(frozen=True)
class NodeDirs:
    """The host directories of one simulated node; keep ``root`` short (socket paths)."""

    root: Path

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    @property
    def plugins(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def plugin_data(self) -> Path:
        return self.plugins / DRIVER

    def node_config(
        self, kubeconfig: Path, *, node_name: str, profile: str, **overrides: Any
    ) -> "NodeConfig":
        """The in-process plugin's configuration on these directories, simulated NVML of
        ``profile``, retrying fast; ``overrides`` are further NodeConfig fields."""
        from drivers.gpu.node import NodeConfig

        return NodeConfig(
            node_name=node_name,
            kubeconfig=kubeconfig,
            registrar_dir=self.registry,
            plugins_dir=self.plugins,
            cdi_root=self.cdi,
            container_driver_root=self.root / "driver-root",
            nvml="simulated",
            profile=profile,
            healthcheck_port=0,
            retry_period=0.2,
            **overrides,
        )

    def paths(self, pod_uid: str | None = None) -> SocketPaths:
        return socket_paths(
            registrar_dir=self.registry,
            plugins_dir=self.plugins,
            driver_name=DRIVER,
            pod_uid=pod_uid,
        )


async def wait_for(condition: Callable[[], bool], what: str, wait_s: float = 30.0) -> None:
    deadline = time.monotonic() + wait_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {wait_s:g}s waiting for {what}")
        await asyncio.sleep(_POLL)


# Variables that would name another node or pod to the plugin under test.
_NODE_ENV = ("NODE_NAME", "POD_UID", "GPU_DRA_NODE_NAME", "GPU_DRA_POD_UID")


class PluginProcess:
    def __init__(
        self,
        dirs: NodeDirs,
        *,
        kubeconfig: Path,
        node_name: str,
        profile: str = "p5.48xlarge",
        pod_uid: str | None = None,
        crashpoint: str | None = None,
        extra_env: dict[str, str] | None = None,
        umask: int = -1,  # -1: the test process's
        driver_root: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """Simulated NVML of ``profile``; with ``driver_root``, ``--nvml system`` over it."""
        self.dirs = dirs
        self.paths = dirs.paths(pod_uid)
        self.log_path = dirs.root / f"plugin-{pod_uid or 'main'}-{time.monotonic_ns()}.log"
        args = [
            sys.executable,
            "-m",
            "cli",
            "kubelet-plugin",
            f"--node-name={node_name}",
            f"--kubeconfig={kubeconfig}",
            f"--kubelet-registrar-directory-path={dirs.registry}",
            f"--kubelet-plugins-directory-path={dirs.plugins}",
            f"--cdi-root={dirs.cdi}",
            "--healthcheck-port=0",
        ]
        if driver_root is None:
            args += [
                f"--container-driver-root={dirs.root / 'driver-root'}",
                "--nvml=simulated",
                f"--profile={profile}",
            ]
        else:  # one machine: the host sees the driver root where this process does
            args += [
                "--nvml=system",
                f"--container-driver-root={driver_root}",
                f"--nvidia-driver-root={driver_root}",
            ]
        if pod_uid:
            args.append(f"--pod-uid={pod_uid}")
        args += extra_args
        env = {k: v for k, v in os.environ.items() if k not in _NODE_ENV}
        env.pop("GPU_DRA_CRASHPOINT", None)
        if crashpoint:
            env["GPU_DRA_CRASHPOINT"] = crashpoint
        env.update(extra_env or {})
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, umask=umask
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _alive(self, what: str) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"plugin exited ({self.proc.returncode}) before {what}:\n{self.log()}"
            )
        return True

    async def wait_log(self, pattern: str, wait_s: float = 30.0) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            match = re.search(pattern, self.log())
            if match:
                found.append(match)
            return bool(match) or not self._alive(f"log {pattern!r}")

        await wait_for(seen, f"log line {pattern!r}", wait_s)
        return found[0]

    async def health_port(self) -> int:
        return int((await self.wait_log(r"health service listening\"? port=(\d+)")).group(1))

    async def health(self) -> int:
        return await health_status(await self.health_port())

    async def wait_ready(self, wait_s: float = 30.0) -> None:
        await self.wait_log("kubelet plugin ready", wait_s)
        await wait_for(self.paths.registration.is_socket, "registration socket", wait_s)
        assert await self.health() == health_pb2.HealthCheckResponse.SERVING, self.log()

    async def wait_exit(self, wait_s: float = 30.0) -> int:
        await wait_for(lambda: self.proc.poll() is not None, "plugin exit", wait_s)
        return self.proc.returncode

    def vm_hwm_kib(self) -> int:
        """Peak resident set size of the live process."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise RuntimeError("VmHWM not found")

    async def terminate(self, wait_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait_exit(wait_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def api_client(kubeconfig: Path) -> Any:
    """A ``kubernetes.aio`` client for the local API server; the caller closes it."""
    return await kubeclient.api_client(kubeconfig, component="test")


async def create_node(api: Any, name: str, *, capacity: dict[str, str] | None = None) -> None:
    from kubernetes.aio import client

    core: Any = client.CoreV1Api(api)  # bodies go as plain dicts
    await core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    if capacity:
        node = await core.read_node(name)
        body = api.sanitize_for_serialization(node)
        body["status"] = {"capacity": capacity, "allocatable": capacity}
        await core.replace_node_status(name, body)


async def create_claim(
    api: Any,
    name: str,
    *,
    node: str,
    devices: Sequence[str],
    namespace: str = "default",
    driver: str = DRIVER,
    config: Sequence[dict[str, Any]] = (),
    results: Sequence[dict[str, Any]] | None = None,
) -> ClaimRef:
    """A ResourceClaim allocated as the scheduler writes it: ``devices`` of ``node``'s pool,
    with the opaque ``config`` entries of its allocation; ``results`` replaces the results
    (shares of a device, with their shareID and consumedCapacity)."""
    from kubernetes.aio import client

    resource: Any = client.ResourceV1Api(api)  # bodies go as plain dicts
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": driver, "count": len(devices)},
                    }
                ]
            }
        },
    }
    created = await resource.create_namespaced_resource_claim(namespace, body)
    claim = api.sanitize_for_serialization(created)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": list(results)
                if results is not None
                else [
                    {"request": "gpu", "driver": driver, "pool": node, "device": device}
                    for device in devices
                ],
                **({"config": list(config)} if config else {}),
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    await resource.replace_namespaced_resource_claim_status(name, namespace, claim)
    return ClaimRef(uid=claim["metadata"]["uid"], namespace=namespace, name=name)


async def die_at(
    doomed: PluginProcess, step: str, claim: ClaimRef, *, in_unprepare: bool | None = None
) -> None:
    """Drive ``claim`` through ``doomed`` (started with crashpoint ``step``) until the plugin
    kills itself there: a prepare, then an unprepare when ``step`` is one of unprepare's
    (``in_unprepare`` says so for a step of a kind's own)."""
    import pytest

    from sandbox.kubeletsim import KubeletSim

    await doomed.wait_ready()
    async with await KubeletSim.register(doomed.paths.registration) as kubelet:
        if step in UNPREPARE_STEPS if in_unprepare is None else in_unprepare:
            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
            with pytest.raises(grpc.aio.AioRpcError):  # the socket dies with the plugin
                await kubelet.unprepare([claim])
        else:
            with pytest.raises(grpc.aio.AioRpcError):
                await kubelet.prepare([claim])
    assert await doomed.wait_exit() == -signal.SIGKILL
