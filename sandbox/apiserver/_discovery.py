"""Discovery documents: /version, /api, /apis and the per-group-version resource lists."""

from typing import Any

from sandbox.apiserver import _status as status
from sandbox.apiserver._resources import RESOURCE_GROUP, RESOURCES

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def served_groups(serve_resource_v1: bool) -> list[str]:
    groups = sorted({r.group for r in RESOURCES if r.group})
    return [g for g in groups if g != RESOURCE_GROUP or serve_resource_v1]


def document(path: str, *, version: str, address: str, serve_resource_v1: bool) -> Any:
    """The discovery document at ``path``; None for a path that is not a discovery one."""
    path = path.rstrip("/") or "/"
    if path == "/version":
        return _version(version)
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        }
    if path == "/api/v1":
        return _resource_list("", "v1")
    if not path.startswith("/apis") or path.count("/") > 3:
        return None  # every resource request: skip the group lookup below
    groups = served_groups(serve_resource_v1)
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups]}
    if path.startswith("/apis/") and path.count("/") == 2:
        group = path.split("/")[2]
        if group not in groups:
            raise status.not_served()
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(group)}
    if path.startswith("/apis/") and path.count("/") == 3:
        _, _, group, group_version = path.split("/")
        if group in groups and any(
            r.group == group and r.version == group_version for r in RESOURCES
        ):
            return _resource_list(group, group_version)
        raise status.not_served()
    return None


def _version(version: str) -> dict[str, str]:
    major, minor = version.split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": major,
        "minCompatibilityMinor": str(int(minor) - 1),
        "gitVersion": f"v{version}",
        "gitCommit": "local",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def _group(group: str) -> dict[str, Any]:
    versions = sorted({r.version for r in RESOURCES if r.group == group})
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def _resource_list(group: str, version: str) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for r in RESOURCES:
        if r.group != group or r.version != version:
            continue
        entry: dict[str, Any] = {
            "name": r.plural,
            "singularName": r.kind.lower(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": _VERBS,
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        resources.append(entry)
        resources.extend(
            {
                "name": f"{r.plural}/{sub}",
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }
            for sub in r.subresources
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
