"""The examples in charts/examples are executed, not just written.

Each one passes the Kubernetes schemas and ``gpu-dra validate`` with the chart's own
DeviceClasses, and is allocated against simulated ResourceSlices of several instance types,
asserting what its opening comment promises about where it will and won't schedule.
"""

import io
from collections.abc import Mapping
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cli import main
from driver.nvml.faults import Faults
from driver.nvml.simulated import SimulatedNode
from drivers.gpu.flavor import GPU_CONFIGS
from drivers.gpu.model.discovery import discover
from drivers.gpu.resourceslice import build_resource_slices
from kubeletplugin.claims import ClaimRef, plan_claim
from tests.chart_render import render
from tools.allocation import Explanation, explain_claim

EXAMPLES = Path(__file__).resolve().parent.parent / "charts" / "examples"
# The EFA driver's DeviceClass, which gpu-with-efa.yaml names (the EFA chart installs it).
EFA_CLASS = Path(__file__).resolve().parent / "data" / "efa-deviceclass.yaml"
FILES = sorted(EXAMPLES.glob("*.yaml"))
DRIVER = "gpu.nvidia.com"

# node name -> (profile, NVML faults). "p5-old" is a p5.48xlarge on a 535 driver (CUDA 12.2).
NODES: dict[str, tuple[str, Faults | None]] = {
    "p5": ("p5.48xlarge", None),
    "p5-old": ("p5.48xlarge", Faults(driver_version="535.104.05", cuda_driver_version="12.2")),
    "p5e": ("p5e.48xlarge", None),
    "p4d": ("p4d.24xlarge", None),
    "p4d-mig": ("p4d.24xlarge-mig", None),  # GPUs 0-3: 3g.20gb, 2g.10gb, 1g.10gb each
    "g6e": ("g6e.48xlarge", None),
    "g6e-12": ("g6e.12xlarge", None),
    "g6": ("g6.xlarge", None),
    "g5": ("g5.48xlarge", None),
}
ALL = frozenset(NODES)
# Examples asking for part of a GPU's memory, with their claim template's name.
CAPACITY_EXAMPLES = {"gpu-memory-shares.yaml": "gpu-20gi", "mps-memory-limit.yaml": "mps-20gi"}


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def the(docs: list[dict[str, Any]], *kinds: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] in kinds]
    return found


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("nodes")
    out: list[dict[str, Any]] = []
    for node, (profile, faults) in NODES.items():
        sim = SimulatedNode(profile, node, root / node, faults=faults)
        inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
        out += build_resource_slices(inventory, driver_name=DRIVER, node_name=node)
    return out


@pytest.fixture(scope="module")
def classes() -> list[dict[str, Any]]:
    """The DeviceClasses the chart installs by default."""
    return [o for o in render() if o["kind"] == "DeviceClass"]


def allocate(
    claim: Mapping[str, Any], slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> Explanation:
    return explain_claim(claim, slices=slices, classes=classes)


def schedulable(explanation: Explanation) -> frozenset[str]:
    return frozenset(str(n.node) for n in explanation.nodes if n.allocatable)


def test_every_scenario_has_an_example() -> None:
    assert [f.name for f in FILES] == [
        "compute-domain-two-nodes.yaml",
        "cuda-driver-floor.yaml",
        "diagnostics-tolerates-xid.yaml",
        "first-available.yaml",
        "gpu-by-model.yaml",
        "gpu-memory-shares.yaml",
        "gpu-with-efa.yaml",
        "job-one-gpu.yaml",
        "legacy-extended-resource.yaml",
        "memory-floor.yaml",
        "mig-1g-10gb.yaml",
        "mig-3g.yaml",
        "mig-two-sizes.yaml",
        "mps-memory-limit.yaml",
        "pipeline-parallel.yaml",
        "shared-claim-two-pods.yaml",
        "shared-gpu-two-containers.yaml",
        "single-gpu.yaml",
        "tensor-parallel.yaml",
        "time-sliced-gpu-two-pods.yaml",
        "torchrun-8-gpus.yaml",
        "vllm-pipeline-parallel-g6e.yaml",
        "vllm-tensor-parallel.yaml",
    ]


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_example_opens_with_its_promise(path: Path) -> None:
    head = path.read_text().split("\napiVersion:", 1)[0]
    assert head.startswith("# ")
    # It says where it schedules and where it does not.
    assert "Schedules on" in head and ("not on" in head.lower() or "pending" in head.lower())


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_examples_pass_kubernetes_validate_strict(version: str) -> None:
    failures = []
    for path in FILES:
        for doc in load(path.name):
            if doc["apiVersion"].startswith("resource.nvidia.com/"):
                continue  # the chart's CRDs: gpu-dra validate checks them (the test below)
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                failures.append(f"{path.name}: {doc['kind']}: {exc.message}")
    assert failures == []


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_examples_pass_gpu_dra_validate_with_the_charts_classes(
    version: str, classes: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The chart's classes are given, so every deviceClassName is checked against them.
    class_file = tmp_path / "classes.yaml"
    class_file.write_text(yaml.safe_dump_all(classes))
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(
            [
                "validate",
                "--kubernetes-version",
                version,
                str(class_file),
                str(EFA_CLASS),
                *map(str, FILES),
            ]
        )
    # Fields behind gates off by default before 1.36, each a warning naming its gate: capacity
    # requests (DRAConsumableCapacity) and the diagnostics claim's tolerations (DRADeviceTaints).
    gated = {
        f"{EXAMPLES / name}: ResourceClaimTemplate/{template}: spec.spec.devices.requests[0]."
        "exactly.capacity.requests: warning: {memory: 20Gi}: needs feature gate "
        f"DRAConsumableCapacity, off by default in Kubernetes {version}"
        for name, template in CAPACITY_EXAMPLES.items()
    } | {
        f"{EXAMPLES / 'diagnostics-tolerates-xid.yaml'}: ResourceClaimTemplate/"
        "diagnostics-tolerates-xid: spec.spec.devices.requests[0].exactly.tolerations: "
        "warning: 1 toleration(s): needs feature gate DRADeviceTaints, off by default in "
        f"Kubernetes {version}"
    }
    lines = out.getvalue().splitlines()
    assert code == 0
    if version == "1.34":
        assert {line.split(" (on by default")[0] for line in lines} == gated
    else:
        assert len(lines) == 1 and lines[0].endswith(" objects, no problems")


def test_mig_examples_schedule_only_on_mig_devices(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    small = allocate(the(load("mig-1g-10gb.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(small) == {"p4d-mig"}
    assert small.node("p4d-mig").results[0].device == "gpu-0-mig-1g10gb-15-6"
    three = allocate(the(load("mig-3g.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(three) == {"p4d-mig"}
    assert three.node("p4d-mig").results[0].device == "gpu-0-mig-3g20gb-9-0"
    both = allocate(the(load("mig-two-sizes.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(both) == {"p4d-mig"}
    got = {r.request: r.device for r in both.node("p4d-mig").results}
    assert got == {"large": "gpu-0-mig-3g20gb-9-0", "small": "gpu-0-mig-1g10gb-15-6"}
    # Whole-GPU nodes, MIG-capable or not, have no MIG device to give.
    assert schedulable(small) & {"p4d", "p5", "p5e", "g6"} == set()


def test_single_gpu_schedules_everywhere(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    for name in ("single-gpu.yaml", "shared-gpu-two-containers.yaml"):
        result = allocate(the(load(name), "ResourceClaimTemplate"), slices, classes)
        assert schedulable(result) == ALL
        assert all(len(n.results) == 1 for n in result.nodes)


def test_gpu_by_model_only_on_h100_nodes(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("gpu-by-model.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == {"p5", "p5-old"}
    assert any("productName" in r for r in result.node("g6e").reasons)


def test_memory_floor_excludes_small_gpus(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("memory-floor.yaml"), "ResourceClaimTemplate"), slices, classes)
    # p4d's A100 has exactly 40 GiB: the floor is inclusive.
    assert schedulable(result) == ALL - {"g6", "g5"}


def test_cuda_floor_holds_only_where_the_driver_meets_it(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    claim = the(load("cuda-driver-floor.yaml"), "ResourceClaimTemplate")
    result = allocate(claim, slices, classes)
    assert schedulable(result) == ALL - {"p5-old"}
    assert any("cudaDriverVersion" in r for r in result.node("p5-old").reasons)


def test_tensor_parallel_needs_one_nvlink_domain(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("tensor-parallel.yaml"), "ResourceClaimTemplate"), slices, classes)
    # p4d-mig's four whole GPUs (4-7) are one NVLink domain still.
    assert schedulable(result) == {"p5", "p5-old", "p5e", "p4d", "p4d-mig"}
    assert len(result.node("p5").results) == 4
    assert {r.device for r in result.node("p4d-mig").results} == {f"gpu-{i}" for i in range(4, 8)}
    for node in ("g6e", "g6e-12"):
        assert any("nvlinkDomain" in r for r in result.node(node).reasons), node


def test_pipeline_parallel_needs_two_gpus_of_any_kind(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("pipeline-parallel.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == ALL - {"g6"}  # g6.xlarge has a single GPU
    assert {"g6e", "g6e-12"} <= schedulable(result)


def test_shared_claim_two_pods(slices: list[dict[str, Any]], classes: list[dict[str, Any]]) -> None:
    docs = load("shared-claim-two-pods.yaml")
    claim = the(docs, "ResourceClaim")
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["resourceClaims"] == [
            {"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}
        ]
    result = allocate(claim, slices, classes)
    assert schedulable(result) == ALL
    # Once allocated, the claim's own allocation does not block it: the second pod reuses it.
    allocated = dict(claim, status={"allocation": result.node("p5").allocation})
    again = explain_claim(allocated, slices=slices, classes=classes, allocated=[allocated])
    assert "p5" in schedulable(again)


def test_time_sliced_gpu_two_pods(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    docs = load("time-sliced-gpu-two-pods.yaml")
    claim = the(docs, "ResourceClaim")
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert [p["spec"]["resourceClaims"] for p in pods] == 2 * [
        [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
    ]
    result = allocate(claim, slices, classes)
    assert schedulable(result) == ALL
    # What the plugin records from the allocation (the scheduler copies the claim's config).
    allocation = result.node("p5").allocation
    assert allocation is not None
    allocation = dict(allocation)
    allocation["devices"] = dict(
        allocation["devices"],
        config=[dict(c, source="FromClaim") for c in claim["spec"]["devices"]["config"]],
    )
    allocated = dict(claim, metadata={"uid": "u-1"}, status={"allocation": allocation})
    plan = plan_claim(
        allocated,
        ClaimRef("u-1", "default", "x"),
        driver_name=DRIVER,
        pool_name="p5",
        rules=GPU_CONFIGS,
    )
    assert [d.config.sharing_settings() for d in plan.devices] == [
        (("interval", "Short"), ("strategy", "TimeSlicing"))
    ]


def test_shared_gpu_two_containers_name_one_claim() -> None:
    pod = the(load("shared-gpu-two-containers.yaml"), "Pod")
    claims = [c["resources"]["claims"] for c in pod["spec"]["containers"]]
    assert len(claims) == 2 and claims[0] == claims[1] == [{"name": "gpu"}]


def test_first_available_falls_back_to_two_a100s(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("first-available.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == {"p5", "p5-old", "p4d", "p4d-mig"}
    assert [r.request for r in result.node("p5").results] == ["gpu/h100"]
    assert [r.request for r in result.node("p4d").results] == ["gpu/a100-pair"] * 2
    assert [r.request for r in result.node("p4d-mig").results] == ["gpu/a100-pair"] * 2
    assert not result.node("g6e").allocatable and not result.node("p5e").allocatable


def test_legacy_pod_is_served_through_extended_resource_name(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    pod = the(load("legacy-extended-resource.yaml"), "Pod")
    (limits,) = [c["resources"]["limits"] for c in pod["spec"]["containers"]]
    count = limits["nvidia.com/gpu"]
    # Without the chart value no class serves nvidia.com/gpu: the pod stays Pending.
    assert not [c for c in classes if c["spec"].get("extendedResourceName")]
    with_value = [
        o
        for o in render((), ("deviceClasses.gpu.extendedResourceName.enabled=true",))
        if o["kind"] == "DeviceClass"
    ]
    (serving,) = [
        c for c in with_value if c["spec"].get("extendedResourceName") == "nvidia.com/gpu"
    ]
    # The claim the scheduler creates for the pod: one request of that class per container.
    implicit = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "legacy-extended-resource-extended-resources"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "container-0-request-0",
                        "exactly": {
                            "deviceClassName": serving["metadata"]["name"],
                            "count": count,
                        },
                    }
                ]
            }
        },
    }
    assert schedulable(explain_claim(implicit, slices=slices, classes=with_value)) == ALL


# --- the workload examples: Jobs and Deployments whose pods use the claims -------------


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def _shm(spec: dict[str, Any]) -> int | None:
    """The memory-backed /dev/shm of a pod spec, in GiB, or None."""
    mounts = [m for c in spec["containers"] for m in c.get("volumeMounts", [])]
    (mount,) = [m for m in mounts if m["mountPath"] == "/dev/shm"] or [None]
    if mount is None:
        return None
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    return int(volume["emptyDir"]["sizeLimit"].removesuffix("Gi"))


def _numa(node: Any, slices: list[dict[str, Any]], key: str) -> set[int]:
    by_device = {
        (s["spec"]["pool"]["name"], d["name"]): d["attributes"][key]["int"]
        for s in slices
        for d in s["spec"]["devices"]
        if key in d["attributes"]
    }
    return {by_device[(r.pool, r.device)] for r in node.results}


def test_job_with_one_gpu(slices: list[dict[str, Any]], classes: list[dict[str, Any]]) -> None:
    docs = load("job-one-gpu.yaml")
    job = the(docs, "Job")
    spec = _pod_spec(job)
    assert spec["restartPolicy"] == "Never"
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    result = allocate(the(docs, "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == ALL
    assert all(len(n.results) == 1 for n in result.nodes)


def test_vllm_tensor_parallel_takes_four_nvlinked_gpus_of_one_numa_node(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    docs = load("vllm-tensor-parallel.yaml")
    deployment = the(docs, "Deployment")
    spec = _pod_spec(deployment)
    (vllm,) = spec["containers"]
    assert "--tensor-parallel-size=4" in vllm["args"]
    assert _shm(spec) == 16
    claim = the(docs, "ResourceClaimTemplate")
    result = allocate(claim, slices, classes)
    assert schedulable(result) == {"p5", "p5-old", "p5e", "p4d", "p4d-mig"}
    for node in ("p5", "p5e", "p4d", "p4d-mig"):
        entry = result.node(node)
        assert len(entry.results) == 4
        assert len(_numa(entry, slices, "resource.kubernetes.io/numaNode")) == 1, node
    assert any("nvlinkDomain" in r for r in result.node("g6e").reasons)
    # With GPU 0 (NUMA node 0) and GPU 5 (NUMA node 1) of the p5 taken, each NUMA node keeps
    # 3 free GPUs: 6 free in all, but the claim does not spill across the two.
    held = {
        **claim,
        "kind": "ResourceClaim",
        "metadata": {"name": "other", "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": "p5", "device": d}
                        for d in ("gpu-0", "gpu-5")
                    ]
                }
            }
        },
    }
    crowded = explain_claim(claim, slices=slices, classes=classes, allocated=[held])
    assert not crowded.node("p5").allocatable
    assert any("numaNode" in r for r in crowded.node("p5").reasons)


def _efa_slices(gpu_slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the EFA DRA driver publishes on the p5 nodes: 4 adapters on each GPU's PCIe root,
    with the standard attributes (AWS: on p5.48xlarge each GPU shares a root with 4 EFAs)."""
    out = []
    for piece in gpu_slices:
        node = piece["spec"]["nodeName"]
        if not node.startswith("p5"):
            continue
        devices: list[dict[str, Any]] = []
        for gpu in piece["spec"]["devices"]:
            attrs = gpu["attributes"]
            for _ in range(4):
                devices.append(
                    {
                        "name": f"efa-{len(devices)}",
                        "attributes": {
                            "dra.net/pciDevice": {"string": "Elastic Fabric Adapter (EFA)"},
                            "resource.kubernetes.io/pcieRoot": attrs[
                                "resource.kubernetes.io/pcieRoot"
                            ],
                            "resource.kubernetes.io/numaNode": attrs["numaNode"],
                        },
                    }
                )
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-efa"},
                "spec": {
                    "driver": "dra.net",
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            }
        )
    return out


def test_gpu_with_its_efa_adapters_on_one_pcie_root(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    docs = load("gpu-with-efa.yaml")
    pod = the(docs, "Pod")
    assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpu-and-its-efas"
    efa_class = yaml.safe_load(EFA_CLASS.read_text())
    everything = slices + _efa_slices(slices)
    result = allocate(the(docs, "ResourceClaimTemplate"), everything, [*classes, efa_class])
    assert schedulable(result) == {"p5", "p5-old", "p5e"}
    roots = {
        (s["spec"]["pool"]["name"], s["spec"]["driver"], d["name"]): d["attributes"][
            "resource.kubernetes.io/pcieRoot"
        ]["string"]
        for s in everything
        for d in s["spec"]["devices"]
    }
    entry = result.node("p5")
    assert sorted(r.request for r in entry.results) == ["efa"] * 4 + ["gpu"]
    assert len({roots[(r.pool, r.driver, r.device)] for r in entry.results}) == 1
    # Without the EFA driver's devices the p5 cannot serve the efa request.
    assert (
        not allocate(the(docs, "ResourceClaimTemplate"), slices, [*classes, efa_class])
        .node("p5")
        .allocatable
    )


def test_torchrun_takes_all_eight_gpus_of_one_nvlink_node(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    docs = load("torchrun-8-gpus.yaml")
    job = the(docs, "Job")
    spec = _pod_spec(job)
    (trainer,) = spec["containers"]
    assert "--nproc_per_node=8" in trainer["command"]
    assert _shm(spec) == 64
    result = allocate(the(docs, "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == {"p5", "p5-old", "p5e", "p4d"}
    assert all(len(result.node(n).results) == 8 for n in ("p5", "p5e", "p4d"))
    assert any("nvlinkDomain" in r for r in result.node("g6e").reasons)


def test_vllm_pipeline_parallel_pair_on_pcie_only_g6e(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    docs = load("vllm-pipeline-parallel-g6e.yaml")
    spec = _pod_spec(the(docs, "Deployment"))
    (vllm,) = spec["containers"]
    assert "--pipeline-parallel-size=2" in vllm["args"]
    assert _shm(spec) == 8
    result = allocate(the(docs, "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == {"g6e", "g6e-12"}
    for node in ("g6e", "g6e-12"):
        entry = result.node(node)
        assert len(entry.results) == 2
        assert len(_numa(entry, slices, "resource.kubernetes.io/numaNode")) == 1
    assert any("productName" in r for r in result.node("p5").reasons)


def test_tensor_parallel_stays_on_one_numa_node(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("tensor-parallel.yaml"), "ResourceClaimTemplate"), slices, classes)
    for node in ("p5", "p5e", "p4d"):
        numa = _numa(result.node(node), slices, "resource.kubernetes.io/numaNode")
        assert len(numa) == 1, node


@pytest.mark.parametrize("name", sorted(CAPACITY_EXAMPLES))
def test_memory_shares_go_to_one_gpu_when_gpus_are_shared(
    name: str, tmp_path: Path, slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    template = the(load(name), "ResourceClaimTemplate")
    # Unshared GPUs: each claim a GPU of its own with at least 20Gi, on every node.
    assert schedulable(allocate(template, slices, classes)) == ALL
    sim = SimulatedNode("p5.48xlarge", "p5", tmp_path / "p5")
    inventory = discover(sim.nvml, sysfs_root=sim.sysfs_root)
    shared = build_resource_slices(
        inventory, driver_name=DRIVER, node_name="p5", consumable_capacity=True
    )
    held: list[dict[str, Any]] = []
    for n in range(4):  # three 20Gi shares fill a 79Gi H100; the fourth takes the next one
        claim = {**template["spec"], "metadata": {"name": f"pod-{n}", "namespace": "default"}}
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim}
        entry = explain_claim(claim, slices=shared, classes=classes, allocated=held).node("p5")
        assert [r.device for r in entry.results] == ["gpu-0" if n < 3 else "gpu-1"]
        assert entry.results[0].consumed_capacity == {"memory": "20Gi"}
        held.append({**claim, "status": {"allocation": entry.allocation}})


def test_compute_domain_two_nodes(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    docs = load("compute-domain-two-nodes.yaml")
    domain = the(docs, "ComputeDomain")
    channel = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    job = the(docs, "Job")
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    spec = _pod_spec(job)
    assert {c["resourceClaimTemplateName"] for c in spec["resourceClaims"]} == {
        channel,
        "four-gb200-gpus",
    }
    (worker,) = spec["containers"]
    assert {c["name"] for c in worker["resources"]["claims"]} == {
        c["name"] for c in spec["resourceClaims"]
    }
    (together,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert together["topologyKey"] == "nvidia.com/gpu.clique"
    (apart,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart["topologyKey"] == "kubernetes.io/hostname"
    # The four GPUs: any node with four free (the simulated profiles have no GB200 yet).
    result = allocate(the(docs, "ResourceClaimTemplate"), slices, classes)
    assert all(len(result.node(n).results) == 4 for n in schedulable(result))
    assert "g6" not in schedulable(result)  # one GPU
