"""The reference tables of docs/reference.md, generated from their sources.

``python -m tests.docs_reference`` rewrites the generated sections in place (``make docs``);
``tests/test_docs_reference.py`` fails when the file differs from what this writes. Each
table is read from the one place its facts live: the flag table (:mod:`cli.flagtable`), the
chart's values schema and values file, the attribute tables the device kinds are tested
against (:mod:`drivers.gpu.model.published`), and the metrics registries
(:mod:`drivers.gpu.metrics`, :mod:`cluster.computedomain.metrics`).
"""

import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
CHART = ROOT / "charts" / "gpu-dra-driver"
FIX = "python -m tests.docs_reference  (or: make docs)"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# The commands that run as a pod's container and read their flags from its environment too.
DAEMONS = frozenset(("kubelet-plugin", "compute-domain-daemon", "compute-domain-controller"))


def flags() -> str:
    from cli import (
        computedomaincontroller,
        computedomaindaemon,
        controller,
        discover,
        doctor,
        plugin,
    )
    from cli.flagtable import FLAGS, GLOBAL

    modules = (plugin, discover, controller, computedomaindaemon, computedomaincontroller, doctor)
    commands = {m.COMMAND: set(m.FLAG_NAMES) for m in modules}
    rows = []
    for flag in FLAGS:
        used = [c for c, names in commands.items() if flag.name in names or flag.name in GLOBAL]
        defaults = {c: flag.default_for(c) for c in used}
        if len(set(defaults.values())) == 1:
            default = _code(next(iter(defaults.values())))
        else:
            default = "; ".join(f"{c}: {_code(d)}" for c, d in defaults.items())
        name = f"`{flag.short}`, `{flag.name}`" if flag.short else f"`{flag.name}`"
        env = f"`{flag.env}`" + (f" or `{flag.also_env}`" if flag.also_env else "")
        if flag.name not in GLOBAL and not DAEMONS & set(used):
            env = "-"  # only the daemons (and the global options) read the environment
        where = "all" if flag.name in GLOBAL else ", ".join(used)
        rows.append((name, where, env, default, flag.help))
    return _table(("flag", "commands", "environment", "default", "meaning"), rows)


def _code(value: str | None) -> str:
    return "-" if value is None else f"`{value}`" if value else '`""`'


def _schema_type(node: dict[str, Any], definitions: dict[str, Any]) -> str:
    ref = node.get("$ref")
    if ref:
        return _schema_type(definitions[ref.rsplit("/", 1)[-1]], definitions)
    if "enum" in node:
        return ", ".join(json.dumps(v) for v in node["enum"])
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    if kinds == ["array"] and "items" in node:
        return f"array of {_schema_type(node['items'], definitions)}"
    return " or ".join(kinds)


def _value_comments(text: str) -> dict[str, str]:
    """The comment right above each key of values.yaml, by dotted path (its first sentence)."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^( *)([A-Za-z][\w-]*):", line)
        if not match:
            pending = [] if not stripped else pending
            continue
        indent = len(match[1])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match[2]))
        if pending:
            comment = " ".join(pending)
            first = re.split(r"(?<=\.)\s", comment, maxsplit=1)[0]
            comments[".".join(k for _, k in stack)] = first
        pending = []
    return comments


def _leaves(
    node: dict[str, Any], definitions: dict[str, Any], path: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    properties = node.get("properties")
    if path and (not properties or path.count(".") >= 2):
        yield path, node
        return
    for key, child in (properties or {}).items():
        yield from _leaves(child, definitions, f"{path}.{key}" if path else key)


def chart_values() -> str:
    import yaml

    schema = json.loads((CHART / "values.schema.json").read_text())
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    comments = _value_comments(values_text)
    definitions = schema.get("definitions", {})
    rows = []
    for path, node in _leaves(schema, definitions):
        default: Any = values
        for key in path.split("."):
            default = default.get(key) if isinstance(default, dict) else None
        comment = comments.get(path) or comments.get(path.rsplit(".", 1)[0], "")
        shown = "-" if default is None else f"`{json.dumps(default)}`"
        rows.append((f"`{path}`", _schema_type(node, definitions), shown, comment))
    return _table(("value", "type", "default", "meaning (values.yaml has the whole comment)"), rows)


def attributes() -> str:
    from driver import DEFAULT_DRIVER_NAME
    from drivers.gpu.model.published import (
        DRIVER_ATTRIBUTES,
        DRIVER_CAPACITIES,
        OPTIONAL_ATTRIBUTES,
        STANDARD_ATTRIBUTES,
        STANDARD_DOMAIN,
    )

    rows = [
        (f"`{DEFAULT_DRIVER_NAME}/{name}`", kind, "yes" if name in OPTIONAL_ATTRIBUTES else "")
        for name, kind in sorted(DRIVER_ATTRIBUTES.items())
    ] + [
        (f"`{STANDARD_DOMAIN}/{name}`", kind, "yes" if name in OPTIONAL_ATTRIBUTES else "")
        for name, kind in sorted(STANDARD_ATTRIBUTES.items())
    ]
    table = _table(("attribute", "type", "absent on hardware without it"), rows)
    capacities = ", ".join(f"`{c}`" for c in sorted(DRIVER_CAPACITIES, key=_natural))
    return f"{table}\n\nCapacities: {capacities}."


def _natural(name: str) -> tuple[str, int]:
    match = re.match(r"^(\D+)(\d*)$", name)
    return (match[1], int(match[2] or -1)) if match else (name, -1)


def metrics() -> str:
    from drivers.computedomain.node import COMPUTE_DOMAIN_PREFIX, COMPUTE_DOMAIN_WHAT
    from drivers.gpu.metrics import Metrics
    from kubeletplugin.metrics import ClaimMetrics

    guest = ClaimMetrics(COMPUTE_DOMAIN_PREFIX, what=COMPUTE_DOMAIN_WHAT)
    return _metrics_table(Metrics().registry, guest.registry)


def compute_domain_metrics() -> str:
    from cluster.computedomain.metrics import ControllerMetrics

    return _metrics_table(ControllerMetrics().registry)


def _metrics_table(*registries: Any) -> str:
    from prometheus_client.metrics import MetricWrapperBase

    rows = []
    # The registry lists its collectors only privately; a labelled family with no series yet
    # keeps its label names on the collector, not in what collect() yields.
    for collector in [c for r in registries for c in list(r._collector_to_names)]:
        if isinstance(collector, MetricWrapperBase):
            found = [
                (collector._name, collector._type, collector._documentation, collector._labelnames)
            ]
        else:
            found = [
                (m.name, m.type, m.documentation, getattr(m, "_labelnames", ()))
                for m in collector.collect()
            ]
        for name, kind, documentation, labels in found:
            exposed = f"{name}_total" if kind == "counter" else name
            label_text = ", ".join(f"`{label}`" for label in labels) or "-"
            rows.append((f"`{exposed}`", str(kind), label_text, documentation))
    return _table(("metric", "type", "labels", "meaning"), sorted(rows))


SECTIONS: dict[str, Callable[[], str]] = {
    "flags": flags,
    "chart-values": chart_values,
    "attributes": attributes,
    "metrics": metrics,
    "compute-domain-metrics": compute_domain_metrics,
}


def _markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- BEGIN GENERATED {name}: {FIX} -->",
        f"<!-- END GENERATED {name} -->",
    )


def regenerate(text: str) -> str:
    """``text`` with each generated section replaced by what its source says now."""
    for name, build in SECTIONS.items():
        begin, end = _markers(name)
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise ValueError(f"{REFERENCE.name}: no generated section {name!r} ({begin})")
        text = f"{text[:start]}{begin}\n{build()}\n{text[stop:]}"
    return text


def main() -> int:
    current = REFERENCE.read_text()
    wanted = regenerate(current)
    if wanted != current:
        REFERENCE.write_text(wanted)
        print(f"rewrote {REFERENCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
