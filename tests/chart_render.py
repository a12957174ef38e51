"""Render the Helm chart with the real Helm engine (helm-python-sdk), offline.

``python -m tests.chart_render [-f VALUES]... [--set K=V]...`` prints the rendered chart as
``helm template`` would; :func:`render` returns the objects for tests.
"""

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import helm_python
import yaml

from sandbox.demo._manifests import CHART_DIR as CHART_DIR  # re-exported for the tests
from sandbox.demo._manifests import render_chart

EKS_VALUES = CHART_DIR / "values-eks.yaml"
NAMESPACE = "gpu-dra-driver"

# Helm's install order for the kinds this chart renders; others follow, as with Helm.
_KIND_ORDER = (
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "DaemonSet",
)


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge as Helm merges ``-f`` files and ``--set``: maps merge, anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def user_values(
    values_files: Iterable[str | PathLike[str]] = (), set_values: Iterable[str] = ()
) -> dict[str, Any]:
    """The user-supplied values: the files in order, then each ``--set`` expression."""
    values: dict[str, Any] = {}
    for path in values_files:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        values = _merge(values, loaded)
    expressions = [e for e in set_values if e]
    if expressions:
        # One parse, as Helm parses every --set into one map: "a[0].x=1" then "a[0].y=2"
        # build one list item instead of the second replacing the first.
        values = _merge(values, helm_python.parse_set_string(",".join(expressions)))
    return values


def _order(item: tuple[str, dict[str, Any]]) -> tuple[int, str, str]:
    path, obj = item
    kind = str(obj.get("kind", ""))
    rank = _KIND_ORDER.index(kind) if kind in _KIND_ORDER else len(_KIND_ORDER)
    return rank, path, str(obj.get("metadata", {}).get("name", ""))


def render_with_sources(
    values_files: Sequence[str | PathLike[str]] = (),
    set_values: Sequence[str] = (),
    *,
    namespace: str = NAMESPACE,
    api_versions: Sequence[str] = (),
) -> list[tuple[str, dict[str, Any]]]:
    """``(template path, object)`` pairs in Helm's install order.

    Raises helm_python.HelmValuesError when the values break values.schema.json, and
    helm_python.HelmRenderError when a template fails (the device-plugin guard, for one).
    """
    items = render_chart(
        user_values(values_files, set_values), namespace=namespace, api_versions=api_versions
    )
    return sorted(items, key=_order)


def render(
    values_files: Sequence[str | PathLike[str]] = (),
    set_values: Sequence[str] = (),
    *,
    api_versions: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """The rendered objects, as ``helm template`` with ``-f`` files, ``--set`` expressions
    and ``--api-versions`` (what the cluster serves)."""
    return [
        obj for _, obj in render_with_sources(values_files, set_values, api_versions=api_versions)
    ]


def lint(
    values_files: Sequence[str | PathLike[str]] = (), set_values: Sequence[str] = ()
) -> dict[str, Any]:
    """Helm's lint report (strict: warnings count as errors) for these values."""
    values = user_values(values_files, set_values)
    report: dict[str, Any] = helm_python.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
    return report


def rbac_grants(
    objects: Iterable[Mapping[str, Any]], kind: str = "ClusterRole"
) -> set[tuple[str, str, str]]:
    """Every ``(verb, apiGroup, resource)`` the rendered ClusterRoles (or Roles) grant."""
    grants: set[tuple[str, str, str]] = set()
    for obj in objects:
        if obj.get("kind") != kind:
            continue
        for rule in obj.get("rules", []):
            grants.update(
                (verb, group, resource)
                for verb in rule.get("verbs", [])
                for group in rule.get("apiGroups", [])
                for resource in rule.get("resources", [])
            )
    return grants


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chart_render",
        description="Print the chart rendered by the Helm engine, as helm template does.",
    )
    parser.add_argument(
        "-f",
        "--values",
        action="append",
        default=[],
        metavar="FILE",
        help="values file (repeatable)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="K=V", help="value override (repeatable)"
    )
    parser.add_argument(
        "--namespace", default=NAMESPACE, help=f"release namespace (default {NAMESPACE})"
    )
    args = parser.parse_args(argv)
    try:
        items = render_with_sources(args.values, args.set, namespace=args.namespace)
    except helm_python.HelmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path, obj in items:
        sys.stdout.write(f"---\n# Source: {path}\n")
        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
