"""driver.common.quantity against upstream k8s.io/apimachinery/pkg/api/resource.

Expected strings follow quantity.go (ParseQuantity: the int64 fast path keeps an already
canonical string verbatim; CanonicalizeBytes: binary values below 1024 or fractional print as
decimal, exponents are floored to multiples of 3) and the examples in its Quantity doc comment
("1.5 will be serialized as 1500m", "1.5Gi will be serialized as 1536Mi") and quantity_test.go.
"""

import random
from fractions import Fraction

import pytest

from driver.common.quantity import Format, Quantity

# (input, canonical string as the API server returns it, exact value, format)
CANONICAL = [
    ("0", "0", Fraction(0), Format.DECIMAL_SI),
    ("000", "0", Fraction(0), Format.DECIMAL_SI),
    ("0Ki", "0", Fraction(0), Format.BINARY_SI),
    ("1", "1", Fraction(1), Format.DECIMAL_SI),
    ("1000", "1k", Fraction(1000), Format.DECIMAL_SI),
    ("0.5", "500m", Fraction(1, 2), Format.DECIMAL_SI),
    ("1.5", "1500m", Fraction(3, 2), Format.DECIMAL_SI),
    ("100m", "100m", Fraction(1, 10), Format.DECIMAL_SI),
    ("1000m", "1", Fraction(1), Format.DECIMAL_SI),
    ("1500m", "1500m", Fraction(3, 2), Format.DECIMAL_SI),
    ("1.5Gi", "1536Mi", Fraction(3 * 2**29), Format.BINARY_SI),
    ("1024Mi", "1Gi", Fraction(2**30), Format.BINARY_SI),
    ("1Ki", "1Ki", Fraction(1024), Format.BINARY_SI),
    ("1025Ki", "1025Ki", Fraction(1025 * 1024), Format.BINARY_SI),
    ("81559Mi", "81559Mi", Fraction(81559 * 2**20), Format.BINARY_SI),
    # A plain integer is DecimalSI and keeps that format: it is not rewritten to Mi
    # (81559Mi is 85520809984; 85520318464 is not a whole number of Mi at all).
    ("85520809984", "85520809984", Fraction(81559 * 2**20), Format.DECIMAL_SI),
    ("85520318464", "85520318464", Fraction(85520318464), Format.DECIMAL_SI),
    ("0.5Ki", "512", Fraction(512), Format.BINARY_SI),  # binary below 1024 prints decimal
    ("0.5Mi", "512Ki", Fraction(2**19), Format.BINARY_SI),
    ("0.1Ki", "102400m", Fraction(512, 5), Format.BINARY_SI),  # fractional: decimal
    ("1k", "1k", Fraction(1000), Format.DECIMAL_SI),
    ("1000k", "1M", Fraction(10**6), Format.DECIMAL_SI),
    ("12E", "12E", Fraction(12 * 10**18), Format.DECIMAL_SI),
    ("1n", "1n", Fraction(1, 10**9), Format.DECIMAL_SI),
    ("1u", "1u", Fraction(1, 10**6), Format.DECIMAL_SI),
    ("1e3", "1e3", Fraction(1000), Format.DECIMAL_EXPONENT),
    ("1E3", "1E3", Fraction(1000), Format.DECIMAL_EXPONENT),
    ("1e6", "1e6", Fraction(10**6), Format.DECIMAL_EXPONENT),
    ("10e3", "10e3", Fraction(10**4), Format.DECIMAL_EXPONENT),
    ("1.5e3", "1500", Fraction(1500), Format.DECIMAL_EXPONENT),
    ("1e-3", "1e-3", Fraction(1, 1000), Format.DECIMAL_EXPONENT),
    ("1000e-3", "1", Fraction(1), Format.DECIMAL_EXPONENT),
    ("-1", "-1", Fraction(-1), Format.DECIMAL_SI),
    ("-1.5", "-1500m", Fraction(-3, 2), Format.DECIMAL_SI),
    ("-1536Mi", "-1536Mi", Fraction(-1536 * 2**20), Format.BINARY_SI),
    # Below 1n rounds up, away from zero (ParseQuantity: "if you want some resources...").
    ("0.1n", "1n", Fraction(1, 10**9), Format.DECIMAL_SI),
    ("1e-10", "1e-9", Fraction(1, 10**9), Format.DECIMAL_EXPONENT),
    ("-0.1n", "-1n", Fraction(-1, 10**9), Format.DECIMAL_SI),
    ("1.0000000001", "1000000001n", Fraction(1000000001, 10**9), Format.DECIMAL_SI),
    # Binary values are capped at int64 max.
    ("16Ei", "9223372036854775807", Fraction(2**63 - 1), Format.BINARY_SI),
    # Upstream scanner quirks: "." is zero; "1.G" is allowed (and kept verbatim).
    (".", "0", Fraction(0), Format.DECIMAL_SI),
    ("1.G", "1.G", Fraction(10**9), Format.DECIMAL_SI),
    (".5", "500m", Fraction(1, 2), Format.DECIMAL_SI),
    # Canonical strings that parse on the fast path are kept verbatim, sign included.
    ("+1k", "+1k", Fraction(1000), Format.DECIMAL_SI),
]

# From quantity_test.go's invalid table, plus the empty string and non-suffixes.
INVALID = [
    "",
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",
    "1 ",
    "1e",
    "abc",
    "1KB",
    "1k3",
    "1Mii",
    "--1",
    "1e99999999",
]


@pytest.mark.parametrize(("text", "canonical", "value", "fmt"), CANONICAL)
def test_parse_and_canonical(text: str, canonical: str, value: Fraction, fmt: Format) -> None:
    q = Quantity.parse(text)
    assert str(q) == canonical
    assert q.value == value
    assert q.format is fmt


@pytest.mark.parametrize("text", INVALID)
def test_invalid(text: str) -> None:
    with pytest.raises(ValueError):
        Quantity.parse(text)


def test_canonical_strings_round_trip() -> None:
    for text, canonical, _, _ in CANONICAL:
        again = Quantity.parse(canonical)
        assert again == Quantity.parse(text)
        assert str(again) == canonical


def test_value_semantics() -> None:
    assert Quantity.parse("85520809984") == Quantity.parse("81559Mi")
    assert Quantity.parse("85520318464") != Quantity.parse("81559Mi")
    assert hash(Quantity.parse("1k")) == hash(Quantity.parse("1000"))
    assert len({Quantity.parse("1Gi"), Quantity.parse("1024Mi"), Quantity.parse("1G")}) == 2
    assert Quantity.parse("1G") < Quantity.parse("1Gi") <= Quantity.parse("1024Mi")
    assert max(Quantity.parse("500m"), Quantity.parse("1")) == Quantity.parse("1")
    assert Quantity.parse("0.5") != 0.5  # no comparison with floats


def test_arithmetic_keeps_receiver_format() -> None:
    total = Quantity.parse("1Gi") + Quantity.parse("512Mi")
    assert str(total) == "1536Mi"
    assert str(Quantity.parse("1") - Quantity.parse("1500m")) == "-500m"
    # A zero receiver takes the other operand's format (upstream Add/Sub).
    assert str(Quantity.parse("0") + Quantity.parse("2Gi")) == "2Gi"
    assert str(-Quantity.parse("2Gi")) == "-2Gi"


def test_sign_integer_float() -> None:
    assert [Quantity.parse(s).sign() for s in ("-1m", "0", "3Ki")] == [-1, 0, 1]
    assert Quantity.parse("2Ki").as_integer() == 2048
    assert Quantity.parse("1500m").is_integer() is False
    assert Quantity.parse("10E").is_integer() is False  # beyond int64
    with pytest.raises(ValueError, match="cannot be converted to an integer"):
        Quantity.parse("1500m").as_integer()
    with pytest.raises(ValueError, match="cannot be converted to an integer"):
        Quantity.parse("10E").as_integer()
    assert Quantity.parse("922337203685477580").as_integer() == 922337203685477580
    assert Quantity.parse("50k").as_integer() == 50000


def test_as_integer_follows_upstream_representation() -> None:
    # Upstream AsInt64 refuses whole values held with a negative scale or as an inf.Dec;
    # each line was checked against the reference oracle (tests/oracles).
    assert Quantity.parse("1000m").is_integer() is False
    assert Quantity.parse("1.0").is_integer() is False
    assert Quantity.parse("0m").is_integer() is False
    assert Quantity.parse("9223372036854775807").is_integer() is False  # 19 digits: an inf.Dec
    assert (Quantity.parse("1500m") + Quantity.parse("500m")).is_integer() is False
    assert (Quantity.parse("5m") - Quantity.parse("5m")).is_integer() is False
    assert (Quantity.parse("10") + Quantity.parse("-10")).is_integer() is True
    assert (Quantity.parse("1Gi") - Quantity.parse("1Gi")).is_integer() is True
    assert (Quantity.parse("1k") + Quantity.parse("24")).as_integer() == 1024
    assert (Quantity.parse("0") + Quantity.parse("500m")).is_integer() is False
    assert Quantity.parse("1.5Gi").as_approximate_float() == 1610612736.0


def test_constructor_rounds_and_canonicalizes() -> None:
    assert str(Quantity(Fraction(85520809984), Format.BINARY_SI)) == "81559Mi"
    assert str(Quantity(Fraction(1, 10**12))) == "1n"
    assert Quantity(Fraction(3, 2)).canonical() == "1500m"
    assert Quantity.parse("+1k").canonical() == "1k"


def test_generated_quantities_round_trip_through_their_canonical_form() -> None:
    rng = random.Random(1234)
    suffixes = [
        "",
        "n",
        "u",
        "m",
        "k",
        "M",
        "G",
        "T",
        "P",
        "E",
        "Ki",
        "Mi",
        "Gi",
        "Ti",
        "Pi",
        "Ei",
        "e3",
        "e-3",
        "E6",
        "e0",
    ]
    for _ in range(2000):
        whole = str(rng.randrange(0, 10 ** rng.randrange(1, 12)))
        fraction = "." + str(rng.randrange(0, 1000)) if rng.random() < 0.4 else ""
        text = rng.choice(["", "-", "+"]) + whole + fraction + rng.choice(suffixes)
        q = Quantity.parse(text)
        again = Quantity.parse(str(q))
        assert again == q, text
        assert str(Quantity.parse(q.canonical())) == q.canonical(), text
