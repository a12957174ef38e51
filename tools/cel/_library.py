"""The function libraries Kubernetes gives selectors, as plain Python functions of CEL values.

Sources, by group: cel-go ext/strings.go (string extensions, version 2) and ext/formatting.go
(``format``); kubernetes staging/src/k8s.io/apiserver/pkg/cel/library/{lists,regex,quantity,
semverlib}.go; the CEL language definition (standard functions live in _runtime).
"""

import itertools
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from driver.common.quantity import Quantity
from driver.common.semver import Semver, SemverError
from tools.cel._errors import CelEvalError
from tools.cel._runtime import (
    INT64_MAX,
    INT64_MIN,
    LazyMap,
    as_dict,
    check_int,
    check_uint,
    compare,
    equals,
    no_overload,
    to_string,
    type_name,
)
from tools.cel._values import UInt

# --- regex (RE2 syntax; Python's re accepts a superset) ----------------------------------

_NOT_RE2 = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]|\(\?P=|\(\?\(")


@lru_cache(maxsize=512)
def compile_regex(pattern: str) -> re.Pattern[str]:
    """Compile an RE2 pattern; lookaround and backreferences (not RE2) are rejected."""
    if _NOT_RE2.search(pattern):
        raise CelEvalError(f"invalid regex {pattern!r}: lookaround and backreferences are not RE2")
    try:
        return re.compile(pattern)
    except re.error as err:
        raise CelEvalError(f"invalid regex {pattern!r}: {err}") from None


def _string_args(name: str, *args: Any) -> None:
    for arg in args:
        if type(arg) is not str:
            raise no_overload(name, *args)


def matches(s: Any, pattern: Any) -> bool:
    _string_args("matches", s, pattern)
    return compile_regex(pattern).search(s) is not None


def find(s: Any, pattern: Any) -> str:
    _string_args("find", s, pattern)
    m = compile_regex(pattern).search(s)
    return m.group(0) if m else ""


def find_all(s: Any, pattern: Any, limit: Any = -1) -> list[str]:
    _string_args("findAll", s, pattern)
    if type(limit) is not int:
        raise no_overload("findAll", s, pattern, limit)
    if limit == 0:
        return []
    found: list[str] = []
    last_end = -1
    for m in compile_regex(pattern).finditer(s):
        # Go's FindAllString drops an empty match right after the previous match.
        if m.start() == m.end() == last_end:
            continue
        found.append(m.group(0))
        last_end = m.end()
        if len(found) == limit:
            break
    return found


# --- standard string members -------------------------------------------------------------


def starts_with(s: Any, prefix: Any) -> bool:
    _string_args("startsWith", s, prefix)
    return bool(s.startswith(prefix))


def ends_with(s: Any, suffix: Any) -> bool:
    _string_args("endsWith", s, suffix)
    return bool(s.endswith(suffix))


def string_contains(s: Any, part: Any) -> bool:
    _string_args("contains", s, part)
    return part in s


# --- string extensions (cel-go ext/strings.go) -------------------------------------------


def char_at(s: Any, i: Any) -> str:
    if type(s) is not str or type(i) is not int:
        raise no_overload("charAt", s, i)
    if i < 0:
        raise CelEvalError(f"charAt: index out of range: {i} is less than 0")
    if i > len(s):
        raise CelEvalError(f"charAt: index out of range: {i} is greater than the string size")
    return s[i : i + 1]


def index_of(s: Any, sub: Any, offset: Any = 0) -> int:
    if type(s) is list:
        if offset != 0:
            raise no_overload("indexOf", s, sub, offset)
        return next((i for i, x in enumerate(s) if equals(x, sub)), -1)
    if type(s) is not str or type(sub) is not str or type(offset) is not int:
        raise no_overload("indexOf", s, sub, offset)
    if sub == "":
        return offset  # cel-go: the position where the search starts
    if offset < 0:
        raise CelEvalError(f"indexOf: index out of range: {offset}")
    return s.find(sub, offset) if offset < len(s) else -1


def last_index_of(s: Any, sub: Any, offset: Any = None) -> int:
    if type(s) is list:
        if offset is not None:
            raise no_overload("lastIndexOf", s, sub, offset)
        return next((i for i in range(len(s) - 1, -1, -1) if equals(s[i], sub)), -1)
    if offset is None:
        if type(s) is str and type(sub) is str:
            return s.rfind(sub)
        offset = 0
    if type(s) is not str or type(sub) is not str or type(offset) is not int:
        raise no_overload("lastIndexOf", s, sub, offset)
    if sub == "":
        return offset
    if offset < 0:
        raise CelEvalError(f"lastIndexOf: index out of range: {offset}")
    if offset >= len(s):
        return -1
    # ``offset`` is the last position a match may start at; the match may extend past it.
    return s.rfind(sub, 0, offset + len(sub))


def _ascii_map(s: Any, name: str, upper: bool) -> str:
    if type(s) is not str:
        raise no_overload(name, s)
    if upper:
        return "".join(c.upper() if "a" <= c <= "z" else c for c in s)
    return "".join(c.lower() if "A" <= c <= "Z" else c for c in s)


def lower_ascii(s: Any) -> str:
    return _ascii_map(s, "lowerAscii", upper=False)


def upper_ascii(s: Any) -> str:
    return _ascii_map(s, "upperAscii", upper=True)


def replace(s: Any, old: Any, new: Any, n: Any = -1) -> str:
    if not (type(s) is type(old) is type(new) is str) or type(n) is not int:
        raise no_overload("replace", s, old, new, n)
    if n == 0:
        return s
    if old == "":
        # Go strings.Replace: an empty old matches before every code point and at the end.
        count = len(s) + 1 if n < 0 else min(n, len(s) + 1)
        out = [new + c if i < count else c for i, c in enumerate(s)]
        return "".join(out) + (new if count == len(s) + 1 else "")
    return s.replace(old, new, n if n > 0 else -1)


def split(s: Any, sep: Any, n: Any = -1) -> list[str]:
    if type(s) is not str or type(sep) is not str or type(n) is not int:
        raise no_overload("split", s, sep, n)
    if n == 0:
        return []
    if sep == "":
        # Go's strings.Split("", "") is empty: no characters, no pieces.
        chars = list(s)
        if n > 0 and len(chars) > n:
            return [*chars[: n - 1], "".join(chars[n - 1 :])]
        return chars
    return s.split(sep, n - 1 if n > 0 else -1)


def substring(s: Any, start: Any, end: Any = None) -> str:
    if end is None:
        end = len(s) if type(s) is str else 0
    if type(s) is not str or type(start) is not int or type(end) is not int:
        raise no_overload("substring", s, start, end)
    if start < 0 or start > len(s) or end > len(s):
        raise CelEvalError(f"substring: index out of range: start {start}, end {end}")
    if end < start:
        raise CelEvalError(f"substring: end {end} is less than start {start}")
    return s[start:end]


# Go's unicode.IsSpace, which strings.TrimSpace uses.
_UNICODE_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
_UNICODE_SPACE += "\u2028\u2029\u202f\u205f\u3000"


def trim(s: Any) -> str:
    if type(s) is not str:
        raise no_overload("trim", s)
    return s.strip(_UNICODE_SPACE)


def join(items: Any, sep: Any = "") -> str:
    if type(items) is not list or type(sep) is not str:
        raise no_overload("join", items, sep)
    for item in items:
        if type(item) is not str:
            raise CelEvalError(f"join: list element of type '{type_name(item)}' is not a string")
    return sep.join(items)


_QUOTED = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def quote(s: Any) -> str:
    if type(s) is not str:
        raise no_overload("strings.quote", s)
    return '"' + "".join(_QUOTED.get(c, c) for c in s) + '"'


# --- format (cel-go ext/formatting.go) ---------------------------------------------------

_CLAUSE = re.compile(r"%(?:\.([0-9]+))?(.)?", re.DOTALL)


_SCALARS = (str, bool, int, UInt, float, Semver, Quantity)


def _format_plain(value: Any) -> str:
    """``%s``: scalars as ``string()`` converts them; bytes never fail here (``string()``
    refuses invalid UTF-8); null, lists and maps as cel-go's formatter writes them."""
    t = type(value)
    if t in _SCALARS:
        return to_string(value)
    if t is bytes:
        return bytes(value).decode("utf-8", errors="replace")
    if value is None:
        return "null"
    if t is list:
        return "[" + ", ".join(_format_plain(v) for v in value) + "]"
    if t is dict or isinstance(value, LazyMap):
        items = sorted(as_dict(value).items(), key=lambda kv: _format_plain(kv[0]))
        return "{" + ", ".join(f"{_format_plain(k)}: {_format_plain(v)}" for k, v in items) + "}"
    if hasattr(value, "name"):
        return str(value.name)
    raise CelEvalError(f"format: no string form for type '{type_name(value)}'")


def _format_fixed(value: Any, precision: int, verb: str) -> str:
    if type(value) not in (int, UInt, float):
        raise CelEvalError(f"format: %{verb} needs a number, got '{type_name(value)}'")
    f = float(value)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return f"{f:.{precision}{verb}}"


def _format_int(value: Any, verb: str) -> str:
    t = type(value)
    if verb == "d":
        if t is int or t is UInt:
            return str(int(value))
        raise CelEvalError(f"format: %d needs an integer, got '{type_name(value)}'")
    if t is bool and verb == "b":
        return "1" if value else "0"
    if t is int or t is UInt:
        sign = "-" if value < 0 else ""
        digits = format(abs(int(value)), {"x": "x", "X": "X", "o": "o", "b": "b"}[verb])
        return sign + digits
    if verb in "xX" and (t is str or t is bytes):
        data = value.encode() if t is str else value
        text = data.hex()
        return str(text.upper() if verb == "X" else text)
    raise CelEvalError(f"format: %{verb} does not take type '{type_name(value)}'")


def format_string(template: Any, args: Any) -> str:
    if type(template) is not str or type(args) is not list:
        raise no_overload("format", template, args)
    out: list[str] = []
    pos = 0
    used = 0
    while True:
        i = template.find("%", pos)
        if i < 0:
            out.append(template[pos:])
            break
        out.append(template[pos:i])
        m = _CLAUSE.match(template, i)
        assert m is not None  # template[i] is "%", and every part after it is optional
        precision_text, verb = m.group(1), m.group(2)
        pos = m.end()
        if verb == "%" and precision_text is None:
            out.append("%")
            continue
        if verb is None or verb not in "sdfeExXob":
            raise CelEvalError(f"format: unrecognized formatting clause {verb!r}")
        if used >= len(args):
            raise CelEvalError(f"format: index {used} out of range")
        value = args[used]
        used += 1
        precision = int(precision_text) if precision_text is not None else 6
        if verb == "s":
            out.append(_format_plain(value))
        elif verb in "fe":
            out.append(_format_fixed(value, precision, verb))
        elif verb == "E":
            out.append(_format_fixed(value, precision, "e").upper())
        else:
            out.append(_format_int(value, verb))
    return "".join(out)


# --- lists (kubernetes library/lists.go) -------------------------------------------------


def _list_arg(name: str, value: Any) -> list[Any]:
    if type(value) is not list:
        raise no_overload(name, value)
    return value


def is_sorted(value: Any) -> bool:
    items = _list_arg("isSorted", value)
    return all(compare("isSorted", a, b) <= 0 for a, b in itertools.pairwise(items))


def list_sum(value: Any, zero: Any = 0) -> Any:
    items = _list_arg("sum", value)
    if not items:
        return zero
    total = items[0]
    kind = type(total)
    if kind not in (int, UInt, float):
        raise no_overload("sum", value)
    for item in items[1:]:
        if type(item) is not kind:
            raise no_overload("sum", value)
        total = total + item
    if kind is int:
        return check_int(total)
    if kind is UInt:
        return check_uint(total)
    return total


def _extreme(name: str, value: Any, want: int) -> Any:
    items = _list_arg(name, value)
    if not items:
        raise CelEvalError(f"{name} called on empty list")
    best = items[0]
    for item in items[1:]:
        if compare(name, best, item) == want:
            best = item
    return best


def list_min(value: Any) -> Any:
    return _extreme("min", value, 1)


def list_max(value: Any) -> Any:
    return _extreme("max", value, -1)


# --- quantity (kubernetes library/quantity.go) -------------------------------------------


def quantity(text: Any) -> Quantity:
    if type(text) is not str:
        raise no_overload("quantity", text)
    try:
        return Quantity.parse(text)
    except ValueError as err:
        raise CelEvalError(f"quantity: {err}") from None


def is_quantity(text: Any) -> bool:
    if type(text) is not str:
        raise no_overload("isQuantity", text)
    try:
        Quantity.parse(text)
    except ValueError:
        return False
    return True


def _quantities(name: str, a: Any, b: Any) -> tuple[Quantity, Quantity]:
    if type(a) is Quantity:
        if type(b) is Quantity:
            return a, b
        if type(b) is int and name in ("add", "sub"):
            return a, Quantity.parse(str(b))
    raise no_overload(name, a, b)


def q_add(a: Any, b: Any) -> Quantity:
    x, y = _quantities("add", a, b)
    return x + y


def q_sub(a: Any, b: Any) -> Quantity:
    x, y = _quantities("sub", a, b)
    return x - y


def q_sign(a: Any) -> int:
    if type(a) is not Quantity:
        raise no_overload("sign", a)
    return a.sign()


def q_is_integer(a: Any) -> bool:
    if type(a) is not Quantity:
        raise no_overload("isInteger", a)
    return a.is_integer()


def q_as_integer(a: Any) -> int:
    if type(a) is not Quantity:
        raise no_overload("asInteger", a)
    try:
        return a.as_integer()
    except ValueError:
        raise CelEvalError("asInteger: cannot convert value to integer") from None


def q_as_float(a: Any) -> float:
    if type(a) is not Quantity:
        raise no_overload("asApproximateFloat", a)
    try:
        return a.as_approximate_float()
    except OverflowError:
        return math.inf if a.sign() > 0 else -math.inf


# --- semver (kubernetes library/semverlib.go) --------------------------------------------


def semver(text: Any, normalize: Any = False) -> Semver:
    if type(text) is not str or type(normalize) is not bool:
        raise no_overload("semver", text, normalize)
    try:
        return Semver.parse(text, normalize)
    except SemverError as err:
        raise CelEvalError(f"semver: {err}") from None


def is_semver(text: Any, normalize: Any = False) -> bool:
    if type(text) is not str or type(normalize) is not bool:
        raise no_overload("isSemver", text, normalize)
    try:
        Semver.parse(text, normalize)
    except SemverError:
        return False
    return True


def _semver_part(name: str, attr: str) -> Callable[[Any], int]:
    def part(v: Any) -> int:
        if type(v) is not Semver:
            raise no_overload(name, v)
        value = int(getattr(v, attr))
        if not INT64_MIN <= value <= INT64_MAX:
            raise CelEvalError(f"{name}: value out of int64 range")
        return value

    return part


major = _semver_part("major", "major")
minor = _semver_part("minor", "minor")
patch = _semver_part("patch", "patch")


# --- comparisons shared by semver and quantity ------------------------------------------


def compare_to(a: Any, b: Any) -> int:
    if type(a) is Semver and type(b) is Semver:
        return a.compare(b)
    if type(a) is Quantity and type(b) is Quantity:
        return (a > b) - (a < b)
    raise no_overload("compareTo", a, b)


def is_less_than(a: Any, b: Any) -> bool:
    if (type(a) is Semver and type(b) is Semver) or (type(a) is Quantity and type(b) is Quantity):
        return compare_to(a, b) < 0
    raise no_overload("isLessThan", a, b)


def is_greater_than(a: Any, b: Any) -> bool:
    if (type(a) is Semver and type(b) is Semver) or (type(a) is Quantity and type(b) is Quantity):
        return compare_to(a, b) > 0
    raise no_overload("isGreaterThan", a, b)
