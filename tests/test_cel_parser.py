"""The parser: cel-python's grammar, our translation of its tree, and when it is loaded.

The cases are where cel-python's Lark grammar and the CEL specification part ways (trailing
commas, a sign lexed into a number, ``5.``, ``rb""``, ``0X``, unchecked escapes, reserved
words, positions Lark drops), each checked against the C++ runtime where it parses them too.
"""

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lark.parsers import lalr_analysis

from driver.common.cachedir import CACHE_ENV, private_dir
from tests.cel_cases import COMPILE_ERROR, UNSUPPORTED, VALUE, Case, bad, t, unsupported
from tools.cel import CelCompileError, CelDevice, CelUnsupportedError, compile_selector
from tools.cel._ast import Call, Ident, Index, Lit, Select
from tools.cel._parser import _grammar, parse

_DEV = CelDevice.from_api("example.com", {"name": "d"})

CASES = [
    # Trailing commas: the specification's grammar takes them in list and map literals.
    t("[1, 2,] == [1, 2]", "SPEC grammar: listInit ','?", oracle=True),
    t("{'a': 1,} == {'a': 1}", "SPEC grammar: mapInitializerList ','?", oracle=True),
    t("[[1,],] == [[1]]", "SPEC grammar: nested trailing commas", oracle=True),
    bad("[1].exists(x, x == 1,)", "1:22", "SPEC grammar: no trailing comma in arguments", True),
    # cel-python lexes a sign into a number; the specification negates.
    t("- 5 == -5", "SPEC: unary minus on a literal", oracle=True),
    t("2 - -3 == 5", "SPEC: binary then unary minus", oracle=True),
    t("2-3 == -1", "SPEC: binary minus without blanks", oracle=True),
    t("- 9223372036854775808 < 0", "SPEC: int64 min literal with a blank", oracle=True),
    t("-(5) == -5", "SPEC: minus on a parenthesis", oracle=True),
    t("-[5][0] == -5", "SPEC: minus binds looser than an index", oracle=True),
    t("--5 == 5", "SPEC: double negation", oracle=True),
    t("-1.5 < 0.0", "SPEC: negative double", oracle=True),
    bad("-9223372036854775809 < 0", "1:2", "SPEC: int literal below int64", oracle=True),
    bad("-1u == 1u", "1:1", "SPEC: no -_ for uint", oracle=True),
    # Number literals.
    t("0xffffffffffffffffu == 18446744073709551615u", "SPEC: uint64 max", oracle=True),
    t("0x7fffffffffffffff == 9223372036854775807", "SPEC: hex int64 max", oracle=True),
    t("-0x8000000000000000 < 0", "SPEC: hex int64 min", oracle=True),
    t("1e3 == 1000.0 && .5 == 0.5 && 1.5e-3 < 1.0", "SPEC: double literal forms", oracle=True),
    bad("18446744073709551616u > 0u", "1:1", "SPEC: uint literal out of range", oracle=True),
    bad("0x8000000000000000 > 0", "1:1", "SPEC: hex int literal out of range", oracle=True),
    bad("0X10 == 16", "1:2", "SPEC grammar: the hex prefix is 0x", oracle=True),
    bad("5. == 5.0", "1:2", "SPEC grammar: a digit after the dot", oracle=True),
    bad("1.e5 == 1e5", "1:2", "SPEC grammar: 1.e5 is no double", oracle=True),
    # Strings and bytes: cel-python keeps the source text; the escapes are checked here.
    t('"""a"b""" == \'a"b\'', "SPEC: a quote inside a triple-quoted string", oracle=True),
    t("'''a'b''' == \"a'b\"", "SPEC: triple single quotes", oracle=True),
    t('r"""\\n""" == "\\\\n"', "SPEC: raw triple-quoted string", oracle=True),
    t('"""""" == ""', "SPEC: empty triple-quoted string", oracle=True),
    t('br"a\\d" == b"a\\\\d"', "SPEC: raw bytes", oracle=True),
    t('b"\\377" == b"\\xff"', "SPEC: octal and hex byte escapes", oracle=True),
    t('size(b"é") == 2', "SPEC: bytes literals are UTF-8", oracle=True),
    t('"\\a\\b\\f\\n\\r\\t\\v\\?\\`\\"\\\'\\\\".size() == 12', "SPEC: every escape", oracle=True),
    t('"\\x41\\X41" == "AA"', "SPEC: \\x and \\X", oracle=True),
    t('"\\U0001F600".size() == 1', "SPEC: \\U escape", oracle=True),
    bad('rb"abc" == b"abc"', "1:3", "SPEC grammar: b before r", oracle=True),
    bad('size(b"\\u00e9") == 2', "1:8", "SPEC: no \\u in bytes", oracle=True),
    bad('"\\400" == "x"', "1:2", "SPEC: octal escapes stop at \\377", oracle=True),
    bad('"\\z" == "z"', "1:2", "SPEC: unknown escape", oracle=True),
    bad('"\\ud800" == "x"', "1:2", "SPEC: no surrogate code points", oracle=True),
    # Precedence and associativity.
    t("!true || true", "SPEC: ! binds tighter than ||", oracle=True),
    t("1 + 2 * 3 == 7", "SPEC: * before +", oracle=True),
    t("(false ? 1 : true ? 2 : 3) == 2", "SPEC: the conditional nests to the right", True),
    t("1 < 2 == true", "SPEC: relations are one left-associative level", oracle=True),
    t("2 in [1, 2] == true", "SPEC: in is a relation", oracle=True),
    t("true && false || true", "SPEC: && before ||", oracle=True),
    t("'a' in {'a': 1} && .size('ab') == 2", "SPEC: a leading dot names a global", True),
    bad(
        "(true ? false ? 1 : 2 : 3) == 2",
        "1:15",
        "SPEC grammar: the middle is no conditional",
        True,
    ),
    # Positions of what Lark drops from its tree: operators after comments, true/false.
    t("1 + // a comment\n 2 == 3", "SPEC: comments", oracle=True),
    bad("1 // c\n + 'a' == 1", "2:2", "SPEC: the operator's position, past a comment", True),
    bad("true + 1 == 2", "1:6", "SPEC: the operator's position after true", oracle=True),
    bad("{'a': 1}.true == 1", "1:10", "SPEC grammar: true is no field name", oracle=True),
    bad("[1].all(if, true)", "1:9", "SPEC: reserved identifier", oracle=True),
    bad("'a' inx", "1:5", "SPEC grammar: inx is an identifier, not in x", oracle=True),
    # Kubernetes' optional syntax, with and without blanks (cel-python: a parse error).
    unsupported("[1, ?optional.none()] == [1]", "K8S-ENV OptionalTypes: optional list element"),
    unsupported("{?'a': optional.none()} == {}", "K8S-ENV OptionalTypes: optional map entry"),
    unsupported("{'a': 1}[?'a'].orValue(0) == 1", "K8S-ENV OptionalTypes: optional index"),
    unsupported("{'a': 1}. ?a.orValue(0) == 1", "K8S-ENV OptionalTypes: '.' and '?' apart"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case) -> None:
    if case.kind == COMPILE_ERROR:
        with pytest.raises(CelCompileError) as info:
            compile_selector(case.expr)
        assert str(info.value).startswith(case.match + ":"), str(info.value)
    elif case.kind == UNSUPPORTED:
        with pytest.raises(CelUnsupportedError, match="not supported by this tool"):
            compile_selector(case.expr)
    else:
        assert case.kind == VALUE
        assert compile_selector(case.expr).matches(_DEV) is case.want


@pytest.mark.parametrize("case", [c for c in CASES if c.oracle], ids=lambda c: c.id)
def test_case_agrees_with_cel_expr_python(case: Case) -> None:
    cel: Any = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is a dev extra")
    try:
        compiled = cel.NewEnv().compile(case.expr)
    except Exception:  # the bindings raise a plain exception for compile errors
        assert case.kind == COMPILE_ERROR, "the C++ runtime rejects it"
        return
    assert case.kind == VALUE, "the C++ runtime accepts it"
    assert compiled.eval().plain_value() is case.want


def test_nodes_point_at_their_operator() -> None:
    assert parse("a . b") == Select(2, Ident(0, "a"), "b")
    assert parse("a [0]") == Index(2, Ident(0, "a"), Lit(3, 0))
    assert parse("f (1)") == Call(2, "f", None, (Lit(3, 1),))
    assert parse("a.f ()") == Call(4, "f", Ident(0, "a"), ())
    assert parse("a ? b : c") == Call(
        2, "_?_:_", None, (Ident(0, "a"), Ident(4, "b"), Ident(8, "c"))
    )
    assert parse("a\n  || b") == Call(4, "_||_", None, (Ident(0, "a"), Ident(7, "b")))
    assert parse("!a") == Call(0, "!_", None, (Ident(1, "a"),))


def test_a_sign_is_part_of_a_literal_only_on_its_own() -> None:
    assert parse("-5") == Lit(1, -5)
    assert parse("- 5") == Lit(2, -5)
    assert parse("-x") == Call(0, "-_", None, (Ident(1, "x"),))
    assert parse("-5[0]") == Call(0, "-_", None, (Index(2, Lit(1, 5), Lit(3, 0)),))
    assert parse("-1.5") == Call(0, "-_", None, (Lit(1, 1.5),))
    assert parse("x-1") == Call(1, "_-_", None, (Ident(0, "x"), Lit(2, 1)))


def test_left_deep_chains_keep_their_order() -> None:
    a, b, c = Ident(0, "a"), Ident(4, "b"), Ident(8, "c")
    assert parse("a - b - c") == Call(6, "_-_", None, (Call(2, "_-_", None, (a, b)), c))
    assert parse("a || b && c") == Call(
        2, "_||_", None, (a, Call(7, "_&&_", None, (Ident(5, "b"), Ident(10, "c"))))
    )


# --- cel-python is loaded where an expression is compiled, and only there ----------------

_PROBE = """
import contextlib, io, json, sys

def loaded():
    return sorted(m for m in ("celpy", "lark") if m in sys.modules)

stages = {}
import cli
stages["import"] = loaded()
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main(["--help"])
    except SystemExit:
        pass
    stages["help"] = loaded()
    code = cli.main(
        ["discover", "--nvml", "simulated", "--profile", "p5.48xlarge", "--node-name", "n"]
    )
stages["discover"] = [code, loaded()]
import tools.allocation, tools.validation
stages["tools"] = loaded()
from tools.cel import compile_selector
compile_selector("true")
stages["compile"] = loaded()
print(json.dumps(stages))
"""


def test_commands_without_cel_do_not_load_cel_python() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    stages = json.loads(out.stdout.splitlines()[-1])
    assert stages["import"] == []
    assert stages["help"] == []
    assert stages["discover"] == [0, []]
    assert stages["tools"] == []
    # The probe can see it: compiling a selector loads Lark, and only cel-python's grammar
    # file, not its modules.
    assert stages["compile"] == ["lark"]


# --- the parser's tables: built once per user, then loaded --------------------------------


@pytest.fixture
def fresh_grammar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The parser made anew in this process, with its cache in ``tmp_path``."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    _grammar.cache_clear()
    yield tmp_path / "cel"
    _grammar.cache_clear()


def _never_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def build(self: object) -> None:
        raise AssertionError("the parser's tables were built, not loaded")

    monkeypatch.setattr(lalr_analysis.LALR_Analyzer, "compute_lalr", build)


def test_the_tables_are_built_once_then_loaded(
    fresh_grammar: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = parse("device.attributes['a'].b == true")
    (cached,) = fresh_grammar.glob("*.lark")
    assert stat.S_IMODE(fresh_grammar.stat().st_mode) == 0o700
    _grammar.cache_clear()
    _never_build(monkeypatch)
    # The same tree, positions included, from the loaded tables.
    assert parse("device.attributes['a'].b == true") == first
    assert list(fresh_grammar.glob("*.lark")) == [cached]


def test_the_probe_sees_a_build(fresh_grammar: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _never_build(monkeypatch)
    with pytest.raises(AssertionError, match="built, not loaded"):
        parse("1 == 1")


def test_a_damaged_cache_file_is_built_anew(fresh_grammar: Path) -> None:
    parse("1 == 1")
    (cached,) = fresh_grammar.glob("*.lark")
    cached.write_bytes(b"not a pickle")
    _grammar.cache_clear()
    assert parse("x == 1") == Call(2, "_==_", None, (Ident(0, "x"), Lit(5, 1)))


def test_a_cache_directory_others_can_write_to_is_not_used(
    fresh_grammar: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Someone else could have planted the pickle there: it is neither read nor written.
    fresh_grammar.mkdir()
    fresh_grammar.chmod(0o777)
    assert private_dir("cel") is None
    assert parse("x == 1") == Call(2, "_==_", None, (Ident(0, "x"), Lit(5, 1)))
    assert list(fresh_grammar.iterdir()) == []
