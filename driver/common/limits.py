"""The ResourceSlice rules the official JSON schemas do not carry.

Kubernetes' OpenAPI schema types ``resource.k8s.io/v1`` ResourceSlice fields but has
no maxItems, maxLength or patterns; the API server enforces those in Go
(``pkg/apis/resource/validation``). :func:`validate_resource_slice` enforces the
same rules, so our own model never publishes what a real API server would reject,
and the local API server can answer 422 like the real one. Every message starts
with the field path, e.g. ``spec.devices[3].attributes[gpu.nvidia.com/model]: ...``.
"""

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from driver.common.quantity import Quantity
from driver.common.semver import Semver, SemverError

MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_ADVANCED = 64  # ...WithTaintsOrConsumesCounters
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength
MAX_DRIVER_NAME = 63
MAX_DOMAIN = 63  # DeviceMaxDomainLength
MAX_ID = 32  # DeviceMaxIDLength
MAX_POOL_NAME = 253
MAX_TAINTS = 16
MAX_COUNTER_CONSUMPTIONS = 2
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_BINDING_CONDITIONS = 4
# Kubernetes 1.34 (counters in the slice of their devices): counters of all sets together,
# and counters consumed by the slice's devices together.
MAX_SHARED_COUNTERS_1_34 = 32
MAX_CONSUMED_COUNTERS_1_34 = 1024

# The one copy of Kubernetes' name rules (the local API server and the tools use them too).
# Matched with fullmatch: ``$`` would also accept a trailing newline.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VALUE_KEYS = ("bool", "int", "string", "version", "bools", "ints", "strings", "versions")
_LIST_KEYS = frozenset({"bools", "ints", "strings", "versions"})


# A Kubernetes UID (claims, shares): lower-case hex, 8-4-4-4-12. uuid.UUID() alone would also
# take braces, "urn:uuid:" and upper case, which are different file names for the same UUID.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_uid(value: object) -> bool:
    """A UID as the API server writes it: the one rule for claim UIDs and share IDs."""
    return isinstance(value, str) and _CANONICAL_UUID.fullmatch(value) is not None


def is_dns_label(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 63 and DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: object, max_length: int = 253) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= max_length
        and DNS_SUBDOMAIN.fullmatch(value) is not None
    )


def is_semver(value: object) -> bool:
    return isinstance(value, str) and _semver_ok(value)


@lru_cache(maxsize=1024)
def _semver_ok(value: str) -> bool:
    # semver.Parse, as the API server checks version attributes.
    try:
        Semver.parse(value)
    except SemverError:
        return False
    return True


@lru_cache(maxsize=1024)
def _quantity_ok(value: str) -> bool:
    # resource.ParseQuantity, as the API server decodes capacities.
    try:
        Quantity.parse(value)
    except ValueError:
        return False
    return True


def qualified_name_error(name: object) -> str | None:
    """Why ``name`` is not a QualifiedName (``[domain/]cIdentifier``), or None."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    return _qualified_name_error(name)


@lru_cache(maxsize=4096)
def _qualified_name_error(name: str) -> str | None:
    # Cached: every device of a slice repeats the same few dozen names.
    domain, sep, ident = name.rpartition("/")
    if sep and not is_dns_subdomain(domain, MAX_DOMAIN):
        return f"domain {domain!r} must be a DNS subdomain of at most {MAX_DOMAIN} characters"
    if len(ident) > MAX_ID or C_IDENTIFIER.fullmatch(ident) is None:
        return f"{ident!r} must be a C identifier of at most {MAX_ID} characters"
    return None


def validate_resource_slice(
    obj: Mapping[str, Any], *, release: tuple[int, int] = (1, 36)
) -> list[str]:
    """Every violation of the upstream limits in one ResourceSlice object; empty when valid.
    ``release``: the Kubernetes minor whose rules apply (1.34 keeps shared counters in the
    slice of the devices that consume them, with its own limits)."""
    errors: list[str] = []
    metadata = obj.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if name is not None and not is_dns_subdomain(name):
        errors.append(f"metadata.name: {name!r} must be a DNS subdomain (<= 253 characters)")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [*errors, "spec: required"]
    _spec(spec, errors, release)
    return errors


def _spec(spec: Mapping[str, Any], errors: list[str], release: tuple[int, int]) -> None:
    driver = spec.get("driver")
    if not is_dns_subdomain(driver, MAX_DRIVER_NAME):
        errors.append(
            f"spec.driver: {driver!r} must be a DNS subdomain of at most {MAX_DRIVER_NAME} "
            "characters"
        )
    _pool(spec.get("pool"), errors)
    _node_selection(spec, errors)
    devices = spec.get("devices")
    counters = spec.get("sharedCounters")
    together = release < (1, 35)
    if devices is not None and counters is not None and not together:
        errors.append("spec: only one of `sharedCounters` or `devices` is allowed")
    if devices is not None:
        _devices(devices, bool(spec.get("perDeviceNodeSelection")), errors)
    if counters is not None:
        _counter_sets(counters, errors)
    if together:
        _counters_1_34(counters, devices, errors)


def _counters_1_34(counters: Any, devices: Any, errors: list[str]) -> None:
    total = sum(len(c.get("counters") or {}) for c in counters or () if isinstance(c, Mapping))
    if total > MAX_SHARED_COUNTERS_1_34:
        errors.append(
            f"spec.sharedCounters: {total} counters, must have at most "
            f"{MAX_SHARED_COUNTERS_1_34} in all sets together"
        )
    consumed = sum(
        len(c.get("counters") or {})
        for d in devices or ()
        if isinstance(d, Mapping)
        for c in d.get("consumesCounters") or ()
        if isinstance(c, Mapping)
    )
    if consumed > MAX_CONSUMED_COUNTERS_1_34:
        errors.append(
            f"spec.devices: {consumed} consumed counters, must have at most "
            f"{MAX_CONSUMED_COUNTERS_1_34} in one slice"
        )


def _pool(pool: Any, errors: list[str]) -> None:
    if not isinstance(pool, Mapping):
        errors.append("spec.pool: required")
        return
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        errors.append("spec.pool.name: required")
    elif len(name) > MAX_POOL_NAME or not all(is_dns_subdomain(p) for p in name.split("/")):
        errors.append(
            f"spec.pool.name: {name!r} must be DNS subdomains separated by '/', "
            f"at most {MAX_POOL_NAME} characters"
        )
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or count <= 0:
        errors.append(f"spec.pool.resourceSliceCount: {count!r} must be greater than zero")
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or generation < 0:
        errors.append(f"spec.pool.generation: {generation!r} must be >= 0")


def _node_selection(spec: Mapping[str, Any], errors: list[str]) -> None:
    chosen = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name == "":
            errors.append("spec.nodeName: must be either unset or set to a non-empty string")
        else:
            chosen.append("nodeName")
            if not is_dns_subdomain(node_name):
                errors.append(f"spec.nodeName: {node_name!r} must be a DNS subdomain")
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("nodeSelector")
        terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
        if not isinstance(terms, list) or len(terms) != 1:
            errors.append(
                "spec.nodeSelector.nodeSelectorTerms: must have exactly one node selector term"
            )
    for flag in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(flag)
        if value is True:
            chosen.append(flag)
        elif value is not None:
            errors.append(f"spec.{flag}: must be either unset or set to true")
    if len(chosen) != 1:
        got = f" (got {', '.join(chosen)})" if chosen else ""
        errors.append(
            "spec: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
            f"`perDeviceNodeSelection` is required{got}"
        )


def max_devices(devices: Sequence[Any]) -> int:
    """Devices one slice may hold: 128, or 64 once any has taints, counters or list attributes."""
    advanced = any(
        isinstance(d, Mapping)
        and (
            d.get("taints")
            or d.get("consumesCounters")
            or any(
                isinstance(v, Mapping) and not _LIST_KEYS.isdisjoint(v)
                for v in (d.get("attributes") or {}).values()
            )
        )
        for d in devices
    )
    return MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES


def _devices(devices: Any, per_device_nodes: bool, errors: list[str]) -> None:
    if not isinstance(devices, list):
        errors.append("spec.devices: must be a list")
        return
    limit = max_devices(devices)
    if len(devices) > limit:
        why = (
            " when a device has taints, counters or list attributes" if limit < MAX_DEVICES else ""
        )
        errors.append(f"spec.devices: {len(devices)} devices, must have at most {limit}{why}")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        path = f"spec.devices[{i}]"
        if not isinstance(device, Mapping):
            errors.append(f"{path}: must be an object")
            continue
        name = device.get("name")
        if not isinstance(name, str) or not is_dns_label(name):
            errors.append(f"{path}.name: {name!r} must be a DNS label (<= 63 characters)")
        elif name in seen:
            errors.append(f"{path}.name: duplicate device name {name!r}")
        else:
            seen.add(name)
        _device(device, path, per_device_nodes, errors)


def _device(
    device: Mapping[str, Any], path: str, per_device_nodes: bool, errors: list[str]
) -> None:
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            f"{path}: {total} attributes and capacities, must not exceed "
            f"{MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, value in attributes.items():
        _attribute(path, key, value, errors)
    for key, value in capacity.items():
        where = f"{path}.capacity[{key}]"
        problem = qualified_name_error(key)
        if problem:
            errors.append(f"{where}: {problem}")
        quantity = value.get("value") if isinstance(value, Mapping) else None
        if not isinstance(quantity, str | int) or not _quantity_ok(str(quantity)):
            errors.append(f"{where}.value: {quantity!r} must be a quantity")
        policy = value.get("requestPolicy") if isinstance(value, Mapping) else None
        if policy is not None and not device.get("allowMultipleAllocations"):
            errors.append(f"{where}.requestPolicy: allowMultipleAllocations must be true")
    _counted(device.get("taints"), MAX_TAINTS, f"{path}.taints", errors)
    _counted(
        device.get("consumesCounters"), MAX_COUNTER_CONSUMPTIONS, f"{path}.consumesCounters", errors
    )
    for key in ("bindingConditions", "bindingFailureConditions"):
        _counted(device.get(key), MAX_BINDING_CONDITIONS, f"{path}.{key}", errors)
    placed = [k for k in ("nodeName", "nodeSelector", "allNodes") if device.get(k) is not None]
    if placed and not per_device_nodes:
        errors.append(
            f"{path}: `nodeName`, `nodeSelector` and `allNodes` can only be set if "
            "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
        )
    elif per_device_nodes and len(placed) != 1:
        errors.append(
            f"{path}: exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required"
        )


_SCALAR_OK = {
    "string": lambda v: isinstance(v, str) and len(v) <= MAX_VALUE_LENGTH,
    "version": lambda v: isinstance(v, str) and len(v) <= MAX_VALUE_LENGTH and is_semver(v),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
}


def _attribute(path: str, key: Any, value: Any, errors: list[str]) -> None:
    problem = qualified_name_error(key)
    if problem:
        errors.append(f"{path}.attributes[{key}]: {problem}")
    # Fast path, taken by every well-formed scalar attribute: one key, a valid value.
    if isinstance(value, dict) and len(value) == 1:
        ((kind, item),) = value.items()
        check = _SCALAR_OK.get(kind)
        if check is not None and check(item):
            return
    _attribute_errors(f"{path}.attributes[{key}]", value, errors)


def _attribute_errors(where: str, value: Any, errors: list[str]) -> None:
    if not isinstance(value, Mapping):
        errors.append(f"{where}: must be an object with exactly one value")
        return
    kinds = [k for k in _VALUE_KEYS if value.get(k) is not None]
    if len(kinds) != 1:
        errors.append(f"{where}: exactly one value must be specified, got {kinds or 'none'}")
        return
    kind = kinds[0]
    item = value[kind]
    items = item if kind in _LIST_KEYS and isinstance(item, list) else [item]
    for entry in items:
        if kind.startswith(("string", "version")):
            if not isinstance(entry, str):
                errors.append(f"{where}.{kind}: {entry!r} must be a string")
                continue
            if len(entry) > MAX_VALUE_LENGTH:
                errors.append(
                    f"{where}.{kind}: {len(entry)} characters, may not exceed {MAX_VALUE_LENGTH}"
                )
            if kind.startswith("version") and not is_semver(entry):
                errors.append(
                    f"{where}.{kind}: {entry!r} must be a string compatible with semver.org "
                    "spec 2.0.0"
                )
        elif kind.startswith("int") and (isinstance(entry, bool) or not isinstance(entry, int)):
            errors.append(f"{where}.{kind}: {entry!r} must be an integer")
        elif kind.startswith("bool") and not isinstance(entry, bool):
            errors.append(f"{where}.{kind}: {entry!r} must be a boolean")


def _counted(items: Any, limit: int, where: str, errors: list[str]) -> None:
    if items is not None and (not isinstance(items, list) or len(items) > limit):
        size = len(items) if isinstance(items, list) else "not a list"
        errors.append(f"{where}: must have at most {limit} items ({size})")


def _counter_sets(sets: Any, errors: list[str]) -> None:
    if not isinstance(sets, list):
        errors.append("spec.sharedCounters: must be a list")
        return
    if len(sets) > MAX_COUNTER_SETS:
        errors.append(f"spec.sharedCounters: must have at most {MAX_COUNTER_SETS} items")
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        path = f"spec.sharedCounters[{i}]"
        if not isinstance(counter_set, Mapping):
            errors.append(f"{path}: must be an object")
            continue
        name = counter_set.get("name")
        if not isinstance(name, str) or not is_dns_label(name):
            errors.append(f"{path}.name: {name!r} must be a DNS label")
        elif name in seen:
            errors.append(f"{path}.name: duplicate counter set {name!r}")
        else:
            seen.add(name)
        counters = counter_set.get("counters")
        if not isinstance(counters, Mapping) or not counters:
            errors.append(f"{path}.counters: required")
            continue
        if len(counters) > MAX_COUNTERS:
            errors.append(f"{path}.counters: must have at most {MAX_COUNTERS} items")
        errors.extend(
            f"{path}.counters[{key}]: must be a DNS label"
            for key in counters
            if not is_dns_label(key)
        )


# apimachinery's IsQualifiedName and IsValidLabelValue (label keys and values, taint and
# toleration keys and values).
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
MAX_LABEL_VALUE = 63


def label_key_error(key: str) -> str | None:
    """Why ``key`` is no label key (``[prefix/]name``), or None."""
    parts = key.split("/")
    if len(parts) > 2:
        return (
            "must be a name with an optional DNS subdomain prefix and '/' (e.g. example.com/name)"
        )
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            return "its prefix before '/' must not be empty"
        if not is_dns_subdomain(prefix):
            return f"its prefix {prefix!r} must be a DNS subdomain (lowercase, '-', '.')"
    if not name:
        return "its name must not be empty"
    if len(name) > MAX_LABEL_VALUE:
        return f"its name must be at most {MAX_LABEL_VALUE} characters, is {len(name)}"
    if _LABEL_NAME.fullmatch(name) is None:
        return (
            "its name must be letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit"
        )
    return None


def label_value_error(value: str) -> str | None:
    """Why ``value`` is no label value, or None (empty is one)."""
    if len(value) > MAX_LABEL_VALUE:
        return f"must be at most {MAX_LABEL_VALUE} characters, is {len(value)}"
    if value and _LABEL_NAME.fullmatch(value) is None:
        return (
            "must be empty or letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit"
        )
    return None
