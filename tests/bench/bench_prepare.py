"""Prepare + unprepare through the real plugin process, against a floor measured in this run.

Measured: p50 / p99 of one NodePrepareResources plus one NodeUnprepareResources
(1-GPU and 8-GPU claims, claim fetched from the local API server each time), of
NodePrepareResources alone (what the Go reference below reports), the throughput
of 8 concurrent claims on distinct GPUs, and the plugin's peak RSS. The local API
server runs in a process of its own, as a real one does.

The floor is what no implementation can avoid on this machine: two empty unary
gRPC calls to the plugin over its unix socket plus the writes the operation must
do, as the plugin does them (see kubeletplugin/records.py; the node has a boot ID,
so nothing is fsynced): prepare reserves the device (a symlink) and writes the CDI
spec (temp file, rename); unprepare removes both (prepare alone: 1 RPC, a symlink,
one atomic write). The floor has no claim fetch. Its throughput floor runs that
sequence on 8 concurrent workers, each on its own. Ratios are measured / floor
(latency: lower is better; throughput: higher is better). Release 0.1.0 made 4
atomic writes with 5 fsyncs per prepare + unprepare; the last line prints that
sequence's cost on this machine, for scale.

Then the Go reference, in the same run, against the same API server, with the same
client: a minimal plugin on upstream's ``k8s.io/dynamic-resource-allocation/
kubeletplugin`` helper (tests/bench/goref/: the helper fetches the claim and, by its
default, serializes calls; the plugin writes one CDI spec and one checkpoint per
claim, each fsynced, and once more without fsyncs; client-go's rate limit off, JSON
on the wire), built by tests/bench/goref.py. The plugins run side by side and
take turns round by round; each figure is printed as ours / Go's, with the idle RSS
beside the import floor of the daemon's runtime dependencies measured in this run, and
the CPU time each plugin process spends per prepare+unprepare (its share of the cores
it competes for with the API server and the kubelet).

Last, the stack floor (tests/bench/stackfloor.py): a Python plugin that does only the
GET and the two writes, on grpc.aio with aiohttp (our stack) and on grpc's thread-pool
server with http.client, in the same rounds. Ours / stack floor is what our own code
costs; stack floor / Go is what the stack costs before any code of ours runs.
"""

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from api.gen import dra_v1_pb2, dra_v1_pb2_grpc
from kubeletplugin.state import ClaimRef
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, PluginProcess, api_client, create_claim, create_node

_ROOT = Path(__file__).resolve().parents[2]
NODE = "bench-node"
ROUNDS_1 = int(os.environ.get("BENCH_ROUNDS", "300"))
THROUGHPUT_ROUNDS = ROUNDS_1 // 6
CONCURRENCY = 8


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _atomic_write(
    directory: Path, payload: bytes, *, fsync_dir: bool, fsync: bool = True, name: str = ""
) -> None:
    tmp = directory / f".bench-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, payload)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    target = directory / f".bench-target{name}"
    tmp.rename(target)
    if fsync_dir:
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


@contextlib.contextmanager
def _apiserver(kubeconfig: Path) -> Iterator[str]:
    """The local API server in a process of its own, as a real one is: in this
    process it would share a GIL with the kubelet simulator and the floor loop."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox.apiserver", "--kubeconfig-out", str(kubeconfig)],
        stdout=subprocess.PIPE,
        cwd=_ROOT,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode().strip()  # it prints its URL once it serves
        if not url:
            raise RuntimeError(f"the local API server exited ({proc.wait()})")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# Every runtime dependency the daemon imports (pyproject's, less cel-python and the schema
# libraries, which only the offline tools use), imported and nothing run.
_IMPORT_FLOOR = (
    "import grpc, grpc_health.v1.health_pb2, google.protobuf, aiohttp, pynvml, yaml, pydantic\n"
    "import prometheus_client, kubernetes.aio.client, kubernetes.aio.config\n"
    "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS')][0])"
)


def _cpu_s(pid: int) -> float:
    """User plus system time of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("VmRSS not found")


async def _figures(
    plugins: dict[str, tuple[KubeletSim, int]], one: ClaimRef, singles: list[ClaimRef]
) -> dict[str, dict[str, float]]:
    """Per plugin, the figures compared with the Go plugin: prepare p50/p99, unprepare
    p50, claims/s of 8 concurrent claims on distinct GPUs, the CPU time the plugin
    process spent (all its threads) per prepare+unprepare over all those rounds, idle
    RSS (MiB). The plugins take turns round by round, so that load from elsewhere on
    the machine hits all alike. On a machine with few cores the CPU figure is the one
    that tells: the plugin shares the cores with the API server and the kubelet."""
    for kubelet, _ in plugins.values():
        for _ in range(20):
            await kubelet.prepare([one])
            await kubelet.unprepare([one])
    cpu_start = {name: _cpu_s(pid) for name, (_, pid) in plugins.items()}
    prep: dict[str, list[float]] = {name: [] for name in plugins}
    unprep: dict[str, list[float]] = {name: [] for name in plugins}

    async def timed(call: Awaitable[object]) -> float:
        start = time.perf_counter()
        await call
        return time.perf_counter() - start

    for _ in range(ROUNDS_1):
        for name, (kubelet, _) in plugins.items():
            prep[name].append(await timed(kubelet.prepare([one])))
            unprep[name].append(await timed(kubelet.unprepare([one])))

    async def burst(kubelet: KubeletSim) -> None:
        async def cycle(claim: ClaimRef) -> None:
            assert not (await kubelet.prepare([claim])).claims[claim.uid].error
            await kubelet.unprepare([claim])

        await asyncio.gather(*(cycle(c) for c in singles))

    elapsed = dict.fromkeys(plugins, 0.0)
    for _ in range(THROUGHPUT_ROUNDS):
        for name, (kubelet, _) in plugins.items():
            elapsed[name] += await timed(burst(kubelet))
    cycles = ROUNDS_1 + THROUGHPUT_ROUNDS * CONCURRENCY
    cpu = {name: (_cpu_s(pid) - cpu_start[name]) / cycles for name, (_, pid) in plugins.items()}
    await asyncio.sleep(1.0)  # idle: let the allocators settle before reading RSS
    return {
        name: {
            "prepare p50 ms": _pct(prep[name], 0.5) * 1e3,
            "prepare p99 ms": _pct(prep[name], 0.99) * 1e3,
            "unprepare p50 ms": _pct(unprep[name], 0.5) * 1e3,
            "8 concurrent claims/s": CONCURRENCY * THROUGHPUT_ROUNDS / elapsed[name],
            "CPU ms per prepare+unprepare": cpu[name] * 1e3,
            "idle RSS MiB": _rss_kib(pid) / 1024,
        }
        for name, (_, pid) in plugins.items()
    }


@contextlib.asynccontextmanager
async def _go_plugin(
    binary: Path, root: Path, kubeconfig: Path, *, fsync: bool
) -> AsyncIterator[tuple[KubeletSim, int]]:
    base = root / ("go-fsync" if fsync else "go-nofsync")
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--node-name={NODE}",
            f"--cdi-root={base / 'cdi'}",
            f"--plugin-dir={base / 'plugins' / 'gpu.nvidia.com'}",
            f"--registrar-dir={base / 'registry'}",
            f"--fsync={'true' if fsync else 'false'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if line.strip() != b"ready":
            raise RuntimeError(f"the Go reference plugin did not start ({proc.wait()})")
        socket = base / "registry" / "gpu.nvidia.com-reg.sock"
        async with await KubeletSim.register(socket) as kubelet:
            yield kubelet, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.asynccontextmanager
async def _stack_floor(flavor: str, root: Path, url: str) -> AsyncIterator[tuple[KubeletSim, int]]:
    base = root / f"stack-{flavor}"
    base.mkdir()
    socket = base / "dra.sock"
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "tests.bench.stackfloor", flavor, str(socket), str(base), url],
        stdout=subprocess.PIPE,
        cwd=_ROOT,
    )
    try:
        assert proc.stdout is not None
        if (await asyncio.to_thread(proc.stdout.readline)).strip() != b"ready":
            raise RuntimeError(f"the {flavor} stack floor did not start ({proc.wait()})")
        async with await KubeletSim.register(socket) as kubelet:
            yield kubelet, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _compare(
    ours: dict[str, float],
    go: dict[str, float],
    label: str,
    names: tuple[str, str] = ("ours", "Go"),
) -> None:
    print(f"{names[0]} vs {names[1]} ({label}):")
    for key, value in ours.items():
        better = "higher is better" if key.endswith("/s") else "lower is better"
        print(
            f"  {key}: {names[0]} {value:.2f}, {names[1]} {go[key]:.2f}, "
            f"ratio {value / go[key]:.2f} ({better})"
        )


def _line(label: str, samples: list[float], floor: list[float]) -> str:
    p50, p99 = _pct(samples, 0.5) * 1e3, _pct(samples, 0.99) * 1e3
    f50, f99 = _pct(floor, 0.5) * 1e3, _pct(floor, 0.99) * 1e3
    return (
        f"{label}: p50 {p50:.2f} ms ({p50 / f50:.2f}x floor), "
        f"p99 {p99:.2f} ms ({p99 / f99:.2f}x floor), "
        f"mean {statistics.fmean(samples) * 1e3:.2f} ms"
    )


async def _bench(
    root: Path, kubeconfig: Path, url: str, goref: Path | None, floor_kib: int
) -> None:
    dirs = NodeDirs(root)
    api = await api_client(kubeconfig)
    await create_node(api, NODE)
    one = await create_claim(api, "one-gpu", node=NODE, devices=["gpu-0"])
    eight = await create_claim(api, "eight-gpu", node=NODE, devices=[f"gpu-{i}" for i in range(8)])
    singles = [
        await create_claim(api, f"single-{i}", node=NODE, devices=[f"gpu-{i}"])
        for i in range(CONCURRENCY)
    ]
    # Metrics served, as the chart runs the daemon by default.
    plugin = PluginProcess(
        dirs,
        kubeconfig=kubeconfig,
        node_name=NODE,
        profile="p5.48xlarge",
        extra_args=("--metrics-port=0",),
    )
    payload = b"x" * 2048
    try:
        await plugin.wait_ready()
        async with (
            await KubeletSim.register(plugin.paths.registration) as kubelet,
            grpc.aio.insecure_channel(f"unix://{plugin.paths.dra}") as channel,
        ):
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)

            async def prepare(claims: list[ClaimRef]) -> None:
                prepared = await kubelet.prepare(claims)
                assert all(not r.error for r in prepared.claims.values()), prepared

            async def cycle(claims: list[ClaimRef]) -> None:
                await prepare(claims)
                await kubelet.unprepare(claims)

            async def empty_rpc() -> None:
                await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest())

            async def write(directory: Path, *, fsync_dir: bool = False) -> None:
                await asyncio.to_thread(_atomic_write, directory, payload, fsync_dir=fsync_dir)

            async def durable_write() -> None:
                await write(dirs.plugin_data, fsync_dir=True)

            async def floor_prepare(worker: int = 0) -> None:
                await empty_rpc()
                # The device's reservation, then the spec.
                (dirs.plugin_data / f".bench-reservation{worker}").symlink_to("claim")
                _atomic_write(dirs.cdi, payload, fsync_dir=False, fsync=False, name=str(worker))

            def floor_unprepare(worker: int = 0) -> None:
                (dirs.cdi / f".bench-target{worker}").unlink()
                (dirs.plugin_data / f".bench-reservation{worker}").unlink()

            async def floor_cycle(worker: int = 0) -> None:
                await floor_prepare(worker)
                await empty_rpc()
                floor_unprepare(worker)

            async def release_0_1_0_writes() -> None:
                await durable_write()  # PrepareStarted
                await write(dirs.cdi)  # the CDI spec
                await write(dirs.plugin_data)  # PrepareCompleted
                await write(dirs.plugin_data)  # the unprepare's checkpoint write

            async def plugin_burst() -> None:
                await asyncio.gather(*(cycle([c]) for c in singles))

            async def floor_burst() -> None:
                await asyncio.gather(*(floor_cycle(i) for i in range(CONCURRENCY)))

            for _ in range(20):  # warm-up: connections, caches, lazy imports
                await cycle([one])
                await floor_cycle()
            # Interleaved, so that load from elsewhere on the machine hits both alike.
            floor: list[float] = []
            floor_prep: list[float] = []
            lat1: list[float] = []
            prep1: list[float] = []
            lat8: list[float] = []
            for i in range(ROUNDS_1):
                floor += await _timed(floor_cycle, 1)
                lat1 += await _timed(lambda: cycle([one]), 1)
                floor_prep += await _timed(floor_prepare, 1)
                prep1 += await _timed(lambda: prepare([one]), 1)
                await kubelet.unprepare([one])
                floor_unprepare()
                if i % 2 == 0:
                    lat8 += await _timed(lambda: cycle([eight]), 1)
            plugin_time = floor_time = 0.0
            for _ in range(THROUGHPUT_ROUNDS):
                floor_time += sum(await _timed(floor_burst, 1))
                plugin_time += sum(await _timed(plugin_burst, 1))
            cpu_before = _cpu_s(plugin.pid)
            rpc = await _timed(empty_rpc, 400)  # 400: CPU time is counted in 10 ms ticks
            rpc_cpu = (_cpu_s(plugin.pid) - cpu_before) / len(rpc)
            writes = await _timed(durable_write, 100)
            atomic = await _timed(lambda: write(dirs.plugin_data), 100)
            old_writes = await _timed(release_0_1_0_writes, 100)
            async with contextlib.AsyncExitStack() as stack:
                plugins = {"ours": (kubelet, plugin.pid)}
                if goref is not None:
                    for name, fsync in (("go", True), ("go-nofsync", False)):
                        go_plugin = _go_plugin(goref, root, kubeconfig, fsync=fsync)
                        plugins[name] = await stack.enter_async_context(go_plugin)
                for flavor in ("aio", "sync"):
                    floor_plugin = _stack_floor(flavor, root, url)
                    plugins[f"stack-{flavor}"] = await stack.enter_async_context(floor_plugin)
                figures = await _figures(plugins, one, singles)
        throughput = CONCURRENCY * THROUGHPUT_ROUNDS / plugin_time
        floor_throughput = CONCURRENCY * THROUGHPUT_ROUNDS / floor_time
        rss_mib = plugin.vm_hwm_kib() / 1024
        assert await plugin.terminate() == 0
    finally:
        plugin.kill()
        await api.close()

    print(
        f"floor parts: empty unary RPC p50 {_pct(rpc, 0.5) * 1e3:.2f} ms "
        f"(the plugin's CPU per call {rpc_cpu * 1e3:.2f} ms), "
        f"atomic write p50 {_pct(atomic, 0.5) * 1e3:.2f} ms, "
        f"+ directory fsync p50 {_pct(writes, 0.5) * 1e3:.2f} ms"
    )
    for label, samples in (
        ("floor of prepare+unprepare (2 empty RPCs, symlink, atomic write, 2 unlinks)", floor),
        ("floor of prepare (1 empty RPC, symlink, atomic write, no fsync)", floor_prep),
    ):
        print(
            f"{label}: p50 {_pct(samples, 0.5) * 1e3:.2f} ms, "
            f"p99 {_pct(samples, 0.99) * 1e3:.2f} ms"
        )
    print(_line("prepare+unprepare 1-GPU claim", lat1, floor))
    print(_line("prepare+unprepare 8-GPU claim", lat8, floor))
    print(_line("prepare alone, 1-GPU claim", prep1, floor_prep))
    print(
        f"throughput, {CONCURRENCY} concurrent claims on distinct GPUs: {throughput:.0f} claims/s "
        f"({throughput / floor_throughput:.2f} of the floor's {floor_throughput:.0f}/s)"
    )
    print(f"plugin peak RSS: {rss_mib:.1f} MiB")
    print(
        "release 0.1.0's writes alone (4 atomic writes, 5 fsyncs, per prepare+unprepare): "
        f"p50 {_pct(old_writes, 0.5) * 1e3:.2f} ms, p99 {_pct(old_writes, 0.99) * 1e3:.2f} ms"
    )
    ours = figures["ours"]
    print(
        f"idle RSS: ours {ours['idle RSS MiB']:.1f} MiB, import floor of the daemon's runtime "
        f"dependencies {floor_kib / 1024:.1f} MiB, "
        f"{ours['idle RSS MiB'] - floor_kib / 1024:+.1f} MiB above it"
    )
    if "go" in figures:
        _compare(
            ours, figures["go"], "Go fsyncs its spec and checkpoint; ours needs none (boot ID)"
        )
        _compare(ours, figures["go-nofsync"], "fsyncs off on both sides")
    # What the stack alone costs: a plugin doing only the GET and the two writes.
    label = "the same GET and writes, nothing else"
    for flavor in ("aio", "sync"):
        _compare(ours, figures[f"stack-{flavor}"], label, ("ours", f"the {flavor} stack floor"))
        if "go" in figures:
            least = figures[f"stack-{flavor}"]
            _compare(least, figures["go"], "Go fsyncs", (f"the {flavor} stack floor", "Go"))


def main() -> int:
    from tests.bench.goref import build_goref

    goref: Path | None = None
    try:
        goref = build_goref()
    except (SystemExit, OSError) as exc:  # no Go toolchain, no module proxy
        print(f"Go reference skipped: {str(exc)[-400:]}")
    floor = subprocess.run(
        [sys.executable, "-c", _IMPORT_FLOOR], capture_output=True, text=True, check=True
    )
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="drab") as name:
        root = Path(name)
        kubeconfig = root / "kubeconfig"
        with _apiserver(kubeconfig) as url:
            asyncio.run(_bench(root, kubeconfig, url, goref, int(floor.stdout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
