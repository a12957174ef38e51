"""What of a device a selector reads: the names it reads by literal, the drivers it compares
``device.driver`` with, or that it reads the device some other way (opaque).

Two users: ``validate`` judges and names one clause at a time against the devices instance
profiles publish, and the allocator shares one verdict among devices that agree on what a
selector reads (:func:`selector_reads`). A selector sees a device only through ``device``:
its driver, ``allowMultipleAllocations``, and the attributes and capacities it names. When
every use of ``device.attributes[d]`` and ``device.capacity[d]`` names a literal domain and
a literal name (``.x``, ``["x"]``, ``has(...x)``, ``"x" in ...``), two devices that agree
on the driver, the flag and those entries get the same verdict, the same runtime error and
the same cost, whatever else they publish (a UUID, an NVLink domain named after the node).
Any other use (the domain's map passed on, iterated, indexed with a computed key, ``device``
itself as a value or rebound by a macro) reads an unknown part of the device: opaque.
"""

from dataclasses import dataclass
from functools import lru_cache

from tools.cel._ast import Call, Ident, Index, ListLit, Lit, MapLit, Node, Select
from tools.cel._errors import CelError
from tools.cel._parser import parse

# ("attributes" | "capacity", domain, name)
Read = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Reads:
    """What a clause reads of the device."""

    # (domain, name, capacity) for each attribute or capacity named by a literal
    names: frozenset[tuple[str, str, bool]]
    # The strings ``device.driver`` is compared with (``==``, ``!=``, ``in [...]``).
    drivers: frozenset[str]
    # A domain's map or the device used some other way (a computed name, a macro over a
    # domain, cel.bind of the device): what the clause reads cannot be told from its text.
    opaque: bool


def _domain_map(node: Node) -> tuple[str, bool] | None:
    """``device.attributes["d"]`` or ``device.capacity["d"]``: (d, whether capacity)."""
    if (
        isinstance(node, Index)
        and isinstance(node.index, Lit)
        and isinstance(node.index.value, str)
        and isinstance(node.operand, Select)
        and node.operand.field in ("attributes", "capacity")
        and isinstance(node.operand.operand, Ident)
        and node.operand.operand.name == "device"
    ):
        return node.index.value, node.operand.field == "capacity"
    return None


def _is_driver(node: Node) -> bool:
    return (
        isinstance(node, Select)
        and node.field == "driver"
        and isinstance(node.operand, Ident)
        and node.operand.name == "device"
    )


class _Scan:
    def __init__(self) -> None:
        self.names: set[tuple[str, str, bool]] = set()
        self.drivers: set[str] = set()
        self.opaque = False

    def visit(self, node: Node) -> None:
        named = self._named(node)
        if named is not None:
            self.names.add(named)
            return
        if isinstance(node, Call) and node.name in ("_==_", "_!=_", "@in") and node.target is None:
            left, right = node.args[0], node.args[-1]
            if _is_driver(left) or _is_driver(right):
                other = right if _is_driver(left) else left
                items = other.items if isinstance(other, ListLit) else (other,)
                self.drivers |= {
                    i.value for i in items if isinstance(i, Lit) and isinstance(i.value, str)
                }
        if _domain_map(node) is not None or (isinstance(node, Ident) and node.name == "device"):
            self.opaque = True  # reached as a whole, not through one literal name
            return
        if isinstance(node, Select) and _is_driver(node):
            return
        if (
            isinstance(node, Select)
            and isinstance(node.operand, Ident)
            and node.operand.name == "device"
        ):
            if node.field in ("attributes", "capacity"):
                self.opaque = True
            return
        for child in _children(node):
            self.visit(child)

    @staticmethod
    def _named(node: Node) -> tuple[str, str, bool] | None:
        """An attribute or capacity read by a literal name, including ``"n" in`` a domain."""
        if isinstance(node, Select):
            domain = _domain_map(node.operand)
            if domain is not None:
                return domain[0], node.field, domain[1]
        if (
            isinstance(node, Index)
            and isinstance(node.index, Lit)
            and isinstance(node.index.value, str)
        ):
            domain = _domain_map(node.operand)
            if domain is not None:
                return domain[0], node.index.value, domain[1]
        if isinstance(node, Call) and node.name == "@in" and len(node.args) == 2:
            item, container = node.args
            domain = _domain_map(container)
            if domain is not None and isinstance(item, Lit) and isinstance(item.value, str):
                return domain[0], item.value, domain[1]
        return None


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Select):
        return (node.operand,)
    if isinstance(node, Index):
        return (node.operand, node.index)
    if isinstance(node, Call):
        return ((node.target,) if node.target is not None else ()) + node.args
    if isinstance(node, ListLit):
        return node.items
    if isinstance(node, MapLit):
        return tuple(part for entry in node.entries for part in entry)
    return ()


def reads(expression: str) -> Reads:
    """What ``expression`` reads of the device; CelError when it does not parse."""
    try:
        tree = parse(expression)
    except RecursionError as exc:
        raise CelError("expression nests too deeply for this tool") from exc
    scan = _Scan()
    scan.visit(tree)
    return Reads(frozenset(scan.names), frozenset(scan.drivers), scan.opaque)


@lru_cache(maxsize=1024)
def selector_reads(expression: str) -> frozenset[Read] | None:
    """The entries ``expression`` reads of a device, or None when they cannot be bounded
    (opaque, or too deeply nested to walk). Only for an expression that compiles; parse
    errors are the compiler's to report."""
    try:
        found = reads(expression)
    except CelError:
        return None
    if found.opaque:
        return None
    return frozenset(
        ("capacity" if capacity else "attributes", domain, name)
        for domain, name, capacity in found.names
    )
