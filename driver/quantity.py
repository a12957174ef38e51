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


@functools.total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact Kubernetes quantity; equality, hashing and ordering go by value."""

    value: Fraction
    format: Format = Format.DECIMAL_SI
    _text: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse every form ParseQuantity accepts; ValueError for anything else."""
        if not isinstance(text, str):
            raise ValueError(f"quantity must be a string, got {type(text).__name__}")
        if text == "":
            raise ValueError("quantity must not be empty")
        if text == "0":
            return cls(Fraction(0), Format.DECIMAL_SI, "0")
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
        if _kept_string(num, denom, base, exponent):
            return cls(value, fmt, text)
        value = _round_up_to_nano(value)
        if fmt is Format.BINARY_SI:
            if abs(value) > _INT64_MAX:
                value = Fraction(_INT64_MAX) if value > 0 else Fraction(-_INT64_MAX)
            if 0 < abs(value) < 1:
                fmt = Format.DECIMAL_SI
        return cls(value, fmt)

    def __post_init__(self) -> None:
        if not isinstance(self.value, Fraction):
            object.__setattr__(self, "value", Fraction(self.value))
        if self.value % _NANO:
            object.__setattr__(self, "value", _round_up_to_nano(self.value))
        object.__setattr__(self, "format", Format(self.format))

    def __str__(self) -> str:
        return self._text if self._text is not None else _canonical(self.value, self.format)

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
        return Quantity(self.value + other.value, self._result_format(other))

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, self._result_format(other))

    def __neg__(self) -> Quantity:
        return Quantity(-self.value, self.format)

    def _result_format(self, other: Quantity) -> Format:
        # Upstream Add/Sub: a zero receiver takes the other operand's format.
        return other.format if self.value == 0 else self.format

    def sign(self) -> int:
        """-1, 0 or 1."""
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """Whether ``as_integer`` succeeds: a whole number that fits in int64."""
        return self.value.denominator == 1 and _INT64_MIN <= self.value.numerator <= _INT64_MAX

    def as_integer(self) -> int:
        """The exact integer value; ValueError if fractional or outside int64."""
        if self.value.denominator != 1:
            raise ValueError(f"quantity {self} is not an integer")
        number = self.value.numerator
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise ValueError(f"quantity {self} does not fit in int64")
        return number

    def as_approximate_float(self) -> float:
        return float(self.value)

    def canonical(self) -> str:
        """The canonical string, ignoring a verbatim-kept parsed form."""
        return _canonical(self.value, self.format)
