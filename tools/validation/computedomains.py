"""ComputeDomain and ComputeDomainClique objects (resource.nvidia.com/v1beta1), checked as
the API server checks them once the chart's CRDs are installed, and for what NVIDIA's
controller needs beyond the schema.

The schemas below are the CRDs' (charts/gpu-dra-driver/crds/; tests/test_validate_
computedomain.py holds them equal, descriptions aside), walked the way the API server's
structural schema does on a create with ``fieldValidation=Strict`` (what ``kubectl apply``
sends): a null field is pruned and takes its default, an unknown field is refused, then
types, required fields, enums and minimums. One rule cannot be checked offline: ``spec`` is
immutable (``self == oldSelf``), which only an update against the stored object can break.
Patterns and maximum lengths are checked too (the channel template's name has both).
"""

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from driver.common.limits import is_dns_subdomain
from drivers.computedomain import names
from tools.cel import suggest
from tools.validation.problems import Check, Finding, Severity

# The CRD's pattern of the channel template's name: a ResourceClaimTemplate's (a DNS subdomain).
DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_PATTERNS: Final = {
    DNS_SUBDOMAIN: "must be a DNS subdomain (lowercase letters, digits, '-' and '.', starting "
    "and ending with a letter or digit): the controller creates a ResourceClaimTemplate of "
    "this name in the domain's namespace",
}
_STATUS: Final = {"type": "string", "default": names.NOT_READY, "enum": list(names.STATUSES)}
_TOP: Final = {
    "apiVersion": {"type": "string"},
    "kind": {"type": "string"},
    "metadata": {"type": "object"},
}

COMPUTE_DOMAIN_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        **_TOP,
        "spec": {
            "type": "object",
            "required": ["channel"],
            "properties": {
                "numNodes": {"type": "integer", "default": 0, "minimum": 0},
                "channel": {
                    "type": "object",
                    "required": ["resourceClaimTemplate"],
                    "properties": {
                        "resourceClaimTemplate": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {
                                    "type": "string",
                                    "maxLength": 253,
                                    "pattern": DNS_SUBDOMAIN,
                                }
                            },
                        },
                        "allocationMode": {
                            "type": "string",
                            "default": names.ALLOCATION_SINGLE,
                            "enum": list(names.ALLOCATION_MODES),
                        },
                    },
                },
            },
        },
        "status": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": _STATUS,
                "conditions": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["type"],
                    "items": {
                        "type": "object",
                        "required": ["message", "reason", "status", "type"],
                        "properties": {
                            "type": {"type": "string"},
                            "status": {"type": "string", "enum": ["True", "False"]},
                            "reason": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    },
                },
                "nodes": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "required": ["cliqueID", "ipAddress", "name"],
                        "properties": {
                            "name": {"type": "string"},
                            "ipAddress": {"type": "string"},
                            "cliqueID": {"type": "string"},
                            "index": {"type": "integer"},
                            "status": _STATUS,
                        },
                    },
                },
            },
        },
    },
}

CLIQUE_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        **_TOP,
        "daemons": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["nodeName"],
            "items": {
                "type": "object",
                "required": ["cliqueID", "ipAddress", "nodeName"],
                "properties": {
                    "nodeName": {"type": "string"},
                    "ipAddress": {"type": "string"},
                    "cliqueID": {"type": "string"},
                    "index": {"type": "integer"},
                    "status": _STATUS,
                },
            },
        },
    },
}

SCHEMAS: Final = {
    names.COMPUTE_DOMAIN_KIND: COMPUTE_DOMAIN_SCHEMA,
    names.CLIQUE_KIND: CLIQUE_SCHEMA,
}
# Kinds of the group that are no resource: opaque configs, written inside a claim.
_CONFIG_KINDS: Final = frozenset(
    {"GpuConfig", "MigDeviceConfig", "VfioDeviceConfig", *names.CONFIG_KIND_OF_TYPE.values()}
)

_JSON_TYPES: Final = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "boolean": "a boolean",
}


def is_ours(doc: Mapping[str, Any]) -> bool:
    """An object of the CRDs' group, whichever version or kind it claims."""
    api_version = doc.get("apiVersion")
    return isinstance(api_version, str) and api_version.partition("/")[0] == names.GROUP


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _walk(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[Finding]:
    """One structural schema against one value; ``value`` is never None (pruned above)."""
    want = schema["type"]
    got = _type_of(value)
    if got != want:
        yield Finding(path, f"must be {_JSON_TYPES[want]}, not {_shown(value)}")
        return
    if want == "object":
        properties: Mapping[str, Any] = schema.get("properties", {})
        if path == "metadata":
            yield from _metadata(value)
            return
        present = {k: v for k, v in value.items() if v is not None}
        for key in sorted(k for k in present if k not in properties):
            near = suggest(str(key), set(properties))
            yield Finding(
                _join(path, str(key)),
                f"unknown field {str(key)!r} (known: {', '.join(properties)})"
                + (f"; did you mean {near}?" if near else ""),
            )
        for key in schema.get("required", []):
            if key not in present and "default" not in properties[key]:
                yield Finding(_join(path, key), "required")
        for key, sub in properties.items():
            # A ComputeDomain's status is a subresource: dropped on create, never validated.
            if key in present and not (key == "status" and path == "" and "spec" in properties):
                yield from _walk(present[key], sub, _join(path, key))
        return
    if want == "array":
        item_schema = schema["items"]
        seen: dict[tuple[Any, ...], int] = {}
        keys = schema.get("x-kubernetes-list-map-keys", [])
        for i, item in enumerate(value):
            if item is None:
                yield Finding(
                    f"{path}[{i}]", f"must be {_JSON_TYPES[item_schema['type']]}, not null"
                )
                continue
            yield from _walk(item, item_schema, f"{path}[{i}]")
            if keys and isinstance(item, Mapping):
                key = tuple(repr(item.get(k)) for k in keys)
                if key in seen:
                    yield Finding(
                        f"{path}[{i}]",
                        f"duplicate {'/'.join(keys)} {', '.join(key)}: entry {seen[key]} has it; "
                        "must be unique (a list keyed by it)",
                    )
                seen.setdefault(key, i)
        return
    enum = schema.get("enum")
    if enum is not None and value not in enum:
        near = suggest(str(value), set(enum))
        yield Finding(
            path,
            f"{_shown(value)} is not allowed: must be one of {', '.join(enum)}"
            + (f"; did you mean {near}?" if near else ""),
        )
    minimum = schema.get("minimum")
    if minimum is not None and value < minimum:
        yield Finding(path, f"{value} must be at least {minimum}")
    longest = schema.get("maxLength")
    if longest is not None and len(value) > longest:
        yield Finding(path, f"{_shown(value)} is {len(value)} characters: at most {longest}")
    pattern = schema.get("pattern")
    if pattern is not None and not re.search(pattern, value):
        yield Finding(path, f"{_shown(value)} {_PATTERNS.get(pattern, f'must match {pattern}')}")


# ObjectMeta's fields (k8s.io/apimachinery metav1.ObjectMeta): another one is unknown.
_METADATA: Final = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "selfLink": "string",
    "uid": "string",
    "resourceVersion": "string",
    "generation": "integer",
    "creationTimestamp": "string",
    "deletionTimestamp": "string",
    "deletionGracePeriodSeconds": "integer",
    "labels": "object",
    "annotations": "object",
    "ownerReferences": "array",
    "finalizers": "array",
    "managedFields": "array",
}


def _metadata(meta: Mapping[str, Any]) -> Iterator[Finding]:
    """Unknown ObjectMeta fields and mistyped scalars and maps; names and labels are
    rules.check_metadata's."""
    for key, value in meta.items():
        want = _METADATA.get(str(key))
        path = f"metadata.{key}"
        if want is None:
            near = suggest(str(key), set(_METADATA))
            yield Finding(
                path, f"unknown field {str(key)!r}" + (f"; did you mean {near}?" if near else "")
            )
        elif value is not None and _type_of(value) != want:
            yield Finding(path, f"must be {_JSON_TYPES[want]}, not {_shown(value)}")
        elif key in ("labels", "annotations") and isinstance(value, Mapping):
            for name, text in value.items():
                if not isinstance(text, str):
                    yield Finding(f"{path}.{name}", f"must be a string, not {_shown(text)}")


def check_schema(doc: Mapping[str, Any]) -> Iterator[Finding]:
    """The API server's answer to creating ``doc`` with the CRDs installed."""
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if api_version != names.API_VERSION:
        yield Finding(
            "apiVersion",
            f"{_shown(api_version)} is not served: the chart's CRDs serve {names.GROUP} only "
            f"at {names.API_VERSION}",
        )
        return
    schema = SCHEMAS.get(str(kind))
    if schema is None:
        hint = (
            ": it is an opaque config, which must be written in a claim's "
            "spec.devices.config[].opaque.parameters"
            if kind in _CONFIG_KINDS
            else f" (the kinds: {', '.join(SCHEMAS)})"
        )
        yield Finding("kind", f"{names.API_VERSION} has no kind {_shown(kind)}{hint}")
        return
    yield from _walk(doc, schema, "")


def check_controller(doc: Mapping[str, Any]) -> Iterator[Finding]:
    """What the server accepts but NVIDIA's controller cannot act on, and what it ignores."""
    if doc.get("kind") != names.COMPUTE_DOMAIN_KIND or doc.get("apiVersion") != names.API_VERSION:
        return
    spec = doc.get("spec")
    if spec is None:
        yield Finding(
            "spec",
            "required by the controller (the schema lets it be absent): "
            "spec.channel.resourceClaimTemplate.name names the ResourceClaimTemplate workload "
            "pods claim their IMEX channel from",
            check=Check.CONTROLLER,
        )
    if doc.get("status") is not None:
        yield Finding(
            "status",
            "ignored: status is a subresource, which the API server drops on create; the "
            "controller writes it (it must be left out)",
            Severity.WARNING,
        )


def _get(doc: Mapping[str, Any], *keys: str) -> Any:
    value: Any = doc
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def channel_template(doc: Mapping[str, Any]) -> str | None:
    """The ResourceClaimTemplate a ComputeDomain's controller creates in its namespace (its
    one request is ``channel``), or None when it names none."""
    if doc.get("kind") != names.COMPUTE_DOMAIN_KIND or doc.get("apiVersion") != names.API_VERSION:
        return None
    name = _get(doc, "spec", "channel", "resourceClaimTemplate", "name")
    return name if is_dns_subdomain(name) else None
