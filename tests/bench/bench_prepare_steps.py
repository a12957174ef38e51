"""Where our prepare's and unprepare's p50 over the aio stack floor's goes, call by call.

Our plugin process and the aio stack floor (tests/bench/stackfloor.py) run side by side
under tests/bench/steptimer.py, which times each named call of a handler
(``steptimer.OURS``, ``steptimer.FLOOR``) with ``perf_counter_ns``. The kubelet
simulator drives both in turns, round by round, one 1-GPU claim at a time, as
bench_prepare does. Printed per RPC: the p50 the kubelet sees for each, the gap, and
the gap by row: the median of each of our calls the floor does not make (a call that
others run within counts its own time only: ``steptimer.OURS_NESTED``), the claim GET and
the writes each side makes (ours minus the floor's), the rest of the handler, and what
lies outside the handler (gRPC and the event loop, from the kubelet's p50 less the
handler's); medians do not add exactly, so the last row says how far their sum is from
the gap. On a loaded machine a row also holds the time the process was not scheduled.
"""

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json

from sandbox.kubeletsim import KubeletSim
from tests.bench.bench_prepare import NODE, _apiserver
from tests.pluginharness import NodeDirs, api_client, create_claim, create_node, wait_for

_ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "300"))
_GET = "GET: "
_WRITE = "write"


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.bench.steptimer", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=_ROOT,
        )


@contextlib.asynccontextmanager
async def _timed_process(
    which: str, module: str, args: list[str], out: Path, registration: Path, ready: str
) -> AsyncIterator[tuple[KubeletSim, subprocess.Popen[bytes]]]:
    log = out.with_suffix(".log")
    proc = await asyncio.to_thread(_start, [str(out), which, module, *args], log)
    try:
        await wait_for(lambda: ready in log.read_text() or proc.poll() is not None, ready)
        if proc.poll() is not None:
            raise RuntimeError(f"{which} exited: {log.read_text()}")
        await wait_for(registration.is_socket, "registration socket")
        async with await KubeletSim.register(registration) as kubelet:
            yield kubelet, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def _collect(proc: subprocess.Popen[bytes], out: Path) -> list[dict[str, Any]]:
    proc.send_signal(signal.SIGUSR1)
    await wait_for(out.exists, f"{out.name}")  # renamed into place once written
    calls: list[dict[str, Any]] = json.loads(await asyncio.to_thread(out.read_text))
    return calls


def _median(values: list[int]) -> float:
    return statistics.median(values) / 1e3 if values else 0.0


def _rows(calls: list[dict[str, Any]], rpc: str) -> tuple[list[int], dict[str, list[int]]]:
    """The handler totals (ns) of ``rpc``, the last ROUNDS, and each step's per call,
    with "own code" (total less the named steps) as one more."""
    mine = [c for c in calls if c["rpc"] == rpc][-ROUNDS:]
    steps: dict[str, list[int]] = {}
    for call in mine:
        named = call["steps"]
        for name, ns in named.items():
            steps.setdefault(name, []).append(ns)
        steps.setdefault("own code", []).append(call["total"] - sum(named.values()))
    return [c["total"] for c in mine], steps


def _group(steps: dict[str, list[int]], prefix: str) -> list[int]:
    """Per call, the sum of the steps whose name starts with ``prefix``."""
    chosen = [v for k, v in steps.items() if k.startswith(prefix)]
    return [sum(parts) for parts in zip(*chosen, strict=True)] if chosen else []


def _report(
    rpc: str,
    ours: list[dict[str, Any]],
    floor: list[dict[str, Any]],
    seen: dict[str, list[float]],
) -> None:
    our_total, our_steps = _rows(ours, rpc)
    floor_total, floor_steps = _rows(floor, rpc)
    if rpc == "NodePrepareResources":
        floor_get = [t - w for t, w in zip(floor_total, _group(floor_steps, "writes"), strict=True)]
        floor_steps = {"GET": floor_get, "writes": floor_steps.get("writes", [])}
        floor_steps["own code"] = [0] * len(floor_get)  # inside floor_get: no way to split
    p50 = {side: statistics.median(samples) * 1e6 for side, samples in seen.items()}
    gap = p50["ours"] - p50["floor"]
    print(
        f"{rpc}: kubelet's p50 ours {p50['ours']:.0f} µs, aio stack floor {p50['floor']:.0f} µs "
        f"({p50['ours'] / p50['floor']:.2f}x), gap {gap:.0f} µs"
    )
    rows: list[tuple[str, float]] = []
    for name, samples in our_steps.items():
        if not name.startswith((_GET, _WRITE)) and name != "own code":
            rows.append((f"ours only: {name}", _median(samples)))
    our_get, our_writes = _group(our_steps, _GET), _group(our_steps, _WRITE)
    if our_get:
        floor_get_us = _median(_group(floor_steps, "GET"))
        rows.append(("claim GET: ours less the floor's", _median(our_get) - floor_get_us))
        for name, samples in our_steps.items():
            if name.startswith(_GET):
                rows.append((f"    of ours: {name[len(_GET) :]}", _median(samples)))
    rows.append(
        (
            "writes: ours less the floor's",
            _median(our_writes) - _median(_group(floor_steps, "writes")),
        )
    )
    rows.append(
        (
            "the rest of the handler: servicer glue, the timers themselves",
            _median(our_steps["own code"]) - _median(floor_steps["own code"]),
        )
    )
    outside_ours = p50["ours"] - _median(our_total)
    outside_floor = p50["floor"] - _median(floor_total)
    rows.append(
        (
            "outside the handler (gRPC, event loop): ours less the floor's",
            outside_ours - outside_floor,
        )
    )
    total = sum(v for name, v in rows if not name.startswith("    "))
    for name, value in rows:
        print(f"  {value:8.0f} µs  {name}")
    print(f"  {gap - total:8.0f} µs  medians do not add: the gap less the rows above")


@contextlib.contextmanager
def _tempdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="dras") as name:
        yield Path(name)


async def _bench(root: Path, kubeconfig: Path, url: str) -> None:
    dirs = NodeDirs(root)
    api = await api_client(kubeconfig)
    await create_node(api, NODE)
    one = await create_claim(api, "one-gpu", node=NODE, devices=["gpu-0"])
    floor_dir = root / "floor"
    floor_dir.mkdir()
    plugin_args = [
        "kubelet-plugin",
        f"--node-name={NODE}",
        f"--kubeconfig={kubeconfig}",
        f"--kubelet-registrar-directory-path={dirs.registry}",
        f"--kubelet-plugins-directory-path={dirs.plugins}",
        f"--cdi-root={dirs.cdi}",
        "--healthcheck-port=0",
        f"--container-driver-root={root / 'driver-root'}",
        "--nvml=simulated",
        "--profile=p5.48xlarge",
        "--metrics-port=0",  # served, as the chart runs the daemon by default
    ]
    floor_socket = floor_dir / "dra.sock"
    floor_args = ["aio", str(floor_socket), str(floor_dir), url]
    try:
        async with (
            _timed_process(
                "ours",
                "cli",
                plugin_args,
                root / "ours.json",
                dirs.paths().registration,
                "kubelet plugin ready",
            ) as (ours, ours_proc),
            _timed_process(
                "floor",
                "tests.bench.stackfloor",
                floor_args,
                root / "floor.json",
                floor_socket,
                "ready",
            ) as (floor, floor_proc),
        ):
            kubelets = {"ours": ours, "floor": floor}
            prep: dict[str, list[float]] = {name: [] for name in kubelets}
            unprep: dict[str, list[float]] = {name: [] for name in kubelets}
            for i in range(20 + ROUNDS):  # 20 rounds of warm-up
                for name, kubelet in kubelets.items():
                    start = time.perf_counter()
                    prepared = await kubelet.prepare([one])
                    middle = time.perf_counter()
                    await kubelet.unprepare([one])
                    end = time.perf_counter()
                    assert not prepared.claims[one.uid].error, prepared
                    if i >= 20:
                        prep[name].append(middle - start)
                        unprep[name].append(end - middle)
            our_calls = await _collect(ours_proc, root / "ours.json")
            floor_calls = await _collect(floor_proc, root / "floor.json")
    finally:
        await api.close()
    _report("NodePrepareResources", our_calls, floor_calls, prep)
    _report("NodeUnprepareResources", our_calls, floor_calls, unprep)


def main() -> int:
    with _tempdir() as root:
        kubeconfig = root / "kubeconfig"
        with _apiserver(kubeconfig) as url:
            asyncio.run(_bench(root, kubeconfig, url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
