"""Static CEL types for the compile-time check, and the signature notation of the function table."""

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ty:
    name: str
    args: tuple["Ty", ...] = ()

    def __str__(self) -> str:
        if self.args:
            return f"{self.name}({', '.join(str(a) for a in self.args)})"
        return self.name


DYN = Ty("dyn")
BOOL = Ty("bool")
INT = Ty("int")
UINT = Ty("uint")
DOUBLE = Ty("double")
STRING = Ty("string")
BYTES = Ty("bytes")
NULL = Ty("null_type")
TYPE = Ty("type")
SEMVER = Ty("kubernetes.Semver")
QUANTITY = Ty("kubernetes.Quantity")
DEVICE = Ty("device")
NUMBERS = frozenset({INT, UINT, DOUBLE})
_PARAMS = frozenset({"A", "B"})


def list_of(elem: Ty) -> Ty:
    return Ty("list", (elem,))


def map_of(key: Ty, value: Ty) -> Ty:
    return Ty("map", (key, value))


_ALIASES = {"Semver": SEMVER, "Quantity": QUANTITY}
_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z_0-9]*|[(),])")


def parse_type(text: str) -> Ty:
    """``list(A)``, ``map(string, dyn)``, ``Semver`` ... (the table's notation)."""
    tokens = _TOKEN.findall(text)
    ty, rest = _parse(tokens)
    if rest:
        raise ValueError(f"bad type {text!r}")
    return ty


def _parse(tokens: list[str]) -> tuple[Ty, list[str]]:
    name, rest = tokens[0], tokens[1:]
    if name in _ALIASES:
        return _ALIASES[name], rest
    if not rest or rest[0] != "(":
        return Ty(name), rest
    args: list[Ty] = []
    rest = rest[1:]
    while rest[0] != ")":
        arg, rest = _parse(rest)
        args.append(arg)
        if rest[0] == ",":
            rest = rest[1:]
    return Ty(name, tuple(args)), rest[1:]


@dataclass(frozen=True, slots=True)
class Signature:
    member: bool
    params: tuple[Ty, ...]  # the receiver first for a member function
    result: Ty


_SIG = re.compile(r"^(?:(?P<recv>.+?)\.)?(?P<name>\w+)\((?P<params>.*)\)->(?P<result>.+)$")


def parse_signature(text: str) -> tuple[str, Signature]:
    """``string.charAt(int)->string`` or ``size(list(A))->int``."""
    m = _SIG.match(text.replace(" ", ""))
    if m is None:
        raise ValueError(f"bad signature {text!r}")
    params: list[Ty] = []
    if m["recv"]:
        params.append(parse_type(m["recv"]))
    depth, start, body = 0, 0, m["params"]
    for i, c in enumerate(body + ","):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            if body[start:i]:
                params.append(parse_type(body[start:i]))
            start = i + 1
    return m["name"], Signature(bool(m["recv"]), tuple(params), parse_type(m["result"]))


def unify(param: Ty, arg: Ty, binds: dict[str, Ty]) -> bool:
    """Whether ``arg`` fits ``param``, binding the type parameters A and B."""
    if param.name in _PARAMS:
        bound = binds.get(param.name)
        if bound is None or bound == DYN:
            binds[param.name] = arg
            return True
        return arg == DYN or assignable(bound, arg)
    if param == DYN or arg == DYN:
        return True
    if param.name != arg.name or len(param.args) != len(arg.args):
        return False
    return all(unify(p, a, binds) for p, a in zip(param.args, arg.args, strict=True))


def assignable(a: Ty, b: Ty) -> bool:
    """Whether values of static types ``a`` and ``b`` may be compared for equality."""
    if a == DYN or b == DYN:
        return True
    if a.name != b.name or len(a.args) != len(b.args):
        return False
    return all(assignable(x, y) for x, y in zip(a.args, b.args, strict=True))


def substitute(ty: Ty, binds: dict[str, Ty]) -> Ty:
    if ty.name in _PARAMS:
        return binds.get(ty.name, DYN)
    if ty.args:
        return Ty(ty.name, tuple(substitute(a, binds) for a in ty.args))
    return ty
