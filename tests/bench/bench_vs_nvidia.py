"""Ours against NVIDIA's GPU kubelet plugin (v0.4.1) on one real node, in turns (issue #40).

By hand only (root, a level-3 node, NVIDIA's plugin built by ``make nvidia-plugin``); under
``make bench`` it says so and exits 0::

    GPU_DRA_E2E_RUN=/tmp/nk-bench flock /tmp/gpu-dra-e2e.lock .venv/bin/python \\
        -m tests.e2e.netns .venv/bin/python tests/bench/bench_vs_nvidia.py [--rounds 3]

The node is :mod:`tests.e2e.side_by_side`'s: the real kubelet and containerd, one simulated
p4d.24xlarge driver root, both plugins as host processes over the same C stand-in of NVML,
registered as ``gpu.nvidia.com`` one at a time. Each round runs both, in alternating order
(ours first in even rounds), and each turn measures:

- start: the plugin's start to its complete pool published and its registration socket there;
- RSS idle: resident memory of the plugin's process tree once its pool is complete;
- pods: ``--pods`` one-GPU pods (NVIDIA's chart's DeviceClass) one after another, each from
  its create to the pod's phase Running (polled every 20 ms), then deleted and its claim
  unprepared before the next;
- the kubelet's own ``dra_operations_duration_seconds`` (PrepareResources and
  UnprepareResources, from its /metrics, the difference over the turn's pods): its buckets
  start at 0.1 s, so below that only the mean (sum / count) says anything;
- CPU per 100 cycles: CPU seconds (user + system, the process tree's) over ``--cycles``
  NodePrepareResources + NodeUnprepareResources calls on the plugin's socket, one claim each
  (allocated on the API server beforehand, as the scheduler writes it), scaled to 100;
- RSS after those claims;
- a rolling upgrade under a prober (:func:`upgrade`): the plugin replaced as its chart rolls
  it while one-GPU pods run one after another; the kubelet's failed prepares (issue #40's
  goal: none for ours) and the longest time no registration socket answered.

Printed: one table per run, ours / NVIDIA's for each figure with the goal where issue #40 set
one, and the raw numbers as JSON (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e import netns, side_by_side
from tests.e2e.kube import await_until
from tests.e2e.side_by_side import DRIVER, GPUS, NODE, Plugin, SideBySide, cpu_s, rss_kib

METRIC = "dra_operations_duration_seconds"
OPERATIONS = ("PrepareResources", "UnprepareResources")
CYCLES_NS = "cycles"
FAILED_PREPARE = "FailedPrepareDynamicResources"  # the kubelet's event reason
PROBERS = 4  # pods at once during an upgrade, of the node's 8 GPUs
USAGE = (
    "GPU_DRA_E2E_RUN=/tmp/nk-bench flock /tmp/gpu-dra-e2e.lock .venv/bin/python -m "
    "tests.e2e.netns .venv/bin/python tests/bench/bench_vs_nvidia.py"
)


# -- the kubelet's histogram ---------------------------------------------------------------


Histogram = dict[str, Any]  # {"buckets": {le: cumulative count}, "sum": s, "count": n}


def _labels(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def histograms(metrics: str) -> dict[str, Histogram]:
    """operation name -> the kubelet's histogram of its successful calls."""
    out: dict[str, Histogram] = defaultdict(lambda: {"buckets": {}, "sum": 0.0, "count": 0})
    for line in metrics.splitlines():
        if not line.startswith(METRIC):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, rest = name_labels.partition("{")
        labels = _labels(rest.rstrip("}"))
        if labels.get("is_error") != "false" or labels.get("operation_name") not in OPERATIONS:
            continue
        h = out[labels["operation_name"]]
        if name == f"{METRIC}_bucket":
            h["buckets"][labels["le"]] = float(value)
        elif name == f"{METRIC}_sum":
            h["sum"] = float(value)
        elif name == f"{METRIC}_count":
            h["count"] = int(float(value))
    return dict(out)


def difference(after: Histogram, before: Histogram | None) -> Histogram:
    if before is None:
        return after
    return {
        "buckets": {le: n - before["buckets"].get(le, 0) for le, n in after["buckets"].items()},
        "sum": after["sum"] - before["sum"],
        "count": after["count"] - before["count"],
    }


def add(a: Histogram | None, b: Histogram) -> Histogram:
    if a is None:
        return b
    return {
        "buckets": {le: n + b["buckets"].get(le, 0) for le, n in a["buckets"].items()},
        "sum": a["sum"] + b["sum"],
        "count": a["count"] + b["count"],
    }


def quantile(h: Histogram, q: float) -> str:
    """histogram_quantile's estimate, as text: in the first bucket only its bound is known."""
    if not h["count"]:
        return "-"
    bounds = sorted(((float("inf") if le == "+Inf" else float(le)), n)
                    for le, n in h["buckets"].items())  # fmt: skip
    rank, lower, below = q * h["count"], 0.0, 0.0
    for i, (upper, n) in enumerate(bounds):
        if n >= rank:
            if i == 0:
                return f"<{upper:g}"
            return f"{lower + (upper - lower) * (rank - below) / max(n - below, 1e-9):.3f}"
        lower, below = upper, n
    return "-"


# -- one turn ----------------------------------------------------------------------------


async def cycles(side: SideBySide, plugin: Plugin, n: int, tag: str) -> float:
    """CPU seconds of ``plugin`` over ``n`` prepare + unprepare calls on its socket."""
    from sandbox.kubeletsim import KubeletSim
    from tests.pluginharness import api_client, create_claim

    side.cp.call("POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CYCLES_NS},
    }, ok=(201, 409))  # fmt: skip
    api = await api_client(side.cp.admin_kubeconfig)
    kubelet = await KubeletSim.register(plugin.registration())
    try:
        refs = [
            await create_claim(api, f"{tag}-{i}", node=NODE, devices=[f"gpu-{i % GPUS}"],
                               namespace=CYCLES_NS, driver=DRIVER)
            for i in range(n)
        ]  # fmt: skip
        before = cpu_s(plugin.pid)
        for ref in refs:
            prepared = (await kubelet.prepare([ref])).claims[ref.uid]
            assert not prepared.error, prepared.error
            undone = (await kubelet.unprepare([ref])).claims[ref.uid]
            assert not undone.error, undone.error
        used = cpu_s(plugin.pid) - before
    finally:
        await kubelet.close()
        await api.close()
    side.cp.raw("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{CYCLES_NS}/resourceclaims")
    return used


# -- a rolling upgrade under a prober --------------------------------------------------------


def registered_now(registry: Path) -> bool:
    """Whether a registration socket in the kubelet's ``registry`` accepts a connection: a
    plugin there to register (the kubelet's own view has no metric)."""
    for path in registry.glob("*reg.sock"):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(0.2)
            try:
                s.connect(str(path))
            except OSError:
                continue
            return True
    return False


async def probe(side: SideBySide, name: str) -> dict[str, Any]:
    """One one-GPU pod from create to Running, then deleted and gone; the seconds to
    Running, and the kubelet's FailedPrepareDynamicResources events for it."""
    ns = side_by_side.NS
    running_s = await side.run_pod(name, wait_s=300)
    events = side.cp.call("GET", f"/api/v1/namespaces/{ns}/events")["items"]
    failed = [e for e in events if e.get("reason") == FAILED_PREPARE
              and e.get("involvedObject", {}).get("name") == name]  # fmt: skip
    # Not forced: the kubelet confirms the deletion once it has unprepared the claim, so no
    # prober's next claim is given a GPU still prepared for this one (forced, both plugins
    # refuse such a claim until the kubelet gets to the unprepare: a minute, seen here).
    side.cp.raw("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=1")
    await await_until(f"pod {name} gone", lambda: not side.pod(name), 120)
    return {
        "running_s": running_s,
        "failed_prepares": sum(e.get("count") or 1 for e in failed),
        "said": sorted({e.get("message", "")[:160] for e in failed}),
    }


async def _registered(plugin: Plugin) -> float:
    """When (monotonic) ``plugin`` is registered by the kubelet, polled every 20 ms."""
    while not plugin.registered():
        if not plugin.alive():
            raise RuntimeError(f"{plugin.name} exited:\n{plugin.log()[-1500:]}")
        await asyncio.sleep(0.02)
    return time.monotonic()


async def upgrade(side: SideBySide, tag: str) -> dict[str, Any]:
    """The current plugin replaced as its chart rolls it, while :data:`PROBERS` probers each
    run one-GPU pods one after another (a prepare every few hundred ms): NVIDIA's
    (``maxUnavailable: 100%``, no surge) is stopped, then started; ours (``maxSurge: 1``)
    starts beside the old one, which stops once the new one is registered. Returns the
    probes' failed prepares, the time from the old plugin gone to the new one registered by
    the kubelet (none when the new one came first), and the longest time no registration
    socket accepted a connection (polled every 20 ms)."""
    old = side.current
    assert old is not None
    registry = side.node.kubelet_dir / "plugins_registry"
    probes: list[dict[str, Any]] = []
    gaps: list[float] = []
    rolled = asyncio.Event()

    async def prober(n: int) -> None:
        after = 0
        while after < 2:  # two probes once the upgrade is over
            during = not rolled.is_set()
            probes.append({**await probe(side, f"{tag}-p{n}-{len(probes)}"), "during": during})
            after += 0 if during else 1

    async def watch() -> None:
        down: float | None = None
        while True:
            up = registered_now(registry)
            now = time.monotonic()
            if not up and down is None:
                down = now
            elif up and down is not None:
                gaps.append(now - down)
                down = None
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    probing = [asyncio.create_task(prober(n)) for n in range(PROBERS)]
    await asyncio.sleep(2)  # probes under way when the upgrade starts
    started = time.monotonic()
    # And one pod created as the new process starts: the moment a node without surge has
    # no plugin registered.
    handover: asyncio.Task[dict[str, Any]]
    if old.name == "nvidia":
        await old.stop()
        gone = time.monotonic()
        new: Plugin = side.nvidia()
        handover = asyncio.create_task(probe(side, f"{tag}-handover"))
        await new.start()
        registered = await _registered(new)
    else:
        new = side_by_side.Ours(side=side, pod_uid=str(uuid.uuid4()))
        handover = asyncio.create_task(probe(side, f"{tag}-handover"))
        await new.start()
        registered = await _registered(new)
        await old.stop()  # the DaemonSet deletes the old pod once the new one is Ready
        gone = time.monotonic()
    side.current = new
    await side.cp.wait_for(
        f"the upgraded {new.name}'s pool", lambda: bool(side.complete_pool()), 60
    )
    upgrade_s = time.monotonic() - started
    rolled.set()
    await asyncio.gather(*probing)
    probes.append({**await handover, "during": True, "handover": True})
    # The next turn starts from a node with no claim prepared; a probe's pod is gone only once
    # the kubelet has unprepared it, so this holds at once unless the kubelet changed that.
    await await_until("the probes' claims unprepared", lambda: not side.specs(), 120)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    return {
        "upgrade_s": upgrade_s,
        "probes": len(probes),
        "probes_during": sum(1 for p in probes if p["during"]),
        "failed_prepares": sum(p["failed_prepares"] for p in probes),
        "probes_with_a_failed_prepare": sum(1 for p in probes if p["failed_prepares"]),
        "unregistered_s": max(0.0, registered - gone),
        "longest_no_socket_s": max(gaps, default=0.0),
        "slowest_probe_s": max(p["running_s"] for p in probes),
        "handover_probe": {k: v for k, v in probes[-1].items() if k != "handover"},
        "said": sorted({m for p in probes for m in p["said"]}),
    }


async def turn(
    side: SideBySide, plugin: Plugin, pods: int, n_cycles: int, tag: str
) -> dict[str, Any]:
    start = await side.switch(plugin)
    registered = side.timings["registered_s"]
    idle = rss_kib(plugin.pid)
    before = histograms(side.kubelet_metrics())
    running = []
    for i in range(pods):
        name = f"{tag}-{i}"
        running.append(await side.run_pod(name))
        await side.delete_pod(name)
    after = histograms(side.kubelet_metrics())
    kubelet = {op: difference(after[op], before.get(op)) for op in OPERATIONS}
    cpu = await cycles(side, plugin, n_cycles, tag)
    rss_after = rss_kib(plugin.pid)
    rolled = await upgrade(side, tag)
    return {
        "plugin": plugin.name,
        "start_to_pool_s": start,
        "start_to_registered_s": registered,
        "rss_idle_kib": idle,
        "pod_running_s": running,
        "kubelet": kubelet,
        "cpu_s_per_100_cycles": cpu * 100 / n_cycles,
        "rss_after_claims_kib": rss_after,
        "upgrade": rolled,
    }


# -- the table ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(turns: list[dict[str, Any]]) -> dict[str, Any]:
    pods = [t for turn in turns for t in turn["pod_running_s"]]
    kubelet: dict[str, Histogram | None] = dict.fromkeys(OPERATIONS)
    for t in turns:
        for op in OPERATIONS:
            kubelet[op] = add(kubelet[op], t["kubelet"][op])
    out: dict[str, Any] = {
        "pods": len(pods),
        "pod_running_p50_s": percentile(pods, 0.5),
        "pod_running_p95_s": percentile(pods, 0.95),
        "start_to_pool_s": statistics.median(t["start_to_pool_s"] for t in turns),
        "start_to_registered_s": statistics.median(t["start_to_registered_s"] for t in turns),
        "rss_idle_mib": statistics.median(t["rss_idle_kib"] for t in turns) / 1024,
        "rss_after_claims_mib": statistics.median(t["rss_after_claims_kib"] for t in turns) / 1024,
        "cpu_s_per_100_cycles": statistics.median(t["cpu_s_per_100_cycles"] for t in turns),
    }
    upgrades = [t["upgrade"] for t in turns]
    out["upgrade_failed_prepares"] = sum(u["failed_prepares"] for u in upgrades)  # goal: 0
    out["upgrade_probes_failed"] = sum(u["probes_with_a_failed_prepare"] for u in upgrades)
    out["upgrade_probes"] = sum(u["probes"] for u in upgrades)
    out["upgrade_unregistered_s"] = max(u["unregistered_s"] for u in upgrades)
    out["upgrade_longest_no_socket_s"] = max(u["longest_no_socket_s"] for u in upgrades)
    out["upgrade_slowest_probe_s"] = max(u["slowest_probe_s"] for u in upgrades)
    out["upgrade_handover_failed_prepares"] = sum(
        u["handover_probe"]["failed_prepares"] for u in upgrades
    )
    out["upgrade_handover_slowest_s"] = max(u["handover_probe"]["running_s"] for u in upgrades)
    out["upgrade_s"] = statistics.median(u["upgrade_s"] for u in upgrades)
    for op in OPERATIONS:
        h = kubelet[op]
        assert h is not None
        out[f"kubelet_{op}_count"] = h["count"]
        out[f"kubelet_{op}_mean_s"] = h["sum"] / h["count"] if h["count"] else float("nan")
        out[f"kubelet_{op}_p50"] = quantile(h, 0.5)
        out[f"kubelet_{op}_p95"] = quantile(h, 0.95)
    return out


GOALS = {
    "kubelet_PrepareResources_mean_s": 0.5,  # the goal is on p50: see the docstring
    "rss_idle_mib": 1.0,
    "rss_after_claims_mib": 1.0,
    "cpu_s_per_100_cycles": 0.5,
}


def table(ours: dict[str, Any], nvidia: dict[str, Any]) -> str:
    rows = [f"{'figure':38} {'ours':>10} {'NVIDIA':>10} {'ours/NV':>8}  goal"]
    for key, value in ours.items():
        theirs = nvidia[key]
        if isinstance(value, (int, float)) and isinstance(theirs, (int, float)) and theirs:
            ratio = f"{value / theirs:.2f}"
            goal = GOALS.get(key)
            verdict = (
                ""
                if goal is None
                else f"<= {goal} {'met' if value / theirs <= goal else 'NOT met'}"
            )
            rows.append(f"{key:38} {value:>10.3f} {theirs:>10.3f} {ratio:>8}  {verdict}")
        else:
            rows.append(f"{key:38} {value!s:>10} {theirs!s:>10} {'':>8}")
    return "\n".join(rows)


async def run(rounds: int, pods: int, n_cycles: int) -> dict[str, Any]:
    turns: dict[str, list[dict[str, Any]]] = {"ours": [], "nvidia": []}
    started = time.monotonic()
    async with side_by_side.side_by_side("bvn") as side:
        # One pod first, unmeasured: the node's first sandbox (pause image unpacked, the
        # bridge made) would be charged to whichever plugin goes first.
        await side.switch(side.ours())
        await side.run_pod("warm-up")
        await side.delete_pod("warm-up")
        for r in range(rounds):
            plugins = [side.ours(), side.nvidia()]
            for plugin in plugins if r % 2 == 0 else plugins[::-1]:
                result = await turn(side, plugin, pods, n_cycles, f"r{r}-{plugin.name}")
                turns[plugin.name].append(result)
                print(f"round {r} {plugin.name}: start {result['start_to_pool_s']:.2f} s, "
                      f"pods p50 {percentile(result['pod_running_s'], 0.5):.2f} s, "
                      f"cpu/100 {result['cpu_s_per_100_cycles']:.2f} s, "
                      f"rss {result['rss_idle_kib'] / 1024:.0f}->"
                      f"{result['rss_after_claims_kib'] / 1024:.0f} MiB",
                      file=sys.stderr, flush=True)  # fmt: skip
        await side.stop()
        version = side.cp.version()["gitVersion"]
    ours, nvidia = summary(turns["ours"]), summary(turns["nvidia"])
    print(f"\nours vs NVIDIA's plugin v0.4.1, Kubernetes {version}, {rounds} rounds, "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    print(table(ours, nvidia))
    return {"kubernetes": version, "rounds": rounds, "summary": {"ours": ours, "nvidia": nvidia},
            "turns": turns}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=10, help="pods per plugin per round")
    parser.add_argument("--cycles", type=int, default=100, help="per plugin per round")
    parser.add_argument("--out", type=Path, help="the raw numbers, as JSON")
    args = parser.parse_args(argv)
    if not netns.isolated():
        print(f"skipped: needs a level-3 node; by hand: {USAGE}")
        return 0
    why = side_by_side.missing()
    if why:
        print(f"skipped: {why}")
        return 0
    result = asyncio.run(run(args.rounds, args.pods, args.cycles))
    raw = json.dumps(result, indent=1, default=str)
    if args.out:
        args.out.write_text(raw + "\n")
    print(json.dumps(result["summary"], default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
