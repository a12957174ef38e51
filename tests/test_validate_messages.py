"""Every problem ``gpu-dra validate`` reports names five things: the file, the object
(``Kind/namespace/name``), the field path, the value the user wrote, and what is allowed.

The message sites are enumerated from the source: every ``Finding(...)`` and ``Problem(...)``
in tools/validation/. The corpus is every case of the validate test tables, a seeded
run of the mutation generator (tests/manifest_mutations.py), and the cases below for sites
those do not reach; each site must be reached by some case (a new site fails here until one
is added), and every problem of every case must pass the five checks.
"""

import ast
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from drivers.computedomain import names
from tests import computedomain_cases, manifest_mutations
from tests import test_validate as table
from tests import test_validate_mistakes as mistakes
from tests import test_validate_server_rules as server_rules
from tools.validation import (
    Problem,
    computedomains,
    hardware,
    manifests,
    rules,
    validate_sources,
    workloads,
)
from tools.validation import problems as problems_module

MODULES = (rules, workloads, computedomains, manifests, hardware)
MUTATIONS = 800
SEED = 20261202
FILE = "case.yaml"
UID = "bb55e2a1-7c3d-4f0e-9a8b-0123456789ea"

# Sites no case reaches, and why they stay.
UNREACHED = {
    # jsonschema's own message for a keyword other than type, required and
    # additionalProperties: no schema validate loads for its kinds uses another one in a way
    # a manifest can break (kept so that a new schema's keyword still reports something).
    ("manifests.py", "_schema_finding", "Finding(_field_path(path), str(error.message))"),
    # Python's RecursionError from the pure-Python YAML loader: where libyaml is built in (here,
    # and in every wheel PyYAML ships) its own bound answers first, a YAML error with a line.
    (
        "manifests.py",
        "_documents",
        'Problem(file, "yaml", "", f"not accepted: nested deeper than {userfiles.MAX_DEPTH}")',
    ),
}

# What is allowed, in the words the messages use.
ALLOWED = re.compile(
    r"must|allowed|one of|at most|at least|did you mean|known|expected|e\.g\.|write |use |"
    r"required|needs feature gate|only|it has|publishes no|there is|there ranges|guard|"
    r"instead|compare it|compare with|takes a|is ignored|should be|is not a|valid|steps of|"
    r"not checked|there has",
    re.IGNORECASE,
)
POSITION = re.compile(r"\b\d+:\d+: ")  # a CEL message's line:column in the expression
SIZE = re.compile(r"\b(?:is|has) \d+\b")  # a limit's message: the size written


def _claim(devices: dict[str, Any], name: str = "c") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": devices},
    }


def _channel(config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    request = {"name": "channel", "exactly": {"deviceClassName": names.DEFAULT_CHANNEL_CLASS}}
    return _claim({"requests": [request], **({"config": config} if config else {})})


def _cd_config(parameters: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"opaque": {"driver": names.DRIVER_NAME, "parameters": parameters}}]


def _domain(**changes: Any) -> dict[str, Any]:
    return {**computedomain_cases.channel_injection(), **changes}


def _taint_rule(api_version: str, effect: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain"},
        "spec": {"taint": {"key": "example.com/maintenance", "effect": effect}},
    }


# Cases for the sites the tables and the generator do not reach: (documents, or YAML text).
EXTRA: list[list[Any] | str] = [
    # the ComputeDomain node driver's decoder refuses the config
    [
        _channel(
            _cd_config(
                {
                    "apiVersion": names.API_VERSION,
                    "kind": names.CHANNEL_CONFIG_KIND,
                    "domainID": "not-a-uid",
                }
            )
        )
    ],
    # a daemon config for a channel request
    [
        _channel(
            _cd_config(
                {"apiVersion": names.API_VERSION, "kind": names.DAEMON_CONFIG_KIND, "domainID": UID}
            )
        )
    ],
    # a channel request with no config
    [_channel()],
    # no alternative can be met on any instance type
    [
        _claim(
            {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": n, "deviceClassName": "gpu.nvidia.com", "count": 64}
                            for n in ("a", "b")
                        ],
                    }
                ]
            }
        )
    ],
    # a ComputeDomain's metadata: an unknown field, a mistyped one, a label that is no string
    [_domain(metadata={"name": "d", "nmae": "x"})],
    [_domain(metadata={"name": "d", "generation": "one"})],
    [_domain(metadata={"name": "d", "labels": {"tier": 7}})],
    # the group at a version the CRDs do not serve; an opaque config's kind as an object
    [_domain(apiVersion="resource.nvidia.com/v1")],
    [{"apiVersion": names.API_VERSION, "kind": "GpuConfig", "metadata": {"name": "g"}}],
    # a toleration's effect no version has
    [
        _claim(
            {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoRun"}],
                        },
                    }
                ]
            }
        )
    ],
    # CEL this tool does not evaluate: not checked, a warning
    [
        _claim(
            {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": 'isIP("10.0.0.1")'}}],
                        },
                    }
                ]
            }
        )
    ],
    # an older API version: only its schema is checked
    [{**_claim({"requests": []}), "apiVersion": "resource.k8s.io/v1beta1"}],
    # no apiVersion or kind; a kind no schema knows; a document that is no object; bad YAML
    [{"metadata": {"name": "x"}}],
    [{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}],
    [["a", "list"]],
    "apiVersion: v1\nkind: Pod\nmetadata: {name: p\n",
    # a document nested past the bound, and a billion-laughs alias bomb
    "a: " + "[" * 150 + "]" * 150 + "\n",
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n"
        for p, n in zip("abcdef", "bcdefg", strict=True)
    ),
    # a DeviceTaintRule: at a version that serves none; with an effect no version has
    [_taint_rule("resource.k8s.io/v1beta1", "NoExecute")],
    [_taint_rule("resource.k8s.io/v1alpha3", "NoRun")],
]


def _corpus() -> Iterator[list[Any] | str]:
    for row in [*table.ERRORS, *table.GATED]:
        yield [row[1]]
    for _, docs, _, _ in mistakes.MISTAKES:
        yield docs
    for row in server_rules.REFUSED:
        yield [row[1]]
    for case in computedomain_cases.CASES:
        yield [case.doc]
    for mutated in manifest_mutations.generate(SEED, MUTATIONS):
        yield [mutated.doc]
    yield from EXTRA


def _label(doc: Any) -> str | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        return None
    raw = doc.get("metadata")
    meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
    namespace = meta.get("namespace")
    where = f"{namespace}/" if isinstance(namespace, str) and namespace else ""
    name = meta.get("name")
    return f"{doc['kind']}/{where}{name if isinstance(name, str) and name else '<unnamed>'}"


_MISSING = object()


def _at(doc: Any, path: str) -> tuple[Any, Any]:
    """(the value at ``path``, its parent), ``_MISSING`` where there is none. A map key may
    hold dots (a label key): the longest key that matches is taken."""
    parts = re.findall(r"\[\d+\]|[^.\[\]]+", path)
    parent, value = _MISSING, doc
    i = 0
    while i < len(parts):
        parent = value
        if parts[i].startswith("["):
            n = int(parts[i][1:-1])
            value = value[n] if isinstance(value, list) and n < len(value) else _MISSING
            i += 1
        else:
            j = len(parts)
            while j > i and not (isinstance(value, dict) and ".".join(parts[i:j]) in value):
                j -= 1
            if j == i:
                return _MISSING, parent
            value, i = value[".".join(parts[i:j])], j
        if value is _MISSING:
            return _MISSING, parent
    return value, parent


def _names_value(problem: Problem, value: Any) -> bool:
    message = problem.message
    if isinstance(value, dict | list):
        return True  # a whole object or list: the path names it
    shown = {str(value), repr(value), json.dumps(value)}
    if isinstance(value, str) and len(value) > 60:
        shown |= {value[:40]}
    if any(s in message for s in shown):
        return True
    if POSITION.search(message) or SIZE.search(message):
        return True  # where in the expression, or the size of what was written
    # A mistake in a key (an unknown field, a capacity nobody publishes): the key is what
    # the user wrote.
    key = re.split(r"[.\[]", problem.path)[-1]
    return f"'{key}'" in message


def five_parts(problem: Problem, docs: list[Any]) -> list[str]:
    """What a problem fails to name, of the five."""
    wrong = []
    if problem.file != FILE:
        wrong.append("file")
    labels = [_label(d) for d in docs]
    if problem.obj == "yaml":
        if not re.fullmatch(r"line \d+, column \d+", problem.path):
            wrong.append("path")
        return wrong + ([] if ALLOWED.search(problem.message) else ["allowed"])
    if problem.obj not in labels and not re.fullmatch(r"document \d+", problem.obj):
        wrong.append("object")
    doc = docs[labels.index(problem.obj)] if problem.obj in labels else None
    if not problem.path:
        # The object as a whole: it is no Kubernetes object, or no schema knows its kind.
        if not re.search(r"not a Kubernetes object|not checked|not accepted", problem.message):
            wrong.append("path")
    elif doc is not None:
        value, parent = _at(doc, problem.path)
        if value is _MISSING and parent is _MISSING:
            wrong.append("path")
        elif value is _MISSING or value is None:
            # Nothing written (or null): the message must say what is wanted there.
            if not ALLOWED.search(problem.message):
                wrong.append("value")
        elif not _names_value(problem, value):
            wrong.append("value")
    if not ALLOWED.search(problem.message):
        wrong.append("allowed")
    return wrong


def _sites() -> dict[tuple[str, str, int], str]:
    """Every Finding(...) and Problem(...) in the validation modules: (file, function, first
    line) -> the call's source."""
    sites = {}
    for module in MODULES:
        path = Path(str(module.__file__))
        source = path.read_text()
        tree = ast.parse(source)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("Finding", "Problem")
                ):
                    text = ast.get_source_segment(source, node) or ""
                    sites[(path.name, function.name, node.lineno)] = text
    return sites


def _recording(cls: type, hits: Counter[tuple[str, int]]) -> type:
    class Recorded(cls):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            caller = sys._getframe(1)
            hits[(Path(caller.f_code.co_filename).name, caller.f_lineno)] += 1

    return Recorded


@pytest.fixture(scope="module")
def run() -> tuple[list[tuple[Problem, list[Any]]], Counter[tuple[str, int]]]:
    hits: Counter[tuple[str, int]] = Counter()
    finding = _recording(problems_module.Finding, hits)
    problem = _recording(problems_module.Problem, hits)
    saved = [(m, m.__dict__.get("Finding"), m.__dict__.get("Problem")) for m in MODULES]
    for module in MODULES:
        if "Finding" in module.__dict__:
            module.Finding = finding  # type: ignore[attr-defined]
        if "Problem" in module.__dict__:
            module.Problem = problem  # type: ignore[attr-defined]
    found: list[tuple[Problem, list[Any]]] = []
    try:
        for case in _corpus():
            text = case if isinstance(case, str) else yaml.safe_dump_all(case)
            docs = [] if isinstance(case, str) else case
            found += [(p, docs) for p in validate_sources([(FILE, text)])]
        # What only a newer API server refuses, at that version.
        newer = [_claim({"requests": [{"name": "a", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "capacity": {"requests": {"a/b/c": "1Gi", "memory": "-1Gi"}}}}]})]  # fmt: skip
        text = yaml.safe_dump_all(newer)
        found += [(p, newer) for p in validate_sources([(FILE, text)], version=(1, 38))]
    finally:
        for module, f, p in saved:
            if f is not None:
                module.Finding = f  # type: ignore[attr-defined]
            if p is not None:
                module.Problem = p  # type: ignore[attr-defined]
    return found, hits


def test_every_message_site_is_reached_by_a_case(
    run: tuple[list[tuple[Problem, list[Any]]], Counter[tuple[str, int]]],
) -> None:
    _, hits = run
    sites = _sites()
    assert len(sites) > 80  # the enumeration finds them
    unreached = []
    for (file, function, line), text in sites.items():
        span = text.count("\n")
        reached = any(f == file and line <= ln <= line + span for f, ln in hits)
        first = text.splitlines()[0].strip() if text else ""
        if not reached and (file, function, first) not in UNREACHED:
            unreached.append(f"{file}:{line} in {function}: {first}")
    assert unreached == [], "\n".join(unreached)


def test_every_problem_names_file_object_path_value_and_what_is_allowed(
    run: tuple[list[tuple[Problem, list[Any]]], Counter[tuple[str, int]]],
) -> None:
    found, _ = run
    assert len(found) > 1000
    failing = [
        f"{p} [missing: {', '.join(wrong)}]" for p, docs in found if (wrong := five_parts(p, docs))
    ]
    assert failing == [], "\n".join(failing)


def test_the_checks_catch_a_message_without_its_value_or_what_is_allowed() -> None:
    doc = _claim({"requests": []})
    bare = Problem(FILE, "ResourceClaim/team/c", "spec.devices.requests", "bad")
    assert five_parts(bare, [doc]) == ["allowed"]
    count = _claim({"requests": [{"name": "gpu", "exactly": {"count": 7}}]})
    silent = Problem(FILE, "ResourceClaim/team/c", "spec.devices.requests[0].exactly.count",
                     "must be at least 1")  # fmt: skip
    assert five_parts(silent, [count]) == ["value"]
    elsewhere = Problem("other.yaml", "ResourceClaim/c", "spec.nosuch.field", "must be 1")
    assert five_parts(elsewhere, [count]) == ["file", "object"]
