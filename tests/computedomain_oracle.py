"""NVIDIA's ComputeDomain controller as the oracle for ours: the recorded fixture, the one
normalization both its tests use, and the differences we keep on purpose.

``tests/data/nvidia-computedomain-objects.json`` holds what NVIDIA's own controller created on
a real kube-apiserver for :data:`DOMAINS` (its header says which release, which Kubernetes, when
and how). Objects are keyed ``Kind/namespace/name`` after :func:`normalize`, which makes two
runs comparable: the domains' UIDs become ``<uid:NAME>``, the driver's namespace and the daemon
image placeholders, and what the server assigns per run (uid, resourceVersion, timestamps,
managedFields, the DaemonSet controller's status) is dropped.

:func:`compared` projects an object onto the fields the issue names (names, namespaces, labels,
owner references, finalizers, device classes, requests, opaque configs, the DaemonSet's
selector, nodeSelector, claims, tolerations and probes), with the server's defaults filled in,
so that the pure objects (``tests/test_computedomain_oracle.py``) and the objects our controller
makes on a real server (``tests/e2e/test_computedomain_oracle.py``) compare alike.
:data:`DELIBERATE` is every field where ours differs from NVIDIA's, with the reason.
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from driver.common.wire import Obj
from drivers.computedomain import names

FIXTURE: Final = Path(__file__).parent / "data" / "nvidia-computedomain-objects.json"
DRIVER_NAMESPACE: Final = "<driver-namespace>"
IMAGE: Final = "<image>"
ABSENT: Final = "<absent>"  # in DELIBERATE: the field is not there


def _spec(num_nodes: int, template: str, mode: str | None = None) -> Obj:
    channel: Obj = {"resourceClaimTemplate": {"name": template}}
    if mode:
        channel["allocationMode"] = mode
    return {"numNodes": num_nodes, "channel": channel}


# The inputs, as recorded: (namespace, name, spec).
DOMAINS: Final[tuple[tuple[str, str, Obj], ...]] = (
    ("default", "two", _spec(2, "two-channel")),
    ("default", "zero", _spec(0, "zero-channel")),
    ("team", "all", _spec(1, "all-channels", names.ALLOCATION_ALL)),
)

_COMMAND_WHY = (
    "our IMEX daemon is `gpu-dra compute-domain-daemon` in the controller's own image, its log "
    "level from the environment; NVIDIA's is `compute-domain-daemon -v $(LOG_VERBOSITY)`"
)
# (kind, field of compared()) -> (our value, why). Everything else must equal NVIDIA's.
DELIBERATE: Final[dict[tuple[str, str], tuple[Any, str]]] = {
    ("DaemonSet", "container.command"): (
        ["gpu-dra", "compute-domain-daemon", "run"],
        _COMMAND_WHY,
    ),
    ("DaemonSet", "probe.command"): ([["gpu-dra", "compute-domain-daemon", "check"]], _COMMAND_WHY),
    ("DaemonSet", "env.LOG_VERBOSITY"): (
        ABSENT,
        "klog's verbosity number; ours logs by level and format (GPU_DRA_LOG_LEVEL, _FORMAT)",
    ),
    ("DaemonSet", "env.GPU_DRA_LOG_LEVEL"): ("INFO", "our daemon's log level (the default)"),
    ("DaemonSet", "env.GPU_DRA_LOG_FORMAT"): ("kv", "our daemon's log format (the default)"),
    ("DaemonSet", "env.FEATURE_GATES"): (
        ABSENT,
        "NVIDIA's daemon takes the controller's feature gates; ours has none: the behaviour "
        "NVIDIA's default gates select (IMEXDaemonsWithDNSNames, ComputeDomainCliques) is ours",
    ),
}

_VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def normalize(obj: Obj, *, uids: Mapping[str, str], namespace: str, image: str) -> Obj:
    """``obj`` made comparable across runs: ``uids`` (domain name -> UID) become ``<uid:NAME>``
    wherever they occur; the driver's ``namespace`` and the daemon ``image`` become
    placeholders where they are a whole value; what the server assigns per run is dropped."""
    subs = {uid: f"<uid:{name}>" for name, uid in uids.items()}
    whole = {namespace: DRIVER_NAMESPACE, image: IMAGE}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, str):
            if value in whole:
                return whole[value]
            for old, new in subs.items():
                value = value.replace(old, new)
        return value

    out: Obj = walk(obj)
    for key in _VOLATILE:
        out["metadata"].pop(key, None)
    if out.get("kind") == "DaemonSet":
        out.pop("status", None)  # the DaemonSet controller's, not the domain controller's
    return out


def key(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"


def compared(obj: Obj) -> dict[str, Any]:
    """The fields the oracle compares, flat, with the server's defaults filled in."""
    meta = obj["metadata"]
    out: dict[str, Any] = {
        "name": meta["name"],
        "namespace": meta.get("namespace", ""),
        "labels": meta.get("labels") or {},
        "finalizers": meta.get("finalizers") or [],
        "ownerReferences": meta.get("ownerReferences") or [],
    }
    kind = obj["kind"]
    if kind == names.COMPUTE_DOMAIN_KIND:
        out["status"] = obj.get("status")
    elif kind == "ResourceClaimTemplate":
        devices = obj["spec"]["spec"]["devices"]
        out["requests"] = [_request(r) for r in devices.get("requests") or []]
        out["config"] = devices.get("config") or []
    elif kind == "DaemonSet":
        out.update(_daemon_set(obj["spec"]))
    return out


def _request(request: Obj) -> Obj:
    exactly = dict(request.get("exactly") or {})
    exactly.setdefault("allocationMode", "ExactCount")
    if exactly["allocationMode"] == "ExactCount":
        exactly.setdefault("count", 1)
    return {"name": request["name"], "exactly": exactly}


_PROBE_DEFAULTS = {"initialDelaySeconds": 0, "successThreshold": 1}
_PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def _daemon_set(spec: Obj) -> dict[str, Any]:
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    out: dict[str, Any] = {
        "selector": spec["selector"],
        "template.labels": spec["template"]["metadata"].get("labels") or {},
        "serviceAccountName": pod.get("serviceAccountName", ""),
        "imagePullSecrets": pod.get("imagePullSecrets") or [],
        "nodeSelector": pod.get("nodeSelector") or {},
        "tolerations": pod.get("tolerations") or [],
        "resourceClaims": pod.get("resourceClaims") or [],
        "volumes": pod.get("volumes") or [],
        "hostNetwork": pod.get("hostNetwork", False),
        "container.name": container["name"],
        "container.image": container["image"],
        "container.command": container.get("command"),
        "container.args": container.get("args") or [],
        "container.claims": (container.get("resources") or {}).get("claims") or [],
        "container.volumeMounts": container.get("volumeMounts") or [],
        "container.securityContext": container.get("securityContext") or {},
    }
    for env in container.get("env") or []:
        value = env.get("value")
        if "valueFrom" in env:
            field = env["valueFrom"]["fieldRef"]
            value = {"fieldRef": {"apiVersion": "v1", **field}}  # the server's default
        out[f"env.{env['name']}"] = value
    commands = set()
    for probe in _PROBES:
        handler = dict(container[probe])
        commands.add(tuple(handler.pop("exec")["command"]))
        out[probe] = {**_PROBE_DEFAULTS, **handler}
    out["probe.command"] = [list(c) for c in sorted(commands)]  # one, when all three agree
    return out


def expected_ours(nvidia: Obj) -> dict[str, Any]:
    """What :func:`compared` must give for our object, from NVIDIA's: theirs with
    :data:`DELIBERATE` applied."""
    out = compared(nvidia)
    for (kind, field), (ours, _) in DELIBERATE.items():
        if kind == nvidia["kind"]:
            if ours == ABSENT:
                out.pop(field, None)
            else:
                out[field] = ours
    return out


def load() -> Obj:
    fixture: Obj = json.loads(FIXTURE.read_text())
    return fixture
