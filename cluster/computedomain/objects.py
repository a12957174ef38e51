"""The objects one ComputeDomain needs, as the controller creates them: pure, from the domain and
the controller's settings.

Names, labels, finalizers, classes and the DaemonSet's shape follow NVIDIA's templates
(``templates/compute-domain-{daemon,daemon-claim-template,workload-claim-template}.tmpl.yaml``).
NVIDIA sets no ownerReferences on any of them, and neither does this: the DaemonSet and the
daemon template live in the driver's namespace, where an owner in the domain's namespace would
be an invalid cross-namespace reference that the garbage collector deletes on sight; the
finalizer and the controller's ordered deletion hold all three instead.

The container runs ``gpu-dra compute-domain-daemon run`` from the controller's own image (its
probes ``... check``), where NVIDIA runs ``compute-domain-daemon -v $(LOG_VERBOSITY) run``. The
daemon reads its settings from the environment: the downward-API variables and
``MAX_NODES_PER_IMEX_DOMAIN`` NVIDIA's DaemonSet sets, ``NVIDIA_VISIBLE_DEVICES=void``, and the
log level and format as the global options' ``GPU_DRA_LOG_LEVEL``/``GPU_DRA_LOG_FORMAT``
(NVIDIA's ``LOG_VERBOSITY``). The domain's UID and the node's clique come from the daemon
claim's CDI edits, as in NVIDIA's driver, not from here.

Every builder leaves out empty and zero values: the API server drops them, and a desired field
the server never shows would look like drift on every comparison.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from driver.common.wire import Obj
from drivers.computedomain import names

COMMAND = ("gpu-dra", "compute-domain-daemon")
# NVIDIA's probes: a fast startup probe that may fail for 20 minutes without a restart (the
# domain's peers may take that long to arrive), then a slow liveness and a strict readiness.
_STARTUP = {"periodSeconds": 1, "timeoutSeconds": 10, "failureThreshold": 1200}
_LIVENESS = {"periodSeconds": 60, "timeoutSeconds": 10, "failureThreshold": 20}
_READINESS = {"periodSeconds": 10, "timeoutSeconds": 10, "failureThreshold": 1}
# Every taint, as NVIDIA's issue #305 asked: a domain's daemon must run wherever its workload does.
_TOLERATIONS = [
    {"operator": "Exists", "effect": effect}
    for effect in ("NoSchedule", "NoExecute", "PreferNoSchedule")
]
_DOWNWARD = (
    ("NODE_NAME", "spec.nodeName"),
    ("POD_IP", "status.podIP"),
    ("POD_UID", "metadata.uid"),
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
)


@dataclass(frozen=True, slots=True)
class DaemonSettings:
    """What every domain's DaemonSet shares: where it goes and what it runs."""

    namespace: str  # the driver's: DaemonSets, daemon templates and cliques live here
    image: str
    image_pull_policy: str = ""  # empty: the cluster's default
    image_pull_secrets: tuple[str, ...] = ()
    max_nodes: int = names.DEFAULT_MAX_NODES_PER_IMEX_DOMAIN
    log_level: str = "INFO"
    log_format: str = "kv"


def uid_of(domain: Obj) -> str:
    return str(domain["metadata"]["uid"])


def workload_template_name(domain: Obj) -> str:
    """``spec.channel.resourceClaimTemplate.name``; empty when the domain lacks it."""
    channel = (domain.get("spec") or {}).get("channel") or {}
    return str((channel.get("resourceClaimTemplate") or {}).get("name") or "")


def allocation_mode(domain: Obj) -> str:
    """The channel's allocation mode; the CRD defaults it to Single, so absent means Single."""
    channel = (domain.get("spec") or {}).get("channel") or {}
    return str(channel.get("allocationMode") or names.ALLOCATION_SINGLE)


def _metadata(name: str, namespace: str, labels: dict[str, str]) -> Obj:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "finalizers": [names.FINALIZER],
    }


def _template(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    request: str,
    device_class: str,
    **params: str,
) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(name, namespace, labels),
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": request, "exactly": {"deviceClassName": device_class}}],
                    "config": [
                        {
                            "requests": [request],
                            "opaque": {
                                "driver": names.DRIVER_NAME,
                                "parameters": {"apiVersion": names.API_VERSION, **params},
                            },
                        }
                    ],
                }
            }
        },
    }


def daemon_template(domain: Obj, settings: DaemonSettings) -> Obj:
    """The daemon pods' ResourceClaimTemplate, in the driver's namespace."""
    uid = uid_of(domain)
    return _template(
        name=names.daemon_name(uid),
        namespace=settings.namespace,
        labels={names.COMPUTE_DOMAIN_LABEL: uid, names.TARGET_LABEL: names.TARGET_DAEMON},
        request=names.DAEMON_REQUEST,
        device_class=names.DAEMON_CLASS,
        kind=names.DAEMON_CONFIG_KIND,
        domainID=uid,
    )


def workload_template(domain: Obj) -> Obj:
    """The workloads' channel ResourceClaimTemplate, in the domain's namespace, under the name
    the domain asks for."""
    uid = uid_of(domain)
    return _template(
        name=workload_template_name(domain),
        namespace=str(domain["metadata"]["namespace"]),
        labels={names.COMPUTE_DOMAIN_LABEL: uid, names.TARGET_LABEL: names.TARGET_WORKLOAD},
        request=names.CHANNEL_REQUEST,
        device_class=names.DEFAULT_CHANNEL_CLASS,
        kind=names.CHANNEL_CONFIG_KIND,
        domainID=uid,
        allocationMode=allocation_mode(domain),
    )


def _probe(handler: Mapping[str, int]) -> Obj:
    return {"exec": {"command": [*COMMAND, "check"]}, **handler}


def daemon_set(domain: Obj, settings: DaemonSettings) -> Obj:
    """The domain's DaemonSet: one IMEX daemon on each node its channel claims labelled."""
    uid = uid_of(domain)
    selector = {names.COMPUTE_DOMAIN_LABEL: uid}
    env: list[Obj] = [
        {"name": "GPU_DRA_LOG_LEVEL", "value": settings.log_level},
        {"name": "GPU_DRA_LOG_FORMAT", "value": settings.log_format},
        {"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": str(settings.max_nodes)},
        *({"name": var, "valueFrom": {"fieldRef": {"fieldPath": path}}} for var, path in _DOWNWARD),
        # Without it the NVIDIA runtime hook would inject every GPU ("all" is inherited).
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
    ]
    container: Obj = {
        "name": names.DAEMON_CONTAINER,
        "image": settings.image,
        "command": [*COMMAND, "run"],
        "env": env,
        "resources": {"claims": [{"name": names.DAEMON_POD_CLAIM}]},
        "startupProbe": _probe(_STARTUP),
        "livenessProbe": _probe(_LIVENESS),
        "readinessProbe": _probe(_READINESS),
    }
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    pod_spec: Obj = {
        "serviceAccountName": names.DAEMON_SERVICE_ACCOUNT,
        "nodeSelector": dict(selector),
        "containers": [container],
        "tolerations": [dict(t) for t in _TOLERATIONS],
        "resourceClaims": [
            {"name": names.DAEMON_POD_CLAIM, "resourceClaimTemplateName": names.daemon_name(uid)}
        ],
    }
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _metadata(names.daemon_name(uid), settings.namespace, dict(selector)),
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "template": {"metadata": {"labels": dict(selector)}, "spec": pod_spec},
        },
    }
