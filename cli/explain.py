"""``gpu-dra explain``: which devices a claim gets on each node, or exactly why not.

Offline, with the scheduler's structured-parameters semantics (see
:mod:`tools.allocation`): DeviceClass and request selectors, ``exactly`` with
``count`` or ``allocationMode: All``, ``firstAvailable``, ``matchAttribute`` /
``distinctAttribute`` constraints, devices already allocated, pool generations
and completeness, device taints (DeviceTaintRules too) and tolerations.

JSON output (``-o json``), stable for scripts; keys may be added, never renamed::

    {"claim": {"kind": "ResourceClaim", "namespace": "default", "name": "tp4"},
     "problems": ["..."],          # claim-level: unknown class, selector not compiling
     "summary": {"nodes": 2, "allocatable": 1},
     "nodes": [
       {"node": "node-a", "allocatable": true,
        "results": [{"request": "gpus", "driver": "gpu.nvidia.com",
                     "pool": "node-a", "device": "gpu-0"}, ...],
        "reasons": [],
        "allocation": {...}},    # the status.allocation a scheduler would write
       {"node": "node-b", "allocatable": false, "results": [],
        "reasons": ["request gpus: needed 4, found 2 matching", ...]}],
     "advice": null,
     # an allocated ResourceClaim (with --cluster, the cluster's of that name): what it
     # holds, with its status.devices entries (the plugin's data: UUID, product...; Ready)
     "allocated": {"node": "node-a", "reservedFor": ["pods/trainer"],
                   "devices": [{"request": "gpus", "driver": "gpu.nvidia.com",
                                "pool": "node-a", "device": "gpu-0", "data": {...},
                                "ready": {"type": "Ready", "status": "True", ...}}]}}

``node`` is null when the slices name no node (only allNodes/nodeSelector pools).
Without ``-f``, the devices each ``--deviceclass`` selects::

    {"deviceClass": "gpu.nvidia.com", "problems": [],
     "summary": {"devices": 16, "selected": 8},
     "devices": [{"node": "node-a", "driver": "gpu.nvidia.com", "pool": "node-a",
                  "device": "gpu-0", "selected": true, "reason": null}, ...]}

Exit status: 0 when the claim is allocatable on at least one node (or the
class selects at least one device), 1 when it is allocatable nowhere (or
selects nothing), 2 when the input is wrong or the API server cannot be read.
"""

import argparse
import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cli import flagvalues

if TYPE_CHECKING:
    from tools.allocation import ClassListing, Explanation
    from tools.allocation.current import CurrentAllocation
    from tools.allocation.inputs import Inputs

_EPILOG = """\
inputs:
  -f FILE holds one ResourceClaim or ResourceClaimTemplate (DeviceClasses in the
  same file are used too). Files may be YAML (multi-document), JSON, or v1 Lists;
  outputs of several `gpu-dra discover -o yaml` runs may be concatenated.
  For thousands of slices prefer JSON: it parses about ten times faster than YAML.
  Without --cluster the chart's DeviceClasses are known (every switch on, the
  ones `gpu-dra validate` knows); --cluster reads ResourceSlices, DeviceClasses,
  allocated ResourceClaims, DeviceTaintRules and Node labels through the
  kubeconfig instead.
  --deviceclass files (a rendered chart, as `make chart` prints it, will do) add
  to and override those classes by name; other objects in them are ignored.
  DeviceTaintRules (from --cluster, in --slices files, or in --taint-rules files)
  taint the devices they select, as the scheduler applies them: a device drained
  by one is refused to a claim that does not tolerate its taint, and the reason
  names the rule.

json output (-o json), stable:
  {"claim": {kind, namespace, name}, "problems": [...],
   "summary": {"nodes": N, "allocatable": M},
   "nodes": [{"node", "allocatable", "results": [{"request", "driver", "pool",
              "device"}], "reasons": [...], "allocation": {...} (if allocatable)}],
   "advice": "one line" (when no node can take the claim) or null,
   "allocated": what an allocated ResourceClaim holds (with --cluster, the cluster's
     claim of that name): {"node", "devices": [{"request", "driver", "pool",
     "device", "data", "ready"}], "reservedFor": [...]}, data and ready from its
     status.devices; else null}
  without -f: {"deviceClass", "problems", "summary": {"devices", "selected"},
   "devices": [{"node", "driver", "pool", "device", "selected", "reason"}]}

exit status:
  0  allocatable on at least one node (without -f: the class selects a device)
  1  allocatable on no node (without -f: the class selects nothing)
  2  bad input, or the API server could not be read
"""


# Kinds a claim file may carry beside the claim (the pods that use it); never explained.
_WORKLOADS = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show which devices a claim gets on each node, or exactly why not",
        description=(
            "Allocate a ResourceClaim (or template) offline with the scheduler's DRA\n"
            "semantics and explain the outcome per node; without -f, list the devices\n"
            "each DeviceClass selects, and why the others are rejected."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        type=Path,
        metavar="CLAIM_OR_TEMPLATE",
        help="file with the ResourceClaim or ResourceClaimTemplate to explain",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--slices",
        type=Path,
        action="extend",
        nargs="+",
        metavar="FILE",
        default=[],
        help="files with ResourceSlices (repeatable)",
    )
    source.add_argument(
        "--cluster",
        action="store_true",
        help="read slices, classes and allocated claims from the API server",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig for --cluster (default: $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "--deviceclass",
        type=Path,
        action="extend",
        nargs="+",
        metavar="FILE",
        default=[],
        help="files with DeviceClasses, e.g. the rendered chart (repeatable; other objects "
        "in them are ignored)",
    )
    parser.add_argument(
        "--allocated",
        type=Path,
        action="extend",
        nargs="+",
        metavar="FILE",
        default=[],
        help="files with allocated ResourceClaims whose devices are taken (repeatable)",
    )
    parser.add_argument(
        "--taint-rules",
        type=Path,
        action="extend",
        nargs="+",
        metavar="FILE",
        default=[],
        help="files with DeviceTaintRules to apply, besides those in --slices files or the "
        "cluster's: a drain previewed before it is created (repeatable; other objects in them, "
        "e.g. the rest of a rendered chart, are ignored)",
    )
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME",
        help="only show these nodes (repeatable)",
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=None,
        metavar="STEPS",
        help="search steps allowed per node (default 100000)",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="output format"
    )
    flagvalues.add_max_file_size(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from driver.common.errors import DriverError
    from driver.common.gcpause import gc_paused

    try:
        # Inputs, explanation and output are acyclic, and the collector's passes over a
        # big cluster's objects (every container made since, again and again) would take
        # longer than decoding them.
        with gc_paused():
            return _run(args, sys.stdout)
    except DriverError as exc:
        print(f"gpu-dra explain: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: stop quietly, as shell tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from tools.allocation import DEFAULT_BUDGET, explain_claim, explain_class
    from tools.allocation.inputs import (
        CLAIM,
        CLASS,
        SLICE,
        TAINT_RULE,
        TEMPLATE,
        InputError,
        Inputs,
        load_file,
        of_kinds,
    )

    if not args.cluster and not args.slices:
        raise InputError("give --slices FILE or --cluster")
    if args.kubeconfig is not None and not args.cluster:
        raise InputError("--kubeconfig needs --cluster")
    inputs = _read_cluster(args.kubeconfig) if args.cluster else Inputs()
    live_claims = list(inputs.claims)
    limit = args.max_file_size
    for path in args.slices:
        # A `kubectl get resourceslices,devicetaintrules -o yaml` dump: the rules come along.
        for obj in of_kinds(load_file(path, max_bytes=limit), (SLICE, TAINT_RULE), str(path)):
            (inputs.slices if obj["kind"] == SLICE else inputs.taint_rules).append(obj)
    for path in args.taint_rules:
        found = [o for o in load_file(path, max_bytes=limit) if o.get("kind") == TAINT_RULE]
        if not found:
            raise InputError(f"{path}: no DeviceTaintRule in it")
        inputs.taint_rules.extend(found)
    if inputs.taint_rules_unread:
        print(
            f"gpu-dra explain: {inputs.taint_rules_unread}: taints of DeviceTaintRules are not "
            "accounted for",
            file=sys.stderr,
        )
    extra_classes = [c for p in args.deviceclass for c in _classes_in(p, limit)]
    for path in args.allocated:
        inputs.claims.extend(of_kinds(load_file(path, max_bytes=limit), (CLAIM,), str(path)))

    if args.filename is None:
        if not extra_classes:
            raise InputError("give -f CLAIM_OR_TEMPLATE, or --deviceclass FILE to list devices")
        listings = [
            explain_class(
                c,
                slices=inputs.slices,
                node_labels=inputs.node_labels,
                taint_rules=inputs.taint_rules,
            )
            for c in extra_classes
        ]
        if args.output == "json":
            body: Any = [x.to_json() for x in listings]
            _write_json(body[0] if len(body) == 1 else body, out)
        else:
            for listing in listings:
                _class_table(listing, out)
        return 0 if any(d.selected for x in listings for d in x.devices) else 1

    # Examples keep the workload beside its claim: the claim is what is explained.
    objects = of_kinds(
        load_file(args.filename, max_bytes=limit),
        (CLAIM, TEMPLATE, CLASS),
        str(args.filename),
        skip=_WORKLOADS,
    )
    claims = [o for o in objects if o.get("kind") in (CLAIM, TEMPLATE)]
    if len(claims) != 1:
        raise InputError(
            f"{args.filename}: expected one ResourceClaim or ResourceClaimTemplate, "
            f"found {len(claims)}"
        )
    extra_classes = [o for o in objects if o.get("kind") == CLASS] + extra_classes
    explanation = explain_claim(
        claims[0],
        slices=inputs.slices,
        classes=_merge_classes(_known_classes(args.cluster, inputs), extra_classes),
        allocated=inputs.claims,
        node_labels=inputs.node_labels,
        budget=args.budget or DEFAULT_BUDGET,
        taint_rules=inputs.taint_rules,
    )
    explanation = _with_lint(explanation, claims[0])
    explanation = _with_current(explanation, claims[0], live_claims if args.cluster else [])
    if args.node:
        wanted = set(args.node)
        unknown = wanted - {n.node for n in explanation.nodes}
        if unknown:
            raise InputError(f"no devices published for node(s) {', '.join(sorted(unknown))}")
        explanation = _only_nodes(explanation, wanted)
    if args.output == "json":
        _write_json(explanation.to_json(), out)
    else:
        _claim_table(explanation, out)
    return 0 if explanation.allocatable_nodes else 1


def _write_json(body: Any, out: TextIO) -> None:
    """The document indented to its lists, one compact line per node or device in them.

    Python's JSON encoder runs in C only without indentation: indenting a 5,000-node answer
    took longer than explaining it. One line per entry also suits grep and head.
    """
    if isinstance(body, list):
        out.write("[\n" + ",\n".join(_indented(item, "  ") for item in body) + "\n]\n")
        return
    out.write(_indented(body, "") + "\n")


def _indented(body: Any, margin: str) -> str:
    if not isinstance(body, dict) or not body:
        return margin + json.dumps(body)
    inner = margin + "  "
    lines = []
    for key, value in body.items():
        if isinstance(value, list) and value:
            entries = ",\n".join(inner + "  " + json.dumps(item) for item in value)
            lines.append(f"{inner}{json.dumps(key)}: [\n{entries}\n{inner}]")
        else:
            lines.append(f"{inner}{json.dumps(key)}: {json.dumps(value)}")
    return margin + "{\n" + ",\n".join(lines) + "\n" + margin + "}"


def _with_lint(explanation: "Explanation", claim: dict[str, Any]) -> "Explanation":
    """Add what `gpu-dra validate` finds in the claim: a misspelled attribute fails on every
    device, and the suggestion says more than the CEL runtime error."""
    from dataclasses import replace

    import yaml

    from tools.validation import Severity, validate_sources

    # Not the check against the instance profiles: explain judges the devices it was given.
    found = [
        f"{p.path}: {p.message}"
        for p in validate_sources([("claim", yaml.safe_dump(claim))], hardware_check=False)
        if p.severity is Severity.ERROR and p.path
    ]
    new = tuple(f for f in found if f not in explanation.problems)
    if not new:
        return explanation
    advice = explanation.advice
    if not explanation.allocatable_nodes:
        advice = "fix the claim first: `gpu-dra validate` shows every problem in it"
    return replace(explanation, problems=(*explanation.problems, *new), advice=advice)


def _with_current(
    explanation: "Explanation", claim: dict[str, Any], live: Sequence[dict[str, Any]]
) -> "Explanation":
    """The allocation the claim holds, with its device status: the cluster's claim of that
    name with --cluster, else the file's own status (`kubectl get resourceclaim -o yaml`)."""
    from dataclasses import replace

    from tools.allocation.current import current_allocation
    from tools.allocation.inputs import CLAIM

    ref = explanation.claim
    if ref.kind != CLAIM:
        return explanation  # a template's claims have generated names
    for other in live:
        meta = other.get("metadata") or {}
        if (meta.get("namespace"), meta.get("name")) == (ref.namespace, ref.name):
            claim = other
    return replace(explanation, current=current_allocation(claim))


def _classes_in(path: Path, max_bytes: int) -> list[dict[str, Any]]:
    """The DeviceClasses of a --deviceclass file; the rest of it (a rendered chart's RBAC, an
    example's claims) is not for explain."""
    from tools.allocation.inputs import CLASS, InputError, load_file

    classes = [o for o in load_file(path, max_bytes=max_bytes) if o.get("kind") == CLASS]
    if not classes:
        raise InputError(f"{path}: no DeviceClass in it")
    return classes


def _known_classes(cluster: bool, inputs: "Inputs") -> list[dict[str, Any]]:
    """The cluster's classes with --cluster (what is installed is what the scheduler sees);
    offline the chart's, as `gpu-dra validate` assumes them."""
    from tools.validation import chart_device_classes

    return list(inputs.classes) if cluster else chart_device_classes()


def _merge_classes(
    cluster: Sequence[dict[str, Any]], files: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    # Later wins: classes from files replace same-named cluster classes.
    by_name = {(c.get("metadata") or {}).get("name"): c for c in [*cluster, *files]}
    return list(by_name.values())


def _only_nodes(explanation: "Explanation", wanted: set[str]) -> "Explanation":
    from dataclasses import replace

    return replace(explanation, nodes=tuple(n for n in explanation.nodes if n.node in wanted))


def _read_cluster(kubeconfig: Path | None) -> "Inputs":
    from cli import _cluster
    from tools.allocation.inputs import read_cluster

    return _cluster.read(kubeconfig, read_cluster, component="explain")


def _device_text(node: str | None, pool: str, device: str) -> str:
    return device if pool == node else f"{pool}/{device}"


def _claim_table(explanation: "Explanation", out: TextIO) -> None:
    allocatable = len(explanation.allocatable_nodes)
    out.write(
        f"{explanation.claim}: allocatable on {allocatable} of {len(explanation.nodes)} node(s)\n"
    )
    for problem in explanation.problems:
        out.write(f"  problem: {problem}\n")
    if explanation.current is not None:
        _current_table(explanation.current, out)
    if not explanation.nodes:
        out.write("no node has devices in the given slices\n")
        return
    rows = [("NODE", "ALLOCATABLE", "DEVICES")]
    for entry in explanation.nodes:
        by_request: dict[str, list[str]] = defaultdict(list)
        for r in entry.results:
            by_request[r.request].append(_device_text(entry.node, r.pool, r.device))
        devices = "; ".join(f"{req}: {', '.join(devs)}" for req, devs in by_request.items())
        rows.append((entry.node or "(any)", "yes" if entry.allocatable else "no", devices or "-"))
    _write_rows(rows, out)
    # Nodes failing for the same reasons are listed once: clusters are mostly alike.
    groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for entry in explanation.nodes:
        if not entry.allocatable:
            groups[entry.reasons].append(entry.node or "(any)")
    if groups:
        out.write("\nwhy not:\n")
    for reasons, nodes in groups.items():
        shown = ", ".join(nodes[:5]) + (f", ... (+{len(nodes) - 5} more)" if len(nodes) > 5 else "")
        out.write(f"  {shown}:\n")
        for reason in reasons:
            out.write(f"    - {reason}\n")
    if explanation.advice:
        out.write(f"\nadvice: {explanation.advice}\n")


def _current_table(current: "CurrentAllocation", out: TextIO) -> None:
    where = f" on {current.node}" if current.node else ""
    users = f", reserved for {', '.join(current.reserved_for)}" if current.reserved_for else ""
    out.write(f"allocated{where}{users}:\n")
    rows = [("  REQUEST", "DEVICE", "UUID", "PRODUCT", "READY")]
    for held in current.devices:
        if held.ready is not None:
            ready = f"{held.ready.get('status')} ({held.ready.get('reason')})"
            if held.ready.get("status") != "True":
                ready += f": {held.ready.get('message', '')}"
        else:
            ready = "- (no status from the node yet)"
        rows.append(
            (
                f"  {held.request}",
                _device_text(current.node, held.pool, held.device),
                str(held.attributes.get("uuid", "-")),
                str(held.attributes.get("productName", "-")),
                ready,
            )
        )
    _write_rows(rows, out)
    out.write("if it were allocated now:\n")


def _class_table(listing: "ClassListing", out: TextIO) -> None:
    selected = sum(1 for d in listing.devices if d.selected)
    out.write(
        f"DeviceClass {listing.device_class}: selects {selected} of "
        f"{len(listing.devices)} device(s)\n"
    )
    for problem in listing.problems:
        out.write(f"  problem: {problem}\n")
    rows = [("NODE", "DRIVER", "POOL", "DEVICE", "SELECTED", "REASON")]
    rows.extend(
        (d.node or "-", d.driver, d.pool, d.device, "yes" if d.selected else "no", d.reason or "")
        for d in listing.devices
    )
    _write_rows(rows, out)
    out.write("\n")


def _write_rows(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        out.write("  ".join(cells).rstrip() + "\n")
