"""Prometheus metrics of the node daemon, scraped over HTTP, every family asserted."""

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes.aio import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from api.gen import dra_v1_pb2 as v1
from driver.devicekind import PreparedClaim
from driver.kube import client as kubeclient
from driver.kube.rest import ERROR_CLASSES, Client, ConflictError, NotFoundError
from driver.kube.session import Session
from drivers.gpu import node as gpunode
from drivers.gpu.metrics import Metrics
from kubeletplugin.draservice import DraService
from kubeletplugin.healthstream import DeviceHealth, HealthBoard
from kubeletplugin.metrics import CONTENT_TYPE, MetricsServer
from kubeletplugin.state import ClaimRef, DeviceState, PreparedDevice, PrepareResult
from sandbox.kubeletsim import KubeletSim
from tests.pluginharness import NodeDirs, create_claim, create_node, wait_for

A, B = (f"{n}0000000-0000-4000-8000-000000000000" for n in "ab")


class _Preparer:
    """A claim state that tells its observer, as DeviceState does."""

    def __init__(self, observer: Metrics) -> None:
        self._observer = observer

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        device = PreparedDevice(
            request_names=("gpu",),
            pool_name="node-a",
            device_name="gpu-0",
            cdi_device_ids=(),
            kind="gpu",
            identity=(("gpu-uuid", "GPU-1234"),),
        )
        for c in claims:
            if c.uid == A:
                self._observer.prepared(PreparedClaim(c.uid, c.namespace, c.name, (device,)))
        return {
            c.uid: PrepareResult(devices=(device,)) if c.uid == A else PrepareResult(error="no")
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        for c in claims:
            self._observer.unprepared(c.uid)
        return {c.uid: "" for c in claims}


async def _scrape(
    port: int, host: str = "127.0.0.1"
) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{host}:{port}/metrics") as answer,
    ):
        assert answer.status == 200
        assert answer.headers["Content-Type"] == CONTENT_TYPE
        text = await answer.text()
    return {
        family.name: [(dict(s.labels), s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


async def _scrape_served(
    caplog: pytest.LogCaptureFixture,
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A scrape of the metrics server the last "serving metrics" line names."""
    (line, *_) = [r for r in reversed(caplog.records) if r.getMessage() == "serving metrics"]
    fields = vars(line)
    return await _scrape(int(fields["port"]), str(fields.get("address", "127.0.0.1")))


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
    service = DraService(_Preparer(metrics), metrics)
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
        # Every error class of driver.kube.rest (an admission refusal apart from RBAC's 403),
        # and nothing else: a bounded label set.
        classes = sorted(ERROR_CLASSES)
        assert {"AdmissionRefusedError", "ForbiddenError", "ConflictError"} <= set(classes)
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
    api = Session(k8s.Configuration(host=apiserver.url))
    try:
        client = Client(api)
        with pytest.raises(NotFoundError):
            await client.get_json("/api/v1/nodes/absent", resource="nodes")
        apiserver.faults.fail("get", "nodes", code=409, times=1)
        with pytest.raises(ConflictError):
            await Client(api).get_json("/api/v1/nodes/absent", resource="nodes")
        await client.get_json("/version", resource="/version")  # a success counts nothing
        assert api.errors == {"NotFoundError": 1, "ConflictError": 1}
    finally:
        await kubeclient.close(api)


# ---- fed from the claim state: what is prepared on the node, by any path ----------------


def _info(metrics: Metrics) -> dict[str, tuple[str, str]]:
    """claim name -> (device, gpu_uuid) of each prepared-device series."""
    out: dict[str, tuple[str, str]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name == "gpu_dra_prepared_device_info":
            for s in family.samples:
                out[s.labels["claim_name"]] = (s.labels["device"], s.labels["gpu_uuid"])
    return out


async def test_metrics_follow_recovery_a_sibling_instance_and_the_reconciler(
    api_client: Any, tmp_path: Path
) -> None:
    from tests.test_state import _config, _inventory, create_claim, delete_claim, devices_of

    config = _config(tmp_path)
    inventory = _inventory("p5.48xlarge", tmp_path)
    uuid = {g.device_name: g.uuid for g in inventory.gpus}
    first = Metrics()
    state = await DeviceState.open(config, api_client, devices_of(inventory, config))
    await state.observe(first)
    one = await create_claim(api_client, "one", ["gpu-0"])
    two = await create_claim(api_client, "two", ["gpu-1"])
    results = await state.prepare([one, two])
    assert {r.error for r in results.values()} == {""}
    assert _info(first) == {"one": ("gpu-0", uuid["gpu-0"]), "two": ("gpu-1", uuid["gpu-1"])}

    # A restart (or a second instance during an upgrade): recovered claims are counted.
    second = Metrics()
    sibling = await DeviceState.open(config, api_client, devices_of(inventory, config))
    await sibling.observe(second)
    assert _info(second) == _info(first)

    # The sibling unprepares "one": its own series go at once, the first instance's at its
    # next reconcile, which reads what the node's records hold.
    assert await sibling.unprepare([one]) == {one.uid: ""}
    assert _info(second) == {"two": ("gpu-1", uuid["gpu-1"])}
    await state.reconcile()
    assert _info(first) == {"two": ("gpu-1", uuid["gpu-1"])}

    # The reconciler unprepares a claim gone from the API server.
    await delete_claim(api_client, two)
    await sibling.reconcile()
    assert _info(second) == {}
    await state.reconcile()
    assert _info(first) == {}
    claims = {f.name: f.samples[0].value for f in text_string_to_metric_families(
        first.render().decode()) if f.name == "gpu_dra_prepared_claims"}  # fmt: skip
    assert claims == {"gpu_dra_prepared_claims": 0.0}


async def test_a_restarted_node_serves_the_recovered_claims_over_http(
    kube: tuple[Any, Path], dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    api, kubeconfig = kube
    await create_node(api, "node-a")
    claim = await create_claim(api, "held", node="node-a", devices=["gpu-2"])
    config = dirs.node_config(kubeconfig, node_name="node-a", profile="p5.48xlarge", metrics_port=0)
    caplog.set_level(logging.INFO)

    def served() -> int:
        return sum(r.getMessage() == "serving metrics" for r in caplog.records)

    async def serve_once(prepare: bool) -> dict[str, list[tuple[dict[str, str], float]]]:
        earlier = served()
        stop = asyncio.Event()
        running = asyncio.create_task(gpunode.run(config, stop))
        try:
            await wait_for(dirs.paths().registration.is_socket, "registration socket")
            if prepare:
                async with await KubeletSim.register(dirs.paths().registration) as kubelet:
                    response = await kubelet.prepare([claim])
                    assert response.claims[claim.uid].error == ""
            # The metrics server starts after the sockets: wait for this run's line.
            await wait_for(lambda: served() > earlier, "the metrics server")
            return await _scrape_served(caplog)
        finally:
            stop.set()
            assert await asyncio.wait_for(running, 30) == 0

    before = await serve_once(prepare=True)
    after = await serve_once(prepare=False)  # a new process would see the same records
    assert len(before["gpu_dra_prepared_device_info"]) == 1
    assert after["gpu_dra_prepared_device_info"] == before["gpu_dra_prepared_device_info"]
    assert after["gpu_dra_prepared_claims"] == [({}, 1.0)]
    ((labels, _),) = after["gpu_dra_prepared_device_info"]
    assert labels["device"] == "gpu-2" and labels["gpu_uuid"].startswith("GPU-")


# ---- the server: bounded connections, the address it is given ----------------------------


async def test_idle_connections_beyond_the_cap_hold_no_thread_and_scrapes_go_on() -> None:
    server = MetricsServer(Metrics(), port=0, host="127.0.0.1", max_connections=4, read_timeout=30)
    await server.start()
    threads = threading.active_count()
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        # Slow clients that never send a request.
        idle += [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(40)]
        # Those beyond the cap are closed by the server: EOF, not a hang.
        closed = 0
        for reader, _ in idle[4:]:
            assert await asyncio.wait_for(reader.read(), 10) == b""
            closed += 1
        assert closed == 36
        assert threading.active_count() <= threads + 1  # no thread per connection
        for _, writer in idle[:4]:
            writer.close()
        got = await _scrape(server.port)  # the slots are free again
        assert got["gpu_dra_prepared_claims"] == [({}, 0.0)]
    finally:
        for _, writer in idle:
            writer.close()
        await server.stop()


async def test_a_connection_that_sends_nothing_is_dropped_after_the_read_timeout() -> None:
    server = MetricsServer(Metrics(), port=0, host="127.0.0.1", max_connections=1, read_timeout=0.2)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the slot is given back
        writer.close()
        got = await _scrape(server.port)
        assert "gpu_dra_devices" in got
    finally:
        await server.stop()


async def test_the_server_binds_the_address_it_is_given_and_loopback_by_default() -> None:
    from cli import build_parser
    from drivers.gpu.node import NodeConfig

    assert NodeConfig(node_name="n").metrics_address == "127.0.0.1"
    parsed = build_parser().parse_args(["kubelet-plugin", "--metrics-address=10.0.0.7"])
    assert parsed.metrics_address == "10.0.0.7"
    assert build_parser().parse_args(["kubelet-plugin"]).metrics_address == "127.0.0.1"
    server = MetricsServer(Metrics(), port=0, host="127.0.0.2")
    await server.start()
    try:
        assert server.address == ("127.0.0.2", server.port)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", server.port)
        got = await _scrape(server.port, host="127.0.0.2")
        assert "gpu_dra_devices" in got
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.2:{server.port}/other") as answer,
        ):
            assert answer.status == 404
    finally:
        await server.stop()
