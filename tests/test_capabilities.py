"""The capability guard against the local API server with feature gates switched off.

The server drops gated fields silently, as the real one does; without the guard a
kind that uses them is rewritten on every event. Here a second kind of slice (GPUs
with a taint, a counter, multiple allocations) goes through the real controller.
"""

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from driver.kube import client as kubeclient
from driver.kube.rest import Client, RejectedError
from driver.kube.session import Session
from driver.slices import SliceController
from driver.slices.capabilities import (
    EFFECT_NONE,
    GATED_FIELDS,
    fit,
    probe,
    probe_slices,
    uses_gated_fields,
)
from drivers.gpu.resourceslice import build_devices
from sandbox.apiserver import LocalApiServer
from tests.test_controller import DRIVER, NODE, Hardware

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
TIMEOUT = 10.0
ALL_GATES = [g.gate for g in GATED_FIELDS]


async def served(gates: dict[str, bool], version: str = "1.34.0") -> tuple[LocalApiServer, Session]:
    server = LocalApiServer(bookmark_interval=0.2, feature_gates=gates, version=version)
    await server.start()
    server.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return server, Session(k8s.Configuration(host=server.url))


@pytest.fixture
async def gated() -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[LocalApiServer, Session]] = []

    async def open_server(version: str = "1.34.0", **gates: bool) -> tuple[LocalApiServer, Session]:
        pair = await served(gates, version)
        opened.append(pair)
        return pair

    yield open_server
    for server, api in opened:
        await kubeclient.close(api)
        await server.stop()


# ---- the local API server: dryRun and gates -------------------------------------------------


async def test_dry_run_create_checks_and_stores_nothing(gated: Callable[..., Any]) -> None:
    server, api = await gated()
    body = probe_slices(DRIVER, NODE)["DRADeviceTaints"]
    answer = await Client(api).request(
        "POST",
        SLICES,
        verb="create",
        resource="resourceslices",
        query=[("dryRun", "All")],
        body=body,
    )
    # Named by the naming rule, which the slice admission policy enforces.
    assert answer["metadata"]["name"] == f"fffff-{DRIVER}-{NODE}"
    assert "resourceVersion" not in answer["metadata"]
    assert answer["spec"]["devices"][0]["taints"][0]["key"] == "gpu-dra.io/capability-probe"
    assert server.objects("resourceslices") == []
    assert server.requests.writes() == []  # a dry run is no write
    [record] = [r for r in server.requests if r.verb == "create"]
    assert record.dry_run and record.code == 201
    # Validation still runs: a bad object is refused as it would be without dryRun.
    body["spec"]["devices"][0]["name"] = "Not_A_Label"
    with pytest.raises(RejectedError):
        await Client(api).request(
            "POST",
            SLICES,
            verb="create",
            resource="resourceslices",
            query=[("dryRun", "All")],
            body=body,
        )


async def test_dry_run_other_values_and_verbs_are_refused(gated: Callable[..., Any]) -> None:
    server, api = await gated()
    body = probe_slices(DRIVER, NODE)["DRADeviceTaints"]
    with pytest.raises(RejectedError, match='supported values: "All"'):
        await Client(api).request(
            "POST", SLICES, verb="create", resource="rs", query=[("dryRun", "Some")], body=body
        )
    body["metadata"] = {"name": "s"}
    await Client(api).request("POST", SLICES, verb="create", resource="rs", body=body)
    with pytest.raises(RejectedError, match="dryRun on delete is not supported"):
        await Client(api).request(
            "DELETE", f"{SLICES}/s", verb="delete", resource="rs", query=[("dryRun", "All")]
        )
    assert len(server.objects("resourceslices")) == 1


@pytest.mark.parametrize("gate", ALL_GATES)
async def test_a_gate_off_drops_its_fields_silently(gated: Callable[..., Any], gate: str) -> None:
    _, api = await gated(**{gate: False})
    probes = probe_slices(DRIVER, NODE)
    # Stored for real (no dry run) to read back what the server kept: one name each.
    stored = [
        await Client(api).request(
            "POST",
            SLICES,
            verb="create",
            resource="rs",
            body={**probes[g], "metadata": {"name": f"stored-{i}"}},
        )
        for i, g in enumerate(ALL_GATES)
    ]
    [field] = [g for g in GATED_FIELDS if g.gate == gate]
    assert not any(field.used_by(s["spec"]) for s in stored)
    for other in GATED_FIELDS:
        if other.gate != gate:
            assert any(other.used_by(s["spec"]) for s in stored), other.gate


def test_an_unknown_gate_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown feature gate"):
        LocalApiServer(feature_gates={"DRANoSuchGate": False})


# ---- the guard --------------------------------------------------------------------------------


async def test_probe_finds_the_gates_that_are_off(gated: Callable[..., Any]) -> None:
    server, api = await gated(DRADeviceTaints=False, DRAConsumableCapacity=False)
    found = await probe(Client(api), driver_name=DRIVER, node_name=NODE)
    assert found.dropped == {"DRADeviceTaints", "DRAConsumableCapacity"}
    assert found.version.startswith("v1.34")
    assert server.requests.writes() == [] and server.objects("resourceslices") == []


async def test_a_refused_probe_counts_as_dropped_with_one_line(
    gated: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    server, api = await gated()
    # One probe refused; the probes go out at once, so which one is the server's order.
    server.faults.fail("create", "resourceslices", code=422, times=1)
    found = await probe(Client(api), driver_name=DRIVER, node_name=NODE)
    [refused] = [g for g in GATED_FIELDS if g.gate in found.dropped]
    assert found.dropped == {refused.gate}
    lines = [
        r.getMessage() for r in caplog.records if "refused the dry-run probe" in r.getMessage()
    ]
    assert lines == [
        f"the API server refused the dry-run probe for {refused.feature}; taking them as not kept"
    ]


def test_fit_leaves_out_unsafe_devices_and_strips_harmless_fields() -> None:
    devices = [
        {"name": "tainted", "taints": [{"key": "k", "effect": "NoSchedule"}]},
        {"name": "shared", "allowMultipleAllocations": True},
        {"name": "plain"},
    ]
    desired = [{"spec": {"pool": {"name": NODE}, "devices": devices}}]
    fitted, counts = fit(desired, frozenset({"DRADeviceTaints", "DRAConsumableCapacity"}))
    assert [d for d in fitted[0]["spec"]["devices"]] == [{"name": "shared"}, {"name": "plain"}]
    assert counts == {"DRADeviceTaints": 1, "DRAConsumableCapacity": 1}
    assert desired[0]["spec"]["devices"] == devices  # the input is left alone
    assert fit(desired, frozenset()) == (desired, {})
    assert uses_gated_fields(desired)
    assert uses_gated_fields(
        [{"spec": {"devices": [{"capacity": {"m": {"requestPolicy": {"default": "1"}}}}]}}]
    )


def test_fit_keeps_devices_whose_taints_are_only_informational() -> None:
    informational = [{"key": "gpu.nvidia.com/unmonitored", "value": "", "effect": "None"}]
    devices = [
        {"name": "unmonitored", "taints": informational},
        {"name": "lost", "taints": [*informational, {"key": "k", "effect": "NoSchedule"}]},
    ]
    desired = [{"spec": {"pool": {"name": NODE}, "devices": devices}}]
    fitted, counts = fit(desired, frozenset({"DRADeviceTaints"}))
    assert fitted[0]["spec"]["devices"] == [{"name": "unmonitored"}]
    assert counts == {"DRADeviceTaints": 2}
    assert not uses_gated_fields([{"spec": {"devices": [{"name": "plain", "capacity": {}}]}}])


def gated_devices(hardware: Hardware) -> Callable[[], Any]:
    """A kind that needs gated fields: GPUs, one of them tainted, all shareable."""

    async def devices() -> list[dict[str, Any]]:
        found = copy.deepcopy(build_devices(await hardware.discover(), node_name=NODE))
        for device in found:
            device["allowMultipleAllocations"] = True
        found[0]["taints"] = [
            {"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
        ]
        return found

    return devices


async def test_a_kind_needing_dropped_fields_gets_one_line_and_no_rewrite_loop(
    gated: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="driver")
    server, api = await gated(DRADeviceTaints=False, DRAConsumableCapacity=False)
    hardware = Hardware(tmp_path)
    controller = SliceController(
        api,
        node_name=NODE,
        driver_name=DRIVER,
        devices=gated_devices(hardware),
        request_timeout=2.0,
        backoff_cap=0.2,
    )
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.wait_for(controller.published.wait(), TIMEOUT)
        for _ in range(5):
            await asyncio.wait_for(controller.resync(), TIMEOUT)
        writes = [r.verb for r in server.requests.writes("resourceslices")]
        assert writes == ["create"]  # once, then never rewritten
        [obj] = server.objects("resourceslices")
        names = [d["name"] for d in obj["spec"]["devices"]]
        assert names == [f"gpu-{i}" for i in range(1, 8)]  # the tainted GPU is left out
        assert not any("allowMultipleAllocations" in d for d in obj["spec"]["devices"])
        lines = [r.getMessage() for r in caplog.records if "the API server drops" in r.getMessage()]
        assert lines == [
            "the API server drops device taints (feature gate DRADeviceTaints is off): "
            "devices that need them are left out",
            "the API server drops multiple allocations (feature gate DRAConsumableCapacity is "
            "off): devices that need them are published without multiple allocations",
        ]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_server_with_every_gate_on_gets_every_field(
    gated: Callable[..., Any], tmp_path: Path
) -> None:
    server, api = await gated()
    hardware = Hardware(tmp_path)
    controller = SliceController(
        api,
        node_name=NODE,
        driver_name=DRIVER,
        devices=gated_devices(hardware),
        request_timeout=2.0,
        backoff_cap=0.2,
    )
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.wait_for(controller.published.wait(), TIMEOUT)
        await asyncio.wait_for(controller.resync(), TIMEOUT)
        [obj] = server.objects("resourceslices")
        assert len(obj["spec"]["devices"]) == 8
        assert obj["spec"]["devices"][0]["taints"][0]["value"] == "xid-79"
        assert [r.verb for r in server.requests.writes("resourceslices")] == ["create"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ---- taint effect None: a value 1.35 added, refused by a 1.34 server -----------------------


def _effect_none_slice() -> dict[str, Any]:
    return probe_slices(DRIVER, NODE)[EFFECT_NONE]


async def test_a_134_server_refuses_effect_none_and_a_135_one_keeps_it(
    gated: Callable[..., Any],
) -> None:
    _, api = await gated()
    with pytest.raises(RejectedError, match='Unsupported value: "None": supported values: '):
        await Client(api).request(
            "POST", SLICES, verb="create", resource="rs", body=_effect_none_slice()
        )
    _, api = await gated(version="1.35.0")
    stored = await Client(api).request(
        "POST", SLICES, verb="create", resource="rs", body=_effect_none_slice()
    )
    assert stored["spec"]["devices"][0]["taints"][0]["effect"] == "None"


@pytest.mark.parametrize(("version", "accepted"), [("1.34.0", False), ("1.35.0", True)])
async def test_probe_learns_whether_effect_none_is_accepted(
    gated: Callable[..., Any], version: str, accepted: bool
) -> None:
    server, api = await gated(version=version)
    found = await probe(Client(api), driver_name=DRIVER, node_name=NODE)
    assert found.dropped == frozenset() and found.effect_none is accepted
    assert server.objects("resourceslices") == []
    # Taints dropped altogether: no question about their effects is asked.
    _, api = await gated(version=version, DRADeviceTaints=False)
    found = await probe(Client(api), driver_name=DRIVER, node_name=NODE)
    assert found.dropped == {"DRADeviceTaints"} and not found.effect_none


def test_fit_without_effect_none_leaves_informational_taints_off() -> None:
    unmonitored = {"key": "gpu.nvidia.com/unmonitored", "value": "", "effect": "None"}
    xid79 = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    devices = [
        {"name": "unmonitored", "taints": [unmonitored]},
        {"name": "lost", "taints": [unmonitored, xid79]},
        {"name": "plain"},
    ]
    desired = [{"spec": {"pool": {"name": NODE}, "devices": devices}}]
    fitted, counts = fit(desired, frozenset(), effect_none=False)
    assert fitted[0]["spec"]["devices"] == [
        {"name": "unmonitored"},
        {"name": "lost", "taints": [xid79]},
        {"name": "plain"},
    ]
    assert counts == {EFFECT_NONE: 2}
    assert desired[0]["spec"]["devices"] == devices  # the input is left alone
    assert fit(desired, frozenset()) == (desired, {})


async def test_a_134_server_with_taints_on_gets_the_slice_without_informational_taints(
    gated: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="driver")
    server, api = await gated()  # 1.34 with DRADeviceTaints on, as K8S=1.34 in the e2e tier
    hardware = Hardware(tmp_path)
    ignored_xid = {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}

    async def devices() -> list[dict[str, Any]]:
        found = copy.deepcopy(build_devices(await hardware.discover(), node_name=NODE))
        found[0]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
        found[1]["taints"] = [ignored_xid]
        found[2]["taints"] = [{"key": "gpu.nvidia.com/unmonitored", "value": "", "effect": "None"}]
        return found

    controller = SliceController(
        api, node_name=NODE, driver_name=DRIVER, devices=devices, request_timeout=2.0
    )
    task = asyncio.create_task(controller.run())
    try:
        await asyncio.wait_for(controller.published.wait(), TIMEOUT)
        for _ in range(3):
            await asyncio.wait_for(controller.resync(), TIMEOUT)
        assert [r.verb for r in server.requests.writes("resourceslices")] == ["create"]
        assert controller.stats.writes == {"create": 1} and not controller.stats.failures
        [obj] = server.objects("resourceslices")
        published = obj["spec"]["devices"]
        assert len(published) == 8  # every device, none left out
        assert [t["value"] for t in published[0]["taints"]] == ["79"]
        assert not any("taints" in d for d in published[1:])
        lines = [r.getMessage() for r in caplog.records if "effect None" in r.getMessage()]
        assert lines == [
            "the API server does not accept taint effect None (Kubernetes 1.35 adds it): "
            "informational taints are left off; the devices are published without them"
        ]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
