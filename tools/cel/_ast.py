"""The small AST that the compiler type-checks and turns into closures.

Every node carries the source offset that its ``line:column`` messages point at: the
operator of an operation, the ``.`` of a selection, the ``[`` of an index, the ``(`` of a
call.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lit:
    pos: int
    value: object


@dataclass(frozen=True, slots=True)
class Ident:
    pos: int
    name: str


@dataclass(frozen=True, slots=True)
class Select:
    pos: int
    operand: "Node"
    field: str


@dataclass(frozen=True, slots=True)
class Index:
    pos: int
    operand: "Node"
    index: "Node"


@dataclass(frozen=True, slots=True)
class Call:
    """A function call; operators are calls too (``_+_``, ``_&&_``, ``!_``, ``_?_:_``)."""

    pos: int
    name: str
    target: "Node | None"
    args: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class ListLit:
    pos: int
    items: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class MapLit:
    pos: int
    entries: tuple[tuple["Node", "Node"], ...]


Node = Lit | Ident | Select | Index | Call | ListLit | MapLit
