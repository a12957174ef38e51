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

from driver.discovery import discover
from driver.nvml.faults import Faults
from driver.nvml.simulated import SimulatedNode
from driver.resourceslice import build_resource_slices
from driver.tools.allocation import Explanation, explain_claim
from kubeletplugin.cli import main
from tests.chart_render import render

EXAMPLES = Path(__file__).resolve().parent.parent / "charts" / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))
DRIVER = "gpu.nvidia.com"

# node name -> (profile, NVML faults). "p5-old" is a p5.48xlarge on a 535 driver (CUDA 12.2).
NODES: dict[str, tuple[str, Faults | None]] = {
    "p5": ("p5.48xlarge", None),
    "p5-old": ("p5.48xlarge", Faults(driver_version="535.104.05", cuda_driver_version="12.2")),
    "p5e": ("p5e.48xlarge", None),
    "p4d": ("p4d.24xlarge", None),
    "g6e": ("g6e.48xlarge", None),
    "g6e-12": ("g6e.12xlarge", None),
    "g6": ("g6.xlarge", None),
    "g5": ("g5.48xlarge", None),
}
ALL = frozenset(NODES)


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
        "cuda-driver-floor.yaml",
        "first-available.yaml",
        "gpu-by-model.yaml",
        "legacy-extended-resource.yaml",
        "memory-floor.yaml",
        "pipeline-parallel.yaml",
        "shared-claim-two-pods.yaml",
        "shared-gpu-two-containers.yaml",
        "single-gpu.yaml",
        "tensor-parallel.yaml",
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
            ["validate", "--kubernetes-version", version, str(class_file), *map(str, FILES)]
        )
    assert (code, out.getvalue()) == (0, "")


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
    assert schedulable(result) == {"p5", "p5-old", "p5e", "p4d"}
    assert len(result.node("p5").results) == 4
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


def test_shared_gpu_two_containers_name_one_claim() -> None:
    pod = the(load("shared-gpu-two-containers.yaml"), "Pod")
    claims = [c["resources"]["claims"] for c in pod["spec"]["containers"]]
    assert len(claims) == 2 and claims[0] == claims[1] == [{"name": "gpu"}]


def test_first_available_falls_back_to_two_a100s(
    slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    result = allocate(the(load("first-available.yaml"), "ResourceClaimTemplate"), slices, classes)
    assert schedulable(result) == {"p5", "p5-old", "p4d"}
    assert [r.request for r in result.node("p5").results] == ["gpu/h100"]
    assert [r.request for r in result.node("p4d").results] == ["gpu/a100-pair"] * 2
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
