"""``gpu-dra controller`` as a process: SIGHUP rediscovers, SIGTERM leaves the slices."""

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from driver.nvml.faults import write_state_file
from sandbox.apiserver import LocalApiServer
from tests.test_controller import PoolWatch, pool

__all__ = ["pool"]  # the fixture, shared with the in-process tests

NODE = "node-1"
TIMEOUT = 20.0


def devices(apiserver: LocalApiServer) -> list[str]:
    return sorted(
        d["name"] for s in apiserver.objects("resourceslices") for d in s["spec"]["devices"]
    )


@pytest.fixture
async def command(
    apiserver: LocalApiServer, tmp_path: Path
) -> AsyncIterator[Callable[[], "asyncio.Future[asyncio.subprocess.Process]"]]:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    state = tmp_path / "state.yaml"
    write_state_file(state, {})
    procs: list[asyncio.subprocess.Process] = []

    def start() -> "asyncio.Future[asyncio.subprocess.Process]":
        async def spawn() -> asyncio.subprocess.Process:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cli",
                "controller",
                "--kubeconfig",
                str(kubeconfig),
                "--node-name",
                NODE,
                "--nvml",
                "simulated",
                "--profile",
                "p5.48xlarge",
                "--sim-state",
                str(state),
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "POD_NAMESPACE": "default"},
            )
            procs.append(proc)
            return proc

        return asyncio.ensure_future(spawn())

    try:
        yield start
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_sighup_rediscovers_and_sigterm_leaves_slices(
    apiserver: LocalApiServer,
    command: Callable[..., "asyncio.Future[asyncio.subprocess.Process]"],
    tmp_path: Path,
    pool: PoolWatch,
) -> None:
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    proc = await command()
    await pool.until(lambda: len(devices(apiserver)) == 8, "published")

    write_state_file(tmp_path / "state.yaml", {"removedGpus": [2]})
    proc.send_signal(signal.SIGHUP)
    await pool.until(lambda: "gpu-2" not in devices(apiserver), "rediscovered on SIGHUP")

    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 0
    assert len(devices(apiserver)) == 7  # left in place for the kubelet to deal with
    assert apiserver.objects("leases") == []  # a lone instance never needed one


async def test_server_without_resource_v1_exits_with_one_line(
    apiserver: LocalApiServer, command: Callable[..., "asyncio.Future[asyncio.subprocess.Process]"]
) -> None:
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    apiserver.faults.serve_resource_v1 = False
    proc = await command()
    assert await asyncio.wait_for(proc.wait(), TIMEOUT) == 1
    assert proc.stderr is not None
    lines = (await proc.stderr.read()).decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "gpu-dra controller: the API server does not serve resource.k8s.io/v1"
    )
