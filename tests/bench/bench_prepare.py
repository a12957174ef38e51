"""Prepare + unprepare through the real plugin process, against a floor measured in this run.

Measured: p50 / p99 of one NodePrepareResources plus one NodeUnprepareResources
(1-GPU and 8-GPU claims, claim fetched from the local API server each time),
the throughput of 8 concurrent claims on distinct GPUs, and the plugin's peak RSS.

The floor is what no implementation can avoid on this machine: two empty unary
gRPC calls to the plugin over its unix socket plus the durable writes the
operation needs, each a write + fsync + rename + directory fsync in the plugin's
directory (PrepareStarted, the CDI spec, PrepareCompleted; the unprepare's
checkpoint write). Its throughput floor runs that sequence on 8 concurrent
workers. Ratios are measured / floor (latency: lower is better; throughput:
higher is better).

Reference (a minimal Go driver on upstream's kubeletplugin helper, same kind of
machine): p50 1.8 ms, p99 3-5 ms, ~400 claims/s with 8 concurrent claims, 34 MB RSS.
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from api.gen import dra_v1_pb2, dra_v1_pb2_grpc
from kubeletplugin.kubeletsim import KubeletSim
from kubeletplugin.state import ClaimRef
from tests.pluginharness import (
    NodeDirs,
    PluginProcess,
    api_client,
    create_claim,
    create_node,
)

if TYPE_CHECKING:
    from driver.apiserver import ThreadedApiServer

NODE = "bench-node"
ROUNDS_1 = int(os.environ.get("BENCH_ROUNDS", "300"))
ROUNDS_8 = ROUNDS_1 // 2
THROUGHPUT_ROUNDS = ROUNDS_1 // 6
DURABLE_WRITES = 4  # per prepare + unprepare, see the module docstring
CONCURRENCY = 8


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _durable_write(directory: Path, payload: bytes) -> None:
    tmp = directory / f".bench-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    target = directory / ".bench-target"
    tmp.rename(target)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


async def _timed(call: Callable[[], Awaitable[object]], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def _bench(server: "ThreadedApiServer", root: Path) -> None:
    dirs = NodeDirs(root)
    kubeconfig = root / "kubeconfig"
    server.write_kubeconfig(kubeconfig)
    api = await api_client(kubeconfig)
    await create_node(api, NODE)
    one = await create_claim(api, "one-gpu", node=NODE, devices=["gpu-0"])
    eight = await create_claim(api, "eight-gpu", node=NODE, devices=[f"gpu-{i}" for i in range(8)])
    singles = [
        await create_claim(api, f"single-{i}", node=NODE, devices=[f"gpu-{i}"])
        for i in range(CONCURRENCY)
    ]
    plugin = PluginProcess(dirs, kubeconfig=kubeconfig, node_name=NODE, profile="p5.48xlarge")
    payload = b"x" * 2048
    try:
        await plugin.wait_ready()
        async with (
            await KubeletSim.register(plugin.paths.registration) as kubelet,
            grpc.aio.insecure_channel(f"unix://{plugin.paths.dra}") as channel,
        ):
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)

            async def cycle(claims: list[ClaimRef]) -> None:
                prepared = await kubelet.prepare(claims)
                assert all(not r.error for r in prepared.claims.values()), prepared
                await kubelet.unprepare(claims)

            async def empty_rpc() -> None:
                await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest())

            async def durable_write() -> None:
                await asyncio.to_thread(_durable_write, dirs.plugin_data, payload)

            async def floor_cycle() -> None:
                await empty_rpc()
                for _ in range(DURABLE_WRITES - 1):
                    await durable_write()
                await empty_rpc()
                await durable_write()

            async def plugin_burst() -> None:
                await asyncio.gather(*(cycle([c]) for c in singles))

            async def floor_burst() -> None:
                await asyncio.gather(*(floor_cycle() for _ in range(CONCURRENCY)))

            for _ in range(20):  # warm-up: connections, caches, lazy imports
                await cycle([one])
                await floor_cycle()
            # Interleaved, so that load from elsewhere on the machine hits both alike.
            floor: list[float] = []
            lat1: list[float] = []
            lat8: list[float] = []
            for i in range(ROUNDS_1):
                floor += await _timed(floor_cycle, 1)
                lat1 += await _timed(lambda: cycle([one]), 1)
                if i % 2 == 0:
                    lat8 += await _timed(lambda: cycle([eight]), 1)
            plugin_time = floor_time = 0.0
            for _ in range(THROUGHPUT_ROUNDS):
                floor_time += sum(await _timed(floor_burst, 1))
                plugin_time += sum(await _timed(plugin_burst, 1))
            rpc = await _timed(empty_rpc, 100)
            writes = await _timed(durable_write, 100)
        throughput = CONCURRENCY * THROUGHPUT_ROUNDS / plugin_time
        floor_throughput = CONCURRENCY * THROUGHPUT_ROUNDS / floor_time
        rss_mib = plugin.vm_hwm_kib() / 1024
        assert await plugin.terminate() == 0
    finally:
        plugin.kill()
        await api.close()

    print(
        f"floor parts: empty unary RPC p50 {_pct(rpc, 0.5) * 1e3:.2f} ms, "
        f"durable write p50 {_pct(writes, 0.5) * 1e3:.2f} ms"
    )
    f50, f99 = _pct(floor, 0.5) * 1e3, _pct(floor, 0.99) * 1e3
    print(
        f"floor (2 empty RPCs + {DURABLE_WRITES} durable writes): "
        f"p50 {f50:.2f} ms, p99 {f99:.2f} ms"
    )
    for label, samples in (("1-GPU claim", lat1), ("8-GPU claim", lat8)):
        p50, p99 = _pct(samples, 0.5) * 1e3, _pct(samples, 0.99) * 1e3
        print(
            f"prepare+unprepare {label}: p50 {p50:.2f} ms ({p50 / f50:.2f}x floor), "
            f"p99 {p99:.2f} ms ({p99 / f99:.2f}x floor), "
            f"mean {statistics.fmean(samples) * 1e3:.2f} ms"
        )
    print(
        f"throughput, {CONCURRENCY} concurrent claims on distinct GPUs: {throughput:.0f} claims/s "
        f"({throughput / floor_throughput:.2f} of the floor's {floor_throughput:.0f}/s)"
    )
    print(f"plugin peak RSS: {rss_mib:.1f} MiB")
    print("reference (Go, upstream helper): p50 1.8 ms, p99 3-5 ms, ~400 claims/s, 34 MB RSS")


def main() -> int:
    from driver.apiserver import ThreadedApiServer

    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="drab") as name,
        ThreadedApiServer() as server,
    ):
        asyncio.run(_bench(server, Path(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
