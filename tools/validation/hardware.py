"""Whether any device of any EKS instance type the driver knows could satisfy a request.

The devices are those ``gpu-dra discover`` publishes on each simulated instance profile, in
each variant (as is, ``--consumable-capacity``, ``--dynamic-mig``), read from
``profiledevices.json`` (written by ``python -m tests.profile_devices``; validate runs
without NVML). A selector is cut into the clauses its ``&&`` joins; a clause that reads what
differs between two nodes of one type (a UUID, a PCI address, the driver version) or reads
the device in a way its text does not show is not judged. Dropping a clause from a
conjunction only widens what it selects, so what is left and selects nothing selects
nothing on a real node of these types either.

The simulator has MIG tables for the A100, H100 and H200 only: the B200's and GB200's MIG
devices are not among these, so a MIG request only they could satisfy is reported (and
``--defined-elsewhere`` makes it a warning).
"""

import difflib
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver import DEFAULT_DRIVER_NAME
from tools.cel import (
    CelCompileError,
    CelDevice,
    CelError,
    CelEvalError,
    compile_selector,
    split_conjuncts,
)
from tools.cel import reads as _parse_reads
from tools.validation.problems import Check, Finding, Severity

DATA = Path(__file__).with_name("profiledevices.json")

# Attributes whose values differ between two nodes of one instance type (or one node's
# reboots): a clause reading one is not judged against the profiles.
NODE_SPECIFIC = frozenset(
    {"uuid", "parentUUID", "pciBusID", "pcieRoot", "driverVersion", "cudaDriverVersion"}
    | {"nvlinkDomain"}
)

_SHOWN_VALUES = 4
_STRING = re.compile(r"""["']([^"'\\]*)["']""")


@dataclass(frozen=True, slots=True)
class Node:
    """One instance type in one of the variants the driver publishes it in."""

    profile: str
    variant: str  # "", "consumable-capacity" or "dynamic-mig"
    devices: tuple[CelDevice, ...]

    @property
    def label(self) -> str:
        return f"{self.profile} ({self.variant})" if self.variant else self.profile


# Both checks below read the same clauses: parse each once.
reads = functools.lru_cache(maxsize=4096)(_parse_reads)


def _frozen(value: Any) -> Any:
    """A published value (a small JSON map) as a key."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


@dataclass(frozen=True, slots=True)
class _Table:
    nodes: tuple[Node, ...]
    devices: tuple[CelDevice, ...]  # every node's, in order
    node_of: tuple[int, ...]  # device -> its node's index
    published: tuple[Mapping[str, Any], ...]  # device -> its JSON form
    driver: str

    @property
    def every(self) -> int:
        return (1 << len(self.devices)) - 1


@functools.cache
def _table() -> _Table:
    """Every profile's devices, read once per process."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    driver = str(data["driver"])
    found = []
    for profile, variants in sorted(data["profiles"].items()):
        for variant, devices in sorted(variants.items()):
            if devices:  # no MIG tables for this GPU in the simulator: no MIG devices
                found.append((profile, variant, devices))
    nodes = tuple(
        Node(profile, variant, tuple(CelDevice.from_api(driver, d) for d in devices))
        for profile, variant, devices in found
    )
    return _Table(
        nodes,
        tuple(device for node in nodes for device in node.devices),
        tuple(n for n, node in enumerate(nodes) for _ in node.devices),
        tuple(d for _, _, devices in found for d in devices),
        driver,
    )


def nodes() -> tuple[Node, ...]:
    return _table().nodes


@dataclass(frozen=True, slots=True)
class Clause:
    """One clause of one selector, judged on its own."""

    owner: str  # "class gpu.nvidia.com" or "the request"
    selector: int  # the selector's index among the owner's
    text: str
    names: tuple[tuple[str, str, bool], ...]  # what it reads, sorted

    def describe(self) -> str:
        return f"{self.text!r} ({self.owner}, selector {self.selector})"


@functools.lru_cache(maxsize=1024)
def _clauses(expression: str) -> tuple[tuple[str, tuple[tuple[str, str, bool], ...]], ...]:
    """The judgeable clauses of one expression with what each reads; none when any part
    of it cannot be read (compiling it is the API check's job)."""
    out = []
    for text in split_conjuncts(expression):
        try:
            what = reads(text)
            compile_selector(text)
        except (CelError, CelCompileError):
            continue  # a clause that does not stand alone: not judged
        if what.opaque or any(name in NODE_SPECIFIC for _, name, _ in what.names):
            continue
        if what.drivers and what.drivers != {DEFAULT_DRIVER_NAME}:
            continue  # another driver's devices: not the profiles' to judge
        out.append((text, tuple(sorted(what.names))))
    return tuple(out)


def ours(expressions: Iterable[str]) -> bool:
    """Whether the selectors pick this driver's devices: they name its driver or domain,
    and compare ``device.driver`` with no other driver's name."""
    named = False
    for expression in expressions:
        for text in split_conjuncts(expression):
            try:
                what = reads(text)
            except CelError:
                return False
            if what.drivers - {DEFAULT_DRIVER_NAME}:
                return False
            named = named or DEFAULT_DRIVER_NAME in what.drivers
            named = named or any(domain == DEFAULT_DRIVER_NAME for domain, _, _ in what.names)
    return named


def clauses(selectors: Sequence[tuple[str, Sequence[str]]]) -> list[Clause]:
    """The clauses to judge of each owner's selectors, in order."""
    return [
        Clause(owner, i, text, names)
        for owner, expressions in selectors
        for i, expression in enumerate(expressions)
        for text, names in _clauses(expression)
    ]


@dataclass(frozen=True, slots=True)
class _Verdicts:
    """A clause on every device, as bit masks over the table's devices."""

    true: int
    error: int
    first_error: str


def _raw(table: Mapping[str, Any], driver: str, domain: str, name: str) -> Any:
    """As CelDevice reads it: the driver's own names may be written unqualified."""
    value = table.get(name) if domain == driver else None
    return value if value is not None else table.get(f"{domain}/{name}")


@functools.lru_cache(maxsize=4096)
def _verdicts(text: str, names: tuple[tuple[str, str, bool], ...]) -> _Verdicts:
    """A clause reads only ``names``, the driver and allowMultipleAllocations, so devices
    that agree on those get one evaluation."""
    selector = compile_selector(text)
    table = _table()
    groups: dict[Any, tuple[int, int]] = {}  # what the clause reads -> (a device, mask)
    for i, device in enumerate(table.published):
        read = tuple(
            _frozen(_raw(device.get("capacity" if c else "attributes") or {}, table.driver, d, n))
            for d, n, c in names
        )
        key = (read, bool(device.get("allowMultipleAllocations")))
        first, mask = groups.get(key, (i, 0))
        groups[key] = (first, mask | 1 << i)
    true = error = 0
    first_error = ""
    for first, mask in groups.values():
        try:
            if selector.matches(table.devices[first]):
                true |= mask
        except CelEvalError as exc:
            error |= mask
            first_error = first_error or str(exc) or type(exc).__name__
    return _Verdicts(true, error, first_error)


def _bits(mask: int) -> Iterator[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


@dataclass(frozen=True, slots=True)
class Unsatisfied:
    """Why no device of any profile passes every clause."""

    clause: Clause | None  # the clause to fix (None: only a combination fails)
    message: str


Where = tuple[int, int]  # (node, device) indexes into nodes()


def _read(device: CelDevice, domain: str, name: str, capacity: bool) -> object:
    if capacity:
        return device.capacity_value(domain, name)
    return device.attribute(domain, name)


def _shown(value: object, name: str, capacity: bool) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if capacity and name == "memory":
        return f"{int(str(value)) / 2**30:.1f}Gi" if str(value).isdigit() else str(value)
    return str(value)


def _closeness(shown: str, literals: Sequence[str]) -> tuple[bool, float]:
    """Contains (or is contained in) a literal first, then the closest spelling."""
    text = shown.strip('"').lower()
    contains = any(lit and (lit.lower() in text or text in lit.lower()) for lit in literals)
    ratio = max(
        (difflib.SequenceMatcher(None, text, lit.lower()).ratio() for lit in literals),
        default=0.0,
    )
    return contains, ratio


def _values(clause: Clause, among: int) -> str:
    """What the devices have for what a clause reads: strings closest to its literals
    first, numbers as their range; with the instance types that have each."""
    literals = _STRING.findall(clause.text)
    table = _table()
    parts = []
    for domain, name, capacity in clause.names:
        seen: dict[str, list[str]] = {}
        order: dict[str, object] = {}
        for i in _bits(among):
            try:
                value = _read(table.devices[i], domain, name, capacity)
            except (KeyError, CelEvalError):
                continue
            shown = _shown(value, name, capacity)
            order.setdefault(shown, value)
            profiles = seen.setdefault(shown, [])
            profile = table.nodes[table.node_of[i]].profile
            if profile not in profiles:
                profiles.append(profile)
        if not seen:
            what = "capacity" if capacity else "attribute"
            parts.append(f"no device there has {what} {domain}/{name}")
            continue

        def where(shown: str, seen: dict[str, list[str]] = seen) -> str:
            profiles = seen[shown]
            return f"{shown} ({', '.join(profiles[:2])}{', ...' if len(profiles) > 2 else ''})"

        if all(not isinstance(v, str | bool) for v in order.values()):
            ranked = sorted(seen, key=lambda s: order[s])  # type: ignore[arg-type,return-value]
            parts.append(
                f"{name} there is {where(ranked[0])}"
                if len(ranked) == 1
                else f"{name} there ranges from {where(ranked[0])} to {where(ranked[-1])}"
            )
            continue
        ranked = sorted(seen, key=lambda s: _closeness(s, literals), reverse=True)
        listed = ", ".join(where(s) for s in ranked[:_SHOWN_VALUES])
        more = f" and {len(seen) - _SHOWN_VALUES} more" if len(seen) > _SHOWN_VALUES else ""
        parts.append(f"{name} there is {listed}{more}")
    return "; ".join(parts)


def _passing(clauses: Sequence[Clause]) -> int:
    """The devices every clause is true on, as a mask."""
    mask = _table().every
    for clause in clauses:
        mask &= _verdicts(clause.text, clause.names).true
    return mask


def _device(i: int) -> str:
    table = _table()
    return f"{table.nodes[table.node_of[i]].label} device {table.devices[i].name}"


def judge(
    clauses: Sequence[Clause], within: Sequence[Clause] = (), scope: str = "device"
) -> Unsatisfied | None:
    """None when some device that passes ``within`` (a class's clauses) passes every clause
    too. ``scope`` names those devices in a message."""
    among = _passing(within)
    if not clauses or not among or among & _passing(clauses):
        return None  # nothing passes ``within``: reported there
    verdicts = [_verdicts(c.text, c.names) for c in clauses]
    for clause, verdict in zip(clauses, verdicts, strict=True):
        if verdict.true & among:
            continue
        elsewhere = verdict.true & ~among
        hint = (
            f"; it holds only on devices outside this class, e.g. {_device(next(_bits(elsewhere)))}"
            if elsewhere
            else ""
        )
        if verdict.error & among == among:
            return Unsatisfied(
                clause,
                f"{clause.describe()} fails at runtime on every {scope} ({verdict.first_error})"
                + (hint or ": guard what some devices lack with has() or `in`"),
            )
        return Unsatisfied(
            clause,
            f"{clause.describe()} is false on every {scope}; {_values(clause, among)}{hint}",
        )
    # Each clause holds somewhere: the device that fails the fewest.
    closest = min(_bits(among), key=lambda i: sum(not (v.true >> i) & 1 for v in verdicts))
    failing = [
        f"{c.describe()} " + ("fails at runtime" if (v.error >> closest) & 1 else "is false")
        for c, v in zip(clauses, verdicts, strict=True)
        if not (v.true >> closest) & 1
    ]
    return Unsatisfied(
        None,
        f"each clause holds on some {scope}, but none on the same one; closest: "
        f"{_device(closest)}, where " + " and ".join(failing),
    )


def most_on_one_node(clauses: Sequence[Clause]) -> tuple[int, list[str]]:
    """The most devices one node has that pass every clause, and the nodes with that many
    (a request's devices are distinct, and all on one node)."""
    table = _table()
    per_node: dict[int, int] = {}
    for i in _bits(_passing(clauses)):
        per_node[table.node_of[i]] = per_node.get(table.node_of[i], 0) + 1
    most = max(per_node.values(), default=0)
    return most, [table.nodes[n].label for n, c in per_node.items() if c == most]


def profile_count() -> int:
    return len({node.profile for node in nodes()})


# ---- the findings -------------------------------------------------------------------


def expressions(selectors: Any) -> list[str]:
    """The CEL expressions of a class's or request's ``selectors`` (others skipped: the
    schema and the rules report them)."""
    out = []
    for selector in selectors if isinstance(selectors, list) else []:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            out.append(expression)
    return out


def _known() -> str:
    return (
        f"the {profile_count()} EKS instance types validate knows (with their MIG and shared "
        "variants)"
    )


_ELSEWHERE = " (--defined-elsewhere if your nodes have other hardware)"


def check_class(path: str, selectors: Any) -> Finding | None:
    """A DeviceClass of this driver whose selectors no device of any profile passes."""
    own = expressions(selectors)
    if not ours(own):
        return None
    unsatisfied = judge(clauses([("the class", own)]))
    if unsatisfied is None:
        return None
    clause = unsatisfied.clause
    return Finding(
        f"{path}.selectors[{clause.selector}].cel.expression" if clause else f"{path}.selectors",
        f"no device of {_known()} passes this class's selectors: {unsatisfied.message}"
        + _ELSEWHERE,
        check=Check.HARDWARE,
    )


def check_request(
    path: str,
    class_name: str,
    class_selectors: Sequence[str],
    request: Mapping[str, Any],
    *,
    alternative: bool = False,
) -> Finding | None:
    """A request (``exactly`` or one ``firstAvailable`` alternative, at ``path``) no device
    of any profile satisfies with its class, or that asks one node for more than any has.
    An alternative that cannot be met is a warning: another one may be."""
    own = expressions(request.get("selectors"))
    raw = request.get("count")
    mode = request.get("allocationMode") or "ExactCount"
    count = raw if isinstance(raw, int) and not isinstance(raw, bool) else 1
    many = mode == "ExactCount" and count > 1
    if not own and not many:
        return None  # satisfied when its class is, which is judged at the class
    owner = f"class {class_name}"
    if not ours([*class_selectors, *own]):
        return None
    of_class = clauses([(owner, class_selectors)])
    if judge(of_class) is not None:
        return None  # the class itself selects nothing: reported at the class
    severity = Severity.WARNING if alternative else Severity.ERROR
    unsatisfied = judge(clauses([("the request", own)]), of_class, f"device of {owner}")
    if unsatisfied is not None:
        clause = unsatisfied.clause
        where = (
            f"{path}.selectors[{clause.selector}].cel.expression"
            if clause is not None and clause.owner == "the request"
            else f"{path}.selectors"
            if clause is None and own
            else f"{path}.deviceClassName"
        )
        what = "this alternative is never chosen" if alternative else "the claim stays pending"
        return Finding(
            where,
            f"no device of {_known()} passes class {class_name}'s selectors and this "
            f"request's, so {what}: {unsatisfied.message}" + _ELSEWHERE,
            severity,
            Check.HARDWARE,
        )
    if not many:
        return None
    most, nodes_with_most = most_on_one_node(of_class + clauses([("the request", own)]))
    if count <= most:
        return None
    return Finding(
        f"{path}.count",
        f"{count} is more than one node has: at most {most} devices of one node pass these "
        f"selectors ({', '.join(nodes_with_most[:3])}), among {_known()}; a claim's devices "
        "come from one node" + _ELSEWHERE,
        severity,
        Check.HARDWARE,
    )


def device_types(
    class_selectors: Sequence[str], request_selectors: Sequence[str]
) -> frozenset[str]:
    """The ``type`` attributes (gpu, mig) of the devices of every profile that pass a class's
    selectors and a request's: what a config on that request meets at prepare. Empty when the
    selectors are not this driver's, or no device passes (reported elsewhere)."""
    if not ours([*class_selectors, *request_selectors]):
        return frozenset()
    table = _table()
    passing = _passing(clauses([("class", class_selectors), ("the request", request_selectors)]))
    found = set()
    for i in _bits(passing):
        try:
            found.add(str(table.devices[i].attribute(table.driver, "type")))
        except KeyError:
            continue
    return frozenset(found)
