"""The controller's pure core: upstream's pool-generation rules and semantic comparison."""

import copy
import itertools
from typing import Any

import pytest

from driver.common.quantity import Quantity
from driver.slices.model import generate_name, index_length
from driver.slices.plan import InvalidPoolError, decode_index, plan
from drivers.gpu.model.inventory import Gpu, Inventory
from drivers.gpu.resourceslice import build_resource_slices

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
NODE_UID = "0b5c7f43-1111-2222-3333-444455556666"
_counter = itertools.count(100)


def gpu(minor: int) -> Gpu:
    return Gpu(
        index=minor,
        minor=minor,
        uuid=f"GPU-{minor:08d}-0000-0000-0000-000000000000",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=85520318464,
        pci_bus_id=f"0000:{minor + 16:02x}:00.0",
        pcie_root=f"pci0000:{minor + 16:02x}",
        numa_node=0,
        mig_enabled=False,
    )


def desired(count: int, **kw: Any) -> list[dict[str, Any]]:
    inventory = Inventory("580.95.05", (13, 0), tuple(gpu(i) for i in range(count)))
    return build_resource_slices(inventory, driver_name=DRIVER, node_name=NODE, **kw)


def stored(body: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns for a created/updated body: names, versions, canonical
    quantities and the fields it populates."""
    obj = copy.deepcopy(body)
    meta = obj["metadata"]
    if "uid" not in meta:
        meta.setdefault("name", meta.get("generateName", "") + f"x{next(_counter)}")
        meta["uid"] = f"uid-{meta['name']}"
        meta["creationTimestamp"] = "2026-01-01T00:00:00Z"
    meta["resourceVersion"] = str(next(_counter))
    meta["managedFields"] = [{"manager": "test", "operation": "Update"}]
    for device in obj["spec"].get("devices") or ():
        for cap in (device.get("capacity") or {}).values():
            cap["value"] = respelled(cap["value"])
    return obj


def respelled(text: str) -> str:
    """The same value, spelled differently (as the issue says the server does)."""
    value = Quantity.parse(text).value
    if value.denominator == 1 and value.numerator % (1 << 20) == 0:
        return f"{value.numerator >> 20}Mi"
    return f"{value * 1000}m"


def publish(want: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result = plan(want, [], driver_name=DRIVER, node_name=NODE, node_uid=NODE_UID)
    return [stored(b) for b in result.creates]


def run_plan(want: list[dict[str, Any]], have: list[dict[str, Any]]) -> Any:
    return plan(want, have, driver_name=DRIVER, node_name=NODE, node_uid=NODE_UID)


def test_initial_publish_is_one_create_with_upstream_naming_and_owner() -> None:
    result = run_plan(desired(8), [])
    assert (len(result.deletes), len(result.updates), len(result.creates)) == (0, 0, 1)
    body = result.creates[0]
    # Upstream's generateName prefix, fixed: the server refuses a second slice for index 0.
    assert body["metadata"]["name"] == f"00000-{DRIVER}-{NODE}"
    assert "generateName" not in body["metadata"]
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": True}
    ]
    assert body["spec"]["nodeName"] == NODE
    assert body["spec"]["driver"] == DRIVER
    assert body["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in body["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert result.generations == {NODE: 1}


def test_unchanged_pool_plans_zero_writes_despite_canonical_quantities() -> None:
    have = publish(desired(8))
    # The server spelled the memory capacity its own way.
    assert have[0]["spec"]["devices"][0]["capacity"]["memory"]["value"] == "85520318464000m"
    assert run_plan(desired(8), have).writes == 0


def test_a_changed_quantity_is_a_change() -> None:
    have = publish(desired(8))
    have[0]["spec"]["devices"][3]["capacity"]["memory"]["value"] = "80Gi"
    result = run_plan(desired(8), have)
    assert len(result.updates) == 1


def test_string_attributes_are_compared_as_strings_not_quantities() -> None:
    want = desired(1)
    have = publish(want)
    want[0]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "1000"}
    have[0]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "1k"}
    assert len(run_plan(want, have).updates) == 1


def test_gpu_disappearing_is_one_update_keeping_generation() -> None:
    have = publish(desired(8))
    want = desired(8)
    want[0]["spec"]["devices"].pop(5)
    result = run_plan(want, have)
    assert (len(result.deletes), len(result.updates), len(result.creates)) == (0, 1, 0)
    body = result.updates[0]
    assert body["metadata"]["name"] == have[0]["metadata"]["name"]
    assert body["metadata"]["resourceVersion"] == have[0]["metadata"]["resourceVersion"]
    assert body["spec"]["pool"]["generation"] == 1
    assert "gpu-5" not in [d["name"] for d in body["spec"]["devices"]]
    assert result.generations == {NODE: 1}


def test_pool_of_two_slices_is_two_creates_indexed_in_order() -> None:
    want = desired(130)
    assert len(want) == 2
    result = run_plan(want, [])
    names = [b["metadata"]["name"] for b in result.creates]
    assert names == [f"00000-{DRIVER}-{NODE}", f"00001-{DRIVER}-{NODE}"]
    assert all(b["spec"]["pool"]["resourceSliceCount"] == 2 for b in result.creates)
    assert run_plan(want, [stored(b) for b in result.creates]).writes == 0


def test_one_changed_slice_of_two_keeps_generation_two_bump_it() -> None:
    have = publish(desired(130))
    one = desired(130)
    one[1]["spec"]["devices"].pop()
    result = run_plan(one, have)
    assert len(result.updates) == 1 and result.generations == {NODE: 1}

    both = desired(130)
    both[0]["spec"]["devices"].pop()
    both[1]["spec"]["devices"].pop()
    result = run_plan(both, have)
    assert len(result.updates) == 2
    assert {b["spec"]["pool"]["generation"] for b in result.updates} == {2}


def test_missing_slice_bumps_generation_and_rewrites_every_matched_slice() -> None:
    have = publish(desired(130))
    result = run_plan(desired(130), have[:1])  # slice 1 was deleted behind our back
    assert len(result.creates) == 1 and len(result.updates) == 1
    assert result.creates[0]["metadata"]["name"].startswith("00001-")
    assert result.generations == {NODE: 2}
    assert result.updates[0]["spec"]["pool"]["generation"] == 2


def test_a_name_too_long_to_fix_falls_back_to_generate_name() -> None:
    node = ".".join(["n" * 60] * 4)  # a legal node name; with index and driver, > 253
    inventory = Inventory("580.95.05", (13, 0), (gpu(0),))
    want = build_resource_slices(inventory, driver_name=DRIVER, node_name=node)
    result = plan(want, [], driver_name=DRIVER, node_name=node, node_uid=NODE_UID)
    meta = result.creates[0]["metadata"]
    assert "name" not in meta
    assert meta["generateName"] == f"00000-{DRIVER}-{node}-"


def test_obsolete_slices_are_deleted_first() -> None:
    have = publish(desired(8))
    old_generation = copy.deepcopy(have[0])
    old_generation["metadata"]["name"] = "00000-gpu.nvidia.com-node-1-old"
    old_generation["spec"]["pool"]["generation"] = 0
    unparsable = copy.deepcopy(have[0])
    unparsable["metadata"]["name"] = "node-1-gpu.nvidia.com-0"
    beyond = copy.deepcopy(have[0])
    beyond["metadata"]["name"] = "00003-gpu.nvidia.com-node-1-abc"
    twin = copy.deepcopy(have[0])
    twin["metadata"]["name"] = have[0]["metadata"]["name"] + "z"  # sorts after: loses
    result = run_plan(desired(8), [*have, old_generation, unparsable, beyond, twin])
    assert {d["metadata"]["name"] for d in result.deletes} == {
        old_generation["metadata"]["name"],
        unparsable["metadata"]["name"],
        beyond["metadata"]["name"],
        twin["metadata"]["name"],
    }
    assert result.updates == () and result.creates == ()


def test_pool_no_longer_desired_is_deleted() -> None:
    have = publish(desired(8))
    other = copy.deepcopy(have[0])
    other["spec"]["pool"]["name"] = "old-pool"
    other["metadata"]["name"] = "00000-gpu.nvidia.com-node-1-other"
    result = run_plan(desired(8), [*have, other])
    assert [d["metadata"]["name"] for d in result.deletes] == [other["metadata"]["name"]]
    assert result.writes == 1


def test_driver_requested_generation_wins_and_rewrites_all() -> None:
    have = publish(desired(130))
    result = run_plan(desired(130, generation=7), have)
    assert len(result.updates) == 2
    assert result.generations == {NODE: 7}


def test_generation_never_goes_backwards() -> None:
    have = publish(desired(8))
    have[0]["spec"]["pool"]["generation"] = 9
    assert run_plan(desired(8), have).writes == 0
    want = desired(8)
    want[0]["spec"]["devices"].pop()
    assert run_plan(want, have).updates[0]["spec"]["pool"]["generation"] == 9


def test_resource_slice_count_change_is_a_change() -> None:
    have = publish(desired(8))
    have[0]["spec"]["pool"]["resourceSliceCount"] = 2
    assert len(run_plan(desired(8), have).updates) == 1


def test_taint_time_added_by_server_is_no_difference_and_is_kept() -> None:
    want = desired(2)
    want[0]["spec"]["devices"][0]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
    have = publish(want)
    have[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    assert run_plan(want, have).writes == 0
    want2 = copy.deepcopy(want)
    want2[0]["spec"]["devices"][1]["taints"] = [{"key": "x", "effect": "NoExecute"}]
    body = run_plan(want2, have).updates[0]
    assert body["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z"


def test_taint_time_added_more_than_a_second_apart_differs() -> None:
    want = desired(1)
    taint = {"key": "k", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}
    want[0]["spec"]["devices"][0]["taints"] = [taint]
    have = publish(want)
    have[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:01Z"
    assert run_plan(want, have).writes == 0
    have[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:05Z"
    assert run_plan(want, have).writes == 1


def test_empty_and_absent_fields_are_equal() -> None:
    have = publish(desired(1))
    have[0]["spec"]["devices"][0]["taints"] = []
    have[0]["spec"]["allNodes"] = False
    have[0]["spec"]["sharedCounters"] = []
    assert run_plan(desired(1), have).writes == 0


def test_counter_quantities_compare_by_value() -> None:
    want = desired(1)
    want[0]["spec"]["devices"] = []
    want[0]["spec"]["sharedCounters"] = [
        {"name": "gpu-0-counters", "counters": {"memory": {"value": "85520318464"}}}
    ]
    have = publish(want)
    have[0]["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] = "85520318464000m"
    assert run_plan(want, have).writes == 0


def test_invalid_pools_are_rejected() -> None:
    twice = desired(2)
    twice[0]["spec"]["devices"][1]["name"] = "gpu-0"
    with pytest.raises(InvalidPoolError, match="gpu-0"):
        run_plan(twice, [])
    dangling = desired(1)
    dangling[0]["spec"]["devices"][0]["consumesCounters"] = [
        {"counterSet": "nope", "counters": {"memory": {"value": "1"}}}
    ]
    with pytest.raises(InvalidPoolError, match="nope"):
        run_plan(dangling, [])


def test_empty_inventory_publishes_one_empty_slice() -> None:
    result = run_plan(desired(0), publish(desired(2)))
    assert len(result.updates) == 1
    assert "devices" not in result.updates[0]["spec"]


def test_index_encoding_matches_upstream() -> None:
    assert index_length(1) == 5
    assert index_length(0x100000) == 5
    assert index_length(0x100001) == 6
    assert generate_name(10, 12, DRIVER, NODE) == f"0000a-{DRIVER}-{NODE}-"
    assert decode_index("0000a-gpu.nvidia.com-node-1-xyz", 5) == 10
    assert decode_index("000a-gpu", 5) is None
    assert decode_index("0000g-gpu", 5) is None
    assert decode_index("nodash", 5) is None
