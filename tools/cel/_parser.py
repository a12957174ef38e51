"""CEL text to our AST: cel-python's Lark grammar parses, this module translates its tree.

The translation adds what the compiler's checks and ``line:column`` messages need and
cel-python's tree leaves out or takes more loosely than the CEL specification (langdef.md):

- the offset of each operator, ``.``, ``[`` and ``(`` (Lark keeps only spans);
- string and bytes literals decoded, raw and triple-quoted ones too, with the escapes of the
  specification checked (cel-python keeps the source text);
- int and uint literals range-checked; a ``-`` that cel-python lexes into a number is a
  negation except in a literal on its own (``-5``, but ``-(5[0])`` for ``-5[0]``);
- a digit required after the ``.`` of a double (cel-python takes ``5.``, so ``5.f()`` is a
  syntax error here: in this environment no method takes a number, so it fails either way);
- reserved words, which cel-python takes as identifiers, rejected; so is ``a inb``, which
  Lark reads as ``a in b``;
- trailing commas in list and map literals (``[1, 2,]``) taken, as the specification does;
- the optional syntax of Kubernetes CEL (``a.?b``, ``a[?k]``, ``[?x]``, ``{?k: v}``), a
  parse error to cel-python, recognised at that error and reported as not supported.

Lark is imported and cel-python's grammar loaded on the first parse only, so no daemon path
and no command without CEL pays for it; the parser's tables are built once per user and
Lark version, then loaded from ``$GPU_DRA_CACHE/cel`` (:func:`_cache_file`).
"""

import fcntl
import importlib.util
import re
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tools.cel._ast import Call, Ident, Index, ListLit, Lit, MapLit, Node, Select
from tools.cel._errors import CelCompileError, CelUnsupportedError, position
from tools.cel._values import UInt

if TYPE_CHECKING:
    from lark import Lark, Token
    from lark import Tree as LarkTree
    from lark.exceptions import UnexpectedInput

    Tree = LarkTree[Token]

_RESERVED = frozenset(
    {"as", "break", "const", "continue", "else", "for", "function", "if", "import", "in", "let"}
    | {"loop", "package", "namespace", "return", "var", "void", "while"}
)
_MAX_DEPTH = 100
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
# What may stand between an operand and the operator after it.
_GAP = re.compile(r"(?:[\t\n\f\r ]+|//[^\n]*)*")
_BAD_FLOAT = re.compile(r"\.(?![0-9])")
_IDENT = re.compile(r"[_a-zA-Z0-9]+")

_OPERATORS = {
    "conditionalor": "_||_",
    "conditionaland": "_&&_",
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "@in",
    "addition_add": "_+_",
    "addition_sub": "_-_",
    "multiplication_mul": "_*_",
    "multiplication_div": "_/_",
    "multiplication_mod": "_%_",
}

_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "?": "?",
    '"': '"',
    "'": "'",
    "`": "`",
}


def parse(text: str) -> Node:
    """Parse one CEL expression; raises CelCompileError / CelUnsupportedError with a position."""
    grammar = _grammar()
    from lark.exceptions import UnexpectedInput

    source = text
    while True:
        try:
            tree = grammar.parse(source)
        except UnexpectedInput as err:
            comma = _trailing_comma(err)
            if comma is None:
                raise _syntax_error(text, err) from err
            # The specification allows [1, 2,] and {k: v,}; cel-python does not. A blank for
            # the comma keeps every offset.
            source = f"{source[:comma]} {source[comma + 1 :]}"
        else:
            return _Translator(text, source).expr(tree, 0)


@cache
def _grammar() -> "Lark":
    """cel-python's grammar with its parser options, and a position on every token."""
    from lark import Lark, Token

    def bool_literal(t: Token) -> Token:
        # cel-python's own lexer callback makes its true/false tokens without a position.
        if t.value in ("true", "false"):
            return Token.new_borrow_pos("BOOL_LIT", t.value, t)
        return t

    # cel-python's grammar file, read without importing cel-python: its parser class builds
    # the tables anew in every process, and its runtime is not used here.
    spec = importlib.util.find_spec("celpy")
    assert spec is not None and spec.submodule_search_locations  # a dependency
    grammar = (Path(spec.submodule_search_locations[0]) / "cel.lark").read_text()
    options: dict[str, Any] = {
        "parser": "lalr",
        "start": "expr",
        "debug": True,
        "g_regex_flags": re.M,
        "lexer_callbacks": {"IDENT": bool_literal},
        "propagate_positions": True,
        "maybe_placeholders": False,
        "priority": "invert",
    }
    cached = _cache_file(grammar, options)
    if cached is None:
        return Lark(grammar, **options)
    # Lark writes its cache file in place (and its name is part of the digest Lark checks,
    # so it cannot be written aside and renamed): one process at a time loads or builds it,
    # and none reads half of one.
    with open(cached.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return Lark(grammar, cache=str(cached), **options)


def _cache_file(grammar: str, options: Mapping[str, Any]) -> Path | None:
    """Where the parser's tables are cached: building them takes about 0.2 s, loading them
    0.01 s. The file is a pickle, so it lives only in a directory no one else can write to
    (None: build them each time), under a digest of everything the tables depend on, so that
    another grammar, option, Lark or Python never loads a stale one (Lark also checks a
    digest of its own in the file, and builds anew when it cannot load it)."""
    import hashlib

    import lark

    from driver.common.cachedir import private_dir

    folder = private_dir("cel")
    if folder is None:
        return None
    kept = sorted((k, repr(v)) for k, v in options.items() if k != "lexer_callbacks")
    key = repr((grammar, kept, lark.__version__, sys.version_info[:2]))
    return folder / f"parser-{hashlib.sha256(key.encode()).hexdigest()[:24]}.lark"


# --- syntax errors -----------------------------------------------------------------------


def _syntax_error(text: str, err: "UnexpectedInput") -> CelCompileError | CelUnsupportedError:
    from lark.exceptions import UnexpectedCharacters, UnexpectedToken

    pos = getattr(err, "pos_in_stream", None) or 0
    message = "Syntax error"
    if isinstance(err, UnexpectedToken):
        token = err.token
        if token.type == "$END":
            pos, message = len(text), "Syntax error: unexpected end of input"
        else:
            pos, message = _start(token), f"Syntax error: unexpected {token.value!r}"
            if token.value == "?":
                optional = _optional(text, pos, _stack(err))
                if optional is not None:
                    return optional
    elif isinstance(err, UnexpectedCharacters):
        message = f"Syntax error: token recognition error at: {text[pos : pos + 1]!r}"
    return CelCompileError(f"{position(text, pos)}: {message}", text, pos)


def _optional(text: str, pos: int, stack: "list[Tree | Token]") -> CelUnsupportedError | None:
    """The optional syntax of Kubernetes CEL, told by what the parser read before the ``?``."""

    def unsupported(at: int, what: str) -> CelUnsupportedError:
        return CelUnsupportedError(
            f"{position(text, at)}: {what} is valid Kubernetes CEL but not supported by this tool",
            text,
            at,
        )

    top = _top(stack)
    if top is None:
        return None
    if top.type in ("DOT", "LSQB") and _after_operand(stack, len(stack) - 1):
        return unsupported(_start(top), f"optional field selection '{top.value}?'")
    bracket = _literal_bracket(stack) if top.type in ("COMMA", "LSQB", "LBRACE") else None
    if bracket is None:
        return None
    what = "list element" if bracket.type == "LSQB" else "map entry"
    return unsupported(pos, f"optional {what} '?'")


def _trailing_comma(err: "UnexpectedInput") -> int | None:
    """The offset of the comma in ``[1, 2,]`` or ``{k: v,}``, where the parser stopped."""
    from lark.exceptions import UnexpectedToken

    if not isinstance(err, UnexpectedToken) or err.token.type not in ("RSQB", "RBRACE"):
        return None
    stack = _stack(err)
    top, bracket = _top(stack), _literal_bracket(stack)
    if top is None or top.type != "COMMA" or bracket is None:
        return None
    closes = {"LSQB": "RSQB", "LBRACE": "RBRACE"}[bracket.type]
    return _start(top) if err.token.type == closes else None


def _stack(err: "UnexpectedInput") -> "list[Tree | Token]":
    """What the parser had read when it stopped: trees for what it reduced, tokens for the
    rest, so a bracket still open is a token on it."""
    return cast("list[Tree | Token]", err.interactive_parser.parser_state.value_stack)


def _top(stack: "list[Tree | Token]") -> "Token | None":
    top = stack[-1] if stack else None
    return top if isinstance(top, str) else None


def _after_operand(stack: "list[Tree | Token]", i: int) -> bool:
    """Whether ``stack[i]`` follows an operand: a ``[`` that indexes, a ``{`` of a message."""
    before = stack[i - 1] if i > 0 else None
    return before is not None and not isinstance(before, str) and before.data == "member"


def _literal_bracket(stack: "list[Tree | Token]") -> "Token | None":
    """The innermost open bracket if it opens a list or map literal, else None."""
    for i in range(len(stack) - 1, -1, -1):
        item = stack[i]
        if isinstance(item, str) and item.type in ("LPAR", "LSQB", "LBRACE"):
            if item.type == "LPAR" or _after_operand(stack, i):
                return None
            return item
    return None


def _start(token: "Token") -> int:
    assert token.start_pos is not None  # every token has one (see _grammar)
    return token.start_pos


# --- the tree ----------------------------------------------------------------------------


class _Translator:
    def __init__(self, text: str, source: str) -> None:
        self._text = text  # what messages quote
        self._source = source  # what was parsed: the text, trailing commas blanked

    def _fail(self, pos: int, msg: str) -> CelCompileError:
        return CelCompileError(f"{position(self._text, pos)}: {msg}", self._text, pos)

    def _after(self, pos: int) -> int:
        """The offset of the token after ``pos`` (an operator or bracket Lark dropped)."""
        gap = _GAP.match(self._source, pos)
        assert gap is not None  # the pattern matches the empty string
        return gap.end()

    def expr(self, tree: "Tree", depth: int) -> Node:
        depth += 1
        if depth > _MAX_DEPTH:
            raise self._fail(tree.meta.start_pos, "expression recursion limit exceeded: 100")
        kids = _trees(tree)
        cond = self._binary(kids[0], depth)
        if len(kids) == 1:
            return cond
        pos = self._after(kids[0].meta.end_pos)
        then, other = self._binary(kids[1], depth), self.expr(kids[2], depth)
        return Call(pos, "_?_:_", None, (cond, then, other))

    def _binary(self, tree: "Tree", depth: int) -> Node:
        """``||`` down to ``*``: left-deep chains, walked in a loop, since ``1 + 1 + ... + 1``
        nests as deep as it is long."""
        pending: list[tuple[str, int, Tree]] = []
        while tree.data != "unary":
            kids = _trees(tree)
            if len(kids) == 1:
                tree = kids[0]
                continue
            op, right = kids
            if tree.data in ("conditionalor", "conditionaland"):
                left, name = op, _OPERATORS[tree.data]
            else:
                left, name = _trees(op)[0], _OPERATORS[op.data]
            pos = self._after(left.meta.end_pos)
            if name == "@in" and _IDENT.match(self._source, pos + 2):
                # Lark matched the keyword as a prefix: a inb, x]index.
                word = _IDENT.match(self._source, pos)
                assert word is not None
                raise self._fail(pos, f"Syntax error: unexpected {word.group()!r}")
            pending.append((name, pos, right))
            tree = left
        node = self._unary(tree, depth)
        for name, pos, right in reversed(pending):
            node = Call(pos, name, None, (node, self._binary(right, depth)))
        return node

    def _unary(self, tree: "Tree", depth: int) -> Node:
        kids = _trees(tree)
        if len(kids) == 1:
            return self._member(kids[0], depth)
        op, operand = kids
        pos = op.meta.start_pos
        if op.data == "unary_not":
            return Call(pos, "!_", None, (self._unary(operand, depth),))
        number = _bare_literal(operand)
        if number is not None and number.type == "INT_LIT" and not number.startswith("-"):
            return self._int(str(number), _start(number), negative=True)
        return Call(pos, "-_", None, (self._unary(operand, depth),))

    def _member(self, tree: "Tree", depth: int) -> Node:
        suffixes: list[Tree] = []
        inner = _trees(tree)[0]
        while inner.data != "primary":
            suffixes.append(inner)
            inner = _trees(_trees(inner)[0])[0]
        base = _trees(inner)[0]
        negate: int | None = None
        if suffixes and base.data == "literal" and _token(base, 0).startswith("-"):
            # cel-python lexes -5 as one number: (-5)[0]; the specification reads -(5[0]).
            negate = _start(_token(base, 0))
            node = self._literal(_token(base, 0), signed=False)
        else:
            node = self._primary(base, depth)
        for suffix in reversed(suffixes):
            node = self._suffix(suffix, node, depth)
        return node if negate is None else Call(negate, "-_", None, (node,))

    def _suffix(self, tree: "Tree", operand: Node, depth: int) -> Node:
        kind = tree.data
        operand_end = _trees(tree)[0].meta.end_pos
        if kind == "member_dot":
            return Select(self._after(operand_end), operand, str(_token(tree, 1)))
        if kind == "member_dot_arg":
            name = _token(tree, 1)
            return Call(self._after(name.end_pos or 0), str(name), operand, self._args(tree, depth))
        if kind == "member_index":
            return Index(self._after(operand_end), operand, self.expr(_trees(tree)[1], depth))
        raise self._fail(
            self._after(operand_end), "message construction is not available: no such type"
        )

    def _args(self, tree: "Tree", depth: int) -> tuple[Node, ...]:
        lists = [k for k in tree.children if not isinstance(k, str) and k.data == "exprlist"]
        return tuple(self.expr(e, depth) for e in _trees(lists[0])) if lists else ()

    def _primary(self, tree: "Tree", depth: int) -> Node:
        kind = tree.data
        if kind == "literal":
            return self._literal(_token(tree, 0))
        if kind == "paren_expr":
            return self.expr(_trees(tree)[0], depth)
        if kind == "list_lit":
            items = tuple(self.expr(e, depth) for k in _trees(tree) for e in _trees(k))
            return ListLit(tree.meta.start_pos, items)
        if kind == "map_lit":
            flat = [self.expr(e, depth) for k in _trees(tree) for e in _trees(k)]
            return MapLit(tree.meta.start_pos, tuple(zip(flat[::2], flat[1::2], strict=True)))
        name = _token(tree, 0)
        if kind in ("ident", "ident_arg") and name in _RESERVED:
            raise self._fail(_start(name), f"Syntax error: reserved identifier: {name}")
        if kind in ("ident", "dot_ident"):
            return Ident(_start(name), str(name))
        paren = self._after(name.end_pos or 0)
        return Call(paren, str(name), None, self._args(tree, depth))

    # -- literals ------------------------------------------------------------------------

    def _literal(self, token: "Token", signed: bool = True) -> Node:
        kind, text, pos = token.type, str(token), _start(token)
        if text.startswith("-"):
            text, pos = text[1:], pos + 1
            if signed and kind == "INT_LIT":
                return self._int(text, pos, negative=True)
            if signed:
                return Call(pos - 1, "-_", None, (self._literal_text(kind, text, pos),))
        return self._literal_text(kind, text, pos)

    def _literal_text(self, kind: str, text: str, pos: int) -> Lit:
        if kind == "INT_LIT":
            return self._int(text, pos)
        if kind == "UINT_LIT":
            value = int(text[:-1], 0)
            if value >= 1 << 64:
                raise self._fail(pos, f"invalid uint literal {text}")
            return Lit(pos, UInt(value))
        if kind == "FLOAT_LIT":
            dot = _BAD_FLOAT.search(text)
            if dot is not None:
                raise self._fail(pos + dot.start(), "Syntax error: a digit must follow '.'")
            return Lit(pos, float(text))
        if kind == "BOOL_LIT":
            return Lit(pos, text == "true")
        if kind == "NULL_LIT":
            return Lit(pos, None)
        return Lit(pos, self._string(text, pos))

    def _int(self, text: str, pos: int, negative: bool = False) -> Lit:
        value = int(text, 0) if text.startswith("0x") else int(text)
        if negative:
            value = -value
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise self._fail(pos, f"invalid int literal {'-' if negative else ''}{text}")
        return Lit(pos, value)

    def _string(self, text: str, pos: int) -> str | bytes:
        """The value of a STRING_LIT, MLSTRING_LIT or BYTES_LIT token at ``pos``."""
        opening = len(text) - len(text.lstrip("rRbB"))
        prefix = text[:opening].lower()
        triple = text[opening : opening + 3]
        quote = triple if triple in ('"""', "'''") and len(text) >= opening + 6 else text[opening]
        start, end = opening + len(quote), len(text) - len(quote)
        raw, is_bytes = "r" in prefix, "b" in prefix
        body = text[start:end] if raw else self._unescape(text, start, end, pos, is_bytes)
        if not is_bytes:
            return body
        # Characters are UTF-8 encoded; \x and octal escapes are raw bytes (see _escape).
        data = bytearray()
        for ch in body:
            data += bytes([ord(ch) - 0xDC00]) if 0xDC00 <= ord(ch) <= 0xDCFF else ch.encode()
        return bytes(data)

    def _unescape(self, text: str, start: int, end: int, base: int, is_bytes: bool) -> str:
        out: list[str] = []
        i = start
        while i < end:
            if text[i] == "\\":
                i = self._escape(text, i, end, base, out, is_bytes)
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    def _escape(
        self, text: str, i: int, end: int, base: int, out: list[str], is_bytes: bool
    ) -> int:
        """Decode the escape at ``text[i]``; a raw byte of a bytes literal becomes a lone
        surrogate (U+DC00 + byte), which no decoded character can be."""
        nxt = text[i + 1] if i + 1 < end else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            return i + 2
        for letter, width in (("x", 2), ("X", 2), ("u", 4), ("U", 8)):
            if nxt == letter:
                digits = text[i + 2 : min(i + 2 + width, end)]
                if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise self._fail(base + i, f"Syntax error: invalid \\{letter} escape")
                if is_bytes and letter in "uU":
                    raise self._fail(base + i, "Syntax error: \\u escapes are not allowed in bytes")
                code = int(digits, 16)
                if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
                    raise self._fail(base + i, "Syntax error: invalid unicode code point")
                out.append(chr(0xDC00 + code) if is_bytes else chr(code))
                return i + 2 + width
        if nxt and nxt in "0123":
            digits = text[i + 1 : min(i + 4, end)]
            if len(digits) != 3 or not all(d in "01234567" for d in digits):
                raise self._fail(base + i, "Syntax error: invalid octal escape")
            code = int(digits, 8)
            out.append(chr(0xDC00 + code) if is_bytes else chr(code))
            return i + 4
        raise self._fail(base + i, f"Syntax error: invalid escape sequence \\{nxt}")


def _trees(tree: "Tree") -> "list[Tree]":
    """The subtrees of a rule whose children the grammar makes all trees."""
    return cast("list[Tree]", tree.children)


def _token(tree: "Tree", i: int) -> "Token":
    return cast("Token", tree.children[i])


def _bare_literal(unary: "Tree") -> "Token | None":
    """The number token of a unary that is only a literal (no member access after it)."""
    kids = _trees(unary)
    if len(kids) != 1:
        return None
    primary = _trees(kids[0])[0]
    if primary.data != "primary":
        return None
    literal = _trees(primary)[0]
    return _token(literal, 0) if literal.data == "literal" else None
