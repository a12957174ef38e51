"""``gpu-dra validate``: check DeviceClass, ResourceClaim and ResourceClaimTemplate manifests."""

import argparse
import sys


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check DeviceClass, ResourceClaim and ResourceClaimTemplate manifests offline",
        description=(
            "Check manifests (multi-document YAML; '-' reads stdin) before applying them: the "
            "Kubernetes API schema with unknown fields rejected (kubernetes-validate --strict), "
            "the rules the schema lacks (DNS-label request names, list limits, exactly one of "
            "exactly/firstAvailable, count >= 1, CEL at most 10 KiB), every CEL selector "
            "compiled with Kubernetes' DRA environment, request names used by constraints and "
            "config, and, when any DeviceClass is among the files, that every deviceClassName "
            "names one of them. Fields that need a feature gate that is off by default in the "
            "chosen version are warnings. Other kinds (a Pod, say) get the schema check only. "
            "Prints one line per problem, 'FILE: KIND/NAME: FIELD: error|warning: MESSAGE'; "
            "exit status 1 on any error, 0 when there are only warnings or nothing."
        ),
    )
    parser.add_argument(
        "--kubernetes-version",
        default="1.34",
        metavar="V",
        help="Kubernetes version whose schema and feature-gate defaults apply, 1.34 to 1.37 "
        "(e.g. 1.35 or v1.35.2-eks-113cf36; default 1.34)",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="manifest file, or - for stdin")
    parser.set_defaults(func=_run)


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    with open(name, encoding="utf-8") as handle:
        return handle.read()


def _run(args: argparse.Namespace) -> int:
    from driver.tools.validation import Severity, parse_version, validate_sources

    try:
        version = parse_version(args.kubernetes_version)
    except ValueError as exc:
        print(f"gpu-dra validate: --kubernetes-version: {exc}", file=sys.stderr)
        return 2
    sources: list[tuple[str, str]] = []
    unreadable = 0
    for name in args.files:
        try:
            sources.append((name, _read(name)))
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"gpu-dra validate: {name}: cannot read: {reason}", file=sys.stderr)
            unreadable += 1
    problems = validate_sources(sources, version=version)
    for problem in problems:
        print(problem)
    if unreadable:
        return 2
    return 1 if any(p.severity is Severity.ERROR for p in problems) else 0
