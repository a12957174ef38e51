"""``gpu-dra validate``: a request no device of any EKS instance type could satisfy.

The devices are what ``gpu-dra discover`` publishes on every simulated instance profile
(``tests/profile_devices.py`` writes them; the first test holds the file equal to a fresh
discovery). Each case is one claim with one request, and what validate must say of it.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import profile_devices
from tools.cel import reads, split_conjuncts
from tools.validation import Check, Problem, Severity, chart_device_classes, validate_sources
from tools.validation.hardware import DATA, nodes
from tools.validation.manifests import CHART_CLASS_SELECTORS

ROOT = Path(__file__).resolve().parent.parent
GPU = 'device.attributes["gpu.nvidia.com"]'


def request(name: str = "gpu", **fields: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **fields}}


def claim(*requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team"},
        "spec": {"devices": {"requests": list(requests) or [request()]}},
    }


def cel(*expressions: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in expressions]


def check(*docs: dict[str, Any], **options: Any) -> list[Problem]:
    return validate_sources([("c.yaml", yaml.safe_dump_all(docs))], **options)


def hardware(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.check is Check.HARDWARE]


def test_the_profile_devices_are_what_discover_publishes() -> None:
    assert DATA.read_text(encoding="utf-8") == profile_devices.render(), (
        "python -m tests.profile_devices  (or: make docs)"
    )


def test_every_eks_profile_is_there_and_no_synthetic_one() -> None:
    labels = {n.label for n in nodes()}
    assert "p5.48xlarge" in labels and "p5.48xlarge (dynamic-mig)" in labels
    assert "p4d.24xlarge-mig" in labels and "g6.xlarge (consumable-capacity)" in labels
    assert not any(label.startswith("synthetic") for label in labels)
    # Node-specific values are left out: validate does not judge them.
    every = [d for n in nodes() for d in n.devices]
    assert all(not d.has("gpu.nvidia.com", "uuid", False) for d in every)


def test_the_chart_class_selectors_are_the_ones_validate_knows() -> None:
    from tests.chart_render import render

    every = [
        "consumableCapacity.enabled=true",
        "deviceClasses.gpu.extendedResourceName.enabled=true",
        "computeDomains.enabled=true",
    ]
    rendered = {
        o["metadata"]["name"]: tuple(s["cel"]["expression"] for s in o["spec"]["selectors"])
        for o in render((), every)
        if o["kind"] == "DeviceClass"
    }
    assert rendered == dict(CHART_CLASS_SELECTORS)
    # What explain knows offline is the same world.
    assert {
        c["metadata"]["name"]: tuple(s["cel"]["expression"] for s in c["spec"]["selectors"])
        for c in chart_device_classes()
    } == rendered


def test_a_product_name_no_instance_type_has_is_an_error_with_the_closest_values() -> None:
    doc = claim(request(selectors=cel(f'{GPU}.productName == "NVIDIA H100"')))
    (problem,) = check(doc)
    assert problem.check is Check.HARDWARE and problem.severity is Severity.ERROR
    assert (problem.file, problem.obj) == ("c.yaml", "ResourceClaim/team/c")
    assert problem.path == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert '\'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100"\'' in (
        problem.message
    )
    assert "is false on every device of class gpu.nvidia.com" in problem.message
    # What is allowed: the values there, the closest first, with where they are.
    assert 'productName there is "NVIDIA H100 80GB HBM3" (p5.48xlarge)' in problem.message
    # Nodes of other hardware: demoted.
    (demoted,) = check(doc, defined_elsewhere=True)
    assert demoted.severity is Severity.WARNING and demoted.message == problem.message


def test_a_number_out_of_every_profile_range_names_the_range() -> None:
    memory = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("300Gi")) >= 0'
    (problem,) = hardware(check(claim(request(selectors=cel(memory)))))
    assert "memory there ranges from 22.5Gi (g5.48xlarge, g6.xlarge) to " in problem.message


def test_a_selector_that_fails_at_runtime_on_every_device_says_so() -> None:
    # profile is a MIG device's attribute; the GPU class has none.
    doc = claim(request(selectors=cel(f'{GPU}.profile == "1g.10gb"')))
    (problem,) = hardware(check(doc))
    assert "fails at runtime on every device of class gpu.nvidia.com (no such key: profile)" in (
        problem.message
    )
    assert "holds only on devices outside this class" in problem.message


def test_clauses_that_hold_apart_but_never_together() -> None:
    both = cel(f'{GPU}.productName == "NVIDIA A10G"', f"{GPU}.memory > 40000")
    (problem,) = hardware(check(claim(request(selectors=both))))
    assert problem.path == "spec.devices.requests[0].exactly.selectors"
    assert "each clause holds on some device of class gpu.nvidia.com, but none on the same" in (
        problem.message
    )


def test_a_class_clause_and_a_request_clause_are_judged_together() -> None:
    # Fine on a MIG device, impossible for the MIG class on a whole-GPU attribute value.
    doc = claim(
        {
            "name": "mig",
            "exactly": {
                "deviceClassName": "mig.nvidia.com",
                "selectors": cel(f'{GPU}.profile == "1g.10gb" && {GPU}.architecture == "Ada"'),
            },
        }
    )
    (problem,) = hardware(check(doc))
    assert '\'device.attributes["gpu.nvidia.com"].architecture == "Ada"\'' in problem.message
    assert "device of class mig.nvidia.com" in problem.message


@pytest.mark.parametrize(
    "expression",
    [
        f'{GPU}.productName == "NVIDIA H100 80GB HBM3"',
        f'{GPU}.profile == "1g.10gb"',  # MIG, through the MIG class below
        f'{GPU}.memory >= 81000 && {GPU}.architecture == "Hopper"',
        f'{GPU}.cudaComputeCapability.isGreaterThan(semver("8.0.0"))',
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
    ],
)
def test_a_selector_some_instance_type_satisfies_is_fine(expression: str) -> None:
    cls = "mig.nvidia.com" if "profile" in expression else "gpu.nvidia.com"
    doc = claim({"name": "r", "exactly": {"deviceClassName": cls, "selectors": cel(expression)}})
    assert hardware(check(doc)) == []


@pytest.mark.parametrize(
    "expression",
    [
        # What differs between two nodes of one type: not judged, whatever it says.
        f'{GPU}.uuid == "GPU-00000000-0000-0000-0000-000000000000"',
        f'{GPU}.driverVersion.isLessThan(semver("1.0.0"))',
        'device.attributes["resource.kubernetes.io"].pciBusID == "0000:00:00.0"',
        # Read in a way the text does not show: not judged.
        f'{GPU}.exists(k, k == "nosuch")',
        # Another driver's devices: not the profiles' to judge.
        'device.driver == "efa.networking.k8s.aws"',
    ],
)
def test_what_varies_per_node_or_cannot_be_read_is_not_judged(expression: str) -> None:
    assert hardware(check(claim(request(selectors=cel(expression))))) == []


def test_a_node_specific_clause_is_dropped_and_the_rest_still_judged() -> None:
    expression = f'{GPU}.driverVersion.isGreaterThan(semver("1.0.0")) && {GPU}.index == 99'
    (problem,) = hardware(check(claim(request(selectors=cel(expression)))))
    assert "'device.attributes[\"gpu.nvidia.com\"].index == 99'" in problem.message
    assert "index there ranges from 0 (" in problem.message


def test_more_devices_than_one_node_has() -> None:
    (problem,) = hardware(check(claim(request(count=16))))
    assert problem.path == "spec.devices.requests[0].exactly.count"
    assert problem.message.startswith("16 is more than one node has: at most 8 devices")
    assert hardware(check(claim(request(count=8)))) == []
    h100 = cel(f'{GPU}.productName == "NVIDIA H100 80GB HBM3"')
    assert hardware(check(claim(request(count=8, selectors=h100)))) == []


def test_an_alternative_never_chosen_warns_and_none_possible_is_an_error() -> None:
    never = {"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 64}
    fine = {"name": "b", "deviceClassName": "gpu.nvidia.com"}
    one = claim({"name": "gpu", "firstAvailable": [never, fine]})
    (warning,) = hardware(check(one))
    assert warning.severity is Severity.WARNING
    assert warning.path == "spec.devices.requests[0].firstAvailable[0].count"
    both = claim({"name": "gpu", "firstAvailable": [never, {**never, "name": "b"}]})
    found = hardware(check(both))
    assert [(p.path, p.severity) for p in found] == [
        ("spec.devices.requests[0].firstAvailable[0].count", Severity.WARNING),
        ("spec.devices.requests[0].firstAvailable[1].count", Severity.WARNING),
        ("spec.devices.requests[0].firstAvailable", Severity.ERROR),
    ]


def test_a_class_in_the_files_that_selects_nothing_is_reported_once_at_the_class() -> None:
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "rtx.example.com"},
        "spec": {"selectors": cel(f'{GPU}.productName == "NVIDIA RTX 6000"')},
    }
    doc = claim({"name": "r", "exactly": {"deviceClassName": "rtx.example.com"}})
    (problem,) = hardware(check(cls, doc))
    assert (problem.obj, problem.path) == (
        "DeviceClass/rtx.example.com",
        "spec.selectors[0].cel.expression",
    )


def test_a_selector_refused_already_gets_no_second_line() -> None:
    typo = claim(request(selectors=cel(f'{GPU}.prodcutName == "x"')))
    problems = check(typo)
    assert [p.check for p in problems] == [Check.DEVICES]


def test_no_false_positive_on_the_examples_and_nvidia_style() -> None:
    files = sorted((ROOT / "charts/examples").glob("*.yaml"))
    files += sorted((ROOT / "tests/data/nvidia-style").glob("*.yaml"))
    sources = [(str(f), f.read_text()) for f in files]
    sources.append(("efa.yaml", (ROOT / "tests/data/efa-deviceclass.yaml").read_text()))
    problems = validate_sources(sources)
    assert [str(p) for p in problems if p.severity is Severity.ERROR] == []
    assert hardware(problems) == []


@pytest.mark.parametrize(
    ("expression", "clauses"),
    [
        ("a && b", ["a", "b"]),
        ("(a && b) && (c)", ["a", "b", "c"]),
        ('"x && y" == s && t', ['"x && y" == s', "t"]),
        ("a || b && c", ["a || b && c"]),  # && binds tighter than ||: no cut
        ("a ? b : c && d", ["a ? b : c && d"]),
        ("f(a && b) && c", ["f(a && b)", "c"]),
        ("(a) || (b && c)", ["(a) || (b && c)"]),
    ],
)
def test_a_selector_is_cut_at_its_top_level_ands(expression: str, clauses: list[str]) -> None:
    assert split_conjuncts(expression) == clauses


def test_what_a_clause_reads() -> None:
    found = reads(f'has({GPU}.numaNode) && "profile" in {GPU} && device.driver == "x"')
    assert found.names == {
        ("gpu.nvidia.com", "numaNode", False),
        ("gpu.nvidia.com", "profile", False),
    }
    assert found.drivers == {"x"} and not found.opaque
    assert reads(f"{GPU}.all(k, true)").opaque
    assert reads('device.attributes[d]["x"] == 1').opaque
