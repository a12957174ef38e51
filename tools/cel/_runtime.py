"""CEL runtime semantics on Python values: equality, ordering, arithmetic, conversions, maps.

Values: bool, int (int64), UInt, float, str, bytes, None, list, dict, LazyMap (maps that
convert on access, like a device's attributes), Semver, Quantity, CelType. Every failure is
a :class:`CelEvalError` whose message says what failed; callers never see a bare Python error.
"""

import math
import re
from abc import abstractmethod
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from driver.common.quantity import Quantity
from driver.common.semver import Semver
from tools.cel._errors import CelEvalError
from tools.cel._values import CelType, UInt

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
NUMERIC = (int, UInt, float)


class LazyMap:
    """A read-only CEL map whose values are built on first access.

    Subclasses give ``lookup`` and ``keys``. The markers are ``abstractmethod`` without
    ``ABCMeta`` on purpose: mypy still refuses a subclass that lacks them, and
    ``isinstance`` against a plain class, on every map access of an evaluation, costs
    about a seventh of what ABCMeta's check does.
    """

    __slots__ = ()

    @abstractmethod
    def lookup(self, key: object) -> Any:
        """The value, or KeyError."""

    @abstractmethod
    def keys(self) -> list[object]:
        """Every key, in a stable order."""

    def contains(self, key: object) -> bool:
        try:
            self.lookup(key)
        except KeyError:
            return False
        return True

    def materialize(self) -> dict[object, Any]:
        return {k: self.lookup(k) for k in self.keys()}


def type_name(value: object) -> str:
    """The CEL name of a value's type, for messages and ``type()``."""
    t = type(value)
    if t is bool:
        return "bool"
    if t is int:
        return "int"
    if t is UInt:
        return "uint"
    if t is float:
        return "double"
    if t is str:
        return "string"
    if t is bytes:
        return "bytes"
    if value is None:
        return "null_type"
    if t is list:
        return "list"
    if t is dict or isinstance(value, LazyMap):
        return "map"
    if t is Semver:
        return "kubernetes.Semver"
    if t is Quantity:
        return "kubernetes.Quantity"
    if t is CelType:
        return "type"
    if hasattr(value, "cel_type_name"):
        return str(value.cel_type_name)
    return t.__name__


def no_overload(name: str, *args: object) -> CelEvalError:
    kinds = ", ".join(type_name(a) for a in args)
    return CelEvalError(f"no such overload: {name}({kinds})")


def check_int(value: int) -> int:
    if INT64_MIN <= value <= INT64_MAX:
        return value
    raise CelEvalError("integer overflow")


def check_uint(value: int) -> UInt:
    if 0 <= value <= UINT64_MAX:
        return UInt(value)
    raise CelEvalError("unsigned integer overflow")


# --- equality and ordering ---------------------------------------------------------------


def equals(a: Any, b: Any) -> bool:
    """CEL heterogeneous equality: different types are unequal, numbers compare by value."""
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is list:
            return len(a) == len(b) and all(equals(x, y) for x, y in zip(a, b, strict=True))
        if ta is dict:
            return _map_equals(a, b)
        return bool(a == b)
    if ta in NUMERIC and tb in NUMERIC:
        return bool(a == b)
    if isinstance(a, LazyMap | dict) and isinstance(b, LazyMap | dict):
        return _map_equals(as_dict(a), as_dict(b))
    if (ta is Semver or ta is Quantity) and b is not None:
        # Kubernetes' Semver.Equal and Quantity.Equal answer "no such overload" for any
        # other type (k8s.io/apiserver/pkg/cel/types.go); the built-in types answer false,
        # so `version == "1.0.0"` fails while `"1.0.0" == version` is false.
        raise no_overload("_==_", a, b)
    return False


def _map_equals(a: dict[object, Any], b: dict[object, Any]) -> bool:
    if len(a) != len(b):
        return False
    return all(key in b and equals(value, b[key]) for key, value in a.items())


def as_dict(value: LazyMap | dict[object, Any]) -> dict[object, Any]:
    if isinstance(value, LazyMap):
        return value.materialize()
    return value


_ORDERED = (bool, str, bytes)


def compare(name: str, a: object, b: object) -> int:
    """-1/0/1 for ``<``-family operators; numbers of different types compare by value."""
    ta, tb = type(a), type(b)
    if (ta is tb and (ta in _ORDERED or ta in NUMERIC)) or (ta in NUMERIC and tb in NUMERIC):
        x: Any = a
        y: Any = b
        if (ta is float and math.isnan(x)) or (tb is float and math.isnan(y)):
            return 2  # NaN: every ordering is false
        return int(x > y) - int(x < y)
    raise no_overload(name, a, b)


# --- arithmetic --------------------------------------------------------------------------


def add(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return check_int(a + b)
        if ta is float:
            return a + b
        if ta is UInt:
            return check_uint(a + b)
        if ta is str or ta is bytes:
            return a + b
        if ta is list:
            return a + b
    raise no_overload("_+_", a, b)


def sub(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return check_int(a - b)
        if ta is float:
            return a - b
        if ta is UInt:
            return check_uint(a - b)
    raise no_overload("_-_", a, b)


def mul(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return check_int(a * b)
        if ta is float:
            return a * b
        if ta is UInt:
            return check_uint(a * b)
    raise no_overload("_*_", a, b)


def _truncated(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def div(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int or ta is UInt:
            if b == 0:
                raise CelEvalError("divide by zero")
            q = _truncated(a, b)
            return check_int(q) if ta is int else check_uint(q)
        if ta is float:
            if b == 0.0:
                if a == 0.0 or math.isnan(a):
                    return math.nan
                return math.copysign(math.inf, a) * math.copysign(1.0, b)
            return a / b
    raise no_overload("_/_", a, b)


def mod(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb and (ta is int or ta is UInt):
        if b == 0:
            raise CelEvalError("modulus by zero")
        if ta is int and a == INT64_MIN and b == -1:
            raise CelEvalError("integer overflow")  # as in cel-go, mirroring the division
        r = a - b * _truncated(a, b)
        return r if ta is int else UInt(r)
    raise no_overload("_%_", a, b)


def negate(a: Any) -> Any:
    t = type(a)
    if t is int:
        return check_int(-a)
    if t is float:
        return -a
    raise no_overload("-_", a)


def logical_not(a: Any) -> bool:
    if type(a) is bool:
        return not a
    raise no_overload("!_", a)


# --- containers --------------------------------------------------------------------------


def size(value: Any) -> int:
    t = type(value)
    if t is str or t is bytes or t is list or t is dict:
        return len(value)
    if isinstance(value, LazyMap):
        return len(value.keys())
    raise no_overload("size", value)


def index(container: Any, key: Any) -> Any:
    t = type(container)
    if t is list:
        kt = type(key)
        if kt is int or kt is UInt or (kt is float and key == int(key)):
            i = int(key)
            if 0 <= i < len(container):
                return container[i]
            raise CelEvalError(f"index out of bounds: {i}")
        raise no_overload("_[_]", container, key)
    if t is dict:
        if type(key) is float and key == int(key):
            key = int(key)
        try:
            return container[key]
        except (KeyError, TypeError):
            raise CelEvalError(f"no such key: {key!r}") from None
    if isinstance(container, LazyMap):
        try:
            return container.lookup(key)
        except KeyError:
            raise CelEvalError(f"no such key: {key!r}") from None
    raise no_overload("_[_]", container, key)


def select(value: Any, field: str) -> Any:
    """``value.field``: a map key or a field of an object value."""
    if type(value) is dict:
        try:
            return value[field]
        except KeyError:
            raise CelEvalError(f"no such key: {field}") from None
    if isinstance(value, LazyMap):
        try:
            return value.lookup(field)
        except KeyError:
            raise CelEvalError(f"no such key: {field}") from None
    getter = getattr(value, "cel_field", None)
    if getter is not None:
        return getter(field)
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")


def has_field(value: Any, field: str) -> bool:
    if type(value) is dict:
        return field in value
    if isinstance(value, LazyMap):
        return value.contains(field)
    tester = getattr(value, "cel_has", None)
    if tester is not None:
        return bool(tester(field))
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")


def contains(container: Any, item: Any) -> bool:
    """The ``in`` operator."""
    t = type(container)
    if t is list:
        return any(equals(item, x) for x in container)
    if t is dict:
        if type(item) is float and item == int(item):
            item = int(item)
        try:
            return item in container
        except TypeError:
            return False
    if isinstance(container, LazyMap):
        return container.contains(item)
    raise no_overload("@in", item, container)


def iterate(value: Any) -> Iterable[Any]:
    """What a comprehension ranges over: list elements or map keys."""
    if type(value) is list or type(value) is dict:
        return value
    if isinstance(value, LazyMap):
        return value.keys()
    raise CelEvalError(f"expression of type '{type_name(value)}' cannot be the range of a macro")


# --- conversions -------------------------------------------------------------------------

_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE
)


def to_int(value: Any) -> int:
    if type(value) is int:
        return value
    t = type(value)
    if t is UInt:
        if value > INT64_MAX:
            raise CelEvalError("integer overflow: uint out of int64 range")
        return int(value)
    if t is float:
        if math.isnan(value) or not -9.223372036854775808e18 < value < 9.223372036854775807e18:
            raise CelEvalError("double out of int64 range")
        return int(value)
    if t is str:
        if not _INT_TEXT.fullmatch(value):
            raise CelEvalError(f"cannot convert string {value!r} to int")
        return check_int(int(value))
    raise no_overload("int", value)


def to_uint(value: Any) -> UInt:
    if type(value) is UInt:
        return value
    t = type(value)
    if t is int:
        if value < 0:
            raise CelEvalError("unsigned integer overflow: int out of uint range")
        return UInt(value)
    if t is float:
        if math.isnan(value) or not -1 < value < 1.8446744073709552e19:
            raise CelEvalError("double out of uint64 range")
        return UInt(int(value))
    if t is str:
        if not value.isascii() or not value.isdigit():
            raise CelEvalError(f"cannot convert string {value!r} to uint")
        return check_uint(int(value))
    raise no_overload("uint", value)


def to_double(value: Any) -> float:
    if type(value) is float:
        return value
    t = type(value)
    if t is int or t is UInt:
        return float(value)
    if t is str:
        if not _FLOAT_TEXT.fullmatch(value):
            raise CelEvalError(f"cannot convert string {value!r} to double")
        return float(value)
    raise no_overload("double", value)


def format_double(value: float) -> str:
    """Go's ``strconv.FormatFloat(f, 'g', -1, 64)``, as cel-go's string(double) prints."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign = "-" if value < 0 else ""
    digits_tuple = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(str(d) for d in digits_tuple.digits)
    exponent = int(digits_tuple.exponent)
    nd = len(digits)
    dp = nd + exponent  # position of the decimal point relative to the digits
    exp = dp - 1
    if exp < -4 or exp >= 6:  # Go: shortest formatting decides with precision 6
        mantissa = digits[0] + ("." + digits[1:] if nd > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if dp <= 0:
        return f"{sign}0.{'0' * -dp}{digits}"
    if dp >= nd:
        return f"{sign}{digits}{'0' * (dp - nd)}"
    return f"{sign}{digits[:dp]}.{digits[dp:]}"


def to_string(value: Any) -> str:
    if type(value) is str:
        return value
    t = type(value)
    if t is bool:
        return "true" if value else "false"
    if t is int or t is UInt:
        return str(int(value))
    if t is float:
        return format_double(value)
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise CelEvalError("invalid UTF-8 in bytes, cannot convert to string") from None
    if t is Semver or t is Quantity:
        return str(value)
    raise no_overload("string", value)


def to_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    t = type(value)
    if t is str:
        if value in ("1", "t", "T", "TRUE", "true", "True"):
            return True
        if value in ("0", "f", "F", "FALSE", "false", "False"):
            return False
        raise CelEvalError(f"type conversion error from 'string' to 'bool': {value!r}")
    raise no_overload("bool", value)


def to_bytes(value: Any) -> bytes:
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode("utf-8")
    raise no_overload("bytes", value)


def type_of(value: Any) -> CelType:
    return CelType(type_name(value))


def guarded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a library function so Python errors become CEL evaluation errors naming it."""

    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except CelEvalError:
            raise
        except (ValueError, TypeError, ArithmeticError, LookupError, re.error) as err:
            raise CelEvalError(f"{name}: {err}") from err

    return call
