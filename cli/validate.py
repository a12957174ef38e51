"""``gpu-dra validate``: check DeviceClass, ResourceClaim, ResourceClaimTemplate and
ComputeDomain manifests."""

import argparse
import sys
from pathlib import Path
from typing import Any

from cli import flagvalues

_EPILOG = """\
what is checked:
  the YAML itself first: a key written twice in one mapping (two documents run together
    without ---, in particular) is an error at its line, as the API server's decoder has it.
  every object: the Kubernetes API schema, unknown fields rejected (every one of an object
    named) (kubernetes-validate --strict) for the chosen version.
  the objects given are the cluster's state for the check, and --cluster adds the cluster's
    own: DeviceClasses, ResourceClaims and templates, ComputeDomains, ResourceSlices and
    Namespaces (adminAccess in a namespace given without the label
    resource.kubernetes.io/admin-access: "true" is an error).
  DeviceClass, ResourceClaim, ResourceClaimTemplate: the rules the schema lacks (DNS-label
    request names, list limits, exactly one of exactly/firstAvailable, count >= 1, CEL at
    most 10 KiB); every CEL selector compiled with Kubernetes' DRA environment; attribute
    and capacity names against what gpu.nvidia.com publishes (with the closest name);
    comparisons across types (an int attribute against a string); quantity() and semver()
    literals; constraint attributes; capacity requests; request names used by constraints
    and config; opaque GpuConfig parameters, parsed as the kubelet plugin parses them, and
    judged against the device types (GPU, MIG) each request they apply to selects through
    its class and selectors (the plugin's rule: MIG devices take no sharing); NVIDIA's other
    kinds (MigDeviceConfig, VfioDeviceConfig) refused with why; a GpuConfig addressed to
    another driver on requests of gpu.nvidia.com (the plugin refuses it), and a config for a
    driver no class or ResourceSlice of the chart, the files or the cluster selects (it
    applies to nothing);
    deviceClassName against the chart's DeviceClasses and those given (files, --cluster),
    with the closest name. Each request of gpu.nvidia.com, with its class's selectors,
    against the devices every EKS instance type the simulated hardware knows publishes
    (with MIG and shared variants, as gpu-dra discover publishes them): a request no
    device passes, or whose count is more than one node has, is an error naming the
    clause that fails and the values the devices have. Clauses reading what differs
    between two nodes of one type (UUIDs, PCI addresses, driver versions, NVLink
    domains) are not judged.
  ComputeDomain, ComputeDomainClique (resource.nvidia.com/v1beta1): the chart's CRD schema
    as the API server applies it (unknown fields, types, required fields, numNodes >= 0,
    allocationMode All or Single), the metadata, and what NVIDIA's controller needs beyond
    it (a spec, a channel template name it can create); its channel template counts as a
    template the files define. Not checkable offline: spec is immutable, which only an
    update against the stored object can break.
  Opaque ComputeDomainChannelConfig and ComputeDomainDaemonConfig parameters (driver
    compute-domain.nvidia.com), parsed as the node driver parses them; requests of the
    ComputeDomain classes against the config kind their device takes.
  Pod, Job, CronJob, Deployment, StatefulSet, DaemonSet, ReplicaSet: each container's
    resources.claims against the pod's resourceClaims, and those against the claims and
    templates given (in the files, read with --cluster, or a ComputeDomain's channel
    template): a name none defines is an error (--defined-elsewhere: a warning).
  Fields behind a feature gate that is off by default in the chosen version are warnings.

output: one line per problem, FILE: KIND/NAME: FIELD.PATH: error|warning: MESSAGE
  (CEL messages start with the LINE:COLUMN of the mistake in the expression); with no
  problem, one line: N objects, no problems.

exit status:
  0  no errors (warnings alone, or nothing)
  1  at least one error
  2  usage error: bad option, unsupported version, a file that cannot be read, or the
     cluster could not be read with --cluster
"""


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check DRA manifests and the pods that use them, offline",
        description=(
            "Check DeviceClass, ResourceClaim, ResourceClaimTemplate and ComputeDomain "
            "manifests, and the "
            "workloads that name them, before applying them (multi-document YAML; '-' reads "
            "stdin)."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubernetes-version",
        default="1.34",
        metavar="V",
        help="Kubernetes version whose schema and feature-gate defaults apply, 1.34 to 1.38 "
        "(e.g. 1.35 or v1.35.2-eks-113cf36; default 1.34)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also read DeviceClasses, ResourceClaims and ResourceClaimTemplates from the "
        "API server, for the names the files use, and the Namespaces, ResourceSlices and "
        "ComputeDomains it lets this user list",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig for --cluster (default: $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "--defined-elsewhere",
        action="store_true",
        help="DeviceClasses, claims and templates may be defined outside the chart, the files "
        "and --cluster, and nodes may have hardware no known EKS instance type has: a name "
        "none of them defines, or a request no known instance type's devices satisfy, is a "
        "warning, not an error",
    )
    flagvalues.add_max_file_size(parser)
    parser.add_argument("files", nargs="+", metavar="FILE", help="manifest file, or - for stdin")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tools.userfiles import UserFileError, read_text
    from tools.validation import Severity, parse_version, validate_report

    try:
        version = parse_version(args.kubernetes_version)
    except ValueError as exc:
        print(f"gpu-dra validate: --kubernetes-version: {exc}", file=sys.stderr)
        return 2
    sources: list[tuple[str, str]] = []
    unreadable = 0
    for name in args.files:
        try:
            sources.append((name, read_text(name, limit=args.max_file_size)))
        except UserFileError as exc:
            print(f"gpu-dra validate: {exc}", file=sys.stderr)
            unreadable += 1
    if unreadable:
        return 2
    known: list[dict[str, Any]] = []
    if args.kubeconfig is not None and not args.cluster:
        print("gpu-dra validate: --kubeconfig needs --cluster", file=sys.stderr)
        return 2
    if args.cluster:
        from cli import _cluster
        from driver.common.errors import DriverError
        from tools.allocation.inputs import read_references

        try:
            known = _cluster.read(args.kubeconfig, read_references, component="validate")
        except DriverError as exc:
            print(f"gpu-dra validate: --cluster: {exc}", file=sys.stderr)
            return 2
    report = validate_report(
        sources, version=version, known=known, defined_elsewhere=args.defined_elsewhere
    )
    problems = report.problems
    for problem in problems:
        print(problem)
    if not problems:
        # Silence would not tell a user that the file was read at all.
        print(f"{report.objects} object{'' if report.objects == 1 else 's'}, no problems")
    return 1 if any(p.severity is Severity.ERROR for p in problems) else 0
