import copy
from typing import Any

import pytest

from driver.common.limits import validate_resource_slice


def _slice(devices: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.nvidia.com-0"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "gpu.nvidia.com/model": {"string": "NVIDIA-L40S"},
                        "driverVersion": {"version": "580.95.5"},
                        "index": {"int": i},
                    },
                    "capacity": {"memory": {"value": "48305799168"}},
                }
                for i in range(devices)
            ],
        },
    }


def _errors(mutate: Any, devices: int = 1) -> list[str]:
    obj = copy.deepcopy(_slice(devices))
    mutate(obj)
    return validate_resource_slice(obj)


def test_a_valid_slice_has_no_errors() -> None:
    assert validate_resource_slice(_slice(128)) == []


def _set(*path: str | int, value: Any) -> Any:
    def mutate(obj: dict[str, Any]) -> None:
        target: Any = obj
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "prefix"),
    [
        (_set("spec", "driver", value="GPU_Driver"), "spec.driver:"),
        (_set("spec", "driver", value="a" * 64), "spec.driver:"),
        (_set("spec", "pool", "name", value="a/" + "b" * 253), "spec.pool.name:"),
        (_set("spec", "pool", "name", value="Node_A"), "spec.pool.name:"),
        (_set("spec", "pool", "resourceSliceCount", value=0), "spec.pool.resourceSliceCount:"),
        (_set("spec", "pool", "generation", value=-1), "spec.pool.generation:"),
        (_set("spec", "allNodes", value=True), "spec: exactly one of"),
        (_set("spec", "nodeName", value=""), "spec.nodeName:"),
        (
            _set(
                "spec", "sharedCounters", value=[{"name": "c", "counters": {"m": {"value": "1"}}}]
            ),
            "spec: only one",
        ),
        (_set("spec", "devices", 0, "name", value="GPU_0"), "spec.devices[0].name:"),
        (_set("spec", "devices", 0, "name", value="gpu-0\n"), "spec.devices[0].name:"),
        (
            _set("spec", "devices", 0, "capacity", "memory", "value", value="1Gi\n"),
            "spec.devices[0].capacity[memory].value:",
        ),
        (
            _set("spec", "devices", 0, "attributes", "driverVersion", value={"version": "1.2.3\n"}),
            "spec.devices[0].attributes[driverVersion]",
        ),
        (_set("metadata", "name", value="Bad Name"), "metadata.name:"),
    ],
)
def test_each_rule_names_its_field(mutate: Any, prefix: str) -> None:
    errors = _errors(mutate)
    assert errors and errors[0].startswith(prefix), errors


def test_attribute_value_rules() -> None:
    def mutate(obj: dict[str, Any]) -> None:
        attrs = obj["spec"]["devices"][0]["attributes"]
        attrs["gpu.nvidia.com/model"] = {"string": "x" * 65}
        attrs["driverVersion"] = {"version": "580.95.05"}
        attrs["index"] = {"int": 1, "string": "1"}
        attrs["9lives"] = {"bool": True}
        attrs["Bad_Domain/x"] = {"bool": True}

    errors = _errors(mutate)
    assert any(
        e.startswith("spec.devices[0].attributes[gpu.nvidia.com/model].string:") for e in errors
    )
    assert any(e.startswith("spec.devices[0].attributes[driverVersion].version:") for e in errors)
    assert any(e.startswith("spec.devices[0].attributes[index]: exactly one") for e in errors)
    assert any(e.startswith("spec.devices[0].attributes[9lives]:") for e in errors)
    assert any(e.startswith("spec.devices[0].attributes[Bad_Domain/x]:") for e in errors)


def test_too_many_attributes_and_capacities() -> None:
    def mutate(obj: dict[str, Any]) -> None:
        device = obj["spec"]["devices"][0]
        device["attributes"] = {f"a{i}": {"int": i} for i in range(30)}
        device["capacity"] = {f"c{i}": {"value": "1"} for i in range(3)}

    assert _errors(mutate) == ["spec.devices[0]: 33 attributes and capacities, must not exceed 32"]


def test_device_count_limits() -> None:
    assert _errors(lambda obj: None, devices=129)[0].startswith("spec.devices: 129 devices")
    taint = [{"key": "k", "effect": "NoSchedule"}]
    errors = _errors(_set("spec", "devices", 0, "taints", value=taint), devices=65)
    assert errors == [
        "spec.devices: 65 devices, must have at most 64 when a device has taints, counters "
        "or list attributes"
    ]


def test_duplicate_device_names() -> None:
    errors = _errors(_set("spec", "devices", 1, "name", value="gpu-0"), devices=2)
    assert errors == ["spec.devices[1].name: duplicate device name 'gpu-0'"]


def test_long_qualified_names() -> None:
    errors = _errors(_set("spec", "devices", 0, "attributes", "x" + "y" * 32, value={"int": 1}))
    assert errors and errors[0].startswith("spec.devices[0].attributes[x")
    domain = "d" * 64 + "/x"
    errors = _errors(_set("spec", "devices", 0, "attributes", domain, value={"int": 1}))
    assert errors and "domain" in errors[0]


def test_non_object_input_is_an_error_not_a_crash() -> None:
    assert validate_resource_slice({}) == ["spec: required"]
    errors = validate_resource_slice({"spec": {"devices": "x"}})
    assert "spec.devices: must be a list" in errors
