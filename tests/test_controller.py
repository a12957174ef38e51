"""The slice controller through the real ``kubernetes.aio`` client against the local API server.

Hardware is simulated at the NVML boundary (a state file removes GPUs); every count
below is read from the server's request log.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes.aio import client as k8s

from driver.common.errors import RetryableError
from driver.kube.resources import RESOURCE_SLICES
from driver.kube.rest import ApiError, Client, GoneError
from driver.kube.session import Session
from driver.nvml.faults import write_state_file
from driver.nvml.simulated import SimulatedNode
from driver.slices import ApiVersionMissingError, NodeNotFoundError, SliceController
from drivers.gpu.kinds import gpu_kinds, node_devices
from drivers.gpu.model.discovery import NvmlNotReadyError, discover
from drivers.gpu.model.inventory import Inventory
from sandbox.apiserver import LocalApiServer

DRIVER = "gpu.nvidia.com"
NODE = "node-1"
SLICES = "resourceslices"
TIMEOUT = 10.0


class Hardware:
    """A simulated node whose GPUs a test can pull (through the NVML state file)."""

    def __init__(self, root: Path, profile: str = "p5.48xlarge") -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.state = root / "state.yaml"
        write_state_file(self.state, {})
        self.node = SimulatedNode(profile, NODE, root / "sys", state_file=self.state)

    def set(self, **faults: Any) -> None:
        write_state_file(self.state, faults)

    async def discover(self) -> Inventory:
        return await asyncio.to_thread(discover, self.node.nvml, sysfs_root=self.node.sysfs_root)


class Running:
    """Controllers started by a test; cancelled (as SIGTERM would) at the end."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, discover: Callable[[], Awaitable[Inventory]], **kw: Any) -> SliceController:
        kw.setdefault("request_timeout", 2.0)
        kw.setdefault("backoff_cap", 0.2)
        controller = SliceController(
            self.api_client,
            node_name=NODE,
            driver_name=DRIVER,
            devices=node_devices(discover, node_name=NODE, kinds=gpu_kinds()).published,
            **kw,
        )
        self.tasks.append(asyncio.create_task(controller.run()))
        return controller

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Render every log line the controller writes, so a bad one fails the test."""
    caplog.set_level(logging.INFO, logger="driver")


@pytest.fixture
def hardware(tmp_path: Path) -> Hardware:
    return Hardware(tmp_path)


@pytest.fixture
async def node(apiserver: LocalApiServer) -> dict[str, Any]:
    [obj] = apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return obj


@pytest.fixture
async def running(api_client: Any, node: dict[str, Any]) -> AsyncIterator[Running]:
    ctl = Running(api_client)
    try:
        yield ctl
    finally:
        await ctl.stop()


async def published(controller: SliceController) -> None:
    await asyncio.wait_for(controller.published.wait(), TIMEOUT)


async def resync(controller: SliceController) -> None:
    await asyncio.wait_for(controller.resync(), TIMEOUT)


def device_names(apiserver: LocalApiServer) -> list[str]:
    """Devices of the pool at its highest generation (what a scheduler would use)."""
    slices = apiserver.objects(SLICES)
    if not slices:
        return []
    top = max(s["spec"]["pool"]["generation"] for s in slices)
    return sorted(
        d["name"]
        for s in slices
        if s["spec"]["pool"]["generation"] == top
        for d in s["spec"].get("devices") or ()
    )


def slice_writes(apiserver: LocalApiServer) -> list[str]:
    return [r.verb for r in apiserver.requests.writes(SLICES) if r.user_agent != MONITOR_AGENT]


GPUS = [f"gpu-{i}" for i in range(8)]


MONITOR_AGENT = "pool-monitor"


class PoolWatch:
    """The test's own watch on every ResourceSlice (its own client and user agent).

    Tests wait on it instead of sleeping: ``until(predicate)`` re-checks at every event
    the server sends, bookmarks included. At every committed change it checks that no
    device appears twice among the slices of the pool's highest generation.
    """

    def __init__(self, url: str) -> None:
        configuration = k8s.Configuration(host=url)
        self._api = Session(configuration)
        self._api.user_agent = MONITOR_AGENT
        self._client = Client(self._api)
        self.slices: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self._changed = asyncio.Condition()
        self._open = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        # Open before the test injects faults (the first event proves it).
        await asyncio.wait_for(self._open.wait(), TIMEOUT)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        close = cast(Callable[[], Awaitable[None]], self._api.close)  # untyped upstream
        await close()

    async def until(self, predicate: Callable[[], bool], what: str) -> None:
        try:
            async with asyncio.timeout(TIMEOUT), self._changed:
                await self._changed.wait_for(predicate)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for: {what}") from None

    async def _run(self) -> None:
        version = ""
        while True:
            try:
                if not version:
                    listed = await self._client.request(
                        "GET",
                        "/apis/resource.k8s.io/v1/resourceslices",
                        verb="list",
                        resource=SLICES,
                    )
                    self.slices = {s["metadata"]["name"]: s for s in listed["items"]}
                    version = listed["metadata"]["resourceVersion"]
                async for event in self._client.watch(
                    RESOURCE_SLICES,
                    query=[("resourceVersion", version)],
                    read_timeout=60,
                ):
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "DELETED":
                        self.slices.pop(obj["metadata"]["name"], None)
                    elif event["type"] != "BOOKMARK":
                        self.slices[obj["metadata"]["name"]] = obj
                        self._check()
                    self._open.set()
                    async with self._changed:
                        self._changed.notify_all()
            except GoneError:
                version = ""
            except (ApiError, RetryableError):
                await asyncio.sleep(0.05)  # the server is away (an outage test): retry

    def _check(self) -> None:
        top = max(s["spec"]["pool"]["generation"] for s in self.slices.values())
        seen: set[str] = set()
        for s in self.slices.values():
            if s["spec"]["pool"]["generation"] != top:
                continue
            for device in s["spec"].get("devices") or ():
                if device["name"] in seen:
                    self.violations.append(f"{device['name']} twice at generation {top}")
                seen.add(device["name"])


@pytest.fixture
async def pool(apiserver: LocalApiServer) -> AsyncIterator[PoolWatch]:
    watch = PoolWatch(apiserver.url)
    await watch.start()
    try:
        yield watch
    finally:
        await watch.stop()
        assert watch.violations == []


def relists(apiserver: LocalApiServer) -> int:
    """The controllers' fresh reads of their slices: a watch list, or a list where the
    server streams none."""
    return calls(apiserver, "list") + sum(
        1 for r in apiserver.requests if r.user_agent != MONITOR_AGENT and r.watch_list
    )


def calls(apiserver: LocalApiServer, verb: str, resource: str = SLICES) -> int:
    """Requests the controllers made (the test's own watch excluded)."""
    return sum(
        1
        for r in apiserver.requests
        if r.user_agent != MONITOR_AGENT
        and r.verb == verb
        and r.resource.rsplit("/", 1)[-1] == resource
    )


# ---- publishing -----------------------------------------------------------------------------


async def test_initial_publish_is_one_create_for_eight_gpus(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, node: dict[str, Any]
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    assert slice_writes(apiserver) == ["create"]
    # Nobody else claims the node: no Lease is written, the slice create is the only write.
    assert [r.resource for r in apiserver.requests.writes()] == ["resource.k8s.io/resourceslices"]
    assert apiserver.objects("leases") == []
    [obj] = apiserver.objects(SLICES)
    assert obj["metadata"]["name"] == f"00000-{DRIVER}-{NODE}"
    assert obj["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
    ]
    assert obj["spec"]["nodeName"] == NODE
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert device_names(apiserver) == sorted(GPUS)


async def test_steady_state_costs_no_requests_over_many_resyncs(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.requests.clear()
    for _ in range(20):
        await resync(controller)
    writes = apiserver.requests.writes()
    assert writes == []
    # Not a single call: resyncs compare against the watched state.
    assert [r.verb for r in apiserver.requests if r.verb != "watch"] == []


async def test_a_relisting_trigger_plans_from_a_fresh_list(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    """What SIGHUP does: an operator's doubt costs one list, and repairs what the watch missed."""
    controller = running.start(hardware.discover)
    await published(controller)
    [obj] = apiserver.objects(SLICES)
    obj["spec"]["devices"] = obj["spec"]["devices"][:3]
    apiserver.put(obj, silent=True)  # a change no watch delivers
    apiserver.requests.clear()
    await resync(controller)
    assert slice_writes(apiserver) == []  # the watched state looks right: nothing to do
    controller.trigger(relist=True)
    await resync(controller)
    assert relists(apiserver) == 1
    assert slice_writes(apiserver) == ["update"]
    assert device_names(apiserver) == sorted(GPUS)


async def test_gpu_disappearing_is_one_update_keeping_the_generation(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.requests.clear()
    hardware.set(removedGpus=[3])
    await resync(controller)
    assert slice_writes(apiserver) == ["update"]
    [obj] = apiserver.objects(SLICES)
    assert obj["spec"]["pool"]["generation"] == 1
    assert device_names(apiserver) == sorted(g for g in GPUS if g != "gpu-3")
    hardware.set()
    await resync(controller)
    assert device_names(apiserver) == sorted(GPUS)
    assert slice_writes(apiserver) == ["update", "update"]


async def test_pool_that_needs_two_slices(
    apiserver: LocalApiServer, running: Running, tmp_path: Path
) -> None:
    hardware = Hardware(tmp_path, profile="synthetic-200gpu")
    controller = running.start(hardware.discover)
    await published(controller)
    assert slice_writes(apiserver) == ["create", "create"]
    names = sorted(s["metadata"]["name"] for s in apiserver.objects(SLICES))
    assert [n[:6] for n in names] == ["00000-", "00001-"]
    assert len(device_names(apiserver)) == 200
    apiserver.requests.clear()
    await resync(controller)
    assert slice_writes(apiserver) == []
    hardware.set(removedGpus=[150])
    await resync(controller)
    assert slice_writes(apiserver) == ["update"]  # only the second slice changed
    assert "gpu-150" not in device_names(apiserver)
    assert {s["spec"]["pool"]["generation"] for s in apiserver.objects(SLICES)} == {1}


@pytest.mark.parametrize("profile", ["p5.48xlarge", "synthetic-200gpu"])
async def test_discover_prints_the_names_the_controller_writes(
    apiserver: LocalApiServer,
    running: Running,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    profile: str,
) -> None:
    """One naming rule: what ``gpu-dra discover`` shows is what lands in the API server."""
    from cli import main

    argv = ["discover", "--nvml", "simulated", "--profile", profile, "--node-name", NODE]
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*argv, "-o", "json"]) == 0
    printed = [s["metadata"]["name"] for s in json.loads(capsys.readouterr().out)["items"]]
    controller = running.start(Hardware(tmp_path, profile=profile).discover)
    await published(controller)
    written = [s["metadata"]["name"] for s in apiserver.objects(SLICES)]
    assert sorted(written) == sorted(printed)
    assert printed[0] == f"00000-{DRIVER}-{NODE}"


async def test_failed_discovery_keeps_published_slices(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.requests.clear()
    hardware.set(nvml="not-loaded")
    with pytest.raises(NvmlNotReadyError):
        await hardware.discover()
    controller.trigger()
    # The failed rediscovery must not count as a finished resync...
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(controller.resync(), 0.5)
    assert slice_writes(apiserver) == []
    assert device_names(apiserver) == sorted(GPUS)
    # ...and once NVML is back, the same GPUs mean no writes.
    hardware.set()
    await resync(controller)
    assert slice_writes(apiserver) == []


async def test_inventory_error_before_first_publish_publishes_nothing(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    hardware.set(nvml="not-loaded")
    controller = running.start(hardware.discover, resync_period=0.05)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(controller.published.wait(), 0.3)
    assert apiserver.objects(SLICES) == []
    hardware.set()
    await published(controller)
    assert device_names(apiserver) == sorted(GPUS)


# ---- others' changes --------------------------------------------------------------------------


async def test_foreign_edit_is_restored(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    api_client: Any,
    pool: PoolWatch,
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    [obj] = apiserver.objects(SLICES)
    obj["spec"]["devices"] = obj["spec"]["devices"][:2]
    await Client(api_client).request(
        "PUT",
        f"/apis/resource.k8s.io/v1/resourceslices/{obj['metadata']['name']}",
        verb="update",
        resource=SLICES,
        body=obj,
    )
    await pool.until(lambda: device_names(apiserver) == sorted(GPUS), "edit restored")
    assert len(apiserver.objects(SLICES)) == 1


async def test_kubelet_wipe_by_delete_collection_is_restored(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    api_client: Any,
    pool: PoolWatch,
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    old = apiserver.objects(SLICES)[0]["metadata"]["uid"]
    # What the kubelet does at start and 30 s after the plugin went away.
    await Client(api_client).request(
        "DELETE",
        "/apis/resource.k8s.io/v1/resourceslices",
        verb="deletecollection",
        resource=SLICES,
        query=[("fieldSelector", f"spec.nodeName={NODE},spec.driver={DRIVER}")],
    )
    await pool.until(
        lambda: [s["metadata"]["uid"] for s in apiserver.objects(SLICES)] not in ([], [old]),
        "slices restored",
    )
    assert device_names(apiserver) == sorted(GPUS)
    assert len(apiserver.objects(SLICES)) == 1


async def test_node_deletion_garbage_collects_and_is_not_fought(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.delete("nodes", NODE)
    assert apiserver.objects(SLICES) == []  # the server's garbage collector
    apiserver.requests.clear()
    await resync(controller)
    assert slice_writes(apiserver) == []
    assert apiserver.objects(SLICES) == []
    # The node comes back (new UID): the slices follow, owned by the new Node.
    [new_node] = apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    await resync(controller)
    [obj] = apiserver.objects(SLICES)
    assert obj["metadata"]["ownerReferences"][0]["uid"] == new_node["metadata"]["uid"]


async def test_a_name_deleted_and_recreated_is_still_repaired(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    api_client: Any,
    pool: PoolWatch,
) -> None:
    """Slice names are fixed, so a deleted name comes back; its later edits must count.

    Issue 13, defect 1: the deleted name was remembered and every later event for it
    dropped, so an edit after the re-create stayed through every resync.
    """
    controller = running.start(hardware.discover)
    await published(controller)
    old = apiserver.objects(SLICES)[0]["metadata"]["uid"]
    await Client(api_client).request(
        "DELETE",
        "/apis/resource.k8s.io/v1/resourceslices",
        verb="deletecollection",
        resource=SLICES,
        query=[("fieldSelector", f"spec.nodeName={NODE},spec.driver={DRIVER}")],
    )
    await pool.until(
        lambda: [s["metadata"]["uid"] for s in apiserver.objects(SLICES)] not in ([], [old]),
        "slices re-created",
    )
    [obj] = apiserver.objects(SLICES)
    obj["spec"]["devices"] = obj["spec"]["devices"][:3]
    await Client(api_client).request(
        "PUT",
        f"/apis/resource.k8s.io/v1/resourceslices/{obj['metadata']['name']}",
        verb="update",
        resource=SLICES,
        body=obj,
    )
    await pool.until(lambda: device_names(apiserver) == sorted(GPUS), "edit after re-create")
    assert len(apiserver.objects(SLICES)) == 1


async def test_a_slice_the_controller_deleted_and_recreated_is_still_repaired(
    apiserver: LocalApiServer, running: Running, tmp_path: Path, api_client: Any, pool: PoolWatch
) -> None:
    """The same through the controller's own delete: the pool shrinks to one slice, grows."""
    hardware = Hardware(tmp_path, profile="synthetic-200gpu")
    controller = running.start(hardware.discover)
    await published(controller)
    second = f"00001-{DRIVER}-{NODE}"
    hardware.set(removedGpus=list(range(100, 200)))
    await resync(controller)
    assert [s["metadata"]["name"] for s in apiserver.objects(SLICES)] == [f"00000-{DRIVER}-{NODE}"]
    hardware.set()
    await resync(controller)
    assert len(device_names(apiserver)) == 200
    [obj] = [s for s in apiserver.objects(SLICES) if s["metadata"]["name"] == second]
    obj["spec"]["devices"] = obj["spec"]["devices"][:3]
    await Client(api_client).request(
        "PUT",
        f"/apis/resource.k8s.io/v1/resourceslices/{second}",
        verb="update",
        resource=SLICES,
        body=obj,
    )
    await pool.until(lambda: len(device_names(apiserver)) == 200, "edit of a re-used name")


async def test_node_recreated_gets_its_slices_without_a_resync(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    """Issue 13, defect 5: the slices came back only at the next resync (10 minutes)."""
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.delete("nodes", NODE)
    # Wait until the controller has seen the owner go (its GET of the Node got a 404).
    await pool.until(
        lambda: any(
            r.verb == "get" and r.resource == "nodes" and r.code == 404 for r in apiserver.requests
        ),
        "the controller noticed the deletion",
    )
    [new_node] = apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    uid = new_node["metadata"]["uid"]
    await pool.until(
        lambda: (
            [s["metadata"]["ownerReferences"][0]["uid"] for s in apiserver.objects(SLICES)] == [uid]
        ),
        "slices owned by the new Node",
    )
    assert device_names(apiserver) == sorted(GPUS)


# ---- faults ---------------------------------------------------------------------------------


async def test_conflict_on_update_rereads_and_retries(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.requests.clear()
    apiserver.faults.fail("update", SLICES, code=409, times=1)
    hardware.set(removedGpus=[0])
    await resync(controller)
    assert slice_writes(apiserver) == ["update"]
    assert calls(apiserver, "update") == 2
    assert relists(apiserver) == 1  # the re-read
    assert device_names(apiserver) == GPUS[1:]
    # What the metrics report: the writes that went through, and the one that failed.
    assert controller.stats.writes == {"create": 1, "update": 1}
    assert controller.stats.failures == {"ConflictError": 1}


async def test_server_errors_on_create_end_with_one_slice(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    apiserver.faults.fail("create", SLICES, code=500, times=2)
    controller = running.start(hardware.discover, request_timeout=0.2)
    await published(controller)
    assert calls(apiserver, "create") == 3
    assert slice_writes(apiserver) == ["create"]
    assert len(apiserver.objects(SLICES)) == 1


async def test_a_rejected_relist_after_a_failed_write_is_retried(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    """Issue 13, defect 4: a 400 on the relist left publishing stalled until the resync."""
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.faults.fail("update", SLICES, code=500, times=1)
    apiserver.faults.fail("watch", SLICES, code=400, times=1)  # the watch list that relists
    hardware.set(removedGpus=[2])
    controller.trigger()
    await pool.until(
        lambda: device_names(apiserver) == [g for g in GPUS if g != "gpu-2"], "retried"
    )
    assert relists(apiserver) >= 2  # the refused relist, then one that worked


async def test_update_timing_out_is_retried(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller = running.start(hardware.discover, request_timeout=0.3)
    await published(controller)
    apiserver.requests.clear()
    apiserver.faults.delay("update", SLICES, seconds=0.6, times=1)
    hardware.set(removedGpus=[4])
    await resync(controller)
    timeouts = [r for r in caplog.records if "no answer" in str(getattr(r, "error", ""))]
    assert len(timeouts) == 1  # the first update timed out...
    assert slice_writes(apiserver) == ["update"]  # ...and the retry went through
    assert device_names(apiserver) == sorted(g for g in GPUS if g != "gpu-4")
    assert len(apiserver.objects(SLICES)) == 1


async def test_lost_create_response_never_duplicates_devices(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    # Watches fail too, so only a fresh list can show the committed slice.
    apiserver.faults.fail("watch", SLICES, code=500, times=-1)
    apiserver.faults.drop_response("create", SLICES, mode="reset")
    controller = running.start(hardware.discover, request_timeout=0.5)
    await published(controller)
    await resync(controller)
    # The one create committed, its answer lost; never a second one.
    creates = [r for r in apiserver.requests if r.verb == "create"]
    assert [r.dropped for r in creates if r.resource.endswith(SLICES)] == [True]
    assert len(apiserver.objects(SLICES)) == 1
    assert pool.violations == []


async def test_create_timing_out_after_commit_never_duplicates(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    apiserver.faults.fail("watch", SLICES, code=500, times=-1)
    # The server commits, then never answers: the client's timeout fires.
    apiserver.faults.drop_response("create", SLICES, mode="timeout")
    controller = running.start(hardware.discover, request_timeout=0.3)
    await published(controller)
    await resync(controller)
    assert calls(apiserver, "create") == 1
    assert len(apiserver.objects(SLICES)) == 1
    assert pool.violations == []


async def test_dropped_watch_resumes_from_its_resource_version(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.requests.clear()
    apiserver.faults.drop_watches()
    # Deleted while the controller may not be watching: the resumed watch replays it.
    apiserver.delete(SLICES, apiserver.objects(SLICES)[0]["metadata"]["name"])
    await pool.until(lambda: device_names(apiserver) == sorted(GPUS), "restored after rewatch")
    assert calls(apiserver, "watch") >= 1
    assert relists(apiserver) == 0  # resumed, not relisted


async def test_expired_watch_relists(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    apiserver.requests.clear()
    # Move the store past what the controller has seen, then forget the history (all in
    # one step of the loop, so no bookmark brings the controller up to date in between).
    apiserver.seed({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other"}})
    apiserver.compact()
    apiserver.faults.drop_watches()
    apiserver.delete(SLICES, apiserver.objects(SLICES)[0]["metadata"]["name"])
    await pool.until(lambda: device_names(apiserver) == sorted(GPUS), "restored after relist")
    assert relists(apiserver) == 1


async def test_api_server_outage_is_ridden_out(
    apiserver: LocalApiServer, running: Running, hardware: Hardware, pool: PoolWatch
) -> None:
    controller = running.start(hardware.discover)
    await published(controller)
    await apiserver.stop()  # connection refused from now on
    hardware.set(removedGpus=[7])
    controller.trigger()
    await apiserver.start()
    await pool.until(lambda: device_names(apiserver) == GPUS[:7], "caught up after outage")
    assert len(apiserver.objects(SLICES)) == 1


async def test_forbidden_is_one_clear_log_line(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    pool: PoolWatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    apiserver.faults.forbid("create", SLICES)
    controller = running.start(hardware.discover)
    await pool.until(lambda: calls(apiserver, "create") >= 4, "several refused creates")
    lines = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith(
        "forbidden: cannot create resourceslices.resource.k8s.io; grant the ClusterRole"
    )
    apiserver.faults.clear()
    await published(controller)
    assert device_names(apiserver) == sorted(GPUS)


async def test_a_node_joining_costs_its_read_one_watch_list_and_one_create(
    apiserver: LocalApiServer, running: Running, hardware: Hardware
) -> None:
    """What a new node's first publish asks of the API server: the Node (its UID, for the
    owner reference), one watch list (the current slices, then the live stream) and one
    create; the helper's three. No publisher lease: the pool was empty (a rival's slices
    would have been listed, or its create refused against ours)."""
    apiserver.requests.clear()
    controller = running.start(hardware.discover)
    await published(controller)
    mine = [
        (r.verb, r.resource.rsplit("/", 1)[-1], r.code)
        for r in apiserver.requests
        if r.user_agent != MONITOR_AGENT
    ]
    assert sorted(mine) == [
        ("create", SLICES, 201),
        ("get", "nodes", 200),
        ("watch", SLICES, 200),
    ]
    assert relists(apiserver) == 1


async def test_a_server_without_watch_lists_gets_a_list_and_a_watch(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kubernetes 1.33's default (WatchList off) refuses sendInitialEvents with a 422."""
    apiserver.faults.fail("watch", SLICES, code=422, message="sendInitialEvents is forbidden")
    apiserver.requests.clear()
    controller = running.start(hardware.discover)
    await published(controller)
    assert device_names(apiserver) == sorted(GPUS)
    assert calls(apiserver, "list") == 1
    assert [r.getMessage() for r in caplog.records if "stream lists" in r.getMessage()] == [
        "the API server does not stream lists; listing instead"
    ]
    controller.trigger(relist=True)
    await resync(controller)
    assert calls(apiserver, "list") == 2  # remembered: no second try of a watch list


async def test_server_without_resource_v1_stops_with_one_clear_error(
    apiserver: LocalApiServer, api_client: Any, hardware: Hardware, node: dict[str, Any]
) -> None:
    apiserver.faults.serve_resource_v1 = False
    controller = SliceController(
        api_client,
        node_name=NODE,
        driver_name=DRIVER,
        devices=node_devices(hardware.discover, node_name=NODE, kinds=gpu_kinds()).published,
    )
    with pytest.raises(ApiVersionMissingError, match=r"does not serve resource\.k8s\.io/v1"):
        await asyncio.wait_for(controller.run(), TIMEOUT)


async def test_unknown_node_is_a_clear_error(
    apiserver: LocalApiServer, api_client: Any, hardware: Hardware
) -> None:
    controller = SliceController(
        api_client,
        node_name="no-such-node",
        driver_name=DRIVER,
        devices=node_devices(
            hardware.discover, node_name="no-such-node", kinds=gpu_kinds()
        ).published,
    )
    with pytest.raises(NodeNotFoundError, match="no-such-node"):
        await asyncio.wait_for(controller.run(), TIMEOUT)


# ---- two instances --------------------------------------------------------------------------


async def test_two_instances_for_one_node_converge_to_the_newer(
    apiserver: LocalApiServer, running: Running, tmp_path: Path, pool: PoolWatch
) -> None:
    old_hw = Hardware(tmp_path / "old")
    new_hw = Hardware(tmp_path / "new")
    new_hw.set(removedGpus=[5])  # the two disagree, as two versions might
    old = running.start(old_hw.discover, identity="old")
    await published(old)
    apiserver.requests.clear()
    new = running.start(new_hw.discover, identity="new")
    await published(new)
    for _ in range(5):
        await resync(old)
        await resync(new)
    assert old.standby and not new.standby
    assert device_names(apiserver) == sorted(g for g in GPUS if g != "gpu-5")
    # The newer instance finds slices it did not write: it creates the lease, then
    # updates the slice; the old instance never writes back.
    assert [(r.verb, r.resource.rsplit("/", 1)[-1]) for r in apiserver.requests.writes()] == [
        ("create", "leases"),
        ("update", "resourceslices"),
    ]
    [lease] = apiserver.objects("leases")
    assert lease["spec"]["holderIdentity"] == "new"


async def test_two_instances_starting_at_once_never_duplicate_and_the_newer_wins(
    apiserver: LocalApiServer, running: Running, tmp_path: Path, pool: PoolWatch
) -> None:
    """A fresh node (or one the kubelet just wiped) with two instances: the fixed slice
    name makes the server refuse the second create, whose 409 is the loser's evidence
    of a rival; the lease then settles on the newer process."""
    old_hw = Hardware(tmp_path / "old")
    new_hw = Hardware(tmp_path / "new")
    new_hw.set(removedGpus=[5])
    old = running.start(old_hw.discover, identity="old")
    new = running.start(new_hw.discover, identity="new")
    await published(old)
    await published(new)
    for _ in range(5):
        await resync(old)
        await resync(new)
    assert old.standby and not new.standby
    assert len(apiserver.objects(SLICES)) == 1
    assert device_names(apiserver) == sorted(g for g in GPUS if g != "gpu-5")
    [lease] = apiserver.objects("leases")
    assert lease["spec"]["holderIdentity"] == "new"
    assert len(apiserver.requests.writes()) <= 6


async def test_stopping_the_holder_releases_the_lease_for_the_standby(
    apiserver: LocalApiServer, running: Running, tmp_path: Path
) -> None:
    old_hw = Hardware(tmp_path / "old")
    new_hw = Hardware(tmp_path / "new")
    old = running.start(old_hw.discover, identity="old")
    await published(old)
    new = running.start(new_hw.discover, identity="new")
    await published(new)
    new_hw.set(removedGpus=[1])
    await resync(new)
    await resync(old)
    assert old.standby
    running.tasks[1].cancel()  # SIGTERM of the new instance
    await asyncio.gather(running.tasks[1], return_exceptions=True)
    assert apiserver.objects("leases")[0]["spec"].get("holderIdentity") is None
    assert device_names(apiserver) == sorted(g for g in GPUS if g != "gpu-1")  # left in place
    await resync(old)
    assert not old.standby
    assert device_names(apiserver) == sorted(GPUS)


async def test_a_slice_no_write_made_seen_by_the_watch_is_a_rivals(
    apiserver: LocalApiServer,
    running: Running,
    hardware: Hardware,
    api_client: Any,
    pool: PoolWatch,
) -> None:
    """The surge defect's evidence: a slice of this node that no write of ours made, seen
    as a watch event after the list (nothing fails, so no list shows it), is another
    instance's; the repair that follows goes through the publisher lease, which it creates.
    Were only a list's slices evidence, the repair would read no lease and write none."""
    controller = running.start(hardware.discover, identity="old")
    await published(controller)
    [ours] = apiserver.objects(SLICES)
    rival = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"rival-{NODE}",
            "ownerReferences": ours["metadata"]["ownerReferences"],
        },
        "spec": {
            **ours["spec"],
            "pool": {"name": "rival-pool", "generation": 1, "resourceSliceCount": 1},
            "devices": [{**ours["spec"]["devices"][0], "name": "rival-0"}],
        },
    }
    apiserver.requests.clear()
    await Client(api_client).request(
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices",
        verb="create",
        resource=SLICES,
        body=rival,
    )
    await pool.until(
        lambda: (
            [s["metadata"]["name"] for s in apiserver.objects(SLICES)] == [ours["metadata"]["name"]]
        ),
        "the rival's slice deleted",
    )
    assert relists(apiserver) == 0  # it came by the watch
    assert [lease["spec"]["holderIdentity"] for lease in apiserver.objects("leases")] == ["old"]
    assert device_names(apiserver) == sorted(GPUS)
