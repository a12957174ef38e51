"""A selector cut into the clauses its top-level ``&&`` joins, and what each clause reads.

CEL's ``&&`` is commutative even with errors (``false && error`` is false either way round),
so a device is selected exactly when every clause is true on it: each clause can be judged,
and named in a message, on its own. A clause is cut from the source text, so a message
quotes what the user wrote.
"""

from dataclasses import dataclass

from driver.tools.cel._ast import Call, Ident, Index, ListLit, Lit, MapLit, Node, Select
from driver.tools.cel._errors import CelError
from driver.tools.cel._parser import parse

_OPEN = "([{"
_CLOSE = ")]}"


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


def _string_end(text: str, i: int) -> int:
    """The index after the string literal that starts at ``text[i]`` (a quote)."""
    quote = text[i]
    if text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        return len(text) if end < 0 else end + 3
    raw = i > 0 and text[i - 1] in "rR"
    j = i + 1
    while j < len(text) and text[j] != quote:
        j += 2 if text[j] == "\\" and not raw else 1
    return j + 1


def _top_level(text: str) -> tuple[list[int], bool]:
    """The offsets of the ``&&`` outside brackets and strings, and whether ``||`` or ``?``
    also appears there (which bind looser: then ``&&`` does not join the whole)."""
    cuts: list[int] = []
    looser = False
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and text.startswith("&&", i):
            cuts.append(i)
            i += 2
            continue
        elif depth == 0 and (text.startswith("||", i) or c == "?"):
            looser = True
        i += 1
    return cuts, looser


def _unwrapped(text: str) -> str | None:
    """``text`` without the parentheses around all of it, or None when it has none."""
    if not (text.startswith("(") and text.endswith(")")):
        return None
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        depth += c in _OPEN
        depth -= c in _CLOSE
        if depth == 0 and i < len(text) - 1:
            return None  # "(a) && (b)": the first parenthesis closes early
        i += 1
    return text[1:-1].strip()


def split_conjuncts(expression: str) -> list[str]:
    """The clauses of ``expression`` joined by a top-level ``&&``, in order, each as written
    (outer parentheses removed); the whole expression when it is no such conjunction."""
    text = expression.strip()
    inner = _unwrapped(text)
    if inner is not None:
        return split_conjuncts(inner)
    cuts, looser = _top_level(text)
    if not cuts or looser:
        return [text]
    bounds = [0, *(c + 2 for c in cuts)]
    ends = [*cuts, len(text)]
    parts: list[str] = []
    for start, end in zip(bounds, ends, strict=True):
        parts += split_conjuncts(text[start:end])
    return parts


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
