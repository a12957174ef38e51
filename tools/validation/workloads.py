"""Pods and the workloads that template them, checked against the claims they name.

The schema accepts a container that names a claim its pod never lists, or a pod that
names a template nobody wrote; the pod then never starts. Every check here is one the
kubelet or the scheduler would fail on later, reported with the workload's field path.
"""

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.common.limits import is_dns_label, is_dns_subdomain
from drivers.computedomain.names import CHANNEL_REQUEST
from tools.cel import suggest
from tools.validation.computedomains import channel_template
from tools.validation.problems import Check, Finding, Severity

# kind -> path from the object to its PodSpec
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Job": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
_CLAIM_KINDS = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}


@dataclass(frozen=True, slots=True)
class Claims:
    """The ResourceClaims and ResourceClaimTemplates known (the files', the cluster's, and
    the channel templates ComputeDomains get), by (namespace, name): their request names
    (``req`` and ``req/sub``)."""

    claims: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    templates: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _namespace(doc: Mapping[str, Any]) -> str:
    namespace = _map(doc.get("metadata")).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"


def _request_names(spec: Any) -> frozenset[str]:
    names: set[str] = set()
    for request in _list(_map(_map(spec).get("devices")).get("requests")):
        name = _map(request).get("name")
        if not isinstance(name, str):
            continue
        names.add(name)
        for sub in _list(_map(request).get("firstAvailable")):
            subname = _map(sub).get("name")
            if isinstance(subname, str):
                names.add(f"{name}/{subname}")
    return frozenset(names)


def collect_claims(docs: Sequence[Any]) -> Claims:
    claims: dict[tuple[str, str], frozenset[str]] = {}
    templates: dict[tuple[str, str], frozenset[str]] = {}
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") not in _CLAIM_KINDS:
            continue
        name = _map(doc.get("metadata")).get("name")
        if not isinstance(name, str):
            continue
        spec: Any = doc
        for key in _CLAIM_KINDS[str(doc["kind"])]:
            spec = _map(spec).get(key)
        target = claims if doc["kind"] == "ResourceClaim" else templates
        target[(_namespace(doc), name)] = _request_names(spec)
    # A ComputeDomain's controller creates its channel template in the domain's namespace.
    for doc in docs:
        if isinstance(doc, Mapping) and (template := channel_template(doc)) is not None:
            templates.setdefault((_namespace(doc), template), frozenset({CHANNEL_REQUEST}))
    return Claims(claims, templates)


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    near = suggest(name, set(known))
    return f"; did you mean {near}?" if near else ""


def _pod_claim(
    path: str, entry: Mapping[str, Any], namespace: str, known: Claims
) -> tuple[list[Finding], frozenset[str] | None]:
    """Findings for one ``spec.resourceClaims`` entry, and the request names of what it
    names (None when unknown)."""
    findings: list[Finding] = []
    claim = entry.get("resourceClaimName")
    template = entry.get("resourceClaimTemplateName")
    if (claim is None) == (template is None):
        findings.append(
            Finding(path, "exactly one of resourceClaimName and resourceClaimTemplateName")
        )
        return findings, None
    for key, value in (("resourceClaimName", claim), ("resourceClaimTemplateName", template)):
        if isinstance(value, str) and not is_dns_subdomain(value):
            findings.append(
                Finding(
                    f"{path}.{key}",
                    f"{value!r} must be a DNS subdomain: lowercase letters, digits, '-' and "
                    "'.', at most 253 characters"
                    + (f", is {len(value)}" if len(value) > 253 else ""),
                )
            )
            return findings, None
    kind, name, table = (
        ("ResourceClaim", claim, known.claims)
        if claim is not None
        else ("ResourceClaimTemplate", template, known.templates)
    )
    field_name = "resourceClaimName" if claim is not None else "resourceClaimTemplateName"
    if not isinstance(name, str):
        return findings, None
    requests = table.get((namespace, name))
    if requests is None:
        in_namespace = sorted(n for ns, n in table if ns == namespace)
        other = "ResourceClaimTemplate" if claim is not None else "ResourceClaim"
        other_table = known.templates if claim is not None else known.claims
        hint = (
            f"; a {other} of that name exists: use "
            f"{'resourceClaimTemplateName' if claim is not None else 'resourceClaimName'}"
            if (namespace, name) in other_table
            else _did_you_mean(name, in_namespace)
        )
        findings.append(
            Finding(
                f"{path}.{field_name}",
                f"no {kind} {name!r} in namespace {namespace!r} in the files given or the "
                f"cluster (known there: {', '.join(in_namespace) or 'none'}): the pod stays "
                f"pending{hint} (--defined-elsewhere if it is)",
                check=Check.REFERENCE,
            )
        )
    return findings, requests


def _containers(spec: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for key in ("initContainers", "containers"):
        for i, container in enumerate(_list(spec.get(key))):
            yield f"{path}.{key}[{i}]", _map(container)


def check_pod_spec(spec: Any, path: str, namespace: str, known: Claims) -> Iterator[Finding]:
    spec = _map(spec)
    entries: dict[str, frozenset[str] | None] = {}
    for i, raw in enumerate(_list(spec.get("resourceClaims"))):
        entry = _map(raw)
        name = entry.get("name")
        epath = f"{path}.resourceClaims[{i}]"
        if not name:
            yield Finding(f"{epath}.name", "required: the name containers use for this claim")
        elif isinstance(name, str) and name in entries:
            yield Finding(f"{epath}.name", f"duplicate name {name!r}: must be unique in the pod")
        elif isinstance(name, str) and not is_dns_label(name):
            yield Finding(f"{epath}.name", f"{name!r} {_DNS_LABEL}")
        findings, requests = _pod_claim(epath, entry, namespace, known)
        yield from findings
        if isinstance(name, str) and name not in entries:
            entries[name] = requests
    used: set[str] = set()
    for cpath, container in _containers(spec, path):
        resources = _map(container.get("resources"))
        yield from _duplicate_claims(f"{cpath}.resources.claims", _list(resources.get("claims")))
        for k, raw in enumerate(_list(resources.get("claims"))):
            ref = _map(raw)
            name = ref.get("name")
            rpath = f"{cpath}.resources.claims[{k}]"
            if not isinstance(name, str) or not name:
                continue
            used.add(name)
            request = ref.get("request")
            if isinstance(request, str) and request and not is_dns_label(request):
                yield Finding(f"{rpath}.request", f"{request!r} {_DNS_LABEL}")
            if name not in entries:
                yield Finding(
                    f"{rpath}.name",
                    f"the pod has no resourceClaims entry {name!r}, so the pod can never start; "
                    f"must be one of its entries ({', '.join(sorted(entries)) or 'none'})"
                    + _did_you_mean(name, sorted(entries)),
                )
                continue
            request = ref.get("request")
            requests = entries[name]
            if isinstance(request, str) and requests is not None and request not in requests:
                top = sorted(r for r in requests if "/" not in r)
                yield Finding(
                    f"{rpath}.request",
                    f"claim {name!r} has no request {request!r} (requests: "
                    f"{', '.join(top) or 'none'})" + _did_you_mean(request, top),
                    check=Check.REFERENCE,
                )
    for name in sorted(set(entries) - used):
        index = next(
            i
            for i, e in enumerate(_list(spec.get("resourceClaims")))
            if _map(e).get("name") == name
        )
        yield Finding(
            f"{path}.resourceClaims[{index}]",
            f"no container lists {name!r} in resources.claims: its devices are allocated "
            "but no container gets them (each entry must be in some container's "
            "resources.claims, or be removed)",
            Severity.WARNING,
        )


_DNS_LABEL = (
    "must be a DNS label: lowercase letters, digits and '-', starting and ending with a "
    "letter or digit, at most 63 characters"
)


def _duplicate_claims(path: str, refs: list[Any]) -> Iterator[Finding]:
    """validateResourceClaimNames: each entry names a claim once, or each of its requests
    once; a whole claim beside one of its requests is a duplicate too."""
    seen: set[str] = set()
    for i, raw in enumerate(refs):
        ref = _map(raw)
        name = ref.get("name")
        if not name:
            yield Finding(
                f"{path}[{i}]", "required: the name of an entry in the pod's resourceClaims"
            )
            continue
        if not isinstance(name, str):
            continue
        if name in seen:
            yield Finding(
                f"{path}[{i}]",
                f"duplicate {name!r}: every request of claim {name!r} is listed already; a "
                "claim, or each of its requests, at most once",
            )
            continue
        request = ref.get("request")
        key = f"{name}/{request}" if isinstance(request, str) and request else name
        if key in seen:
            yield Finding(f"{path}[{i}]", f"duplicate entry {key!r}: each at most once")
        elif key == name and any(k.startswith(f"{name}/") for k in seen):
            yield Finding(
                f"{path}[{i}]",
                f"duplicate {name!r}: claim {name!r} is listed already for one of its "
                "requests; the whole claim or its requests, not both",
            )
        seen.add(key)


def check_workload(doc: Mapping[str, Any], known: Claims) -> Iterator[Finding]:
    spec_path = POD_SPEC_PATHS.get(str(doc.get("kind")))
    if spec_path is None:
        return
    spec: Any = doc
    for key in spec_path:
        spec = _map(spec).get(key)
    yield from check_pod_spec(spec, ".".join(spec_path), _namespace(doc), known)
