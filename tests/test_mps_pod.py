"""MPS with ``--mps-daemon=pod``: each GPU's control daemon a pod of its own in the driver's
namespace (``drivers.gpu.kinds.mpspod``), against the local API server, with
:class:`tests.podrunner.PodRunner` as the node's kubelet running the pod's container (the
stand-in daemon of :mod:`tests.test_mps`). A plugin that restarts, or a second plugin of
the node, adopts the pod; the last unprepare deletes it; a pod that will not serve fails
its claim alone and is deleted; a pod that lost its last claim to a crash is deleted."""

import asyncio
import contextlib
import copy
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.common.errors import PermanentError
from driver.kube.rest import Client, ForbiddenError
from driver.kube.session import Session
from drivers.gpu.kinds import mpspaths
from drivers.gpu.kinds.mpspod import (
    DaemonSpec,
    MpsPodConfig,
    MpsPods,
    daemon_pod,
    failure,
    pod_name,
)
from kubeletplugin.state import DeviceState
from sandbox.apiserver import LocalApiServer
from tests.pluginharness import wait_for
from tests.podrunner import PodRunner
from tests.standin import short_dir
from tests.test_chart_policy import _policy, evaluate
from tests.test_mps import Control, daemon_pids, mps
from tests.test_state import DRIVER, NODE, _config, _inventory, create_claim, devices_of
from tests.test_timeslicing import Smi

NAMESPACE = "gpu-dra"
IMAGE = "gpu-dra-driver:0.1.0"
POD_CONFIG = MpsPodConfig(namespace=NAMESPACE, image=IMAGE, pull_policy="IfNotPresent",
                          pull_secrets=("regcred",))  # fmt: skip


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Short: the daemons' sockets live under it."""
    with short_dir() as path:
        yield path


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    yield Control(tmp_path / "mps-control")
    for pid in daemon_pids(tmp_path):  # whatever a failed test left running
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def runner(apiserver: LocalApiServer) -> AsyncIterator[PodRunner]:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    async with PodRunner(apiserver, NODE) as running:
        yield running


async def _state(api: Session, tmp_path: Path, smi: Smi, control: Control) -> DeviceState:
    pods = MpsPods(Client(api), asyncio.get_running_loop(), POD_CONFIG, NODE)
    config = _config(tmp_path, nvidia_smi=smi.path, mps_control=control.path, mps_pods=pods,
                     nvidia_driver_root=Path("/host/driver"))  # fmt: skip
    devices = devices_of(_inventory("p5.48xlarge", tmp_path), config)
    return await DeviceState.open(config, api, devices)


def _uuid(tmp_path: Path, device: str) -> str:
    return _inventory("p5.48xlarge", tmp_path).by_device_name()[device].uuid


def _gpu_dir(tmp_path: Path, uuid: str) -> Path:
    return tmp_path / "plugins" / DRIVER / "kinds" / "gpu" / "mps" / uuid


def _pipe(tmp_path: Path, uuid: str) -> Path:
    return mpspaths.pipe_dir(tmp_path / "plugins" / DRIVER, uuid)


async def test_a_daemon_pod_per_gpu_adopted_by_the_next_plugin_deleted_at_the_last_unprepare(
    api_client: Session, tmp_path: Path, control: Control, runner: PodRunner
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-0")
    ref = await create_claim(api_client, "mps", ["gpu-0"], config=[mps()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    assert smi.calls() == [f"-i {uuid} -c EXCLUSIVE_PROCESS"]
    assert control.calls() == [f"-f CUDA_VISIBLE_DEVICES={uuid}"]
    (pod,) = runner.pods()
    gpu_dir = _gpu_dir(tmp_path, uuid)
    assert pod["metadata"]["name"] == pod_name(NODE, uuid)
    assert pod["metadata"]["namespace"] == NAMESPACE
    spec = pod["spec"]
    assert (spec["nodeName"], spec["hostPID"], spec["restartPolicy"]) == (NODE, True, "OnFailure")
    assert spec["automountServiceAccountToken"] is False
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    (container,) = spec["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (IMAGE, "IfNotPresent")
    assert container["command"] == [str(control.path), "-f"]
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "CUDA_VISIBLE_DEVICES": uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(_pipe(tmp_path, uuid)),
        "CUDA_MPS_LOG_DIRECTORY": str(gpu_dir / "log"),
    }
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]} == {
        "driver-root": "/host/driver", "pipe": str(_pipe(tmp_path, uuid)),
        "log": str(gpu_dir / "log"),
    }  # fmt: skip
    (pid,) = daemon_pids(tmp_path)
    assert runner.started == [pod["metadata"]["name"]]

    # A plugin restart, then a second plugin of the node (a surge): the pod is adopted.
    for _ in range(2):
        state = await _state(api_client, tmp_path, smi, control)
        assert (await state.prepare([ref]))[ref.uid].error == ""
        await state.watch()
    (again,) = runner.pods()
    assert again["metadata"]["uid"] == pod["metadata"]["uid"] and runner.started == [
        pod["metadata"]["name"]]  # fmt: skip
    assert daemon_pids(tmp_path) == [pid] and control.calls() == [] and smi.calls() == []

    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert control.calls() == ["quit"]
    assert smi.calls() == [f"-i {uuid} -c DEFAULT"]
    assert runner.pods() == [] and daemon_pids(tmp_path) == []
    assert not (gpu_dir / "pod").exists()


async def test_a_pod_that_will_not_serve_fails_its_claim_alone_and_is_deleted(
    api_client: Session, tmp_path: Path, control: Control, runner: PodRunner
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    good = await create_claim(api_client, "good", ["gpu-0"])
    failing = await create_claim(api_client, "failing", ["gpu-4"], config=[mps()])
    control.fail.touch()
    results = await state.prepare([good, failing])
    assert results[good.uid].error == ""
    error = results[failing.uid].error
    assert "the MPS control daemon for GPU" in error and "CrashLoopBackOff" in error, error
    assert "the daemon exited with 1" in error, error
    uuid = _uuid(tmp_path, "gpu-4")
    assert runner.pods() == [] and daemon_pids(tmp_path) == []
    assert smi.calls() == [f"-i {uuid} -c EXCLUSIVE_PROCESS", f"-i {uuid} -c DEFAULT"]
    assert not (_gpu_dir(tmp_path, uuid) / "pod").exists()
    control.fail.unlink()
    assert (await state.prepare([failing]))[failing.uid].error == ""  # the kubelet's retry
    assert len(runner.pods()) == 1 and len(daemon_pids(tmp_path)) == 1
    assert await state.unprepare([failing, good]) == {failing.uid: "", good.uid: ""}
    assert runner.pods() == []


async def test_a_pod_gone_under_its_claims_is_made_again_and_one_without_claims_deleted(
    api_client: Session,
    apiserver: LocalApiServer,
    tmp_path: Path,
    control: Control,
    runner: PodRunner,
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-0")
    ref = await create_claim(api_client, "mps", ["gpu-0"], config=[mps()])
    assert (await state.prepare([ref]))[ref.uid].error == ""
    name = pod_name(NODE, uuid)
    apiserver.delete("pods", name, NAMESPACE)  # a person, or an eviction
    await wait_for(lambda: daemon_pids(tmp_path) == [], "the daemon stopped with its pod")
    await state.watch()
    await wait_for(lambda: len(daemon_pids(tmp_path)) == 1, "the daemon back")
    assert [p["metadata"]["name"] for p in runner.pods()] == [name] and runner.started == [name] * 2

    # A SIGKILL between the last holder's removal and the pod's deletion: what is left is a
    # pod and its record without a holder. The watchdog deletes it.
    (_gpu_dir(tmp_path, uuid) / "holders" / ref.uid).unlink()
    await state.watch()
    assert runner.pods() == [] and daemon_pids(tmp_path) == []
    assert smi.calls()[-1] == f"-i {uuid} -c DEFAULT"

    # A pod of this node whose GPU has no holder and no record of it (its state directory
    # lost): the next plugin's first watch deletes it; another node's pod is left alone.
    other = DaemonSpec("node-other", uuid, control.path, _pipe(tmp_path, uuid),
                       _gpu_dir(tmp_path, uuid) / "log", Path("/"), Path("/"))  # fmt: skip
    gone = _uuid(tmp_path, "gpu-3")
    mine = DaemonSpec(NODE, gone, control.path, _pipe(tmp_path, gone),
                      _gpu_dir(tmp_path, gone) / "log", Path("/"), Path("/"))  # fmt: skip
    for spec in (other, mine):
        apiserver.put(daemon_pod(POD_CONFIG, spec))
    state = await _state(api_client, tmp_path, smi, control)
    await state.watch()
    assert runner.pods() == []
    left = [p["spec"]["nodeName"] for p in apiserver.objects("pods", NAMESPACE)]
    assert left == ["node-other"]
    assert await state.unprepare([ref]) == {ref.uid: ""}


def _spec(tmp_path: Path, control: Control, uuid: str, node: str = NODE) -> DaemonSpec:
    """The daemon :func:`_state`'s plugin makes for ``uuid`` (on ``node``)."""
    logs = _gpu_dir(tmp_path, uuid) / "log"
    return DaemonSpec(node, uuid, control.path, _pipe(tmp_path, uuid), logs, Path("/host/driver"),
                      Path("/"))  # fmt: skip


def _squatter(tmp_path: Path, control: Control, uuid: str, how: str) -> dict[str, Any]:
    """A pod under the name of this node's daemon of ``uuid`` that its plugin did not make:
    another node's plugin's (which the chart's policy lets pin a pod to its own node only),
    or one of this node with another image or command."""
    if how == "another node":
        pod = daemon_pod(POD_CONFIG, _spec(tmp_path, control, uuid, "node-other"))
        pod["metadata"]["name"] = pod_name(NODE, uuid)
        return pod
    pod = daemon_pod(POD_CONFIG, _spec(tmp_path, control, uuid))
    (container,) = pod["spec"]["containers"]
    if how == "another image":
        container["image"] = "registry.example/busybox:1"  # the same daemon, another's image
    else:
        container["command"] = ["sleep", "600"]
    return pod


SQUATS = {
    "another node": "node 'node-other', not 'node-a'",
    "another image": "image 'registry.example/busybox', not 'gpu-dra-driver'",
    "another command": "command ['sleep', '600'], not [",
}


@pytest.mark.parametrize("how", list(SQUATS))
async def test_a_pod_taking_the_daemons_name_is_neither_adopted_nor_deleted(
    api_client: Session,
    apiserver: LocalApiServer,
    tmp_path: Path,
    control: Control,
    runner: PodRunner,
    how: str,
) -> None:
    smi = Smi(tmp_path / "smi")
    state = await _state(api_client, tmp_path, smi, control)
    uuid = _uuid(tmp_path, "gpu-0")
    name = pod_name(NODE, uuid)
    squat = apiserver.put(_squatter(tmp_path, control, uuid, how))
    ref = await create_claim(api_client, "mps", ["gpu-0"], config=[mps()])
    error = (await asyncio.wait_for(state.prepare([ref]), 20))[ref.uid].error
    assert f"pod {NAMESPACE}/{name} holds the name of the MPS control daemon of GPU {uuid} " \
        f"on node {NODE}, but it is not that daemon" in error, error  # fmt: skip
    assert SQUATS[how] in error, error
    assert f"delete it (kubectl -n {NAMESPACE} delete pod {name})" in error, error
    assert "ClusterRole" not in error, error
    (left,) = apiserver.objects("pods", NAMESPACE)
    assert left["metadata"]["uid"] == squat["metadata"]["uid"]
    assert apiserver.requests.count("delete", "pods") == 0
    assert apiserver.requests.count("create", "pods") == 0
    assert smi.calls() == [f"-i {uuid} -c DEFAULT"]
    # The watchdog does not take it for the GPU's daemon either.
    await state.watch()
    assert apiserver.requests.count("delete", "pods") == 0

    apiserver.delete("pods", name, NAMESPACE)  # the operator, as the error says
    await wait_for(lambda: runner.running() == 0, "the squatter's container stopped")
    assert (await state.prepare([ref]))[ref.uid].error == ""
    (ours,) = runner.pods()
    assert ours["spec"]["containers"][0]["command"] == [str(control.path), "-f"]
    assert await state.unprepare([ref]) == {ref.uid: ""}
    assert runner.pods() == []


async def test_a_create_answered_409_adopts_only_this_daemon(
    apiserver: LocalApiServer, api_client: Session, tmp_path: Path, control: Control
) -> None:
    """The create's 409 (a create whose answer was lost, the other plugin of a surge): the pod
    there is adopted when it is this daemon, of this release's image or another tag of it, and
    refused, not deleted, when it is not."""
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    pods = MpsPods(Client(api_client), asyncio.get_running_loop(), POD_CONFIG, NODE)
    uuid = _uuid(tmp_path, "gpu-0")
    spec = _spec(tmp_path, control, uuid)

    def create() -> Any:
        return asyncio.to_thread(pods.create, spec)

    def image(pod: dict[str, Any], value: str) -> None:
        pod["spec"]["containers"][0]["image"] = value

    adopted: list[Callable[[dict[str, Any]], object]] = [
        lambda p: None,
        lambda p: image(p, "gpu-dra-driver:0.0.9"),  # the last release's pod, in a surge
        lambda p: image(p, "gpu-dra-driver@sha256:" + "0" * 64),
    ]
    for change in adopted:
        pod = daemon_pod(POD_CONFIG, spec)
        change(pod)
        there = apiserver.put(pod)
        assert (await create())["metadata"]["uid"] == there["metadata"]["uid"]
        apiserver.delete("pods", pod_name(NODE, uuid), NAMESPACE)

    for how, difference in SQUATS.items():
        there = apiserver.put(_squatter(tmp_path, control, uuid, how))
        with pytest.raises(PermanentError, match="it is not that daemon") as refused:
            await create()
        assert difference in str(refused.value), refused.value
        (left,) = apiserver.objects("pods", NAMESPACE)
        assert left["metadata"]["uid"] == there["metadata"]["uid"]
        apiserver.delete("pods", pod_name(NODE, uuid), NAMESPACE)
    labelled = daemon_pod(POD_CONFIG, spec)
    labels = copy.deepcopy(labelled["metadata"]["labels"])
    labelled["metadata"]["labels"] = {**labels, "resource.nvidia.com/computeDomain": "x"}
    apiserver.put(labelled)
    with pytest.raises(PermanentError, match="labels"):
        await create()
    assert apiserver.requests.count("delete", "pods") == 0


def test_why_a_pod_will_not_serve() -> None:
    def pod(phase: str, **container: Any) -> dict[str, Any]:
        return {"status": {"phase": phase, "containerStatuses": [container] if container else []}}

    assert failure(pod("Pending")) is None
    assert failure(pod("Running", state={"running": {}})) is None
    assert failure(pod("Pending", state={"waiting": {"reason": "ContainerCreating"}})) is None
    pull = pod("Pending", state={"waiting": {"reason": "ErrImageNeverPull", "message": "x: Never"}})
    assert failure(pull) == "ErrImageNeverPull: x: Never"
    failed = {"status": {"phase": "Failed", "reason": "OutOfpods"}}
    assert failure(failed) == "the pod is Failed: OutOfpods"
    crashed = pod("Running", state={"terminated": {"exitCode": 2, "reason": "Error"}})
    assert failure(crashed) == "the daemon exited with 2 (Error)"
    assert failure(pod("Succeeded")) == "the pod is Succeeded"


def test_pod_names_are_fixed_by_node_and_gpu_and_valid() -> None:
    uuid = "GPU-9b7e2a4c-1111-2222-3333-444455556666"
    name = pod_name("ip-10-0-1-2.ec2.internal", uuid)
    assert name == pod_name("ip-10-0-1-2.ec2.internal", uuid) != pod_name("other", uuid)
    assert name.startswith("mps-control-daemon-9b7e2a4c-") and len(name) <= 63
    assert name == name.lower()


def test_missing_namespace_or_image_is_refused_with_what_to_set() -> None:
    for namespace, image in (("", IMAGE), (NAMESPACE, "")):
        with pytest.raises(PermanentError, match=r"POD_NAMESPACE.*--image"):
            MpsPodConfig(namespace=namespace, image=image)


@pytest.mark.parametrize("code", [422, 403])
async def test_a_delete_the_charts_policy_refuses_is_not_put_on_rbac(
    apiserver: LocalApiServer,
    api_client: Session,
    tmp_path: Path,
    control: Control,
    code: int,
) -> None:
    """A delete of another node's pod, refused by the chart's policy as the API server words
    it (422, Invalid, as the real one answers, tests/e2e/test_admission.py; or 403, where a
    policy's validation says reason: Forbidden, or a webhook's): the error quotes the refusal,
    and does not send the operator to the ClusterRole, where granting the verb would change
    nothing. RBAC's own 403 still does."""
    pods = MpsPods(Client(api_client), asyncio.get_running_loop(), POD_CONFIG, NODE)
    uuid = _uuid(tmp_path, "gpu-0")
    other = daemon_pod(POD_CONFIG, _spec(tmp_path, control, uuid, "node-other"))
    other["metadata"]["name"] = name = pod_name(NODE, uuid)
    (denial,) = evaluate(_policy("pods"), operation="DELETE", obj=other, user_node=NODE)
    policy = "gpu-dra-driver-mps-daemon-pods"
    message = (f'pods "{name}" is forbidden: ValidatingAdmissionPolicy \'{policy}\' with '
               f"binding '{policy}' denied request: {denial}")  # fmt: skip
    apiserver.faults.fail("delete", "pods", code=code, message=message)
    with pytest.raises(PermanentError) as refused:
        await asyncio.to_thread(pods.delete, uuid, "uid-1")
    assert str(refused.value) == (
        f"refused by admission: cannot delete pods: {message}"
        if code == 403
        else f"delete pods: HTTP 422: {message}"
    )
    apiserver.faults.clear()
    apiserver.faults.forbid("delete", "pods")
    with pytest.raises(ForbiddenError, match="grant the ClusterRole of this driver the verb"):
        await asyncio.to_thread(pods.delete, uuid, "uid-1")
