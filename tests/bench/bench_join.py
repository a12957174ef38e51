"""A new node's complete pool: from exec to the pool visible, ours against the Go reference.

Karpenter keeps a new node uninitialized (and cluster-autoscaler keeps it NotReady) until
every driver it expects has published a complete pool, so every scale-up waits on this.

(a) One node. ``gpu-dra kubelet-plugin`` (simulated NVML, p5.48xlarge: 8 GPUs) and the Go
reference (``tests/bench/goref``: a plugin on upstream's kubeletplugin helper publishing
the same 8 devices, read from a file, through the helper's ResourceSlice controller) are
started in turn against one local API server, each round on a node of its own, the order
alternating. The time is from just before exec to the pool complete as a watch of the
bench sees it (Karpenter's rule: the slices of the pool's highest ``pool.generation``
number its ``resourceSliceCount``). Medians and the ratio ours / Go; ours' breakdown from
its own log timestamps (exec to imports done, NVML and discovery, the claim state, the
servers, the first write); ours' idle RSS once complete; the requests each made.

(b) The fleet. N nodes of each started at once (ours, then Go), against one API server:
the requests per node from the server's request log, conflicts (409) and the time until
every pool is complete. On a machine with fewer cores than nodes this measures a CPU
queue as much as the plugins; the requests per node do not depend on it.

(c) What the daemon's start-up imports cost, by top-level package (``-X importtime``).

``--tree PATH`` runs ours from another checkout (the same virtualenv), for a before/after.

Usage: bench_join.py [--rounds N] [--fleet N] [--tree PATH]  (defaults 5, 100)
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from driver.kube import client as kubeclient  # noqa: E402
from driver.kube.resources import RESOURCE_SLICES  # noqa: E402
from driver.kube.rest import Client  # noqa: E402
from driver.nvml.simulated import SimulatedNode  # noqa: E402
from drivers.gpu.kinds import discovered  # noqa: E402
from drivers.gpu.model.discovery import discover  # noqa: E402
from sandbox.apiserver import ThreadedApiServer  # noqa: E402
from tests.bench.bytecode import byte_compile  # noqa: E402
from tests.bench.goref import build_goref  # noqa: E402

PROFILE = "p5.48xlarge"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
WATCHER = "bench-join"
TIMEOUT = 600.0
# Ours' log lines that mark the steps of its start, in order.
STEPS = (
    ("imports", "health service listening"),
    ("NVML+discovery", "GPUs discovered"),
    ("claim state", "device state ready"),
    ("servers", "kubelet plugin ready"),
    ("desired slices", "discovered devices"),
    ("first write", "slices written"),
)


@dataclass
class Pools:
    """Per pool, when the bench's watch first saw it complete."""

    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    complete: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.slices.pop(name, None)
            return
        self.slices[name] = obj
        pool = obj["spec"]["pool"]["name"]
        if pool in self.complete:
            return
        mine = [
            s["spec"]["pool"] for s in self.slices.values() if s["spec"]["pool"]["name"] == pool
        ]
        top = max(p["generation"] for p in mine)
        latest = [p for p in mine if p["generation"] == top]
        if len(latest) == latest[0]["resourceSliceCount"]:
            self.complete[pool] = time.time()
            self.changed.set()

    async def until(self, pools: list[str], wait_s: float = TIMEOUT) -> None:
        deadline = time.monotonic() + wait_s
        while not all(p in self.complete for p in pools):
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [p for p in pools if p not in self.complete]
                raise TimeoutError(f"pools never complete: {missing[:5]} ({len(missing)})")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


async def watch(api: Any, pools: Pools) -> None:
    client = Client(api, request_timeout=30)
    while True:
        listed = await client.request("GET", SLICES, verb="list", resource="resourceslices")
        for obj in listed.get("items") or ():
            pools.apply("ADDED", obj)
        version = listed["metadata"]["resourceVersion"]
        query = [("resourceVersion", version), ("timeoutSeconds", "3600")]
        async for event in client.watch(RESOURCE_SLICES, query=query, read_timeout=3700):
            if event["type"] != "BOOKMARK":
                pools.apply(event["type"], event["object"])


@dataclass
class Started:
    node: str
    proc: subprocess.Popen[bytes]
    t0: float
    log: Path


def start_ours(node: str, root: Path, kubeconfig: Path, tree: Path) -> Started:
    root.mkdir(parents=True)
    args = [
        sys.executable,
        "-m",
        "cli",
        "--log-format=json",
        "kubelet-plugin",
        f"--node-name={node}",
        f"--kubeconfig={kubeconfig}",
        f"--kubelet-registrar-directory-path={root}/reg",
        f"--kubelet-plugins-directory-path={root}/plugins",
        f"--cdi-root={root}/cdi",
        f"--container-driver-root={root}/driver-root",
        "--healthcheck-port=0",
        "--nvml=simulated",
        f"--profile={PROFILE}",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for name in ("NODE_NAME", "POD_UID", "GPU_DRA_NODE_NAME", "GPU_DRA_POD_UID"):
        env.pop(name, None)
    log = root / "log"
    with log.open("wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tree)
    return Started(node, proc, t0, log)


def start_go(node: str, root: Path, kubeconfig: Path, goref: Path, devices: Path) -> Started:
    root.mkdir(parents=True)
    args = [
        str(goref),
        f"-kubeconfig={kubeconfig}",
        f"-node-name={node}",
        f"-cdi-root={root}/cdi",
        f"-plugin-dir={root}/plugin",
        f"-registrar-dir={root}/reg",
        f"-devices={devices}",
    ]
    log = root / "log"
    with log.open("wb") as out:
        t0 = time.time()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    return Started(node, proc, t0, log)


def stop(started: list[Started]) -> None:
    for s in started:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in started:
        try:
            s.proc.wait(30)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()


def breakdown(started: Started) -> dict[str, float]:
    """Seconds from exec to each of ours' steps, by its log lines."""
    at: dict[str, float] = {}
    for line in started.log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        for step, message in STEPS:
            if record.get("msg") == message and step not in at:
                when = datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
                at[step] = when.timestamp() - started.t0
    return at


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def requests_of(records: list[Any], agent: str) -> Counter[str]:
    return Counter(
        f"{r.verb} {r.resource.rsplit('/', 1)[-1]}" + (f" {r.code}" if r.code >= 400 else "")
        for r in records
        if r.user_agent.startswith(agent) or (agent == "go" and _is_go(r.user_agent))
    )


def _is_go(agent: str) -> bool:
    return not agent.startswith(("gpu-dra", WATCHER))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def import_profile(tree: Path) -> list[tuple[str, float]]:
    """Cumulative import seconds of the daemon's start-up modules by top-level package."""
    code = "import cli, cli.plugin, drivers.gpu.node, driver.kube.client"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        check=True,
    )
    own: dict[str, float] = defaultdict(float)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line.removeprefix("import time:").split("|")
        own[name.strip().split(".")[0]] += int(self_us) / 1e6
    total = sum(own.values())
    return [("total", total), *sorted(own.items(), key=lambda kv: -kv[1])[:8]]


async def one_node(
    server: ThreadedApiServer,
    pools: Pools,
    kubeconfig: Path,
    work: Path,
    rounds: int,
    tree: Path,
    goref: Path,
    devices: Path,
) -> None:
    times: dict[str, list[float]] = {"ours": [], "go": []}
    steps: dict[str, list[float]] = defaultdict(list)
    rss: list[float] = []
    cpu: dict[str, list[float]] = {"ours": [], "go": []}
    requests: dict[str, Counter[str]] = {"ours": Counter(), "go": Counter()}
    for i in range(rounds):
        order = ["ours", "go"] if i % 2 == 0 else ["go", "ours"]
        for who in order:
            node = f"join-{who}-{i}"
            server.requests.clear()
            if who == "ours":
                s = start_ours(node, work / node, kubeconfig, tree)
            else:
                s = start_go(node, work / node, kubeconfig, goref, devices)
            try:
                await pools.until([node], wait_s=120)
                times[who].append(pools.complete[node] - s.t0)
                cpu[who].append(cpu_s(s.proc.pid))
                if who == "ours":
                    # Idle: its start-up done (ready and published), nothing to do.
                    await asyncio.sleep(1.0)
                    rss.append(rss_mib(s.proc.pid))
                    for step, at in breakdown(s).items():
                        steps[step].append(at)
                requests[who] += requests_of(
                    server.requests.snapshot(), who if who == "go" else "gpu-dra"
                )
            finally:
                stop([s])
    ours, go = median(times["ours"]), median(times["go"])
    print(f"(a) one node, {rounds} rounds each, alternating; exec -> pool complete (watch):")
    print(f"    ours  median {ours:.3f}s  runs {' '.join(f'{t:.2f}' for t in times['ours'])}")
    print(f"    go    median {go:.3f}s  runs {' '.join(f'{t:.2f}' for t in times['go'])}")
    print(f"    ratio ours/go = {ours / go:.2f}  (target <= 0.70)")
    # CPU time does not wait in the run queue: on a loaded machine it says what the start
    # costs, where wall time says how long it waited for a CPU.
    ours_cpu, go_cpu = median(cpu["ours"]), median(cpu["go"])
    print(
        f"    CPU seconds used by then: ours median {ours_cpu:.3f}s, go {go_cpu:.3f}s; "
        f"ours' CPU / go's wall = {ours_cpu / go:.2f}"
    )
    print("    ours' breakdown, median seconds from exec (its log):")
    last = 0.0
    for step, _ in STEPS:
        at = median(steps.get(step, []))
        print(f"      {step:<15} at {at:6.3f}s  (+{at - last:.3f}s)")
        last = at
    print(f"      {'pool complete':<15} at {ours:6.3f}s  (+{ours - last:.3f}s)")
    print(f"    ours' idle RSS once published: median {median(rss):.1f} MiB")
    for who in ("ours", "go"):
        detail = ", ".join(f"{k}={n / rounds:g}" for k, n in sorted(requests[who].items()))
        print(f"    requests/node {who}: {sum(requests[who].values()) / rounds:g}  [{detail}]")


async def fleet(
    server: ThreadedApiServer,
    pools: Pools,
    kubeconfig: Path,
    work: Path,
    n: int,
    tree: Path,
    goref: Path,
    devices: Path,
) -> None:
    print(f"(b) fleet: {n} nodes started at once, on {os.cpu_count()} CPUs:")
    result: dict[str, float] = {}
    for who in ("ours", "go"):
        nodes = [f"fleet-{who}-{i}" for i in range(n)]
        server.requests.clear()
        t0 = time.time()
        started = [
            start_ours(node, work / node, kubeconfig, tree)
            if who == "ours"
            else start_go(node, work / node, kubeconfig, goref, devices)
            for node in nodes
        ]
        try:
            await pools.until(nodes)
            wall = max(pools.complete[node] for node in nodes) - t0
            records = server.requests.snapshot()
        finally:
            stop(started)
        mine = requests_of(records, who if who == "go" else "gpu-dra")
        conflicts = sum(k for key, k in mine.items() if key.endswith(" 409"))
        result[who] = sum(mine.values()) / n
        detail = ", ".join(f"{k}={c / n:g}" for k, c in sorted(mine.items()))
        print(
            f"    {who:<4} all complete {wall:6.1f}s  requests/node {result[who]:.2f}  "
            f"conflicts {conflicts}  [{detail}]"
        )
    print(f"    requests/node ours/go = {result['ours'] / result['go']:.2f}  (target <= 1.00)")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fleet", type=int, default=100)
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    goref = build_goref()
    byte_compile(args.tree)  # as installed: the Go reference is compiled too
    with tempfile.TemporaryDirectory(prefix="join-") as tmp:
        work = Path(tmp)
        # The devices both publish; also builds the simulated NVML library before any run.
        sim = SimulatedNode(PROFILE, "template", work / "template")
        inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
        devices = work / "devices.json"
        devices.write_text(json.dumps(discovered(inventory, node_name="x").discovered()))
        nodes = [f"join-{w}-{i}" for w in ("ours", "go") for i in range(args.rounds)]
        nodes += [f"fleet-{w}-{i}" for w in ("ours", "go") for i in range(args.fleet)]
        print(
            f"ours from {args.tree}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        for name, seconds in import_profile(args.tree):
            print(f"(c) imports: {name:<16} {seconds:6.3f}s")
        with ThreadedApiServer(bookmark_interval=30.0) as server:
            server.seed(
                *({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in nodes)
            )
            kubeconfig = server.write_kubeconfig(work / "kubeconfig")
            api = await kubeclient.api_client(kubeconfig, component="watcher")
            api.user_agent = WATCHER
            pools = Pools()
            watcher = asyncio.create_task(watch(api, pools))
            try:
                await one_node(
                    server, pools, kubeconfig, work, args.rounds, args.tree, goref, devices
                )
                if args.fleet:
                    await fleet(
                        server, pools, kubeconfig, work, args.fleet, args.tree, goref, devices
                    )
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
                await kubeclient.close(api)


if __name__ == "__main__":
    asyncio.run(main())
