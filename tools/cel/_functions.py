"""The function table: every function a selector may call, its signatures, its implementation.

Signatures use a small notation (``string.charAt(int)->string``; a receiver before the dot
makes a member function; ``A``/``B`` are type parameters). Also listed: the functions and
namespaces that are valid Kubernetes CEL but not evaluated by this tool.
"""

from collections.abc import Callable
from typing import Any

from tools.cel import _library as lib
from tools.cel import _runtime as rt
from tools.cel._types import Signature, parse_signature

# name -> (implementation, signatures). Member signatures name the receiver first.
TABLE: dict[str, tuple[Callable[..., Any], list[str]]] = {
    "size": (
        rt.size,
        [
            "size(string)->int",
            "size(bytes)->int",
            "size(list(A))->int",
            "size(map(A,B))->int",
            "string.size()->int",
            "bytes.size()->int",
            "list(A).size()->int",
            "map(A,B).size()->int",
        ],
    ),
    "int": (rt.to_int, ["int(int)->int", "int(uint)->int", "int(double)->int", "int(string)->int"]),
    "uint": (
        rt.to_uint,
        ["uint(uint)->uint", "uint(int)->uint", "uint(double)->uint", "uint(string)->uint"],
    ),
    "double": (
        rt.to_double,
        [f"double({t})->double" for t in ("double", "int", "uint", "string")],
    ),
    "string": (
        rt.to_string,
        [f"string({t})->string" for t in ("string", "int", "uint", "double", "bytes", "bool")],
    ),
    "bool": (rt.to_bool, ["bool(bool)->bool", "bool(string)->bool"]),
    "bytes": (rt.to_bytes, ["bytes(bytes)->bytes", "bytes(string)->bytes"]),
    "dyn": (lambda v: v, ["dyn(A)->dyn"]),
    "type": (rt.type_of, ["type(A)->type"]),
    "contains": (lib.string_contains, ["string.contains(string)->bool"]),
    "startsWith": (lib.starts_with, ["string.startsWith(string)->bool"]),
    "endsWith": (lib.ends_with, ["string.endsWith(string)->bool"]),
    "matches": (lib.matches, ["string.matches(string)->bool", "matches(string,string)->bool"]),
    "find": (lib.find, ["string.find(string)->string"]),
    "findAll": (
        lib.find_all,
        ["string.findAll(string)->list(string)", "string.findAll(string,int)->list(string)"],
    ),
    "charAt": (lib.char_at, ["string.charAt(int)->string"]),
    "indexOf": (
        lib.index_of,
        [
            "string.indexOf(string)->int",
            "string.indexOf(string,int)->int",
            "list(A).indexOf(A)->int",
        ],
    ),
    "lastIndexOf": (
        lib.last_index_of,
        [
            "string.lastIndexOf(string)->int",
            "string.lastIndexOf(string,int)->int",
            "list(A).lastIndexOf(A)->int",
        ],
    ),
    "lowerAscii": (lib.lower_ascii, ["string.lowerAscii()->string"]),
    "upperAscii": (lib.upper_ascii, ["string.upperAscii()->string"]),
    "replace": (
        lib.replace,
        ["string.replace(string,string)->string", "string.replace(string,string,int)->string"],
    ),
    "split": (
        lib.split,
        ["string.split(string)->list(string)", "string.split(string,int)->list(string)"],
    ),
    "substring": (
        lib.substring,
        ["string.substring(int)->string", "string.substring(int,int)->string"],
    ),
    "trim": (lib.trim, ["string.trim()->string"]),
    "join": (lib.join, ["list(string).join()->string", "list(string).join(string)->string"]),
    "format": (lib.format_string, ["string.format(list(dyn))->string"]),
    "quote": (lib.quote, ["quote(string)->string"]),  # reached as strings.quote only
    "isSorted": (lib.is_sorted, ["list(A).isSorted()->bool"]),
    "sum": (lib.list_sum, ["list(A).sum()->A"]),
    "min": (lib.list_min, ["list(A).min()->A"]),
    "max": (lib.list_max, ["list(A).max()->A"]),
    "quantity": (lib.quantity, ["quantity(string)->Quantity"]),
    "isQuantity": (lib.is_quantity, ["isQuantity(string)->bool"]),
    "compareTo": (
        lib.compare_to,
        ["Quantity.compareTo(Quantity)->int", "Semver.compareTo(Semver)->int"],
    ),
    "isLessThan": (
        lib.is_less_than,
        ["Quantity.isLessThan(Quantity)->bool", "Semver.isLessThan(Semver)->bool"],
    ),
    "isGreaterThan": (
        lib.is_greater_than,
        ["Quantity.isGreaterThan(Quantity)->bool", "Semver.isGreaterThan(Semver)->bool"],
    ),
    "add": (lib.q_add, ["Quantity.add(Quantity)->Quantity", "Quantity.add(int)->Quantity"]),
    "sub": (lib.q_sub, ["Quantity.sub(Quantity)->Quantity", "Quantity.sub(int)->Quantity"]),
    # Upstream documents the member form but declares only the global overload, so the API
    # server refuses `q.sign()` (found by the reference oracle, tests/oracles).
    "sign": (lib.q_sign, ["sign(Quantity)->int"]),
    "asInteger": (lib.q_as_integer, ["Quantity.asInteger()->int"]),
    "isInteger": (lib.q_is_integer, ["Quantity.isInteger()->bool"]),
    "asApproximateFloat": (lib.q_as_float, ["Quantity.asApproximateFloat()->double"]),
    "semver": (lib.semver, ["semver(string)->Semver", "semver(string,bool)->Semver"]),
    "isSemver": (lib.is_semver, ["isSemver(string)->bool", "isSemver(string,bool)->bool"]),
    "major": (lib.major, ["Semver.major()->int"]),
    "minor": (lib.minor, ["Semver.minor()->int"]),
    "patch": (lib.patch, ["Semver.patch()->int"]),
}


def _signatures() -> dict[str, list[Signature]]:
    table: dict[str, list[Signature]] = {}
    for name, (_impl, sigs) in TABLE.items():
        for text in sigs:
            parsed_name, sig = parse_signature(text)
            if parsed_name != name:
                raise AssertionError(f"signature {text!r} filed under {name!r}")
            table.setdefault(name, []).append(sig)
    return table


SIGS = _signatures()
# strings.quote is the only namespaced function we evaluate: its receiver is a namespace.
NAMESPACED = {("strings", "quote")}

# Valid in Kubernetes' CEL environment for selectors, but not evaluated by this tool.
UNSUPPORTED_FUNCTIONS = {
    "ip": "IP addresses",
    "cidr": "CIDR ranges",
    "isIP": "IP addresses",
    "isCIDR": "CIDR ranges",
    "url": "URLs",
    "isURL": "URLs",
    "timestamp": "timestamps",
    "duration": "durations",
    "includes": "list-type attributes (includes)",
    "transformList": "two-variable comprehensions",
    "transformMap": "two-variable comprehensions",
    "transformMapEntry": "two-variable comprehensions",
    "existsOne": "two-variable comprehensions",
    "reverse": "strings.reverse",
    "mul": "quantity mul",
    "div": "quantity div",
    "divInt": "quantity divInt",
}
UNSUPPORTED_NAMESPACES = {
    "optional": "optional types",
    "sets": "the sets extension",
    "math": "the math extension",
    "base64": "the encoders extension",
    "strings": "this strings function",
}
