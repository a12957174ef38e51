"""What the demo applies: the chart's DeviceClasses, the examples, and claims from templates.

The chart and the examples live in the source tree (``charts/``), next to the
packages: the demo runs from a checkout, as ``make demo`` does.
"""

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.allocation.inputs import load_file

CHARTS_DIR = Path(__file__).resolve().parents[2] / "charts"
CHART_DIR = CHARTS_DIR / "gpu-dra-driver"
EXAMPLES_DIR = CHARTS_DIR / "examples"
# The examples the demo runs, in this order: a claim per pod, a four-GPU NVLink claim that
# only an NVSwitch node can take, a CUDA driver floor, one GPU shared by two containers, and
# one claim shared by two pods.
DEFAULT_EXAMPLES = (
    "single-gpu",
    "tensor-parallel",
    "cuda-driver-floor",
    "shared-gpu-two-containers",
    "shared-claim-two-pods",
)
_RELEASE = "gpu-dra-driver"
# Upstream's resource-claim controller: generated names keep 57 characters for the base,
# leaving room for the API server's five random ones within a 63-character name.
_MAX_BASE = 57
_HALF = 28
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def render_chart(
    values: Mapping[str, Any],
    *,
    namespace: str = _RELEASE,
    chart_dir: Path = CHART_DIR,
    api_versions: Sequence[str] = (),
) -> list[tuple[str, dict[str, Any]]]:
    """``(template path, object)`` for every object the chart renders, as ``helm template``
    (``--api-versions`` for each of ``api_versions``: what the cluster serves, as
    ``group/version`` or ``group/version/Kind``, beyond Helm's built-in set).

    Needs helm-python-sdk (ImportError without it); raises helm_python.HelmValuesError when
    the values break values.schema.json, helm_python.HelmRenderError when a template fails.
    """
    import helm_python

    with helm_python.Chart.load(chart_dir) as chart:
        if not api_versions:
            manifests = chart.render(
                dict(values), name=_RELEASE, namespace=namespace, is_install=True
            )
        else:
            # Chart.render has no api_versions keyword; the engine's render call takes it.
            from helm_python import _native

            opts = {
                "name": _RELEASE,
                "namespace": namespace,
                "is_install": True,
                "api_versions": list(api_versions),
            }
            manifests = json.loads(
                _native.call_string(
                    "helm_render", chart._raw(), json.dumps(dict(values)), json.dumps(opts)
                )
            )
    return [
        (path, doc)
        for path, text in sorted(manifests.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if isinstance(doc, dict)
    ]


def load_examples(
    names: Sequence[str] = DEFAULT_EXAMPLES, directory: Path = EXAMPLES_DIR
) -> list[tuple[str, dict[str, Any]]]:
    """``(file name, object)`` for every object of the named example files, in file order."""
    return [
        (f"{name}.yaml", obj) for name in names for obj in load_file(directory / f"{name}.yaml")
    ]


def claim_base_name(pod_name: str, pod_claim_name: str) -> str:
    """The generateName of a claim made from a template, as upstream's controller builds it."""
    base = f"{pod_name}-{pod_claim_name}-"
    if len(base) > _MAX_BASE:
        # Truncating both keeps part of the claim name when the pod name is long.
        base = f"{pod_name[:_HALF]}-{pod_claim_name[:_HALF]}-"
    return base


def claim_from_template(
    pod: Mapping[str, Any], pod_claim_name: str, template: Mapping[str, Any]
) -> dict[str, Any]:
    """The ResourceClaim the resource-claim controller creates for one pod claim (pure).

    Spec, labels and annotations come from the template; the pod owns the claim.
    """
    meta = pod["metadata"]
    template_meta = (template.get("spec") or {}).get("metadata") or {}
    annotations = dict(template_meta.get("annotations") or {})
    annotations[POD_CLAIM_ANNOTATION] = pod_claim_name
    claim_meta: dict[str, Any] = {
        "generateName": claim_base_name(meta["name"], pod_claim_name),
        "namespace": meta["namespace"],
        "annotations": annotations,
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if template_meta.get("labels"):
        claim_meta["labels"] = dict(template_meta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_meta,
        "spec": copy.deepcopy(template["spec"]["spec"]),
    }


def pod_claim_sources(pod: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(pod claim name, "template" | "claim", referenced name)`` for each pod claim."""
    sources = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if entry.get("resourceClaimTemplateName"):
            sources.append((entry["name"], "template", entry["resourceClaimTemplateName"]))
        elif entry.get("resourceClaimName"):
            sources.append((entry["name"], "claim", entry["resourceClaimName"]))
    return sources
