"""Kubernetes ``resource.Quantity``: exact parsing, value semantics and canonical strings.

Follows k8s.io/apimachinery/pkg/api/resource (quantity.go, suffix.go): a value keeps the
format (binary SI, decimal SI, decimal exponent) it was parsed with; its string is the
canonical form the API server serializes, except that a string already in canonical form
when parsed is kept verbatim, as upstream does. Values are exact fractions, never floats.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["Format", "Quantity"]


class Format(enum.StrEnum):
    """How a quantity is written; kept from parsing (upstream ``resource.Format``)."""

    BINARY_SI = "BinarySI"  # 12Mi
    DECIMAL_SI = "DecimalSI"  # 12M
    DECIMAL_EXPONENT = "DecimalExponent"  # 12e6


_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
_NANO = Fraction(1, 10**9)
# Exponents beyond this would build astronomically large integers; upstream has no
# practical use for them either (it truncates to int32).
_MAX_EXPONENT = 10_000

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_SUFFIXES |= {"P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXPONENT = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER = {e // 10: s for s, e in _BINARY_SUFFIXES.items()}

# The shape upstream's scanner (parseQuantityString) accepts: sign, digits with an optional
# fraction, then suffix letters, an optional sign and digits. The suffix is checked after.
_SCAN = re.compile(r"([+-]?)(0*)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)")


def _interpret_suffix(suffix: str) -> tuple[int, int, Format]:
    """(base, exponent, format) for a suffix; ValueError when it is none of the three kinds."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], Format.DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"quantity exponent {exponent} is out of the supported range")
        return 10, exponent, Format.DECIMAL_EXPONENT
    raise ValueError(f"unable to parse quantity's suffix {suffix!r}")


def _round_up_to_nano(value: Fraction) -> Fraction:
    """Round away from zero to a multiple of 1e-9: asking for some resource gets some."""
    scaled = abs(value) / _NANO
    whole = -(-scaled.numerator // scaled.denominator)
    rounded = whole * _NANO
    return rounded if value >= 0 else -rounded


def _kept_string(num: str, denom: str, base: int, exp: int) -> bool:
    """Whether upstream's int64 fast path keeps the parsed string as the serialized form."""
    shifted = num + denom
    if base == 2:
        if exp < 0 or denom:
            return False
        if 15 - len(num) - exp * 3 // 10 - 1 < 0:
            return False
        magnitude = int(shifted) << exp
        if magnitude > _INT64_MAX:
            return False
        return int(shifted) & 0x07 != 0
    if 18 - len(shifted) < 0:
        return False
    scale = exp - len(denom)
    if scale < -9:
        return False
    return scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def _canonical(value: Fraction, fmt: Format) -> str:
    """The string CanonicalizeBytes produces for a value already rounded to nano units."""
    if value == 0:
        return "0"
    if fmt is Format.BINARY_SI:
        if -1024 < value < 1024 or value.denominator != 1:
            fmt = Format.DECIMAL_SI  # small or fractional binary values print as decimal
        else:
            number, power = value.numerator, 0
            while number % 1024 == 0 and power < 6:
                number //= 1024
                power += 1
            return f"{number}{_BINARY_BY_POWER.get(power, '')}"
    scaled = value / _NANO
    number, exponent = scaled.numerator, -9
    while number % 10 == 0:
        number //= 10
        exponent += 1
    while exponent % 3:
        number *= 10
        exponent -= 1
    if fmt is Format.DECIMAL_EXPONENT:
        return f"{number}e{exponent}" if exponent else str(number)
    if exponent > 18:
        # Upstream has no suffix past E and would drop it; keep the value right instead.
        number *= 10 ** (exponent - 18)
        exponent = 18
    return f"{number}{_DECIMAL_BY_EXPONENT[exponent]}"


def _fits(n: int) -> bool:
    return _INT64_MIN <= n <= _INT64_MAX


def _parsed_amount(
    negative: bool, num: str, denom: str, base: int, exponent: int
) -> tuple[int, int] | None:
    """ParseQuantity's int64Amount fast path: (mantissa, scale), or None for an inf.Dec."""
    mantissa = 1
    if base == 10:
        scale = exponent
        precision = 18 - (len(num) + len(denom))  # maxInt64Factors
    elif exponent >= 0 and not denom:
        scale = 0
        mantissa = 1 << exponent
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
    else:
        return None
    scale -= len(denom)
    if precision < 0 or scale < -9:
        return None
    value = int(num + denom) * mantissa
    if not _fits(value):
        return None
    return (-value if negative else value, scale)


def _add_amounts(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    """int64Amount.Add: the smaller scale wins; None (an inf.Dec) on overflow."""
    if a is None or b is None:
        return None
    (av, ascale), (bv, bscale) = a, b
    if bv == 0:
        return a
    if av == 0:
        return b
    scale = min(ascale, bscale)
    x, y = av * 10 ** (ascale - scale), bv * 10 ** (bscale - scale)
    if not (_fits(x) and _fits(y) and _fits(x + y)):
        return None
    return (x + y, scale)


def _as_int64(amount: tuple[int, int] | None) -> int | None:
    if amount is None:
        return None
    value, scale = amount
    if scale < 0:
        return None
    number = value * 10**scale
    return number if _fits(number) else None


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact Kubernetes quantity; equality, hashing and ordering go by value."""

    value: Fraction
    format: Format = Format.DECIMAL_SI
    _text: str | None = field(default=None, repr=False)
    # How upstream holds the value: an int64 mantissa with a base-10 scale, or an inf.Dec
    # (_dec). Only AsInt64 (CEL isInteger/asInteger) can tell: "1000m" or 0.5 + 0.5 are
    # whole numbers that upstream still refuses to convert. Derived from the value if unset.
    _amount: tuple[int, int] | None = field(default=None, repr=False)
    _dec: bool = field(default=False, repr=False)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse every form ParseQuantity accepts; ValueError for anything else."""
        if not isinstance(text, str):
            raise ValueError(f"quantity must be a string, got {type(text).__name__}")
        if text == "":
            raise ValueError("quantity must not be empty")
        if text == "0":
            return cls(Fraction(0), Format.DECIMAL_SI, "0", (0, 0))
        match = _SCAN.fullmatch(text)
        if match is None:
            raise ValueError(
                f"quantity {text!r} must match '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        sign, _zeros, num, denom, suffix = match.groups()
        denom = denom or ""
        num = num or "0"
        negative = sign == "-"
        base, exponent, fmt = _interpret_suffix(suffix)
        magnitude = Fraction(int(num + denom), 10 ** len(denom))
        magnitude *= Fraction(base) ** exponent
        value = -magnitude if negative else magnitude
        amount = _parsed_amount(negative, num, denom, base, exponent)
        if amount is None:
            return cls._from_dec(value, fmt)
        if _kept_string(num, denom, base, exponent):
            return cls(value, fmt, text, amount)
        return cls(value, fmt, None, amount)

    @classmethod
    def _from_dec(cls, value: Fraction, fmt: Format) -> Quantity:
        value = _round_up_to_nano(value)
        if fmt is Format.BINARY_SI:
            if abs(value) > _INT64_MAX:
                value = Fraction(_INT64_MAX) if value > 0 else Fraction(-_INT64_MAX)
            if 0 < abs(value) < 1:
                fmt = Format.DECIMAL_SI
        return cls(value, fmt, None, None, True)

    def __post_init__(self) -> None:
        if not isinstance(self.value, Fraction):
            object.__setattr__(self, "value", Fraction(self.value))
        if self.value % _NANO:
            object.__setattr__(self, "value", _round_up_to_nano(self.value))
        object.__setattr__(self, "format", Format(self.format))
        if self._amount is None and not self._dec:
            whole = self.value.denominator == 1 and _INT64_MIN <= self.value.numerator <= _INT64_MAX
            if whole:
                object.__setattr__(self, "_amount", (self.value.numerator, 0))
            else:
                object.__setattr__(self, "_dec", True)

    def __str__(self) -> str:
        text = self._text
        if text is None:
            # Kept once written: explain writes the same share on every node of a shape.
            text = _canonical(self.value, self.format)
            object.__setattr__(self, "_text", text)
        return text

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __add__(self, other: Quantity) -> Quantity:
        return self._combine(other, other._amount)

    def __sub__(self, other: Quantity) -> Quantity:
        negated = None if other._amount is None else (-other._amount[0], other._amount[1])
        return self._combine(-other, negated)

    def _combine(self, other: Quantity, amount: tuple[int, int] | None) -> Quantity:
        total = _add_amounts(self._amount, amount)
        fmt = self._result_format(other)
        if total is None:
            return Quantity(self.value + other.value, fmt, None, None, True)
        return Quantity(self.value + other.value, fmt, None, total)

    def __neg__(self) -> Quantity:
        if self._amount is None:
            return Quantity(-self.value, self.format, None, None, True)
        return Quantity(-self.value, self.format, None, (-self._amount[0], self._amount[1]))

    def _result_format(self, other: Quantity) -> Format:
        # Upstream Add/Sub: a zero receiver takes the other operand's format.
        return other.format if self.value == 0 else self.format

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """Whether ``as_integer`` succeeds (upstream ``AsInt64``)."""
        return _as_int64(self._amount) is not None

    def as_integer(self) -> int:
        """The integer value as upstream's ``AsInt64`` gives it; ValueError where it refuses.

        It refuses fractions and values outside int64, and also whole values held with a
        negative scale ("1000m") or as an inf.Dec (beyond 18 digits, binary fractions).
        """
        number = _as_int64(self._amount)
        if number is None:
            raise ValueError(f"quantity {self} cannot be converted to an integer")
        return number

    def as_approximate_float(self) -> float:
        return float(self.value)

    def canonical(self) -> str:
        """The canonical string, ignoring a verbatim-kept parsed form."""
        return _canonical(self.value, self.format)
