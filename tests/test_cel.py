"""The table-driven CEL suite (tests/cel_cases.py), cross-checked against cel-expr-python."""

from typing import Any

import pytest

from tests.cel_cases import (
    CASES,
    COMPILE_ERROR,
    DEVICE,
    DRIVER,
    EVAL_ERROR,
    UNSUPPORTED,
    VALUE,
    Case,
)
from tools.cel import (
    CelCompileError,
    CelDevice,
    CelEvalError,
    CelUnsupportedError,
    compile_selector,
)

_DEV = CelDevice.from_api(DRIVER, DEVICE)


def test_the_table_is_big_enough_and_cited() -> None:
    assert len(CASES) >= 150
    assert all(case.cite for case in CASES)
    assert len({case.expr for case in CASES}) == len(CASES), "duplicate expressions"
    assert sum(case.oracle for case in CASES) >= 80


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case) -> None:
    if case.kind == COMPILE_ERROR:
        with pytest.raises(CelCompileError) as compile_info:
            compile_selector(case.expr)
        message = str(compile_info.value)
        assert message.startswith(case.match + ":"), message
        return
    if case.kind == UNSUPPORTED:
        with pytest.raises(CelUnsupportedError, match="not supported by this tool"):
            compile_selector(case.expr)
        return
    selector = compile_selector(case.expr)
    if case.kind == EVAL_ERROR:
        with pytest.raises(CelEvalError) as info:
            selector.matches(_DEV)
        assert case.match in str(info.value), str(info.value)
        return
    assert case.kind == VALUE
    assert selector.matches(_DEV) is case.want


# --- the oracle: the official C++ runtime ------------------------------------------------

_ORACLE_CASES = [c for c in CASES if c.oracle]


@pytest.fixture(scope="module")
def oracle() -> Any:
    cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is a dev extra")
    from cel_expr_python.ext import ext_bindings, ext_strings

    return cel, cel.NewEnv(extensions=[ext_strings.ExtStrings(), ext_bindings.ExtBindings()])


def _oracle_outcome(oracle: Any, expr: str) -> tuple[str, object]:
    cel, env = oracle
    try:
        compiled = env.compile(expr)
    except Exception:  # the bindings raise a plain exception for compile errors
        return COMPILE_ERROR, None
    value = compiled.eval()
    if value.type() == cel.Type.ERROR:
        return EVAL_ERROR, None
    return VALUE, value.plain_value()


@pytest.mark.parametrize("case", _ORACLE_CASES, ids=[c.id for c in _ORACLE_CASES])
def test_case_agrees_with_cel_expr_python(oracle: Any, case: Case) -> None:
    kind, value = _oracle_outcome(oracle, case.expr)
    assert kind == case.kind, f"the C++ runtime says {kind} ({value!r})"
    if kind == VALUE:
        assert value is case.want
