"""The allocator against hand-built ResourceSlices: the scheduler's semantics, case by case.

Expected outcomes follow the stable allocator in kubernetes
staging/src/k8s.io/dynamic-resource-allocation/structured/internal/stable/allocator_stable.go
and its table tests in .../structured/internal/allocatortesting/allocator_testing.go;
each test names the upstream function or case it mirrors.
"""

import datetime
from pathlib import Path
from typing import Any

import pytest

from driver.common.errors import PermanentError
from tools.allocation import Explanation, explain_claim, explain_class

DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"


def device(name: str, taints: list[dict[str, Any]] | None = None, **attrs: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, bool):
            attributes[key] = {"bool": value}
        elif isinstance(value, int):
            attributes[key] = {"int": value}
        else:
            attributes[key] = {"string": value}
    out: dict[str, Any] = {"name": name, "attributes": attributes}
    if taints:
        out["taints"] = taints
    return out


def slice_(
    node: str | None,
    *devices: dict[str, Any],
    pool: str | None = None,
    name: str | None = None,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
    **spec: Any,
) -> dict[str, Any]:
    pool_name = pool or node or "shared"
    body: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool_name, "generation": generation, "resourceSliceCount": count},
        "devices": list(devices),
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{pool_name}-{driver}-{generation}"},
        "spec": body,
    }


def device_class(
    name: str = CLASS, *selectors: str, config: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    exprs = selectors or (f'device.driver == "{DRIVER}"',)
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in exprs]}
    if config:
        spec["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def exactly(
    name: str, count: int = 1, *selectors: str, cls: str = CLASS, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, "count": count, **extra}
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-c"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def allocated_claim(name: str, *devices: tuple[str, str], admin: bool = False) -> dict[str, Any]:
    results = [
        {"request": "r", "driver": DRIVER, "pool": pool, "device": dev, "adminAccess": admin}
        for pool, dev in devices
    ]
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def picked(explanation: Explanation, node: str | None = "n1") -> list[tuple[str, str]]:
    entry = explanation.node(node)
    assert entry.allocatable, entry.reasons
    return [(r.request, r.device) for r in entry.results]


def reasons(explanation: Explanation, node: str | None = "n1") -> str:
    entry = explanation.node(node)
    assert not entry.allocatable, entry.results
    return "\n".join(entry.reasons)


GPUS = [device(f"gpu-{i}", type="gpu") for i in range(3)]


# --- count -----------------------------------------------------------------------------


def test_count_takes_the_first_devices_in_slice_order() -> None:
    # allocateOne: devices are tried in pool/slice/device order; the first solution wins.
    out = explain_claim(
        claim(exactly("gpus", 2)), slices=[slice_("n1", *GPUS)], classes=[device_class()]
    )
    assert picked(out) == [("gpus", "gpu-0"), ("gpus", "gpu-1")]


def test_count_larger_than_the_node_has_says_needed_and_found() -> None:
    out = explain_claim(
        claim(exactly("gpus", 4)), slices=[slice_("n1", *GPUS)], classes=[device_class()]
    )
    assert "request gpus: needed 4, found 3 matching" in reasons(out)


def test_every_node_gets_its_own_answer() -> None:
    slices = [slice_("n1", *GPUS), slice_("n2", GPUS[0])]
    out = explain_claim(claim(exactly("gpus", 2)), slices=slices, classes=[device_class()])
    assert [n.node for n in out.nodes] == ["n1", "n2"]
    assert out.allocatable_nodes == ["n1"]
    assert "needed 2, found 1" in reasons(out, "n2")


# --- allocationMode All ----------------------------------------------------------------


def test_all_takes_every_matching_device() -> None:
    req = {"name": "all", "exactly": {"deviceClassName": CLASS, "allocationMode": "All"}}
    out = explain_claim(claim(req), slices=[slice_("n1", *GPUS)], classes=[device_class()])
    assert picked(out) == [("all", "gpu-0"), ("all", "gpu-1"), ("all", "gpu-2")]


def test_all_fails_when_one_matching_device_is_allocated() -> None:
    # allocator_testing.go "all-devices-some-allocated": no result.
    req = {"name": "all", "exactly": {"deviceClassName": CLASS, "allocationMode": "All"}}
    out = explain_claim(
        claim(req),
        slices=[slice_("n1", *GPUS)],
        classes=[device_class()],
        allocated=[allocated_claim("other", ("n1", "gpu-1"))],
    )
    text = reasons(out)
    assert "allocationMode All needs every matching device (3)" in text
    assert "1 device allocated to other claims [gpu-1]" in text


def test_all_needs_at_least_one_device() -> None:
    # allocateOne: "At least one device is required for 'All' allocation mode."
    req = {"name": "all", "exactly": {"deviceClassName": CLASS, "allocationMode": "All"}}
    out = explain_claim(
        claim(req),
        slices=[slice_("n1", device("nic-0", type="nic"))],
        classes=[device_class(CLASS, 'device.attributes["gpu.nvidia.com"].type == "gpu"')],
    )
    assert "allocationMode All needs at least one matching device, found none" in reasons(out)


def test_all_on_a_node_with_an_incomplete_pool_is_an_error() -> None:
    # allocator_testing.go "all-devices-of-the-incomplete-pool".
    req = {"name": "all", "exactly": {"deviceClassName": CLASS, "allocationMode": "All"}}
    out = explain_claim(claim(req), slices=[slice_("n1", *GPUS, count=2)], classes=[device_class()])
    assert "asks for all devices, but resource pool gpu.nvidia.com/n1 is incomplete" in reasons(out)


# --- pools -----------------------------------------------------------------------------


def test_incomplete_pool_is_skipped_and_another_pool_used() -> None:
    # GatherPools marks IsIncomplete; allocateOne skips such pools for ExactCount.
    slices = [
        slice_("n1", device("gpu-0"), pool="a-incomplete", count=2),
        slice_("n1", device("gpu-9"), pool="b-complete"),
    ]
    out = explain_claim(claim(exactly("gpus")), slices=slices, classes=[device_class()])
    assert [(r.pool, r.device) for r in out.node("n1").results] == [("b-complete", "gpu-9")]


def test_incomplete_pool_alone_gives_a_reason() -> None:
    out = explain_claim(
        claim(exactly("gpus")), slices=[slice_("n1", *GPUS, count=2)], classes=[device_class()]
    )
    text = reasons(out)
    assert (
        "pool gpu.nvidia.com/n1 skipped: incomplete, 1 of 2 slices of generation 1 present" in text
    )
    assert "needed 1, found 0" in text


def test_only_the_highest_generation_counts() -> None:
    # addSlice: a newer generation replaces all slices of the older one.
    slices = [
        slice_("n1", device("old-0"), generation=1, name="s-old"),
        slice_("n1", device("new-0"), generation=2, name="s-new"),
    ]
    out = explain_claim(claim(exactly("gpus", 2)), slices=slices, classes=[device_class()])
    assert "needed 2, found 1" in reasons(out)
    out = explain_claim(claim(exactly("gpus")), slices=slices, classes=[device_class()])
    assert picked(out) == [("gpus", "new-0")]


def test_duplicate_device_names_make_a_pool_invalid() -> None:
    slices = [
        slice_("n1", device("gpu-0"), name="s1", count=2),
        slice_("n1", device("gpu-0"), name="s2", count=2),
    ]
    out = explain_claim(claim(exactly("gpus")), slices=slices, classes=[device_class()])
    assert "skipped: invalid (duplicate device name gpu-0)" in reasons(out)
    # Twice in one slice (the API server refuses it; a hand-written file may not).
    alone = [slice_("n1", device("gpu-0"), device("gpu-1"), device("gpu-0"), name="s1")]
    out = explain_claim(claim(exactly("gpus")), slices=alone, classes=[device_class()])
    assert "skipped: invalid (duplicate device name gpu-0)" in reasons(out)


def test_all_nodes_pool_is_seen_by_every_node_and_leaves_no_node_selector() -> None:
    slices = [slice_(None, device("shared-0"), pool="net", allNodes=True), slice_("n1", GPUS[0])]
    out = explain_claim(
        claim(
            exactly("gpus", 1, 'device.attributes["gpu.nvidia.com"].type == "gpu"'),
            exactly("any", 1),
        ),
        slices=slices,
        classes=[device_class()],
    )
    entry = out.node("n1")
    assert [(r.pool, r.device) for r in entry.results] == [("n1", "gpu-0"), ("net", "shared-0")]
    # One node-local device pins the claim to the node (createNodeSelector).
    assert entry.allocation is not None
    assert entry.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "n1"
    ]


def test_node_selector_pools_follow_node_labels() -> None:
    selector = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
        ]
    }
    slices = [
        slice_(None, device("x-0"), pool="zonal", nodeSelector=selector),
        slice_("n1", device("local")),
        slice_("n2", device("local")),
    ]
    req = exactly("x", 1, 'device.attributes["gpu.nvidia.com"].x == 1')
    slices[0]["spec"]["devices"][0]["attributes"] = {"x": {"int": 1}}
    slices[1]["spec"]["devices"][0]["attributes"] = {"x": {"int": 0}}
    slices[2]["spec"]["devices"][0]["attributes"] = {"x": {"int": 0}}
    out = explain_claim(
        claim(req),
        slices=slices,
        classes=[device_class()],
        node_labels={"n1": {"zone": "a"}, "n2": {"zone": "b"}},
    )
    assert out.allocatable_nodes == ["n1"]
    allocation = out.node("n1").allocation
    assert allocation is not None
    assert allocation["nodeSelector"] == selector


# --- firstAvailable --------------------------------------------------------------------


def first_available(*subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": "gpus", "firstAvailable": list(subs)}


def test_first_available_falls_back_in_order() -> None:
    big = {"name": "big", "deviceClassName": CLASS, "count": 8}
    small = {"name": "small", "deviceClassName": CLASS, "count": 2}
    out = explain_claim(
        claim(first_available(big, small)), slices=[slice_("n1", *GPUS)], classes=[device_class()]
    )
    assert picked(out) == [("gpus/small", "gpu-0"), ("gpus/small", "gpu-1")]


def test_first_available_prefers_the_first_alternative() -> None:
    one = {"name": "one", "deviceClassName": CLASS, "count": 1}
    two = {"name": "two", "deviceClassName": CLASS, "count": 2}
    out = explain_claim(
        claim(first_available(one, two)), slices=[slice_("n1", *GPUS)], classes=[device_class()]
    )
    assert picked(out) == [("gpus/one", "gpu-0")]


def test_first_available_failing_lists_every_alternative() -> None:
    big = {"name": "big", "deviceClassName": CLASS, "count": 8}
    huge = {"name": "huge", "deviceClassName": CLASS, "count": 9}
    out = explain_claim(
        claim(first_available(big, huge)), slices=[slice_("n1", *GPUS)], classes=[device_class()]
    )
    text = reasons(out)
    assert "request gpus/big: needed 8, found 3 matching" in text
    assert "request gpus/huge: needed 9, found 3 matching" in text


def test_constraint_naming_a_request_covers_its_subrequests() -> None:
    # matchAttributeConstraint.matches: the parent name covers "req/sub".
    devices = [
        device("gpu-0", domain="x"),
        device("gpu-1", domain="y"),
        device("gpu-2", domain="y"),
    ]
    sub = {"name": "pair", "deviceClassName": CLASS, "count": 2}
    out = explain_claim(
        claim(
            first_available(sub),
            constraints=[{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/domain"}],
        ),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("gpus/pair", "gpu-1"), ("gpus/pair", "gpu-2")]


# --- constraints -----------------------------------------------------------------------


def test_match_attribute_picks_devices_sharing_the_value() -> None:
    devices = [device("gpu-0", numa=0), device("gpu-1", numa=1), device("gpu-2", numa=1)]
    out = explain_claim(
        claim(exactly("gpus", 2), constraints=[{"matchAttribute": "gpu.nvidia.com/numa"}]),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("gpus", "gpu-1"), ("gpus", "gpu-2")]


def test_match_attribute_unmet_names_the_attribute_and_largest_group() -> None:
    devices = [device("gpu-0", numa=0), device("gpu-1", numa=1), device("gpu-2", numa=2)]
    out = explain_claim(
        claim(exactly("gpus", 2), constraints=[{"matchAttribute": "gpu.nvidia.com/numa"}]),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert (
        "matchAttribute gpu.nvidia.com/numa (requests: all requests): no value is shared by "
        "2 devices for request gpus (largest group: 1 with gpu.nvidia.com/numa=0)"
    ) in reasons(out)


def test_device_lacking_the_match_attribute_cannot_satisfy_it() -> None:
    # matchAttributeConstraint.add: "Constraint not satisfied, attribute not set".
    devices = [device("gpu-0"), device("gpu-1", numa=1)]
    out = explain_claim(
        claim(exactly("gpus", 1), constraints=[{"matchAttribute": "gpu.nvidia.com/numa"}]),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("gpus", "gpu-1")]


def test_short_attribute_name_matches_in_the_drivers_domain() -> None:
    # lookupAttribute: "gpu.nvidia.com/numa" finds the bare "numa" of a gpu.nvidia.com device.
    devices = [device("gpu-0", numa=3), device("gpu-1", numa=3)]
    out = explain_claim(
        claim(exactly("gpus", 2), constraints=[{"matchAttribute": "gpu.nvidia.com/numa"}]),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert len(picked(out)) == 2


def test_distinct_attribute_spreads_devices() -> None:
    # experimental constraint.go distinctAttributeConstraint: no value twice.
    devices = [device(f"gpu-{i}", numa=i // 2) for i in range(4)]
    out = explain_claim(
        claim(exactly("gpus", 2), constraints=[{"distinctAttribute": "gpu.nvidia.com/numa"}]),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("gpus", "gpu-0"), ("gpus", "gpu-2")]
    out = explain_claim(
        claim(exactly("gpus", 3), constraints=[{"distinctAttribute": "gpu.nvidia.com/numa"}]),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert "only 2 distinct values among devices for request gpus, needed 3" in reasons(out)


def test_backtracking_revisits_an_earlier_request() -> None:
    # The first choice for "a" (gpu-0, domain x) leaves "b" no device in domain x; the
    # search must go back and give "a" gpu-1 so that "b" can take gpu-2 (allocateOne).
    devices = [
        device("gpu-0", domain="x", kind="small"),
        device("gpu-1", domain="y", kind="small"),
        device("gpu-2", domain="y", kind="big"),
    ]
    out = explain_claim(
        claim(
            exactly("a", 1),
            exactly("b", 1, 'device.attributes["gpu.nvidia.com"].kind == "big"'),
            constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/domain"}],
        ),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("a", "gpu-1"), ("b", "gpu-2")]
    assert out.node("n1").steps > 3  # it did try gpu-0 for "a" first


def test_backtracking_when_a_greedy_first_request_starves_the_second() -> None:
    # "a" takes any two devices; greedily it would take both big ones and leave "b" none.
    devices = [device(f"big-{i}", kind="big") for i in range(2)]
    devices += [device(f"small-{i}", kind="small") for i in range(2)]
    out = explain_claim(
        claim(
            exactly("a", 2), exactly("b", 2, 'device.attributes["gpu.nvidia.com"].kind == "big"')
        ),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("a", "small-0"), ("a", "small-1"), ("b", "big-0"), ("b", "big-1")]


def test_unsatisfiable_combination_reports_values_per_request() -> None:
    devices = [device("gpu-0", domain="x", kind="small"), device("gpu-1", domain="y", kind="big")]
    out = explain_claim(
        claim(
            exactly("a", 1, 'device.attributes["gpu.nvidia.com"].kind == "small"'),
            exactly("b", 1, 'device.attributes["gpu.nvidia.com"].kind == "big"'),
            constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/domain"}],
        ),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    text = reasons(out)
    assert "no combination of devices satisfies all requests and constraints together" in text
    assert "values per request: a: x (x1); b: y (x1)" in text


# --- taints ----------------------------------------------------------------------------


TAINT = {"key": "example.com/unhealthy", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("taint", "tolerations", "expected"),
    [
        # taintPreventsAllocation: only NoSchedule/NoExecute block; None never does.
        (TAINT, [], "gpu-1"),
        ({**TAINT, "effect": "NoExecute"}, [], "gpu-1"),
        ({**TAINT, "effect": "None"}, [], "gpu-0"),
        # resourceclaim.ToleratesTaint: Exists matches any value, Equal needs the value.
        (TAINT, [{"key": "example.com/unhealthy", "operator": "Exists"}], "gpu-0"),
        (TAINT, [{"key": "example.com/unhealthy", "operator": "Equal", "value": "true"}], "gpu-0"),
        (TAINT, [{"key": "example.com/unhealthy", "value": "false"}], "gpu-1"),
        # Empty key with Exists tolerates everything; an effect must match when given.
        (TAINT, [{"operator": "Exists"}], "gpu-0"),
        (TAINT, [{"operator": "Exists", "effect": "NoExecute"}], "gpu-1"),
    ],
)
def test_taints_and_tolerations(
    taint: dict[str, str], tolerations: list[dict[str, str]], expected: str
) -> None:
    devices = [device("gpu-0", taints=[taint]), device("gpu-1")]
    out = explain_claim(
        claim(exactly("gpus", 1, tolerations=tolerations)),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    assert picked(out) == [("gpus", expected)]


def test_untolerated_taint_is_a_reason_and_tolerations_land_in_the_result() -> None:
    devices = [device("gpu-0", taints=[TAINT])]
    out = explain_claim(
        claim(exactly("gpus")), slices=[slice_("n1", *devices)], classes=[device_class()]
    )
    assert (
        "1 device tainted without a matching toleration "
        "[gpu-0 (example.com/unhealthy=true:NoSchedule)]"
    ) in reasons(out)
    toleration = {"key": "example.com/unhealthy", "operator": "Exists"}
    out = explain_claim(
        claim(exactly("gpus", tolerations=[toleration])),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
    )
    allocation = out.node("n1").allocation
    assert allocation is not None
    assert allocation["devices"]["results"][0]["tolerations"] == [toleration]


# --- allocated devices -----------------------------------------------------------------


def test_devices_allocated_to_other_claims_are_skipped() -> None:
    out = explain_claim(
        claim(exactly("gpus", 2)),
        slices=[slice_("n1", *GPUS)],
        classes=[device_class()],
        allocated=[allocated_claim("other", ("n1", "gpu-0"))],
    )
    assert picked(out) == [("gpus", "gpu-1"), ("gpus", "gpu-2")]


def test_all_taken_says_which_claims_hold_them() -> None:
    out = explain_claim(
        claim(exactly("gpus", 2)),
        slices=[slice_("n1", *GPUS)],
        classes=[device_class()],
        allocated=[allocated_claim("other", ("n1", "gpu-0"), ("n1", "gpu-1"))],
    )
    text = reasons(out)
    assert "2 devices allocated to other claims [gpu-0, gpu-1]" in text
    assert "needed 2, found 1 matching" in text


def test_admin_access_ignores_other_claims_and_admin_results_take_nothing() -> None:
    # allocator_testing.go "count-devices-some-allocated-admin-access"; the scheduler's
    # foreachAllocatedDevice (plugins/dynamicresources) skips results with adminAccess.
    out = explain_claim(
        claim(exactly("gpus", 2, adminAccess=True)),
        slices=[slice_("n1", *GPUS)],
        classes=[device_class()],
        allocated=[allocated_claim("other", ("n1", "gpu-0"))],
    )
    assert picked(out) == [("gpus", "gpu-0"), ("gpus", "gpu-1")]
    allocation = out.node("n1").allocation
    assert allocation is not None
    assert allocation["devices"]["results"][0]["adminAccess"] is True
    out = explain_claim(
        claim(exactly("gpus", 3)),
        slices=[slice_("n1", *GPUS)],
        classes=[device_class()],
        allocated=[allocated_claim("monitor", ("n1", "gpu-0"), admin=True)],
    )
    assert len(picked(out)) == 3


def test_the_claim_itself_does_not_count_as_taking_its_devices() -> None:
    me = claim(exactly("gpus", 3))
    me["status"] = allocated_claim("c", ("n1", "gpu-0"))["status"]
    out = explain_claim(me, slices=[slice_("n1", *GPUS)], classes=[device_class()], allocated=[me])
    assert len(picked(out)) == 3


# --- selectors -------------------------------------------------------------------------


def test_class_selector_rejections_are_counted_with_the_cel_result() -> None:
    cls = device_class(CLASS, 'device.attributes["gpu.nvidia.com"].type == "gpu"')
    devices = [device(f"nic-{i}", type="nic") for i in range(8)]
    out = explain_claim(claim(exactly("gpus")), slices=[slice_("n1", *devices)], classes=[cls])
    assert (
        "request gpus: 8 devices rejected by class gpu.nvidia.com selector #0 "
        '(device.attributes["gpu.nvidia.com"].type == "gpu"): false'
    ) in reasons(out)


def test_request_selector_error_stops_allocation_when_reached() -> None:
    # selectorsMatch: a CEL runtime error is returned by Allocate for this node.
    devices = [device("gpu-0"), device("gpu-1", mem=10)]
    req = exactly("gpus", 1, 'device.attributes["gpu.nvidia.com"].mem > 5')
    out = explain_claim(claim(req), slices=[slice_("n1", *devices)], classes=[device_class()])
    text = reasons(out)
    assert "request gpus selector #0" in text
    assert "CEL runtime error: no such key" in text
    assert "allocation stopped on this node at device gpu-0" in text
    # Allocate's error, told apart from a mere no-fit (the oracle test compares it).
    error = out.node("n1").error
    assert error is not None
    assert "CEL runtime error" in error


def test_a_claim_that_does_not_fit_is_no_error() -> None:
    out = explain_claim(
        claim(exactly("gpus", 4)), slices=[slice_("n1", *GPUS)], classes=[device_class()]
    )
    assert out.node("n1").error is None
    assert "needed 4" in reasons(out)


def _per_device_slice(*devices: dict[str, Any]) -> dict[str, Any]:
    return slice_(None, *devices, pool="spread", perDeviceNodeSelection=True)


def test_per_device_node_selection_picks_only_devices_for_the_node() -> None:
    # incubating isSelectable: NodeMatches on the device's nodeName/allNodes/nodeSelector.
    devices = [
        {**device("gpu-0"), "nodeName": "n2"},
        {**device("gpu-1"), "nodeName": "n1"},
        {**device("gpu-2"), "allNodes": True},
    ]
    out = explain_claim(
        claim(exactly("gpus", 2)), slices=[_per_device_slice(*devices)], classes=[device_class()]
    )
    assert picked(out, "n1") == [("gpus", "gpu-1"), ("gpus", "gpu-2")]
    assert picked(out, "n2") == [("gpus", "gpu-0"), ("gpus", "gpu-2")]


def test_selector_error_on_another_nodes_device_stops_allocation() -> None:
    # Found by the reference oracle (tests/oracles): the scheduler runs the selectors of a
    # per-device slice's device before checking its node, so gpu-0 (on n2, no "mem") fails
    # the claim on n1 too.
    devices = [{**device("gpu-0"), "nodeName": "n2"}, {**device("gpu-1", mem=10), "nodeName": "n1"}]
    req = exactly("gpus", 1, 'device.attributes["gpu.nvidia.com"].mem > 5')
    slices = [_per_device_slice(*devices)]
    out = explain_claim(claim(req), slices=slices, classes=[device_class()])
    assert out.node("n1").error is not None
    assert "allocation stopped on this node at device spread/gpu-0" in reasons(out, "n1")
    # All mode evaluates the same devices first.
    every = {
        "name": "gpus",
        "exactly": {
            "deviceClassName": CLASS,
            "allocationMode": "All",
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].mem > 5'}}],
        },
    }
    out = explain_claim(claim(every), slices=slices, classes=[device_class()])
    assert out.node("n1").error is not None


def test_selector_error_on_a_device_never_reached_does_not_matter() -> None:
    # The scheduler evaluates lazily: a solution found before gpu-1 is returned.
    devices = [device("gpu-0", mem=10), device("gpu-1")]
    req = exactly("gpus", 1, 'device.attributes["gpu.nvidia.com"].mem > 5')
    out = explain_claim(claim(req), slices=[slice_("n1", *devices)], classes=[device_class()])
    assert picked(out) == [("gpus", "gpu-0")]


@pytest.mark.parametrize(
    ("classes", "requests", "expected"),
    [
        # allocator_testing.go "unknown-class" / "empty-class".
        ([], [exactly("gpus", cls="missing")], "request gpus: device class missing not found"),
        ([device_class()], [exactly("gpus", cls="")], "request gpus: missing device class name"),
        ([device_class(CLASS, "device.driver ==")], [exactly("gpus")], "CEL compile error"),
        ([device_class()], [exactly("gpus", 33)], "exceeds the claim limit of 32"),
        ([device_class()], [{"name": "gpus"}], "neither exactly nor firstAvailable"),
        ([device_class()], [exactly("gpus", count="four")], "malformed claim spec"),  # type: ignore[arg-type]
    ],
)
def test_claim_level_problems_fail_every_node(
    classes: list[dict[str, Any]], requests: list[dict[str, Any]], expected: str
) -> None:
    out = explain_claim(claim(*requests), slices=[slice_("n1", *GPUS)], classes=classes)
    assert out.problems and expected in out.problems[0]
    assert expected in reasons(out)
    assert out.node("n1").error == out.problems[0]


def test_malformed_slice_is_a_clear_permanent_error() -> None:
    broken = slice_("n1", *GPUS)
    del broken["spec"]["pool"]
    with pytest.raises(PermanentError, match=r"spec\.driver and spec\.pool\.name required"):
        explain_claim(claim(exactly("gpus")), slices=[broken], classes=[device_class()])


def test_search_budget_bounds_the_work() -> None:
    devices = [device(f"gpu-{i}", group=i % 8) for i in range(16)]
    out = explain_claim(
        claim(
            exactly("a", 2),
            exactly("b", 2),
            constraints=[{"distinctAttribute": "gpu.nvidia.com/group"}],
        ),
        slices=[slice_("n1", *devices)],
        classes=[device_class()],
        budget=3,
    )
    assert "search budget exceeded (3 steps)" in reasons(out)


# --- status.allocation -----------------------------------------------------------------


def test_allocation_carries_class_and_claim_config_like_the_scheduler() -> None:
    opaque_class = {"opaque": {"driver": DRIVER, "parameters": {"from": "class"}}}
    opaque_claim = {"opaque": {"driver": DRIVER, "parameters": {"from": "claim"}}}
    cls = device_class(CLASS, config=[opaque_class])
    out = explain_claim(
        claim(
            exactly("a"),
            first_available({"name": "s", "deviceClassName": CLASS}),
            config=[{"requests": ["gpus/s"], **opaque_claim}, opaque_claim],
        ),
        slices=[slice_("n1", *GPUS)],
        classes=[cls],
    )
    allocation = out.node("n1").allocation
    assert allocation == {
        "devices": {
            "results": [
                {"request": "a", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                {"request": "gpus/s", "driver": DRIVER, "pool": "n1", "device": "gpu-1"},
            ],
            "config": [
                # One class config for both requests: "requests" cleared, as it covers all.
                {"source": "FromClass", **opaque_class},
                {"source": "FromClaim", "requests": ["gpus/s"], **opaque_claim},
                {"source": "FromClaim", **opaque_claim},
            ],
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }


def test_template_and_json_shape() -> None:
    template = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {"spec": claim(exactly("gpus"))["spec"]},
    }
    out = explain_claim(template, slices=[slice_("n1", *GPUS)], classes=[device_class()])
    body = out.to_json()
    assert body["claim"] == {"kind": "ResourceClaimTemplate", "namespace": "ml", "name": "t"}
    assert body["summary"] == {"nodes": 1, "allocatable": 1}
    assert body["nodes"][0]["results"] == [
        {"request": "gpus", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}
    ]
    assert set(body["nodes"][0]) == {"node", "allocatable", "results", "reasons", "allocation"}


# --- class listing ---------------------------------------------------------------------


def test_class_listing_says_why_each_device_is_rejected() -> None:
    cls = device_class(CLASS, 'device.attributes["gpu.nvidia.com"].type == "gpu"')
    slices = [slice_("n1", device("gpu-0", type="gpu"), device("nic-0", type="nic"), device("odd"))]
    listing = explain_class(cls, slices=slices)
    verdicts = {d.device: (d.selected, d.reason) for d in listing.devices}
    assert verdicts["gpu-0"] == (True, None)
    assert verdicts["nic-0"][0] is False
    assert verdicts["nic-0"][1] is not None and verdicts["nic-0"][1].endswith(": false")
    assert verdicts["odd"][1] is not None and "CEL runtime error" in verdicts["odd"][1]


def test_the_diagnostics_example_tolerates_an_xid_but_not_a_lost_gpu() -> None:
    """charts/examples/diagnostics-tolerates-xid.yaml against the driver's own taints."""
    import yaml

    from drivers.gpu.model.devicehealth import GPU_LOST_KEY, XID_KEY

    path = Path(__file__).resolve().parent.parent / "charts/examples/diagnostics-tolerates-xid.yaml"
    template = next(
        d for d in yaml.safe_load_all(path.read_text()) if d["kind"].endswith("Template")
    )
    xid = {"key": XID_KEY, "value": "79", "effect": "NoSchedule"}
    lost = {"key": GPU_LOST_KEY, "value": "", "effect": "NoSchedule"}
    classes = [device_class("gpu.nvidia.com")]
    out = explain_claim(template, slices=[slice_("n1", device("gpu-0", [xid]))], classes=classes)
    assert picked(out) == [("gpu", "gpu-0")]
    out = explain_claim(template, slices=[slice_("n1", device("gpu-0", [lost]))], classes=classes)
    assert not out.node("n1").allocatable
    assert f"[gpu-0 ({GPU_LOST_KEY}:NoSchedule)]" in reasons(out)
    # Without the toleration the XID taint is the reason, by name.
    plain = claim(exactly("gpu", cls="gpu.nvidia.com"))
    out = explain_claim(plain, slices=[slice_("n1", device("gpu-0", [xid]))], classes=classes)
    assert f"[gpu-0 ({XID_KEY}=79:NoSchedule)]" in reasons(out)


def test_nodes_with_values_a_shape_cannot_hold_are_each_searched() -> None:
    # YAML reads an unquoted 2024-01-01 as a date, which marshal cannot write: such a node
    # gets no shape and its own search, with the same answer.
    slices = [
        slice_(node, device("gpu-0", model="a"), device("gpu-1", model="b"))
        for node in ("n1", "n2")
    ]
    for s in slices:
        s["spec"]["devices"][0]["attributes"]["built"] = {"string": datetime.date(2024, 1, 1)}
    selector = 'has(device.attributes["gpu.nvidia.com"].built) == false'
    out = explain_claim(
        claim(exactly("gpus", 1, selector)), slices=slices, classes=[device_class()]
    )
    assert [(n.node, [r.device for r in n.results]) for n in out.nodes] == [
        ("n1", ["gpu-1"]),
        ("n2", ["gpu-1"]),
    ]


def test_twin_nodes_that_differ_in_a_field_beside_the_attributes_get_their_own_outcomes() -> None:
    # A node's shape compares its devices' other fields with ==: a capacity, a taint that
    # only some devices have, are told apart.
    def gpu(name: str, gib: int, **extra: Any) -> dict[str, Any]:
        return {**device(name, type="gpu"), "capacity": {"memory": {"value": f"{gib}Gi"}}, **extra}

    taint = {"key": "broken", "effect": "NoSchedule"}
    slices = [
        slice_("n1", gpu("gpu-0", 80), gpu("gpu-1", 80)),
        slice_("n2", gpu("gpu-0", 40), gpu("gpu-1", 80)),
        slice_("n3", gpu("gpu-0", 80), gpu("gpu-1", 80)),
        slice_("n4", gpu("gpu-0", 80, taints=[taint]), gpu("gpu-1", 80)),
        slice_("n5", gpu("gpu-0", 40), gpu("gpu-1", 40)),
    ]
    out = explain_claim(
        claim(exactly("gpus", 1, capacity={"requests": {"memory": "48Gi"}})),
        slices=slices,
        classes=[device_class()],
    )
    assert [(n.node, [r.device for r in n.results]) for n in out.nodes] == [
        ("n1", ["gpu-0"]),
        ("n2", ["gpu-1"]),
        ("n3", ["gpu-0"]),
        ("n4", ["gpu-1"]),
        ("n5", []),
    ]
    assert "request gpus: needed 1, found 0 matching" in reasons(out, "n5")


def test_a_device_that_is_not_an_object_is_a_clear_permanent_error() -> None:
    broken = slice_("n1", *GPUS)
    broken["spec"]["devices"].append("gpu-9")
    with pytest.raises(PermanentError, match=r"ResourceSlice n1-gpu.nvidia.com-1: malformed"):
        explain_claim(claim(exactly("gpus")), slices=[broken], classes=[device_class()])
