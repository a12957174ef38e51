"""The chart's ComputeDomain part: the two CRDs in crds/ carry NVIDIA's schema rule for rule
(facts §2.1, §2.2: kubernetes-sigs/dra-driver-nvidia-gpu v0.5.0), and the two DeviceClasses
render only with computeDomains.enabled, with NVIDIA's names and selectors, selecting the
devices NVIDIA's node driver publishes and nothing else."""

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from drivers.computedomain import names
from tests import chart_render
from tests.chart_render import render
from tests.test_chart import helm_binary
from tools.allocation import explain_claim
from tools.cel import compile_selector

CRDS = chart_render.CHART_DIR / "crds"
COMPUTE_DOMAINS = CRDS / "resource.nvidia.com_computedomains.yaml"
CLIQUES = CRDS / "resource.nvidia.com_computedomaincliques.yaml"
ENABLED = ("computeDomains.enabled=true",)


def load(path: Path) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def schema_of(path: Path) -> dict[str, Any]:
    (version,) = load(path)["spec"]["versions"]
    found: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return found


def at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    """The schema of a field: ``spec.channel.allocationMode``, ``status.nodes[].name``."""
    node = schema
    for part in dotted.split("."):
        items = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if items:
            assert node["type"] == "array", dotted
            node = node["items"]
    return node


def test_both_crds_are_namespaced_v1beta1_of_resource_nvidia_com() -> None:
    for path, kind, plural, status in (
        (COMPUTE_DOMAINS, "ComputeDomain", "computedomains", {"status": {}}),
        (CLIQUES, "ComputeDomainClique", "computedomaincliques", None),
    ):
        crd = load(path)
        spec = crd["spec"]
        assert crd["metadata"]["name"] == f"{plural}.{names.GROUP}"
        assert (spec["group"], spec["scope"]) == (names.GROUP, "Namespaced")
        assert spec["names"] == {
            "kind": kind,
            "listKind": f"{kind}List",
            "plural": plural,
            "singular": plural.removesuffix("s"),
        }
        (version,) = spec["versions"]  # the only version, served and stored
        assert (version["name"], version["served"], version["storage"]) == (
            names.VERSION,
            True,
            True,
        )
        assert version.get("subresources") == status
    assert (names.COMPUTE_DOMAINS, names.CLIQUES) == ("computedomains", "computedomaincliques")


def test_compute_domain_schema_is_nvidias() -> None:
    schema = schema_of(COMPUTE_DOMAINS)
    spec = at(schema, "spec")
    assert spec["required"] == ["channel"]
    # Exactly NVIDIA's rule and message: users' tooling may match on the message.
    assert spec["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
    ]
    assert set(spec["properties"]) == {"numNodes", "channel"}
    num = at(schema, "spec.numNodes")
    assert (num["type"], num["default"], num["minimum"]) == ("integer", 0, 0)
    channel = at(schema, "spec.channel")
    assert channel["required"] == ["resourceClaimTemplate"]
    assert set(channel["properties"]) == {"resourceClaimTemplate", "allocationMode"}
    template = at(schema, "spec.channel.resourceClaimTemplate")
    assert (template["required"], set(template["properties"])) == (["name"], {"name"})
    assert at(schema, "spec.channel.resourceClaimTemplate.name")["type"] == "string"
    mode = at(schema, "spec.channel.allocationMode")
    assert (mode["type"], mode["default"], mode["enum"]) == ("string", "Single", ["All", "Single"])
    assert tuple(mode["enum"]) == names.ALLOCATION_MODES
    status = at(schema, "status")
    assert status["required"] == ["status"]
    # NVIDIA's two, and the conditions this driver adds (its controller's reasons not to
    # serve the domain): NVIDIA's status writes fit unchanged.
    assert set(status["properties"]) == {"status", "nodes", "conditions"}
    for path in ("status.status", "status.nodes[].status"):
        field = at(schema, path)
        assert (field["type"], field["default"], field["enum"]) == (
            "string",
            "NotReady",
            ["Ready", "NotReady"],
        )
    assert tuple(at(schema, "status.status")["enum"]) == names.STATUSES
    nodes = at(schema, "status.nodes")
    assert (nodes["x-kubernetes-list-type"], nodes["x-kubernetes-list-map-keys"]) == (
        "map",
        ["name"],
    )
    node = nodes["items"]
    assert sorted(node["required"]) == ["cliqueID", "ipAddress", "name"]
    assert {k: v["type"] for k, v in node["properties"].items()} == {
        "name": "string",
        "ipAddress": "string",
        "cliqueID": "string",
        "index": "integer",
        "status": "string",
    }
    assert "default" not in node["properties"]["index"]  # optional, not omitempty, in Go


def test_clique_schema_is_nvidias_with_its_payload_at_the_top() -> None:
    schema = schema_of(CLIQUES)
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "daemons"}
    daemons = at(schema, "daemons")
    assert (daemons["x-kubernetes-list-type"], daemons["x-kubernetes-list-map-keys"]) == (
        "map",
        ["nodeName"],
    )
    item = daemons["items"]
    assert sorted(item["required"]) == ["cliqueID", "ipAddress", "nodeName"]
    assert {k: v["type"] for k, v in item["properties"].items()} == {
        "nodeName": "string",
        "ipAddress": "string",
        "cliqueID": "string",
        "index": "integer",
        "status": "string",
    }
    assert item["properties"]["status"]["enum"] == ["Ready", "NotReady"]
    assert item["properties"]["status"]["default"] == "NotReady"
    (version,) = load(CLIQUES)["spec"]["versions"]
    assert "additionalPrinterColumns" not in version  # NVIDIA has none; the default suits it


def test_printer_columns_show_status_and_nodes_and_read_fields_that_exist() -> None:
    (version,) = load(COMPUTE_DOMAINS)["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Status", "NumNodes", "Channel", "Mode", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    for column in columns.values():
        path = column["jsonPath"]
        if path == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        field = at(schema, path.removeprefix("."))
        assert column["type"] == field["type"], path
    assert columns["Mode"].get("priority") == 1  # -o wide only


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_crds_pass_kubernetes_validate_strict(version: str) -> None:
    for path in (COMPUTE_DOMAINS, CLIQUES):
        kubernetes_validate.validate(load(path), version, strict=True)


def test_crds_are_not_templates_so_no_value_turns_them_off() -> None:
    # Helm installs crds/ before the templates and never from a render: a ComputeDomain
    # manifest applies even where computeDomains.enabled is false (it waits, as NVIDIA's).
    for objects in (render(), render((), ENABLED)):
        assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"]


def test_helm_shows_both_crds_as_separate_documents() -> None:
    # `helm show crds | kubectl apply -f -` is how CRDs are upgraded (Helm never does): the
    # files are printed back to back, so each must open its own YAML document.
    helm = helm_binary()
    if helm is None:
        pytest.skip("no helm binary: `make e2e-build` builds the pinned one")
    out = subprocess.run(
        [helm, "show", "crds", str(chart_render.CHART_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    shown = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["metadata"]["name"] for d in shown) == [
        "computedomaincliques.resource.nvidia.com",
        "computedomains.resource.nvidia.com",
    ]
    assert sorted(shown, key=str) == sorted([load(COMPUTE_DOMAINS), load(CLIQUES)], key=str)


# ---- the DeviceClasses -----------------------------------------------------------------


def compute_domain_classes(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] == "DeviceClass" and o["metadata"]["name"].startswith("compute-domain")
    }


def test_classes_are_off_by_default() -> None:
    assert compute_domain_classes(render()) == {}


def test_classes_have_nvidias_names_and_selectors() -> None:
    classes = compute_domain_classes(render((), ENABLED))
    assert {n: c["spec"] for n, c in classes.items()} == {
        names.DAEMON_CLASS: {"selectors": [{"cel": {"expression": names.DAEMON_CLASS_SELECTOR}}]},
        names.DEFAULT_CHANNEL_CLASS: {
            "selectors": [{"cel": {"expression": names.DEFAULT_CHANNEL_CLASS_SELECTOR}}]
        },
    }
    for cls in classes.values():
        assert cls["apiVersion"] == "resource.k8s.io/v1"
        compile_selector(cls["spec"]["selectors"][0]["cel"]["expression"])
    # The GPU classes are untouched by the switch.
    gpu = {o["metadata"]["name"] for o in render() if o["kind"] == "DeviceClass"}
    assert gpu <= {o["metadata"]["name"] for o in render((), ENABLED)}


def _device(name: str, kind: str, ident: int) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {names.TYPE_ATTRIBUTE: {"string": kind}, names.ID_ATTRIBUTE: {"int": ident}},
    }


def _slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _claim(class_name: str) -> dict[str, Any]:
    request = {"name": "r", "exactly": {"deviceClassName": class_name}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
    }


def test_each_class_selects_its_own_device_of_the_compute_domain_driver() -> None:
    # What NVIDIA's node driver publishes (facts §4.2): channel-0 and daemon-0 with type and
    # id. Decoys: a second channel (id 1), and the same devices under another driver.
    ours = [
        _device(names.CHANNEL_DEVICE, names.CHANNEL_TYPE, 0),
        _device("channel-1", names.CHANNEL_TYPE, 1),
        _device(names.DAEMON_DEVICE, names.DAEMON_TYPE, 0),
    ]
    decoys = [_device("channel-0", "channel", 0), _device("daemon-0", "daemon", 0)]
    slices = [
        _slice("gb200-a", names.DRIVER_NAME, ours),
        _slice("gb200-b", "gpu.nvidia.com", decoys),
    ]
    classes = list(compute_domain_classes(render((), ENABLED)).values())
    for class_name, device in (
        (names.DEFAULT_CHANNEL_CLASS, names.CHANNEL_DEVICE),
        (names.DAEMON_CLASS, names.DAEMON_DEVICE),
    ):
        result = explain_claim(_claim(class_name), slices=slices, classes=classes)
        assert [str(n.node) for n in result.nodes if n.allocatable] == ["gb200-a"], class_name
        assert [(r.driver, r.device) for r in result.node("gb200-a").results] == [
            (names.DRIVER_NAME, device)
        ]
