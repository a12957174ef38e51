"""DeviceTaintRules in ``gpu-dra explain``: the devices a rule selects get its taint, as the
scheduler's ResourceSlice tracker applies it (KEP-5055), and the reason names the rule."""

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.kube.resources import Resource
from driver.kube.rest import ApiError, ForbiddenError, NotFoundError, ServerError
from tests.chart_render import render
from tests.test_allocator import DRIVER, claim, device, device_class, exactly, picked, slice_
from tests.test_explain_cli import discover_yaml, run, write
from tools.allocation import explain_claim, explain_class
from tools.allocation.inputs import TAINT_RULE_VERSIONS, ClusterReadError, _taint_rules
from tools.allocation.taintrules import (
    RULE,
    TaintRuleError,
    apply_taint_rules,
    parse_rules,
)

NIC = ("other.example.com", "n1", "nic-0")
DRAIN = {"key": "gpu.nvidia.com/maintenance", "value": "drain", "effect": "NoSchedule"}


def rule(
    name: str, selector: dict[str, Any] | None, taint: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": taint or DRAIN}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": spec,
    }


def two_nodes() -> list[dict[str, Any]]:
    return [
        slice_("n1", device("gpu-0"), device("gpu-1")),
        slice_("n2", device("gpu-0"), device("gpu-1")),
        slice_("n1", device("nic-0"), driver="other.example.com"),
    ]


def tainted(slices: list[dict[str, Any]] | list[Any]) -> set[tuple[str, str, str]]:
    return {
        (s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])
        for s in slices
        for d in s["spec"]["devices"]
        if d.get("taints")
    }


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        # DeviceTaintSelector: every criterion given must match.
        ({"driver": DRIVER, "pool": "n1", "device": "gpu-1"}, {(DRIVER, "n1", "gpu-1")}),
        ({"driver": DRIVER, "pool": "n1"}, {(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")}),
        # A pool alone selects every driver's devices in it (node-local pools share the name).
        (
            {"pool": "n1"},
            {(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1"), NIC},
        ),
        ({"device": "gpu-0"}, {(DRIVER, "n1", "gpu-0"), (DRIVER, "n2", "gpu-0")}),
        ({"driver": DRIVER, "pool": "n3"}, set()),
        ({"pool": ""}, set()),  # given, so compared: no pool is named ""
        # The empty selector matches every device; no selector matches none.
        ({}, {(DRIVER, p, f"gpu-{i}") for p in ("n1", "n2") for i in (0, 1)} | {NIC}),
        (None, set()),
    ],
)
def test_a_rule_taints_the_devices_its_selector_matches(
    selector: dict[str, Any] | None, expected: set[tuple[str, str, str]]
) -> None:
    slices = two_nodes()
    out = apply_taint_rules(slices, parse_rules([rule("r", selector)]))
    assert tainted(list(out)) == expected
    assert tainted(slices) == set()  # the inputs are not changed
    # A slice no rule touches is passed through, not copied.
    for before, after in zip(slices, out, strict=True):
        assert (before is after) == (not tainted([after]))


def test_rule_taints_follow_the_drivers_own_and_name_their_rule() -> None:
    xid = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    slices = [slice_("n1", device("gpu-0", taints=[xid]))]
    rules = [rule("b-second", {"device": "gpu-0"}), rule("a-first", {"device": "gpu-0"})]
    (out,) = apply_taint_rules(slices, parse_rules(rules))
    taints = out["spec"]["devices"][0]["taints"]
    # The driver's first, then the rules' by name, whatever order they were listed in.
    assert [t.get(RULE) for t in taints] == [None, "a-first", "b-second"]
    assert taints[1] == {**DRAIN, RULE: "a-first"}


def test_a_drained_device_is_refused_with_the_rules_name() -> None:
    slices = [slice_("n1", device("gpu-0"), device("gpu-1"))]
    drain = rule("drain-n1-gpu-0", {"driver": DRIVER, "pool": "n1", "device": "gpu-0"})
    out = explain_claim(
        claim(exactly("gpus", 2)), slices=slices, classes=[device_class()], taint_rules=[drain]
    )
    entry = out.node("n1")
    assert not entry.allocatable
    assert (
        "request gpus: 1 device tainted without a matching toleration [gpu-0 "
        "(gpu.nvidia.com/maintenance=drain:NoSchedule by DeviceTaintRule drain-n1-gpu-0)]"
    ) in entry.reasons
    assert out.advice is not None and "kubectl delete devicetaintrule" in out.advice
    # One GPU asked: the other one is given.
    one = explain_claim(
        claim(exactly("gpus")), slices=slices, classes=[device_class()], taint_rules=[drain]
    )
    assert picked(one) == [("gpus", "gpu-1")]


@pytest.mark.parametrize(
    ("effect", "tolerations", "fits"),
    [
        ("NoSchedule", [], False),
        ("NoExecute", [], False),
        ("None", [], True),  # informational: never blocks
        ("NoSchedule", [{"key": "gpu.nvidia.com/maintenance", "operator": "Exists"}], True),
        ("NoExecute", [{"key": "gpu.nvidia.com/maintenance", "value": "drain"}], True),
        ("NoExecute", [{"operator": "Exists", "effect": "NoSchedule"}], False),
    ],
)
def test_the_claims_tolerations_are_honoured(
    effect: str, tolerations: list[dict[str, str]], fits: bool
) -> None:
    out = explain_claim(
        claim(exactly("gpus", tolerations=tolerations)),
        slices=[slice_("n1", device("gpu-0"))],
        classes=[device_class()],
        taint_rules=[rule("drain", {"pool": "n1"}, {**DRAIN, "effect": effect})],
    )
    assert out.node("n1").allocatable is fits


def test_the_class_listing_says_which_selected_devices_are_drained() -> None:
    listing = explain_class(
        device_class(),
        slices=[slice_("n1", device("gpu-0"), device("gpu-1"))],
        taint_rules=[rule("drain", {"device": "gpu-1"})],
    )
    reasons = {d.device: (d.selected, d.reason) for d in listing.devices}
    assert reasons == {
        "gpu-0": (True, None),
        "gpu-1": (
            True,
            "tainted gpu.nvidia.com/maintenance=drain:NoSchedule by DeviceTaintRule drain",
        ),
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"deviceSelector": {}}, "spec.taint.key is required"),
        ({"taint": {**DRAIN, "effect": "Evict"}}, "spec.taint.effect 'Evict' is not one of"),
        (
            {"taint": DRAIN, "deviceSelector": {"deviceClassName": "gpu.nvidia.com"}},
            "deviceSelector.deviceClassName was removed in Kubernetes 1.35",
        ),
    ],
)
def test_a_rule_that_cannot_be_applied_is_refused(body: dict[str, Any], message: str) -> None:
    bad = {"kind": "DeviceTaintRule", "metadata": {"name": "bad"}, "spec": body}
    with pytest.raises(TaintRuleError, match=f"DeviceTaintRule bad: {message}"):
        parse_rules([bad])


# --- the command line ---------------------------------------------------------------------


@pytest.fixture
def g6e(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    slices = tmp_path / "slices.yaml"
    slices.write_text(discover_yaml("g6e.12xlarge", "g6e-a", capsys))
    four = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "four", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}}]
            }
        },
    }
    drain = rule("drain-g6e-a-gpu-0", {"driver": DRIVER, "pool": "g6e-a", "device": "gpu-0"})
    return {
        "slices": slices,
        "claim": write(tmp_path / "claim.yaml", four),
        "rule": write(tmp_path / "drain.yaml", drain),
    }


def test_rules_from_a_file_or_beside_the_slices(
    g6e: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["-f", str(g6e["claim"]), "--slices", str(g6e["slices"])], capsys)
    assert code == 0, out
    why = "gpu-0 (gpu.nvidia.com/maintenance=drain:NoSchedule by DeviceTaintRule drain-g6e-a-gpu-0)"
    with_flag = ["--slices", str(g6e["slices"]), "--taint-rules", str(g6e["rule"])]
    # `kubectl get resourceslices,devicetaintrules -o yaml`: one file holds both.
    dump = tmp_path / "dump.yaml"
    dump.write_text(g6e["slices"].read_text() + "---\n" + g6e["rule"].read_text())
    for inputs in (with_flag, ["--slices", str(dump)]):
        code, out, _ = run(["-f", str(g6e["claim"]), *inputs], capsys)
        assert code == 1
        assert why in out
        assert "advice: the devices that fit are drained by a DeviceTaintRule" in out


def test_a_rendered_chart_serves_as_the_rules_file(
    g6e: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The chart's deviceTaintRule values, rendered: its rule drains the pool; the rest of the
    chart is ignored, and a file without a rule is refused (a wrong file, not no drain)."""
    values = (
        "deviceTaintRule.enabled=true",
        "deviceTaintRule.pool=g6e-a",
        "deviceTaintRule.device=gpu-2",
    )
    served = ["resource.k8s.io/v1/DeviceTaintRule"]
    chart = tmp_path / "chart.yaml"
    chart.write_text(yaml.safe_dump_all(render((), values, api_versions=served)))
    argv = ["-f", str(g6e["claim"]), "--slices", str(g6e["slices"]), "--taint-rules"]
    code, out, _ = run([*argv, str(chart)], capsys)
    assert code == 1
    assert "gpu-2 (gpu.nvidia.com/maintenance:NoSchedule by DeviceTaintRule gpu-dra" in out
    code, _, err = run([*argv, str(g6e["slices"])], capsys)
    assert code == 2
    assert f"{g6e['slices']}: no DeviceTaintRule in it" in err


# --- reading the cluster's rules ------------------------------------------------------------


class _Api:
    """list_all answering per path: a list of items, or an ApiError to raise."""

    def __init__(self, answers: dict[str, list[dict[str, Any]] | ApiError]) -> None:
        self.answers = answers
        self.paths: list[str] = []

    async def list_all(self, kind: Resource) -> list[dict[str, Any]]:
        path = kind.path()
        self.paths.append(path)
        answer = self.answers[path]
        if isinstance(answer, ApiError):
            raise answer
        return answer


def _path(version: str) -> str:
    return f"/apis/resource.k8s.io/{version}/devicetaintrules"


def _error(cls: type[ApiError], status: int) -> ApiError:
    return cls("x", status=status, verb="list", resource="devicetaintrules")


def test_the_newest_served_version_is_read_and_none_served_means_no_rules() -> None:
    found = [rule("drain", {})]
    # 1.36 with v1beta2 enabled: v1 is not served there.
    api = _Api({_path("v1"): _error(NotFoundError, 404), _path("v1beta2"): found})
    assert asyncio.run(_taint_rules(api)) == (found, None)  # type: ignore[arg-type]
    assert api.paths == [_path("v1"), _path("v1beta2")]
    # 1.36 by default: the scheduler applies no rule, nor does explain.
    none = _Api({_path(v): _error(NotFoundError, 404) for v in TAINT_RULE_VERSIONS})
    assert asyncio.run(_taint_rules(none)) == ([], None)  # type: ignore[arg-type]


def test_rules_forbidden_are_said_and_a_server_error_is_retryable() -> None:
    api = _Api({_path("v1"): _error(ForbiddenError, 403)})
    rules, unread = asyncio.run(_taint_rules(api))  # type: ignore[arg-type]
    assert rules == [] and unread == "list devicetaintrules: HTTP 403"
    failing = _Api({_path("v1"): _error(ServerError, 503)})
    with pytest.raises(ClusterReadError):
        asyncio.run(_taint_rules(failing))  # type: ignore[arg-type]
