"""What of a device a selector can read: the proof that two devices get the same verdict.

A selector sees a device only through ``device``: its driver, ``allowMultipleAllocations``,
and the attributes and capacities it names. When every use of ``device.attributes[d]`` and
``device.capacity[d]`` names a literal domain and a literal name (``.x``, ``["x"]``,
``has(...x)``, ``"x" in ...``), two devices that agree on the driver, the flag and those
entries get the same verdict, the same runtime error and the same cost, whatever else they
publish (a UUID, an NVLink domain named after the node). Any other use (the domain's map
passed on, iterated, indexed with a computed key, ``device`` itself as a value or rebound
by a macro) reads an unknown part of the device: then there is no such proof, and the
analysis says so with None.
"""

from functools import lru_cache

from driver.tools.cel._ast import Call, Ident, Index, ListLit, Lit, MapLit, Node, Select
from driver.tools.cel._parser import parse

# ("attributes" | "capacity", domain, name)
Read = tuple[str, str, str]

_PLAIN_FIELDS = ("driver", "allowMultipleAllocations")


@lru_cache(maxsize=1024)
def selector_reads(expression: str) -> frozenset[Read] | None:
    """The entries ``expression`` reads of a device, or None when they cannot be bounded.

    Only for an expression that compiles; parse errors are the compiler's to report.
    """
    reads: set[Read] = set()
    try:
        followed = _walk(parse(expression), reads)
    except RecursionError:
        return None
    return frozenset(reads) if followed else None


def _domain(node: Node) -> tuple[str, str] | None:
    """``device.attributes["d"]`` or ``device.capacity["d"]``: (field, domain)."""
    if (
        isinstance(node, Index)
        and isinstance(node.index, Lit)
        and type(node.index.value) is str
        and isinstance(node.operand, Select)
        and node.operand.field in ("attributes", "capacity")
        and isinstance(node.operand.operand, Ident)
        and node.operand.operand.name == "device"
    ):
        return node.operand.field, node.index.value
    return None


def _walk(node: Node, reads: set[Read]) -> bool:
    """Add what ``node`` reads to ``reads``; False for a use of the device not followed."""
    if isinstance(node, Select):
        found = _domain(node.operand)
        if found is not None:
            reads.add((*found, node.field))
            return True
        if isinstance(node.operand, Ident) and node.operand.name == "device":
            return node.field in _PLAIN_FIELDS
        return _walk(node.operand, reads)
    if isinstance(node, Index):
        found = _domain(node.operand)
        if found is not None and isinstance(node.index, Lit) and type(node.index.value) is str:
            reads.add((*found, node.index.value))
            return True
        return _walk(node.operand, reads) and _walk(node.index, reads)
    if isinstance(node, Call):
        if node.name == "@in" and len(node.args) == 2:
            item, container = node.args
            found = _domain(container)
            if found is not None and isinstance(item, Lit) and type(item.value) is str:
                reads.add((*found, item.value))
                return True
        if node.target is not None and not _walk(node.target, reads):
            return False
        return all(_walk(arg, reads) for arg in node.args)
    if isinstance(node, Ident):
        return node.name != "device"
    if isinstance(node, ListLit):
        return all(_walk(item, reads) for item in node.items)
    if isinstance(node, MapLit):
        return all(_walk(k, reads) and _walk(v, reads) for k, v in node.entries)
    return isinstance(node, Lit)
