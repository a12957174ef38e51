"""Explain's inputs: Kubernetes objects from manifest files or from the API server.

Files may hold YAML (one or many documents), JSON (one object or several in a
row), and v1 Lists (``kind: List`` or ``*List`` with ``items``). Outputs of
several ``gpu-dra discover -o yaml`` runs pasted together without ``---``
between them are accepted too: a top-level key repeated in one document (which
plain YAML would silently resolve to the last value, losing objects) starts a
new document when the line begins with ``apiVersion:``.
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from driver.kube.resources import Resource
    from driver.kube.rest import Client
    from driver.kube.session import Session

from driver.common.errors import PermanentError, RetryableError
from tools import userfiles

# Kinds each input carries, by the field of Inputs they go to.
SLICE = "ResourceSlice"
CLASS = "DeviceClass"
CLAIM = "ResourceClaim"
TEMPLATE = "ResourceClaimTemplate"
TAINT_RULE = "DeviceTaintRule"
# Where each Kubernetes version serves DeviceTaintRules, newest first: v1 from 1.37, v1beta2
# in 1.36 (off unless runtime-config enables it), v1alpha3 before.
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")


class InputError(PermanentError):
    """A file that cannot be read or parsed, or holds objects of the wrong kind."""


class ClusterReadError(RetryableError):
    """The API server could not be read now (network, 5xx, throttling)."""


class ClusterAccessError(PermanentError):
    """The API server refused (unauthorized, forbidden, resource.k8s.io/v1 not served)."""


@dataclass(slots=True)
class Inputs:
    slices: list[dict[str, Any]] = field(default_factory=list)
    classes: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)  # allocated claims
    node_labels: dict[str, dict[str, str]] | None = None
    taint_rules: list[dict[str, Any]] = field(default_factory=list)
    # Why the cluster's DeviceTaintRules could not be read (forbidden), or None.
    taint_rules_unread: str | None = None


_StrictLoader = userfiles.StrictLoader
_DuplicateKey = userfiles.DuplicateKeyError


_DOC_START = re.compile(r"^apiVersion:", re.MULTILINE)


def parse_text(text: str, source: str) -> list[dict[str, Any]]:
    """All objects in a manifest text, Lists flattened; ``source`` names it in errors."""
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            docs = _parse_json(stripped, source)
        else:
            docs = _parse_yaml(text, source)
    except RecursionError as exc:  # the decoders recurse: past ~1000 levels, not ours to bound
        raise InputError(f"{source}: nested deeper than {userfiles.MAX_DEPTH} levels") from exc
    # Before anything walks them: an alias bomb expands to a billion values there.
    for index, doc in enumerate(docs):
        if why := userfiles.document_error(doc):
            raise InputError(f"{source}: document #{index + 1}: {why}")
    return flatten(docs, source)


def _parse_json(text: str, source: str) -> list[Any]:
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    position = 0
    while position < len(text):
        try:
            doc, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{source}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}"
            ) from exc
        docs.extend(doc if isinstance(doc, list) else [doc])
        position = end
        while position < len(text) and text[position].isspace():
            position += 1
    return docs


def _parse_yaml(text: str, source: str) -> list[Any]:
    try:
        return list(yaml.load_all(text, Loader=_StrictLoader))
    except _DuplicateKey as exc:
        if exc.problem_mark is None or exc.problem_mark.column != 0:
            raise _yaml_error(exc, source) from exc
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source) from exc
    # A repeated top-level key: documents pasted together without "---".
    starts = [m.start() for m in _DOC_START.finditer(text)]
    chunks = [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)], strict=True)]
    docs: list[Any] = []
    for chunk in chunks:
        try:
            docs.extend(yaml.load_all(chunk, Loader=_StrictLoader))
        except yaml.YAMLError as exc:
            raise _yaml_error(exc, source) from exc
    return docs


def _yaml_error(exc: yaml.YAMLError, source: str) -> InputError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return InputError(f"{source}: {where}invalid YAML: {problem}")


def flatten(docs: Iterable[Any], source: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, doc in enumerate(docs):
        if doc is None:
            continue  # an empty document, e.g. a trailing "---"
        if not isinstance(doc, dict):
            raise InputError(f"{source}: document #{index + 1} is not an object")
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            out.extend(flatten(doc["items"], source))
            continue
        if not isinstance(kind, str) or not kind:
            raise InputError(f"{source}: document #{index + 1} has no kind")
        out.append(doc)
    return out


def load_file(path: Path, *, max_bytes: int = userfiles.DEFAULT_MAX_BYTES) -> list[dict[str, Any]]:
    """The objects of a regular file of at most ``max_bytes``."""
    try:
        text = userfiles.read_text(str(path), limit=max_bytes)
    except userfiles.UserFileError as exc:
        raise InputError(str(exc)) from exc
    return parse_text(text, str(path))


def of_kinds(
    objects: Iterable[dict[str, Any]],
    kinds: tuple[str, ...],
    source: str,
    *,
    skip: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The objects of one of ``kinds``; those of a ``skip`` kind are left out, others refused."""
    out: list[dict[str, Any]] = []
    for obj in objects:
        if obj.get("kind") in skip:
            continue
        if obj.get("kind") not in kinds:
            name = (obj.get("metadata") or {}).get("name", "?")
            raise InputError(
                f"{source}: {obj.get('kind')} {name}: expected {' or '.join(kinds)} here"
            )
        out.append(obj)
    return out


async def read_cluster(api_client: "Session") -> Inputs:
    """ResourceSlices, DeviceClasses, allocated ResourceClaims, DeviceTaintRules and Node labels
    from the API server.

    Node labels are
    optional: without permission to list Nodes they stay unknown.
    """
    from driver.kube import resources
    from driver.kube.rest import Client

    api = Client(api_client)
    slices = await _list_all(api, resources.RESOURCE_SLICES)
    classes = await _list_all(api, resources.DEVICE_CLASSES)
    claims = await _list_all(api, resources.RESOURCE_CLAIMS)
    try:
        nodes = await _list_all(api, resources.NODES)
    except ClusterAccessError:
        labels = None
    else:
        labels = {
            str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {}) for n in nodes
        }
    allocated = [c for c in claims if (c.get("status") or {}).get("allocation")]
    rules, unread = await _taint_rules(api)
    for kind, items in ((SLICE, slices), (CLASS, classes), (CLAIM, allocated), (TAINT_RULE, rules)):
        for item in items:
            item.setdefault("kind", kind)
    return Inputs(
        slices=slices,
        classes=classes,
        claims=allocated,
        node_labels=labels,
        taint_rules=rules,
        taint_rules_unread=unread,
    )


async def _taint_rules(api: "Client") -> tuple[list[dict[str, Any]], str | None]:
    """The DeviceTaintRules in the newest version served; none where no version is (the
    scheduler applies none there either). Without permission to list them, none and why:
    the claim is still explained, with that said."""
    from driver.kube.resources import Resource
    from driver.kube.rest import ApiError

    for version in TAINT_RULE_VERSIONS:
        rules = Resource("resource.k8s.io", version, "devicetaintrules", namespaced=False)
        try:
            return await api.list_all(rules), None
        except ApiError as exc:
            if exc.status == 404:
                continue
            if exc.status in (401, 403):
                return [], f"list devicetaintrules: HTTP {exc.status}"
            if isinstance(exc, RetryableError):
                raise ClusterReadError(str(exc)) from exc
            raise ClusterAccessError(str(exc)) from exc
    return [], None


_HINTS = {
    401: "check the kubeconfig credentials",
    403: "grant list on {resource}",
    404: "is resource.k8s.io/v1 served (Kubernetes 1.34+)?",
}


async def read_references(api_client: "Session") -> list[dict[str, Any]]:
    """DeviceClasses, ResourceClaims and ResourceClaimTemplates: what manifests name; and,
    where the API server lets them be listed, Namespaces (their labels allow admin access),
    ResourceSlices (the drivers that publish) and ComputeDomains (their channel templates).

    For ``gpu-dra validate --cluster``: a pod in a file may name a template that is
    already in the cluster.
    """
    from driver.kube import resources
    from driver.kube.rest import Client
    from drivers.computedomain import names as computedomain

    api = Client(api_client)
    found: list[dict[str, Any]] = []
    for kind, listed in (
        (CLASS, resources.DEVICE_CLASSES),
        (CLAIM, resources.RESOURCE_CLAIMS),
        (TEMPLATE, resources.RESOURCE_CLAIM_TEMPLATES),
    ):
        for item in await _list_all(api, listed):
            item.setdefault("kind", kind)
            found.append(item)
    # What validate reads besides: a user who may not list them loses only those checks,
    # and a cluster without the ComputeDomain CRD has none.
    for kind, listed in (
        ("Namespace", resources.NAMESPACES),
        (SLICE, resources.RESOURCE_SLICES),
        ("ComputeDomain", computedomain.COMPUTE_DOMAINS_API),
    ):
        try:
            items = await _list_all(api, listed)
        except ClusterAccessError:
            continue
        for item in items:
            item.setdefault("kind", kind)
            if kind == "ComputeDomain":  # the items of a list carry no apiVersion
                item.setdefault("apiVersion", computedomain.API_VERSION)
            found.append(item)
    return found


async def _list_all(api: "Client", listed: "Resource") -> list[dict[str, Any]]:
    from driver.kube.rest import ApiError

    resource = listed.rbac()
    try:
        return await api.list_all(listed)
    except ApiError as exc:
        if exc.status in _HINTS:
            hint = _HINTS[exc.status].format(resource=resource)
            raise ClusterAccessError(f"list {resource}: HTTP {exc.status}: {hint}") from exc
        if isinstance(exc, RetryableError):
            raise ClusterReadError(str(exc)) from exc
        raise ClusterAccessError(str(exc)) from exc
