"""``gpu-dra explain`` against the scheduler's own allocator, on the same inputs.

The reference is ``k8s.io/dynamic-resource-allocation/structured`` as the kube-scheduler of
1.36 runs it (tests/oracles/cmd/oracle, built by ``python -m tests.e2e.build oracles``), on
500, 2,000 and 5,000 nodes of mixed profiles with slices as ``discover`` makes them:
p5.48xlarge (8 H100, one NVLink domain), g6e.48xlarge published with consumable capacity
(8 L40S, shareable) and p4d.24xlarge-mig (8 A100, four in MIG mode). Every fourth node
already holds a claim: two whole GPUs, a share of one GPU, or a MIG device.

Four claims: 4 GPUs of one NVLink domain; two 1g.10gb MIG devices; one GPU with 40Gi of
memory (capacity requests); 9 GPUs, which no node has.

Two comparisons, each printed as ours / upstream (lower is better; the targets are 0.5 core
against core and 1.0 whole process against whole process):

- core against core: ours is ``explain_claim`` from the slice dicts in memory to the
  explanation (reasons for every node that fails included); upstream is the oracle's own
  timing of NewAllocator and Allocate on every node, after decoding, at the scheduler's
  default parallelism (16 nodes at once) and at 1.
- whole process against whole process: ``gpu-dra explain -o json --slices FILE`` against
  ``oracle explain --slices FILE`` on the same files, from exec to exit, output discarded.
  Our modules are byte-compiled first, as installing the package does: where
  PYTHONDONTWRITEBYTECODE is set (as here), every process would compile them again.

Before timing, every node's outcome of ours is compared with upstream's
(tests/oracles/test_allocator_oracle.py's comparison): a disagreement stops the bench.
"""

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.model.inventory import Gpu, Inventory
from drivers.gpu.resourceslice import build_resource_slices
from tests.bench.bytecode import byte_compile
from tests.oracles.client import Oracle
from tests.oracles.test_allocator_oracle import compare
from tools.allocation import explain_claim

DRIVER = "gpu.nvidia.com"
VERSION = "1.36"
# (profile, published with consumable capacity)
PROFILES = (("p5.48xlarge", False), ("g6e.48xlarge", True), ("p4d.24xlarge-mig", False))
SIZES = (500, 2000, 5000)
RUNS = 3
PARALLELISM = (16, 1)  # the kube-scheduler's default, and one node at a time

_SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == '
CLASSES = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": _SELECTOR + f'"{kind}"'}}]},
    }
    for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig"))
]


def _claim(name: str, request: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": request}], **devices}},
    }


CLAIMS = {
    "4 GPUs, one NVLink domain": _claim(
        "tp4",
        {"deviceClassName": "gpu.nvidia.com", "count": 4},
        constraints=[{"requests": ["r"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}],
    ),
    "2 MIG 1g.10gb": _claim(
        "mig",
        {
            "deviceClassName": "mig.nvidia.com",
            "count": 2,
            "selectors": [
                {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "1g.10gb"'}}
            ],
        },
    ),
    "1 GPU with 40Gi": _claim(
        "mem40",
        {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": "40Gi"}}},
    ),
    "9 GPUs (nowhere)": _claim("nine", {"deviceClassName": "gpu.nvidia.com", "count": 9}),
}


# ----------------------------------------------------------------------------------------
# The cluster
# ----------------------------------------------------------------------------------------


def _templates() -> dict[str, Inventory]:
    with tempfile.TemporaryDirectory() as root:
        out = {}
        for profile, _ in PROFILES:
            node = SimulatedNode(profile, f"{profile}-template", Path(root) / profile)
            out[profile] = discover(node.nvml, sysfs_root=node.sysfs_root)
        return out


def _renamed(gpu: Gpu, node: str) -> Gpu:
    def new(kind: str, key: str) -> str:
        return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{key}')}"

    migs = tuple(
        dataclasses.replace(m, uuid=new("MIG", f"{gpu.index}/{m.uuid}")) for m in gpu.mig_devices
    )
    return dataclasses.replace(gpu, uuid=new("GPU", str(gpu.index)), mig_devices=migs)


def build_cluster(nodes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The slices of ``nodes`` nodes, profiles in turn, and the claims already allocated.

    One node of each profile is discovered through the simulated NVML (the real path); the
    others reuse its inventory with their own GPU and MIG UUIDs.
    """
    templates = _templates()
    slices: list[dict[str, Any]] = []
    allocated: list[dict[str, Any]] = []
    for n in range(nodes):
        profile, shared = PROFILES[n % len(PROFILES)]
        name = f"node-{n:05d}"
        inventory = templates[profile]
        inventory = dataclasses.replace(
            inventory, gpus=tuple(_renamed(g, name) for g in inventory.gpus)
        )
        node_slices = build_resource_slices(
            inventory, driver_name=DRIVER, node_name=name, consumable_capacity=shared
        )
        slices += node_slices
        if n % 4 == 0:
            allocated.append(_holding(name, node_slices, n // 4))
    return slices, allocated


def _holding(node: str, node_slices: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """An allocated claim on ``node``: two whole GPUs, a 20Gi share of one, or a MIG device."""
    devices = [d for s in node_slices for d in s["spec"].get("devices") or ()]
    migs = [d for d in devices if d["attributes"]["type"]["string"] == "mig"]
    gpus = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
    results: list[dict[str, Any]]
    base = {"request": "r", "driver": DRIVER, "pool": node}
    if migs:
        results = [{**base, "device": migs[index % len(migs)]["name"]}]
    elif gpus[0].get("allowMultipleAllocations"):
        results = [
            {
                **base,
                "device": gpus[index % len(gpus)]["name"],
                "shareID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/share")),
                "consumedCapacity": {"memory": "20Gi"},
            }
        ]
    else:
        results = [{**base, "device": g["name"]} for g in gpus[:2]]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"held-{node}", "namespace": "default", "uid": f"uid-held-{node}"},
        "spec": {
            "devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


# ----------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------


def _median_s(fn: Callable[[], object], runs: int = RUNS) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _case(
    claim: dict[str, Any], slices: list[dict[str, Any]], allocated: list[dict[str, Any]]
) -> dict[str, Any]:
    names = sorted({s["spec"]["nodeName"] for s in slices})
    return {
        "kind": "allocate",
        "version": VERSION,
        "slices": slices,
        "classes": CLASSES,
        "claim": claim,
        "allocated": allocated,
        "nodes": [{"name": n, "labels": {}} for n in names],
    }


def core(
    oracle: Oracle,
    claim: dict[str, Any],
    slices: list[dict[str, Any]],
    allocated: list[dict[str, Any]],
    runs: int,
) -> tuple[float, dict[int, float], int]:
    """Ours in memory, upstream's own timing per parallelism (seconds, medians), and the
    number of nodes the claim fits."""
    case = _case(claim, slices, allocated)
    case["timing"] = {"parallelism": list(PARALLELISM), "repeat": runs}
    (answer,) = oracle.ask([case])
    problems = compare(case, answer)
    if problems:
        raise SystemExit(
            f"ours and upstream disagree on {len(problems)} nodes:\n" + "\n".join(problems[:5])
        )
    allocatable = sum(1 for o in answer["nodes"].values() if o["outcome"] == "allocated")
    upstream: dict[int, float] = {}
    for run in answer["timings"]["runs"]:
        assert set(run["allocated"]) == {allocatable}, run
        upstream[run["parallelism"]] = statistics.median(
            a + b for a, b in zip(run["newAllocatorSeconds"], run["loopSeconds"], strict=True)
        )
    ours = _median_s(
        lambda: explain_claim(claim, slices=slices, classes=CLASSES, allocated=allocated), runs
    )
    return ours, upstream, allocatable


def whole(
    binary: Path, workdir: Path, name: str, claim: dict[str, Any], runs: int
) -> tuple[float, float]:
    """Seconds from exec to exit: ``gpu-dra explain`` and ``oracle explain`` on the same files."""
    claim_file = workdir / f"claim-{name}.json"
    claim_file.write_text(json.dumps(claim))
    files = [
        *("--slices", str(workdir / "slices.json")),
        *("--deviceclass", str(workdir / "classes.json")),
        *("--allocated", str(workdir / "allocated.json")),
        *("-f", str(claim_file)),
    ]
    gpu_dra = shutil.which("gpu-dra", path=str(Path(sys.executable).parent))
    if gpu_dra is None:
        raise SystemExit("gpu-dra is not installed in this interpreter's environment")
    ours_cmd = [gpu_dra, "explain", "-o", "json", *files]
    theirs_cmd = [str(binary), "explain", *files]

    def run(cmd: list[str]) -> Callable[[], None]:
        def go() -> None:
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")

        return go

    return _median_s(run(ours_cmd), runs), _median_s(run(theirs_cmd), runs)


def _write_inputs(
    workdir: Path, slices: list[dict[str, Any]], allocated: list[dict[str, Any]]
) -> None:
    def as_list(items: list[dict[str, Any]]) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})

    (workdir / "slices.json").write_text(as_list(slices))
    (workdir / "classes.json").write_text(as_list(CLASSES))
    (workdir / "allocated.json").write_text(as_list(allocated))


def _first(
    size: int, slices: list[dict[str, Any]], allocated: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The cluster of the first ``size`` nodes: nodes are built in order, so it is the one
    ``build_cluster(size)`` makes."""
    names = {f"node-{n:05d}" for n in range(size)}
    return (
        [s for s in slices if s["spec"]["nodeName"] in names],
        [
            c
            for c in allocated
            if c["status"]["allocation"]["devices"]["results"][0]["pool"] in names
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help="runs per figure (median)")
    parser.add_argument(
        "--whole-runs", type=int, help="runs per whole-process figure (default: --runs)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="node counts")
    args = parser.parse_args()
    if shutil.which("go") is None:
        print("bench_explain: skipped, go not found on PATH (the oracle is built from Go modules)")
        return
    from tests.e2e.build import build_oracles

    binary = build_oracles()
    byte_compile(Path(__file__).resolve().parents[2])
    print(
        f"upstream: k8s.io/dynamic-resource-allocation structured, {VERSION} features; "
        f"ours: this tree; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"medians of {args.runs} runs ({args.whole_runs or args.runs} of whole processes)"
    )
    started = time.perf_counter()
    everything = build_cluster(max(args.sizes))
    print(f"cluster of {max(args.sizes)} nodes built in {time.perf_counter() - started:.1f} s")
    with Oracle(binary) as oracle, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for size in sorted(args.sizes):
            slices, allocated = _first(size, *everything)
            devices = sum(len(s["spec"].get("devices") or ()) for s in slices)
            _write_inputs(workdir, slices, allocated)
            megabytes = (workdir / "slices.json").stat().st_size / 2**20
            print(
                f"\n{size} nodes: {len(slices)} slices, {devices} devices, {len(allocated)} "
                f"claims allocated, slices file {megabytes:.0f} MiB"
            )
            for label, claim in CLAIMS.items():
                ours, upstream, fits = core(oracle, claim, slices, allocated, args.runs)
                ours_whole, theirs_whole = whole(
                    binary, workdir, claim["metadata"]["name"], claim, args.whole_runs or args.runs
                )
                ratios = ", ".join(
                    f"upstream at {p} {upstream[p]:.3f} s, ratio {ours / upstream[p]:.2f}"
                    for p in PARALLELISM
                )
                print(
                    f"  {label}: fits {fits} nodes\n"
                    f"    core: ours {ours:.3f} s; {ratios}\n"
                    f"    whole process: ours {ours_whole:.3f} s, upstream {theirs_whole:.3f} s, "
                    f"ratio {ours_whole / theirs_whole:.2f}"
                )


if __name__ == "__main__":
    main()
