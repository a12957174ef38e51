"""Mistakes the API server accepts but that can never select a device, found on the AST.

Kubernetes types every attribute as ``dyn``, so ``compile_selector`` (like the API server)
lets ``device.attributes["gpu.nvidia.com"].prodcutName`` or ``memory == "80Gi"`` through;
they fail on every device at allocation time. Given what a driver publishes (a
:class:`Schema`), this pass finds them before: names that are not published (with the
closest published name), comparisons across types, methods the value's type lacks, and
``quantity()``/``semver()`` literals that do not parse. Every finding starts with the
``line:column`` of the offending node, as compile errors do.
"""

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from driver.common.quantity import Quantity
from driver.common.semver import Semver, SemverError
from tools.cel import _functions as fn_table
from tools.cel._ast import Call, Ident, Index, ListLit, Lit, MapLit, Node, Select
from tools.cel._errors import position
from tools.cel._types import BOOL, INT, QUANTITY, SEMVER, STRING, Ty, unify
from tools.cel._values import UInt

# DeviceAttribute value kinds -> the static type CEL gives the value.
_KIND_TYPES = {"string": STRING, "int": INT, "bool": BOOL, "version": SEMVER}
_KIND_WORDS = {"string": "a string", "int": "an int", "bool": "a bool", "version": "a version"}
_EQUALITY = frozenset({"_==_", "_!=_"})
_ORDERING = frozenset({"_<_", "_<=_", "_>_", "_>=_"})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


@dataclass(frozen=True, slots=True)
class Schema:
    """What drivers publish: attribute kinds and capacity names, by domain."""

    attributes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    capacities: Mapping[str, frozenset[str]] = field(default_factory=dict)
    drivers: frozenset[str] = frozenset()
    # Attribute names some devices lack (in any domain that has them).
    optional: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Lint:
    offset: int
    message: str  # starts with "line:column: "
    warning: bool = False  # fails on some devices only, not on every one


@dataclass(frozen=True, slots=True)
class _Value:
    """A node whose type the schema knows: an attribute (kind) or a capacity (quantity)."""

    what: str  # "attribute memory" or "capacity memory"
    ty: Ty
    kind: str  # "string", "int", "bool", "version" or "quantity"


def suggest(name: str, known: list[str] | set[str] | frozenset[str]) -> str | None:
    """The published name a typo most likely meant, or None."""
    by_case = {k.lower(): k for k in known}
    if name.lower() in by_case:
        return by_case[name.lower()]
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
    if close:
        return close[0]
    # An abbreviation: mem for memory, cuda for cudaDriverVersion is too vague (two match).
    # Names that extend another match (memorySlice0 extends memory) do not make it vague.
    longer = sorted(
        (k for k in known if len(name) >= 3 and k.lower().startswith(name.lower())), key=len
    )
    if longer and all(k.lower().startswith(longer[0].lower()) for k in longer):
        return longer[0]
    return None


def _did_you_mean(name: str | None) -> str:
    return f"; did you mean {name}?" if name else ""


_QUANTITY_FIXES = (
    (re.compile(r"\s+"), ""),
    (re.compile(r"([KMGTPE])iB$", re.IGNORECASE), r"\1i"),  # 40GiB -> 40Gi
    (re.compile(r"([KMGTPE])B$", re.IGNORECASE), r"\1"),  # 40GB -> 40G
)


def _fixed_quantity(text: str) -> str | None:
    fixed = text
    for pattern, repl in _QUANTITY_FIXES:
        fixed = pattern.sub(repl, fixed)
    # Binary suffixes are Ki Mi Gi ...: an upper-case letter and a lower-case i.
    fixed = re.sub(r"([kmgtpe])(i)$", lambda m: m[1].upper() + "i", fixed, flags=re.IGNORECASE)
    if fixed == text:
        return None
    try:
        Quantity.parse(fixed)
    except ValueError:
        return None
    return fixed


def _fixed_semver(text: str) -> str | None:
    try:
        return str(Semver.parse(text, normalize=True))
    except SemverError:
        return None


class _Linter:
    def __init__(self, text: str, schema: Schema) -> None:
        self._text = text
        self._schema = schema
        self.found: list[Lint] = []
        # Optional attributes read, (domain, name) -> first node; and those guarded by
        # `"name" in device.attributes[domain]` or has(device.attributes[domain].name).
        self._read: dict[tuple[str, str], Node] = {}
        self._guarded: set[tuple[str, str]] = set()
        self._in_has: set[int] = set()

    def report(self, node: Node, message: str) -> None:
        self.found.append(Lint(node.pos, f"{position(self._text, node.pos)}: {message}"))

    # -- what a node is ---------------------------------------------------------------------

    @staticmethod
    def _device_map(node: Node) -> str | None:
        """``device.attributes`` or ``device.capacity``: which; None for anything else."""
        if (
            isinstance(node, Select)
            and node.field in ("attributes", "capacity")
            and isinstance(node.operand, Ident)
            and node.operand.name == "device"
        ):
            return node.field
        return None

    def _domain_of(self, node: Node) -> tuple[str, str] | None:
        """``device.attributes["d"]``: ("attributes", "d"); None for anything else."""
        if isinstance(node, Index) and isinstance(node.index, Lit):
            which = self._device_map(node.operand)
            if which is not None and type(node.index.value) is str:
                return which, node.index.value
        return None

    def _member(self, node: Node) -> tuple[tuple[str, str], str] | None:
        """``device.attributes["d"].name`` or ``["name"]``: ((which, domain), name)."""
        if isinstance(node, Select):
            domain = self._domain_of(node.operand)
            return (domain, node.field) if domain else None
        if isinstance(node, Index) and isinstance(node.index, Lit):
            domain = self._domain_of(node.operand)
            if domain and type(node.index.value) is str:
                return domain, node.index.value
        return None

    def _value(self, node: Node) -> _Value | None:
        member = self._member(node)
        if member is None:
            return None
        (which, domain), name = member
        if which == "capacity":
            if name in self._schema.capacities.get(domain, frozenset()):
                return _Value(f"capacity {name}", QUANTITY, "quantity")
            return None
        kind = self._schema.attributes.get(domain, {}).get(name)
        if kind is None:
            return None
        return _Value(f"attribute {name}", _KIND_TYPES[kind], kind)

    @staticmethod
    def _literal_type(node: Node) -> tuple[Ty, str] | None:
        """The static type of a literal, or of ``quantity(...)``/``semver(...)``."""
        if isinstance(node, Lit):
            value = node.value
            names: dict[type, tuple[Ty, str]] = {
                bool: (BOOL, "a bool"),
                int: (INT, "an int"),
                UInt: (Ty("uint"), "a uint"),
                float: (Ty("double"), "a double"),
                str: (STRING, "a string"),
            }
            return names.get(type(value))
        if isinstance(node, Call) and node.target is None:
            if node.name == "quantity":
                return QUANTITY, "a quantity"
            if node.name == "semver":
                return SEMVER, "a version"
        return None

    # -- checks -----------------------------------------------------------------------------

    def _record_optional(self, node: Node) -> None:
        member = self._member(node)
        if member is None or id(node) in self._in_has:
            return
        (which, domain), name = member
        if which == "attributes" and name in self._schema.optional:
            self._read.setdefault((domain, name), node)

    def _record_guard(self, node: Call) -> None:
        guarded: Node | None = None
        if node.name == "has" and node.target is None and len(node.args) == 1:
            guarded = node.args[0]
            self._in_has.add(id(guarded))
            member = self._member(guarded)
            if member is not None:
                self._guarded.add((member[0][1], member[1]))
        elif node.name == "@in" and len(node.args) == 2 and isinstance(node.args[0], Lit):
            found = self._domain_of(node.args[1])
            if found is not None and type(node.args[0].value) is str:
                self._guarded.add((found[1], node.args[0].value))

    def unguarded(self) -> None:
        for (domain, name), node in self._read.items():
            if (domain, name) in self._guarded:
                continue
            self.found.append(
                Lint(
                    node.pos,
                    f"{position(self._text, node.pos)}: {name} is absent on GPUs without it, "
                    "where this expression fails and stops the claim's allocation on that "
                    f'node: guard it with "{name}" in device.attributes["{domain}"] && ...',
                    warning=True,
                )
            )

    def _check_member(self, node: Node) -> None:
        member = self._member(node)
        if member is None:
            return
        (which, domain), name = member
        if which == "capacity":
            known_capacities = self._schema.capacities.get(domain)
            if known_capacities is not None and name not in known_capacities:
                self.report(
                    node,
                    f"{domain} publishes no capacity {name!r} (it has: "
                    f"{', '.join(sorted(known_capacities))})"
                    + _did_you_mean(suggest(name, known_capacities)),
                )
            return
        attributes = self._schema.attributes.get(domain)
        if attributes is not None and name not in attributes:
            self.report(
                node,
                f"{domain} publishes no attribute {name!r}"
                + _did_you_mean(suggest(name, set(attributes))),
            )

    def _check_domain(self, node: Node) -> None:
        found = self._domain_of(node)
        if found is None:
            return
        which, domain = found
        known = self._schema.attributes if which == "attributes" else self._schema.capacities
        if domain in known:
            return
        qualified, slash, ident = domain.rpartition("/")
        if slash and qualified in known:
            self.report(
                node,
                f"device.{which} is keyed by domain alone: write "
                f'device.{which}["{qualified}"].{ident}, not device.{which}["{domain}"]',
            )
            return
        near = suggest(domain, set(known))
        if near is not None:
            self.report(node, f"no driver publishes domain {domain!r}; did you mean {near}?")

    def _check_unqualified(self, node: Select) -> None:
        """``device.attributes.productName``: the domain level is missing."""
        which = self._device_map(node.operand)
        if which is None:
            return
        known = self._schema.attributes if which == "attributes" else self._schema.capacities
        if node.field in known:
            return
        owners = sorted(d for d, names in known.items() if node.field in names)
        if owners:
            self.report(
                node,
                f"device.{which} is keyed by domain: write "
                f'device.{which}["{owners[0]}"].{node.field}',
            )

    def _check_literal_call(self, node: Call) -> None:
        if node.target is not None or not node.args or not isinstance(node.args[0], Lit):
            return
        text = node.args[0].value
        if type(text) is not str:
            return
        if node.name == "quantity" and len(node.args) == 1:
            try:
                Quantity.parse(text)
            except ValueError:
                fixed = _fixed_quantity(text)
                hint = f'did you mean quantity("{fixed}")?' if fixed else "e.g. 40Gi, 512Mi, 80G"
                self.report(
                    node.args[0],
                    f"quantity({text!r}) fails on every device: not a quantity; {hint}",
                )
        elif node.name == "semver":
            normalize = (
                len(node.args) == 2
                and isinstance(node.args[1], Lit)
                and (node.args[1].value is True)
            )
            try:
                Semver.parse(text, normalize)
            except SemverError as err:
                fixed = _fixed_semver(text)
                hint = f'; did you mean semver("{fixed}")?' if fixed and fixed != text else ""
                self.report(node.args[0], f"semver({text!r}) fails on every device: {err}{hint}")

    def _check_comparison(self, node: Call) -> None:
        if node.name not in _EQUALITY | _ORDERING or len(node.args) != 2:
            return
        for mine, other in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            value = self._value(mine)
            if value is None:
                continue
            if node.name in _ORDERING and value.kind in ("version", "quantity"):
                ctor = "semver" if value.kind == "version" else "quantity"
                self.report(
                    node,
                    f"{value.what} is {_KIND_WORDS.get(value.kind, 'a quantity')}: "
                    f"compare with {ctor}(...) through compareTo, isGreaterThan or "
                    f"isLessThan, not {node.name.strip('_')}",
                )
                return
            literal = self._literal_type(other)
            if literal is None:
                continue
            ty, words = literal
            numeric = {value.ty.name, ty.name} <= {"int", "uint", "double"}
            if ty != value.ty and not numeric:
                advice = ""
                if value.kind == "version" and ty == STRING and isinstance(other, Lit):
                    advice = f'; write semver("{other.value}")'
                elif value.kind == "int" and ty == STRING:
                    advice = "; write the number without quotes"
                elif value.kind == "quantity":
                    advice = '; write quantity("...")'
                else:
                    advice = f"; compare it with {_KIND_WORDS.get(value.kind, 'a quantity')}"
                self.report(
                    node,
                    f"{value.what} is {_KIND_WORDS.get(value.kind, 'a quantity')}, "
                    f"compared with {words}: never true{advice}",
                )
            return

    def _check_method(self, node: Call) -> None:
        if node.target is None or node.name in _MACROS:
            return
        value = self._value(node.target)
        if value is None:
            return
        sigs = fn_table.SIGS.get(node.name, [])
        if not any(s.member and s.params and unify(s.params[0], value.ty, {}) for s in sigs):
            methods = sorted(
                n
                for n, overloads in fn_table.SIGS.items()
                if n[0].isalpha()
                and any(
                    s.member and s.params and unify(s.params[0], value.ty, {}) for s in overloads
                )
            )
            self.report(
                node,
                f"{value.what} is {_KIND_WORDS.get(value.kind, 'a quantity')}: it has no "
                f"method {node.name}()"
                + (
                    f" (it has: {', '.join(m + '()' for m in methods)})"
                    if methods
                    else " (it has none: use operators such as == and <)"
                ),
            )

    def _check_in(self, node: Call) -> None:
        if node.name != "@in" or len(node.args) != 2:
            return
        key, container = node.args
        found = self._domain_of(container)
        if found is None or not isinstance(key, Lit) or type(key.value) is not str:
            return
        which, domain = found
        known: Mapping[str, object] | frozenset[str] | None
        known = (
            self._schema.attributes.get(domain)
            if which == "attributes"
            else self._schema.capacities.get(domain)
        )
        if known is not None and key.value not in known:
            self.report(
                key,
                f"{domain} publishes no {which[:-1] if which == 'attributes' else which} "
                f"{key.value!r}" + _did_you_mean(suggest(key.value, set(known))),
            )

    def _check_driver(self, node: Call) -> None:
        if node.name not in _EQUALITY or not self._schema.drivers:
            return
        for mine, other in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            if (
                isinstance(mine, Select)
                and mine.field == "driver"
                and isinstance(mine.operand, Ident)
                and mine.operand.name == "device"
                and isinstance(other, Lit)
                and type(other.value) is str
                and other.value not in self._schema.drivers
            ):
                near = suggest(other.value, self._schema.drivers)
                if near is not None:
                    self.report(other, f"no driver is named {other.value!r}; did you mean {near}?")

    # -- walk -------------------------------------------------------------------------------

    def visit(self, node: Node) -> None:
        if isinstance(node, Call):
            self._record_guard(node)  # before the children: has()'s argument is no read
        for child in _children(node):
            self.visit(child)
        if isinstance(node, Select):
            self._check_member(node)
            self._check_unqualified(node)
            self._record_optional(node)
        elif isinstance(node, Index):
            self._check_member(node)
            self._check_domain(node)
            self._record_optional(node)
        elif isinstance(node, Call):
            self._check_literal_call(node)
            self._check_comparison(node)
            self._check_method(node)
            self._check_in(node)
            self._check_driver(node)


def _children(node: Node) -> Iterator[Node]:
    if isinstance(node, (Select,)):
        yield node.operand
    elif isinstance(node, Index):
        yield node.operand
        yield node.index
    elif isinstance(node, Call):
        if node.target is not None:
            yield node.target
        yield from node.args
    elif isinstance(node, ListLit):
        yield from node.items
    elif isinstance(node, MapLit):
        for key, value in node.entries:
            yield key
            yield value


def lint_ast(text: str, tree: Node, schema: Schema) -> list[Lint]:
    """Every finding in a parsed selector, in source order."""
    linter = _Linter(text, schema)
    linter.visit(tree)
    linter.unguarded()
    # A member that is both unpublished and compared is reported once, for the name.
    seen: set[int] = set()
    unique = []
    for lint in sorted(linter.found, key=lambda f: f.offset):
        if lint.offset not in seen:
            seen.add(lint.offset)
            unique.append(lint)
    return unique
