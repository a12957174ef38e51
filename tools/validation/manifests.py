"""``gpu-dra validate``'s core: multi-document YAML in, one ``Problem`` per finding out.

Pure: it takes file names with their text and never touches the file system, so the command
reads the files and everything here is a function of data.
"""

import dataclasses
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import kubernetes_validate
import referencing
import yaml
from kubernetes_validate import utils as kv_utils

from driver import DEFAULT_DRIVER_NAME
from drivers.computedomain import names as computedomain
from drivers.gpu.model.published import (
    DRIVER_ATTRIBUTES,
    DRIVER_CAPACITIES,
    OPTIONAL_ATTRIBUTES,
    STANDARD_ATTRIBUTES,
    STANDARD_DOMAIN,
)
from tools import userfiles
from tools.cel import (
    CelCompileError,
    CelUnsupportedError,
    Schema,
    compile_selector,
    lint_selector,
    suggest,
)
from tools.validation import computedomains, gates, hardware, rules, workloads
from tools.validation.problems import Check, Finding, Problem, Severity

# What this driver publishes (drivers/gpu/model/published.py), the one source for names and types.
PUBLISHED = rules.Published(
    driver=DEFAULT_DRIVER_NAME,
    attributes={DEFAULT_DRIVER_NAME: DRIVER_ATTRIBUTES, STANDARD_DOMAIN: STANDARD_ATTRIBUTES},
    capacities=DRIVER_CAPACITIES,
    classes=frozenset({DEFAULT_DRIVER_NAME}),
)

# The DeviceClasses the chart installs (every switch on): known to exist without a file
# (tests/test_validate_server_rules.py holds this equal to the chart's render).
CHART_CLASSES = frozenset(
    {
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "shared.gpu.nvidia.com",
        computedomain.DAEMON_CLASS,
        computedomain.DEFAULT_CHANNEL_CLASS,
    }
)

_GPU = f'device.driver == "{DEFAULT_DRIVER_NAME}" && device.attributes["{DEFAULT_DRIVER_NAME}"]'
# Their selectors (tests/test_validate_profiles.py holds these equal to the chart's render).
CHART_CLASS_SELECTORS: Mapping[str, tuple[str, ...]] = {
    "gpu.nvidia.com": (f'{_GPU}.type == "gpu"',),
    "mig.nvidia.com": (f'{_GPU}.type == "mig"',),
    "shared.gpu.nvidia.com": (f'{_GPU}.type == "gpu"', "device.allowMultipleAllocations"),
    computedomain.DAEMON_CLASS: (computedomain.DAEMON_CLASS_SELECTOR,),
    computedomain.DEFAULT_CHANNEL_CLASS: (computedomain.DEFAULT_CHANNEL_CLASS_SELECTOR,),
}


def chart_device_classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses as objects, for ``explain``: the classes ``validate`` knows
    without a file, so both commands see the same world."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in selectors]},
        }
        for name, selectors in CHART_CLASS_SELECTORS.items()
    ]


# kind -> where its ResourceClaimSpec or DeviceClassSpec sits
_CLAIM_SPEC_PATH = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}
_DRA_KINDS = frozenset({"DeviceClass", *_CLAIM_SPEC_PATH})
_SPEC_OPTIONAL = frozenset({"DeviceClass", "ResourceClaim", "ResourceClaimTemplate"})
# v1beta2 has the v1 shape; v1beta1 puts the request fields on the request itself.
_RULE_API_VERSIONS = frozenset({"resource.k8s.io/v1", "resource.k8s.io/v1beta2"})


def check_selector(expression: str) -> Finding | None:
    """Compile with Kubernetes' CEL environment; a compile error is an error, a feature this
    tool does not implement yet only a warning (the API server may well accept it)."""
    try:
        compile_selector(expression)
    except CelUnsupportedError as exc:
        return Finding("", f"not checked: {exc}", Severity.WARNING)
    except CelCompileError as exc:
        return Finding(
            "",
            f"invalid CEL: {exc} (must be a bool expression over device, in Kubernetes' DRA CEL)",
        )
    return None


def _schema_of(published: rules.Published) -> Schema:
    return Schema(
        attributes=published.attributes,
        capacities={published.driver: published.capacities},
        drivers=frozenset({published.driver}),
        optional=OPTIONAL_ATTRIBUTES,
    )


def linter(published: rules.Published) -> "rules.SelectorLint":
    """Selector findings against what ``published`` says the driver publishes."""
    schema = _schema_of(published)

    def lint(expression: str) -> list[Finding]:
        return [
            Finding("", f.message, Severity.WARNING if f.warning else Severity.ERROR, Check.DEVICES)
            for f in lint_selector(expression, schema)
        ]

    return lint


def _label(doc: Mapping[str, Any], index: int) -> str:
    """``Kind/namespace/name`` (``Kind/name`` when no namespace is written: a cluster-scoped
    object, or one that goes to kubectl's current namespace)."""
    kind = doc.get("kind")
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if isinstance(kind, str) and kind:
        where = f"{namespace}/" if isinstance(namespace, str) and namespace else ""
        return f"{kind}/{where}{name if isinstance(name, str) and name else '<unnamed>'}"
    return f"document {index + 1}"


def _field_path(parts: Sequence[object]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@functools.lru_cache(maxsize=128)
def _validator(version: str, kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's strict schema for one kind, loaded once: its ``validate`` reads
    and parses the schema and the 4 MB of definitions again on every call, most of the time
    a file of many documents takes. Raises SchemaNotFoundError as kubernetes-validate does."""
    newest = [v for v in kv_utils.all_versions() if kv_utils.major_minor(v) <= version][-1]
    folder = f"kubernetes-json-schema/v{newest}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv_utils.schema_contents(f"{folder}/{kind.lower()}-{group}.json", version)
    except FileNotFoundError:
        raise kubernetes_validate.SchemaNotFoundError(
            version=version, kind=kind, api_version=api_version
        ) from None
    definitions = kv_utils.schema_contents(f"{folder}/_definitions.json", version)
    registry: referencing.Registry[Any] = (
        referencing.Resource.from_contents(schema) @ referencing.Registry()
    )
    registry = referencing.Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _schema(doc: Mapping[str, Any], version: gates.Version) -> list[Finding]:
    """kubernetes-validate --strict: the API's OpenAPI schema, unknown fields rejected."""
    if not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
        return [Finding("", "apiVersion and kind must be set: not a Kubernetes object")]
    try:
        validator = _validator(f"{version[0]}.{version[1]}", doc["kind"], doc["apiVersion"])
    except kubernetes_validate.SchemaNotFoundError as exc:
        severity = Severity.ERROR if doc["kind"] in _DRA_KINDS else Severity.WARNING
        return [Finding("", f"{exc.message}; not checked", severity)]
    findings: dict[str, Finding] = {}
    for error in validator.iter_errors(dict(doc)):
        finding = _schema_finding(error, str(doc["kind"]))
        if finding is not None:
            findings.setdefault(finding.path, finding)  # one per field: the first
    return sorted(findings.values(), key=lambda f: f.path)


def _schema_finding(error: jsonschema.ValidationError, kind: str) -> Finding | None:
    """One schema error at the field it concerns: an unknown or a missing field is named
    in the path itself, as the API server names it."""
    path = list(error.path)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        allowed = _map_keys(error.schema)
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            near = suggest(str(extra[0]), set(allowed))
            # Every unknown field of the object: fixing one at a time would take as many runs.
            others = "".join(
                f"; unknown field {k!r} too"
                + (f" (did you mean {n}?)" if (n := suggest(str(k), set(allowed))) else "")
                for k in extra[1:]
            )
            return Finding(
                _field_path([*path, extra[0]]),
                f"unknown field {extra[0]!r}"
                + (f"; did you mean {near}?" if near else f" (allowed: {_listed(allowed)})")
                + others,
            )
    instance = error.instance
    if error.validator == "required" and isinstance(error.validator_value, list):
        missing = [
            k for k in error.validator_value if isinstance(instance, Mapping) and k not in instance
        ]
        # The API server takes an absent spec of these kinds (a template's inner spec too)
        # as an empty one.
        if path in ([], ["spec"]) and missing == ["spec"] and kind in _SPEC_OPTIONAL:
            return None
        if missing:
            return Finding(_field_path([*path, missing[0]]), "required")
    if error.validator == "type":
        return Finding(_field_path(path), _type_message(error.validator_value, instance))
    return Finding(_field_path(path), str(error.message))


_TYPE_WORDS = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
}


def _type_message(wanted: Any, instance: Any) -> str:
    """``must be an integer, not 'two'``: the type allowed, then the value written."""
    types = [wanted] if isinstance(wanted, str) else list(wanted)
    words = [_TYPE_WORDS.get(str(t), str(t)) for t in types if t != "null"]
    shown = repr(instance)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"must be {' or '.join(words)}, not {shown}"


def _listed(names: Sequence[str], most: int = 12) -> str:
    shown = sorted(names)
    return ", ".join(shown[:most]) + (f" and {len(shown) - most} more" if len(shown) > most else "")


def _map_keys(schema: Any) -> list[str]:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    return list(properties) if isinstance(properties, Mapping) else []


def _documents(file: str, text: str) -> Iterator[tuple[int, Any] | Problem]:
    try:
        for index, doc in enumerate(yaml.load_all(text, Loader=userfiles.StrictLoader)):
            if doc is None:
                continue
            # Before any check walks it: an alias bomb expands to a billion values there.
            if why := userfiles.document_error(doc):
                yield Problem(file, f"document {index + 1}", "", f"not accepted: {why}")
                return
            yield index, doc
    except RecursionError:  # the pure-Python loader, where libyaml's own bound would stop it
        yield Problem(file, "yaml", "", f"not accepted: nested deeper than {userfiles.MAX_DEPTH}")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        yield Problem(file, "yaml", where, f"not valid YAML: {problem}")


def _class_names(docs: Sequence[Any]) -> frozenset[str]:
    """The chart's DeviceClasses and those in the files and the cluster."""
    classes = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == "DeviceClass"]
    metas = [c.get("metadata") for c in classes]
    return CHART_CLASSES | frozenset(
        m["name"] for m in metas if isinstance(m, Mapping) and isinstance(m.get("name"), str)
    )


def _class_selectors(docs: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """Each known DeviceClass's selectors: the chart's, overridden by the files' and the
    cluster's."""
    known = dict(CHART_CLASS_SELECTORS)
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") != "DeviceClass":
            continue
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if isinstance(name, str):
            spec = doc.get("spec")
            selectors = spec.get("selectors") if isinstance(spec, Mapping) else None
            known[name] = tuple(hardware.expressions(selectors))
    return known


def _drivers(docs: Sequence[Any]) -> frozenset[str] | None:
    """The drivers whose devices the chart's classes, the files' and the cluster's select (a
    driver a selector compares ``device.driver`` with, or whose attributes it reads), or whose
    ResourceSlices they hold. None when a class selects devices of any driver: then no
    driver is unknown."""
    from tools.cel import CelError

    found = {PUBLISHED.driver, computedomain.DRIVER_NAME}
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        spec = doc.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        if doc.get("kind") == "ResourceSlice" and isinstance(spec.get("driver"), str):
            found.add(spec["driver"])
        if doc.get("kind") != "DeviceClass":
            continue
        named: set[str] = set()
        for expression in hardware.expressions(spec.get("selectors")):
            try:
                what = hardware.reads(expression)
            except CelError:
                continue
            named |= what.drivers | {domain for domain, _, _ in what.names}
        if not named:
            return None
        found |= named
    return frozenset(found)


def _namespaces(docs: Sequence[Any]) -> dict[str, Mapping[str, str]]:
    """Each Namespace of the files and the cluster with its labels."""
    found: dict[str, Mapping[str, str]] = {}
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") != "Namespace":
            continue
        meta = doc.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        labels = meta.get("labels")
        if isinstance(meta.get("name"), str):
            found[meta["name"]] = labels if isinstance(labels, Mapping) else {}
    return found


def _namespace_of(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata")
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def _object_findings(
    doc: Mapping[str, Any], ctx: rules.Context, claims: workloads.Claims
) -> Iterator[Finding]:
    ctx = dataclasses.replace(ctx, namespace=_namespace_of(doc))
    if computedomains.is_ours(doc):
        yield from _compute_domain_findings(doc)
        return
    schema = _schema(doc, ctx.version)
    yield from schema
    # A field the schema already refused (a missing or null one) gets no second line.
    refused = {f.path for f in schema}
    for finding in _rule_findings(doc, ctx, claims):
        if finding.path not in refused:
            yield finding


def _compute_domain_findings(doc: Mapping[str, Any]) -> Iterator[Finding]:
    """The CRDs' schema (no kubernetes-validate schema knows them), then the name and labels,
    then what the controller needs."""
    schema = list(computedomains.check_schema(doc))
    yield from schema
    if any(f.path in ("apiVersion", "kind") for f in schema):
        return
    refused = {f.path for f in schema}
    for finding in (
        *rules.check_metadata(doc.get("metadata"), str(doc.get("kind"))),
        *computedomains.check_controller(doc),
    ):
        if finding.path not in refused:
            yield finding


def _rule_findings(
    doc: Mapping[str, Any], ctx: rules.Context, claims: workloads.Claims
) -> Iterator[Finding]:
    kind = doc.get("kind")
    if kind == "DeviceTaintRule":
        yield from rules.check_taint_rule(doc, ctx)
        return
    if kind in workloads.POD_SPEC_PATHS:
        yield from rules.check_metadata(doc.get("metadata"), str(kind))
        yield from workloads.check_workload(doc, claims)
        return
    if kind not in _DRA_KINDS:
        return
    if doc.get("apiVersion") not in _RULE_API_VERSIONS:
        yield Finding(
            "apiVersion",
            f"only the schema was checked for {doc.get('apiVersion')}: write resource.k8s.io/v1",
            Severity.WARNING,
        )
        return
    yield from rules.check_metadata(doc.get("metadata"), str(kind))
    if kind == "DeviceClass":
        yield from rules.check_device_class_spec(doc.get("spec"), "spec", ctx)
        return
    spec: Any = doc
    for key in _CLAIM_SPEC_PATH[str(kind)]:
        spec = spec.get(key) if isinstance(spec, Mapping) else None
    yield from rules.check_claim_spec(spec, ".".join(_CLAIM_SPEC_PATH[str(kind)]), ctx)


def _severity(finding: Finding, defined_elsewhere: bool) -> Severity:
    if defined_elsewhere and finding.check in (Check.REFERENCE, Check.HARDWARE):
        return Severity.WARNING
    return finding.severity


@dataclass(frozen=True)
class Report:
    """The problems found, and how many objects were read: a clean run says what it read."""

    problems: list[Problem]
    objects: int


def validate_sources(
    sources: Sequence[tuple[str, str]],
    *,
    version: gates.Version = gates.OLDEST,
    selector_check: rules.SelectorCheck = check_selector,
    published: rules.Published | None = PUBLISHED,
    known: Sequence[Mapping[str, Any]] = (),
    defined_elsewhere: bool = False,
    hardware_check: bool = True,
) -> list[Problem]:
    """The problems of :func:`validate_report`."""
    return validate_report(
        sources,
        version=version,
        selector_check=selector_check,
        published=published,
        known=known,
        defined_elsewhere=defined_elsewhere,
        hardware_check=hardware_check,
    ).problems


def validate_report(
    sources: Sequence[tuple[str, str]],
    *,
    version: gates.Version = gates.OLDEST,
    selector_check: rules.SelectorCheck = check_selector,
    published: rules.Published | None = PUBLISHED,
    known: Sequence[Mapping[str, Any]] = (),
    defined_elsewhere: bool = False,
    hardware_check: bool = True,
) -> Report:
    """Every problem in the ``(file name, YAML text)`` sources, in file and document order.

    DeviceClass, ResourceClaim and ResourceClaimTemplate names are collected across all
    sources (and ``known``, objects read from a cluster) first: every ``deviceClassName``
    must name one of them or of the chart's, and every pod's ``resourceClaims`` a claim or
    template among them. ``hardware_check``: each request of this driver is judged against
    the devices of every instance profile. ``defined_elsewhere``: a name none defines, or a
    request no profile's devices satisfy, is a warning. ``published`` is what the driver
    publishes, for names and types in selectors, constraints and configs (None: unchecked).
    """
    per_file: list[tuple[str, list[tuple[int, Any]], list[Problem]]] = []
    for file, text in sources:
        docs: list[tuple[int, Any]] = []
        unparsable: list[Problem] = []
        for item in _documents(file, text):
            if isinstance(item, Problem):
                unparsable.append(item)  # parsing stops here: it comes after the docs before it
            else:
                docs.append(item)
        per_file.append((file, docs, unparsable))
    every = [*known, *(doc for _, docs, _ in per_file for _, doc in docs)]
    ctx = rules.Context(
        version=version,
        check_selector=selector_check,
        classes=_class_names(every),
        lint_selector=linter(published) if published is not None else rules.no_lint,
        published=published,
        class_selectors=_class_selectors(every) if hardware_check else None,
        drivers=_drivers([*chart_device_classes(), *every]),
        namespaces=_namespaces(every),
    )
    claims = workloads.collect_claims(every)
    problems: list[Problem] = []
    for file, docs, unparsable in per_file:
        for index, doc in docs:
            if not isinstance(doc, Mapping):
                problems.append(
                    Problem(
                        file,
                        f"document {index + 1}",
                        "",
                        "not a Kubernetes object: must be a mapping with apiVersion and kind",
                    )
                )
                continue
            label = _label(doc, index)
            problems.extend(
                Problem(file, label, f.path, f.message, _severity(f, defined_elsewhere), f.check)
                for f in _object_findings(doc, ctx, claims)
            )
        problems.extend(unparsable)
    return Report(problems, objects=sum(len(docs) for _, docs, _ in per_file))
