"""Prometheus metrics of the node daemon, scraped over HTTP, every family asserted."""

from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from api.gen import dra_v1_pb2 as v1
from driver.kube import client as kubeclient
from driver.kube.rest import ApiError, Client, ConflictError, NotFoundError, errors_of
from kubeletplugin.draservice import DraService
from kubeletplugin.healthstream import DeviceHealth, HealthBoard
from kubeletplugin.metrics import CONTENT_TYPE, Metrics, MetricsServer
from kubeletplugin.state import ClaimRef, PreparedDevice, PrepareResult

A, B = (f"{n}0000000-0000-4000-8000-000000000000" for n in "ab")


class _Preparer:
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        device = PreparedDevice(
            request_names=("gpu",), pool_name="node-a", device_name="gpu-0", cdi_device_ids=()
        )
        return {
            c.uid: PrepareResult(devices=(device,)) if c.uid == A else PrepareResult(error="no")
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {c.uid: "" for c in claims}


async def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as answer,
    ):
        assert answer.status == 200
        assert answer.headers["Content-Type"] == CONTENT_TYPE
        text = await answer.text()
    return {
        family.name: [(dict(s.labels), s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def _claim(uid: str, name: str) -> v1.Claim:
    return v1.Claim(uid=uid, namespace="team", name=name)


async def test_every_family_over_http() -> None:
    board = HealthBoard(
        [
            DeviceHealth("node-a", "gpu-0", "Healthy"),
            DeviceHealth("node-a", "gpu-1", "Unhealthy", "XID 79"),
        ]
    )
    metrics = Metrics(
        board=board,
        events_by_xid=lambda: {79: 250, 13: 3},
        slice_writes=lambda: {"create": 1, "update": 4},
        slice_write_failures=lambda: {"ConflictError": 2},
        api_errors=lambda: {"ConflictError": 2, "NotFoundError": 1},
    )
    uuids = {"gpu-0": "GPU-1234"}
    service = DraService(_Preparer(), metrics, lambda name: uuids.get(name, ""))
    server = MetricsServer(metrics, port=0, host="127.0.0.1")
    await server.start()
    try:
        await service.prepare(
            v1.NodePrepareResourcesRequest(claims=[_claim(A, "a"), _claim(B, "b")])
        )
        got = await _scrape(server.port)
        assert got["gpu_dra_prepare_requests"] == [
            ({"outcome": "success"}, 1.0),
            ({"outcome": "error"}, 1.0),
        ]
        (count,) = [
            v for labels, v in got["gpu_dra_prepare_duration_seconds"] if labels.get("le") == "+Inf"
        ]
        assert count == 1.0
        assert sorted(got["gpu_dra_devices"], key=lambda s: s[0]["state"]) == [
            ({"state": "Healthy"}, 1.0),
            ({"state": "Unhealthy"}, 1.0),
            ({"state": "Unknown"}, 0.0),
        ]
        assert got["gpu_dra_nvml_xid_events"] == [({"xid": "13"}, 3.0), ({"xid": "79"}, 250.0)]
        assert got["gpu_dra_prepared_device_info"] == [
            (
                {
                    "gpu_uuid": "GPU-1234",
                    "device": "gpu-0",
                    "claim_namespace": "team",
                    "claim_name": "a",
                    "claim_uid": A,
                },
                1.0,
            )
        ]
        assert got["gpu_dra_prepared_claims"] == [({}, 1.0)]
        assert got["gpu_dra_slice_writes"] == [
            ({"verb": "create"}, 1.0),
            ({"verb": "update"}, 4.0),
            ({"verb": "delete"}, 0.0),
        ]
        # Every error class of driver.kube.rest, and nothing else: a bounded label set.
        classes = sorted(c.__name__ for c in ApiError.__subclasses__())
        failures = dict((labels["error"], v) for labels, v in got["gpu_dra_slice_write_failures"])
        assert failures == {c: (2.0 if c == "ConflictError" else 0.0) for c in classes}
        errors = dict((labels["error"], v) for labels, v in got["gpu_dra_api_errors"])
        assert errors["ConflictError"] == 2.0 and errors["NotFoundError"] == 1.0
        assert sorted(errors) == classes and sum(errors.values()) == 3.0

        await service.unprepare(v1.NodeUnprepareResourcesRequest(claims=[_claim(A, "a")]))
        got = await _scrape(server.port)
        assert got["gpu_dra_unprepare_requests"] == [({"outcome": "success"}, 1.0)]
        assert got["gpu_dra_prepared_device_info"] == []  # the series goes with the claim
        assert got["gpu_dra_prepared_claims"] == [({}, 0.0)]
    finally:
        await server.stop()


async def test_api_errors_are_counted_by_class_per_api_client(apiserver: Any) -> None:
    api = k8s.ApiClient(k8s.Configuration(host=apiserver.url))
    try:
        client = Client(api)
        with pytest.raises(NotFoundError):
            await client.get_json("/api/v1/nodes/absent", resource="nodes")
        apiserver.faults.fail("get", "nodes", code=409, times=1)
        with pytest.raises(ConflictError):
            await Client(api).get_json("/api/v1/nodes/absent", resource="nodes")
        await client.get_json("/version", resource="/version")  # a success counts nothing
        assert errors_of(api) == {"NotFoundError": 1, "ConflictError": 1}
    finally:
        await kubeclient.close(api)
