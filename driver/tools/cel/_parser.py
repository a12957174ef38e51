"""CEL text to a small AST (the grammar of the CEL specification, langdef.md).

Hand-written so that every node carries its source offset for ``line:column``
messages, and so that Kubernetes-valid syntax this tool does not evaluate
(optional field selection ``.?`` / ``[?``) is recognised and reported as such.
"""

import re
from dataclasses import dataclass

from driver.tools.cel._errors import CelCompileError, CelUnsupportedError, position
from driver.tools.cel._values import UInt

_RESERVED = frozenset(
    {"as", "break", "const", "continue", "else", "for", "function", "if", "import", "let"}
    | {"loop", "package", "namespace", "return", "var", "void", "while"}
)

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f]+|//[^\n]*)
  | (?P<float>(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?
               |[0-9]+[eE][+-]?[0-9]+))
  | (?P<hex>0[xX][0-9a-fA-F]+[uU]?)
  | (?P<int>[0-9]+[uU]?)
  | (?P<str>[rRbB]{0,2}(?:\"\"\"|'''|"|'))
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE,
)

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

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


# --- AST ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lit:
    pos: int
    value: object


@dataclass(frozen=True, slots=True)
class Ident:
    pos: int
    name: str


@dataclass(frozen=True, slots=True)
class Select:
    pos: int
    operand: "Node"
    field: str


@dataclass(frozen=True, slots=True)
class Index:
    pos: int
    operand: "Node"
    index: "Node"


@dataclass(frozen=True, slots=True)
class Call:
    """A function call; operators are calls too (``_+_``, ``_&&_``, ``!_``, ``_?_:_``)."""

    pos: int
    name: str
    target: "Node | None"
    args: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class ListLit:
    pos: int
    items: tuple["Node", ...]


@dataclass(frozen=True, slots=True)
class MapLit:
    pos: int
    entries: tuple[tuple["Node", "Node"], ...]


Node = Lit | Ident | Select | Index | Call | ListLit | MapLit

_RELOPS = {
    "<": "_<_",
    "<=": "_<=_",
    ">": "_>_",
    ">=": "_>=_",
    "==": "_==_",
    "!=": "_!=_",
    "in": "@in",
}


@dataclass(slots=True)
class _Tok:
    kind: str  # "int", "uint", "float", "str", "bytes", "ident", "op", "eof"
    text: str
    pos: int
    value: object = None


class _Parser:
    def __init__(self, text: str) -> None:
        self._text = text
        self._toks = self._lex(text)
        self._i = 0
        self._depth = 0

    # -- lexing --------------------------------------------------------------------------

    def _fail(self, pos: int, msg: str) -> CelCompileError:
        return CelCompileError(f"{position(self._text, pos)}: {msg}", self._text, pos)

    def _lex(self, text: str) -> list[_Tok]:
        toks: list[_Tok] = []
        i = 0
        while i < len(text):
            m = _TOKEN.match(text, i)
            if m is None:
                raise self._fail(i, f"Syntax error: token recognition error at: {text[i]!r}")
            kind = m.lastgroup or ""
            tok = m.group()
            if kind == "ws":
                i = m.end()
                continue
            if kind == "str":
                string_tok, i = self._string(tok, i)
                toks.append(string_tok)
                continue
            if kind in ("int", "hex", "float"):
                toks.append(self._number(kind, tok, i))
            else:
                toks.append(_Tok(kind, tok, i))
            i = m.end()
        toks.append(_Tok("eof", "", len(text)))
        return toks

    def _number(self, kind: str, tok: str, pos: int) -> _Tok:
        if kind == "float":
            return _Tok("float", tok, pos, float(tok))
        unsigned = tok[-1] in "uU"
        digits = tok[:-1] if unsigned else tok
        value = int(digits, 16) if kind == "hex" else int(digits)
        if unsigned:
            if value >= 1 << 64:
                raise self._fail(pos, f"invalid uint literal {tok}")
            return _Tok("uint", tok, pos, UInt(value))
        # The range check of a signed literal waits for a possible unary minus.
        return _Tok("int", tok, pos, value)

    def _string(self, opener: str, pos: int) -> tuple[_Tok, int]:
        prefix = opener.rstrip("\"'").lower()
        quote = opener[len(prefix) :]
        if prefix.count("r") > 1 or prefix.count("b") > 1:
            raise self._fail(pos, "Syntax error: bad string prefix")
        raw, is_bytes = "r" in prefix, "b" in prefix
        i = pos + len(opener)
        text = self._text
        out: list[str] = []
        while True:
            if i >= len(text):
                raise self._fail(pos, "Syntax error: unterminated string literal")
            if text.startswith(quote, i):
                i += len(quote)
                break
            c = text[i]
            if c == "\n" and len(quote) == 1:
                raise self._fail(pos, "Syntax error: newline in string literal")
            if c == "\\" and raw:
                out.append(c)
                if i + 1 < len(text) and text[i + 1] in (quote[0], "\\"):
                    out.append(text[i + 1])
                    i += 2
                else:
                    i += 1
                continue
            if c == "\\":
                i = self._escape(text, i, out, is_bytes)
                continue
            out.append(c)
            i += 1
        body = "".join(out)
        if is_bytes:
            # Non-escape characters are UTF-8 encoded; \x and octal escapes are raw bytes.
            data = bytearray()
            for ch in body:
                data += bytes([ord(ch) - 0xDC00]) if 0xDC00 <= ord(ch) <= 0xDCFF else ch.encode()
            return _Tok("bytes", opener, pos, bytes(data)), i
        return _Tok("str", opener, pos, body), i

    def _escape(self, text: str, i: int, out: list[str], is_bytes: bool) -> int:
        nxt = text[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            return i + 2
        for letter, width in (("x", 2), ("X", 2), ("u", 4), ("U", 8)):
            if nxt == letter:
                digits = text[i + 2 : i + 2 + width]
                if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise self._fail(i, f"Syntax error: invalid \\{letter} escape")
                if is_bytes and letter in "uU":
                    raise self._fail(i, "Syntax error: \\u escapes are not allowed in bytes")
                code = int(digits, 16)
                if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
                    raise self._fail(i, "Syntax error: invalid unicode code point")
                out.append(chr(0xDC00 + code) if is_bytes else chr(code))
                return i + 2 + width
        if nxt in "0123":
            digits = text[i + 1 : i + 4]
            if len(digits) != 3 or not all(d in "01234567" for d in digits):
                raise self._fail(i, "Syntax error: invalid octal escape")
            code = int(digits, 8)
            out.append(chr(0xDC00 + code) if is_bytes else chr(code))
            return i + 4
        raise self._fail(i, f"Syntax error: invalid escape sequence \\{nxt}")

    # -- parsing -------------------------------------------------------------------------

    @property
    def _tok(self) -> _Tok:
        return self._toks[self._i]

    def _is(self, text: str) -> bool:
        tok = self._toks[self._i]
        return tok.kind in ("op", "ident") and tok.text == text

    def _take(self, text: str) -> _Tok:
        tok = self._tok
        if not self._is(text):
            found = "end of input" if tok.kind == "eof" else repr(tok.text)
            raise self._fail(tok.pos, f"Syntax error: expected {text!r}, found {found}")
        self._i += 1
        return tok

    def parse(self) -> Node:
        node = self._expr()
        if self._tok.kind != "eof":
            raise self._fail(self._tok.pos, f"Syntax error: unexpected {self._tok.text!r}")
        return node

    def _expr(self) -> Node:
        self._depth += 1
        if self._depth > 100:
            raise self._fail(self._tok.pos, "expression recursion limit exceeded: 100")
        cond = self._or()
        if self._is("?"):
            pos = self._take("?").pos
            then = self._or()
            self._take(":")
            other = self._expr()
            cond = Call(pos, "_?_:_", None, (cond, then, other))
        self._depth -= 1
        return cond

    def _or(self) -> Node:
        node = self._and()
        while self._is("||"):
            pos = self._take("||").pos
            node = Call(pos, "_||_", None, (node, self._and()))
        return node

    def _and(self) -> Node:
        node = self._relation()
        while self._is("&&"):
            pos = self._take("&&").pos
            node = Call(pos, "_&&_", None, (node, self._relation()))
        return node

    def _relation(self) -> Node:
        node = self._addition()
        while self._tok.text in _RELOPS and self._tok.kind in ("op", "ident"):
            tok = self._tok
            self._i += 1
            node = Call(tok.pos, _RELOPS[tok.text], None, (node, self._addition()))
        return node

    def _addition(self) -> Node:
        node = self._multiplication()
        while self._tok.kind == "op" and self._tok.text in ("+", "-"):
            tok = self._tok
            self._i += 1
            node = Call(tok.pos, f"_{tok.text}_", None, (node, self._multiplication()))
        return node

    def _multiplication(self) -> Node:
        node = self._unary()
        while self._tok.kind == "op" and self._tok.text in ("*", "/", "%"):
            tok = self._tok
            self._i += 1
            node = Call(tok.pos, f"_{tok.text}_", None, (node, self._unary()))
        return node

    def _unary(self) -> Node:
        tok = self._tok
        if tok.kind == "op" and tok.text == "!":
            self._i += 1
            return Call(tok.pos, "!_", None, (self._unary(),))
        if tok.kind == "op" and tok.text == "-":
            self._i += 1
            nxt = self._tok
            if nxt.kind == "int" and not self._member_follows():
                self._i += 1
                return self._int_lit(nxt, negative=True)
            return Call(tok.pos, "-_", None, (self._unary(),))
        return self._member()

    def _member_follows(self) -> bool:
        after = self._toks[self._i + 1]
        return after.kind == "op" and after.text in (".", "[", ".?", "[?")

    def _int_lit(self, tok: _Tok, negative: bool = False) -> Lit:
        raw = tok.value
        assert type(raw) is int  # _number gives every "int" token an int value
        value = -raw if negative else raw
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise self._fail(tok.pos, f"invalid int literal {'-' if negative else ''}{tok.text}")
        return Lit(tok.pos, value)

    def _member(self) -> Node:
        node = self._primary()
        while True:
            tok = self._tok
            if tok.kind != "op":
                return node
            if tok.text in (".?", "[?"):
                raise CelUnsupportedError(
                    f"{position(self._text, tok.pos)}: optional field selection "
                    f"'{tok.text}' is valid Kubernetes CEL but not supported by this tool",
                    self._text,
                    tok.pos,
                )
            if tok.text == ".":
                self._i += 1
                name = self._tok
                if name.kind != "ident":
                    raise self._fail(name.pos, "Syntax error: expected a field or method name")
                self._i += 1
                if self._is("("):
                    paren = self._take("(").pos
                    node = Call(paren, name.text, node, self._args(")"))
                else:
                    node = Select(tok.pos, node, name.text)
            elif tok.text == "[":
                self._i += 1
                index = self._expr()
                self._take("]")
                node = Index(tok.pos, node, index)
            elif tok.text == "{":
                raise self._fail(tok.pos, "message construction is not available: no such type")
            else:
                return node

    def _args(self, close: str) -> tuple[Node, ...]:
        args: list[Node] = []
        if not self._is(close):
            args.append(self._expr())
            while self._is(","):
                self._i += 1
                args.append(self._expr())
        self._take(close)
        return tuple(args)

    def _primary(self) -> Node:
        tok = self._tok
        self._i += 1
        if tok.kind == "int":
            return self._int_lit(tok)
        if tok.kind in ("uint", "float", "str", "bytes"):
            return Lit(tok.pos, tok.value)
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return Lit(tok.pos, tok.text == "true")
            if tok.text == "null":
                return Lit(tok.pos, None)
            if tok.text in _RESERVED or tok.text == "in":
                raise self._fail(tok.pos, f"Syntax error: reserved identifier: {tok.text}")
            if self._is("("):
                paren = self._take("(").pos
                return Call(paren, tok.text, None, self._args(")"))
            return Ident(tok.pos, tok.text)
        if tok.kind == "op":
            if tok.text == ".":
                name = self._tok
                if name.kind == "ident":
                    self._i += 1
                    if self._is("("):
                        paren = self._take("(").pos
                        return Call(paren, name.text, None, self._args(")"))
                    return Ident(name.pos, name.text)
            if tok.text == "(":
                node = self._expr()
                self._take(")")
                return node
            if tok.text == "[?":
                raise CelUnsupportedError(
                    f"{position(self._text, tok.pos)}: optional list element '?' is "
                    "valid Kubernetes CEL but not supported by this tool",
                    self._text,
                    tok.pos,
                )
            if tok.text == "[":
                items = self._list_items()
                return ListLit(tok.pos, items)
            if tok.text == "{":
                return MapLit(tok.pos, self._map_entries())
        found = "end of input" if tok.kind == "eof" else repr(tok.text)
        raise self._fail(tok.pos, f"Syntax error: unexpected {found}")

    def _list_items(self) -> tuple[Node, ...]:
        items: list[Node] = []
        while not self._is("]"):
            if self._is("?"):
                raise CelUnsupportedError(
                    f"{position(self._text, self._tok.pos)}: optional list element '?' is "
                    "valid Kubernetes CEL but not supported by this tool",
                    self._text,
                    self._tok.pos,
                )
            items.append(self._expr())
            if not self._is(","):
                break
            self._i += 1
        self._take("]")
        return tuple(items)

    def _map_entries(self) -> tuple[tuple[Node, Node], ...]:
        entries: list[tuple[Node, Node]] = []
        while not self._is("}"):
            if self._is("?"):
                raise CelUnsupportedError(
                    f"{position(self._text, self._tok.pos)}: optional map entry '?' is "
                    "valid Kubernetes CEL but not supported by this tool",
                    self._text,
                    self._tok.pos,
                )
            key = self._expr()
            self._take(":")
            entries.append((key, self._expr()))
            if not self._is(","):
                break
            self._i += 1
        self._take("}")
        return tuple(entries)


def parse(text: str) -> Node:
    """Parse one CEL expression; raises CelCompileError / CelUnsupportedError with a position."""
    return _Parser(text).parse()
