"""Every value of the chart, set to something other than its default, rendered by the real
Helm engine and checked: it lands where it should, and the result passes
kubernetes-validate --strict for every supported Kubernetes version."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from drivers.computedomain.names import DAEMON_CLASS_SELECTOR, DEFAULT_CHANNEL_CLASS_SELECTOR
from tests import chart_render
from tests.chart_render import EKS_VALUES, render

KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
Objects = list[dict[str, Any]]


def kind(objects: Objects, name: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == name]


def daemonset(objects: Objects) -> dict[str, Any]:
    (found,) = kind(objects, "DaemonSet")
    return found


def pod(objects: Objects) -> dict[str, Any]:
    spec: dict[str, Any] = daemonset(objects)["spec"]["template"]["spec"]
    return spec


def container(objects: Objects) -> dict[str, Any]:
    found: dict[str, Any] = pod(objects)["containers"][0]
    return found


def args(objects: Objects) -> list[str]:
    found: list[str] = container(objects)["args"]
    return found


def cd_controller(objects: Objects) -> dict[str, Any]:
    return kind(objects, "Deployment")[0]  # IndexError where it is not rendered


def cd_args(objects: Objects) -> list[str]:
    return list(cd_controller(objects)["spec"]["template"]["spec"]["containers"][0]["args"])


_CD = "computeDomains.enabled=true"


def classes(objects: Objects) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c["spec"] for c in kind(objects, "DeviceClass")}


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}
            ]
        }
    }
}

# value -> (--set expressions, what the render must show)
CASES: dict[str, tuple[tuple[str, ...], Callable[[Objects], bool]]] = {
    "computeDomains.enabled": (
        (_CD,),
        lambda o: (
            cd_controller(o)["spec"]["replicas"] == 2
            and "--leader-elect=true" in cd_args(o)
            and classes(o)["compute-domain-daemon.nvidia.com"]["selectors"][0]["cel"]["expression"]
            == DAEMON_CLASS_SELECTOR
            and classes(o)["compute-domain-default-channel.nvidia.com"]["selectors"][0]["cel"][
                "expression"
            ]
            == DEFAULT_CHANNEL_CLASS_SELECTOR
            # The node process serves the ComputeDomain driver too.
            and "--compute-domains=true" in args(o)
        ),
    ),
    "computeDomains.controller.replicas": (
        (_CD, "computeDomains.controller.replicas=3"),
        lambda o: cd_controller(o)["spec"]["replicas"] == 3,
    ),
    "computeDomains.controller.logLevel": (
        (_CD, "computeDomains.controller.logLevel=DEBUG"),
        lambda o: "--log-level=DEBUG" in cd_args(o),
    ),
    "computeDomains.controller.daemonLogLevel": (
        (_CD, "computeDomains.controller.daemonLogLevel=WARNING"),
        lambda o: "--daemon-log-level=WARNING" in cd_args(o),
    ),
    "computeDomains.controller.maxNodesPerImexDomain": (
        (_CD, "computeDomains.controller.maxNodesPerImexDomain=9"),
        lambda o: "--max-nodes-per-imex-domain=9" in cd_args(o),
    ),
    "computeDomains.controller.metricsPort": (
        (_CD, "metrics.enabled=true", "computeDomains.controller.metricsPort=9101"),
        lambda o: "--metrics-port=9101" in cd_args(o),
    ),
    "computeDomains.controller.nodeSelector": (
        (_CD, "computeDomains.controller.nodeSelector.role=system"),
        lambda o: (
            cd_controller(o)["spec"]["template"]["spec"]["nodeSelector"] == {"role": "system"}
        ),
    ),
    "computeDomains.controller.tolerations": (
        (_CD, "computeDomains.controller.tolerations[0].operator=Exists"),
        lambda o: (
            cd_controller(o)["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
        ),
    ),
    "computeDomains.controller.resources": (
        (_CD, "computeDomains.controller.resources.limits.memory=1Gi"),
        lambda o: (
            cd_controller(o)["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
                "memory"
            ]
            == "1Gi"
        ),
    ),
    "driverName": (
        ("driverName=gpu.example.com",),
        lambda o: (
            "--driver-name=gpu.example.com" in args(o)
            and 'device.driver == "gpu.example.com"'
            in classes(o)["gpu.nvidia.com"]["selectors"][0]["cel"]["expression"]
        ),
    ),
    "nameOverride": (
        ("nameOverride=gpus",),
        lambda o: daemonset(o)["metadata"]["name"] == "gpu-dra-driver-gpus-kubelet-plugin",
    ),
    "fullnameOverride": (
        ("fullnameOverride=dra",),
        lambda o: daemonset(o)["metadata"]["name"] == "dra-kubelet-plugin",
    ),
    "namespace.create": (
        ("namespace.create=true", "namespace.name=gpu-dra"),
        lambda o: kind(o, "Namespace")[0]["metadata"]["name"] == "gpu-dra",
    ),
    "namespace.name": (
        ("namespace.name=elsewhere",),
        lambda o: daemonset(o)["metadata"]["namespace"] == "elsewhere" and not kind(o, "Namespace"),
    ),
    "image.repository": (
        ("image.repository=1234.dkr.ecr.us-east-1.amazonaws.com/gpu-dra",),
        lambda o: container(o)["image"].startswith("1234.dkr.ecr.us-east-1.amazonaws.com/gpu-dra:"),
    ),
    "image.tag": (("image.tag=0.9.1-rc1",), lambda o: container(o)["image"].endswith(":0.9.1-rc1")),
    "image.pullPolicy": (
        ("image.pullPolicy=Always",),
        lambda o: container(o)["imagePullPolicy"] == "Always",
    ),
    "imagePullSecrets": (
        ("imagePullSecrets[0].name=ecr",),
        lambda o: pod(o)["imagePullSecrets"] == [{"name": "ecr"}],
    ),
    "serviceAccount.name": (
        ("serviceAccount.name=plugin",),
        lambda o: (
            pod(o)["serviceAccountName"] == "plugin"
            and kind(o, "ServiceAccount")[0]["metadata"]["name"] == "plugin"
        ),
    ),
    "serviceAccount.annotations": (
        ("serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/r",),
        lambda o: (
            kind(o, "ServiceAccount")[0]["metadata"]["annotations"]
            == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}
        ),
    ),
    "nvidiaDriverRoot": (
        ("nvidiaDriverRoot=/run/nvidia/driver",),
        lambda o: (
            "--nvidia-driver-root=/run/nvidia/driver" in args(o)
            and {
                "name": "driver-root",
                "hostPath": {"path": "/run/nvidia/driver", "type": "Directory"},
            }
            in pod(o)["volumes"]
        ),
    ),
    "cdiRoot": (("cdiRoot=/etc/cdi",), lambda o: "--cdi-root=/etc/cdi" in args(o)),
    "featureGates": (
        ("featureGates=DRAExtendedResource=true\\,DRADeviceTaints=false",),
        lambda o: "--feature-gates=DRAExtendedResource=true,DRADeviceTaints=false" in args(o),
    ),
    "kubeletPlugin.logLevel": (
        ("kubeletPlugin.logLevel=DEBUG",),
        lambda o: args(o)[0] == "--log-level=DEBUG",
    ),
    "kubeletPlugin.logFormat": (
        ("kubeletPlugin.logFormat=json",),
        lambda o: "--log-format=json" in args(o),
    ),
    "kubeletPlugin.kubeletRegistrarDirectoryPath": (
        ("kubeletPlugin.kubeletRegistrarDirectoryPath=/var/lib/k/plugins_registry",),
        lambda o: "--kubelet-registrar-directory-path=/var/lib/k/plugins_registry" in args(o),
    ),
    "kubeletPlugin.kubeletPluginsDirectoryPath": (
        ("kubeletPlugin.kubeletPluginsDirectoryPath=/var/lib/k/plugins",),
        lambda o: "--kubelet-plugins-directory-path=/var/lib/k/plugins" in args(o),
    ),
    "kubeletPlugin.nvml": (
        ("kubeletPlugin.nvml=simulated", "kubeletPlugin.profile=g6e.12xlarge"),
        lambda o: "--nvml=simulated" in args(o),
    ),
    "kubeletPlugin.profile": (
        ("kubeletPlugin.nvml=simulated", "kubeletPlugin.profile=p5.48xlarge"),
        lambda o: "--profile=p5.48xlarge" in args(o),
    ),
    "kubeletPlugin.mpsDaemon": (
        ("kubeletPlugin.mpsDaemon=process",),
        lambda o: "--mps-daemon=process" in args(o) and "--image" not in str(args(o)),
    ),
    "kubeletPlugin.healthcheckPort": (
        ("kubeletPlugin.healthcheckPort=6000",),
        lambda o: (
            "--healthcheck-port=6000" in args(o)
            and container(o)["livenessProbe"]["grpc"]["port"] == 6000
        ),
    ),
    "kubeletPlugin.priorityClassName": (
        ("kubeletPlugin.priorityClassName=gpu-critical",),
        lambda o: pod(o)["priorityClassName"] == "gpu-critical",
    ),
    "kubeletPlugin.resources": (
        ("kubeletPlugin.resources.limits.memory=1Gi",),
        lambda o: container(o)["resources"]["limits"]["memory"] == "1Gi",
    ),
    "kubeletPlugin.startupProbe": (
        ("kubeletPlugin.startupProbe.failureThreshold=120",),
        lambda o: container(o)["startupProbe"]["failureThreshold"] == 120,
    ),
    "kubeletPlugin.livenessProbe": (
        ("kubeletPlugin.livenessProbe.periodSeconds=20",),
        lambda o: (
            container(o)["livenessProbe"]["periodSeconds"] == 20
            and container(o)["readinessProbe"]["periodSeconds"] == 20
        ),
    ),
    "kubeletPlugin.podAnnotations": (
        ("kubeletPlugin.podAnnotations.team=ml",),
        lambda o: daemonset(o)["spec"]["template"]["metadata"]["annotations"] == {"team": "ml"},
    ),
    "kubeletPlugin.podLabels": (
        ("kubeletPlugin.podLabels.team=ml",),
        lambda o: daemonset(o)["spec"]["template"]["metadata"]["labels"]["team"] == "ml",
    ),
    "kubeletPlugin.tolerations": (
        (
            "kubeletPlugin.tolerations[0].key=dedicated",
            "kubeletPlugin.tolerations[0].operator=Exists",
        ),
        lambda o: (
            {"key": "dedicated", "operator": "Exists"} in pod(o)["tolerations"]
            and len(pod(o)["tolerations"]) == 2
        ),
    ),
    "kubeletPlugin.nodeSelector": (
        ("kubeletPlugin.nodeSelector.team=ml",),
        lambda o: (
            pod(o)["nodeSelector"] == {"team": "ml"} and "nodeAffinity" in pod(o)["affinity"]
        ),  # on top of nodeSelection, not instead
    ),
    "kubeletPlugin.affinity": (
        (),  # too nested for --set: given as a values file, see FILES
        lambda o: pod(o)["affinity"] == AFFINITY,
    ),
    "kubeletPlugin.updateStrategy": (
        (
            "kubeletPlugin.updateStrategy.type=OnDelete",
            "kubeletPlugin.updateStrategy.rollingUpdate=null",
        ),
        lambda o: daemonset(o)["spec"]["updateStrategy"] == {"type": "OnDelete"},
    ),
    "kubeletPlugin.podSecurityContext": (
        ("kubeletPlugin.podSecurityContext.seccompProfile.type=RuntimeDefault",),
        lambda o: (
            pod(o)["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
            and container(o)["securityContext"] == {"privileged": True}
        ),
    ),
    "kubeletPlugin.extraEnv": (
        ("kubeletPlugin.extraEnv[0].name=GPU_DRA_SIM_STATE", "kubeletPlugin.extraEnv[0].value=/x"),
        lambda o: container(o)["env"][-1] == {"name": "GPU_DRA_SIM_STATE", "value": "/x"},
    ),
    "kubeletPlugin.extraArgs": (
        ("kubeletPlugin.extraArgs[0]=--container-driver-root=/host",),
        lambda o: args(o)[-1] == "--container-driver-root=/host",
    ),
    "nodeSelection.gpuNodeLabel": (
        ("nodeSelection.gpuNodeLabel.key=gpu", "nodeSelection.gpuNodeLabel.value=yes"),
        lambda o: (
            {"key": "gpu", "operator": "In", "values": ["yes"]}
            in pod(o)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ][0]["matchExpressions"]
        ),
    ),
    "nodeSelection.instanceTypes": (
        ("nodeSelection.instanceTypes={p5.48xlarge}",),
        lambda o: "node.kubernetes.io/instance-type" in str(pod(o)["affinity"]),
    ),
    "nodeSelection.excludeEksAutoMode": (
        ("nodeSelection.excludeEksAutoMode=false",),
        lambda o: "eks.amazonaws.com/compute-type" not in str(pod(o)["affinity"]),
    ),
    "nodeSelection.excludeKarpenter": (
        ("nodeSelection.excludeKarpenter=false",),
        lambda o: "karpenter.sh/nodepool" not in str(pod(o)["affinity"]),
    ),
    "nvidiaDevicePlugin.runsOnSelectedNodes": (
        ("nvidiaDevicePlugin.runsOnSelectedNodes=false",),  # true fails: test_chart.py
        lambda o: bool(kind(o, "DaemonSet")),
    ),
    "resourceSlicePolicy.enabled": (
        ("resourceSlicePolicy.enabled=false",),
        lambda o: len(kind(o, "ValidatingAdmissionPolicy")) == 1,
    ),
    "configAdmission.enabled": (
        ("configAdmission.enabled=false",),
        lambda o: len(kind(o, "ValidatingAdmissionPolicy")) == 4,
    ),
    "configAdmission.failurePolicy": (
        ("configAdmission.failurePolicy=Ignore",),
        lambda o: (
            "Ignore" in [p["spec"]["failurePolicy"] for p in kind(o, "ValidatingAdmissionPolicy")]
        ),
    ),
    "configAdmission.namespaceSelector": (
        ("configAdmission.namespaceSelector.matchLabels.gpu=yes",),
        lambda o: any(
            p["spec"]["matchConstraints"].get("namespaceSelector")
            == {"matchLabels": {"gpu": "yes"}}
            for p in kind(o, "ValidatingAdmissionPolicy")
        ),
    ),
    "deviceClasses.gpu.enabled": (
        ("deviceClasses.gpu.enabled=false",),
        lambda o: "gpu.nvidia.com" not in classes(o),
    ),
    "deviceClasses.gpu.name": (
        ("deviceClasses.gpu.name=gpu.example.com",),
        lambda o: "gpu.example.com" in classes(o),
    ),
    "deviceClasses.gpu.extendedResourceName": (
        (
            "deviceClasses.gpu.extendedResourceName.enabled=true",
            "deviceClasses.gpu.extendedResourceName.name=example.com/gpu",
        ),
        lambda o: classes(o)["gpu.nvidia.com"].get("extendedResourceName") == "example.com/gpu",
    ),
    "consumableCapacity.enabled": (
        ("consumableCapacity.enabled=true",),
        lambda o: (
            "--consumable-capacity=true" in args(o)
            and {"cel": {"expression": "device.allowMultipleAllocations"}}
            in classes(o)["shared.gpu.nvidia.com"]["selectors"]
        ),
    ),
    "mig.dynamic.enabled": (
        ("mig.dynamic.enabled=true",),
        lambda o: "--dynamic-mig=true" in args(o),
    ),
    "deviceClasses.sharedGpu.name": (
        ("consumableCapacity.enabled=true", "deviceClasses.sharedGpu.name=shared.example.com"),
        lambda o: "shared.example.com" in classes(o),
    ),
    "deviceClasses.mig.enabled": (
        ("deviceClasses.mig.enabled=false",),
        lambda o: "mig.nvidia.com" not in classes(o),
    ),
    "deviceClasses.mig.name": (
        ("deviceClasses.mig.name=mig.example.com",),
        lambda o: "mig.example.com" in classes(o),
    ),
    "deviceClasses.extra": (
        (
            "deviceClasses.extra[0].name=l40s.gpu.nvidia.com",
            'deviceClasses.extra[0].selectors[0]=device.attributes["gpu.nvidia.com"].productName'
            ' == "NVIDIA L40S"',
        ),
        lambda o: "l40s.gpu.nvidia.com" in classes(o),
    ),
    "metrics.enabled": (
        ("metrics.enabled=false",),
        lambda o: (
            not kind(o, "Service")
            and "--metrics-port=9401" not in args(o)
            and "--metrics-address=$(POD_IP)" not in args(o)
        ),
    ),
    "health.additionalXidsToIgnore": (
        ("health.additionalXidsToIgnore={94,95}",),
        lambda o: "--additional-xids-to-ignore=94,95" in args(o),
    ),
    "health.autoRecover.probes": (
        ("health.autoRecover.probes=3",),
        lambda o: (
            "--auto-recover-probes=3" in args(o)
            and "--auto-recover-period=10" in args(o)
            and "--recoverable-xids=8,11" in args(o)
        ),
    ),
    "health.autoRecover.periodSeconds": (
        ("health.autoRecover.probes=3", "health.autoRecover.periodSeconds=30"),
        lambda o: "--auto-recover-period=30" in args(o),
    ),
    "health.autoRecover.xids": (
        ("health.autoRecover.probes=3", "health.autoRecover.xids={8,31}"),
        lambda o: "--recoverable-xids=8,31" in args(o),
    ),
    "metrics.port": (
        ("metrics.port=9500",),
        lambda o: (
            "--metrics-port=9500" in args(o)
            and kind(o, "Service")[0]["spec"]["ports"][0]["port"] == 9500
        ),
    ),
    "metrics.serviceMonitor.enabled": (
        ("metrics.serviceMonitor.enabled=true",),
        lambda o: len(kind(o, "ServiceMonitor")) == 1,
    ),
    "metrics.serviceMonitor.interval": (
        ("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=1m"),
        lambda o: kind(o, "ServiceMonitor")[0]["spec"]["endpoints"][0]["interval"] == "1m",
    ),
    "metrics.serviceMonitor.labels": (
        ("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"),
        lambda o: kind(o, "ServiceMonitor")[0]["metadata"]["labels"]["release"] == "prom",
    ),
    "deviceTaintRule.enabled": (
        ("deviceTaintRule.enabled=true", "deviceTaintRule.pool=node-a"),
        lambda o: len(kind(o, "DeviceTaintRule")) == 1,
    ),
    "deviceTaintRule.pool": (
        ("deviceTaintRule.enabled=true", "deviceTaintRule.pool=node-b"),
        lambda o: kind(o, "DeviceTaintRule")[0]["spec"]["deviceSelector"]["pool"] == "node-b",
    ),
    "deviceTaintRule.device": (
        (
            "deviceTaintRule.enabled=true",
            "deviceTaintRule.pool=node-a",
            "deviceTaintRule.device=gpu-3",
        ),
        lambda o: kind(o, "DeviceTaintRule")[0]["spec"]["deviceSelector"]["device"] == "gpu-3",
    ),
    "deviceTaintRule.taint": (
        (
            "deviceTaintRule.enabled=true",
            "deviceTaintRule.pool=node-a",
            "deviceTaintRule.taint.key=example.com/drain",
            "deviceTaintRule.taint.value=now",
            "deviceTaintRule.taint.effect=NoExecute",
        ),
        lambda o: (
            kind(o, "DeviceTaintRule")[0]["spec"]["taint"]
            == {"key": "example.com/drain", "value": "now", "effect": "NoExecute"}
        ),
    ),
}

# What the cluster serves, for values whose objects are rendered only where it does: the
# Prometheus Operator's API, and DeviceTaintRule in the version every supported minor serves
# (v1alpha3; which version is picked where several are served is tested in test_chart.py).
SERVED = ("monitoring.coreos.com/v1", "resource.k8s.io/v1alpha3/DeviceTaintRule")
# Kinds that are not Kubernetes' own: kubernetes-validate has no schema for them.
NOT_KUBERNETES = {"ServiceMonitor"}


# Values too nested for --set, given as a -f file.
FILES: dict[str, dict[str, Any]] = {
    "kubeletPlugin.affinity": {"kubeletPlugin": {"affinity": AFFINITY}}
}


def _holds(check: Callable[[Objects], bool], objects: Objects) -> bool:
    try:
        return check(objects)
    except (KeyError, IndexError):  # the field the value sets is absent by default
        return False


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Keys of values.yaml down to the level a user sets (maps of data stay one value)."""
    keys: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        nested = isinstance(value, dict) and value and key not in _DATA_MAPS
        keys |= _leaf_keys(value, f"{path}.") if nested else {path}
    return keys


# Maps whose keys are data (quantities, probe timings, a strategy) rather than chart settings.
_DATA_MAPS = {
    "resources",
    "startupProbe",
    "livenessProbe",
    "updateStrategy",
    "gpuNodeLabel",
    "extendedResourceName",
    "taint",
}


def test_every_value_of_values_yaml_has_a_case() -> None:
    values = yaml.safe_load((chart_render.CHART_DIR / "values.yaml").read_text())
    assert _leaf_keys(values) == set(CASES)


@pytest.mark.parametrize("key", sorted(CASES))
def test_value_lands_and_validates_strictly(key: str, tmp_path: Path) -> None:
    sets, check = CASES[key]
    files = []
    if key in FILES:
        files.append(tmp_path / "values.yaml")
        files[0].write_text(yaml.safe_dump(FILES[key]))
    objects = render(files, sets, api_versions=SERVED)
    assert check(objects), key
    # The same check against the default render: it must be able to fail.
    if key != "nvidiaDevicePlugin.runsOnSelectedNodes":
        assert not _holds(check, render()), f"{key}: the check also holds for the defaults"
    failures = []
    for version in KUBERNETES_VERSIONS:
        for obj in objects:
            if obj["kind"] in NOT_KUBERNETES:
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                failures.append(f"{version}: {obj['kind']}: {exc.message}")
    assert failures == []


def test_namespace_create_with_the_release_namespace_fails_clearly() -> None:
    for sets in (
        ("namespace.create=true",),
        ("namespace.create=true", f"namespace.name={chart_render.NAMESPACE}"),
    ):
        with pytest.raises(helm_python.HelmRenderError) as info:
            render((), sets)
        message = str(info.value)
        assert f'namespace.create=true would create "{chart_render.NAMESPACE}"' in message
        assert "the release's own namespace" in message and "namespace.name" in message


@pytest.mark.parametrize(
    "setting",
    [
        "kubeletPlugin.logFormat=xml",
        "kubeletPlugin.updateStrategy.type=Recreate",
        "featureGates=DRAExtendedResource",
        "kubeletPlugin.extraArgs[0]=kubelet-plugin",
    ],
)
def test_schema_rejects_wrong_new_values(setting: str) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        render((), (setting,))


def test_eks_values_carry_what_differs_on_eks() -> None:
    default = render()
    eks = render([EKS_VALUES])
    expressions = pod(eks)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    (by_type,) = [e for e in expressions if e["key"] == "node.kubernetes.io/instance-type"]
    assert {"p5.48xlarge", "p4d.24xlarge", "g6e.48xlarge", "g5.xlarge"} <= set(by_type["values"])
    assert "--log-format=json" in args(eks)
    assert daemonset(eks) != daemonset(default)
    text = EKS_VALUES.read_text()
    assert "--install-nvidia-plugin=false" in text  # eksctl installs the device plugin
    assert "settings.kubelet-device-plugins.nvidia.enabled = false" in text  # Bottlerocket
    assert "excludeKarpenter" in text and "Karpenter 1.15" in text


def test_rendered_flags_parse_with_every_new_value() -> None:
    """The DaemonSet command line with the new values still parses with gpu-dra's parser."""
    import re

    from cli import build_parser

    objects = render(
        [EKS_VALUES],
        (
            "featureGates=DRAExtendedResource=true",
            "kubeletPlugin.extraArgs[0]=--container-driver-root=/host",
        ),
    )
    env = {"NODE_NAME": "node-a", "POD_UID": "uid", "POD_IP": "10.0.1.7"}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in args(objects)]
    parsed = build_parser().parse_args(argv)
    assert parsed.feature_gates == {"DRAExtendedResource": True}
    assert (parsed.log_format, parsed.container_driver_root) == ("json", "/host")
