"""The health monitor when its disk or its state file fails: a failed write of
``health.json`` is logged and the daemon goes on serving (the taint is still published,
the next write catches up), the write runs off the event loop, and a state file that
cannot be understood keeps the node not ready instead of crashing it or reading it as
"no taints"."""

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from driver.common import fsutil
from driver.common.errors import PermanentError
from driver.nvml.faults import write_state_file
from drivers.gpu import node
from drivers.gpu.healthmonitor import STATE_FILE, HealthMonitor, HealthStateError
from drivers.gpu.model import devicehealth
from drivers.gpu.model.devicehealth import Taint, Xid
from kubeletplugin.healthstream import HealthBoard
from tests.pluginharness import NodeDirs, create_node, health_status, logged_health_port, wait_for

NODE = "node-h"
XID79 = Taint(devicehealth.XID_KEY, "79", "NoSchedule")
XID79_PUBLISHED = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}


async def _taints(api: Any) -> dict[str, list[dict[str, str]]]:
    from kubernetes.aio import client

    found = await client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={NODE}"
    )
    return {
        device.name: [
            {"key": t.key, "value": t.value or "", "effect": t.effect} for t in device.taints or []
        ]
        for item in found.items
        for device in item.spec.devices or []
    }


async def _until_taints(
    api: Any, running: "asyncio.Task[int]", predicate: Any, within: float = 30.0
) -> dict[str, list[dict[str, str]]]:
    deadline = time.monotonic() + within
    while True:
        assert not running.done(), f"the daemon ended with {running.result()}"
        taints = await _taints(api)
        if taints and predicate(taints):
            return taints
        assert time.monotonic() < deadline, f"slices never matched: {taints}"
        await asyncio.sleep(0.05)


def _inject(state: Path, hup: asyncio.Event, *gpus: int) -> None:
    # The simulated library re-reads its state at the nvmlInit of a rediscovery; an event
    # set goes on from the last XID it delivered, so the list only grows.
    write_state_file(state, {"xidEvents": [{"gpu": gpu, "xid": 79} for gpu in gpus]})
    hup.set()


async def test_a_failed_health_write_is_logged_and_the_daemon_goes_on_serving(
    kube: tuple[Any, Path], dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    state = dirs.root / "sim-state.yaml"
    write_state_file(state, {})
    config = dirs.node_config(kubeconfig, node_name=NODE, profile="p5.48xlarge", sim_state=state)
    stop, hup = asyncio.Event(), asyncio.Event()
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(node.run(config, stop, hup=hup))
    health_file = dirs.plugin_data / STATE_FILE
    try:
        await _until_taints(api, running, lambda t: len(t) == 8)
        # A real failure of the rename under the write: a directory where the file goes.
        health_file.mkdir()
        (health_file / "in-the-way").write_text("")

        _inject(state, hup, 3)
        taints = await _until_taints(api, running, lambda t: any(t.values()))
        (tainted,) = [name for name, ts in taints.items() if ts]
        assert taints[tainted] == [XID79_PUBLISHED]  # published although not persisted
        await wait_for(
            lambda: any(STATE_FILE in str(getattr(r, "error", "")) for r in caplog.records),
            "the failed write's log line",
        )
        failed = [r for r in caplog.records if STATE_FILE in str(getattr(r, "error", ""))]
        assert failed[0].levelname == "ERROR" and getattr(failed[0], "loop", "") == (
            "health-monitor"
        )
        assert not running.done()
        assert (
            await health_status(logged_health_port(caplog.records))
            == health_pb2.HealthCheckResponse.SERVING
        )

        (health_file / "in-the-way").unlink()
        health_file.rmdir()
        _inject(state, hup, 3, 5)
        taints = await _until_taints(api, running, lambda t: sum(bool(v) for v in t.values()) == 2)

        def persisted() -> dict[str, tuple[Taint, ...]]:
            if not health_file.is_file():
                return {}
            return devicehealth.loads(health_file.read_text())

        # The next event's write holds both taints: the one whose write failed too.
        await wait_for(lambda: len(persisted()) == 2, "health.json with both taints")
        assert set(persisted().values()) == {(XID79,)}
        assert not running.done()
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


async def test_the_health_write_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    written = threading.Event()
    release = threading.Event()
    writers: list[int] = []
    responsive: list[bool] = []
    real = fsutil.write_atomic

    def spy(path: Path, content: bytes, *, fsync: bool) -> None:
        writers.append(threading.get_ident())
        written.set()
        # Only a loop that is free while the write blocks can release it: on the loop's
        # own thread this wait would time out.
        responsive.append(release.wait(10))
        real(path, content, fsync=fsync)

    monkeypatch.setattr("drivers.gpu.healthmonitor.write_atomic", spy)
    monitor = HealthMonitor(tmp_path, HealthBoard(), pool="node-a", window=0.01)
    monitor.set_devices({"GPU-a": "gpu-0"})
    runner = asyncio.create_task(monitor.run(clear_check=0.05))
    try:
        monitor.submit([Xid("GPU-a", 79)])
        assert await asyncio.to_thread(written.wait, 10)
        release.set()  # from the loop, while the write is under way
        await wait_for(lambda: (tmp_path / STATE_FILE).is_file(), "health.json", 10)
    finally:
        release.set()
        runner.cancel()
    assert writers and loop_thread not in writers
    assert responsive == [True]
    assert devicehealth.loads((tmp_path / STATE_FILE).read_text()) == {"GPU-a": (XID79,)}


# A health.json this release cannot understand: each is refused, none read as "no taints".
_WRITTEN = devicehealth.dumps({"GPU-a": (XID79,)})
_UNREADABLE = {
    "truncated": _WRITTEN[: len(_WRITTEN) // 2],
    "empty": "",
    "taints-a-string": '{"version": 1, "taints": "GPU-a"}',
    "taint-list-a-string": '{"version": 1, "taints": {"GPU-a": "xid=79"}}',
    "taint-an-int": '{"version": 1, "taints": {"GPU-a": [79]}}',
    "key-a-number": '{"version": 1, "taints": {"GPU-a": [{"key": 1, "value": "79",'
    ' "effect": "NoSchedule"}]}}',
    "value-missing": '{"version": 1, "taints": {"GPU-a": [{"key": "gpu.nvidia.com/xid",'
    ' "effect": "NoSchedule"}]}}',
    "a-list": "[1, 2]",
    "version-2": '{"version": 2, "taints": {}}',
}


@pytest.mark.parametrize("text", _UNREADABLE.values(), ids=_UNREADABLE.keys())
def test_a_state_file_that_cannot_be_understood_is_refused_not_read_as_no_taints(
    tmp_path: Path, text: str
) -> None:
    (tmp_path / STATE_FILE).write_text(text)
    with pytest.raises(HealthStateError) as refused:
        HealthMonitor(tmp_path, HealthBoard(), pool="node-a")
    message = str(refused.value)
    assert str(tmp_path / STATE_FILE) in message and "remove" in message
    assert isinstance(refused.value, PermanentError)  # no retry reads it differently
    assert isinstance(refused.value.__cause__, ValueError)
    assert (tmp_path / STATE_FILE).read_text() == text  # left for the admin to judge


def test_no_state_file_is_no_taints_and_a_written_one_is_read(tmp_path: Path) -> None:
    assert HealthMonitor(tmp_path, HealthBoard(), pool="node-a").taints == {}
    (tmp_path / STATE_FILE).write_text(_WRITTEN)
    assert HealthMonitor(tmp_path, HealthBoard(), pool="node-a").taints == {"GPU-a": (XID79,)}


@pytest.mark.parametrize("case", ["taint-list-a-string", "truncated"])
async def test_the_node_stays_up_not_ready_with_one_line_until_the_file_is_dealt_with(
    apiserver: Any,
    kube: tuple[Any, Path],
    dirs: NodeDirs,
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    api, kubeconfig = kube
    await create_node(api, NODE)
    dirs.plugin_data.mkdir(parents=True)
    health_file = dirs.plugin_data / STATE_FILE
    health_file.write_text(_UNREADABLE[case])
    config = dirs.node_config(kubeconfig, node_name=NODE, profile="p5.48xlarge")
    stop = asyncio.Event()
    caplog.set_level(logging.INFO)
    running = asyncio.create_task(node.run(config, stop))

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if STATE_FILE in r.getMessage()]

    try:
        await wait_for(
            lambda: bool(lines()) or running.done() or dirs.paths().registration.exists(),
            "the refusal's log line",
        )
        assert not running.done(), "the plugin ended instead of waiting, not ready"
        assert not dirs.paths().registration.exists(), "registered with the file unread"
        # Setup retries every 0.2 s here, reading the Node each time: still one line.
        reads = apiserver.requests.count("get", "nodes")
        await wait_for(
            lambda: apiserver.requests.count("get", "nodes") >= reads + 3, "three setup retries"
        )
        assert len(lines()) == 1, lines()
        assert str(health_file) in lines()[0] and "remove" in lines()[0]
        assert (
            await health_status(logged_health_port(caplog.records))
            == health_pb2.HealthCheckResponse.NOT_SERVING
        )
        assert not dirs.paths().registration.exists()
        assert not (await _taints(api))  # nothing published as healthy meanwhile

        health_file.unlink()  # what the line says to do, having checked the GPUs
        await wait_for(dirs.paths().registration.is_socket, "registration after the removal")
        assert not running.done()
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0
