"""The Helm chart, rendered by the real Helm engine: structure, lint, schema, Kubernetes schemas."""

import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from driver.nvml.profile import profile_names
from tests import chart_render
from tests.chart_render import EKS_VALUES, NAMESPACE, rbac_grants, render
from tests.e2e import build as e2e_build

KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")

# Every optional template on, to validate what the defaults leave out.
EVERYTHING_ON = (
    "namespace.create=true",
    "namespace.name=gpu-dra",
    "deviceClasses.gpu.extendedResourceName.enabled=true",
    "deviceClasses.extra[0].name=h100.gpu.nvidia.com",
    'deviceClasses.extra[0].selectors[0]=device.attributes["gpu.nvidia.com"].productName'
    ' == "NVIDIA H100 80GB HBM3"',
    "nodeSelection.instanceTypes={p5.48xlarge,g6e.48xlarge}",
    "kubeletPlugin.nvml=simulated",
    "kubeletPlugin.profile=p5.48xlarge",
    "imagePullSecrets[0].name=registry",
    "kubeletPlugin.tolerations[0].operator=Exists",
    "kubeletPlugin.logFormat=json",
    "featureGates=DRAExtendedResource=true",
    "kubeletPlugin.nodeSelector.team=ml",
    "kubeletPlugin.podSecurityContext.seccompProfile.type=RuntimeDefault",
    "kubeletPlugin.extraEnv[0].name=GPU_DRA_LOG_LEVEL",
    "kubeletPlugin.extraEnv[0].value=DEBUG",
    "kubeletPlugin.extraArgs[0]=--cdi-root=/etc/cdi",
    "health.additionalXidsToIgnore={94,95}",
    "health.autoRecover.probes=3",
    "computeDomains.enabled=true",
)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objects, kind)
    return found


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def eks() -> list[dict[str, Any]]:
    return render([EKS_VALUES])


def plugin_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][
        0
    ]
    return container


def test_default_render_has_every_object(default: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in default)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
            "Service",  # metrics
            "DeviceClass",  # gpu.nvidia.com
            "DeviceClass",  # mig.nvidia.com
            "ValidatingAdmissionPolicy",  # resourceslices
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # leases
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # claims' status.devices
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # MPS control daemon pods
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy",  # users' GpuConfigs
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    namespaced = [o for o in default if "namespace" in o["metadata"]]
    assert {o["metadata"]["namespace"] for o in namespaced} == {NAMESPACE}


@pytest.mark.parametrize(
    ("values", "sets"),
    [((), ()), ((EKS_VALUES,), ()), ((EKS_VALUES,), EVERYTHING_ON)],
    ids=["default", "eks", "everything-on"],
)
def test_helm_lint_is_clean(values: tuple[str, ...], sets: tuple[str, ...]) -> None:
    report = chart_render.lint(values, sets)
    assert report["errors"] == []
    # Severity 2 is a warning, 3 an error; 1 (info) is only "icon is recommended".
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _all_renders() -> Iterator[tuple[str, dict[str, Any]]]:
    for label, files, sets in (
        ("default", (), ()),
        ("eks", (EKS_VALUES,), ()),
        ("everything-on", (EKS_VALUES,), EVERYTHING_ON),
    ):
        for obj in render(files, sets):
            yield f"{label}:{obj['kind']}/{obj['metadata']['name']}", obj


RENDERED = list(_all_renders())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_passes_kubernetes_validate_strict(version: str) -> None:
    failures = []
    for label, obj in RENDERED:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{label}: {'.'.join(map(str, exc.path))}: {exc.message}")
    assert failures == []
    assert len(RENDERED) >= 31  # the three renders really produced their objects


def test_everything_on_renders_the_optional_objects() -> None:
    objects = render([EKS_VALUES], EVERYTHING_ON)
    namespace = one(objects, "Namespace")
    assert namespace["metadata"]["name"] == "gpu-dra"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # Helm creates the namespace before anything that lives in it.
    assert objects[0]["kind"] == "Namespace"
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] == "DaemonSet"} == {
        "gpu-dra"
    }
    classes = {c["metadata"]["name"]: c["spec"] for c in by_kind(objects, "DeviceClass")}
    assert classes["gpu.nvidia.com"]["extendedResourceName"] == "nvidia.com/gpu"
    h100 = [s["cel"]["expression"] for s in classes["h100.gpu.nvidia.com"]["selectors"]]
    assert h100 == [
        classes["gpu.nvidia.com"]["selectors"][0]["cel"]["expression"],
        'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',
    ]


def test_daemonset_runs_the_kubelet_plugin(default: list[dict[str, Any]]) -> None:
    ds = one(default, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    container = plugin_container(default)
    assert container["command"] == ["gpu-dra"]
    args = container["args"]
    assert args[args.index("kubelet-plugin") :] == [
        "kubelet-plugin",
        "--node-name=$(NODE_NAME)",
        "--pod-uid=$(POD_UID)",
        "--driver-name=gpu.nvidia.com",
        "--kubelet-registrar-directory-path=/var/lib/kubelet/plugins_registry",
        "--kubelet-plugins-directory-path=/var/lib/kubelet/plugins",
        "--cdi-root=/var/run/cdi",
        "--nvidia-driver-root=/",
        "--container-driver-root=/driver-root",
        "--nvml=system",
        "--healthcheck-port=51515",
        "--metrics-port=9401",
        "--metrics-address=$(POD_IP)",
        "--mps-daemon=pod",
        "--image=gpu-dra-driver:0.2.0",
        "--image-pull-policy=IfNotPresent",
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {
        "NODE_NAME": "spec.nodeName",
        "POD_UID": "metadata.uid",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
    }
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["serviceAccountName"] == one(default, "ServiceAccount")["metadata"]["name"]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    # Restarts follow the process (service "liveness"); readiness follows registration ("").
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 51515, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 51515}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["securityContext"] == {"privileged": True}


def test_plugin_args_parse_with_the_real_command(default: list[dict[str, Any]]) -> None:
    """Flag names drift: the rendered command line must parse with gpu-dra's own parser."""
    from cli import build_parser

    container = plugin_container(default)
    # The kubelet expands $(VAR) from the container's env; do the same with sample values.
    env = {"NODE_NAME": "node-a", "POD_UID": "6a0e6d3c-uid", "POD_IP": "10.0.1.7"}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], arg) for arg in container["args"]]
    args = build_parser().parse_args(argv)
    assert (args.command, args.node_name, args.pod_uid) == (
        "kubelet-plugin",
        "node-a",
        "6a0e6d3c-uid",
    )
    assert (args.nvml, args.healthcheck_port, args.container_driver_root) == (
        "system",
        51515,
        "/driver-root",
    )
    assert args.log_level == "INFO"
    assert (args.metrics_port, args.metrics_address) == (9401, "10.0.1.7")


def test_health_values_become_the_plugins_flags() -> None:
    from cli import build_parser

    def parsed(*sets: str) -> Any:
        container = plugin_container(render((), sets))
        argv = [
            a.replace("$(NODE_NAME)", "n").replace("$(POD_UID)", "u") for a in container["args"]
        ]
        return build_parser().parse_args(argv)

    default = parsed()
    assert (default.additional_xids_to_ignore, default.auto_recover_probes) == (None, 0)
    tuned = parsed(
        "health.additionalXidsToIgnore={94,95}",
        "health.autoRecover.probes=3",
        "health.autoRecover.periodSeconds=30",
        "health.autoRecover.xids={8,11,31}",
    )
    assert tuned.additional_xids_to_ignore == frozenset({94, 95})
    assert (tuned.auto_recover_probes, tuned.auto_recover_period) == (3, 30.0)
    assert tuned.recoverable_xids == frozenset({8, 11, 31})


def test_daemonset_mounts(default: list[dict[str, Any]]) -> None:
    pod = one(default, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m for m in plugin_container(default)["volumeMounts"]}
    assert volumes == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugins": "/var/lib/kubelet/plugins",
        "cdi": "/var/run/cdi",
        "driver-root": "/",
        "nvidia-caps": "/dev/nvidia-caps",
    }
    # Socket and CDI paths are handed to the kubelet and runtime: same path inside and out.
    for name in ("plugins-registry", "plugins", "cdi"):
        assert mounts[name]["mountPath"] == volumes[name]
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"
    assert mounts["driver-root"]["mountPath"] == "/driver-root"
    assert mounts["driver-root"]["readOnly"] is True
    assert mounts["nvidia-caps"]["mountPath"] == "/dev/nvidia-caps"


def _match_expressions(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    affinity = one(objects, "DaemonSet")["spec"]["template"]["spec"]["affinity"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert len(terms) == 1  # one term: every expression must hold
    expressions: list[dict[str, Any]] = terms[0]["matchExpressions"]
    return expressions


def test_node_affinity_defaults(default: list[dict[str, Any]]) -> None:
    assert _match_expressions(default) == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
        {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]},
        {"key": "karpenter.sh/nodepool", "operator": "DoesNotExist"},
    ]


def test_node_affinity_by_instance_type_and_karpenter_flip() -> None:
    objects = render(
        (),
        (
            "nodeSelection.instanceTypes={p5.48xlarge,p4d.24xlarge}",
            "nodeSelection.excludeKarpenter=false",
        ),
    )
    assert _match_expressions(objects) == [
        {
            "key": "node.kubernetes.io/instance-type",
            "operator": "In",
            "values": ["p5.48xlarge", "p4d.24xlarge"],
        },
        {"key": "eks.amazonaws.com/compute-type", "operator": "NotIn", "values": ["auto"]},
    ]


def test_eks_values(eks: list[dict[str, Any]]) -> None:
    args = plugin_container(eks)["args"]
    assert "--nvidia-driver-root=/" in args
    assert "--cdi-root=/var/run/cdi" in args
    text = EKS_VALUES.read_text()
    assert "nvidia.com/gpu.present" in text and "node group" in text.lower()


def test_eks_values_select_every_instance_type_we_have_a_profile_of(
    eks: list[dict[str, Any]],
) -> None:
    """A profile is an EKS GPU instance we simulate: values-eks.yaml must schedule the plugin
    there (P6e-GB200 was missing, so ComputeDomains' own instance got no plugin)."""
    (selected,) = [e["values"] for e in _match_expressions(eks)
                   if e["key"] == "node.kubernetes.io/instance-type"]  # fmt: skip
    ours = {p.removesuffix("-mig") for p in profile_names() if not p.startswith("synthetic")}
    assert ours <= set(selected), ours - set(selected)


def test_cluster_role_is_least_privilege(default: list[dict[str, Any]]) -> None:
    # tests/test_rbac_use.py holds these grants against what the node process really sends.
    slices = {
        (v, "resource.k8s.io", "resourceslices")
        for v in ("list", "watch", "create", "update", "delete")
    }
    claims = {
        ("get", "resource.k8s.io", "resourceclaims"),
        ("update", "resource.k8s.io", "resourceclaims/status"),  # status.devices
        ("associated-node:update", "resource.k8s.io", "resourceclaims/driver"),
    }
    assert rbac_grants(default) == slices | claims | {("get", "", "nodes")}
    # status.devices: this release's drivers only (the ComputeDomain one is off by default)
    (driver_rule,) = [r for r in one(default, "ClusterRole")["rules"]
                      if r["resources"] == ["resourceclaims/driver"]]  # fmt: skip
    assert driver_rule["resourceNames"] == ["gpu.nvidia.com"]
    assert rbac_grants(default, "Role") == {
        (v, "coordination.k8s.io", "leases") for v in ("get", "create", "update")
    } | {(v, "", "pods") for v in ("get", "list", "create", "delete")}  # MPS daemon pods
    sa = one(default, "ServiceAccount")["metadata"]
    for binding in by_kind(default, "ClusterRoleBinding") + by_kind(default, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
        ]


def named(objects: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objects, kind) if o["metadata"]["name"].endswith(suffix)]
    return found


def test_resourceslice_policy_binds_writes_to_own_node(default: list[dict[str, Any]]) -> None:
    policy = named(default, "ValidatingAdmissionPolicy", "-resourceslices")
    binding = named(default, "ValidatingAdmissionPolicyBinding", "-resourceslices")
    sa = one(default, "ServiceAccount")["metadata"]
    spec = policy["spec"]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceslices"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    (condition,) = spec["matchConditions"]
    assert f'"system:serviceaccount:{sa["namespace"]}:{sa["name"]}"' in condition["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["userNodeName"]
    assert (
        "oldObject" in variables["slice"] and 'request.operation == "DELETE"' in variables["slice"]
    )
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert 'variables.slice.spec.driver in ["gpu.nvidia.com"]' in checks
    assert "variables.sliceNodeName == variables.userNodeName" in checks
    assert "variables.slicePoolName == variables.userNodeName" in checks


def test_claims_are_read_one_by_one_and_the_values_say_reads_cannot_be_narrowed(
    default: list[dict[str, Any]],
) -> None:
    """RBAC cannot scope claim reads to a node: the grant is the narrowest there is (a get,
    never a list or watch of every claim), and the values tell the operator the rest."""
    claims = {
        verb for verb, group, resource in rbac_grants(default) if resource == "resourceclaims"
    }
    assert claims == {"get"}
    values = " ".join((chart_render.CHART_DIR / "values.yaml").read_text().split())
    assert "every node's plugin can read every ResourceClaim in every namespace" in values.replace(
        "# ", ""
    )


def test_lease_policy_binds_writes_to_own_lease(default: list[dict[str, Any]]) -> None:
    policy = named(default, "ValidatingAdmissionPolicy", "-leases")
    binding = named(default, "ValidatingAdmissionPolicyBinding", "-leases")
    sa = one(default, "ServiceAccount")["metadata"]
    spec = policy["spec"]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    (condition,) = spec["matchConditions"]
    assert f'"system:serviceaccount:{sa["namespace"]}:{sa["name"]}"' in condition["expression"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert (
        '["gpu.nvidia.com"].exists(d, variables.leaseName == d + "-" + variables.userNodeName)'
        in checks
    )


def _policy_names(objects: list[dict[str, Any]]) -> set[str]:
    return {o["metadata"]["name"] for o in by_kind(objects, "ValidatingAdmissionPolicy")}


def test_policy_can_be_turned_off() -> None:
    objects = render((), ("resourceSlicePolicy.enabled=false",))
    assert _policy_names(objects) == {"gpu-dra-driver-gpuconfig"}


def test_config_admission_can_be_turned_off() -> None:
    objects = render((), ("configAdmission.enabled=false",))
    assert "gpu-dra-driver-gpuconfig" not in _policy_names(objects)
    assert len(_policy_names(objects)) == 4


def test_config_admission_matches_claims_and_templates_of_this_driver_on_create(
    default: list[dict[str, Any]],
) -> None:
    (policy,) = [
        p for p in by_kind(default, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == "gpu-dra-driver-gpuconfig"
    ]  # fmt: skip
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceclaims", "resourceclaimtemplates"]
    assert rule["operations"] == ["CREATE"]
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"
    (condition,) = spec["matchConditions"]
    assert 'c.opaque.driver == "gpu.nvidia.com"' in condition["expression"]


def test_mig_device_class(default: list[dict[str, Any]]) -> None:
    (cls,) = [
        c for c in by_kind(default, "DeviceClass") if c["metadata"]["name"] != "gpu.nvidia.com"
    ]
    assert cls["metadata"]["name"] == "mig.nvidia.com"
    assert cls["spec"] == {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.nvidia.com" && '
                    'device.attributes["gpu.nvidia.com"].type == "mig"'
                }
            }
        ]
    }


def test_gpu_device_class(default: list[dict[str, Any]]) -> None:
    (cls,) = [
        c for c in by_kind(default, "DeviceClass") if c["metadata"]["name"] == "gpu.nvidia.com"
    ]
    assert cls["metadata"]["name"] == "gpu.nvidia.com"
    assert cls["spec"] == {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.driver == "gpu.nvidia.com" && '
                    'device.attributes["gpu.nvidia.com"].type == "gpu"'
                }
            }
        ]
    }  # extendedResourceName is off by default


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("kubeletPlugin.healthcheckPort=not-a-port", "/kubeletPlugin/healthcheckPort"),
        ("nodeSelection.excludeKarpenter=maybe", "/nodeSelection/excludeKarpenter"),
        ("kubeletPlugin.nvml=cuda", "/kubeletPlugin/nvml"),
        ("cdiRoot=relative/path", "/cdiRoot"),
        # 56 and 70 bytes: no room for the MPS sockets, or for a registration socket.
        (
            "kubeletPlugin.kubeletPluginsDirectoryPath=/" + "k" * 47 + "/plugins",
            "/kubeletPlugin/kubeletPluginsDirectoryPath",
        ),
        (
            "kubeletPlugin.kubeletRegistrarDirectoryPath=/" + "k" * 52 + "/plugins_registry",
            "/kubeletPlugin/kubeletRegistrarDirectoryPath",
        ),
        ("kubeletPlugn.logLevel=INFO", "kubeletPlugn"),
        ("health.autoRecover.xids={8,79}", "/health/autoRecover/xids/1"),
        ("health.autoRecover.probes=-1", "/health/autoRecover/probes"),
    ],
)
def test_schema_rejects_wrong_values(setting: str, where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as info:
        render((), (setting,))
    assert where in str(info.value)


def test_device_plugin_guard_fails_the_install() -> None:
    with pytest.raises(helm_python.HelmRenderError) as info:
        render([EKS_VALUES], ("nvidiaDevicePlugin.runsOnSelectedNodes=true",))
    message = str(info.value)
    assert "NVIDIA device plugin" in message and "twice" in message


def test_simulated_nvml_needs_a_profile() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"kubeletPlugin\.profile"):
        render((), ("kubeletPlugin.nvml=simulated",))


def test_values_schema_is_valid_json_schema() -> None:
    schema = json.loads((chart_render.CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    for path in (chart_render.CHART_DIR / "values.yaml", EKS_VALUES):
        values = chart_render.user_values([chart_render.CHART_DIR / "values.yaml", path])
        assert list(validator.iter_errors(values)) == [], path.name


def test_chart_metadata_admits_eks_versions() -> None:
    chart = yaml.safe_load((chart_render.CHART_DIR / "Chart.yaml").read_text())
    # "-0" lets pre-releases such as v1.34.3-eks-... through.
    assert chart["kubeVersion"] == ">=1.34.0-0"


def test_every_value_is_commented() -> None:
    """Every key down to the second level has its own comment right above it (deeper keys are
    plain data such as resource quantities, explained by their parent's comment)."""
    lines = (chart_render.CHART_DIR / "values.yaml").read_text().splitlines()
    keys = 0
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if not line.strip() or line.lstrip().startswith(("#", "- ")) or indent > 2:
            continue
        keys += 1
        assert lines[i - 1].strip().startswith("#"), f"values.yaml:{i + 1}: no comment: {line!r}"
    assert keys >= 30


def test_make_chart_prints_the_rendered_chart() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert chart_render.main(["-f", str(EKS_VALUES)]) == 0
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert docs == render([EKS_VALUES])
    assert "# Source: gpu-dra-driver/templates/daemonset.yaml" in out.getvalue()


def test_strict_schema_check_catches_a_misspelt_field(default: list[dict[str, Any]]) -> None:
    """The schema test above can fail: strict mode rejects a field the API does not know."""
    daemonset = yaml.safe_load(yaml.safe_dump(one(default, "DaemonSet")))
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError, match="volumeMount"):
        kubernetes_validate.validate(daemonset, "1.34", strict=True)


def helm_binary() -> str | None:
    """helm on PATH, or the one the e2e tier built (tests/e2e/versions.toml pins it)."""
    cached = e2e_build.cache_root() / f"helm-{e2e_build.VERSIONS['helm']['version']}" / "helm"
    return shutil.which("helm") or (str(cached) if cached.exists() else None)


@pytest.fixture
def helm() -> str:
    found = helm_binary()
    if found is None:
        pytest.skip(
            "no helm binary: `make e2e-build` builds the pinned one (tests/e2e/versions.toml); "
            "helm-python-sdk's lint engine runs in test_helm_lint_is_clean"
        )
    return found


@pytest.mark.parametrize("values", [(), (EKS_VALUES,)], ids=["default", "eks"])
def test_helm_binary_lint_strict_is_clean(helm: str, values: tuple[str, ...]) -> None:
    files = [arg for path in values for arg in ("-f", str(path))]
    out = subprocess.run(
        [helm, "lint", "--strict", str(chart_render.CHART_DIR), *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_helm_template_renders_what_the_tests_render(helm: str) -> None:
    """`helm template` (the README's render command) and the engine of these tests agree."""
    out = subprocess.run(
        [
            helm,
            "template",
            "gpu-dra-driver",
            str(chart_render.CHART_DIR),
            "-n",
            NAMESPACE,
            "--kube-version",
            "1.34.0",
            "-f",
            str(EKS_VALUES),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert sorted(docs, key=key) == sorted(render([EKS_VALUES]), key=key)


# ---- metrics, ServiceMonitor, DeviceTaintRule: rendered for what the cluster serves ----------

# Which DeviceTaintRule versions each minor serves (kubernetes-dra-facts: v1alpha3 from 1.33,
# v1beta2 from 1.36, v1 from 1.37), and the one the chart must pick: the newest.
TAINT_RULE_VERSIONS = {
    "1.34": (("v1alpha3",), "v1alpha3"),
    "1.35": (("v1alpha3",), "v1alpha3"),
    "1.36": (("v1alpha3", "v1beta2"), "v1beta2"),
    "1.37": (("v1alpha3", "v1beta2", "v1"), "v1"),
}
TAINT_RULE = ("deviceTaintRule.enabled=true", "deviceTaintRule.pool=ip-10-0-1-7.ec2.internal")


def test_metrics_are_served_on_the_port_the_service_names(default: list[dict[str, Any]]) -> None:
    container = plugin_container(default)
    assert "--metrics-port=9401" in container["args"]
    assert {"name": "metrics", "containerPort": 9401, "protocol": "TCP"} in container["ports"]
    service = one(default, "Service")
    assert service["spec"]["clusterIP"] == "None"  # one endpoint per plugin pod
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9401, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = one(default, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    off = render((), ("metrics.enabled=false",))
    assert not by_kind(off, "Service")
    assert not any(a.startswith("--metrics-") for a in plugin_container(off)["args"])
    assert "POD_IP" not in {e["name"] for e in plugin_container(off)["env"]}


def test_service_monitor_only_where_the_cluster_serves_it() -> None:
    on = ("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
    assert not by_kind(render((), on), "ServiceMonitor")  # no Prometheus Operator: no object
    assert not by_kind(render(api_versions=["monitoring.coreos.com/v1"]), "ServiceMonitor")
    objects = render((), on, api_versions=["monitoring.coreos.com/v1"])
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    service = one(objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_device_taint_rule_uses_the_newest_version_the_cluster_serves(version: str) -> None:
    served, expected = TAINT_RULE_VERSIONS[version]
    api_versions = [f"resource.k8s.io/{v}/DeviceTaintRule" for v in served]
    rule = one(render((), TAINT_RULE, api_versions=api_versions), "DeviceTaintRule")
    assert rule["apiVersion"] == f"resource.k8s.io/{expected}"
    assert rule["spec"] == {
        "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "ip-10-0-1-7.ec2.internal"},
        "taint": {"key": "gpu.nvidia.com/maintenance", "effect": "NoSchedule"},
    }
    kubernetes_validate.validate(rule, version, strict=True)
    one_device = (*TAINT_RULE, "deviceTaintRule.device=gpu-3", "deviceTaintRule.taint.value=rma")
    rule = one(render((), one_device, api_versions=api_versions), "DeviceTaintRule")
    assert rule["spec"]["deviceSelector"]["device"] == "gpu-3"
    assert rule["spec"]["taint"]["value"] == "rma"
    kubernetes_validate.validate(rule, version, strict=True)


def test_device_taint_rule_is_off_by_default_and_absent_where_not_served() -> None:
    served = ["resource.k8s.io/v1/DeviceTaintRule"]
    assert not by_kind(render(api_versions=served), "DeviceTaintRule")  # off by default
    # Helm's built-in set has resource.k8s.io/v1beta2 as a group version, not the kind a
    # cluster serves: without the kind in discovery nothing is rendered.
    assert not by_kind(render((), TAINT_RULE), "DeviceTaintRule")
    with pytest.raises(helm_python.HelmRenderError, match=r"deviceTaintRule\.pool must name"):
        render((), ("deviceTaintRule.enabled=true",), api_versions=served)


def test_mps_daemon_pods_are_the_default_and_process_mode_grants_no_pods() -> None:
    """The MPS daemons run as pods from the plugin's own image and pull secrets, which the
    plugin may make and delete in its namespace alone; ``process`` takes both away."""
    pods = {(verb, "", "pods") for verb in ("get", "list", "create", "delete")}
    objects = render([], ["image.tag=0.2.0", "imagePullSecrets[0].name=regcred"])
    args = plugin_container(objects)["args"]
    assert "--mps-daemon=pod" in args and "--image=gpu-dra-driver:0.2.0" in args
    assert "--image-pull-secrets=regcred" in args
    assert rbac_grants(objects, "Role") >= pods
    assert not rbac_grants(objects, "ClusterRole") & pods  # never cluster-wide
    objects = render([], ["kubeletPlugin.mpsDaemon=process"])
    args = plugin_container(objects)["args"]
    assert "--mps-daemon=process" in args and not any(a.startswith("--image") for a in args)
    assert not rbac_grants(objects, "Role") & pods
