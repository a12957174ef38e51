"""``gpu-dra validate``: schema, the rules the schema lacks, CEL, class references, gates.

Each table case is one claim (or class) with a single defect, and the one problem it must
produce; the clean baseline proves the defect alone causes it.
"""

import copy
import io
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import main
from tools.validation import Check, Problem, Severity, parse_version, validate_sources

CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
}


def claim(**devices: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
    }
    base.update(devices)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": base},
    }


def exactly(**fields: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", **fields}}


def sub(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "deviceClassName": "gpu.nvidia.com", **fields}


def cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def check(*docs: dict[str, Any], version: str = "1.34") -> list[Problem]:
    text = yaml.safe_dump_all(docs)
    return validate_sources([("f.yaml", text)], version=parse_version(version))


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


def fa_claim(*subrequests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return claim(requests=[{"name": "gpu", "firstAvailable": list(subrequests)}], **devices)


OPAQUE = {
    "driver": "gpu.nvidia.com",
    "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
}
TWO = [exactly(), {"name": "pair", "firstAvailable": [sub("h100"), sub("a100", count=2)]}]

# (id, document, expected field path, expected message fragment)
ERRORS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "request name not a DNS label",
        claim(requests=[{"name": "GPU_0", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
        "spec.devices.requests[0].name",
        "must be a DNS label",
    ),
    (
        "duplicate request name",
        claim(requests=[exactly(), exactly()]),
        "spec.devices.requests[1].name",
        "duplicate request name",
    ),
    (
        "both exactly and firstAvailable",
        claim(requests=[{**exactly(), "firstAvailable": [sub("a")]}]),
        "spec.devices.requests[0]",
        "exactly one of exactly and firstAvailable",
    ),
    (
        "neither exactly nor firstAvailable",
        claim(requests=[{"name": "gpu"}]),
        "spec.devices.requests[0]",
        "exactly one of exactly and firstAvailable",
    ),
    (
        # 0 is no count (the server defaults it to 1): a negative one is refused.
        "count negative",
        claim(requests=[exactly(count=-1)]),
        "spec.devices.requests[0].exactly.count",
        "at least 1",
    ),
    (
        "count with allocationMode All",
        claim(requests=[exactly(allocationMode="All", count=2)]),
        "spec.devices.requests[0].exactly.count",
        "must not be set when allocationMode is All",
    ),
    (
        "unknown allocationMode",
        claim(requests=[exactly(allocationMode="Some")]),
        "spec.devices.requests[0].exactly.allocationMode",
        "must be one of ExactCount, All",
    ),
    (
        "33 requests",
        claim(requests=[{**exactly(), "name": f"r{i}"} for i in range(33)]),
        "spec.devices.requests",
        "at most 32 items, has 33",
    ),
    (
        "9 subrequests",
        fa_claim(*(sub(f"s{i}") for i in range(9))),
        "spec.devices.requests[0].firstAvailable",
        "at most 8 items, has 9",
    ),
    (
        "empty firstAvailable",
        fa_claim(),
        "spec.devices.requests[0]",
        "exactly one of exactly and firstAvailable",
    ),
    (
        "subrequest name not a DNS label",
        fa_claim(sub("H100")),
        "spec.devices.requests[0].firstAvailable[0].name",
        "must be a DNS label",
    ),
    (
        "duplicate subrequest name",
        fa_claim(sub("a"), sub("a")),
        "spec.devices.requests[0].firstAvailable[1].name",
        "duplicate subrequest name",
    ),
    (
        "subrequest count negative",
        fa_claim(sub("a", count=-2)),
        "spec.devices.requests[0].firstAvailable[0].count",
        "at least 1",
    ),
    (
        "33 selectors",
        claim(requests=[exactly(selectors=[cel("true")] * 33)]),
        "spec.devices.requests[0].exactly.selectors",
        "at most 32 items, has 33",
    ),
    (
        "selector without cel",
        claim(requests=[exactly(selectors=[{}])]),
        "spec.devices.requests[0].exactly.selectors[0].cel",
        "required",
    ),
    (
        "CEL over 10 KiB",
        claim(requests=[exactly(selectors=[cel("true && " * 1300 + "true")])]),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        "at most 10240 bytes",
    ),
    (
        "CEL syntax error",
        claim(requests=[exactly(selectors=[cel('device.driver == "a" &&')])]),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        "invalid CEL: 1:",
    ),
    (
        "CEL not boolean",
        claim(requests=[exactly(selectors=[cel("device.driver")])]),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        "must evaluate to bool",
    ),
    (
        "CEL unknown function",
        claim(requests=[exactly(selectors=[cel('device.driver.frobnicate() == "x"')])]),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        "invalid CEL",
    ),
    (
        "CEL in a subrequest",
        fa_claim(sub("a", selectors=[cel("device.nosuchfield == 1")])),
        "spec.devices.requests[0].firstAvailable[0].selectors[0].cel.expression",
        "invalid CEL",
    ),
    (
        "constraint names a missing request",
        claim(
            constraints=[{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]
        ),
        "spec.devices.constraints[0].requests[0]",
        "'gpus': no request named 'gpus'; must name one of the claim's requests (gpu)",
    ),
    (
        "constraint names a missing subrequest",
        claim(
            requests=TWO,
            constraints=[
                {"requests": ["pair/b200"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}
            ],
        ),
        "spec.devices.constraints[0].requests[0]",
        "has no subrequest 'b200'; must be one of pair, pair/a100, pair/h100",
    ),
    (
        "subrequest of an exactly request",
        claim(
            constraints=[{"requests": ["gpu/a"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}]
        ),
        "spec.devices.constraints[0].requests[0]",
        "it has no firstAvailable",
    ),
    (
        "constraint without an attribute",
        claim(constraints=[{"requests": ["gpu"]}]),
        "spec.devices.constraints[0]",
        "one of matchAttribute and distinctAttribute must be set",
    ),
    (
        "matchAttribute without domain",
        claim(constraints=[{"matchAttribute": "nvlinkDomain"}]),
        "spec.devices.constraints[0].matchAttribute",
        "must be a fully qualified name",
    ),
    (
        "33 constraints",
        claim(constraints=[{"matchAttribute": "gpu.nvidia.com/nvlinkDomain"}] * 33),
        "spec.devices.constraints",
        "at most 32 items, has 33",
    ),
    (
        "config names a missing request",
        claim(
            config=[
                {
                    "requests": ["gpu", "other"],
                    "opaque": OPAQUE,
                }
            ]
        ),
        "spec.devices.config[0].requests[1]",
        "no request named 'other'",
    ),
    (
        "33 configs",
        claim(config=[{"opaque": OPAQUE}] * 33),
        "spec.devices.config",
        "at most 32 items, has 33",
    ),
    (
        "opaque parameters over 10 KiB",
        claim(config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": "y" * 10300}}}]),
        "spec.devices.config[0].opaque.parameters",
        "at most 10240 bytes",
    ),
    (
        "toleration Exists with a value",
        claim(requests=[exactly(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}])]),
        "spec.devices.requests[0].exactly.tolerations[0].value",
        "'v' must be empty for operator Exists",
    ),
    (
        "schema: unknown field",
        claim(requests=[exactly(cuont=1)]),
        "spec.devices.requests[0].exactly.cuont",
        "unknown field 'cuont'; did you mean count?",
    ),
    (
        "constraint names a request twice",
        claim(
            constraints=[
                {"requests": ["gpu", "gpu"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}
            ]
        ),
        "spec.devices.constraints[0].requests[1]",
        "duplicate entry 'gpu'",
    ),
    (
        "reference with two slashes",
        claim(requests=TWO, config=[{"requests": ["pair/h100/x"], "opaque": OPAQUE}]),
        "spec.devices.config[0].requests[0]",
        "must be a request name or <request>/<subrequest>",
    ),
    (
        "config without opaque",
        claim(config=[{"requests": ["gpu"]}]),
        "spec.devices.config[0].opaque",
        "required",
    ),
    (
        "schema: opaque without parameters",
        claim(config=[{"opaque": {"driver": "gpu.nvidia.com"}}]),
        "spec.devices.config[0].opaque.parameters",
        "required",
    ),
    (
        "claim name not a DNS subdomain",
        {**claim(), "metadata": {"name": "My_Claim"}},
        "metadata.name",
        "must be a DNS subdomain",
    ),
    (
        "schema: wrong type",
        claim(requests=[exactly(count="two")]),
        "spec.devices.requests[0].exactly.count",
        "must be an integer, not 'two'",
    ),
    (
        "schema: adminAccess is not a subrequest field",
        fa_claim(sub("a", adminAccess=True)),
        "spec.devices.requests[0].firstAvailable[0].adminAccess",
        "unknown field 'adminAccess'",
    ),
    (
        "class extendedResourceName in kubernetes.io",
        {**CLASS, "spec": {"extendedResourceName": "kubernetes.io/gpu"}},
        "spec.extendedResourceName",
        "must be an extended resource name",
    ),
    (
        "class selector that does not compile",
        {**CLASS, "spec": {"selectors": [cel("device.driver ==")]}},
        "spec.selectors[0].cel.expression",
        "invalid CEL",
    ),
]


def test_clean_claim_and_class_have_no_problem() -> None:
    assert check(claim(), CLASS) == []
    assert (
        check(
            claim(
                requests=TWO,
                constraints=[
                    {
                        "requests": ["gpu", "pair/h100"],
                        "matchAttribute": "gpu.nvidia.com/nvlinkDomain",
                    }
                ],
            ),
            CLASS,
        )
        == []
    )


@pytest.mark.parametrize(
    ("doc", "path", "fragment"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS]
)
def test_error(doc: dict[str, Any], path: str, fragment: str) -> None:
    # The 1.37 check: no gate warning gets in the way of the one error.
    problem = only([p for p in check(doc, version="1.37") if p.severity is Severity.ERROR])
    assert problem.path == path
    assert fragment in problem.message
    assert problem.obj == f"{doc['kind']}/{doc['metadata']['name']}"


def test_template_paths_start_at_spec_spec() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": claim(requests=[exactly(count=-1)])["spec"]},
    }
    assert only(check(template)).path == "spec.spec.devices.requests[0].exactly.count"


def test_a_class_nobody_defines_is_refused_with_the_closest_name() -> None:
    typo = claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.co"}}])
    problem = only(check(typo))
    assert problem.path == "spec.devices.requests[0].exactly.deviceClassName"
    assert problem.check is Check.REFERENCE and problem.severity is Severity.ERROR
    assert "no DeviceClass 'gpu.nvidia.co' in the chart" in problem.message
    assert "did you mean gpu.nvidia.com?" in problem.message
    # The chart's classes are known without a file; another file's class is known too.
    mig = claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}])
    assert check(mig) == []
    other = claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "example.com"}}])
    mine = {**CLASS, "metadata": {"name": "example.com"}}
    across = validate_sources(
        [("claim.yaml", yaml.safe_dump(other)), ("class.yaml", yaml.safe_dump(mine))]
    )
    assert across == []
    # Classes defined elsewhere: the same line, as a warning.
    demoted = validate_sources([("c.yaml", yaml.safe_dump(typo))], defined_elsewhere=True)
    assert [p.severity for p in demoted] == [Severity.WARNING]


def test_the_chart_classes_are_the_ones_validate_knows() -> None:
    from tests.chart_render import render
    from tools.validation.manifests import CHART_CLASSES

    every = [
        "consumableCapacity.enabled=true",
        "deviceClasses.gpu.extendedResourceName.enabled=true",
        "computeDomains.enabled=true",
    ]
    rendered = {o["metadata"]["name"] for o in render((), every) if o["kind"] == "DeviceClass"}
    assert rendered == CHART_CLASSES


def test_cli_defined_elsewhere_demotes_unknown_names(tmp_path: Path) -> None:
    typo = claim(requests=[{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.co"}}])
    path = write(tmp_path, "typo.yaml", typo)
    code, lines = run([path])
    assert code == 1 and "did you mean gpu.nvidia.com?" in lines[0]
    code, lines = run(["--defined-elsewhere", path])
    assert code == 0 and ": warning: " in lines[0]


GATED: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "distinctAttribute",
        claim(
            requests=[exactly(count=2)], constraints=[{"distinctAttribute": "gpu.nvidia.com/uuid"}]
        ),
        "spec.devices.constraints[0].distinctAttribute",
        "DRAConsumableCapacity",
    ),
    (
        "capacity requests",
        claim(requests=[exactly(capacity={"requests": {"gpu.nvidia.com/memory": "10Gi"}})]),
        "spec.devices.requests[0].exactly.capacity.requests",
        "DRAConsumableCapacity",
    ),
    (
        "allowMultipleAllocations in CEL",
        claim(requests=[exactly(selectors=[cel("device.allowMultipleAllocations")])]),
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        "DRAConsumableCapacity",
    ),
    (
        "extendedResourceName",
        {**CLASS, "spec": {"extendedResourceName": "nvidia.com/gpu"}},
        "spec.extendedResourceName",
        "DRAExtendedResource",
    ),
    (
        "tolerations",
        fa_claim(sub("a", tolerations=[{"key": "k", "operator": "Exists"}])),
        "spec.devices.requests[0].firstAvailable[0].tolerations",
        "DRADeviceTaints",
    ),
]


@pytest.mark.parametrize(("doc", "path", "gate"), [g[1:] for g in GATED], ids=[g[0] for g in GATED])
def test_gated_fields_warn_where_the_gate_is_off_by_default(
    doc: dict[str, Any], path: str, gate: str
) -> None:
    # Sources: pkg/features/kube_features.go: all three gates alpha (off) in 1.34 and 1.35,
    # beta and on by default from 1.36.
    for version in ("1.34", "1.35"):
        problem = only(check(doc, version=version))
        assert problem.severity is Severity.WARNING
        assert problem.path == path
        assert (
            f"needs feature gate {gate}, off by default in Kubernetes {version}" in problem.message
        )
    for version in ("1.36", "1.37"):
        assert check(doc, version=version) == []


def test_unsupported_cel_is_a_warning_not_an_error() -> None:
    doc = claim(
        requests=[
            exactly(
                selectors=[cel('device.attributes["gpu.nvidia.com"].?model.orValue("") == "x"')]
            )
        ]
    )
    problem = only(check(doc))
    assert problem.severity is Severity.WARNING
    assert "not supported by this tool" in problem.message


def test_other_kinds_get_the_schema_only() -> None:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "resourcez": {}}]},
    }
    problem = only(check(pod))
    assert (problem.obj, problem.path) == ("Pod/p", "spec.containers[0].resourcez")
    good = copy.deepcopy(pod)
    del good["spec"]["containers"][0]["resourcez"]
    assert check(good) == []
    crd = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert only(check(crd)).severity is Severity.WARNING


def test_older_api_version_gets_schema_and_a_warning() -> None:
    doc = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "old"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}},
    }
    problem = only(check(doc))
    assert problem.severity is Severity.WARNING
    assert "write resource.k8s.io/v1" in problem.message


def test_broken_yaml_keeps_the_documents_before_it() -> None:
    text = yaml.safe_dump(claim(requests=[exactly(count=-1)])) + "---\nkind: [unclosed\n"
    problems = validate_sources([("f.yaml", text)])
    assert [p.obj for p in problems] == ["ResourceClaim/c", "yaml"]
    assert problems[1].message.startswith("not valid YAML")
    assert problems[1].path.startswith("line ")


def test_non_objects() -> None:
    problems = validate_sources([("f.yaml", "- a list\n---\nname: x\n")])
    assert [(p.obj, p.severity) for p in problems] == [
        ("document 1", Severity.ERROR),
        ("document 2", Severity.ERROR),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.34", (1, 34)),
        ("v1.35.2", (1, 35)),
        ("v1.36.1-eks-113cf36", (1, 36)),
        ("1.37.0", (1, 37)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int]) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize("text", ["1.33", "1.39", "banana", "1", "1.x"])
def test_parse_version_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"1\.34 to 1\.38|not a Kubernetes version"):
        parse_version(text)


# --- the command -------------------------------------------------------------------------

LINE = re.compile(r"^(?P<file>[^:]+): (?P<obj>[^:]+): (?P<path>\S+): (?P<sev>error|warning): .+$")


def run(args: list[str], stdin: str = "") -> tuple[int, list[str]]:
    out = io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with redirect_stdout(out):
            code = main(["validate", *args])
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue().splitlines()


def write(tmp_path: Path, name: str, *docs: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def test_cli_clean_file_exits_0(tmp_path: Path) -> None:
    assert run([write(tmp_path, "ok.yaml", claim(), CLASS)]) == (0, ["2 objects, no problems"])


def test_cli_error_exits_1_with_one_line_per_problem(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", claim(requests=[exactly(count=-1), exactly()]))
    code, lines = run([bad])
    assert code == 1
    assert len(lines) == 2
    for line in lines:
        match = LINE.match(line)
        assert match, line
        assert match["file"] == bad and match["obj"] == "ResourceClaim/c"
    assert lines[0].startswith(
        f"{bad}: ResourceClaim/c: spec.devices.requests[0].exactly.count: error: "
    )


def test_cli_warnings_alone_exit_0_and_version_matters(tmp_path: Path) -> None:
    gated = write(
        tmp_path, "g.yaml", claim(constraints=[{"distinctAttribute": "gpu.nvidia.com/uuid"}])
    )
    code, lines = run([gated])
    assert code == 0 and len(lines) == 1 and ": warning: " in lines[0]
    assert run(["--kubernetes-version", "v1.36.0-eks-1", gated]) == (0, ["1 object, no problems"])


def test_cli_reads_stdin_and_reports_unreadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(["-"], stdin=yaml.safe_dump(claim(requests=[exactly(count=-1)])))
    assert code == 1 and lines[0].startswith("-: ResourceClaim/c: ")
    capsys.readouterr()
    code, lines = run([str(tmp_path / "missing.yaml")])
    # A file that cannot be read is a usage error (2), not a problem in a manifest (1).
    err = capsys.readouterr().err
    assert code == 2 and lines == []
    missing = tmp_path / "missing.yaml"
    assert err == f"gpu-dra validate: {missing}: cannot read: No such file or directory\n"


def test_cli_rejects_unsupported_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(["--kubernetes-version", "1.30", write(tmp_path, "ok.yaml", claim())])
    assert code == 2 and lines == []
    assert "1.34 to 1.38" in capsys.readouterr().err


def test_selector_check_is_injectable() -> None:
    """The rules use whatever compiler they are given: here one that rejects everything."""
    seen: list[str] = []

    def reject(expression: str) -> Any:
        from tools.validation.problems import Finding

        seen.append(expression)
        return Finding("", "rejected")

    problems = validate_sources(
        [("f.yaml", yaml.safe_dump(claim(requests=[exactly(selectors=[cel("true")])])))],
        selector_check=reject,
    )
    assert seen == ["true"] and [p.message for p in problems] == ["rejected"]


def test_a_memory_request_off_the_shared_gpus_step_is_a_warning() -> None:
    doc = claim(requests=[exactly(capacity={"requests": {"gpu.nvidia.com/memory": "20500Mi"}})])
    problem = only(check(doc, version="1.36"))
    assert problem.severity is Severity.WARNING
    assert (
        problem.path == "spec.devices.requests[0].exactly.capacity.requests.gpu.nvidia.com/memory"
    )
    assert "this request consumes 21Gi" in problem.message
    whole = claim(requests=[exactly(capacity={"requests": {"gpu.nvidia.com/memory": "20Gi"}})])
    assert check(whole, version="1.36") == []


@pytest.mark.parametrize(
    ("version", "key", "refused"),
    [
        ((1, 36), "distinctAttribute", False),
        ((1, 37), "distinctAttribute", True),
        ((1, 37), "matchAttribute", False),
    ],
)
def test_a_constraints_domain_case_as_each_api_server_judges_it(
    version: tuple[int, int], key: str, refused: bool
) -> None:
    """1.37's API server refuses 'GPU.nvidia.com/uuid' as a distinctAttribute (its prefix must
    be a lowercase subdomain), which 1.36 took: seen by the validate oracle at 1.37."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "constraints": [{key: "GPU.nvidia.com/uuid"}],
            }
        },
    }
    found = validate_sources([("c.yaml", yaml.safe_dump(claim))], version=version)
    errors = [
        p.message for p in found if p.severity is Severity.ERROR and p.check is not Check.DEVICES
    ]
    path = f"spec.devices.constraints[0].{key}"
    assert [p.path for p in found if "must be lowercase" in p.message] == (
        [path] if refused else []
    )
    assert bool(errors) == refused, errors


@pytest.mark.parametrize("version", [(1, 37), (1, 38)])
def test_two_slashes_and_a_negative_request_as_each_api_server_judges_them(
    version: tuple[int, int],
) -> None:
    """1.38.0-beta.0's API server refuses 'a/b/c' as a constraint's attribute or a capacity
    name, and a capacity request of -1Gi, which 1.37 took: seen by the validate oracle."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "a",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "capacity": {"requests": {"a/b/c": "1Gi", "memory": "-1Gi"}},
                        },
                    }
                ],
                "constraints": [{"matchAttribute": "a/b/c"}],
            }
        },
    }
    found = validate_sources([("c.yaml", yaml.safe_dump(claim))], version=version)
    refused = sorted(
        p.path
        for p in found
        if p.severity is Severity.ERROR
        and ("more than one slash" in p.message or "greater than or equal to 0" in p.message)
    )
    capacity = "spec.devices.requests[0].exactly.capacity.requests"
    expected = [
        f"{capacity}.a/b/c",
        f"{capacity}.memory",
        "spec.devices.constraints[0].matchAttribute",
    ]
    assert refused == (sorted(expected) if version >= (1, 38) else [])
