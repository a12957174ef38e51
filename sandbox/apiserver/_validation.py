"""Write-time checks: official JSON schemas (cached), names, quantities, immutable fields.

Schemas come from ``kubernetes_validate`` (strict variant: unknown fields are reported);
the loaded definitions and one validator per kind are cached, since building them costs far
more than validating. ResourceSlice rules the schemas do not carry come from
``driver.common.limits.validate_resource_slice``.
"""

import functools
import json
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

from driver.common import limits
from driver.common.limits import DNS_LABEL, DNS_SUBDOMAIN
from driver.common.quantity import Quantity
from sandbox.apiserver._resources import ResourceType
from sandbox.apiserver._status import ApiError

DEFAULT_VERSION = "1.34.0"  # the oldest Kubernetes with resource.k8s.io/v1, what EKS runs

_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    f"for validation is '{DNS_SUBDOMAIN.pattern}')"
)
_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used "
    f"for validation is '{DNS_LABEL.pattern}')"
)

Errors = list[tuple[str, str]]  # (field path, message)


@functools.cache
def _schema_dir(version: str) -> Any:
    """The strict schemas of the newest release not newer than ``version``."""
    wanted = release(version)
    root = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    releases = sorted(
        (release(entry.name[1:]), entry.name)
        for entry in root.iterdir()
        if entry.name.startswith("v") and entry.name.endswith("-local-strict")
    )
    eligible = [name for found, name in releases if found <= wanted]
    if not eligible:
        raise ValueError(f"no schemas for Kubernetes {version}")
    return root.joinpath(eligible[-1])


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``1.34.0`` or ``v1.34.0-local``."""
    major, minor = re.findall(r"\d+", version)[:2]
    return int(major), int(minor)


# Keywords that only document; dropping them makes validation faster, never weaker.
_ANNOTATIONS = frozenset(
    {
        "description",
        "$schema",
        "$id",
        "format",
        "x-kubernetes-group-version-kind",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-unions",
    }
)


class _Cycle(Exception):
    pass


@functools.cache
def _definitions(version: str) -> dict[str, Any]:
    document = json.loads(_schema_dir(version).joinpath("_definitions.json").read_text())
    definitions: dict[str, Any] = document["$defs"]
    return definitions


def _inline(node: Any, definitions: dict[str, Any], stack: tuple[str, ...] = ()) -> Any:
    """The schema with every $ref replaced by its target: resolving refs dominates the cost."""
    if isinstance(node, list):
        return [_inline(item, definitions, stack) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATIONS or key == "$ref":
            continue
        if key in ("properties", "patternProperties", "$defs"):
            out[key] = {name: _inline(sub, definitions, stack) for name, sub in value.items()}
        else:
            out[key] = _inline(value, definitions, stack)
    ref = node.get("$ref")
    if ref is None:
        return out
    name = ref.rsplit("/", 1)[-1]
    if name in stack:
        raise _Cycle(name)
    return {**_inline(definitions[name], definitions, (*stack, name)), **out}


@functools.cache
def _validator(rt: ResourceType, version: str) -> Any:
    """A validator for ``rt`` at ``version``, or None where that release lacks the type."""
    group = rt.group.split(".")[0]
    name = f"{rt.kind.lower()}-{group + '-' if group else ''}{rt.version}.json"
    directory = _schema_dir(version)
    if not directory.joinpath(name).is_file():
        return None
    schema = json.loads(directory.joinpath(name).read_text())
    try:
        return jsonschema.Draft202012Validator(_inline(schema, _definitions(version)))
    except _Cycle:
        definitions: Resource[Any] = Resource.from_contents(
            json.loads(directory.joinpath("_definitions.json").read_text())
        )
        return jsonschema.Draft202012Validator(schema, registry=definitions @ Registry())


def warm_up(types: tuple[ResourceType, ...], version: str = DEFAULT_VERSION) -> None:
    """Load every schema now so the first write does not pay for it."""
    for rt in types:
        _validator(rt, version)


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_errors(
    rt: ResourceType, obj: dict[str, Any], version: str = DEFAULT_VERSION
) -> tuple[Errors, list[str]]:
    """(errors, unknown field paths) for ``obj`` against the official schema."""
    errors: Errors = []
    unknown: list[str] = []
    validator = _validator(rt, version)
    if validator is None:
        return errors, unknown
    for error in validator.iter_errors(obj):
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set(error.schema.get("properties", {}))
            base = list(error.absolute_path)
            unknown.extend(_path([*base, key]) for key in error.instance if key not in known)
            continue
        errors.append((_path(error.absolute_path), f"Invalid value: {error.message}"))
    return errors, unknown


def drop_fields(obj: dict[str, Any], paths: list[str]) -> None:
    """Remove unknown fields (the server's default ``fieldValidation=Warn`` drops them)."""
    for path in paths:
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
        node: Any = obj
        for part in parts[:-1]:
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        last = parts[-1]
        if isinstance(node, dict):
            node.pop(last, None)


def name_errors(rt: ResourceType, name: str) -> Errors:
    if not name:
        return [("metadata.name", "Required value: name or generateName is required")]
    if rt.plural == "namespaces":
        ok, message, limit = bool(DNS_LABEL.fullmatch(name)), _LABEL_MESSAGE, 63
    else:
        ok, message, limit = bool(DNS_SUBDOMAIN.fullmatch(name)), _SUBDOMAIN_MESSAGE, 253
    if not ok:
        return [("metadata.name", f'Invalid value: "{name}": {message}')]
    if len(name) > limit:
        return [
            ("metadata.name", f'Invalid value: "{name}": must be no more than {limit} characters')
        ]
    return []


_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_NAME_PART_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def label_errors(labels: Any) -> Errors:
    """metadata.labels: qualified-name keys, values of at most 63 label characters."""
    if not isinstance(labels, dict):
        return []
    errors: Errors = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if not _NAME_PART.fullmatch(name):
            errors.append(("metadata.labels", f'Invalid value: "{key}": {_NAME_PART_MESSAGE}'))
        elif len(name) > 63:
            errors.append(
                (
                    "metadata.labels",
                    f'Invalid value: "{key}": name part must be no more than 63 characters',
                )
            )
        elif prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)):
            errors.append(
                ("metadata.labels", f'Invalid value: "{key}": prefix part {_SUBDOMAIN_MESSAGE}')
            )
        if not isinstance(value, str):
            continue  # the schema reports the type
        if len(value) > 63:
            errors.append(
                ("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters')
            )
        elif value and not _NAME_PART.fullmatch(value):
            errors.append(("metadata.labels", f'Invalid value: "{value}": {_LABEL_VALUE_MESSAGE}'))
    return errors


# Where quantities sit, per resource; "*" walks every list item or map value.
_DEVICE_CAPACITY = (
    ("value",),
    ("requestPolicy", "default"),
    ("requestPolicy", "validValues", "*"),
    ("requestPolicy", "validRange", "min"),
    ("requestPolicy", "validRange", "max"),
    ("requestPolicy", "validRange", "step"),
)
_CLAIM_SPEC = (
    ("devices", "requests", "*", "exactly", "capacity", "requests", "*"),
    ("devices", "requests", "*", "firstAvailable", "*", "capacity", "requests", "*"),
)
_CONTAINER = (("resources", "requests", "*"), ("resources", "limits", "*"))
_QUANTITY_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "resourceslices": (
        *(("spec", "devices", "*", "capacity", "*", *p) for p in _DEVICE_CAPACITY),
        ("spec", "devices", "*", "consumesCounters", "*", "counters", "*", "value"),
        ("spec", "sharedCounters", "*", "counters", "*", "value"),
    ),
    "resourceclaims": (
        *(("spec", *p) for p in _CLAIM_SPEC),
        ("status", "allocation", "devices", "results", "*", "consumedCapacity", "*"),
    ),
    "resourceclaimtemplates": tuple(("spec", "spec", *p) for p in _CLAIM_SPEC),
    "pods": (
        *(("spec", "containers", "*", *p) for p in _CONTAINER),
        *(("spec", "initContainers", "*", *p) for p in _CONTAINER),
        ("spec", "overhead", "*"),
    ),
    "nodes": (("status", "capacity", "*"), ("status", "allocatable", "*")),
}


def _walk(
    node: Any, path: tuple[str, ...], trail: list[str | int]
) -> Iterator[tuple[Any, str | int, list[str | int]]]:
    """(container, key, trail) for every leaf the path reaches."""
    head, rest = path[0], path[1:]
    if head == "*":
        keys: list[str | int] = (
            list(range(len(node)))
            if isinstance(node, list)
            else list(node)
            if isinstance(node, dict)
            else []
        )
    else:
        keys = [head] if isinstance(node, dict) and head in node else []
    for key in keys:
        child = node[key]
        if not rest:
            yield node, key, [*trail, key]
        elif child is not None:
            yield from _walk(child, rest, [*trail, key])


def canonicalize_quantities(rt: ResourceType, obj: dict[str, Any]) -> None:
    """Rewrite quantities in place as the server serializes them; ApiError 400 if malformed."""
    for path in _QUANTITY_PATHS.get(rt.plural, ()):
        for container, key, trail in _walk(obj, path, []):
            raw = container[key]
            if raw is None:
                continue
            text = str(raw).strip() if isinstance(raw, (str, int, float)) else None
            try:
                if text is None or isinstance(raw, bool):
                    raise ValueError("quantity must be a string or a number")
                container[key] = str(Quantity.parse(text))
            except ValueError as exc:
                raise ApiError(
                    400,
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                    f"{_path(trail)}: {exc}",
                ) from exc


def immutable_errors(rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> Errors:
    def get(obj: dict[str, Any], *path: str) -> Any:
        node: Any = obj
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        return node

    fields: tuple[tuple[str, ...], ...] = ()
    if rt.plural == "resourceslices":
        fields = (("spec", "driver"), ("spec", "nodeName"), ("spec", "pool", "name"))
    elif rt.plural in ("resourceclaims", "resourceclaimtemplates"):
        fields = (("spec",),)
    errors: Errors = []
    for path in fields:
        before, after = get(old, *path), get(new, *path)
        if before != after:
            shown = json.dumps(after) if not isinstance(after, dict) else "{...}"
            errors.append((".".join(path), f"Invalid value: {shown}: field is immutable"))
    return errors


def _request_errors(devices: Any, prefix: str) -> Errors:
    """A request's count and every selector, as the real server's validation checks them."""
    errors: Errors = []
    requests = devices.get("requests") if isinstance(devices, dict) else None
    for i, request in enumerate(requests if isinstance(requests, list) else []):
        if not isinstance(request, dict):
            continue
        path = f"{prefix}.requests[{i}]"
        subs = [(f"{path}.exactly", request.get("exactly"))]
        first = request.get("firstAvailable")
        subs += [(f"{path}.firstAvailable[{j}]", s) for j, s in enumerate(first or [])]
        for sub_path, sub in subs:
            if not isinstance(sub, dict):
                continue
            if sub.get("allocationMode", "ExactCount") == "ExactCount" and sub.get("count", 1) < 1:
                errors.append((f"{sub_path}.count", f"Invalid value: {sub['count']}: must be "
                               "greater than zero"))  # fmt: skip
            errors += _selector_errors(sub.get("selectors"), f"{sub_path}.selectors")
    return errors


def _selector_errors(selectors: Any, prefix: str) -> Errors:
    """CEL that does not compile is refused at write time, as the real server does."""
    from tools.cel import CelCompileError, CelUnsupportedError, compile_selector

    errors: Errors = []
    for i, selector in enumerate(selectors if isinstance(selectors, list) else []):
        expression = (selector.get("cel") or {}).get("expression") if isinstance(
            selector, dict) else None  # fmt: skip
        if not isinstance(expression, str):
            continue
        try:
            compile_selector(expression)
        except CelCompileError as exc:
            errors.append((f"{prefix}[{i}].cel.expression", f"Invalid value: compilation "
                           f"failed: {exc}"))  # fmt: skip
        except CelUnsupportedError:
            continue  # valid Kubernetes CEL this project's CEL does not run: the server takes it
    return errors


def taint_effect_errors(rt: ResourceType, obj: dict[str, Any], version: str) -> Errors:
    """The effects a ResourceSlice's device taints may have: NoSchedule and NoExecute,
    and None from 1.35 (``validateDeviceTaint``; 1.34 refuses the whole slice)."""
    if rt.plural != "resourceslices" or not isinstance(obj.get("spec"), dict):
        return []
    effects = ["NoExecute", "NoSchedule"] + (["None"] if release(version) >= (1, 35) else [])
    supported = ", ".join(f'"{e}"' for e in effects)
    errors: Errors = []
    for i, device in enumerate(obj["spec"].get("devices") or ()):
        if not isinstance(device, dict):
            continue
        for j, taint in enumerate(device.get("taints") or ()):
            effect = taint.get("effect") if isinstance(taint, dict) else None
            field = f"spec.devices[{i}].taints[{j}].effect"
            if not effect:
                errors.append((field, "Required value"))
            elif effect not in effects:
                errors.append(
                    (field, f'Unsupported value: "{effect}": supported values: {supported}')
                )
    return errors


def extra_errors(rt: ResourceType, obj: dict[str, Any], version: str = DEFAULT_VERSION) -> Errors:
    """Rules the schemas do not carry (driver.common.limits, counts, CEL), as (field, message)
    pairs."""
    spec: dict[str, Any] = obj["spec"] if isinstance(obj.get("spec"), dict) else {}
    if rt.plural == "deviceclasses":
        return _selector_errors(spec.get("selectors"), "spec.selectors")
    if rt.plural == "resourceclaims":
        return _request_errors(spec.get("devices"), "spec.devices")
    if rt.plural == "resourceclaimtemplates":
        inner: dict[str, Any] = spec["spec"] if isinstance(spec.get("spec"), dict) else {}
        return _request_errors(inner.get("devices"), "spec.spec.devices")
    if rt.plural != "resourceslices":
        return []
    errors: Errors = []
    for message in limits.validate_resource_slice(obj, release=release(version)):
        field, sep, rest = message.partition(": ")
        if sep and re.fullmatch(r"[A-Za-z0-9_.\[\]/-]+", field):
            errors.append((field, rest))
        else:
            errors.append(("", message))
    return errors
