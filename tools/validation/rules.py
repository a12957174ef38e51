"""The rules the OpenAPI schema does not carry, for DeviceClass and ResourceClaim specs.

Pure functions of the parsed object: each yields ``Finding``s with a Kubernetes field path.
Limits and messages follow ``pkg/apis/resource/validation`` (resource.k8s.io/v1). Every
accessor tolerates a wrong type, because the schema check reports those already.
"""

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.common.limits import (
    C_IDENTIFIER,
    MAX_DRIVER_NAME,
    MAX_ID,
    is_dns_label,
    is_dns_subdomain,
    label_key_error,
    label_value_error,
)
from drivers.computedomain import names as computedomain
from tools.validation import gates, hardware
from tools.validation.problems import Check, Finding, Severity

# pkg/apis/resource/types.go
MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_CONSTRAINTS = 32  # DeviceConstraintsMaxSize
MAX_CONFIGS = 32  # DeviceConfigMaxSize
# DeviceTolerationsMaxLength (16) is declared but not enforced (1.34, 1.36): not checked.
MAX_CEL_BYTES = 10 * 1024  # CELSelectorExpressionMaxLength
MAX_OPAQUE_PARAMETERS_BYTES = 10 * 1024  # OpaqueParametersMaxLength

_ALLOCATION_MODES = ("ExactCount", "All")
_USES_ALLOW_MULTIPLE = re.compile(r"\ballowMultipleAllocations\b")


# compile_selector stand-in for tests of the rules alone: returns an error message, a
# "not supported" message (as a warning), or None when the expression is fine.
SelectorCheck = Callable[[str], Finding | None]


SelectorLint = Callable[[str], list[Finding]]


def no_lint(_expression: str) -> list[Finding]:
    return []


@dataclass(frozen=True, slots=True)
class Published:
    """What a driver publishes, for names in constraints, capacity requests and configs."""

    driver: str
    attributes: Mapping[str, Mapping[str, str]]  # domain -> name -> kind
    capacities: frozenset[str]
    # DeviceClasses whose devices are this driver's (their unqualified names are its own).
    classes: frozenset[str]


@dataclass(frozen=True, slots=True)
class Context:
    version: gates.Version
    check_selector: SelectorCheck
    # DeviceClass names known: the chart's, the files', the cluster's; None: do not check.
    classes: frozenset[str] | None = None
    # Findings that compile cannot make: names and types against what drivers publish.
    lint_selector: SelectorLint = no_lint
    published: Published | None = None
    # DeviceClass name -> its selectors, for the check against every instance profile's
    # devices; None: not checked.
    class_selectors: Mapping[str, tuple[str, ...]] | None = None
    # Drivers whose devices some class of the chart, the files or the cluster selects (or
    # whose ResourceSlices they hold); None: not checked (a class selects any driver's).
    drivers: frozenset[str] | None = None
    # Namespace name -> its labels, of the Namespaces in the files and the cluster.
    namespaces: Mapping[str, Mapping[str, str]] | None = None
    # The namespace of the object being checked ("default" when none is written).
    namespace: str = "default"


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def is_driver_name(name: str) -> bool:
    """A driver name (and an attribute's domain): a DNS subdomain of at most 63 characters,
    compared without case (ValidateCSIDriverName lowercases it first)."""
    return is_dns_subdomain(name.lower(), MAX_DRIVER_NAME)


# From this version the API server takes a distinctAttribute's domain as written, lowercase only.
STRICT_DISTINCT_DOMAIN = (1, 37)
# From this version (seen on 1.38.0-beta.0) the API server refuses a qualified name with two
# slashes (constraints, capacity requests) and a negative capacity request, which 1.37 took.
STRICT_QUALIFIED_NAMES = (1, 38)


def _fully_qualified_name(
    name: str, *, any_case: bool = True, one_slash: bool = False
) -> str | None:
    """Why ``name`` is no fully qualified attribute name (``<domain>/<id>``), or None.

    As validateFullyQualifiedName, which lets a name with two slashes pass (the API server
    accepts it): no attribute has one, which the caller reports as a name that matches
    nothing. ``any_case=False``: the domain as written must be lowercase (1.37's check of
    distinctAttribute, seen refusing 'GPU.nvidia.com/uuid' that 1.36 took)."""
    parts = name.split("/")
    if len(parts) == 1:
        return "must be a fully qualified name: <domain>/<name>, e.g. gpu.nvidia.com/nvlinkDomain"
    if len(parts) > 2:
        return "must not contain more than one slash" if one_slash else None
    domain, ident = parts
    if not domain:
        return "the domain before '/' must not be empty"
    if not is_driver_name(domain):
        return f"domain {domain!r} must be a DNS subdomain of at most {MAX_DRIVER_NAME} characters"
    if not any_case and domain != domain.lower():
        return f"domain {domain!r} must be lowercase: write {domain.lower()!r}"
    if not ident:
        return "the name after '/' must not be empty"
    if not C_IDENTIFIER.fullmatch(ident) or len(ident) > MAX_ID:
        return (
            f"name {ident!r} must be a C identifier (letters, digits, '_') of at most "
            f"{MAX_ID} characters, is {len(ident)}"
        )
    return None


def _too_many(path: str, items: list[Any], limit: int) -> Iterator[Finding]:
    if len(items) > limit:
        yield Finding(path, f"must have at most {limit} items, has {len(items)}")


def _gated(path: str, gate: gates.Gate, ctx: Context, written: str) -> Iterator[Finding]:
    """``written``: what the user wrote there, as the message shows it."""
    if gate.off_by_default(ctx.version):
        yield Finding(path, f"{written}: {gates.warning(gate, ctx.version)}", Severity.WARNING)


def _selectors(path: str, selectors: list[Any], ctx: Context) -> Iterator[Finding]:
    yield from _too_many(path, selectors, MAX_SELECTORS)
    for i, selector in enumerate(selectors):
        expr_path = f"{path}[{i}].cel.expression"
        if _map(selector).get("cel") is None:
            yield Finding(f"{path}[{i}].cel", "required: the only kind of selector")
            continue
        expression = _str(_map(_map(selector).get("cel")).get("expression"))
        if expression is None:
            continue  # the schema reports a missing or mistyped expression
        size = len(expression.encode())
        if size > MAX_CEL_BYTES:
            yield Finding(expr_path, f"must be at most {MAX_CEL_BYTES} bytes, is {size}")
            continue
        finding = ctx.check_selector(expression)
        if finding is not None:
            yield Finding(expr_path, finding.message, finding.severity)
        for lint in ctx.lint_selector(expression):
            yield Finding(expr_path, lint.message, lint.severity, lint.check)
        if _USES_ALLOW_MULTIPLE.search(expression):
            yield from _gated(
                expr_path, gates.DRA_CONSUMABLE_CAPACITY, ctx, "device.allowMultipleAllocations"
            )


def _gpu_config(path: str, parameters: Any) -> Iterator[Finding]:
    """The opaque config through the very models (and steps) the kubelet plugin uses."""
    from api.config import ConfigError, parse_gpu_config

    try:
        parse_gpu_config(parameters, source="GpuConfig")
    except ConfigError as exc:
        yield Finding(
            path, f"the plugin would reject it: {exc}{_field_hint(str(exc))}", check=Check.PLUGIN
        )


_EXTRA_FIELD = re.compile(r'field "(?:[^"]*\.)?([^".]+)": unknown field')


def _field_hint(message: str) -> str:
    """``did you mean sharing?`` for each unknown field of a GpuConfig that is close to one."""
    from pydantic import BaseModel

    from api import config
    from tools.cel import suggest

    models = [m for m in vars(config).values() if isinstance(m, type) and issubclass(m, BaseModel)]
    names = {f.alias or n for m in models for n, f in m.model_fields.items()}
    hints = []
    for match in _EXTRA_FIELD.finditer(message):
        near = suggest(match[1], names)
        if near:
            hints.append(f"; did you mean {near}?")
    return "".join(hints)


def _opaque_configs(path: str, configs: list[Any], ctx: Context) -> Iterator[Finding]:
    yield from _too_many(path, configs, MAX_CONFIGS)
    for i, config in enumerate(configs):
        opaque = _map(config).get("opaque")
        if opaque is None:
            yield Finding(f"{path}[{i}].opaque", "required: the only kind of configuration")
            continue
        if not isinstance(opaque, Mapping):
            continue
        driver = _str(opaque.get("driver"))
        if driver is None or not driver:
            yield Finding(f"{path}[{i}].opaque.driver", "required: the driver the config is for")
        elif not is_driver_name(driver):
            yield Finding(
                f"{path}[{i}].opaque.driver",
                f"{driver!r} must be a DNS subdomain of at most {MAX_DRIVER_NAME} characters"
                + (f", is {len(driver)}" if len(driver) > MAX_DRIVER_NAME else ""),
            )
        elif (
            ctx.drivers is not None
            and driver not in ctx.drivers
            # A GpuConfig for another driver: judged with its requests (the plugin's rule).
            and not _looks_ours(opaque.get("parameters"), driver, ctx)
        ):
            yield _unknown_driver(f"{path}[{i}].opaque.driver", driver, ctx.drivers)
        if opaque.get("parameters") is None:
            yield Finding(f"{path}[{i}].opaque.parameters", "required: the driver's config")
        else:
            size = len(json.dumps(opaque["parameters"], separators=(",", ":")).encode())
            if size > MAX_OPAQUE_PARAMETERS_BYTES:
                yield Finding(
                    f"{path}[{i}].opaque.parameters",
                    f"must be at most {MAX_OPAQUE_PARAMETERS_BYTES} bytes as JSON, is {size}",
                )
                continue
        if ctx.published is not None and driver == ctx.published.driver:
            yield from _gpu_config(f"{path}[{i}].opaque.parameters", opaque.get("parameters"))
        if driver == computedomain.DRIVER_NAME and opaque.get("parameters") is not None:
            yield from _compute_domain_config(
                f"{path}[{i}].opaque.parameters", opaque["parameters"]
            )


def _looks_ours(parameters: Any, driver: str, ctx: Context) -> bool:
    from api.config import GPU_CONFIG_KIND, misaddressed

    published = ctx.published
    return (
        published is not None
        and ctx.class_selectors is not None
        and misaddressed(parameters, driver, published.driver, (GPU_CONFIG_KIND,)) is not None
    )


def _unknown_driver(path: str, driver: str, known: frozenset[str]) -> Finding:
    from tools.cel import suggest

    near = suggest(driver, set(known))
    return Finding(
        path,
        f"{driver!r}: no DeviceClass of the chart, the files given or the cluster selects "
        f"devices of this driver (known: {', '.join(sorted(known))}), so the config applies "
        "to nothing" + (f"; did you mean {near}?" if near else "") + " (--defined-elsewhere "
        "if it is)",
        check=Check.REFERENCE,
    )


def _requests_by_name(devices: Mapping[str, Any]) -> dict[str, tuple[str, list[str], str]]:
    """Each request and ``request/subrequest``: (its class, its selectors, the path of its
    deviceClassName)."""
    out: dict[str, tuple[str, list[str], str]] = {}
    for i, raw in enumerate(_list(devices.get("requests"))):
        request = _map(raw)
        name = _str(request.get("name"))
        if name is None:
            continue
        alternatives = [(name, _map(request.get("exactly")), f"requests[{i}].exactly")]
        for j, sub in enumerate(_list(request.get("firstAvailable"))):
            subname = _str(_map(sub).get("name"))
            if subname is not None:
                alternatives.append(
                    (f"{name}/{subname}", _map(sub), f"requests[{i}].firstAvailable[{j}]")
                )
        for target, fields, where in alternatives:
            class_name = _str(fields.get("deviceClassName"))
            if class_name is not None:
                selectors = hardware.expressions(fields.get("selectors"))
                out[target] = (class_name, selectors, where)
    return out


def _gpu_configs_on_device_types(
    path: str, devices: Mapping[str, Any], ctx: Context
) -> Iterator[Finding]:
    """The claim's GpuConfigs as the plugin plans them: one for another driver on requests of
    this one (api.config.misaddressed), two that conflict on a request (api.config.choose),
    and the one a request gets against the device types its class and selectors select
    among every profile's devices (api.config.refused_on)."""
    from api.config import (
        GPU_CONFIG_KIND,
        AppliedConfig,
        ConfigError,
        choose,
        decode_gpu_config,
        misaddressed,
    )

    kinds = (GPU_CONFIG_KIND,)
    entries: list[AppliedConfig] = []

    known = ctx.class_selectors
    if known is None or ctx.published is None:
        return
    requests = _requests_by_name(devices)
    driver = ctx.published.driver
    for i, raw in enumerate(_list(devices.get("config"))):
        opaque = _map(_map(raw).get("opaque"))
        refs = [r for r in _list(_map(raw).get("requests")) if isinstance(r, str)]
        why = misaddressed(opaque.get("parameters"), opaque.get("driver"), driver, kinds)
        if why is not None:
            ours = [
                t
                for t, (class_name, selectors, _) in requests.items()
                if (not refs or t in refs or t.partition("/")[0] in refs)
                and hardware.ours([*known.get(class_name, ()), *selectors])
            ]
            if ours:
                yield Finding(
                    f"{path}.config[{i}].opaque.driver",
                    f"the plugin would reject it at prepare on request {ours[0]!r}: {why}",
                    check=Check.PLUGIN,
                )
            elif ctx.drivers is not None and _str(opaque.get("driver")) not in ctx.drivers:
                yield _unknown_driver(
                    f"{path}.config[{i}].opaque.driver", str(opaque.get("driver")), ctx.drivers
                )
            continue
        if opaque.get("driver") != driver or opaque.get("parameters") is None:
            continue
        try:
            config = decode_gpu_config(opaque["parameters"], source="")
        except ConfigError:
            continue  # refused for its shape already
        entries.append(AppliedConfig(tuple(refs), f"config[{i}]", config, "claim"))
    # Per request of this driver, the config the plugin picks (api.config.choose), judged
    # against the device types the request's class and selectors select.
    refused: set[str] = set()
    for target, (class_name, selectors, _) in requests.items():
        if class_name not in known or not hardware.ours([*known[class_name], *selectors]):
            continue
        try:
            chosen = choose(target, entries)
        except ConfigError as exc:
            # The entry that met an earlier one: the shortest prefix of them that is refused.
            later = next(
                e.source for k, e in enumerate(entries) if _conflicts(target, entries[: k + 1])
            )
            if later not in refused:
                refused.add(later)
                yield Finding(
                    f"{path}.{later}",
                    f"the plugin would reject the claim at prepare: {exc}",
                    check=Check.PLUGIN,
                )
            continue
        if chosen is None:
            continue
        finding = _on_types(
            f"{path}.{chosen.source}.opaque.parameters",
            chosen.config.sharing_settings(),
            hardware.device_types(known[class_name], selectors),
            f"request {target!r}, whose class {class_name} and selectors select",
        )
        if finding is not None:
            yield finding


def _conflicts(request: str, configs: Sequence[Any]) -> bool:
    from api.config import ConfigError, choose

    try:
        choose(request, configs)
    except ConfigError:
        return True
    return False


def _on_types(
    path: str, settings: tuple[tuple[str, str], ...], types: frozenset[str], subject: str
) -> Finding | None:
    """A config with ``settings`` on devices of ``types``: refused where the plugin refuses
    it on each of them (an error), or on some of them (a warning)."""
    from api.config import refused_on

    reasons = {t: why for t in sorted(types) if (why := refused_on(t, settings)) is not None}
    if not reasons:
        return None
    only = set(reasons) == set(types)
    kinds = ", ".join(t.upper() for t in reasons)
    return Finding(
        path,
        f"the plugin would reject it at prepare on {subject} "
        + (
            f"only {kinds} devices"
            if only
            else f"{kinds} devices among others (refused if it gets one)"
        )
        + f": {next(iter(reasons.values()))}",
        Severity.ERROR if only else Severity.WARNING,
        Check.PLUGIN,
    )


def _class_gpu_configs(path: str, spec: Mapping[str, Any], ctx: Context) -> Iterator[Finding]:
    """A class's GpuConfigs against the device types its selectors select: every request of
    the class gets them."""
    from api.config import ConfigError, decode_gpu_config

    if ctx.published is None or ctx.class_selectors is None:
        return
    types = hardware.device_types(hardware.expressions(spec.get("selectors")), [])
    for i, raw in enumerate(_list(spec.get("config"))):
        opaque = _map(_map(raw).get("opaque"))
        if opaque.get("driver") != ctx.published.driver or opaque.get("parameters") is None:
            continue
        try:
            settings = decode_gpu_config(opaque["parameters"], source="").sharing_settings()
        except ConfigError:
            continue  # refused for its shape already
        finding = _on_types(
            f"{path}.config[{i}].opaque.parameters",
            settings,
            types,
            "every request of this class, whose selectors select",
        )
        if finding is not None:
            yield finding


def _compute_domain_config(path: str, parameters: Any) -> Iterator[Finding]:
    """A ComputeDomainChannelConfig or ComputeDomainDaemonConfig through the node driver's
    own decoder and validation."""
    from api.computedomain import KINDS, parse_compute_domain_config
    from api.config import ConfigError

    kind = _map(parameters).get("kind")
    try:
        parse_compute_domain_config(parameters, source=kind if kind in KINDS else "parameters")
    except ConfigError as exc:
        yield Finding(
            path,
            f"the {computedomain.DRIVER_NAME} node driver would reject it at prepare: {exc}",
            check=Check.PLUGIN,
        )


# The chart's ComputeDomain classes (they carry no config) -> the config kind their device takes.
_COMPUTE_DOMAIN_CLASSES = {
    computedomain.DAEMON_CLASS: computedomain.DAEMON_CONFIG_KIND,
    computedomain.DEFAULT_CHANNEL_CLASS: computedomain.CHANNEL_CONFIG_KIND,
}


def _compute_domain_requests(path: str, devices: Mapping[str, Any]) -> Iterator[Finding]:
    """Requests of a ComputeDomain class against the configs that apply to them: the node
    driver takes only its own kind on each device, and a device with none has no domain."""
    wanted: dict[str, tuple[str, str]] = {}  # request (or request/sub) -> (its path, kind)
    for i, raw in enumerate(_list(devices.get("requests"))):
        request = _map(raw)
        name = _str(request.get("name"))
        if name is None:
            continue
        exactly = _map(request.get("exactly"))
        kind = _COMPUTE_DOMAIN_CLASSES.get(_str(exactly.get("deviceClassName")) or "")
        if kind is not None:
            wanted[name] = (f"{path}.requests[{i}].exactly.deviceClassName", kind)
        for j, sub in enumerate(_list(request.get("firstAvailable"))):
            kind = _COMPUTE_DOMAIN_CLASSES.get(_str(_map(sub).get("deviceClassName")) or "")
            subname = _str(_map(sub).get("name"))
            if kind is not None and subname is not None:
                wanted[f"{name}/{subname}"] = (
                    f"{path}.requests[{i}].firstAvailable[{j}].deviceClassName",
                    kind,
                )
    if not wanted:
        return
    configured: set[str] = set()
    for i, raw in enumerate(_list(devices.get("config"))):
        opaque = _map(_map(raw).get("opaque"))
        if opaque.get("driver") != computedomain.DRIVER_NAME:
            continue
        kind = _map(opaque.get("parameters")).get("kind")
        refs = [r for r in _list(_map(raw).get("requests")) if isinstance(r, str)]
        # No requests: the config applies to every request; a request name covers its subs.
        targets = [t for t in wanted if not refs or t in refs or t.partition("/")[0] in refs]
        for target in targets:
            configured.add(target)
            expected = wanted[target][1]
            if isinstance(kind, str) and kind in _COMPUTE_DOMAIN_KINDS and kind != expected:
                yield Finding(
                    f"{path}.config[{i}].opaque.parameters.kind",
                    f"cannot apply {kind} to request: {target} (the node driver's error at "
                    f"prepare): a device of class "
                    f"{_class_of(expected)} takes a {expected}",
                    check=Check.PLUGIN,
                )
    for target, (where, kind) in wanted.items():
        if target not in configured:
            yield Finding(
                where,
                f"{_class_of(kind)!r}: no {kind} applies to request {target!r}, so the node "
                "driver refuses it at "
                'prepare ("domainID cannot be empty"): a workload names the '
                "ResourceClaimTemplate its ComputeDomain creates "
                "(spec.channel.resourceClaimTemplate.name) instead of a claim of its own",
                check=Check.PLUGIN,
            )


_COMPUTE_DOMAIN_KINDS = frozenset(_COMPUTE_DOMAIN_CLASSES.values())


def _class_of(kind: str) -> str:
    return next(c for c, k in _COMPUTE_DOMAIN_CLASSES.items() if k == kind)


def check_metadata(metadata: Any, kind: str) -> Iterator[Finding]:
    """Every object's name (required, a DNS subdomain; a Job's at most 63 characters, as
    it becomes a label of its pods) and labels."""
    meta = _map(metadata)
    name = _str(meta.get("name"))
    if not name and not meta.get("generateName"):
        yield Finding("metadata.name", "required (or metadata.generateName)")
    elif name and not is_dns_subdomain(name):
        yield Finding(
            "metadata.name",
            f"{name!r} must be a DNS subdomain: lowercase letters, digits, '-' and '.', at "
            f"most 253 characters" + (f", is {len(name)}" if len(name) > 253 else ""),
        )
    elif name and kind == "Job" and len(name) > MAX_JOB_NAME:
        yield Finding(
            "metadata.name",
            f"{name!r}: a Job's name becomes its pods' label batch.kubernetes.io/job-name: "
            f"at most {MAX_JOB_NAME} characters, is {len(name)}",
        )
    for key, value in _map(meta.get("labels")).items():
        if (why := label_key_error(str(key))) is not None:
            yield Finding("metadata.labels", f"label key {key!r}: {why}")
        elif isinstance(value, str) and (why := label_value_error(value)) is not None:
            yield Finding(f"metadata.labels.{key}", f"label value {value!r}: {why}")


MAX_JOB_NAME = 63


def check_device_class_spec(spec: Any, path: str, ctx: Context) -> Iterator[Finding]:
    spec = _map(spec)
    selectors = list(_selectors(f"{path}.selectors", _list(spec.get("selectors")), ctx))
    yield from selectors
    yield from _opaque_configs(f"{path}.config", _list(spec.get("config")), ctx)
    yield from _class_gpu_configs(path, spec, ctx)
    refused = any(f.severity is Severity.ERROR for f in selectors)
    if ctx.class_selectors is not None and not refused:
        unsatisfiable = hardware.check_class(path, spec.get("selectors"))
        if unsatisfiable is not None:
            yield unsatisfiable
    name = _str(spec.get("extendedResourceName"))
    if name is not None:
        erp = f"{path}.extendedResourceName"
        # An extended resource name is domain-qualified, outside kubernetes.io and not a
        # quota name (IsExtendedResourceName in pkg/apis/core/v1/helper).
        if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
            yield Finding(
                erp,
                f"{name!r} must be an extended resource name: <domain>/<name> outside "
                "kubernetes.io, e.g. nvidia.com/gpu",
            )
        yield from _gated(erp, gates.DRA_EXTENDED_RESOURCE, ctx, repr(name))


def _request_fields(
    path: str, request: Mapping[str, Any], ctx: Context, *, alternative: bool = False
) -> Iterator[Finding]:
    """The fields ``exactly`` and a ``firstAvailable`` subrequest (an alternative) share."""
    class_name = _str(request.get("deviceClassName"))
    if not class_name:
        yield Finding(f"{path}.deviceClassName", "required: the DeviceClass to allocate from")
    else:
        if not is_dns_subdomain(class_name):
            yield Finding(
                f"{path}.deviceClassName",
                f"{class_name!r} must be a DNS subdomain: lowercase letters, digits, '-' and "
                "'.', at most 253 characters"
                + (f", is {len(class_name)}" if len(class_name) > 253 else ""),
            )
        elif ctx.classes is not None and class_name not in ctx.classes:
            from tools.cel import suggest

            near = suggest(class_name, set(ctx.classes))
            yield Finding(
                f"{path}.deviceClassName",
                f"no DeviceClass {class_name!r} in the chart, the files given or the cluster "
                f"(known: {', '.join(sorted(ctx.classes))}): the claim would stay pending"
                + (f"; did you mean {near}?" if near else "")
                + " (--defined-elsewhere if it is)",
                check=Check.REFERENCE,
            )
    selectors = list(_selectors(f"{path}.selectors", _list(request.get("selectors")), ctx))
    yield from selectors
    known = ctx.class_selectors
    # A selector already refused (it does not compile, or fails on every device by its
    # names alone) gets no second line from the devices.
    refused = any(f.severity is Severity.ERROR for f in selectors)
    if known is not None and class_name is not None and class_name in known and not refused:
        unsatisfiable = hardware.check_request(
            path, class_name, known[class_name], request, alternative=alternative
        )
        if unsatisfiable is not None:
            yield unsatisfiable
    mode = _str(request.get("allocationMode")) or "ExactCount"
    # 0 is no count: the field is omitted when empty, and the server defaults it.
    count = request.get("count") or 0
    if mode not in _ALLOCATION_MODES:
        yield Finding(
            f"{path}.allocationMode", f"{mode!r} must be one of {', '.join(_ALLOCATION_MODES)}"
        )
    elif mode == "All" and isinstance(count, int) and count:
        yield Finding(f"{path}.count", f"{count} must not be set when allocationMode is All")
    elif mode == "ExactCount" and isinstance(count, int) and count < 0:
        yield Finding(f"{path}.count", f"{count} is out of range: must be at least 1")
    if request.get("adminAccess") is True:
        yield from _admin_access(f"{path}.adminAccess", ctx)
    tolerations = _list(request.get("tolerations"))
    if tolerations:
        yield from _gated(
            f"{path}.tolerations", gates.DRA_DEVICE_TAINTS, ctx, f"{len(tolerations)} toleration(s)"
        )
        for i, toleration in enumerate(tolerations):
            yield from _toleration(f"{path}.tolerations[{i}]", _map(toleration), ctx)
    capacity = _map(request.get("capacity"))
    if capacity.get("requests"):
        asked = ", ".join(f"{k}: {v}" for k, v in _map(capacity.get("requests")).items())
        yield from _gated(
            f"{path}.capacity.requests", gates.DRA_CONSUMABLE_CAPACITY, ctx, f"{{{asked}}}"
        )
        yield from _capacity_requests(
            f"{path}.capacity.requests", _map(capacity.get("requests")), class_name, ctx
        )


ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"


def _admin_access(path: str, ctx: Context) -> Iterator[Finding]:
    """adminAccess against the claim's Namespace where the files or the cluster have it."""
    labels = (ctx.namespaces or {}).get(ctx.namespace)
    if labels is None:
        yield Finding(
            path,
            f"true: allowed only in a namespace with the label {ADMIN_ACCESS_LABEL}: "
            f'"true" (the API server refuses it elsewhere; namespace {ctx.namespace!r} is not '
            "in the files given or the cluster)",
            Severity.WARNING,
        )
    elif labels.get(ADMIN_ACCESS_LABEL) != "true":
        value = labels.get(ADMIN_ACCESS_LABEL)
        yield Finding(
            path,
            f"true: namespace {ctx.namespace!r} has "
            + (
                f"{ADMIN_ACCESS_LABEL}: {value!r}"
                if value is not None
                else f"no label {ADMIN_ACCESS_LABEL}"
            )
            + f', and the API server allows admin access only with {ADMIN_ACCESS_LABEL}: "true"',
        )


_OPERATORS = ("Equal", "Exists")


def _effects(version: gates.Version) -> tuple[str, ...]:
    # DeviceTaintEffectNone is new in 1.35.
    return (
        ("NoExecute", "NoSchedule", "None") if version >= (1, 35) else ("NoExecute", "NoSchedule")
    )


def _toleration(path: str, toleration: Mapping[str, Any], ctx: Context) -> Iterator[Finding]:
    """validateDeviceToleration."""
    key = _str(toleration.get("key")) or ""
    value = _str(toleration.get("value")) or ""
    if key and (why := label_key_error(key)) is not None:
        yield Finding(f"{path}.key", f"{key!r} is no taint key: {why}")
    # An unset operator is defaulted to Equal before validation.
    operator = _str(toleration.get("operator")) or "Equal"
    if operator not in _OPERATORS:
        yield Finding(f"{path}.operator", f"{operator!r} must be one of {', '.join(_OPERATORS)}")
    elif operator == "Exists" and value:
        yield Finding(f"{path}.value", f"{value!r} must be empty for operator Exists")
    elif operator == "Equal" and (why := label_value_error(value)) is not None:
        yield Finding(f"{path}.value", f"{value!r}: {why}")
    effect = _str(toleration.get("effect")) or ""
    effects = _effects(ctx.version)
    if effect and effect not in effects:
        yield Finding(
            f"{path}.effect",
            f"{effect!r} must be one of {', '.join(effects)} (or unset: every effect)",
        )


def check_taint_rule(doc: Mapping[str, Any], ctx: Context) -> Iterator[Finding]:
    """A DeviceTaintRule (an admin's drain of a device or a pool): served from which version,
    its gate, and its taint's effect."""
    api_version = _str(doc.get("apiVersion")) or ""
    first = gates.TAINT_RULE_VERSIONS.get(api_version)
    if first is None or ctx.version < first:
        served = [v for v, since in gates.TAINT_RULE_VERSIONS.items() if since <= ctx.version]
        yield Finding(
            "apiVersion",
            f"{api_version!r} serves no DeviceTaintRule in Kubernetes "
            f"{ctx.version[0]}.{ctx.version[1]}: write {served[-1]}",
        )
        return
    yield from _gated("spec", gates.DRA_DEVICE_TAINT_RULES, ctx, "a DeviceTaintRule")
    taint = _map(_map(doc.get("spec")).get("taint"))
    effect = _str(taint.get("effect")) or ""
    effects = _effects(ctx.version)
    if effect not in effects:
        yield Finding("spec.taint.effect", f"{effect!r} must be one of {', '.join(effects)}")


def _capacity_requests(
    path: str, requests: Mapping[str, Any], class_name: str | None, ctx: Context
) -> Iterator[Finding]:
    from driver.common.quantity import Quantity
    from tools.cel import suggest

    published = ctx.published
    strict = ctx.version >= STRICT_QUALIFIED_NAMES
    for name, value in requests.items():
        if strict and str(name).count("/") > 1:
            yield Finding(f"{path}.{name}", f"{name!r}: must not contain more than one slash")
        if isinstance(value, str):
            negative = False
            try:
                negative = Quantity.parse(value).value < 0
            except ValueError:
                yield Finding(
                    f"{path}.{name}",
                    f"{value!r} is not a quantity (e.g. 40Gi, 512Mi); the API server rejects it",
                )
            if strict and negative:
                yield Finding(f"{path}.{name}", f"{value!r}: must be greater than or equal to 0")
        if published is None:
            continue
        domain, slash, ident = str(name).rpartition("/")
        ours = domain == published.driver or (not slash and class_name in published.classes)
        if ours and ident == "memory" and isinstance(value, str):
            yield from _off_step(f"{path}.{name}", value)
        if ours and ident not in published.capacities:
            near = suggest(ident, published.capacities)
            yield Finding(
                f"{path}.{name}",
                f"{published.driver} publishes no capacity {ident!r} (it has: "
                f"{', '.join(sorted(published.capacities))})"
                + (f"; did you mean {near}?" if near else ""),
                check=Check.DEVICES,
            )


def _off_step(path: str, value: str) -> Iterator[Finding]:
    """A memory request the request policy of shared GPUs rounds up (consumable capacity)."""
    from driver.common.quantity import Quantity
    from drivers.gpu.model.published import MEMORY_MIN as MIN
    from drivers.gpu.model.published import MEMORY_STEP as STEP

    try:
        amount = Quantity.parse(value).value
    except ValueError:
        return
    rounded = MIN if amount <= MIN else MIN + -((MIN - amount) // STEP) * STEP
    if rounded != amount:
        yield Finding(
            path,
            f"{value} is not a whole number of GiB: a shared GPU (--consumable-capacity) "
            f"takes memory in steps of 1Gi, so this request consumes {rounded // STEP}Gi",
            Severity.WARNING,
        )


def _published_attribute(path: str, name: str, ctx: Context) -> Iterator[Finding]:
    """A constraint's attribute must be one the driver publishes, to match anything."""
    from tools.cel import suggest

    published = ctx.published
    if published is None:
        return
    domain, _, ident = name.partition("/")
    names = published.attributes.get(domain)
    if names is None:
        near = suggest(domain, set(published.attributes))
        if near is not None:
            yield Finding(
                path,
                f"{name!r}: no driver publishes domain {domain!r}; did you mean {near}?",
                check=Check.DEVICES,
            )
        return
    if ident not in names:
        near = suggest(ident, set(names))
        yield Finding(
            path,
            f"{name!r}: {domain} publishes no attribute {ident!r}, so the constraint can never "
            "be met"
            + (
                f"; did you mean {domain}/{near}?"
                if near
                else f" (it has: {', '.join(sorted(names))})"
            ),
            check=Check.DEVICES,
        )


def _requests(
    path: str, requests: list[Any], ctx: Context
) -> tuple[list[Finding], dict[str, set[str]]]:
    """Findings, and each request name with its subrequest names (empty for ``exactly``)."""
    findings = list(_too_many(path, requests, MAX_REQUESTS))
    names: dict[str, set[str]] = {}
    for i, raw in enumerate(requests):
        request = _map(raw)
        rpath = f"{path}[{i}]"
        name = _str(request.get("name"))
        if name is not None:
            if not is_dns_label(name):
                findings.append(Finding(f"{rpath}.name", f"{name!r} must be a DNS label"))
            elif name in names:
                findings.append(
                    Finding(f"{rpath}.name", f"duplicate request name {name!r}: must be unique")
                )
        # An empty firstAvailable counts as unset, as in the API server.
        has_exactly = request.get("exactly") is not None
        has_first = bool(_list(request.get("firstAvailable")))
        if has_exactly == has_first:
            findings.append(Finding(rpath, "exactly one of exactly and firstAvailable must be set"))
        subnames: set[str] = set()
        if has_exactly and not has_first:
            findings += _request_fields(f"{rpath}.exactly", _map(request.get("exactly")), ctx)
        if has_first and not has_exactly:
            fpath = f"{rpath}.firstAvailable"
            subrequests = _list(request.get("firstAvailable"))
            findings += _too_many(fpath, subrequests, MAX_SUBREQUESTS)
            never = 0
            for j, raw_sub in enumerate(subrequests):
                sub = _map(raw_sub)
                spath = f"{fpath}[{j}]"
                subname = _str(sub.get("name"))
                if subname is not None:
                    if not is_dns_label(subname):
                        findings.append(
                            Finding(f"{spath}.name", f"{subname!r} must be a DNS label")
                        )
                    elif subname in subnames:
                        findings.append(
                            Finding(
                                f"{spath}.name",
                                f"duplicate subrequest name {subname!r}: must be unique",
                            )
                        )
                    subnames.add(subname)
                found = list(_request_fields(spath, sub, ctx, alternative=True))
                never += any(f.check is Check.HARDWARE for f in found)
                findings += found
            if subrequests and never == len(subrequests):
                findings.append(
                    Finding(
                        fpath,
                        f"none of the {len(subrequests)} alternatives can be met on the EKS "
                        "instance types validate knows (each is named above): the claim "
                        "stays pending (--defined-elsewhere if your nodes have other hardware)",
                        check=Check.HARDWARE,
                    )
                )
        if name is not None and name not in names:
            names[name] = subnames
    return findings, names


def _references(path: str, refs: list[Any], names: Mapping[str, set[str]]) -> Iterator[Finding]:
    """Each entry of a constraint's or config's ``requests`` must name a request or subrequest."""
    seen: set[str] = set()
    for i, ref in enumerate(refs):
        if ref is None:
            ref = ""  # JSON null decodes as the empty string
        if not isinstance(ref, str):
            continue
        if ref in seen:
            yield Finding(f"{path}[{i}]", f"duplicate entry {ref!r}: each must be listed once")
            continue
        seen.add(ref)
        base, slash, sub = ref.partition("/")
        if ref.count("/") > 1 or not all(is_dns_label(part) for part in ref.split("/")):
            yield Finding(
                f"{path}[{i}]",
                f"{ref!r} must be a request name or <request>/<subrequest>, each a DNS label",
            )
        elif base not in names:
            known = ", ".join(sorted(names)) or "none"
            yield Finding(
                f"{path}[{i}]",
                f"{ref!r}: no request named {base!r}; must name one of the claim's requests "
                f"({known})",
            )
        elif slash and sub not in names[base]:
            subs = ", ".join(f"{base}/{s}" for s in sorted(names[base]))
            yield Finding(
                f"{path}[{i}]",
                f"{ref!r}: request {base!r} has no subrequest {sub!r}; must be "
                + (f"one of {base}, {subs}" if subs else f"{base!r} (it has no firstAvailable)"),
            )


def check_claim_spec(spec: Any, path: str, ctx: Context) -> Iterator[Finding]:
    devices = _map(_map(spec).get("devices"))
    dpath = f"{path}.devices"
    findings, names = _requests(f"{dpath}.requests", _list(devices.get("requests")), ctx)
    yield from findings
    constraints = _list(devices.get("constraints"))
    yield from _too_many(f"{dpath}.constraints", constraints, MAX_CONSTRAINTS)
    for i, raw in enumerate(constraints):
        constraint = _map(raw)
        cpath = f"{dpath}.constraints[{i}]"
        yield from _references(f"{cpath}.requests", _list(constraint.get("requests")), names)
        match = _str(constraint.get("matchAttribute"))
        distinct = _str(constraint.get("distinctAttribute"))
        if match is None and distinct is None:
            yield Finding(cpath, "one of matchAttribute and distinctAttribute must be set")
        elif match is not None and distinct is not None:
            # The server takes matchAttribute and never looks at distinctAttribute.
            yield Finding(
                f"{cpath}.distinctAttribute",
                f"{distinct!r} is ignored: matchAttribute is set too, and the API server keeps "
                "only that one (set one of them)",
                Severity.WARNING,
            )
        checked = (
            ("matchAttribute", match) if match is not None else ("distinctAttribute", distinct)
        )
        for key, value in (checked,):
            any_case = key == "matchAttribute" or ctx.version < STRICT_DISTINCT_DOMAIN
            strict = ctx.version >= STRICT_QUALIFIED_NAMES
            why = value and _fully_qualified_name(value, any_case=any_case, one_slash=strict)
            if value is not None and why:
                yield Finding(f"{cpath}.{key}", f"{value!r}: {why}")
            elif value is not None:
                yield from _published_attribute(f"{cpath}.{key}", value, ctx)
        if distinct is not None and match is None:
            yield from _gated(
                f"{cpath}.distinctAttribute", gates.DRA_CONSUMABLE_CAPACITY, ctx, repr(distinct)
            )
    configs = _list(devices.get("config"))
    yield from _opaque_configs(f"{dpath}.config", configs, ctx)
    yield from _gpu_configs_on_device_types(dpath, devices, ctx)
    yield from _compute_domain_requests(dpath, devices)
    for i, raw in enumerate(configs):
        refs = _list(_map(raw).get("requests"))
        yield from _references(f"{dpath}.config[{i}].requests", refs, names)
