"""Our slices against NVIDIA's own plugin's, for what users' selectors read (issue #40).

``tests/data/nvidia-plugin/slices-<profile>.json`` holds the ResourceSlices NVIDIA's GPU
kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1, built and run by hand on the
simulated NVML: ``tests/e2e/nvidia_plugin.py``; its README says how) published for each
simulated profile. Ours for the same profile and node name come from our pure slice code
(``drivers.gpu.resourceslice``, what ``gpu-dra discover`` prints).

Held equal: the devices' names, and every attribute and capacity NVIDIA's publishes, by
name, type and value (a capacity as a quantity: NVIDIA writes ``143771Mi`` where we write
``150754820096``, one value to CEL's ``quantity`` and ``compareTo``). What only ours
publishes is :data:`ONLY_OURS`, each with why; a selector written for NVIDIA's driver never
reads it, so it works on ours. Then every example claim of NVIDIA's that we hold
(``tests/data/nvidia/``) is allocated by ``explain``'s allocator on NVIDIA's slices and on
ours: the same devices on each node, or a difference in :data:`EXPLAIN_DIFFERS`.

Dynamic MIG (``slices-p5e.48xlarge-dynamic-mig.json``, NVIDIA's with its ``DynamicMIG``
gate) is held to ours with ``--dynamic-mig`` on the same p5e in MIG mode: the same 200
placements by name, the same 8 counter sets, the same counters consumed by each, every
attribute and capacity of NVIDIA's alike, NVIDIA's examples on the same placements; what
differs is :data:`DYNAMIC_DIFFERS`, first of all the whole GPUs only NVIDIA's publishes.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from driver.common.quantity import Quantity
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices
from tools.allocation import explain_claim
from tools.allocation.inputs import load_file
from tools.validation import chart_device_classes

DATA: Final = Path(__file__).parent / "data"
RECORDS: Final = DATA / "nvidia-plugin"
EXAMPLES: Final = DATA / "nvidia"
PROFILES: Final = ("p5e.48xlarge", "p4d.24xlarge-mig")
DRIVER: Final = "gpu.nvidia.com"

_OLD_SELECTORS = (
    "NVIDIA's plugin published it until 36fc80ab (2025-09, first in v25.8.0); ours keeps it, "
    "so selectors written for NVIDIA's earlier releases (its own quickstart gpu-test6.yaml "
    "still selects on index) keep working"
)
# Attributes only ours publishes (NVIDIA's has none that ours lacks): name -> why.
ONLY_OURS: Final[dict[str, str]] = {
    "index": f"the GPU's NVML index; {_OLD_SELECTORS}",
    "minor": f"the GPU's device-node minor (/dev/nvidia<minor>); {_OLD_SELECTORS}",
    "memory": (
        "the full GPU's memory in MiB as an int, for selectors that compare numbers "
        "(memory >= 80000); the capacity NVIDIA's has too is the quantity"
    ),
    "model": (
        "the product name as a label-safe string (NVIDIA-H200), what node labels and GPU "
        "Feature Discovery call the product; productName is NVIDIA's own, also published"
    ),
    "numaNode": "the GPU's NUMA node from sysfs, for placing CPUs and NICs beside it",
    "resource.kubernetes.io/numaNode": (
        "the same, under the standard name that other drivers' devices match on "
        "(matchAttribute across drivers)"
    ),
    "nvlinkDomain": (
        "GPUs joined by NVLink (NVSwitch) share a domain: matchAttribute for tensor "
        "parallelism; NVIDIA's plugin publishes no NVLink topology for full GPUs"
    ),
}

# (example file, claim name) -> why the allocations differ; every other claim lands on the
# same devices on each node.
EXPLAIN_DIFFERS: Final[dict[tuple[str, str], str]] = {
    ("gpu-test6.yaml", "a100"): (
        "its selector reads the index attribute, which NVIDIA's plugin no longer publishes: "
        "on NVIDIA's slices the A100 node stops at a CEL runtime error (no such key: index); "
        "on ours the claim gets GPU 0 of the A100 node, as the example means (see ONLY_OURS)"
    ),
}


def _ours(profile: str, root: Path) -> list[dict[str, Any]]:
    node = f"sim-{profile}"
    sim = SimulatedNode(profile, node, root / node)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    return build_resource_slices(inventory, driver_name=DRIVER, node_name=node)


def _theirs(profile: str) -> list[dict[str, Any]]:
    body = json.loads((RECORDS / f"slices-{profile}.json").read_text())
    assert body["source"]["tag"] == "v0.4.1" and body["source"]["profile"] == profile
    slices: list[dict[str, Any]] = body["slices"]
    return slices


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[Any], list[Any]]]:
    """Per profile: (ours, NVIDIA's) slices."""
    root = tmp_path_factory.mktemp("nodes")
    return {p: (_ours(p, root), _theirs(p)) for p in PROFILES}


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(section, name) of every attribute or capacity of one device that a selector would
    read differently, and of every other device field that differs."""
    a, b = ours.get("attributes", {}), theirs.get("attributes", {})
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):  # {"string": ...} vs {"version": ...}: the type too
            yield "attributes", name
    a, b = ours.get("capacity", {}), theirs.get("capacity", {})
    for name in sorted(a.keys() | b.keys()):
        if name not in a or name not in b:
            yield "capacity", name
            continue
        if Quantity.parse(a[name]["value"]) != Quantity.parse(b[name]["value"]):
            yield "capacity", name
        if {k: v for k, v in a[name].items() if k != "value"} != {
            k: v for k, v in b[name].items() if k != "value"
        }:
            yield "capacity", f"{name} (requestPolicy)"
    for field in sorted((ours.keys() | theirs.keys()) - {"name", "attributes", "capacity"}):
        if ours.get(field) != theirs.get(field):
            yield "device", field


@pytest.mark.parametrize("profile", PROFILES)
def test_same_pool_and_device_names(
    pairs: dict[str, tuple[list[Any], list[Any]]], profile: str
) -> None:
    ours, theirs = pairs[profile]

    def pool(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in s["spec"].items() if k != "devices"} for s in slices]

    assert pool(ours) == pool(theirs)
    assert sorted(_devices(ours)) == sorted(_devices(theirs))
    expected = 8 if profile == "p5e.48xlarge" else 4 + 4 * 3
    assert len(_devices(theirs)) == expected


@pytest.mark.parametrize("profile", PROFILES)
def test_every_attribute_and_capacity_of_nvidias_reads_the_same_on_ours(
    pairs: dict[str, tuple[list[Any], list[Any]]], profile: str
) -> None:
    ours, theirs = pairs[profile]
    mine, nvidia = _devices(ours), _devices(theirs)
    for name, device in nvidia.items():
        for section, key in _differences(mine[name], device):
            # Only what ours adds may differ: nothing of NVIDIA's is missing or changed.
            assert section == "attributes" and key in ONLY_OURS, (name, section, key)
            assert key not in device.get("attributes", {}), (name, key)


def test_the_table_lists_exactly_what_differs(
    pairs: dict[str, tuple[list[Any], list[Any]]],
) -> None:
    """No stale entry: each attribute of ONLY_OURS is published by ours on some device."""
    seen = {
        key
        for ours, theirs in pairs.values()
        for name, device in _devices(theirs).items()
        for _, key in _differences(_devices(ours)[name], device)
    }
    assert seen == set(ONLY_OURS)


def _outcomes(claim: dict[str, Any], slices: list[dict[str, Any]]) -> dict[str | None, Any]:
    """Per node: the (request, device) pairs allocated, or the first reason it cannot."""
    explanation = explain_claim(claim, slices=slices, classes=chart_device_classes())
    return {
        n.node: sorted((r.request, r.device) for r in n.results)
        if n.allocatable
        else ("unallocatable", n.reasons[0] if n.reasons else "")
        for n in explanation.nodes
    }


def _in_our_order(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[Any]:
    """NVIDIA's slices with each pool's devices in our order. Its plugin lists them in Go
    map order, another each run (deterministic order is NVIDIA's open draft NV#1358), and
    the allocator takes the first fit in slice order: one order compares which devices
    fit, not where a map put them."""
    order = {
        (s["spec"]["pool"]["name"], d["name"]): i
        for s in ours
        for i, d in enumerate(s["spec"]["devices"])
    }
    out = []
    for s in theirs:
        pool = s["spec"]["pool"]["name"]
        devices = sorted(s["spec"]["devices"], key=lambda d: order[(pool, d["name"])])
        out.append({**s, "spec": {**s["spec"], "devices": devices}})
    return out


def test_nvidias_examples_land_on_the_same_devices(
    pairs: dict[str, tuple[list[Any], list[Any]]],
) -> None:
    ours = [s for o, _ in pairs.values() for s in o]
    theirs = _in_our_order(ours, [s for _, t in pairs.values() for s in t])
    differ: dict[tuple[str, str], tuple[Any, Any]] = {}
    allocated = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for obj in load_file(path):
            if obj.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
                continue
            mine, nvidia = _outcomes(obj, ours), _outcomes(obj, theirs)
            allocated += sum(isinstance(v, list) for v in nvidia.values())
            if mine != nvidia:
                differ[(path.name, obj["metadata"]["name"])] = (mine, nvidia)
    assert set(differ) == set(EXPLAIN_DIFFERS)
    # Not a comparison of two refusals: 17 (claim, node) pairs fit NVIDIA's slices (the
    # others: MIG profiles neither node has, NVIDIA's VFIO and IMEX classes, not published).
    assert allocated == 17
    mine, nvidia = differ[("gpu-test6.yaml", "a100")]
    assert mine["sim-p4d.24xlarge-mig"] == [("gpu", "gpu-4")]  # the first whole A100
    assert "no such key: index" in nvidia["sim-p4d.24xlarge-mig"][1]


# Dynamic MIG: NVIDIA's plugin with its alpha DynamicMIG gate against ours with
# --dynamic-mig, on the p5e.48xlarge (8 H200, Hopper).
#
# NVIDIA's v0.4.1 publishes, for a Hopper-or-later GPU, the whole GPU and every MIG
# placement whatever the GPU's MIG mode is, and turns MIG mode on when it makes a placement
# and off again after the last one goes (cmd/gpu-kubelet-plugin/nvlib.go:1491-1495, "Hopper+
# supports reset-less MIG mode toggling, so advertise both the full GPU and the dynamic MIG
# profiles irrespective of current MIG state"; SetMigMode at nvlib.go:963 and :1183). Its
# records: the p5e as the profile has it, MIG mode off (slices-...-dynamic-mig.json), and
# with every GPU in MIG mode and no instance (slices-...-mig-mode-dynamic-mig.json): the same
# slices. Ours never changes a GPU's MIG mode (tests/test_discovery_mig.py): it publishes
# placements for a GPU already in MIG mode, and a GPU not in MIG mode as a whole GPU only.
# So the two are compared on the p5e in MIG mode (what an admin or mig-parted sets before
# the plugin starts); the whole GPUs are the difference that follows, in DYNAMIC_DIFFERS.
DYNAMIC_PROFILE: Final = "p5e.48xlarge"
WHOLE_GPUS: Final = frozenset(f"gpu-{i}" for i in range(8))

DYNAMIC_DIFFERS: Final[dict[str, str]] = {
    "whole GPUs": (
        "NVIDIA's publishes each Hopper GPU whole beside its placements, consuming all of its "
        "counter set, and toggles MIG mode at prepare; ours does not change MIG mode, so with "
        "the GPU in MIG mode it publishes no whole GPU (a whole-GPU claim of NVIDIA's, class "
        "gpu.nvidia.com, finds none on such a node: keep some GPUs out of MIG mode, or ask for "
        "the 7g.141gb placement), and with MIG mode off only the whole GPU, no placements and "
        "no counters (as without --dynamic-mig). A gap for users who mix whole-GPU and MIG "
        "claims on one Hopper GPU; closing it means toggling MIG mode at prepare"
    ),
    "zero counters": (
        "NVIDIA's counter sets and consumptions carry counters valued 0 (encoders: an H200 has "
        "no NVENC); ours leaves a counter out when no device consumes any of it. Consuming 0 of "
        "a counter never blocks an allocation, so both allocate alike"
    ),
    "memorySlice capacities": (
        "ours publishes memorySlice<i> = 1 for each memory slice of a placement, as NVIDIA's "
        "static MIG devices do (slices-p4d.24xlarge-mig.json) and as our static MIG devices "
        "do; NVIDIA's dynamic placements publish none, so a selector reading them works on "
        "ours and stops at a CEL error on NVIDIA's"
    ),
    "slice layout": (
        "both put the 8 counter sets in one slice of their own first (Kubernetes 1.35+); "
        "NVIDIA's then one slice per GPU (26 devices), ours 64 devices a slice (the most a slice "
        "may hold once its devices consume counters): the scheduler reads the pool, not the "
        "slices"
    ),
}


def _ours_dynamic(root: Path, *, mig_mode: bool) -> list[dict[str, Any]]:
    node = f"sim-{DYNAMIC_PROFILE}"
    profile: str | Path = DYNAMIC_PROFILE
    if mig_mode:
        profile = root / "dynamic.yaml"
        profile.write_text(f"extends: {DYNAMIC_PROFILE}\nmig: {{enabled: all}}\n")
    sim = SimulatedNode(profile, node, root / node)
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root, dynamic_mig=True)
    return build_resource_slices(inventory, driver_name=DRIVER, node_name=node)


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], list[Any]]:
    """(ours on the p5e in MIG mode with --dynamic-mig, NVIDIA's with DynamicMIG there)."""
    body = _theirs_dynamic("mig-mode-dynamic-mig")
    assert "MIG mode" in body["source"]["migMode"]
    return _ours_dynamic(tmp_path_factory.mktemp("dyn"), mig_mode=True), body["slices"]


def _theirs_dynamic(suffix: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        (RECORDS / f"slices-{DYNAMIC_PROFILE}-{suffix}.json").read_text()
    )
    source = body["source"]
    assert (source["tag"], source["profile"], source["featureGates"]) == (
        "v0.4.1",
        DYNAMIC_PROFILE,
        "DynamicMIG=true",
    )
    return body


def test_nvidias_dynamic_mig_slices_do_not_depend_on_mig_mode(
    dynamic: tuple[list[Any], list[Any]],
) -> None:
    """On Hopper NVIDIA's publishes the same pool with MIG mode off as on (nvlib.go:1491):
    the pool ours is compared with is the one a p5e as EC2 starts it gets."""
    _, theirs = dynamic
    off = _theirs_dynamic("dynamic-mig")
    assert "migMode" not in off["source"]
    assert off["slices"] == theirs


def _counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters", [])}


def _amounts(counters: dict[str, Any]) -> dict[str, Quantity]:
    """Counters as quantities, those valued 0 left out (DYNAMIC_DIFFERS: zero counters)."""
    out = {k: Quantity.parse(v["value"]) for k, v in counters.items()}
    return {k: q for k, q in out.items() if q.value != 0}


def test_dynamic_mig_same_placements_and_counter_sets(
    dynamic: tuple[list[Any], list[Any]],
) -> None:
    ours, theirs = dynamic
    mine, nvidia = _devices(ours), _devices(theirs)
    assert len(nvidia) == 208 and set(nvidia) - set(mine) == WHOLE_GPUS  # whole GPUs
    assert set(mine) <= set(nvidia) and len(mine) == 200  # 25 placements of 8 GPUs
    sets_mine, sets_nvidia = _counter_sets(ours), _counter_sets(theirs)
    assert sorted(sets_mine) == sorted(sets_nvidia) == [f"gpu-{i}-counter-set" for i in range(8)]
    for name, counters in sets_nvidia.items():
        # 6 engine counts, memory (140Gi, the 7g placement's) and 8 memory slices
        assert len(counters) == 15 and counters["memory"]["value"] == "140Gi", name
        assert _amounts(sets_mine[name]) == _amounts(counters), name
        zero = {k for k, v in counters.items() if Quantity.parse(v["value"]).value == 0}
        assert zero == {"encoders"} and zero.isdisjoint(sets_mine[name]), name  # zero counters


def test_dynamic_mig_placements_read_and_consume_the_same(
    dynamic: tuple[list[Any], list[Any]],
) -> None:
    ours, theirs = dynamic
    mine, nvidia = _devices(ours), _devices(theirs)
    extra_capacities: set[str] = set()
    for name, device in mine.items():
        theirs_ = nvidia[name]
        ((a,), (b,)) = (device["consumesCounters"], theirs_["consumesCounters"])
        assert a["counterSet"] == b["counterSet"] == f"{name.split('-mig-')[0]}-counter-set"
        assert _amounts(a["counters"]) == _amounts(b["counters"]), name
        assert any(k.startswith("memory-slice-") for k in b["counters"]), name
        mine_, nvidia_ = (
            {k: v for k, v in d.items() if k != "consumesCounters"} for d in (device, theirs_)
        )  # compared above
        for section, key in _differences(mine_, nvidia_):
            assert section != "device", (name, key)
            if section == "capacity":
                assert key.startswith("memorySlice") and key not in theirs_["capacity"], name
                extra_capacities.add(key)  # memorySlice capacities
            else:
                assert key in ONLY_OURS and key not in theirs_["attributes"], (name, key)
        assert theirs_["attributes"]["type"] == {"string": "mig"}, name
    assert extra_capacities == {f"memorySlice{i}" for i in range(8)}


def test_dynamic_mig_whole_gpus_are_nvidias_alone(
    dynamic: tuple[list[Any], list[Any]], tmp_path: Path
) -> None:
    """DYNAMIC_DIFFERS["whole GPUs"], both ways it shows."""
    ours, theirs = dynamic
    nvidia = _devices(theirs)
    sets = _counter_sets(theirs)
    for name in WHOLE_GPUS:
        device = nvidia[name]
        assert device["attributes"]["type"] == {"string": "gpu"}
        ((consumed,),) = [device["consumesCounters"]]
        # all of its set: no placement of the GPU fits beside it, nor it beside one
        assert consumed["counters"] == sets[consumed["counterSet"]], name
    assert not WHOLE_GPUS & set(_devices(ours))
    # The p5e with MIG mode off: ours publishes its whole GPUs, as without
    # --dynamic-mig (the static record's names), and neither placements nor counters.
    off = _ours_dynamic(tmp_path, mig_mode=False)
    assert set(_devices(off)) == WHOLE_GPUS == set(_devices(_theirs(DYNAMIC_PROFILE)))
    assert not _counter_sets(off)
    assert not any("consumesCounters" in d for d in _devices(off).values())


def test_dynamic_mig_slice_layout(dynamic: tuple[list[Any], list[Any]]) -> None:
    """DYNAMIC_DIFFERS["slice layout"]."""
    ours, theirs = dynamic
    for slices, per_slice in ((ours, [64, 64, 64, 8]), (theirs, [26] * 8)):
        first, *rest = slices
        assert len(first["spec"]["sharedCounters"]) == 8 and not first["spec"].get("devices")
        assert [len(s["spec"]["devices"]) for s in rest] == per_slice
        assert not any(s["spec"].get("sharedCounters") for s in rest)
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}


def _allocated(claim: dict[str, Any], slices: list[dict[str, Any]]) -> Any:
    """The claim's devices on the p5e, or None where it cannot be allocated (why differs
    with which of the two pools' devices a refusal counts first)."""
    outcome = _outcomes(claim, slices)[f"sim-{DYNAMIC_PROFILE}"]
    return outcome if isinstance(outcome, list) else None


def test_nvidias_examples_on_dynamic_mig(dynamic: tuple[list[Any], list[Any]]) -> None:
    """Every MIG claim of NVIDIA's examples lands on the same placements of both pools (the
    counters keep two claims' placements apart alike); every whole-GPU claim lands on
    NVIDIA's alone (DYNAMIC_DIFFERS["whole GPUs"])."""
    ours, theirs = dynamic
    same: list[str] = []
    whole_gpu_only_nvidias: list[str] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for obj in load_file(path):
            if obj.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
                continue
            name = f"{path.name}/{obj['metadata']['name']}"
            mine, nvidia = _allocated(obj, ours), _allocated(obj, theirs)
            if mine == nvidia:
                same.append(name)
                continue
            assert mine is None, name
            assert {device for _, device in nvidia} <= WHOLE_GPUS, name
            whole_gpu_only_nvidias.append(name)
    assert sorted(same) == [
        "bats-gpu-anymig.yaml/rct-anymig",
        "bats-gpu-multiple-mig.yaml/rct-migdevs",
        "bats-gpu-simple-mig-ts.yaml/rct-mig1g-ts",
        "bats-gpu-simple-mig.yaml/rct-mig1g",
        "gpu-test-vfio-config.yaml/single-gpu-full-vfioconfig",  # neither: no VFIO class
        "gpu-test4.yaml/mig-devices",  # neither: A100 profiles
        "gpu-test6.yaml/a100",  # neither: an A100 selector
    ]
    assert len(whole_gpu_only_nvidias) == 7
    # Two placements of one GPU that the counters let fit together, on both.
    (claim,) = [
        o
        for o in load_file(EXAMPLES / "bats-gpu-multiple-mig.yaml")
        if o["kind"] == "ResourceClaimTemplate"
    ]
    assert _allocated(claim, ours) == [
        ("mig1", "gpu-0-mig-1g18gb-19-0"),
        ("mig2", "gpu-0-mig-3g71gb-9-4"),
    ]
