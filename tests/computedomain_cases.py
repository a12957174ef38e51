"""ComputeDomain and ComputeDomainClique manifests, valid and mutated, each with the verdict
the API server gives on create with the chart's CRDs installed.

One table for two oracles: tests/test_validate_computedomain.py holds ``gpu-dra validate``
to each verdict offline, and tests/e2e/test_computedomain_api.py holds the real
kube-apiserver to the same verdicts, so validate and the server agree through it.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from drivers.computedomain import names

UID = "bb55e2a1-7c3d-4f0e-9a8b-0123456789ea"


def channel_injection() -> dict[str, Any]:
    """NVIDIA's demo/specs/imex/channel-injection.yaml ComputeDomain."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": "imex-channel-injection"},
        "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "imex-channel-0"}}},
    }


def aws_nvbandwidth() -> dict[str, Any]:
    """AWS's P6e-GB200 walkthrough (ml-eks-nvidia-ultraserver): elastic, numNodes 0."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.COMPUTE_DOMAIN_KIND,
        "metadata": {"name": "nvbandwidth-test-compute-domain"},
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": "nvbandwidth-test-compute-domain-channel"}
            },
        },
    }


def clique() -> dict[str, Any]:
    """What two daemons of one clique write (cmd/compute-domain-daemon/cdclique.go)."""
    clique_id = "00000000-0000-0000-0000-000000000001.0"
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.CLIQUE_KIND,
        "metadata": {"name": names.clique_name(UID, clique_id)},
        "daemons": [
            {"nodeName": f"gb200-{i}", "ipAddress": f"10.0.0.{i}", "cliqueID": clique_id,
             "index": i, "status": "Ready"}
            for i in (1, 2)
        ],
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    doc: dict[str, Any]
    # The field the API server refuses the create at (validate's API error names it), or
    # None when it accepts the object.
    refused_at: str | None
    # A field validate reports beyond the schema (the controller cannot act on it), or None.
    controller: str | None = None


def within(path: str, field: str) -> bool:
    """``path`` is ``field`` or a field inside it."""
    return path == field or path.startswith((f"{field}.", f"{field}["))


def _mutated(base: Callable[[], dict[str, Any]], change: Callable[[dict[str, Any]], None]) -> Any:
    doc = copy.deepcopy(base())
    change(doc)
    return doc


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set (or, with ``...``, delete) the field at a dotted path."""

    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is ...:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


CD = channel_injection
NAME = "spec.channel.resourceClaimTemplate.name"
MODE = "spec.channel.allocationMode"

CASES: list[Case] = [
    # accepted
    Case("NVIDIA's channel-injection domain", CD(), None),
    Case("AWS's nvbandwidth domain", aws_nvbandwidth(), None),
    Case("allocationMode All", _mutated(CD, _set(MODE, "All")), None),
    Case("allocationMode Single", _mutated(CD, _set(MODE, "Single")), None),
    Case("numNodes absent: the default 0", _mutated(CD, _set("spec.numNodes", ...)), None),
    Case("numNodes null: pruned, then 0", _mutated(CD, _set("spec.numNodes", None)), None),
    Case("allocationMode null: pruned, then Single", _mutated(CD, _set(MODE, None)), None),
    Case("numNodes 18, one NVL72 rack", _mutated(CD, _set("spec.numNodes", 18)), None),
    Case("numNodes a million", _mutated(CD, _set("spec.numNodes", 10**6)), None),
    Case("generateName", _mutated(CD, _set("metadata", {"generateName": "cd-"})), None),
    Case("labels", _mutated(CD, _set("metadata.labels", {"team": "ml"})), None),
    Case("a status on create: dropped", _mutated(CD, _set("status", {"status": "Ready"})), None),
    Case("a wrong status on create: dropped, unchecked",
         _mutated(CD, _set("status", {"status": "Bogus", "nodes": [{"name": 1}]})), None),
    Case("no spec: the schema allows it", _mutated(CD, _set("spec", ...)), None, "spec"),
    Case("spec null: pruned", _mutated(CD, _set("spec", None)), None, "spec"),
    Case("a clique", clique(), None),
    Case("a clique without daemons", _mutated(clique, _set("daemons", ...)), None),
    # refused
    Case("a template name the controller cannot create",
         _mutated(CD, _set(NAME, "Imex_Channel")), NAME),
    Case("an empty template name", _mutated(CD, _set(NAME, "")), NAME),
    Case("a template name of 254 characters", _mutated(CD, _set(NAME, "a" * 254)), NAME),
    Case("numNodes -1", _mutated(CD, _set("spec.numNodes", -1)), "spec.numNodes"),
    Case("numNodes a string", _mutated(CD, _set("spec.numNodes", "2")), "spec.numNodes"),
    Case("numNodes 1.5", _mutated(CD, _set("spec.numNodes", 1.5)), "spec.numNodes"),
    Case("numNodes true", _mutated(CD, _set("spec.numNodes", True)), "spec.numNodes"),
    Case("numNodes a list", _mutated(CD, _set("spec.numNodes", [2])), "spec.numNodes"),
    Case("allocationMode all", _mutated(CD, _set(MODE, "all")), MODE),
    Case("allocationMode empty", _mutated(CD, _set(MODE, "")), MODE),
    Case("allocationMode ExactCount", _mutated(CD, _set(MODE, "ExactCount")), MODE),
    Case("allocationMode 1", _mutated(CD, _set(MODE, 1)), MODE),
    Case("no channel", _mutated(CD, _set("spec.channel", ...)), "spec.channel"),
    Case("channel null", _mutated(CD, _set("spec.channel", None)), "spec.channel"),
    Case("channel empty", _mutated(CD, _set("spec.channel", {})),
         "spec.channel.resourceClaimTemplate"),
    Case("channel a list", _mutated(CD, _set("spec.channel", [])), "spec.channel"),
    Case("no resourceClaimTemplate name",
         _mutated(CD, _set("spec.channel.resourceClaimTemplate", {})), NAME),
    Case("template name null", _mutated(CD, _set(NAME, None)), NAME),
    Case("template name a number", _mutated(CD, _set(NAME, 5)), NAME),
    Case("template as a string", _mutated(CD, _set("spec.channel.resourceClaimTemplate",
                                                   "imex-channel-0")),
         "spec.channel.resourceClaimTemplate"),
    Case("unknown field in spec", _mutated(CD, _set("spec.chanel", {})), "spec.chanel"),
    Case("unknown top-level field", _mutated(CD, _set("specs", {})), "specs"),
    Case("template namespace (no such field)",
         _mutated(CD, _set("spec.channel.resourceClaimTemplate.namespace", "x")),
         "spec.channel.resourceClaimTemplate.namespace"),
    Case("numNodes at the top", _mutated(CD, _set("numNodes", 2)), "numNodes"),
    Case("spec a list", _mutated(CD, _set("spec", [])), "spec"),
    Case("spec a string", _mutated(CD, _set("spec", "channel")), "spec"),
    Case("name not a DNS subdomain", _mutated(CD, _set("metadata.name", "Imex")), "metadata.name"),
    Case("a label key with two slashes", _mutated(CD, _set("metadata.labels", {"a/b/c": "x"})),
         "metadata.labels"),
    Case("a label value with a space", _mutated(CD, _set("metadata.labels", {"a": "b c"})),
         "metadata.labels"),
    Case("unknown metadata field", _mutated(CD, _set("metadata.labelz", {})), "metadata.labelz"),
    Case("a spec on a clique", _mutated(clique, _set("spec", {})), "spec"),
    Case("a clique daemon without an address",
         _mutated(clique, _set("daemons.0.ipAddress", ...)), "daemons[0].ipAddress"),
    Case("a clique daemon with a wrong status",
         _mutated(clique, _set("daemons.0.status", "Up")), "daemons[0].status"),
    Case("a clique daemon index a string",
         _mutated(clique, _set("daemons.0.index", "1")), "daemons[0].index"),
    Case("two clique daemons on one node",
         _mutated(clique, _set("daemons.1.nodeName", "gb200-1")), "daemons[1]"),
    Case("a clique daemon null", _mutated(clique, _set("daemons.1", None)), "daemons[1]"),
]  # fmt: skip
