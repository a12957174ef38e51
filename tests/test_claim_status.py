"""The claim says which device it got: the status writer against the local API server.

Entries appear after prepare (the device's published attributes, identity, sharing), are
written once per change and never at rest, follow the device's health, keep other drivers'
entries, survive a failing API server (retried, counted) and go at unprepare.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes.aio import client as k8s

from driver.devicekind import NodeDevice, PreparedClaim, PreparedDevice
from driver.kube.rest import Client, ServerError
from driver.kube.session import Session
from kubeletplugin.claimstatus import ClaimStatusWriter, desired_entries, merged, running
from kubeletplugin.healthstream import DeviceHealth, HealthBoard
from kubeletplugin.state import ClaimRef
from sandbox.apiserver import LocalApiServer
from tests.pluginharness import create_claim, wait_for

DRIVER = "gpu.nvidia.com"
NODE = "node-s"
UUID = "GPU-5fec25fb-4a50-92b0-5008-05ca4f0c47e2"
GPU0 = NodeDevice(
    kind="gpu",
    name="gpu-0",
    published={
        "name": "gpu-0",
        "attributes": {
            "uuid": {"string": UUID},
            "productName": {"string": "NVIDIA H200"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:53:00.0"},
            "index": {"int": 0},
            "driverVersion": {"version": "580.159.4"},
        },
        "capacity": {"memory": {"value": "150754820096"}},
    },
    edits={},
    identity={"uuid": UUID},
)


def _prepared(ref: ClaimRef, **device: Any) -> PreparedClaim:
    return PreparedClaim(
        ref.uid,
        ref.namespace,
        ref.name,
        (
            PreparedDevice(
                ("gpu",), NODE, "gpu-0", (f"k8s.gpu.nvidia.com/claim={ref.uid}-gpu-0",),
                kind="gpu", identity=(("uuid", UUID),), **device,
            ),
        ),
    )  # fmt: skip


@pytest.fixture
async def claim(api_client: Session) -> ClaimRef:
    return await create_claim(api_client, "c", node=NODE, devices=["gpu-0"])


async def _status(api: Any, ref: ClaimRef) -> list[dict[str, Any]]:
    got = await k8s.ResourceV1Api(api).read_namespaced_resource_claim(ref.name, ref.namespace)
    devices: list[dict[str, Any]] = (
        api.sanitize_for_serialization(got).get("status", {}).get("devices") or []
    )
    return devices


@pytest.fixture
async def writer(
    api_client: Session,
) -> AsyncIterator[tuple[ClaimStatusWriter, HealthBoard]]:
    board = HealthBoard()
    w = ClaimStatusWriter(
        Client(api_client), DRIVER, NODE, devices=lambda: {"gpu-0": GPU0}, board=board
    )
    async with running(w):
        yield w, board


async def _until(
    api: Session, ref: ClaimRef, test: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    last: list[list[dict[str, Any]]] = [[]]

    async def poll() -> bool:
        last[0] = await _status(api, ref)
        return test(last[0])

    for _ in range(200):
        if await poll():
            return last[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"claim status never matched: {last[0]}")


async def test_prepared_claim_shows_its_gpu_once_and_not_at_rest(
    api_client: Session, apiserver: LocalApiServer, claim: ClaimRef, writer: Any
) -> None:
    w, _ = writer
    w.prepared(_prepared(claim, sharing=(("strategy", "MPS"),), consumed=(("memory", "20Gi"),)))
    (entry,) = await _until(api_client, claim, lambda d: len(d) == 1)
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, "gpu-0")
    data = entry["data"]
    assert data["attributes"]["uuid"] == UUID
    assert data["attributes"]["productName"] == "NVIDIA H200"
    assert data["attributes"]["resource.kubernetes.io/pciBusID"] == "0000:53:00.0"
    assert data["sharing"] == {"strategy": "MPS"} and data["consumedCapacity"] == {"memory": "20Gi"}
    (ready,) = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    writes = len(apiserver.requests.writes("resource.k8s.io/resourceclaims/status"))
    # The same news again, and a resync of the records: nothing to write.
    w.prepared(_prepared(claim, sharing=(("strategy", "MPS"),), consumed=(("memory", "20Gi"),)))
    w.health_changed()
    await wait_for(lambda: w.stats.skipped_unchanged >= 1, "the writer compared and skipped")
    assert len(apiserver.requests.writes("resource.k8s.io/resourceclaims/status")) == writes
    assert w.stats.writes == 1


async def test_health_moves_the_condition_and_unprepare_clears(
    api_client: Session, claim: ClaimRef, writer: Any
) -> None:
    w, board = writer
    w.prepared(_prepared(claim))
    await _until(api_client, claim, lambda d: len(d) == 1)
    board.replace([DeviceHealth(NODE, "gpu-0", "Unhealthy", "XID 79: fell off the bus")])
    (entry,) = await _until(api_client, claim, lambda d: d[0]["conditions"][0]["status"] == "False")
    assert entry["conditions"][0]["reason"] == "Unhealthy"
    assert "XID 79" in entry["conditions"][0]["message"]
    board.replace([DeviceHealth(NODE, "gpu-0", "Healthy")])
    await _until(api_client, claim, lambda d: d[0]["conditions"][0]["status"] == "True")
    w.unprepared(claim.uid)
    await _until(api_client, claim, lambda d: d == [])


async def test_other_drivers_entries_are_kept(
    api_client: Any, claim: ClaimRef, writer: Any
) -> None:
    resource = k8s.ResourceV1Api(api_client)
    body = api_client.sanitize_for_serialization(
        await resource.read_namespaced_resource_claim(claim.name, claim.namespace)
    )
    other = {"driver": "nic.example.com", "pool": NODE, "device": "nic-0", "data": {"x": 1}}
    body["status"]["devices"] = [other]
    await resource.replace_namespaced_resource_claim_status(claim.name, claim.namespace, body)
    w, _ = writer
    w.prepared(_prepared(claim))
    devices = await _until(api_client, claim, lambda d: len(d) == 2)
    assert other in devices
    w.unprepared(claim.uid)
    assert await _until(api_client, claim, lambda d: len(d) == 1) == [other]


async def test_a_failing_api_server_is_retried_and_counted(
    api_client: Session, apiserver: LocalApiServer, claim: ClaimRef, writer: Any
) -> None:
    apiserver.faults.fail("update", "resourceclaims/status", claim.name, code=500, times=2)
    w, _ = writer
    w.prepared(_prepared(claim))
    await _until(api_client, claim, lambda d: len(d) == 1)
    assert w.stats.failures == 2 and w.stats.writes == 1


async def test_a_refused_grant_turns_the_writer_off_with_one_line(
    apiserver: LocalApiServer,
    claim: ClaimRef,
    writer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """403 (a chart older than the writer, or another node's claim): no retry helps, so no
    retry storm; prepare is not touched, and one line says why."""
    apiserver.faults.fail("update", "resourceclaims/status", claim.name, code=403, times=-1)
    w, _ = writer
    w.prepared(_prepared(claim))
    await wait_for(lambda: "claim device status not written again" in caplog.text, "the line")
    assert not w.enabled
    w.prepared(_prepared(claim, sharing=(("strategy", "MPS"),)))
    w.health_changed()
    assert not w.pending  # news after the refusal wakes nothing
    assert (w.stats.writes, w.stats.failures) == (0, 0)
    assert caplog.text.count("claim device status not written again") == 1


async def test_an_admission_refusal_stops_that_claim_only(
    api_client: Session,
    apiserver: LocalApiServer,
    claim: ClaimRef,
    writer: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """403 from an admission policy (its own words, as kube-apiserver sends them) refuses one
    claim's write, with the verb granted: the writer stays on, keeps writing other claims,
    and tries that claim again at its next change, not in a loop."""
    denial = (
        f'resourceclaims.resource.k8s.io "{claim.name}" is forbidden: ValidatingAdmissionPolicy '
        "'gpu-dra-driver-claim-status' with binding 'gpu-dra-driver-claim-status' denied "
        "request: only this node's devices"
    )
    apiserver.faults.fail(
        "update", "resourceclaims/status", claim.name, code=403, times=-1, message=denial
    )
    other = await create_claim(api_client, "d", node=NODE, devices=["gpu-0"])
    w, _ = writer
    w.prepared(_prepared(claim))
    w.prepared(_prepared(other))
    await _until(api_client, other, lambda d: len(d) == 1)
    await wait_for(lambda: w.stats.failures == 1 and not w.pending, "the refusal")
    assert w.enabled and w.stats.writes == 1 and await _status(api_client, claim) == []
    (line,) = [vars(r) for r in caplog.records if "refused by admission" in r.getMessage()]
    assert (line["claim_uid"], line["claim_namespace"], line["claim_name"]) == (
        claim.uid, claim.namespace, claim.name,
    )  # fmt: skip
    assert "denied request: only this node's devices" in str(line["error"])
    # The claim changes and the policy admits it now: written; the other's news still flows.
    apiserver.faults.clear()
    w.prepared(_prepared(claim, sharing=(("strategy", "TimeSlicing"),)))
    (entry,) = await _until(api_client, claim, lambda d: len(d) == 1)
    assert entry["data"]["sharing"] == {"strategy": "TimeSlicing"}
    w.unprepared(other.uid)
    await _until(api_client, other, lambda d: d == [])
    assert (w.stats.writes, w.stats.failures) == (3, 1)


async def test_a_refused_claim_waits_for_its_next_change(
    api_client: Session, apiserver: LocalApiServer, claim: ClaimRef, writer: Any
) -> None:
    """422 for one claim (as 1.36 answers a write for a claim of another node): not retried
    in a loop; the claim's next change tries again."""
    apiserver.faults.fail("update", "resourceclaims/status", claim.name, code=422, times=1)
    w, _ = writer
    w.prepared(_prepared(claim))
    await wait_for(lambda: w.stats.failures == 1 and not w.pending, "the refusal")
    assert w.enabled and w.stats.writes == 0 and await _status(api_client, claim) == []
    w.prepared(_prepared(claim, sharing=(("strategy", "TimeSlicing"),)))
    (entry,) = await _until(api_client, claim, lambda d: len(d) == 1)
    assert entry["data"]["sharing"] == {"strategy": "TimeSlicing"}
    assert (w.stats.writes, w.stats.failures) == (1, 1)


async def test_what_the_driver_adds_is_written_and_its_failure_retried(
    api_client: Session, claim: ClaimRef
) -> None:
    """A driver's own data (the ComputeDomain channel's domain and clique) joins the entry;
    a lookup the API server fails is retried as a failed write."""
    asked: list[tuple[str, str]] = []

    async def describe(prepared: PreparedClaim, device: PreparedDevice) -> dict[str, Any]:
        asked.append((prepared.uid, device.reservation))
        if len(asked) == 1:
            raise ServerError("list: HTTP 503", status=503, verb="list", resource="things")
        return {"cliqueID": "c.0"}

    w = ClaimStatusWriter(
        Client(api_client), DRIVER, NODE, devices=lambda: {"gpu-0": GPU0}, describe=describe
    )
    async with running(w):
        w.prepared(_prepared(claim))
        (entry,) = await _until(api_client, claim, lambda d: len(d) == 1)
    assert entry["data"]["cliqueID"] == "c.0" and entry["data"]["kind"] == "gpu"
    assert asked == [(claim.uid, "gpu-0")] * 2
    assert (w.stats.writes, w.stats.failures) == (1, 1)


def test_entries_are_pure_and_keep_an_unchanged_conditions_time() -> None:
    ref = ClaimRef(uid="u", namespace="n", name="c")
    first = desired_entries(_prepared(ref), DRIVER, {"gpu-0": GPU0}, {}, [], "2026-12-04T10:00:00Z")
    again = desired_entries(
        _prepared(ref), DRIVER, {"gpu-0": GPU0}, {}, first, "2026-12-04T11:00:00Z"
    )
    assert again == first
    unhealthy = {(NODE, "gpu-0"): DeviceHealth(NODE, "gpu-0", "Unhealthy", "XID 48")}
    moved = desired_entries(
        _prepared(ref), DRIVER, {"gpu-0": GPU0}, unhealthy, first, "2026-12-04T12:00:00Z"
    )
    assert moved[0]["conditions"][0]["lastTransitionTime"] == "2026-12-04T12:00:00Z"
    other_pool = {"driver": DRIVER, "pool": "elsewhere", "device": "gpu-0"}
    assert merged([other_pool, *first], [], DRIVER, NODE) == [other_pool]
