"""The node process's memory serving the GPU driver alone and serving both drivers.

Two ``gpu-dra kubelet-plugin`` processes on one simulated GB200 node (p6e-gb200.36xlarge),
one with ``--compute-domains``, take turns round by round against one local API server (in
this process). Each is measured idle once ready (VmRSS, after the plugin hands freed heap
back), and again after one ComputeDomain channel and daemon claim prepared and unprepared
(the second driver's code paths loaded). Printed: MiB each, and both / one, whose floor is
1.0 (a second driver that costs nothing).
"""

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from drivers.computedomain import names
from sandbox.apiserver import LocalApiServer
from sandbox.kubeletsim import KubeletSim
from tests import cdnode
from tests.pluginharness import NodeDirs, PluginProcess, api_client

ROUNDS = 3


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found")


async def _one(apiserver: LocalApiServer, both: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="drm") as name:
        dirs = NodeDirs(Path(name))
        kubeconfig = dirs.root / "kubeconfig"
        apiserver.write_kubeconfig(kubeconfig)
        api = await api_client(kubeconfig)
        try:
            if both:
                plugin = cdnode.start(dirs, kubeconfig)
            else:
                plugin = PluginProcess(
                    dirs, kubeconfig=kubeconfig, node_name=cdnode.NODE, profile=cdnode.PROFILE
                )
            try:
                await plugin.wait_ready(120)
                await asyncio.sleep(1.0)  # idle: let the allocators settle before reading
                idle = _rss_mib(plugin.pid)
                if both:
                    channel = await cdnode.channel_claim(api, f"w{plugin.pid}")
                    daemon = await cdnode.daemon_claim(api, f"d{plugin.pid}")
                    registration = cdnode.cd_paths(dirs).registration
                    async with await KubeletSim.register(registration) as kubelet:
                        for claim in (channel, daemon):
                            assert (await kubelet.prepare([claim])).claims[claim.uid].error == ""
                            assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
                    await asyncio.sleep(1.0)
                used = _rss_mib(plugin.pid)
            finally:
                await plugin.terminate()
        finally:
            await api.close()
        return idle, used


async def _bench() -> None:
    apiserver = LocalApiServer()
    await apiserver.start()
    try:
        cdnode.seed(apiserver)
        cdnode.ready(apiserver)
        one: list[tuple[float, float]] = []
        both: list[tuple[float, float]] = []
        for _ in range(ROUNDS):
            one.append(await _one(apiserver, both=False))
            both.append(await _one(apiserver, both=True))
    finally:
        await apiserver.stop()
    one_idle = statistics.median(r[0] for r in one)
    both_idle = statistics.median(r[0] for r in both)
    both_used = statistics.median(r[1] for r in both)
    print(f"node process RSS, median of {ROUNDS} rounds (p6e-gb200.36xlarge simulated):")
    print(f"  GPU driver alone, idle: {one_idle:.1f} MiB")
    print(
        f"  GPU + {names.DRIVER_NAME}, idle: {both_idle:.1f} MiB "
        f"({both_idle / one_idle:.3f} of one; floor 1.0)"
    )
    print(
        f"  GPU + {names.DRIVER_NAME}, after a channel and a daemon claim: {both_used:.1f} MiB "
        f"({both_used / one_idle:.3f} of one)"
    )


def main() -> int:
    asyncio.run(_bench())
    return 0


if __name__ == "__main__":
    sys.exit(main())
