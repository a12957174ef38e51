"""The rules ``validate`` got from holding it against the real kube-apiserver
(tests/e2e/test_validate_oracle.py): each disagreement found there, as a unit test of what
the server does. Upstream's function is named where there is one
(pkg/apis/resource/validation, pkg/apis/core/validation)."""

import copy
from typing import Any

import pytest

from tests.manifest_mutations import base, put
from tools.validation import Check, Problem, Severity, parse_version, validate_sources


def check(doc: dict[str, Any], version: str = "1.36") -> list[Problem]:
    import json

    return validate_sources([("f.yaml", json.dumps(doc))], version=parse_version(version))


def errors(doc: dict[str, Any], version: str = "1.36") -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in check(doc, version) if p.severity is Severity.ERROR]


def edited(name: str, path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    doc = base(name)
    put(doc, path, value)
    return doc


EXACTLY = ("spec", "devices", "requests", 0, "exactly")
TOLERATION = (*EXACTLY, "tolerations", 0)


ACCEPTED = [
    # validateDeviceAllocationMode: 0 is an omitted count, defaulted to 1 (ExactCount) or
    # left unset (All).
    ("count 0", edited("ResourceClaim/exactly", (*EXACTLY, "count"), 0)),
    (
        "count 0 with All",
        edited(
            "ResourceClaim/firstAvailable",
            ("spec", "devices", "requests", 1, "exactly", "count"),
            0,
        ),
    ),
    # An unset toleration operator is defaulted to Equal.
    (
        "toleration without operator",
        edited("ResourceClaim/exactly", TOLERATION, {"key": "k", "value": "v"}),
    ),
    # The toleration list's declared limit of 16 is not enforced.
    (
        "17 tolerations",
        edited(
            "ResourceClaim/exactly",
            (*EXACTLY, "tolerations"),
            [{"key": "k", "operator": "Exists"}] * 17,
        ),
    ),
    # ValidateCSIDriverName lowercases before it checks.
    (
        "driver in capitals",
        edited(
            "ResourceClaim/exactly",
            ("spec", "devices", "config", 0, "opaque", "driver"),
            "GPU.nvidia.com",
        ),
    ),
    # A spec may be left out: the server takes it as empty.
    ("DeviceClass without spec", {k: v for k, v in base("DeviceClass").items() if k != "spec"}),
    ("template without spec.spec", edited("ResourceClaimTemplate", ("spec",), {})),
]


@pytest.mark.parametrize(("what", "doc"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_the_server_accepts(what: str, doc: dict[str, Any]) -> None:
    found = [p for p in check(doc) if p.severity is Severity.ERROR]
    assert [(p.path, p.message) for p in found if p.check is Check.API] == []
    if what == "driver in capitals":
        # Accepted, but the kubelet hands a config only to the driver of that exact name, and
        # the plugin refuses a GpuConfig for another driver on its requests.
        (refused,) = found
        assert refused.check is Check.PLUGIN
        assert "a GpuConfig for driver 'GPU.nvidia.com'" in refused.message
    else:
        assert found == []


def test_match_and_distinct_attribute_both_set_is_a_warning() -> None:
    doc = base("ResourceClaim/exactly")
    doc["spec"]["devices"]["constraints"][0]["distinctAttribute"] = "gpu.nvidia.com/uuid"
    (problem,) = check(doc)
    assert problem.severity is Severity.WARNING
    assert problem.path == "spec.devices.constraints[0].distinctAttribute"


def test_an_attribute_with_two_slashes_passes_the_server_but_matches_nothing() -> None:
    doc = edited("ResourceClaim/exactly", ("spec", "devices", "constraints", 0, "matchAttribute"),
                 "gpu.nvidia.com/a/b")  # fmt: skip
    assert [p for p in check(doc) if p.check is Check.API and p.severity is Severity.ERROR] == []


REFUSED = [
    (
        "name missing",
        edited("Pod", ("metadata",), {"labels": {"a": "b"}}),
        "metadata.name",
        "required",
    ),
    (
        "name not a DNS subdomain",
        edited("Deployment", ("metadata", "name"), "gpu_0"),
        "metadata.name",
        "'gpu_0' must be a DNS subdomain",
    ),
    (
        "Job name over 63",
        edited("Job", ("metadata", "name"), "j" * 64),
        "metadata.name",
        "at most 63 characters, is 64",
    ),
    (
        "label key",
        edited("DeviceClass", ("metadata", "labels"), {"a/b/c": "x"}),
        "metadata.labels",
        "label key 'a/b/c'",
    ),
    (
        "label value",
        edited("ResourceClaim/exactly", ("metadata", "labels"), {"tier": "x" * 64}),
        "metadata.labels.tier",
        "must be at most 63 characters, is 64",
    ),
    (
        "toleration operator near miss",
        edited("ResourceClaim/exactly", (*TOLERATION, "operator"), "EQUAL"),
        "spec.devices.requests[0].exactly.tolerations[0].operator",
        "'EQUAL' must be one of Equal, Exists",
    ),
    (
        "toleration value over 63",
        edited("ResourceClaim/exactly", (*TOLERATION, "value"), "v" * 64),
        "spec.devices.requests[0].exactly.tolerations[0].value",
        "at most 63 characters, is 64",
    ),
    (
        "toleration key",
        edited("ResourceClaim/exactly", (*TOLERATION, "key"), "a/b/c"),
        "spec.devices.requests[0].exactly.tolerations[0].key",
        "no taint key",
    ),
    (
        "count negative",
        edited("ResourceClaim/exactly", (*EXACTLY, "count"), -1),
        "spec.devices.requests[0].exactly.count",
        "-1 is out of range: must be at least 1",
    ),
    (
        "null request reference",
        edited("ResourceClaim/exactly", ("spec", "devices", "config", 0, "requests", 0), None),
        "spec.devices.config[0].requests[0]",
        "must be a request name",
    ),
    (
        "pod claim name twice",
        edited("Pod", ("spec", "resourceClaims", 1, "name"), "gpus"),
        "spec.resourceClaims[1].name",
        "duplicate name 'gpus'",
    ),
    (
        "container lists a claim twice",
        edited(
            "Pod",
            ("spec", "containers", 1, "resources", "claims"),
            [{"name": "shared"}, {"name": "shared"}],
        ),
        "spec.containers[1].resources.claims[1]",
        "duplicate",
    ),
    (
        "container lists a claim and one of its requests",
        edited(
            "Pod",
            ("spec", "containers", 0, "resources", "claims"),
            [{"name": "gpus", "request": "share"}, {"name": "gpus"}],
        ),
        "spec.containers[0].resources.claims[1]",
        "listed already for one of its requests",
    ),
    (
        "request not a DNS label",
        edited(
            "Job",
            ("spec", "template", "spec", "containers", 0, "resources", "claims", 0, "request"),
            "Share",
        ),
        "spec.template.spec.containers[0].resources.claims[0].request",
        "must be a DNS label",
    ),
    (
        "template name not a DNS subdomain",
        edited(
            "Deployment",
            ("spec", "template", "spec", "resourceClaims", 0, "resourceClaimTemplateName"),
            "gpu-",
        ),
        "spec.template.spec.resourceClaims[0].resourceClaimTemplateName",
        "must be a DNS subdomain",
    ),
    (
        "unknown field named in the path",
        edited("DeviceClass", ("spec", "selector"), "x"),
        "spec.selector",
        "unknown field 'selector'; did you mean selectors?",
    ),
]


@pytest.mark.parametrize(("what", "doc", "path", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_server_refuses(what: str, doc: dict[str, Any], path: str, message: str) -> None:
    found = errors(doc)
    assert any(p == path and message in m for p, m in found), found


def test_the_none_effect_is_new_in_1_35() -> None:
    doc = edited("ResourceClaim/exactly", (*TOLERATION, "effect"), "None")
    assert errors(doc, "1.36") == []
    assert errors(doc, "1.34") == [
        (
            "spec.devices.requests[0].exactly.tolerations[0].effect",
            "'None' must be one of NoExecute, NoSchedule (or unset: every effect)",
        )
    ]


def test_admin_access_warns_of_the_namespace_label() -> None:
    doc = copy.deepcopy(base("ResourceClaim/exactly"))
    doc["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    (problem,) = check(doc)
    assert problem.severity is Severity.WARNING
    assert "resource.kubernetes.io/admin-access" in problem.message
