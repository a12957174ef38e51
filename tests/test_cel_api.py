"""The public surface of tools.cel beyond the case table: errors, positions, reuse."""

import itertools

import pytest

from driver.common.errors import PermanentError
from driver.common.semver import Semver, SemverError
from tests.cel_cases import DEVICE, DRIVER
from tools.cel import (
    CelCompileError,
    CelDevice,
    CelError,
    CelEvalError,
    CelUnsupportedError,
    compile_selector,
)

_DEV = CelDevice.from_api(DRIVER, DEVICE)


def test_error_classes_are_permanent_and_distinct() -> None:
    assert issubclass(CelError, PermanentError)
    for cls in (CelCompileError, CelUnsupportedError, CelEvalError):
        assert issubclass(cls, CelError)
    # "not supported" must never be mistaken for "invalid" by a caller catching compile errors.
    assert not issubclass(CelUnsupportedError, CelCompileError)


def test_compile_error_carries_position_and_expression() -> None:
    expr = 'device.driver == "a" &&\n  device.nope == 1'
    with pytest.raises(CelCompileError) as info:
        compile_selector(expr)
    assert str(info.value).startswith("2:9: undefined field 'nope'")
    assert info.value.expression == expr
    assert expr[info.value.offset] == "."


def test_unsupported_error_names_the_feature() -> None:
    with pytest.raises(CelUnsupportedError) as info:
        compile_selector('ip("1.2.3.4").family() == 4')
    assert "IP addresses" in str(info.value)
    assert "not supported by this tool" in str(info.value)
    assert "invalid" not in str(info.value)


def test_selector_is_compiled_once_and_reused() -> None:
    expr = 'device.attributes["gpu.nvidia.com"].type == "gpu"'
    first = compile_selector(expr)
    assert compile_selector(expr) is first
    assert first.expression == expr
    other = CelDevice.from_api(DRIVER, {"name": "x", "attributes": {"type": {"string": "nic"}}})
    assert first.matches(_DEV) is True
    assert first.matches(other) is False


def test_from_api_tolerates_missing_sections() -> None:
    bare = CelDevice.from_api("example.com", {"name": "d0"})
    assert compile_selector('device.driver == "example.com"').matches(bare)
    assert compile_selector('device.attributes["example.com"].size() == 0').matches(bare)
    assert not compile_selector("device.allowMultipleAllocations").matches(bare)


def test_bad_values_are_evaluation_errors_not_crashes() -> None:
    broken = CelDevice.from_api(
        DRIVER,
        {
            "name": "gpu-9",
            "attributes": {"v": {"version": "not-a-version"}, "odd": {"float": 1.5}},
            "capacity": {"memory": {"value": "lots"}},
        },
    )
    cases = {
        'device.attributes["gpu.nvidia.com"].v.major() == 1': "not-a-version",
        'device.attributes["gpu.nvidia.com"].odd == 1': "no value of a known type",
        'sign(device.capacity["gpu.nvidia.com"].memory) == 1': "capacity gpu.nvidia.com/memory",
    }
    for expr, message in cases.items():
        with pytest.raises(CelEvalError, match=message):
            compile_selector(expr).matches(broken)


def test_the_device_is_not_mutated_and_lookups_are_lazy() -> None:
    raw = {
        "name": "gpu-1",
        "attributes": {"v": {"version": "bogus"}, "type": {"string": "gpu"}},
    }
    device = CelDevice.from_api(DRIVER, raw)  # a bad version is no error until it is read
    assert compile_selector('device.attributes["gpu.nvidia.com"].type == "gpu"').matches(device)
    assert raw == {
        "name": "gpu-1",
        "attributes": {"v": {"version": "bogus"}, "type": {"string": "gpu"}},
    }


def test_non_bool_results_are_errors() -> None:
    with pytest.raises(
        CelCompileError, match="must evaluate to bool or the unknown type, not string"
    ):
        compile_selector('"x"')
    with pytest.raises(CelEvalError, match="not bool"):
        compile_selector("dyn(1)").matches(_DEV)


def test_runtime_budget_stops_nested_comprehensions() -> None:
    # Six nested loops over ten elements: 10**6 iterations of a non-trivial body, far above
    # CELSelectorExpressionMaxCost (1,000,000); stopped early, not after a million steps.
    expr = (
        "cel.bind(t, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], t.all(a, t.all(b, t.all(c, t.all(d,"
        " t.all(e, t.all(f, a + b + c + d + e + f >= 0)))))))"
    )
    with pytest.raises(CelEvalError, match="cost limit exceeded"):
        compile_selector(expr).matches(_DEV)


def test_budget_is_not_absorbed_by_or() -> None:
    loop = "[" + ", ".join(["0"] * 200) + "]"
    expr = f"{loop}.all(a, {loop}.all(b, {loop}.all(c, a == b))) || true"
    with pytest.raises(CelEvalError, match="cost limit"):
        compile_selector(expr).matches(_DEV)


def test_budget_allows_ordinary_loops() -> None:
    loop = "[" + ", ".join(str(i) for i in range(100)) + "]"
    assert compile_selector(f"{loop}.all(a, {loop}.exists(b, b == a))").matches(_DEV)


def test_deep_nesting_is_a_compile_error() -> None:
    with pytest.raises(CelCompileError, match="recursion limit"):
        compile_selector("(" * 150 + "true" + ")" * 150)


def test_very_long_operator_chains_fail_cleanly() -> None:
    chain = " + ".join(["1"] * 5000)
    with pytest.raises(CelCompileError, match="nests too deeply"):
        compile_selector(f"{chain} > 0")
    assert compile_selector(" + ".join(["1"] * 200) + " == 200").matches(_DEV)


def test_comprehension_variable_shadows_device() -> None:
    assert compile_selector("[1].all(device, device == 1)").matches(_DEV)


def test_non_string_expression_is_a_compile_error() -> None:
    with pytest.raises(CelCompileError):
        compile_selector(42)  # type: ignore[arg-type]


# --- driver.common.semver (blang/semver v4 rules) -----------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalize", "expected"),
    [
        ("1.2.3", False, "1.2.3"),
        ("1.2.3-rc.1+build.5", False, "1.2.3-rc.1+build.5"),
        ("v1.2", True, "1.2.0"),
        ("1", True, "1.0.0"),
        ("01.002.0003", True, "1.2.3"),
        ("v1.0.0-alpha", True, "1.0.0-alpha"),
    ],
)
def test_semver_parse(text: str, normalize: bool, expected: str) -> None:
    assert str(Semver.parse(text, normalize)) == expected


@pytest.mark.parametrize(
    ("text", "normalize"),
    [
        ("", False),
        ("1.2", False),
        ("v1.2.3", False),
        ("01.2.3", False),
        ("1.2.3-", False),
        ("1.2.3-01", False),
        ("1.2.3+", False),
        ("1.2.3-a_b", False),
        ("1.2-rc1", True),
        ("x.y.z", True),
    ],
)
def test_semver_rejects(text: str, normalize: bool) -> None:
    with pytest.raises(SemverError):
        Semver.parse(text, normalize)


def test_semver_precedence_follows_semver_org() -> None:
    # semver.org section 11's example chain.
    chain = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "2.0.0",
    ]
    versions = [Semver.parse(v) for v in chain]
    assert versions == sorted(reversed(versions))
    assert all(a.compare(b) == -1 for a, b in itertools.pairwise(versions))
