"""The MPS control daemon as a pod of its own (``--mps-daemon=pod``), not a process of the
plugin's container.

A process of the plugin's container dies with the plugin's pod: its PID namespace ends
with the container, so an upgrade, a rollback or a container restart takes the daemon,
and its CUDA clients lose their server. NVIDIA's driver runs one Deployment per daemon;
this driver runs one bare Pod per GPU, pinned with ``nodeName``, for three reasons:

- the kubelet starts it directly: no Deployment and ReplicaSet controllers between the
  prepare and the daemon, each a hop inside the kubelet's 45 s, and each a part that can
  be down while the node must still prepare;
- its name is fixed by the node and the GPU, so a plugin that restarted, a second plugin
  pod of a surge upgrade, or a create whose answer was lost finds it by name (a create
  answers 409) instead of searching a ReplicaSet's generated names. A name anyone who may
  create pods in the namespace can take first: a pod found under it is adopted only when it
  is what :func:`daemon_pod` makes for this node and GPU (:func:`differences`), and another
  is neither adopted nor deleted (:class:`ForeignPodError`);
- a Deployment recreating a lost pod would not save its clients (a new pod is a new
  server); the kubelet restarts a crashed daemon in place (``restartPolicy: OnFailure``)
  and the plugin's watchdog recreates a pod that went.

The pod runs the control binary itself from the plugin's image (which has no shell), with
the host's driver root mounted where the plugin sees it and the GPU's pipe and log
directories at their host paths, which the plugin's pod sees at the same paths: the plugin
clears and watches the pipe, sends ``quit`` through it, and the pod needs no API access.

:func:`daemon_pod` and :func:`failure` are pure; :class:`MpsPods` is the thin shell. Its
calls block: the kind calls them from worker threads, and they run on the plugin's event
loop, where the one API client lives.
"""

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from driver.common.errors import PermanentError, RetryableError
from driver.common.wire import Obj
from driver.kube.resources import PODS
from driver.kube.rest import Client, ConflictError, NotFoundError

COMPONENT = "mps-control-daemon"
CONTAINER = "mps-control-daemon"
NAME_PREFIX = "mps-control-daemon-"
# Annotations: a node name can be longer than a label value may be.
NODE_ANNOTATION = "gpu.nvidia.com/node"
GPU_ANNOTATION = "gpu.nvidia.com/gpu-uuid"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
_CALL_S = 35.0  # beyond the client's own 30 s request timeout
_POLL_S = 0.1
# A container the kubelet will not run as it is: waiting on a person, not on time.
_STUCK = frozenset({
    "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull",
    "InvalidImageName", "CreateContainerConfigError", "CreateContainerError",
    "RunContainerError",
})  # fmt: skip

T = TypeVar("T")


class MpsPodError(RetryableError):
    """The daemon's pod did not come up or go away in time; a retry may see it through."""


class ForeignPodError(PermanentError):
    """A pod holds the name of this node's daemon of a GPU but is not one this plugin made:
    every retry finds it again until a person deletes it."""


@dataclass(frozen=True, slots=True)
class MpsPodConfig:
    """Where and from what the daemon pods run: the plugin's own namespace and image."""

    namespace: str
    image: str
    pull_policy: str = ""  # "": the cluster's default
    pull_secrets: tuple[str, ...] = ()
    driver_name: str = "gpu.nvidia.com"

    def __post_init__(self) -> None:
        if not self.namespace or not self.image:
            raise PermanentError(
                "--mps-daemon=pod needs the plugin's namespace (POD_NAMESPACE) and its "
                "image (--image, IMAGE_NAME): the daemon pods run there, from it"
            )


@dataclass(frozen=True, slots=True)
class DaemonSpec:
    """One GPU's daemon: what the pod runs and mounts (paths as the plugin sees them,
    which are the host's for ``pipe`` and ``log``: the plugins directory is mounted at its
    path, so the pod binds its sockets at the path the budget was computed for)."""

    node_name: str
    uuid: str
    control: Path  # the control binary, under container_driver_root
    pipe: Path  # CUDA_MPS_PIPE_DIRECTORY (drivers.gpu.kinds.mpspaths)
    log: Path  # CUDA_MPS_LOG_DIRECTORY
    nvidia_driver_root: Path  # on the host
    container_driver_root: Path  # where the pod mounts it


def pod_name(node_name: str, uuid: str) -> str:
    """Fixed by the node and the GPU (a simulated profile repeats UUIDs across nodes)."""
    digest = hashlib.sha256(f"{node_name}/{uuid}".encode()).hexdigest()[:10]
    short = uuid.lower().removeprefix("gpu-")[:8]
    return f"{NAME_PREFIX}{short}-{digest}"


def daemon_pod(config: MpsPodConfig, spec: DaemonSpec) -> Obj:
    """The daemon's Pod: pinned to its node, privileged (GPU device nodes; NVIDIA's is too),
    in the host's PID namespace as NVIDIA's (the MPS server and its clients meet by PID),
    no service account token (it calls no API), tolerating every taint (it lives as long
    as its clients: an eviction would take their server)."""
    pipe, logs = spec.pipe, spec.log
    volumes = [("driver-root", spec.nvidia_driver_root, spec.container_driver_root, True),
               ("pipe", pipe, pipe, False), ("log", logs, logs, False)]  # fmt: skip
    container: Obj = {
        "name": CONTAINER,
        "image": config.image,
        "command": [str(spec.control), "-f"],
        "env": [
            {"name": "CUDA_VISIBLE_DEVICES", "value": spec.uuid},
            {"name": PIPE_ENV, "value": str(pipe)},
            {"name": "CUDA_MPS_LOG_DIRECTORY", "value": str(logs)},
        ],
        "securityContext": {"privileged": True},
        "volumeMounts": [
            {"name": name, "mountPath": str(inside), "readOnly": ro}
            for name, _, inside, ro in volumes
        ],
    }
    if config.pull_policy:
        container["imagePullPolicy"] = config.pull_policy
    pod_spec: Obj = {
        "nodeName": spec.node_name,
        "hostPID": True,
        "restartPolicy": "OnFailure",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": [
            {"name": name, "hostPath": {"path": str(host), "type": "Directory"}}
            for name, host, _, _ in volumes
        ],
    }
    if config.pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in config.pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(spec.node_name, spec.uuid),
            "namespace": config.namespace,
            "labels": {
                "app.kubernetes.io/component": COMPONENT,
                "app.kubernetes.io/part-of": config.driver_name,
            },
            "annotations": {NODE_ANNOTATION: spec.node_name, GPU_ANNOTATION: spec.uuid},
        },
        "spec": pod_spec,
    }


def differences(pod: Mapping[str, Any], wanted: Obj, pipes: Collection[str] = ()) -> list[str]:
    """What makes ``pod`` not the daemon ``wanted`` (:func:`daemon_pod` for this node and
    GPU): its node, node and GPU annotations, labels, image repository, command and
    environment, each as found and as wanted; [] when it is that daemon. The image's tag may
    differ (the pod of the last release, adopted by a surge upgrade's new plugin), and the
    pipe directory may be any of ``pipes`` (the last release's layout)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    want_meta, want_spec = wanted["metadata"], wanted["spec"]
    found: list[str] = []

    def differ(what: str, have: object, want: object) -> None:
        if have != want:
            found.append(f"{what} {have!r}, not {want!r}")

    differ("node", spec.get("nodeName"), want_spec["nodeName"])
    annotations = meta.get("annotations") or {}
    for key in (NODE_ANNOTATION, GPU_ANNOTATION):
        differ(f"annotation {key}", annotations.get(key), want_meta["annotations"][key])
    differ("labels", meta.get("labels") or {}, want_meta["labels"])
    containers = spec.get("containers") or []
    if len(containers) != 1:
        return [*found, f"{len(containers)} containers, not 1"]
    (container,), (want,) = containers, want_spec["containers"]
    differ("image", _repository(container.get("image")), _repository(want["image"]))
    command = [*(container.get("command") or ()), *(container.get("args") or ())]
    differ("command", command, want["command"])
    env = {e.get("name"): e.get("value") for e in container.get("env") or ()}
    want_env = {e["name"]: e["value"] for e in want["env"]}
    if env.get(PIPE_ENV) in pipes:
        want_env[PIPE_ENV] = env[PIPE_ENV]
    for name in sorted({*env, *want_env}, key=str):
        differ(f"env {name}", env.get(name), want_env.get(name))
    return found


def _repository(image: object) -> str:
    """An image reference without its tag or digest."""
    name = str(image or "").partition("@")[0]
    repository, colon, tag = name.rpartition(":")
    return repository if colon and "/" not in tag else name


def failure(pod: Mapping[str, Any]) -> str | None:
    """Why ``pod`` will not serve without a change (a phase it never leaves, an image it
    cannot pull, a daemon that keeps exiting); None while it may still come up."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason") or status.get("message") or ""
        return f"the pod is {phase}" + (f": {reason}" if reason else "")
    for cs in status.get("containerStatuses") or ():
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _STUCK:
            said = _exit(last.get("terminated")) or waiting.get("message") or ""
            return f"{waiting['reason']}" + (f": {said}" if said else "")
        if state.get("terminated") and state["terminated"].get("exitCode") != 0:
            return _exit(state["terminated"])
    return None


def _exit(terminated: Mapping[str, Any] | None) -> str:
    if not terminated:
        return ""
    said = terminated.get("message") or terminated.get("reason") or ""
    return f"the daemon exited with {terminated.get('exitCode')}" + (f" ({said})" if said else "")


def pipe_of(pod: Mapping[str, Any]) -> str | None:
    """The pipe directory a daemon pod serves, as its container's environment names it."""
    for container in (pod.get("spec") or {}).get("containers") or ():
        for env in container.get("env") or ():
            if env.get("name") == PIPE_ENV:
                return str(env.get("value", ""))
    return None


def terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


class MpsPods:
    """The daemon pods of one node, through the plugin's API client on its event loop."""

    def __init__(
        self,
        client: Client,
        loop: asyncio.AbstractEventLoop,
        config: MpsPodConfig,
        node_name: str,
    ) -> None:
        self._client = client
        self._loop = loop
        self.config = config
        self.node_name = node_name

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result(_CALL_S)

    def get(self, uuid: str) -> Obj | None:
        """The pod under the name of the GPU's daemon, whoever made it (:meth:`ours` tells)."""
        name = pod_name(self.node_name, uuid)
        try:
            return self._run(self._client.get(PODS, name, namespace=self.config.namespace))
        except NotFoundError:
            return None

    def ours(self, pod: Obj, spec: DaemonSpec, pipes: Collection[str] = ()) -> Obj:
        """``pod``, when it is the daemon ``spec`` describes (``pipes``: other pipe
        directories it may serve); else :class:`ForeignPodError`. Such a pod is left alone:
        deleting another's pod is not this plugin's call (and for a pod of another node, the
        chart's admission policy refuses it)."""
        found = differences(pod, daemon_pod(self.config, spec), pipes)
        if not found:
            return pod
        name, namespace = (pod.get("metadata") or {}).get("name"), self.config.namespace
        raise ForeignPodError(
            f"pod {namespace}/{name} holds the name of the MPS control daemon of GPU "
            f"{spec.uuid} on node {spec.node_name}, but it is not that daemon "
            f"({'; '.join(found)}): someone else made it, so the plugin neither adopts nor "
            "deletes it, and MPS claims on this GPU fail while it is there; once you know "
            f"whose it is, delete it (kubectl -n {namespace} delete pod {name})"
        )

    def create(self, spec: DaemonSpec, pipes: Collection[str] = ()) -> Obj:
        """The pod, created; or the one already there (a create whose answer was lost, a
        plugin killed after its create) when it is this daemon (:meth:`ours`): adopted,
        never a second."""
        body = daemon_pod(self.config, spec)
        try:
            return self._run(self._client.create(PODS, body, namespace=self.config.namespace))
        except ConflictError:
            pod = self.get(spec.uuid)
            if pod is None:
                raise
            return self.ours(pod, spec, pipes)

    def delete(self, uuid: str, uid: str) -> None:
        """The pod of UID ``uid`` under the daemon's name, if it is still there: a pod made
        under that name since is not the one judged ours."""
        name = pod_name(self.node_name, uuid)
        body = {"preconditions": {"uid": uid}}
        with contextlib.suppress(NotFoundError, ConflictError):
            self._run(self._client.delete(PODS, name, namespace=self.config.namespace, body=body))

    def wait_gone(self, uuid: str, uid: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (pod := self.get(uuid)) is not None and pod["metadata"].get("uid") == uid:
            if time.monotonic() > deadline:
                raise MpsPodError(
                    f"the MPS control daemon pod {pod['metadata']['name']} of GPU {uuid} "
                    f"is still there {timeout:.0f} s after its deletion"
                )
            time.sleep(_POLL_S * 5)

    def on_node(self) -> Sequence[Obj]:
        """Every daemon pod of this node (of any GPU): what the watchdog holds to the
        holders, so a pod that lost its last claim to a crash is deleted."""
        query = [("labelSelector", f"app.kubernetes.io/component={COMPONENT}"),
                 ("fieldSelector", f"spec.nodeName={self.node_name}")]  # fmt: skip
        pods = self._client.list_all(PODS, namespace=self.config.namespace, query=query)
        return self._run(pods)
